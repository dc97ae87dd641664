//! AWS: the instance identity document and its RSA-SHA256 signature, as
//! IMDSv2 serves them (`/latest/dynamic/instance-identity/{document,
//! signature}`), verified with the per-region certificates AWS publishes
//! (`[cloud_iid.aws] certificates`).
//!
//! The same document also comes as PKCS#7 (`/latest/dynamic/instance-
//! identity/rsa2048`: a CMS SignedData carrying it, RSA-SHA256, signed by
//! the region's "RSA-2048" certificate, which AWS publishes beside the "RSA"
//! one of the `signature` form and the message does not carry): evidence
//! without `signature` is that form, checked by the [`super::cms`] verifier
//! Azure uses, with the configured keys. The bundle holds both kinds.
//!
//! The document has no issue time (it lasts the instance's life), so no
//! age or audience applies: the once-ever use per instance is what stops a
//! copy. Checked: the signature by a configured certificate's key
//! (`cloud-signature`), then the signed fields (`cloud-malformed`).

use std::path::Path;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use rsa::pkcs8::DecodePublicKey;
use serde::Deserialize;

use super::cms::Signed;
use super::{CloudIdentity, CloudReason};

/// The public keys (SPKI DER) of the configured certificates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsKeys {
    spkis: Vec<Vec<u8>>,
}

/// Reads a PEM bundle of RSA certificates; none, or one that is not RSA,
/// is an error.
pub fn load_certificates(file: &Path) -> Result<AwsKeys, String> {
    let mut spkis = Vec::new();
    for der in super::chain::load_bundle(file)? {
        let (_, cert) = x509_parser::parse_x509_certificate(&der)
            .map_err(|e| format!("{}: a certificate does not parse: {e}", file.display()))?;
        let spki = cert.tbs_certificate.subject_pki.raw.to_vec();
        rsa::PublicKey::from_public_key_der(&spki)
            .map_err(|_| format!("{}: a certificate's key is not RSA", file.display()))?;
        spkis.push(spki);
    }
    Ok(AwsKeys { spkis })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    account_id: String,
    instance_id: String,
    availability_zone: String,
}

pub fn verify(
    keys: &AwsKeys,
    document: &str,
    signature: Option<&str>,
) -> Result<CloudIdentity, CloudReason> {
    let Some(sig) = signature else {
        return verify_pkcs7(keys, document);
    };
    // IMDS wraps the base64 at 64 columns.
    let sig: String = sig.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let sig = B64.decode(sig).map_err(|_| CloudReason::Malformed)?;
    let verified = keys
        .spkis
        .iter()
        .filter_map(|spki| rsa::PublicKey::from_public_key_der(spki).ok())
        .any(|k| {
            k.pkcs1v15_verify::<rsa::sha2::Sha256>(document.as_bytes(), &sig)
                .is_ok()
        });
    if !verified {
        return Err(CloudReason::Signature);
    }
    identity(document.as_bytes())
}

/// The PKCS#7 form: the document is the SignedData's content.
fn verify_pkcs7(keys: &AwsKeys, pkcs7: &str) -> Result<CloudIdentity, CloudReason> {
    let signed = Signed::from_base64(pkcs7)?;
    for spki in &keys.spkis {
        match signed.verify(spki) {
            Ok(()) => return identity(signed.content()),
            // Unsupported algorithms fail alike with every key.
            Err(CloudReason::Malformed) => return Err(CloudReason::Malformed),
            Err(_) => {}
        }
    }
    Err(CloudReason::Signature)
}

/// The identity a verified document names (public for the fuzzer).
pub fn identity(document: &[u8]) -> Result<CloudIdentity, CloudReason> {
    let doc: Document = serde_json::from_slice(document).map_err(|_| CloudReason::Malformed)?;
    CloudIdentity::new(
        super::AWS.to_owned(),
        doc.account_id,
        doc.availability_zone,
        doc.instance_id,
    )
}
