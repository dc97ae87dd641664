//! The real TPM output the tests are built around: the tpm attestor's
//! two-round join captured from swtpm (controlplane/src/attestors/tpm/
//! testdata, made by `cargo run --example tpm-capture`) and the test EK
//! maker's certificates it chains to (tpmsim-fixtures). Fixed bytes, so a
//! test or a fuzz corpus file means the same thing in every run.

/// `TpmAttestation{hello}`: EK public area, EK certificate, AK public area.
pub const TPM_HELLO: &[u8] =
    include_bytes!("../../controlplane/src/attestors/tpm/testdata/hello.bin");
/// `TpmAttestation{answer}` to the challenge of [`TPM_HELLO`].
pub const TPM_ANSWER: &[u8] =
    include_bytes!("../../controlplane/src/attestors/tpm/testdata/answer.bin");
/// The CSR of both rounds, signed by the TPM-held node key.
pub const TPM_CSR: &[u8] = include_bytes!("../../controlplane/src/attestors/tpm/testdata/csr.der");
/// The challenge key the state in [`TPM_ANSWER`] is sealed under.
pub const CHALLENGE_KEY: &[u8] =
    include_bytes!("../../controlplane/src/attestors/tpm/testdata/challenge.key");
const CAPTURED_AT: &str =
    include_str!("../../controlplane/src/attestors/tpm/testdata/captured-at.txt");
/// The test maker's EK root and intermediate (PEM).
pub const EK_ROOT_PEM: &[u8] = include_bytes!("../../tpmsim-fixtures/ek-root.pem");
pub const EK_INTERMEDIATE_PEM: &[u8] = include_bytes!("../../tpmsim-fixtures/ek-intermediate.pem");

/// The database time of the captured round 1 (ms): the fixtures' EK
/// certificate is valid then, and the challenge state open for 5 minutes.
pub fn captured_at() -> i64 {
    CAPTURED_AT.trim().parse().unwrap_or(0)
}
