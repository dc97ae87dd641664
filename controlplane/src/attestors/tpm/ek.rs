//! The EK certificate: its chain to the configured `ekRoots`, and the EK
//! public area it must describe.
//!
//! The chain is verified here and not by a TLS verifier: EK certificates
//! carry a critical subjectAltName holding only a directoryName (the TPM's
//! maker, model and version) and the EKU 2.23.133.8.1, which webpki and
//! friends reject. What is checked instead:
//!
//! * the EK certificate parses as exactly one DER certificate (0xFF padding
//!   after it, what NV holds on some chips, is dropped:
//!   [`bc_wire::ekcert::nv`]) and is valid at the database's time;
//! * it is an EK certificate (EKU, keyUsage, not a CA: `ek-certificate`);
//! * a path leads from it to an anchor (a configured certificate of kind
//!   `anchor`, self-signed or not) through the configured intermediates and
//!   at most 8 intermediates the agent sent, untrusted (`ek-chain`,
//!   [`bc_wire::ekcert::path`]): every issuer a CA valid at the database's
//!   time, at most [`bc_wire::ekcert::path::MAX_DEPTH`] issuers, the walk stopping at the first
//!   anchor;
//! * an RSA EK does not have the ROCA fingerprint (`ek-roca`).
//!
//! The EK public area must be the TCG template of the certificate's key
//! holding that key: RSA-2048 (L-1, here), or ECC P-256 (L-2) or P-384 (H-3)
//! ([`super::ek_ecc`]). Which one it is ([`EkTemplate`]) decides how
//! MakeCredential protects the seed.
//!
//! Roots are stored in the `ek_roots` table by `bc-controlplane ek-roots add`:
//! every certificate the operator adds is an anchor (kind `anchor`), but
//! for `--intermediate`. Rows added before kinds were recorded (kind NULL)
//! keep the meaning they had: an anchor when self-signed, else an
//! intermediate; adding the certificate again records its kind.

use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

use bc_wire::tpm::{KeyParams, Public, ALG_NULL};

use crate::store::{params, DbError, Store, Tx, UnixMs};

pub(crate) use super::ek_template::{EkError, EkTemplate, EK_ATTRIBUTES, EK_POLICY_A};

const ALG_AES: u16 = 0x0006;
const ALG_SHA256: u16 = 0x000B;
const RSA_2048: u16 = 2048;
const DEFAULT_RSA_EXPONENT: u32 = 65_537;

/// An EK whose certificate chains to a root and whose public area matches it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedEk {
    pub template: EkTemplate,
    /// The certificate's SubjectPublicKeyInfo, DER: MakeCredential encrypts
    /// to this key, never to one the agent chose.
    pub spki_der: Vec<u8>,
    /// SHA-256 of `spki_der`: the key the machine is known by.
    pub(crate) spki_sha256: [u8; 32],
    pub issuer: String,
    /// Lowercase hex of the serial number.
    pub serial: String,
}

/// The configured CA certificates (DER): the anchors a path must end at,
/// and the intermediates it may go through.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EkTrust {
    pub anchors: Vec<Vec<u8>>,
    pub intermediates: Vec<Vec<u8>>,
}

impl EkTrust {
    /// Every certificate an anchor (what `ek-roots add` makes them).
    pub fn anchors(anchors: Vec<Vec<u8>>) -> Self {
        EkTrust {
            anchors,
            intermediates: Vec::new(),
        }
    }
}

/// Verifies the EK certificate against `trust` and the agent's untrusted
/// `intermediates` (DER) at database time `now`, then the EK public area
/// against it.
pub fn verify_ek(
    cert_der: &[u8],
    ek_public: &[u8],
    trust: &EkTrust,
    intermediates: &[Vec<u8>],
    now: UnixMs,
) -> Result<VerifiedEk, EkError> {
    let cert = bc_wire::ekcert::nv::without_padding(cert_der)
        .and_then(parse_exact)
        .ok_or_else(|| EkError::Certificate("not one DER X.509 certificate".into()))?;
    verify_chain(&cert, trust, intermediates, now)?;
    let template = check_public(&cert, ek_public)?;
    let spki_der = cert.public_key().raw.to_vec();
    let mut issuer = cert.issuer().to_string();
    truncate(&mut issuer, super::state::MAX_ISSUER_LEN);
    Ok(VerifiedEk {
        template,
        spki_sha256: bc_wire::sha256(&spki_der),
        spki_der,
        issuer,
        serial: hex::encode(cert.raw_serial()),
    })
}

/// An EK that sent no certificate, for a join an operator pinned
/// (`resolve add --ek-sha256 H --uncertified`): its key is the public
/// area's own, which must be one of the TCG default EK templates (the
/// challenge is computed for exactly that EK). Nothing vouches for its
/// maker; the caller admits it only when a pin names its SHA-256.
pub(crate) fn uncertified_ek(ek_public: &[u8]) -> Result<VerifiedEk, EkError> {
    let m = EkError::Mismatch;
    let spki_der = bc_wire::ekcert::spki::public_spki_der(ek_public)
        .map_err(|_| m("the EK public area is not an RSA, P-256 or P-384 key"))?;
    let public = Public::parse(ek_public).map_err(|_| m("the EK public area does not parse"))?;
    let template = match &public.params {
        KeyParams::Rsa { .. } => {
            check_rsa_template(&public)?;
            EkTemplate::RsaL1
        }
        KeyParams::Ecc { curve, x, y, .. } => {
            // public_spki_der took only these two curves.
            let template = match curve {
                0x0003 => EkTemplate::EccL2P256,
                _ => EkTemplate::EccH3P384,
            };
            if super::ek_ecc::expected_public(template, x, y) != ek_public {
                return Err(m("the EK public area is not a default ECC EK template"));
            }
            template
        }
    };
    Ok(VerifiedEk {
        template,
        spki_sha256: bc_wire::sha256(&spki_der),
        spki_der,
        issuer: String::new(),
        serial: String::new(),
    })
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

fn parse_exact(der: &[u8]) -> Option<X509Certificate<'_>> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Some(cert),
        _ => None,
    }
}

fn valid_at(cert: &X509Certificate<'_>, now: UnixMs) -> bool {
    let now_s = now.div_euclid(1000);
    let v = cert.validity();
    v.not_before.timestamp() <= now_s && now_s <= v.not_after.timestamp()
}

/// A path from the EK certificate to a configured anchor through the
/// configured intermediates and the agent's untrusted ones
/// ([`bc_wire::ekcert::path`]); then what makes it an EK certificate, and
/// the ROCA fingerprint.
fn verify_chain(
    leaf: &X509Certificate<'_>,
    trust: &EkTrust,
    agent_intermediates: &[Vec<u8>],
    now: UnixMs,
) -> Result<(), EkError> {
    use bc_wire::ekcert;
    if !valid_at(leaf, now) {
        return Err(EkError::Certificate(
            "the EK certificate is not valid at this time".into(),
        ));
    }
    ekcert::check_profile(leaf).map_err(EkError::Certificate)?;
    if agent_intermediates.len() > ekcert::MAX_AGENT_INTERMEDIATES {
        return Err(EkError::Chain(format!(
            "{} intermediates sent, at most {} accepted",
            agent_intermediates.len(),
            ekcert::MAX_AGENT_INTERMEDIATES
        )));
    }
    // Stored roots were checked when added; one that no longer parses is skipped.
    let anchors: Vec<_> = trust
        .anchors
        .iter()
        .filter_map(|d| parse_exact(d))
        .collect();
    let mut intermediates: Vec<_> = trust
        .intermediates
        .iter()
        .filter_map(|d| parse_exact(d))
        .collect();
    for der in agent_intermediates {
        let cert = parse_exact(der)
            .ok_or_else(|| EkError::Chain("an intermediate is not one DER certificate".into()))?;
        intermediates.push(cert);
    }
    ekcert::build_path(leaf, &anchors, &intermediates, now.div_euclid(1000))
        .map_err(|e| EkError::Chain(e.to_string()))?;
    if let Ok(PublicKey::RSA(rsa)) = leaf.public_key().parsed() {
        if ekcert::has_roca_fingerprint(rsa.modulus) {
            return Err(EkError::Roca);
        }
    }
    Ok(())
}

/// The EK public area must be the template of the certificate's key holding
/// that key: the challenge is computed for exactly that EK.
fn check_public(cert: &X509Certificate<'_>, ek_public: &[u8]) -> Result<EkTemplate, EkError> {
    if super::ek_ecc::is_ecc_public(ek_public) {
        return super::ek_ecc::check_public(cert, ek_public);
    }
    check_rsa_public(cert, ek_public)?;
    Ok(EkTemplate::RsaL1)
}

/// The L-1 RSA-2048 template holding the certificate's key.
fn check_rsa_public(cert: &X509Certificate<'_>, ek_public: &[u8]) -> Result<(), EkError> {
    let m = EkError::Mismatch;
    let public = Public::parse(ek_public).map_err(|_| m("the EK public area does not parse"))?;
    let KeyParams::Rsa {
        exponent, modulus, ..
    } = &public.params
    else {
        return Err(m("the EK is not an RSA key"));
    };
    check_rsa_template(&public)?;
    let Ok(PublicKey::RSA(cert_key)) = cert.public_key().parsed() else {
        return Err(m("the EK certificate does not hold an RSA key"));
    };
    let exponent = if *exponent == 0 {
        DEFAULT_RSA_EXPONENT
    } else {
        *exponent
    };
    let cert_exponent = strip_zeros(cert_key.exponent);
    if strip_zeros(modulus) != strip_zeros(cert_key.modulus)
        || cert_exponent.len() > 4
        || cert_exponent
            .iter()
            .fold(0u32, |acc, b| (acc << 8) | u32::from(*b))
            != exponent
    {
        return Err(m("the EK public area does not hold the certificate's key"));
    }
    Ok(())
}

/// The L-1 template's fields, whatever the key.
fn check_rsa_template(public: &Public) -> Result<(), EkError> {
    let KeyParams::Rsa {
        symmetric,
        scheme,
        key_bits,
        ..
    } = &public.params
    else {
        return Err(EkError::Mismatch("the EK is not an RSA key"));
    };
    if public.attributes != EK_ATTRIBUTES
        || public.name_alg != ALG_SHA256
        || public.auth_policy != EK_POLICY_A
        || *symmetric != ALG_AES
        || *scheme != ALG_NULL
        || *key_bits != RSA_2048
    {
        return Err(EkError::Mismatch(
            "the EK public area is not the default RSA-2048 EK template",
        ));
    }
    Ok(())
}

fn strip_zeros(b: &[u8]) -> &[u8] {
    let first = b.iter().position(|&x| x != 0).unwrap_or(b.len());
    &b[first..]
}

/// What a configured CA certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootKind {
    /// A trust anchor: a path may end at it, whatever is above it.
    Anchor,
    /// Trusted only through a path to an anchor (`ek-roots add
    /// --intermediate`; not self-signed rows added before kinds).
    Intermediate,
}

impl RootKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RootKind::Anchor => "anchor",
            RootKind::Intermediate => "intermediate",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "anchor" => Some(RootKind::Anchor),
            "intermediate" => Some(RootKind::Intermediate),
            _ => None,
        }
    }

    /// A row's kind: the one stored, or for a row added before kinds were
    /// recorded (NULL), what it was then: an anchor when self-signed.
    fn of_row(stored: Option<&str>, der: &[u8]) -> Self {
        match stored.and_then(RootKind::parse) {
            Some(kind) => kind,
            None if parse_exact(der).is_some_and(|c| bc_wire::ekcert::is_self_signed(&c)) => {
                RootKind::Anchor
            }
            None => RootKind::Intermediate,
        }
    }
}

/// A configured EK root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EkRoot {
    pub kind: RootKind,
    /// Lowercase hex SHA-256 of the DER.
    pub sha256: String,
    pub der: Vec<u8>,
    pub subject: String,
    pub not_after: UnixMs,
    pub added_at: UnixMs,
}

/// What adding one certificate did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    New,
    /// Already configured with that kind.
    Present,
    /// Already configured, now with the kind asked for.
    KindChanged,
}

impl Added {
    pub fn as_str(self) -> &'static str {
        match self {
            Added::New => "added",
            Added::Present => "already present",
            Added::KindChanged => "kind changed",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EkRootError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// Parses the CA certificates in one file: PEM text with one or more
/// CERTIFICATE blocks, or one DER certificate. Anything else (another PEM
/// block type, a leaf certificate, bytes after the DER) refuses the whole
/// file.
pub fn parse_roots(bytes: &[u8]) -> Result<Vec<Vec<u8>>, EkRootError> {
    if bytes.first() == Some(&0x30) {
        let cert = parse_exact(bytes).ok_or_else(|| {
            EkRootError::Invalid("not one DER X.509 certificate (nor PEM)".into())
        })?;
        require_ca(&cert)?;
        return Ok(vec![bytes.to_vec()]);
    }
    parse_roots_pem(bytes)
}

/// Parses PEM text holding one or more CERTIFICATE blocks, each of which
/// must be a CA certificate. Anything else (no PEM, another block type, a
/// leaf certificate) refuses the whole input.
pub fn parse_roots_pem(text: &[u8]) -> Result<Vec<Vec<u8>>, EkRootError> {
    use rustls_pemfile::Item;
    let mut out = Vec::new();
    for item in rustls_pemfile::read_all(&mut &text[..]) {
        match item.map_err(|e| EkRootError::Invalid(format!("bad PEM: {e}")))? {
            Item::X509Certificate(der) => {
                let cert = parse_exact(&der).ok_or_else(|| {
                    EkRootError::Invalid(format!(
                        "certificate {} is not a DER X.509 certificate",
                        out.len() + 1
                    ))
                })?;
                require_ca(&cert)?;
                out.push(der.to_vec());
            }
            _ => {
                return Err(EkRootError::Invalid(
                    "only CERTIFICATE PEM blocks are accepted".into(),
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(EkRootError::Invalid(
            "no certificate found (neither PEM CERTIFICATE blocks nor one DER certificate)".into(),
        ));
    }
    Ok(out)
}

fn require_ca(cert: &X509Certificate<'_>) -> Result<(), EkRootError> {
    match cert.basic_constraints() {
        Ok(Some(bc)) if bc.value.ca => Ok(()),
        _ => {
            let subject = cert.subject().to_string();
            let who = match subject.is_empty() {
                // EK certificates have an empty subject.
                true => "a certificate with an empty subject".to_owned(),
                false => subject,
            };
            Err(EkRootError::Invalid(format!(
                "{who} is not a CA certificate (basicConstraints CA:TRUE); an EK root must be a maker's root or intermediate"
            )))
        }
    }
}

/// Adds CA certificates (DER, checked by [`parse_roots`]) as `kind`, in one
/// transaction; returns each root and what adding it did. A certificate
/// already configured takes the kind asked for.
pub fn add_roots(
    db: &Store,
    ders: &[Vec<u8>],
    kind: RootKind,
) -> Result<Vec<(EkRoot, Added)>, EkRootError> {
    db.write(|tx| {
        let now = tx.now()?;
        let mut out = Vec::new();
        for der in ders {
            let cert = parse_exact(der)
                .ok_or_else(|| EkRootError::Invalid("not a DER X.509 certificate".into()))?;
            let sha256 = hex::encode(bc_wire::sha256(der));
            let existing: Option<(Option<String>, i64)> = tx.query_opt_map(
                "SELECT kind, added_at FROM ek_roots WHERE sha256 = ?1",
                params![&sha256],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let added = match &existing {
                None => {
                    tx.execute(
                        "INSERT INTO ek_roots (sha256, der, subject, not_after, added_at, kind)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        params![
                            sha256,
                            der,
                            cert.subject().to_string(),
                            cert.validity().not_after.timestamp().saturating_mul(1000),
                            now,
                            kind.as_str()
                        ],
                    )?;
                    Added::New
                }
                Some((stored, _)) => {
                    let was = RootKind::of_row(stored.as_deref(), der);
                    if stored.as_deref() != Some(kind.as_str()) {
                        tx.execute(
                            "UPDATE ek_roots SET kind = ?2 WHERE sha256 = ?1",
                            params![sha256, kind.as_str()],
                        )?;
                    }
                    if was == kind {
                        Added::Present
                    } else {
                        Added::KindChanged
                    }
                }
            };
            let root = EkRoot {
                kind,
                sha256,
                der: der.clone(),
                subject: cert.subject().to_string(),
                not_after: cert.validity().not_after.timestamp().saturating_mul(1000),
                added_at: existing.map_or(now, |(_, at)| at),
            };
            out.push((root, added));
        }
        Ok(out)
    })
}

/// The configured anchors and intermediates, read in `conn`'s transaction.
pub(crate) fn trust(tx: &Tx<'_>) -> Result<EkTrust, DbError> {
    let rows = tx.query_map(
        "SELECT der, kind FROM ek_roots ORDER BY added_at, sha256",
        params![],
        |r| Ok((r.get::<Vec<u8>>(0)?, r.get::<Option<String>>(1)?)),
    )?;
    let mut trust = EkTrust::default();
    for row in rows {
        let (der, kind) = row?;
        match RootKind::of_row(kind.as_deref(), &der) {
            RootKind::Anchor => trust.anchors.push(der),
            RootKind::Intermediate => trust.intermediates.push(der),
        }
    }
    Ok(trust)
}

pub fn list_roots(db: &Store) -> Result<Vec<EkRoot>, DbError> {
    db.read(|tx| {
        let rows = tx.query_map("SELECT sha256, der, subject, not_after, added_at, kind FROM ek_roots ORDER BY added_at, sha256", params![], |r| {
            let der: Vec<u8> = r.get(1)?;
            let kind: Option<String> = r.get(5)?;
            Ok(EkRoot {
                kind: RootKind::of_row(kind.as_deref(), &der),
                sha256: r.get(0)?,
                der,
                subject: r.get(2)?,
                not_after: r.get(3)?,
                added_at: r.get(4)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()})
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const ROOT_PEM: &[u8] = include_bytes!("../../../../tpmsim-fixtures/ek-root.pem");
    pub(crate) const INTERMEDIATE_PEM: &[u8] =
        include_bytes!("../../../../tpmsim-fixtures/ek-intermediate.pem");
    const OTHER_PEM: &[u8] = include_bytes!("../../../../tpmsim-fixtures/other-maker.pem");
    /// A real swtpm EK certificate issued by the test intermediate, and the
    /// EK public area the agent sent with it (see testdata/README.md).
    pub(crate) const EK_CERT: &[u8] = include_bytes!("testdata/ek-cert.der");
    pub(crate) const EK_PUBLIC: &[u8] = include_bytes!("testdata/ek-public.bin");
    /// The database time the fixtures were captured at.
    pub(crate) const CAPTURED_AT: UnixMs = include!("testdata/captured-at.txt");

    fn der(pem: &[u8]) -> Vec<u8> {
        parse_roots_pem(pem).unwrap().remove(0)
    }

    /// Every certificate in `ders` an anchor.
    fn anchors(ders: &[Vec<u8>]) -> EkTrust {
        EkTrust::anchors(ders.to_vec())
    }

    #[test]
    fn chains_through_the_intermediate() {
        let both = [der(ROOT_PEM), der(INTERMEDIATE_PEM)];
        let ek = verify_ek(EK_CERT, EK_PUBLIC, &anchors(&both), &[], CAPTURED_AT).unwrap();
        assert_eq!(ek.spki_sha256, bc_wire::sha256(&ek.spki_der));
        assert!(
            ek.issuer.contains("BCD Test EK Issuing CA 01"),
            "{}",
            ek.issuer
        );
        // The root configured, the intermediate sent by the agent.
        let (root, int) = (vec![der(ROOT_PEM)], vec![der(INTERMEDIATE_PEM)]);
        verify_ek(EK_CERT, EK_PUBLIC, &anchors(&root), &int, CAPTURED_AT).unwrap();
        // The intermediate configured as an anchor: the path ends there.
        verify_ek(EK_CERT, EK_PUBLIC, &anchors(&both[1..]), &[], CAPTURED_AT).unwrap();
        // Configured as an intermediate, it is no anchor.
        let only_int = EkTrust {
            anchors: Vec::new(),
            intermediates: int.clone(),
        };
        assert_eq!(
            verify_ek(EK_CERT, EK_PUBLIC, &only_int, &[], CAPTURED_AT)
                .unwrap_err()
                .reason()
                .as_str(),
            "ek-chain"
        );
        // The root an anchor, the intermediate a configured intermediate.
        let split = EkTrust {
            anchors: root.clone(),
            intermediates: int.clone(),
        };
        verify_ek(EK_CERT, EK_PUBLIC, &split, &[], CAPTURED_AT).unwrap();
        // More than 8 from the agent are refused unread.
        let nine = vec![der(INTERMEDIATE_PEM); 9];
        assert_eq!(
            verify_ek(EK_CERT, EK_PUBLIC, &anchors(&root), &nine, CAPTURED_AT)
                .unwrap_err()
                .reason()
                .as_str(),
            "ek-chain"
        );
    }

    #[test]
    fn refuses_other_roots_and_bad_times() {
        let reason = |roots: &[Vec<u8>], at| {
            verify_ek(EK_CERT, EK_PUBLIC, &anchors(roots), &[], at)
                .map(|_| "ok")
                .unwrap_or_else(|e| e.reason().as_str())
        };
        // The root alone: the agent sends no intermediate, so no chain.
        assert_eq!(reason(&[der(ROOT_PEM)], CAPTURED_AT), "ek-chain");
        assert_eq!(reason(&[der(OTHER_PEM)], CAPTURED_AT), "ek-chain");
        assert_eq!(reason(&[], CAPTURED_AT), "ek-chain");
        let both = [der(ROOT_PEM), der(INTERMEDIATE_PEM)];
        // Before the certificates existed.
        assert_eq!(reason(&both, CAPTURED_AT - 86_400_000), "ek-certificate");
        assert_eq!(reason(&both, CAPTURED_AT), "ok");
        // A CA with the intermediate's exact subject but another key.
        let forged = forged_intermediate();
        assert_eq!(
            reason(&[der(ROOT_PEM), forged.clone()], CAPTURED_AT),
            "ek-chain"
        );
        // Beside the real one, the real one is found by its signature.
        assert_eq!(
            reason(&[der(ROOT_PEM), forged, der(INTERMEDIATE_PEM)], CAPTURED_AT),
            "ok"
        );
    }

    fn forged_intermediate() -> Vec<u8> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, DnValue, IsCa, KeyPair};
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(
            DnType::CountryName,
            DnValue::PrintableString("XX".try_into().unwrap()),
        );
        p.distinguished_name.push(
            DnType::OrganizationName,
            DnValue::Utf8String("BCD Test TPM Manufacturer".into()),
        );
        p.distinguished_name.push(
            DnType::CommonName,
            DnValue::Utf8String("BCD Test EK Issuing CA 01".into()),
        );
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = p.self_signed(&key).unwrap();
        let (_, real) = x509_parser::parse_x509_certificate(INTERMEDIATE_DER.as_slice()).unwrap();
        let (_, fake) = x509_parser::parse_x509_certificate(cert.der()).unwrap();
        assert_eq!(real.subject().as_raw(), fake.subject().as_raw());
        cert.der().to_vec()
    }

    static INTERMEDIATE_DER: std::sync::LazyLock<Vec<u8>> =
        std::sync::LazyLock::new(|| der(INTERMEDIATE_PEM));

    #[test]
    fn refuses_altered_certificate_or_public() {
        let both = anchors(&[der(ROOT_PEM), der(INTERMEDIATE_PEM)]);
        let mut cert = EK_CERT.to_vec();
        let n = cert.len();
        cert[n - 5] ^= 1;
        assert_eq!(
            verify_ek(&cert, EK_PUBLIC, &both, &[], CAPTURED_AT)
                .unwrap_err()
                .reason()
                .as_str(),
            "ek-chain"
        );
        let mut trailing = EK_CERT.to_vec();
        trailing.push(0);
        assert_eq!(
            verify_ek(&trailing, EK_PUBLIC, &both, &[], CAPTURED_AT)
                .unwrap_err()
                .reason()
                .as_str(),
            "ek-certificate"
        );
        // 0xFF padding after the DER, as NV holds it, is dropped.
        let mut padded = EK_CERT.to_vec();
        padded.extend_from_slice(&[0xff; 431]);
        verify_ek(&padded, EK_PUBLIC, &both, &[], CAPTURED_AT).unwrap();
        padded.push(0);
        assert_eq!(
            verify_ek(&padded, EK_PUBLIC, &both, &[], CAPTURED_AT)
                .unwrap_err()
                .reason()
                .as_str(),
            "ek-certificate"
        );
        // Another modulus, other attributes, garbage.
        let mut public = EK_PUBLIC.to_vec();
        let n = public.len();
        public[n - 1] ^= 1;
        assert_eq!(
            verify_ek(EK_CERT, &public, &both, &[], CAPTURED_AT).unwrap_err(),
            EkError::Mismatch("the EK public area does not hold the certificate's key")
        );
        let mut public = EK_PUBLIC.to_vec();
        public[7] |= 0x40; // userWithAuth
        assert_eq!(
            verify_ek(EK_CERT, &public, &both, &[], CAPTURED_AT)
                .unwrap_err()
                .reason()
                .as_str(),
            "ek-mismatch"
        );
        assert_eq!(
            verify_ek(EK_CERT, b"junk", &both, &[], CAPTURED_AT)
                .unwrap_err()
                .reason()
                .as_str(),
            "ek-mismatch"
        );
    }

    #[test]
    fn roots_pem_input() {
        assert_eq!(parse_roots_pem(ROOT_PEM).unwrap().len(), 1);
        let mut two = ROOT_PEM.to_vec();
        two.extend_from_slice(INTERMEDIATE_PEM);
        assert_eq!(parse_roots_pem(&two).unwrap().len(), 2);
        assert!(parse_roots_pem(b"").is_err());
        assert!(parse_roots_pem(EK_CERT).is_err(), "DER is not PEM");
        // parse_roots takes one DER CA certificate too, nothing after it.
        assert_eq!(parse_roots(&der(ROOT_PEM)).unwrap(), vec![der(ROOT_PEM)]);
        let e = parse_roots(EK_CERT).unwrap_err().to_string();
        assert!(e.contains("not a CA"), "{e}");
        let mut trailing = der(ROOT_PEM);
        trailing.push(0);
        assert!(parse_roots(&trailing).is_err());
        assert!(parse_roots(b"# a README\n").is_err());
        let leaf = crate::pki::pem_encode("CERTIFICATE", EK_CERT);
        let e = parse_roots_pem(leaf.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("not a CA"), "{e}");
        let key = b"-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----\n";
        assert!(parse_roots_pem(key).is_err());
    }

    #[test]
    fn roots_are_stored_once_with_their_kind() {
        let dir = tempfile::tempdir().unwrap();
        let db = Store::open_dir(dir.path()).unwrap();
        let ders = parse_roots_pem(ROOT_PEM).unwrap();
        let added = add_roots(&db, &ders, RootKind::Anchor).unwrap();
        assert_eq!(added[0].1, Added::New);
        let again = add_roots(&db, &ders, RootKind::Anchor).unwrap();
        assert_eq!(again[0].1, Added::Present);
        let listed = list_roots(&db).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].kind, RootKind::Anchor);
        assert!(listed[0].subject.contains("BCD Test EK Root CA"));
        // The issuing CA, not self-signed, is an anchor too when added so.
        let int = parse_roots_pem(INTERMEDIATE_PEM).unwrap();
        let added = add_roots(&db, &int, RootKind::Anchor).unwrap();
        assert_eq!(added[0].0.kind, RootKind::Anchor);
        // Added again as an intermediate, it becomes one.
        let again = add_roots(&db, &int, RootKind::Intermediate).unwrap();
        assert_eq!(again[0].1, Added::KindChanged);
        assert_eq!(again[0].0.added_at, added[0].0.added_at);
        assert!(list_roots(&db)
            .unwrap()
            .iter()
            .any(|r| r.kind == RootKind::Intermediate && r.subject.contains("Issuing CA")));
        let trust = db.read(super::trust).unwrap();
        assert_eq!(trust.anchors, ders);
        assert_eq!(trust.intermediates, int);
    }

    /// A database whose roots were added before kinds were recorded keeps
    /// working as it did: self-signed rows are anchors, the others
    /// intermediates, until they are added again.
    #[test]
    fn roots_added_before_kinds_keep_their_meaning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let (root, int) = (der(ROOT_PEM), der(INTERMEDIATE_PEM));
        let seed: String = [&root, &int]
            .iter()
            .map(|der| {
                format!(
                    "INSERT INTO ek_roots (sha256, der, subject, not_after, added_at)
                     VALUES ('{}', x'{}', 'old', 0, 1);",
                    hex::encode(bc_wire::sha256(der)),
                    hex::encode(der)
                )
            })
            .collect();
        crate::store::sqlite::old_database(&path, 10, &seed);
        let db = Store::open(&path).unwrap();
        let trust = db.read(super::trust).unwrap();
        assert_eq!(trust.anchors, vec![root.clone()]);
        assert_eq!(trust.intermediates, vec![int.clone()]);
        let kinds: Vec<_> = list_roots(&db).unwrap().iter().map(|r| r.kind).collect();
        assert!(kinds.contains(&RootKind::Anchor) && kinds.contains(&RootKind::Intermediate));
        // The self-signed root added again: still an anchor, now recorded.
        let again = add_roots(&db, std::slice::from_ref(&root), RootKind::Anchor).unwrap();
        assert_eq!(again[0].1, Added::Present);
        // The intermediate added again (without --intermediate): an anchor.
        let again = add_roots(&db, std::slice::from_ref(&int), RootKind::Anchor).unwrap();
        assert_eq!(again[0].1, Added::KindChanged);
        let trust = db.read(super::trust).unwrap();
        assert_eq!(trust.anchors.len(), 2);
    }

    /// An RSA public key given by its modulus (never used to encrypt).
    struct RsaPublic(Vec<u8>);

    impl rcgen::PublicKeyData for RsaPublic {
        fn der_bytes(&self) -> &[u8] {
            &self.0
        }
        fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
            &rcgen::PKCS_RSA_SHA256
        }
    }

    fn rsa_public(modulus: &[u8]) -> RsaPublic {
        let mut n = vec![0x02, 0x82, 0, 0];
        if modulus[0] & 0x80 != 0 {
            n.push(0); // positive, minimally
        }
        n.extend_from_slice(modulus);
        let len = n.len() - 4;
        (n[2], n[3]) = ((len >> 8) as u8, len as u8);
        let body = [n, vec![0x02, 0x03, 0x01, 0x00, 0x01]].concat();
        let mut der = vec![0x30, 0x82, (body.len() >> 8) as u8, body.len() as u8];
        der.extend_from_slice(&body);
        RsaPublic(der)
    }

    /// 65537^k, big-endian: a power of 65537 modulo every small prime.
    fn power_of_65537(k: u32) -> Vec<u8> {
        let mut n = vec![1u8];
        for _ in 0..k {
            let mut carry = 0u64;
            for b in n.iter_mut().rev() {
                let v = u64::from(*b) * 65_537 + carry;
                *b = v as u8;
                carry = v >> 8;
            }
            while carry > 0 {
                n.insert(0, carry as u8);
                carry >>= 8;
            }
        }
        n
    }

    /// An EK certificate for `modulus` from a fresh root, and that root.
    fn ek_with_modulus(modulus: &[u8], ca: bool) -> (Vec<u8>, Vec<u8>) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
        let key = KeyPair::generate().unwrap();
        let mut rp = CertificateParams::new(Vec::<String>::new()).unwrap();
        rp.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let root = rp.self_signed(&key).unwrap().der().to_vec();
        let issuer = Issuer::new(rp, key);
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.key_usages = vec![KeyUsagePurpose::KeyEncipherment];
        if ca {
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        let ek = p.signed_by(&rsa_public(modulus), &issuer).unwrap();
        (ek.der().to_vec(), root)
    }

    #[test]
    fn refuses_roca_weak_eks_and_non_ek_certificates() {
        let reason = |modulus: &[u8], ca: bool| {
            let (ek, root) = ek_with_modulus(modulus, ca);
            verify_ek(&ek, EK_PUBLIC, &anchors(&[root]), &[], CAPTURED_AT)
                .map(|_| "ok")
                .unwrap_or_else(|e| e.reason().as_str())
        };
        let weak = power_of_65537(128);
        assert!(weak.len() >= 256);
        assert_eq!(reason(&weak, false), "ek-roca");
        // A clean key of another TPM reaches the public area check.
        let mut clean = weak.clone();
        clean[0] ^= 0x40;
        *clean.last_mut().unwrap() ^= 0x02;
        assert!(!bc_wire::ekcert::has_roca_fingerprint(&clean));
        assert_eq!(reason(&clean, false), "ek-mismatch");
        // A CA certificate is no EK certificate.
        assert_eq!(reason(&clean, true), "ek-certificate");
    }
}
