#![no_main]
// The body is bc_fuzz::helper_frames (fuzz-bodies), which the corpus test replays on stable.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bc_fuzz::helper_frames(data));
