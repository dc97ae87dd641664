#![no_main]
// The body is bc_fuzz::tpm_wire (fuzz/bodies), which the corpus test replays on stable.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bc_fuzz::tpm_wire(data));
