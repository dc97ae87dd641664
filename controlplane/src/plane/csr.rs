//! The checks on a CSR and on the node-key statement a certificate will
//! carry, shared by Join and Renew: a CSR is PKCS#10 DER, its key P-256 and
//! its signature valid; a statement is one a renewal can prove again.

use p256::pkcs8::DecodePublicKey;

use crate::plane::api_error::ApiError;

/// The only node-key statement a renewal can prove again (see the spec,
/// "Renewing a TPM-held key"); any other is refused rather than issued.
const KNOWN_STATEMENT_PREFIX: &str = "urn:bc:tpm-ak:";

/// A CSR whose signature verified.
pub(crate) struct VerifiedCsr {
    pub(crate) sha256: [u8; 32],
    pub(crate) spki_der: Vec<u8>,
    pub(crate) spki_sha256: [u8; 32],
}

/// Why a CSR that parses is refused. Join and Renew each name it with
/// their own reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CsrRefusal {
    /// The key is not P-256.
    Key,
    /// The signature does not verify.
    Signature,
}

/// Parses and verifies a CSR. The outer error is a broken request
/// (INVALID_INPUT); the inner one a refusal, which each API names with
/// its own reason.
pub(crate) fn verify_csr(der: &[u8]) -> Result<Result<VerifiedCsr, CsrRefusal>, ApiError> {
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::prelude::FromDer;
    if der.is_empty() {
        return Err(ApiError::InvalidInput("csr is empty".to_owned()));
    }
    let (rest, csr) = X509CertificationRequest::from_der(der)
        .map_err(|_| ApiError::InvalidInput("csr is not a PKCS#10 request in DER".to_owned()))?;
    if !rest.is_empty() {
        return Err(ApiError::InvalidInput("csr has trailing bytes".to_owned()));
    }
    let spki = csr.certification_request_info.subject_pki.raw;
    if p256::PublicKey::from_public_key_der(spki).is_err() {
        return Ok(Err(CsrRefusal::Key));
    }
    if csr.verify_signature().is_err() {
        return Ok(Err(CsrRefusal::Signature));
    }
    Ok(Ok(VerifiedCsr {
        sha256: bc_wire::sha256(der),
        spki_der: spki.to_vec(),
        spki_sha256: bc_wire::sha256(spki),
    }))
}

/// `JoinCrypto.knowsKeyStatement`: the only node-key statement a renewal
/// can prove again is a well-formed AK statement; any other is refused
/// rather than written into a certificate that could never renew.
pub(crate) fn knows_key_statement(uri: &str) -> bool {
    uri.starts_with(KNOWN_STATEMENT_PREFIX) && bc_wire::tpm::parse_ak_statement(uri).is_ok()
}
