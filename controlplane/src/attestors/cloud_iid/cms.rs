//! CMS SignedData (PKCS#7, RFC 5652), as Azure's attested document and
//! AWS's `rsa2048` identity document carry it: one signer, RSA PKCS#1 v1.5
//! with SHA-256, the content attached. Shared by both verifiers, which
//! differ only in where the signer's key comes from (Azure: a certificate
//! in the message, chained to configured roots; AWS: configured
//! certificates).
//!
//! Parsing refuses anything else as `cloud-malformed`; [`Signed::verify`]
//! checks the signature the RFC's way: with signed attributes, their
//! `messageDigest` must be the content's SHA-256 and the signature covers
//! their DER SET; without, it covers the content.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use cms::cert::CertificateChoices;
use cms::content_info::ContentInfo;
use cms::signed_data::{SignedData, SignerIdentifier, SignerInfo};
use der::asn1::{ObjectIdentifier, OctetString};
use der::{Decode, Encode};
use rsa::pkcs8::DecodePublicKey;
use x509_cert::ext::pkix::SubjectKeyIdentifier;

use super::CloudReason;

const ID_SIGNED_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.2");
const ID_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.1");
const ID_CONTENT_TYPE: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.3");
const ID_MESSAGE_DIGEST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.4");
const ID_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const SHA256_WITH_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");

/// The largest message parsed (the evidence is at most 16 KiB anyway).
pub(crate) const MAX_CMS_LEN: usize = 16 * 1024;
/// The most certificates a message may carry.
const MAX_CERTS: usize = 8;

/// A parsed SignedData: its content and its one signer.
pub struct Signed {
    content: Vec<u8>,
    signer: SignerInfo,
    /// The carried certificate the signer names, DER.
    signer_cert: Option<Vec<u8>>,
    /// Every carried certificate, DER (candidate intermediates).
    certs: Vec<Vec<u8>>,
}

impl Signed {
    /// Parses base64 (whitespace ignored) DER, or BER as some signers
    /// stream it (AWS's `rsa2048`: indefinite lengths, the content in
    /// chunks).
    pub(crate) fn from_base64(text: &str) -> Result<Self, CloudReason> {
        let text: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        if text.len() > MAX_CMS_LEN * 4 / 3 + 4 {
            return Err(CloudReason::Malformed);
        }
        let der = B64.decode(text).map_err(|_| CloudReason::Malformed)?;
        Self::from_der(&der)
    }

    pub fn from_der(bytes: &[u8]) -> Result<Self, CloudReason> {
        if bytes.len() > MAX_CMS_LEN {
            return Err(CloudReason::Malformed);
        }
        let der = super::ber::to_der(bytes).ok_or(CloudReason::Malformed)?;
        let info = ContentInfo::from_der(&der).map_err(|_| CloudReason::Malformed)?;
        if info.content_type != ID_SIGNED_DATA {
            return Err(CloudReason::Malformed);
        }
        let sd: SignedData = info
            .content
            .decode_as()
            .map_err(|_| CloudReason::Malformed)?;
        let eci = &sd.encap_content_info;
        if eci.econtent_type != ID_DATA {
            return Err(CloudReason::Malformed);
        }
        let content = eci
            .econtent
            .as_ref()
            .ok_or(CloudReason::Malformed)?
            .decode_as::<OctetString>()
            .map_err(|_| CloudReason::Malformed)?
            .into_bytes()
            .into_vec();
        let mut signers = sd.signer_infos.0.into_vec();
        let (Some(signer), None) = (signers.pop(), signers.pop()) else {
            return Err(CloudReason::Malformed);
        };
        let certs: Vec<_> = sd
            .certificates
            .map(|c| c.0.into_vec())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| match c {
                CertificateChoices::Certificate(c) => Some(c),
                CertificateChoices::Other(_) => None,
            })
            .collect();
        if certs.len() > MAX_CERTS {
            return Err(CloudReason::Malformed);
        }
        let signer_cert = certs
            .iter()
            .find(|c| names(&signer.sid, c))
            .map(|c| c.to_der().map_err(|_| CloudReason::Malformed))
            .transpose()?;
        let certs = certs
            .iter()
            .map(|c| c.to_der().map_err(|_| CloudReason::Malformed))
            .collect::<Result<_, _>>()?;
        Ok(Signed {
            content,
            signer,
            signer_cert,
            certs,
        })
    }

    /// The signed content; trust it only after [`Signed::verify`].
    pub fn content(&self) -> &[u8] {
        &self.content
    }

    /// The carried certificate the signer identifies itself with.
    pub fn signer_cert(&self) -> Option<&[u8]> {
        self.signer_cert.as_deref()
    }

    /// Every carried certificate.
    pub fn certs(&self) -> &[Vec<u8>] {
        &self.certs
    }

    /// Checks the signature with the RSA key `spki` (DER):
    /// `cloud-malformed` for algorithms other than SHA-256 with RSA, or
    /// signed attributes without one `messageDigest`; `cloud-signature` for
    /// a digest or signature that does not match.
    pub fn verify(&self, spki: &[u8]) -> Result<(), CloudReason> {
        let s = &self.signer;
        if s.digest_alg.oid != ID_SHA256 && s.digest_alg.oid != SHA256_WITH_RSA {
            return Err(CloudReason::Malformed);
        }
        let alg = s.signature_algorithm.oid;
        if alg != RSA_ENCRYPTION && alg != SHA256_WITH_RSA {
            return Err(CloudReason::Malformed);
        }
        let signed = match &s.signed_attrs {
            None => self.content.clone(),
            Some(attrs) => {
                let digest = single_value(attrs, ID_MESSAGE_DIGEST)?
                    .ok_or(CloudReason::Malformed)?
                    .decode_as::<OctetString>()
                    .map_err(|_| CloudReason::Malformed)?;
                if digest.as_bytes() != bc_wire::sha256(&self.content) {
                    return Err(CloudReason::Signature);
                }
                // RFC 5652 5.3: present whenever signed attributes are.
                let ct: ObjectIdentifier = single_value(attrs, ID_CONTENT_TYPE)?
                    .ok_or(CloudReason::Malformed)?
                    .decode_as()
                    .map_err(|_| CloudReason::Malformed)?;
                if ct != ID_DATA {
                    return Err(CloudReason::Malformed);
                }
                // The DER SET OF, not the [0] IMPLICIT it travels as.
                attrs.to_der().map_err(|_| CloudReason::Malformed)?
            }
        };
        let key = rsa::PublicKey::from_public_key_der(spki).map_err(|_| CloudReason::Signature)?;
        key.pkcs1v15_verify::<rsa::sha2::Sha256>(&signed, s.signature.as_bytes())
            .map_err(|_| CloudReason::Signature)
    }
}

/// The one value of attribute `oid`, `None` if absent; several
/// attributes or values of it are malformed.
fn single_value(
    attrs: &x509_cert::attr::Attributes,
    oid: ObjectIdentifier,
) -> Result<Option<&der::Any>, CloudReason> {
    let mut found = attrs.iter().filter(|a| a.oid == oid);
    match (found.next(), found.next()) {
        (None, _) => Ok(None),
        (Some(a), None) if a.values.len() == 1 => Ok(a.values.iter().next()),
        _ => Err(CloudReason::Malformed),
    }
}

/// Whether `sid` names `cert`.
fn names(sid: &SignerIdentifier, cert: &x509_cert::Certificate) -> bool {
    let tbs = cert.tbs_certificate();
    match sid {
        SignerIdentifier::IssuerAndSerialNumber(isn) => {
            tbs.issuer() == &isn.issuer && tbs.serial_number() == &isn.serial_number
        }
        SignerIdentifier::SubjectKeyIdentifier(ski) => {
            matches!(tbs.get_extension::<SubjectKeyIdentifier>(), Ok(Some((_, k))) if &k == ski)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_input_is_refused_without_panics() {
        let cases: &[&[u8]] = &[
            b"",
            b"\x30",
            b"\x30\x80",
            b"\x30\x80\x00\x00",
            b"\x30\x03\x06\x01\x00",
            // ContentInfo with id-data, not SignedData.
            b"\x30\x0f\x06\x09\x2a\x86\x48\x86\xf7\x0d\x01\x07\x01\xa0\x02\x04\x00",
            // SignedData OID, content an empty SEQUENCE.
            b"\x30\x0f\x06\x09\x2a\x86\x48\x86\xf7\x0d\x01\x07\x02\xa0\x02\x30\x00",
            // Indefinite lengths that never end.
            b"\x30\x80\x06\x09\x2a\x86\x48\x86\xf7\x0d\x01\x07\x02\xa0\x80\x30\x80",
        ];
        for c in cases {
            assert_eq!(
                Signed::from_der(c).err(),
                Some(CloudReason::Malformed),
                "{c:?}"
            );
        }
        assert_eq!(
            Signed::from_der(&vec![0x30; MAX_CMS_LEN + 1]).err(),
            Some(CloudReason::Malformed)
        );
        assert_eq!(
            Signed::from_base64("!!").err(),
            Some(CloudReason::Malformed)
        );
        // Every prefix and a byte flipped anywhere: refused or parsed, never a panic.
        for sample in [SIGNED_ATTRS, NO_ATTRS, STREAMED] {
            for n in 0..sample.len() {
                let _ = Signed::from_der(&sample[..n]);
                let mut flipped = sample.to_vec();
                flipped[n] ^= 0x41;
                if let Ok(s) = Signed::from_der(&flipped) {
                    let _ = s.verify(&signer_spki());
                }
            }
        }
    }

    // Made by OpenSSL (testdata/cms/regenerate): an independent signer.
    const SIGNED_ATTRS: &[u8] = include_bytes!("../../../testdata/cms/signed-attrs.p7");
    const NO_ATTRS: &[u8] = include_bytes!("../../../testdata/cms/no-attrs.p7");
    const STREAMED: &[u8] = include_bytes!("../../../testdata/cms/streamed.p7");
    const CONTENT: &[u8] = include_bytes!("../../../testdata/cms/content.json");
    const SIGNER: &[u8] = include_bytes!("../../../testdata/cms/signer.pem");

    fn signer_der() -> Vec<u8> {
        let certs: Vec<_> = rustls_pemfile::certs(&mut &SIGNER[..])
            .collect::<Result<_, _>>()
            .expect("pem");
        certs[0].to_vec()
    }

    fn signer_spki() -> Vec<u8> {
        let der = signer_der();
        let (_, c) = x509_parser::parse_x509_certificate(&der).expect("cert");
        c.tbs_certificate.subject_pki.raw.to_vec()
    }

    #[test]
    fn openssl_messages_verify_with_and_without_signed_attributes() {
        for (name, sample) in [
            ("attrs", SIGNED_ATTRS),
            ("noattr", NO_ATTRS),
            ("stream", STREAMED),
        ] {
            let s = Signed::from_der(sample).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s.content(), CONTENT, "{name}");
            assert_eq!(s.signer_cert(), Some(&signer_der()[..]), "{name}");
            assert_eq!(s.certs().len(), 1);
            assert_eq!(s.verify(&signer_spki()), Ok(()), "{name}");
            let b64 = B64.encode(sample);
            assert!(Signed::from_base64(&b64).is_ok(), "{name}");
        }
        // Another key: not its signature.
        let other = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tpmsim-fixtures/cloud-aws.pem"
        ))
        .expect("fixture");
        let der = rustls_pemfile::certs(&mut other.as_bytes())
            .next()
            .expect("one")
            .expect("pem");
        let (_, c) = x509_parser::parse_x509_certificate(&der).expect("cert");
        let spki = c.tbs_certificate.subject_pki.raw;
        for sample in [SIGNED_ATTRS, NO_ATTRS] {
            let s = Signed::from_der(sample).expect("parses");
            assert_eq!(s.verify(spki), Err(CloudReason::Signature));
        }
    }

    #[test]
    fn content_changed_after_signing_is_refused() {
        // The content's last byte ('}') changed in place: with signed
        // attributes the messageDigest no longer matches; without, the
        // signature does not.
        for sample in [SIGNED_ATTRS, NO_ATTRS] {
            let at = sample
                .windows(CONTENT.len())
                .position(|w| w == CONTENT)
                .expect("content in the message");
            let mut changed = sample.to_vec();
            changed[at + CONTENT.len() - 2] = b'X';
            let s = Signed::from_der(&changed).expect("parses");
            assert_eq!(s.verify(&signer_spki()), Err(CloudReason::Signature));
        }
    }
}
