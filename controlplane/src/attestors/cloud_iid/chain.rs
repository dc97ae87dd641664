//! Certificate bundles a cloud verifier trusts, and the walk from a signer
//! certificate up to one of the roots (Azure's attested document is signed
//! by a certificate that a public CA issued through an intermediate Azure
//! rotates; the roots, and optionally the intermediates, are configured).

use std::path::Path;

use x509_parser::certificate::X509Certificate;
use x509_parser::time::ASN1Time;

/// The largest bundle read.
const MAX_BUNDLE_LEN: u64 = 1024 * 1024;
const MAX_CERTS: usize = 64;
/// Signer, intermediates, root: a longer path is refused.
const MAX_DEPTH: usize = 4;

/// Reads a PEM bundle of 1 to [`MAX_CERTS`] certificates, each parsed.
pub(super) fn load_bundle(file: &Path) -> Result<Vec<Vec<u8>>, String> {
    let bytes = bc_wire::file::read_regular(file, MAX_BUNDLE_LEN, bc_wire::file::Links::Follow)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let mut certs = Vec::new();
    for der in rustls_pemfile::certs(&mut &bytes[..]) {
        let der = der.map_err(|e| format!("{}: {e}", file.display()))?;
        x509_parser::parse_x509_certificate(&der)
            .map_err(|e| format!("{}: a certificate does not parse: {e}", file.display()))?;
        certs.push(der.to_vec());
    }
    if certs.is_empty() || certs.len() > MAX_CERTS {
        return Err(format!(
            "{}: expected 1 to {MAX_CERTS} certificates",
            file.display()
        ));
    }
    Ok(certs)
}

/// Whether `leaf` (DER) chains to one of `roots` through CA certificates
/// among `intermediates`, every certificate on the path valid at `now_s`
/// (Unix seconds) and each signed by the next.
pub(super) fn verify(leaf: &[u8], intermediates: &[&[u8]], roots: &[Vec<u8>], now_s: i64) -> bool {
    let Ok(now) = ASN1Time::from_timestamp(now_s) else {
        return false;
    };
    let roots: Vec<X509Certificate<'_>> = roots.iter().filter_map(|d| parse(d)).collect();
    let intermediates: Vec<X509Certificate<'_>> =
        intermediates.iter().filter_map(|d| parse(d)).collect();
    let Some(mut cur) = parse(leaf) else {
        return false;
    };
    for _ in 0..MAX_DEPTH {
        if !cur.validity().is_valid_at(now) {
            return false;
        }
        let issued = |by: &&X509Certificate<'_>| {
            by.subject() == cur.issuer()
                && by.is_ca()
                && by.validity().is_valid_at(now)
                && cur.verify_signature(Some(by.public_key())).is_ok()
        };
        if roots.iter().any(|r| issued(&r)) {
            return true;
        }
        match intermediates.iter().find(issued) {
            Some(next) => cur = next.clone(),
            None => return false,
        }
    }
    false
}

fn parse(der: &[u8]) -> Option<X509Certificate<'_>> {
    x509_parser::parse_x509_certificate(der)
        .ok()
        .map(|(_, c)| c)
}

/// Whether `cert` (DER) is for `name`: its subject CN or a DNS name in its
/// subjectAltName, compared exactly (ASCII case aside).
pub(super) fn names(cert: &[u8], name: &str) -> bool {
    let Ok((_, c)) = x509_parser::parse_x509_certificate(cert) else {
        return false;
    };
    let cn = c
        .subject()
        .iter_common_name()
        .filter_map(|a| a.as_str().ok())
        .any(|cn| cn.eq_ignore_ascii_case(name));
    let san = matches!(c.subject_alternative_name(), Ok(Some(ext))
        if ext.value.general_names.iter().any(|g| matches!(g,
            x509_parser::extensions::GeneralName::DNSName(d) if d.eq_ignore_ascii_case(name))));
    cn || san
}
