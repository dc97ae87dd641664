#![no_main]
// The body is bc_fuzz::deploy_image (fuzz-bodies), which the corpus test replays on stable.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bc_fuzz::deploy_image(data));
