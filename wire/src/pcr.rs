//! PCR banks: which hash a PCR value is in, as the challenge names it
//! (`TpmChallenge.pcr_banks`, TPM_ALG_IDs) and a quote's selection says.
//!
//! Older server firmware allocates only SHA-1 PCRs; current machines have
//! SHA-256 (and often SHA-1 too). A quote selects one bank; its pcrDigest is
//! always the AK's signing hash (SHA-256 for bcd's AK) over the concatenated
//! values of that bank, whatever the bank's own hash (TPM 2.0 Part 3,
//! TPM2_Quote: `PCRComputeCurrentDigest(inScheme.hashAlg, …)`).

/// TPM_ALG_SHA1.
pub const ALG_SHA1: u16 = 0x0004;

/// A PCR bank bcd can quote and a control plane can check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PcrBank {
    /// Preferred: ordered first.
    Sha256,
    Sha1,
}

impl PcrBank {
    /// Every bank, the agent's preference first.
    pub(crate) const ALL: [PcrBank; 2] = [PcrBank::Sha256, PcrBank::Sha1];

    /// Its TPM_ALG_ID, as the wire and TPML_PCR_SELECTION carry it.
    pub fn alg(self) -> u16 {
        match self {
            PcrBank::Sha256 => crate::tpm::ALG_SHA256,
            PcrBank::Sha1 => ALG_SHA1,
        }
    }

    /// The bank of a TPM_ALG_ID; `None` for one bcd does not know.
    pub fn from_alg(alg: u32) -> Option<PcrBank> {
        PcrBank::ALL.into_iter().find(|b| u32::from(b.alg()) == alg)
    }

    /// The size of one PCR value in this bank.
    pub fn digest_len(self) -> usize {
        match self {
            PcrBank::Sha256 => 32,
            PcrBank::Sha1 => 20,
        }
    }

    /// As operators write it (`[tpm.pcr_policy.sha1]`) and messages say it.
    pub fn name(self) -> &'static str {
        match self {
            PcrBank::Sha256 => "sha256",
            PcrBank::Sha1 => "sha1",
        }
    }

    pub fn from_name(s: &str) -> Option<PcrBank> {
        PcrBank::ALL.into_iter().find(|b| b.name() == s)
    }

    /// The banks a challenge's `pcr_banks` names, preference order, unknown
    /// ids skipped. None named is SHA-256 (control planes before the field).
    pub fn from_challenge(algs: &[u32]) -> Vec<PcrBank> {
        if algs.is_empty() {
            return vec![PcrBank::Sha256];
        }
        PcrBank::ALL
            .into_iter()
            .filter(|b| algs.contains(&u32::from(b.alg())))
            .collect()
    }
}

impl std::fmt::Display for PcrBank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PcrBank::Sha256 => "SHA-256",
            PcrBank::Sha1 => "SHA-1",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenge_banks() {
        assert_eq!(PcrBank::from_challenge(&[]), vec![PcrBank::Sha256]);
        assert_eq!(PcrBank::from_challenge(&[4]), vec![PcrBank::Sha1]);
        // Preference order, whatever the wire order; unknown ids skipped.
        assert_eq!(
            PcrBank::from_challenge(&[4, 0x0c, 0x0b]),
            vec![PcrBank::Sha256, PcrBank::Sha1]
        );
        assert!(PcrBank::from_challenge(&[0x0c]).is_empty());
        assert_eq!(PcrBank::from_alg(0x0b), Some(PcrBank::Sha256));
        assert_eq!(PcrBank::from_name("sha1"), Some(PcrBank::Sha1));
    }
}
