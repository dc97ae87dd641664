//! Reading node certificates: the identity they name, the key they certify.
//!
//! Both the join (checking a fresh answer) and the identity loader (checking
//! what is on disk) read a leaf the same way, so the rules live here once:
//! exactly one SPIFFE ID, first among the URI SANs, the others `urn:bc:`
//! statements, at most four URIs in all.
use bc_wire::spiffe::NodeSpiffeId;
use p256::pkcs8::der::pem::{self, LineEnding};
use rustls::pki_types::pem::{PemObject, SectionKind};
use time::OffsetDateTime;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

/// How long after notAfter a node may still re-join as itself (the control
/// plane's x509pop `graceMs`, 7 days by default).
pub(crate) const GRACE: time::Duration = time::Duration::days(7);

/// The most URI SANs a node certificate may carry.
const MAX_URIS: usize = 4;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CertError {
    #[error("certificate {index} of the chain is not an X.509 certificate in DER")]
    NotDer { index: usize },
    #[error("the certificate chain is empty")]
    EmptyChain,
    #[error("the node certificate has no SPIFFE ID (URI SAN)")]
    NoSpiffeId,
    #[error(
        "the node certificate's URI SANs are not one SPIFFE ID followed by urn:bc: statements: {0}"
    )]
    BadUris(String),
    #[error("the node certificate's SPIFFE ID is invalid: {0}")]
    BadSpiffeId(#[from] bc_wire::spiffe::SpiffeError),
    #[error("the certificate chain is not one PEM \"CERTIFICATE\" block per entry")]
    NotPem,
}

/// What bcd needs from its node certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCert {
    pub id: NodeSpiffeId,
    /// The certified key's SubjectPublicKeyInfo (DER).
    pub spki: Vec<u8>,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    /// The `urn:bc:` statements (the URI SANs after the SPIFFE ID), in order.
    pub statements: Vec<String>,
    /// SHA-256 of the leaf's DER: what spreads a fleet's renewals
    /// ([`NodeCert::renew_at`]) the same way at every restart.
    pub der_sha256: [u8; 32],
}

impl NodeCert {
    /// When to renew: a point between 50 % and 60 % of the certificate's
    /// lifetime (the spec's "well before expiry"), taken from the certificate's
    /// own hash. Machines that joined in one PXE wave hold certificates of the
    /// same age, and renewing all at exactly half their lifetime would send the
    /// whole fleet to the control plane in the same second; a point derived from
    /// the certificate spreads them and stays put across restarts.
    pub(crate) fn renew_at(&self) -> OffsetDateTime {
        let lifetime = self.not_after - self.not_before;
        let h = self.der_sha256;
        // 0..=1 in steps of 1/65535: fine enough for a 24-hour certificate (~0.13 s).
        let spread = f64::from(u16::from_be_bytes([h[0], h[1]])) / f64::from(u16::MAX);
        self.not_before + lifetime * (0.5 + 0.1 * spread)
    }

    /// Reads the leaf of a chain. Extra bytes after the certificate are refused:
    /// the leaf must be exactly what the CA signed.
    pub fn parse(der: &[u8]) -> Result<NodeCert, CertError> {
        let cert = parse_der(der, 0)?;
        let sans = cert
            .subject_alternative_name()
            .map_err(|e| CertError::BadUris(e.to_string()))?;
        let uris: Vec<&str> = sans
            .map(|ext| {
                ext.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        GeneralName::URI(u) => Some(*u),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let first = uris.first().ok_or(CertError::NoSpiffeId)?;
        if !first.starts_with("spiffe://") {
            return Err(if uris.iter().any(|u| u.starts_with("spiffe://")) {
                CertError::BadUris("the SPIFFE ID is not the first URI".to_owned())
            } else {
                CertError::NoSpiffeId
            });
        }
        if uris.len() > MAX_URIS {
            return Err(CertError::BadUris(format!(
                "{} URIs, at most {MAX_URIS}",
                uris.len()
            )));
        }
        let rest = uris.get(1..).unwrap_or_default();
        if let Some(other) = rest.iter().find(|u| !u.starts_with("urn:bc:")) {
            return Err(CertError::BadUris(format!(
                "unexpected URI {:?}",
                printable(other)
            )));
        }
        let id = NodeSpiffeId::parse(first)?;
        Ok(NodeCert {
            id,
            spki: cert.public_key().raw.to_vec(),
            not_before: cert.validity().not_before.to_datetime(),
            not_after: cert.validity().not_after.to_datetime(),
            statements: rest.iter().map(|u| printable(u)).collect(),
            der_sha256: bc_wire::sha256(der),
        })
    }

    /// The AK statement (`urn:bc:tpm-ak:…`) this certificate carries, if any:
    /// a renewal of it must prove that AK again.
    pub(crate) fn ak_statement(&self) -> Option<&str> {
        self.statements
            .iter()
            .map(String::as_str)
            .find(|s| s.starts_with(bc_wire::tpm::AK_STATEMENT_PREFIX))
    }
}

/// Checks that every certificate of a chain parses; the leaf first.
pub(crate) fn check_chain(chain: &[Vec<u8>]) -> Result<NodeCert, CertError> {
    let leaf = chain.first().ok_or(CertError::EmptyChain)?;
    for (i, c) in chain.iter().enumerate().skip(1) {
        parse_der(c, i)?;
    }
    NodeCert::parse(leaf)
}

/// Whether `leaf` (DER) carries a valid signature by the key of `issuer`
/// (DER); `false` when either does not parse.
pub(crate) fn signed_by(leaf: &[u8], issuer: &[u8]) -> bool {
    use x509_parser::certificate::X509Certificate;
    match (
        X509Certificate::from_der(leaf),
        X509Certificate::from_der(issuer),
    ) {
        (Ok((_, leaf)), Ok((_, issuer))) => {
            leaf.verify_signature(Some(issuer.public_key())).is_ok()
        }
        _ => false,
    }
}

fn parse_der(
    der: &[u8],
    index: usize,
) -> Result<x509_parser::certificate::X509Certificate<'_>, CertError> {
    match x509_parser::certificate::X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        _ => Err(CertError::NotDer { index: index + 1 }),
    }
}

/// A chain as PEM blocks, one after the other, leaf first.
pub fn chain_to_pem(chain: &[Vec<u8>]) -> Vec<String> {
    chain
        .iter()
        .filter_map(|der| pem::encode_string("CERTIFICATE", LineEnding::LF, der).ok())
        .collect()
}

/// Reads a chain stored as one PEM certificate per string; anything else is refused.
pub(crate) fn chain_from_pem(pems: &[String]) -> Result<Vec<Vec<u8>>, CertError> {
    pems.iter()
        .map(|p| {
            let mut sections = <(SectionKind, Vec<u8>)>::pem_slice_iter(p.as_bytes());
            match (sections.next(), sections.next()) {
                (Some(Ok((SectionKind::Certificate, der))), None) => Ok(der),
                _ => Err(CertError::NotPem),
            }
        })
        .collect()
}

/// `2026-12-01T17:00:00Z`: certificate times have whole seconds, and so does every time bcd shows.
pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let t = t.replace_nanosecond(0).unwrap_or(t);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.unix_timestamp().to_string())
}

/// Untrusted text made safe for one line of a message.
pub(crate) fn printable(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(200).collect()
}

/// Who issued a certificate that is not a node certificate (the EK's).
pub(crate) struct CertSummary {
    pub issuer: String,
    /// Hex, as `openssl x509 -serial` prints it.
    pub serial: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

/// Reads any X.509 certificate's issuer, serial and validity.
pub(crate) fn parse_cert(der: &[u8]) -> Result<CertSummary, CertError> {
    let cert = parse_der(der, 0)?;
    Ok(CertSummary {
        issuer: printable(&cert.issuer().to_string()),
        serial: hex::encode_upper(cert.raw_serial()),
        not_before: cert.validity().not_before.to_datetime(),
        not_after: cert.validity().not_after.to_datetime(),
    })
}

/// Largest PEM bundle of CA certificates bcd reads (`[tpm] ek_intermediates`,
/// `[tpm] ek_roots`): every maker's CAs together are ~200 KiB.
pub(crate) const MAX_PEM_BUNDLE: u64 = 1 << 20;

/// The certificates of a PEM bundle an operator dropped on the machine
/// (`[tpm] ek_intermediates`): absent is empty (the file is optional);
/// anything but CERTIFICATE blocks that parse is an error naming the file.
pub(crate) fn read_pem_bundle(path: &std::path::Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let text = match bc_wire::file::read_regular(path, MAX_PEM_BUNDLE, bc_wire::file::Links::Follow)
    {
        Err(e) if e.is_not_found() => {
            tracing::info!(file = %path.display(), "no [tpm] ek_intermediates file");
            return Ok(Vec::new());
        }
        read => read.map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
    };
    let mut out = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(&text) {
        match section {
            Ok((SectionKind::Certificate, der)) => {
                if x509_parser::certificate::X509Certificate::from_der(&der).is_err() {
                    anyhow::bail!("{}: a certificate does not parse", path.display());
                }
                out.push(der);
            }
            // Never echo a block: a misplaced private key must not reach a log.
            Ok(_) => anyhow::bail!("{}: only CERTIFICATE blocks belong there", path.display()),
            Err(e) => anyhow::bail!("{} is not PEM ({e})", path.display()),
        }
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{CertificateParams, Issuer, KeyPair, SanType};

    /// A CA and a leaf for `spki_der` carrying `uris`; returns the chain, leaf first.
    pub(crate) fn issue(spki_der: &[u8], uris: &[&str], hours: i64) -> Vec<Vec<u8>> {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI(rcgen::string::Ia5String::try_from(*u).unwrap()))
            .collect();
        let now = OffsetDateTime::now_utc();
        leaf.not_before = now - time::Duration::minutes(1);
        leaf.not_after = now + time::Duration::hours(hours);
        let pk = rcgen::SubjectPublicKeyInfo::from_der(spki_der).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let leaf_cert = leaf.signed_by(&pk, &issuer).unwrap();
        vec![leaf_cert.der().to_vec(), ca_cert.der().to_vec()]
    }

    fn spki() -> Vec<u8> {
        use crate::keys::NodeKey;
        crate::keys::FileKey::generate()
            .unwrap()
            .spki_der()
            .to_vec()
    }

    #[test]
    fn reads_the_node_id_and_key() {
        let k = spki();
        let chain = issue(
            &k,
            &["spiffe://bc.test/node/node_abc", "urn:bc:tpm-ak:sha256:00"],
            24,
        );
        let c = check_chain(&chain).unwrap();
        assert_eq!(c.id.node_id, "node_abc");
        assert_eq!(c.id.trust_domain, "bc.test");
        assert_eq!(c.spki, k);
    }

    #[test]
    fn reads_statements_after_the_spiffe_id() {
        const AK: &str =
            "urn:bc:tpm-ak:sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let k = spki();
        let chain = issue(&k, &["spiffe://bc.test/node/node_abc", AK], 1);
        let cert = NodeCert::parse(&chain[0]).unwrap();
        assert_eq!(cert.statements, vec![AK.to_owned()]);
        assert_eq!(cert.ak_statement(), Some(AK));
        let plain = issue(&k, &["spiffe://bc.test/node/node_abc"], 1);
        assert_eq!(NodeCert::parse(&plain[0]).unwrap().ak_statement(), None);
        assert!(NodeCert::parse(b"junk").is_err());
    }

    #[test]
    fn refuses_uri_layouts_other_than_the_spec() {
        let k = spki();
        let cases: &[&[&str]] = &[
            &[],
            &["urn:bc:x", "spiffe://bc.test/node/node_a"],
            &["spiffe://bc.test/node/node_a", "https://example.com"],
            &[
                "spiffe://bc.test/node/node_a",
                "spiffe://bc.test/node/node_b",
            ],
            &[
                "spiffe://bc.test/node/node_a",
                "urn:bc:a",
                "urn:bc:b",
                "urn:bc:c",
                "urn:bc:d",
            ],
            &["spiffe://bc.test/workload/x"],
        ];
        for uris in cases {
            assert!(check_chain(&issue(&k, uris, 1)).is_err(), "{uris:?}");
        }
    }

    #[test]
    fn refuses_trailing_bytes_and_garbage() {
        let k = spki();
        let mut chain = issue(&k, &["spiffe://bc.test/node/node_a"], 1);
        chain[0].push(0);
        assert_eq!(check_chain(&chain), Err(CertError::NotDer { index: 1 }));
        chain[0].pop();
        chain[1] = b"garbage".to_vec();
        assert_eq!(check_chain(&chain), Err(CertError::NotDer { index: 2 }));
        assert_eq!(check_chain(&[]), Err(CertError::EmptyChain));
    }

    #[test]
    fn pem_round_trip() {
        let chain = issue(&spki(), &["spiffe://bc.test/node/node_a"], 1);
        let pems = chain_to_pem(&chain);
        assert_eq!(pems.len(), 2);
        assert_eq!(chain_from_pem(&pems).unwrap(), chain);
        assert_eq!(chain_from_pem(&["junk".to_owned()]), Err(CertError::NotPem));
        assert_eq!(chain_from_pem(&[pems.concat()]), Err(CertError::NotPem));
    }
}
