//! Generates the protobuf messages with prost-build and the `protoc` from the
//! system (Debian: protobuf-compiler), so nothing is downloaded at build time.
fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=proto");
    prost_build::Config::new().compile_protos(
        &[
            "proto/agent.proto",
            "proto/site.proto",
            "proto/command.proto",
        ],
        &["proto"],
    )
}
