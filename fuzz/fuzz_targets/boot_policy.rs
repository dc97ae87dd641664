#![no_main]
// The body is bc_fuzz::boot_policy (fuzz-bodies), which the corpus test replays on stable.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bc_fuzz::boot_policy(data));
