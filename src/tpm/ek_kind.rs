//! The EKs bcd knows (TCG EK Credential Profile 2.5): where each one's
//! certificate, nonce and template live in NV, its persistent handle, and
//! its template with a given unique.
//!
//! Templates are handled as marshalled TPMT_PUBLIC bytes: a maker's
//! template comes from NV that way, and the expected public area of an EK
//! is its template with the certificate's key in place of the unique.

use tss_esapi::abstraction::ek::create_ek_public_from_default_template_2;
use tss_esapi::abstraction::{AsymmetricAlgorithmSelection, DefaultKey};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::traits::Marshall;

use bc_wire::tpm::{KeyParams, Public};

use super::TpmError;

/// Which EK: `[tpm] ek` in the config, and what `bcd tpm identify` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum EkKind {
    /// RSA-2048, template L-1 (certificate at NV 0x01c00002).
    #[serde(rename = "rsa")]
    Rsa,
    /// NIST P-256, template L-2 (certificate at NV 0x01c0000a).
    #[serde(rename = "ecc-p256")]
    EccP256,
    /// NIST P-384, high-range template H-3 (certificate at NV 0x01c00016).
    #[serde(rename = "ecc-p384")]
    EccP384,
}

/// The order bcd prefers when `[tpm] ek` names none: the RSA EK that most
/// control planes and tools know, then the ECC ones Intel PTT, Nuvoton and
/// swtpm ship alone.
pub(super) const PREFERENCE: [EkKind; 3] = [EkKind::Rsa, EkKind::EccP256, EkKind::EccP384];

impl EkKind {
    pub(crate) const NAMES: &'static str = "\"rsa\", \"ecc-p256\" or \"ecc-p384\"";

    pub(crate) fn parse(s: &str) -> Option<EkKind> {
        match s {
            "rsa" => Some(EkKind::Rsa),
            "ecc-p256" => Some(EkKind::EccP256),
            "ecc-p384" => Some(EkKind::EccP384),
            _ => None,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EkKind::Rsa => "rsa",
            EkKind::EccP256 => "ecc-p256",
            EkKind::EccP384 => "ecc-p384",
        }
    }

    /// The NV index of its certificate.
    pub(crate) fn certificate_index(self) -> u32 {
        match self {
            EkKind::Rsa => 0x01C0_0002,
            EkKind::EccP256 => 0x01C0_000A,
            EkKind::EccP384 => 0x01C0_0016,
        }
    }

    /// The NV indices of its nonce and template (the low range only).
    pub(crate) fn nonce_and_template_indices(self) -> Option<(u32, u32)> {
        match self {
            EkKind::Rsa => Some((0x01C0_0003, 0x01C0_0004)),
            EkKind::EccP256 => Some((0x01C0_000B, 0x01C0_000C)),
            EkKind::EccP384 => None,
        }
    }

    /// Its conventional persistent handle (swtpm's for P-384).
    pub(crate) fn persistent_handle(self) -> u32 {
        match self {
            EkKind::Rsa => 0x8101_0001,
            EkKind::EccP256 => 0x8101_0002,
            EkKind::EccP384 => 0x8101_0016,
        }
    }

    /// Bytes of the unique a nonce is padded to (RSA: the modulus; ECC: x).
    fn nonce_width(self) -> usize {
        match self {
            EkKind::Rsa => 256,
            EkKind::EccP256 => 32,
            EkKind::EccP384 => 48,
        }
    }

    /// The TCG default template, marshalled (tss-esapi's, which is
    /// byte-identical to what swtpm_setup and tpm2_createek make).
    pub(crate) fn default_template(self) -> Result<Vec<u8>, TpmError> {
        let alg = match self {
            EkKind::Rsa => AsymmetricAlgorithmSelection::Rsa(RsaKeyBits::Rsa2048),
            EkKind::EccP256 => AsymmetricAlgorithmSelection::Ecc(EccCurve::NistP256),
            EkKind::EccP384 => AsymmetricAlgorithmSelection::Ecc(EccCurve::NistP384),
        };
        create_ek_public_from_default_template_2(alg, None::<DefaultKey>)
            .map_err(|source| TpmError::Command {
                command: "CreatePrimary",
                source,
            })?
            .marshall()
            .map_err(|_| TpmError::Unexpected("an EK template that does not marshal"))
    }

    /// The template with a maker's nonce as its unique, as tpm2_createek
    /// fills it: RSA, the nonce then zeros to 256 bytes; ECC, x is the
    /// nonce then zeros to the coordinate size, y that many zeros.
    pub(crate) fn with_nonce(self, template: &[u8], nonce: &[u8]) -> Result<Vec<u8>, TpmError> {
        let width = self.nonce_width();
        if nonce.len() > width {
            return Err(TpmError::Unexpected(
                "an EK nonce longer than the EK's unique",
            ));
        }
        let mut padded = nonce.to_vec();
        padded.resize(width, 0);
        match self {
            EkKind::Rsa => with_unique(template, &[&padded]),
            _ => with_unique(template, &[&padded, &vec![0; width]]),
        }
    }

    /// The kind of EK a certificate's key is: RSA-2048, P-256 or P-384.
    pub(crate) fn of_certificate(cert: &[u8]) -> Option<EkKind> {
        use x509_parser::oid_registry::{OID_EC_P256, OID_NIST_EC_P384};
        use x509_parser::prelude::*;
        use x509_parser::public_key::PublicKey;
        let (_, parsed) = X509Certificate::from_der(cert).ok()?;
        let spki = parsed.public_key();
        match spki.parsed().ok()? {
            PublicKey::RSA(rsa) => {
                let m = rsa.modulus;
                let len = m.len() - m.iter().take_while(|&&b| b == 0).count();
                (len == 256).then_some(EkKind::Rsa)
            }
            PublicKey::EC(_) => {
                let curve = spki.algorithm.parameters.as_ref()?.as_oid().ok()?;
                if curve == OID_EC_P256 {
                    Some(EkKind::EccP256)
                } else if curve == OID_NIST_EC_P384 {
                    Some(EkKind::EccP384)
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    /// The public area of the EK the certificate names: the template with
    /// the certificate's key as unique. None when the certificate holds
    /// another kind of key.
    pub(crate) fn expected_public(
        self,
        template: &[u8],
        cert: &[u8],
    ) -> Result<Option<Vec<u8>>, TpmError> {
        use x509_parser::prelude::*;
        use x509_parser::public_key::PublicKey;
        let (_, parsed) =
            X509Certificate::from_der(cert).map_err(|e| TpmError::EkCertificate(e.to_string()))?;
        match (self, parsed.public_key().parsed()) {
            (EkKind::Rsa, Ok(PublicKey::RSA(rsa))) => {
                let m = rsa.modulus;
                let modulus = &m[m.iter().position(|&b| b != 0).unwrap_or(m.len())..];
                if modulus.len() != 256 || rsa.try_exponent().ok() != Some(65537) {
                    return Ok(None);
                }
                with_unique(template, &[modulus]).map(Some)
            }
            (EkKind::EccP256 | EkKind::EccP384, Ok(PublicKey::EC(point))) => {
                let n = self.nonce_width();
                match point.data() {
                    [4, xy @ ..] if xy.len() == 2 * n => {
                        with_unique(template, &[&xy[..n], &xy[n..]]).map(Some)
                    }
                    _ => Ok(None),
                }
            }
            _ => Ok(None),
        }
    }
}

/// `template` (a marshalled TPMT_PUBLIC) with its unique replaced by
/// `parts`, each a TPM2B: the RSA modulus, or the ECC x and y.
pub(super) fn with_unique(template: &[u8], parts: &[&[u8]]) -> Result<Vec<u8>, TpmError> {
    let parsed = Public::parse(template)
        .map_err(|_| TpmError::Unexpected("an EK template that does not parse"))?;
    let (old, want) = match &parsed.params {
        KeyParams::Rsa { modulus, .. } => (2 + modulus.len(), 1),
        KeyParams::Ecc { x, y, .. } => (4 + x.len() + y.len(), 2),
    };
    if parts.len() != want {
        return Err(TpmError::Unexpected("an EK template of another key type"));
    }
    let mut out = template[..template.len() - old].to_vec();
    for part in parts {
        let len = u16::try_from(part.len())
            .map_err(|_| TpmError::Unexpected("an EK unique longer than 64 KiB"))?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(part);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_templates_are_the_tcg_ones() {
        // L-1: RSA, SHA-256, 0x300B2, PolicyA, AES-128-CFB, 256 zero bytes.
        let rsa = EkKind::Rsa.default_template().unwrap();
        assert_eq!(&rsa[..8], &[0x00, 0x01, 0x00, 0x0B, 0x00, 0x03, 0x00, 0xB2]);
        assert_eq!(rsa.len(), 2 + 2 + 4 + 34 + 6 + 2 + 2 + 4 + 258);
        // L-2: ECC, SHA-256, x and y 32 zero bytes.
        let p256 = EkKind::EccP256.default_template().unwrap();
        assert_eq!(
            &p256[..8],
            &[0x00, 0x23, 0x00, 0x0B, 0x00, 0x03, 0x00, 0xB2]
        );
        assert!(p256.ends_with(&[&[0, 32][..], &[0; 32], &[0, 32], &[0; 32]].concat()));
        // H-3: ECC, SHA-384, 0x300F2 (userWithAuth), empty x and y.
        let p384 = EkKind::EccP384.default_template().unwrap();
        assert_eq!(
            &p384[..8],
            &[0x00, 0x23, 0x00, 0x0C, 0x00, 0x03, 0x00, 0xF2]
        );
        assert!(p384.ends_with(&[0, 4, 0, 16, 0, 0, 0, 0]));
    }

    #[test]
    fn a_nonce_fills_the_unique_as_tpm2_createek_does() {
        let rsa = EkKind::Rsa.default_template().unwrap();
        let filled = EkKind::Rsa.with_nonce(&rsa, &[7; 16]).unwrap();
        assert_eq!(filled.len(), rsa.len());
        assert_eq!(&filled[..rsa.len() - 256], &rsa[..rsa.len() - 256]);
        assert_eq!(&filled[rsa.len() - 256..][..16], &[7; 16]);
        assert!(filled[rsa.len() - 240..].iter().all(|&b| b == 0));

        let p256 = EkKind::EccP256.default_template().unwrap();
        let filled = EkKind::EccP256.with_nonce(&p256, &[9; 5]).unwrap();
        let tail = &filled[filled.len() - 68..];
        assert_eq!(&tail[..7], &[0, 32, 9, 9, 9, 9, 9]);
        assert!(tail[7..]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == 0 || i == 28));
        assert_eq!(&tail[34..36], &[0, 32]);

        assert!(EkKind::EccP256.with_nonce(&p256, &[1; 33]).is_err());
    }

    #[test]
    fn config_names() {
        for k in PREFERENCE {
            assert_eq!(EkKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(EkKind::parse("ecc"), None);
    }
}
