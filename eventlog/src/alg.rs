//! The hash algorithms of the PCR banks bcd replays.

/// A PCR bank's hash algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Alg {
    Sha1,
    Sha256,
    Sha384,
    Sha512,
    Sm3_256,
}

impl Alg {
    /// Every bank, in TPM_ALG_ID order.
    pub const ALL: [Alg; 5] = [
        Alg::Sha1,
        Alg::Sha256,
        Alg::Sha384,
        Alg::Sha512,
        Alg::Sm3_256,
    ];

    /// From a TPM_ALG_ID.
    pub fn from_id(id: u16) -> Option<Alg> {
        Some(match id {
            0x0004 => Alg::Sha1,
            0x000B => Alg::Sha256,
            0x000C => Alg::Sha384,
            0x000D => Alg::Sha512,
            0x0012 => Alg::Sm3_256,
            _ => return None,
        })
    }

    /// Its TPM_ALG_ID.
    pub fn id(self) -> u16 {
        match self {
            Alg::Sha1 => 0x0004,
            Alg::Sha256 => 0x000B,
            Alg::Sha384 => 0x000C,
            Alg::Sha512 => 0x000D,
            Alg::Sm3_256 => 0x0012,
        }
    }

    /// Its name as tpm2-tools and the `--pcrs` JSON spell it.
    pub fn name(self) -> &'static str {
        match self {
            Alg::Sha1 => "sha1",
            Alg::Sha256 => "sha256",
            Alg::Sha384 => "sha384",
            Alg::Sha512 => "sha512",
            Alg::Sm3_256 => "sm3_256",
        }
    }

    /// From [`Alg::name`].
    pub fn from_name(name: &str) -> Option<Alg> {
        Alg::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Its digest size in bytes.
    pub fn size(self) -> usize {
        match self {
            Alg::Sha1 => 20,
            Alg::Sha256 | Alg::Sm3_256 => 32,
            Alg::Sha384 => 48,
            Alg::Sha512 => 64,
        }
    }

    /// The digest of `data`.
    pub fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Alg::Sha1 => {
                use sha1::Digest as _;
                sha1::Sha1::digest(data).to_vec()
            }
            Alg::Sha256 => {
                use sha2::Digest as _;
                sha2::Sha256::digest(data).to_vec()
            }
            Alg::Sha384 => {
                use sha2::Digest as _;
                sha2::Sha384::digest(data).to_vec()
            }
            Alg::Sha512 => {
                use sha2::Digest as _;
                sha2::Sha512::digest(data).to_vec()
            }
            Alg::Sm3_256 => {
                use sm3::Digest as _;
                sm3::Sm3::digest(data).to_vec()
            }
        }
    }

    /// TPM2_PCR_Extend: `hash(pcr || digest)`.
    pub(crate) fn extend(self, pcr: &mut Vec<u8>, digest: &[u8]) {
        let mut buf = Vec::with_capacity(pcr.len() + digest.len());
        buf.extend_from_slice(pcr);
        buf.extend_from_slice(digest);
        *pcr = self.hash(&buf);
    }
}
