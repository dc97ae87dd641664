//! TPM 2.0 structures as they cross the wire, parsed in pure Rust.
//!
//! The control plane has no TPM, and the agent must check what its helper's
//! TPM returned, so both sides verify TPM output here: public areas
//! (TPMT_PUBLIC), attestations (TPMS_ATTEST) and signatures (TPMT_SIGNATURE).
//! Parsers take exact lengths (no trailing bytes), and signatures are always
//! verified over the exact bytes received.

use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::EncodePublicKey;

pub(crate) const ALG_RSA: u16 = 0x0001;
pub const ALG_SHA256: u16 = 0x000B;
pub const ALG_SHA384: u16 = 0x000C;
pub const ALG_NULL: u16 = 0x0010;

/// The largest TCG event log an agent sends (`TpmAnswer.event_log`) and a
/// control plane accepts. A real log is 10-100 KiB (the largest of
/// eventlog/tests/data is 72 KiB): 1 MiB leaves room for many option ROMs
/// and long MokLists while a join body, read before anything is
/// authenticated, stays small.
pub const MAX_EVENT_LOG: usize = 1 << 20;

/// How a renewal refused by its boot evidence begins its ACCESS_DENIED
/// message; the reason and what failed follow (`: boot-app: …`).
pub const RENEW_REFUSED_BOOT: &str = "Renew refused by the pool's boot policy";
pub(crate) const ALG_ECDSA: u16 = 0x0018;
pub(crate) const ALG_ECC: u16 = 0x0023;
pub(crate) const ECC_NIST_P256: u16 = 0x0003;

pub(crate) const TPM_GENERATED_VALUE: u32 = 0xFF54_4347;
pub(crate) const ST_ATTEST_CERTIFY: u16 = 0x8017;
pub(crate) const ST_ATTEST_QUOTE: u16 = 0x8018;

/// TPMA_OBJECT bits.
pub mod attr {
    pub const FIXED_TPM: u32 = 0x0000_0002;
    pub const FIXED_PARENT: u32 = 0x0000_0010;
    pub const SENSITIVE_DATA_ORIGIN: u32 = 0x0000_0020;
    pub const USER_WITH_AUTH: u32 = 0x0000_0040;
    pub const RESTRICTED: u32 = 0x0001_0000;
    pub const DECRYPT: u32 = 0x0002_0000;
    pub const SIGN: u32 = 0x0004_0000;
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TpmError {
    #[error("{0}: truncated")]
    Truncated(&'static str),
    #[error("{0}: trailing bytes")]
    Trailing(&'static str),
    #[error("{what}: unsupported value {value:#06x}")]
    Unsupported { what: &'static str, value: u32 },
    #[error("not a TPM-generated attestation (magic)")]
    Magic,
    #[error("the attestation is of type {0:#06x}, not the expected one")]
    AttestType(u16),
    #[error("the key is not a P-256 point")]
    BadPoint,
    #[error("the signature does not verify")]
    Signature,
    #[error("not a urn:bc:tpm-ak statement")]
    Statement,
}

/// A big-endian reader that refuses to read past the end.
struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], TpmError> {
        if self.buf.len() < n {
            return Err(TpmError::Truncated(self.what));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, TpmError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, TpmError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, TpmError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, TpmError> {
        let hi = u64::from(self.u32()?);
        Ok(hi << 32 | u64::from(self.u32()?))
    }
    /// A TPM2B: u16 size, then the bytes.
    fn tpm2b(&mut self) -> Result<&'a [u8], TpmError> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
    fn finish(self) -> Result<(), TpmError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(TpmError::Trailing(self.what))
        }
    }
}

/// The type-specific parameters and unique field of a public area.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyParams {
    Ecc {
        symmetric: u16,
        scheme: u16,
        scheme_hash: u16,
        curve: u16,
        kdf: u16,
        x: Vec<u8>,
        y: Vec<u8>,
    },
    Rsa {
        symmetric: u16,
        scheme: u16,
        key_bits: u16,
        exponent: u32,
        modulus: Vec<u8>,
    },
}

/// A TPMT_PUBLIC, with the exact bytes it was parsed from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Public {
    pub raw: Vec<u8>,
    pub name_alg: u16,
    pub attributes: u32,
    pub auth_policy: Vec<u8>,
    pub params: KeyParams,
}

/// TPMT_SYM_DEF_OBJECT: the algorithm, skipping key bits and mode.
fn sym_def(r: &mut Reader<'_>) -> Result<u16, TpmError> {
    let alg = r.u16()?;
    if alg != ALG_NULL {
        r.u16()?;
        r.u16()?;
    }
    Ok(alg)
}

impl Public {
    /// Parses a marshalled TPMT_PUBLIC (not the TPM2B wrapper).
    pub fn parse(raw: &[u8]) -> Result<Self, TpmError> {
        let mut r = Reader::new(raw, "TPMT_PUBLIC");
        let kind = r.u16()?;
        let name_alg = r.u16()?;
        // SHA-384: the high-range EK templates (H-3, P-384).
        if name_alg != ALG_SHA256 && name_alg != ALG_SHA384 {
            return Err(TpmError::Unsupported {
                what: "nameAlg",
                value: name_alg.into(),
            });
        }
        let attributes = r.u32()?;
        let auth_policy = r.tpm2b()?.to_vec();
        let params = match kind {
            ALG_ECC => {
                let symmetric = sym_def(&mut r)?;
                let scheme = r.u16()?;
                let scheme_hash = if scheme == ALG_NULL {
                    ALG_NULL
                } else {
                    r.u16()?
                };
                if scheme != ALG_NULL && scheme != ALG_ECDSA {
                    return Err(TpmError::Unsupported {
                        what: "ECC scheme",
                        value: scheme.into(),
                    });
                }
                let curve = r.u16()?;
                let kdf = r.u16()?;
                if kdf != ALG_NULL {
                    r.u16()?;
                }
                let x = r.tpm2b()?.to_vec();
                let y = r.tpm2b()?.to_vec();
                KeyParams::Ecc {
                    symmetric,
                    scheme,
                    scheme_hash,
                    curve,
                    kdf,
                    x,
                    y,
                }
            }
            ALG_RSA => {
                let symmetric = sym_def(&mut r)?;
                let scheme = r.u16()?;
                if scheme != ALG_NULL {
                    r.u16()?;
                }
                let key_bits = r.u16()?;
                let exponent = r.u32()?;
                let modulus = r.tpm2b()?.to_vec();
                KeyParams::Rsa {
                    symmetric,
                    scheme,
                    key_bits,
                    exponent,
                    modulus,
                }
            }
            other => {
                return Err(TpmError::Unsupported {
                    what: "key type",
                    value: other.into(),
                })
            }
        };
        r.finish()?;
        Ok(Public {
            raw: raw.to_vec(),
            name_alg,
            attributes,
            auth_policy,
            params,
        })
    }

    /// The TPM name: nameAlg ‖ H_nameAlg(TPMT_PUBLIC).
    pub fn name(&self) -> Vec<u8> {
        use sha2::Digest as _;
        let mut name = Vec::with_capacity(50);
        name.extend_from_slice(&self.name_alg.to_be_bytes());
        if self.name_alg == ALG_SHA384 {
            name.extend_from_slice(&sha2::Sha384::digest(&self.raw));
        } else {
            name.extend_from_slice(&crate::sha256(&self.raw));
        }
        name
    }

    pub fn has(&self, bits: u32) -> bool {
        self.attributes & bits == bits
    }

    /// The P-256 public key of an ECC public area.
    pub fn p256_key(&self) -> Result<VerifyingKey, TpmError> {
        match &self.params {
            KeyParams::Ecc {
                curve: ECC_NIST_P256,
                x,
                y,
                ..
            } if x.len() <= 32 && y.len() <= 32 => {
                let mut sec1 = [0u8; 65];
                sec1[0] = 4;
                sec1[1 + 32 - x.len()..33].copy_from_slice(x);
                sec1[33 + 32 - y.len()..].copy_from_slice(y);
                VerifyingKey::from_sec1_bytes(&sec1).map_err(|_| TpmError::BadPoint)
            }
            _ => Err(TpmError::BadPoint),
        }
    }

    /// The SubjectPublicKeyInfo DER of a P-256 public area.
    pub fn p256_spki_der(&self) -> Result<Vec<u8>, TpmError> {
        let key = self.p256_key()?;
        key.to_public_key_der()
            .map(|d| d.as_bytes().to_vec())
            .map_err(|_| TpmError::BadPoint)
    }
}

/// What a TPMS_ATTEST attests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attested {
    /// PCR selection as (hash, bitmap) entries, and the digest of the values.
    Quote {
        selection: Vec<(u16, Vec<u8>)>,
        pcr_digest: Vec<u8>,
    },
    Certify {
        name: Vec<u8>,
        qualified_name: Vec<u8>,
    },
}

/// A TPMS_ATTEST, with the exact bytes it was parsed from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attest {
    pub raw: Vec<u8>,
    pub qualified_signer: Vec<u8>,
    pub extra_data: Vec<u8>,
    pub reset_count: u32,
    pub restart_count: u32,
    pub firmware_version: u64,
    pub attested: Attested,
}

impl Attest {
    pub fn parse(raw: &[u8]) -> Result<Self, TpmError> {
        let mut r = Reader::new(raw, "TPMS_ATTEST");
        if r.u32()? != TPM_GENERATED_VALUE {
            return Err(TpmError::Magic);
        }
        let kind = r.u16()?;
        let qualified_signer = r.tpm2b()?.to_vec();
        let extra_data = r.tpm2b()?.to_vec();
        let _clock = r.u64()?;
        let reset_count = r.u32()?;
        let restart_count = r.u32()?;
        let _safe = r.u8()?;
        let firmware_version = r.u64()?;
        let attested = match kind {
            ST_ATTEST_QUOTE => {
                let count = r.u32()?;
                if count > 16 {
                    return Err(TpmError::Unsupported {
                        what: "PCR selection count",
                        value: count,
                    });
                }
                let mut selection = Vec::new();
                for _ in 0..count {
                    let hash = r.u16()?;
                    let size = r.u8()?;
                    selection.push((hash, r.take(usize::from(size))?.to_vec()));
                }
                Attested::Quote {
                    selection,
                    pcr_digest: r.tpm2b()?.to_vec(),
                }
            }
            ST_ATTEST_CERTIFY => Attested::Certify {
                name: r.tpm2b()?.to_vec(),
                qualified_name: r.tpm2b()?.to_vec(),
            },
            other => return Err(TpmError::AttestType(other)),
        };
        r.finish()?;
        Ok(Attest {
            raw: raw.to_vec(),
            qualified_signer,
            extra_data,
            reset_count,
            restart_count,
            firmware_version,
            attested,
        })
    }
}

/// Parses an ECDSA-SHA256 TPMT_SIGNATURE into a P-256 signature.
pub fn parse_ecdsa_signature(raw: &[u8]) -> Result<Signature, TpmError> {
    let mut r = Reader::new(raw, "TPMT_SIGNATURE");
    let alg = r.u16()?;
    if alg != ALG_ECDSA {
        return Err(TpmError::Unsupported {
            what: "signature algorithm",
            value: alg.into(),
        });
    }
    let hash = r.u16()?;
    if hash != ALG_SHA256 {
        return Err(TpmError::Unsupported {
            what: "signature hash",
            value: hash.into(),
        });
    }
    let (rr, ss) = (r.tpm2b()?, r.tpm2b()?);
    r.finish()?;
    Signature::from_slice(&p1363(rr, ss).ok_or(TpmError::Signature)?)
        .map_err(|_| TpmError::Signature)
}

/// Left-pads r and s to 32 bytes each (a TPM may drop leading zeros).
pub fn p1363(r: &[u8], s: &[u8]) -> Option<[u8; 64]> {
    let strip = |v: &[u8]| -> Option<Vec<u8>> {
        let first = v.iter().position(|&b| b != 0).unwrap_or(v.len());
        let v = &v[first..];
        (v.len() <= 32).then(|| v.to_vec())
    };
    let (r, s) = (strip(r)?, strip(s)?);
    let mut out = [0u8; 64];
    out[32 - r.len()..32].copy_from_slice(&r);
    out[64 - s.len()..].copy_from_slice(&s);
    Some(out)
}

/// Verifies `signature` (TPMT_SIGNATURE) by `signer` over the exact
/// `attest` bytes, and parses them.
pub fn verify_attest(signer: &Public, attest: &[u8], signature: &[u8]) -> Result<Attest, TpmError> {
    let key = signer.p256_key()?;
    let sig = parse_ecdsa_signature(signature)?;
    key.verify(attest, &sig).map_err(|_| TpmError::Signature)?;
    Attest::parse(attest)
}

/// Attributes an attestation key must have: a restricted signing key that
/// was made in the TPM and can never leave it.
pub fn is_attestation_key(ak: &Public) -> bool {
    // Its statement is a SHA-256 name.
    ak.name_alg == ALG_SHA256
        && ak.has(
            attr::FIXED_TPM
                | attr::FIXED_PARENT
                | attr::SENSITIVE_DATA_ORIGIN
                | attr::RESTRICTED
                | attr::SIGN,
        )
        && !ak.has(attr::DECRYPT)
        && matches!(
            ak.params,
            KeyParams::Ecc {
                curve: ECC_NIST_P256,
                scheme: ALG_ECDSA,
                scheme_hash: ALG_SHA256,
                ..
            }
        )
}

/// Why a key certification (TPM2_Certify of a node key by the AK) fails.
/// Each maps to one refusal reason of the spec.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CertificationError {
    #[error("node-key-malformed: {0}")]
    Malformed(TpmError),
    #[error("node-key-signature: the AK's signature does not verify")]
    Signature,
    #[error("node-key-nonce: the certification is not qualified by sha256(csr)")]
    Nonce,
    #[error("node-key-name: the certified name is not the key's")]
    Name,
    #[error("node-key-attributes: the key is not a TPM-bound signing key")]
    Attributes,
    #[error("node-key-not-csr: the key is not the CSR's")]
    NotCsr,
}

impl CertificationError {
    /// The spec's refusal reason.
    pub fn reason(&self) -> &'static str {
        match self {
            CertificationError::Malformed(_) => "node-key-malformed",
            CertificationError::Signature => "node-key-signature",
            CertificationError::Nonce => "node-key-nonce",
            CertificationError::Name => "node-key-name",
            CertificationError::Attributes => "node-key-attributes",
            CertificationError::NotCsr => "node-key-not-csr",
        }
    }
}

/// Checks that `ak` certified `key_public` over `qualifying` (sha256 of the
/// CSR), that the key was made in the TPM and can never leave it, and that
/// it is the CSR's key (`csr_spki_der`). Returns the parsed key.
pub fn verify_key_certification(
    ak: &Public,
    key_public: &[u8],
    certify_info: &[u8],
    signature: &[u8],
    qualifying: &[u8],
    csr_spki_der: &[u8],
) -> Result<Public, CertificationError> {
    use CertificationError as E;
    let key = Public::parse(key_public).map_err(E::Malformed)?;
    if key.name_alg != ALG_SHA256 {
        return Err(E::Malformed(TpmError::Unsupported {
            what: "nameAlg",
            value: key.name_alg.into(),
        }));
    }
    let attest = Attest::parse(certify_info).map_err(E::Malformed)?;
    let sig = parse_ecdsa_signature(signature).map_err(E::Malformed)?;
    let ak_key = ak.p256_key().map_err(E::Malformed)?;
    ak_key
        .verify(certify_info, &sig)
        .map_err(|_| E::Signature)?;
    let Attested::Certify { name, .. } = &attest.attested else {
        return Err(E::Malformed(TpmError::AttestType(ST_ATTEST_QUOTE)));
    };
    if attest.extra_data != qualifying {
        return Err(E::Nonce);
    }
    if *name != key.name() {
        return Err(E::Name);
    }
    let required = attr::FIXED_TPM | attr::FIXED_PARENT | attr::SENSITIVE_DATA_ORIGIN | attr::SIGN;
    if !key.has(required) || key.has(attr::DECRYPT) || key.has(attr::RESTRICTED) {
        return Err(E::Attributes);
    }
    match key.p256_spki_der() {
        Ok(spki) if spki == csr_spki_der => Ok(key),
        _ => Err(E::NotCsr),
    }
}

/// The AK statement a certificate carries: `urn:bc:tpm-ak:sha256:<hex digest>`
/// of the AK's TPM name.
pub fn ak_statement(ak_name: &[u8]) -> Result<String, TpmError> {
    match ak_name {
        [0x00, 0x0B, digest @ ..] if digest.len() == 32 => Ok(format!(
            "urn:bc:tpm-ak:sha256:{}",
            crate::signing::hex_lower(digest)
        )),
        _ => Err(TpmError::Statement),
    }
}

/// The AK name a statement names.
pub fn parse_ak_statement(uri: &str) -> Result<Vec<u8>, TpmError> {
    let hex = uri
        .strip_prefix("urn:bc:tpm-ak:sha256:")
        .ok_or(TpmError::Statement)?;
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(TpmError::Statement);
    }
    let mut name = vec![0x00, 0x0B];
    for i in (0..64).step_by(2) {
        name.push(u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| TpmError::Statement)?);
    }
    Ok(name)
}

/// The statement URI prefix every `urn:bc:` AK statement starts with.
pub const AK_STATEMENT_PREFIX: &str = "urn:bc:tpm-ak:";
