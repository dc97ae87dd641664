//! EK certificates, judged the same way by the control plane (which refuses
//! a join for them) and by `bcd doctor` (which says why before a join):
//!
//! * [`path`]: a path from the EK certificate through untrusted
//!   intermediates (the TPM's NV chain, `[tpm] ek_intermediates`, the
//!   operator's) to a configured anchor (any certificate the operator
//!   trusts, self-signed or not), issuers found by key identifier and by
//!   name ([`name`]);
//! * [`nv`]: the certificate cut out of what NV holds (header, padding);
//! * [`profile`]: what makes a certificate an EK certificate (the TCG EKU
//!   when present, the key usage of its key type, not a CA);
//! * [`roca`]: the Infineon RSA key-generation flaw (CVE-2017-15361);
//! * [`sha512`]: ecdsa-with-SHA512 signatures, which x509-parser does not
//!   verify.
//!
//! The chain is verified here and not by a TLS verifier: EK certificates
//! carry a critical subjectAltName holding only a directoryName (the TPM's
//! maker, model and version) and the EKU 2.23.133.8.1, which webpki and
//! friends reject.

pub(crate) mod name;
pub mod nv;
pub mod path;
pub(crate) mod profile;
pub(crate) mod roca;
mod sha512;
pub mod spki;

pub use path::{build_path, is_self_signed, Anchored, ChainError};
pub use profile::check_profile;
pub use roca::has_roca_fingerprint;

/// Whether `issuer`'s key verifies `cert`'s signature: x509-parser's
/// algorithms, and ecdsa-with-SHA512 ([`sha512`]).
pub(crate) fn signed_by(
    cert: &x509_parser::certificate::X509Certificate<'_>,
    issuer: &x509_parser::x509::SubjectPublicKeyInfo<'_>,
) -> bool {
    match sha512::is_ecdsa_sha512(cert) {
        true => sha512::verifies(cert, issuer),
        false => cert.verify_signature(Some(issuer)).is_ok(),
    }
}

/// Most intermediates the control plane accepts from an agent (in
/// `TpmHello.ek_intermediates`); bcd sends at most this many.
pub const MAX_AGENT_INTERMEDIATES: usize = 8;

/// The real makers' certificates in `testdata/real/` (see its README).
#[cfg(test)]
pub(crate) mod real {
    /// The DER of `testdata/real/NAME` (a PEM file or raw NV bytes).
    pub(crate) fn der(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/ekcert/testdata/real")
            .join(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if !name.ends_with(".pem") {
            return bytes;
        }
        let (_, pem) = x509_parser::pem::parse_x509_pem(&bytes).expect("PEM");
        pem.contents
    }
}
