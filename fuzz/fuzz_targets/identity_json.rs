#![no_main]
// The body is bc_fuzz::identity_json (fuzz/bodies), which the corpus test replays on stable.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bc_fuzz::identity_json(data));
