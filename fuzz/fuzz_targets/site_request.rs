#![no_main]
// The body is bc_fuzz::site_request (fuzz/bodies), which the corpus test replays on stable.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bc_fuzz::site_request(data));
