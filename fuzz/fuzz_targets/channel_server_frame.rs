#![no_main]
// The body is bc_fuzz::channel_server_frame (fuzz-bodies), which the corpus test replays on stable.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bc_fuzz::channel_server_frame(data));
