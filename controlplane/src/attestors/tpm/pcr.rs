//! `pcr_policy`: the PCR values a TPM join must quote, per bank, and the
//! check of a quote's PCRs against them.
//!
//! A policy names values in SHA-256, in SHA-1, or in both. The challenge
//! names its PCRs and banks; the agent quotes one bank (SHA-256 when its TPM
//! has it), and the quote meets the policy when every PCR the policy names
//! in *that* bank has its value. Naming both lets one policy admit a fleet
//! mixing current machines and older ones with only a SHA-1 bank.

use std::collections::BTreeMap;

use bc_wire::pcr::PcrBank;

/// PCR index → value, per bank. Values have the bank's digest length
/// (checked when the config is read).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PcrPolicy {
    banks: BTreeMap<PcrBank, BTreeMap<u32, Vec<u8>>>,
}

/// Why a PCR value cannot go into a policy.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PcrPolicyError {
    #[error("{0} is not a PCR index from 0 to 23")]
    Index(u32),
    #[error("a {bank} PCR value is {want} bytes, not {got}")]
    Length {
        bank: PcrBank,
        want: usize,
        got: usize,
    },
    #[error("PCR {index} has two {bank} values")]
    Twice { bank: PcrBank, index: u32 },
}

impl PcrPolicy {
    /// Adds the value `index` must have in `bank`.
    pub(crate) fn insert(
        &mut self,
        bank: PcrBank,
        index: u32,
        value: Vec<u8>,
    ) -> Result<(), PcrPolicyError> {
        if index > 23 {
            return Err(PcrPolicyError::Index(index));
        }
        if value.len() != bank.digest_len() {
            return Err(PcrPolicyError::Length {
                bank,
                want: bank.digest_len(),
                got: value.len(),
            });
        }
        let values = self.banks.entry(bank).or_default();
        if values.contains_key(&index) {
            return Err(PcrPolicyError::Twice { bank, index });
        }
        values.insert(index, value);
        Ok(())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.banks.values().all(BTreeMap::is_empty)
    }

    /// The PCRs the challenge asks for: every index any bank names.
    pub(crate) fn pcrs(&self) -> Vec<u32> {
        let mut all: Vec<u32> = self
            .banks
            .values()
            .flat_map(|v| v.keys().copied())
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The challenge's `pcr_banks`: the TPM_ALG_IDs of the banks named.
    pub(crate) fn bank_algs(&self) -> Vec<u32> {
        self.banks
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(b, _)| u32::from(b.alg()))
            .collect()
    }

    /// Whether PCRs quoted in `bank` meet the policy: it names that bank and
    /// every PCR it names there was quoted with its value. An empty policy
    /// is met by anything.
    pub(crate) fn is_met(&self, bank: PcrBank, quoted: &BTreeMap<u32, &[u8]>) -> bool {
        if self.is_empty() {
            return true;
        }
        match self.banks.get(&bank) {
            Some(values) if !values.is_empty() => values
                .iter()
                .all(|(i, v)| quoted.get(i) == Some(&v.as_slice())),
            _ => false,
        }
    }
}

/// The quoted PCRs by index and their bank, when the selection is exactly
/// one bank bcd knows, there is one value of that bank's length per selected
/// PCR, and the values (in selection order) hash to the quote's digest. That
/// digest is the AK's signing hash (SHA-256, which `ak-attributes` requires)
/// over the values, whatever the bank (TPM 2.0 Part 3, TPM2_Quote).
pub(crate) fn quoted_pcrs<'a>(
    selection: &[(u16, Vec<u8>)],
    values: &'a [Vec<u8>],
    digest: &[u8],
) -> Option<(PcrBank, BTreeMap<u32, &'a [u8]>)> {
    let [(alg, bitmap)] = selection else {
        return None;
    };
    let bank = PcrBank::from_alg(u32::from(*alg))?;
    let indices: Vec<u32> = bitmap
        .iter()
        .enumerate()
        .flat_map(|(byte, bits)| {
            (0..8u32)
                .filter(move |b| bits & (1 << b) != 0)
                // A selection bitmap has at most 255 bytes: no overflow.
                .map(move |b| byte as u32 * 8 + b)
        })
        .collect();
    if indices.len() != values.len() || values.iter().any(|v| v.len() != bank.digest_len()) {
        return None;
    }
    if bc_wire::sha256(&values.concat()) != digest {
        return None;
    }
    Some((
        bank,
        indices
            .into_iter()
            .zip(values.iter().map(Vec::as_slice))
            .collect(),
    ))
}

/// The quoted PCRs of every bank a quote selects (a boot policy's quote:
/// one selection per populated bank), when each bank is a hash bcd knows
/// and appears once, there is one value of the bank's length per selected
/// PCR, and the values, bank after bank in selection order, hash to the
/// quote's digest.
pub(crate) fn quoted_banks(
    selection: &[(u16, Vec<u8>)],
    values: &[Vec<u8>],
    digest: &[u8],
) -> Option<bc_eventlog::PcrValues> {
    let mut out = bc_eventlog::PcrValues::new();
    let mut rest = values;
    for (alg, bitmap) in selection {
        let alg = bc_eventlog::Alg::from_id(*alg)?;
        if out.contains_key(&alg) {
            return None;
        }
        let bank = out.entry(alg).or_default();
        for (byte, bits) in bitmap.iter().enumerate() {
            for b in (0..8u32).filter(|b| bits & (1 << b) != 0) {
                let (value, tail) = rest.split_first()?;
                if value.len() != alg.size() {
                    return None;
                }
                // A selection bitmap has at most 255 bytes: no overflow.
                bank.insert(byte as u32 * 8 + b, value.clone());
                rest = tail;
            }
        }
    }
    if !rest.is_empty() || bc_wire::sha256(&values.concat()) != digest {
        return None;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_wire::pcr::ALG_SHA1;
    use bc_wire::tpm::ALG_SHA256;

    fn policy(entries: &[(PcrBank, u32, u8)]) -> PcrPolicy {
        let mut p = PcrPolicy::default();
        for &(bank, index, byte) in entries {
            p.insert(bank, index, vec![byte; bank.digest_len()])
                .unwrap();
        }
        p
    }

    #[test]
    fn sha1_selections_hash_20_byte_values_with_sha256() {
        let v = vec![vec![1u8; 20], vec![2u8; 20]];
        let digest = bc_wire::sha256(&v.concat());
        // PCRs 1 and 9 of the SHA-1 bank.
        let sel = vec![(ALG_SHA1, vec![0b10, 0b10, 0])];
        let (bank, got) = quoted_pcrs(&sel, &v, &digest).unwrap();
        assert_eq!(bank, PcrBank::Sha1);
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), [1, 9]);
        assert_eq!(got[&9], &[2u8; 20][..]);
        // The same values called SHA-256, or a digest of the bank's size: refused.
        assert!(quoted_pcrs(&[(ALG_SHA256, vec![0b10, 0b10, 0])], &v, &digest).is_none());
        assert!(quoted_pcrs(&sel, &v, &digest[..20]).is_none());
        // A SHA-384 bank (0x000C) is none bcd knows.
        assert!(quoted_pcrs(&[(0x000C, vec![0b10, 0b10, 0])], &v, &digest).is_none());
        // A SHA-256 value in a SHA-1 selection.
        let mixed = vec![vec![1u8; 20], vec![2u8; 32]];
        let d = bc_wire::sha256(&mixed.concat());
        assert!(quoted_pcrs(&sel, &mixed, &d).is_none());
        // No policy: an empty SHA-1 selection is a quote like any other.
        assert!(quoted_pcrs(&[(ALG_SHA1, vec![0, 0, 0])], &[], &bc_wire::sha256(&[])).is_some());
    }

    #[test]
    fn a_policy_is_met_in_a_bank_it_names() {
        let (a1, a32) = ([0xa1u8; 20], [0xa1u8; 32]);
        let sha1_quote: BTreeMap<u32, &[u8]> = [(0, &a1[..])].into();
        let sha256_quote: BTreeMap<u32, &[u8]> = [(0, &a32[..])].into();
        let sha1_only = policy(&[(PcrBank::Sha1, 0, 0xa1)]);
        assert!(sha1_only.is_met(PcrBank::Sha1, &sha1_quote));
        // A quote in a bank the policy does not name meets nothing.
        assert!(!sha1_only.is_met(PcrBank::Sha256, &sha256_quote));
        assert!(!policy(&[(PcrBank::Sha1, 0, 0xa2)]).is_met(PcrBank::Sha1, &sha1_quote));
        assert!(!policy(&[(PcrBank::Sha1, 7, 0xa1)]).is_met(PcrBank::Sha1, &sha1_quote));
        // Both banks: either meets it, each against its own values.
        let both = policy(&[(PcrBank::Sha1, 0, 0xa1), (PcrBank::Sha256, 0, 0xa1)]);
        assert!(both.is_met(PcrBank::Sha1, &sha1_quote));
        assert!(both.is_met(PcrBank::Sha256, &sha256_quote));
        assert_eq!(both.pcrs(), [0]);
        assert_eq!(both.bank_algs(), [0x0b, 0x04]);
        assert!(PcrPolicy::default().is_met(PcrBank::Sha1, &BTreeMap::new()));
    }

    #[test]
    fn values_must_fit_their_bank() {
        let mut p = PcrPolicy::default();
        assert_eq!(
            p.insert(PcrBank::Sha1, 0, vec![0; 32]),
            Err(PcrPolicyError::Length {
                bank: PcrBank::Sha1,
                want: 20,
                got: 32
            })
        );
        assert_eq!(
            p.insert(PcrBank::Sha256, 24, vec![0; 32]),
            Err(PcrPolicyError::Index(24))
        );
        p.insert(PcrBank::Sha256, 0, vec![0; 32]).unwrap();
        assert!(p.insert(PcrBank::Sha256, 0, vec![1; 32]).is_err());
        assert!(!p.is_empty() && p.bank_algs() == [0x0b]);
    }

    #[test]
    fn a_quote_of_several_banks_is_split_by_bank_in_selection_order() {
        use bc_eventlog::Alg;
        let v = vec![vec![1u8; 32], vec![2u8; 32], vec![3u8; 20], vec![4u8; 20]];
        let digest = bc_wire::sha256(&v.concat());
        let sel = vec![
            (ALG_SHA256, vec![0b1, 0b1, 0]),
            (ALG_SHA1, vec![0b1, 0b1, 0]),
        ];
        let got = quoted_banks(&sel, &v, &digest).unwrap();
        assert_eq!(got[&Alg::Sha256][&8], vec![2u8; 32]);
        assert_eq!(got[&Alg::Sha1][&0], vec![3u8; 20]);
        // Banks swapped: lengths no longer fit.
        let swapped = vec![sel[1].clone(), sel[0].clone()];
        assert!(quoted_banks(&swapped, &v, &digest).is_none());
        // A bank twice, a value too many or too few, another digest.
        let twice = vec![sel[0].clone(), sel[0].clone()];
        let doubled = [v[0].clone(), v[1].clone(), v[0].clone(), v[1].clone()];
        assert!(quoted_banks(&twice, &doubled, &bc_wire::sha256(&doubled.concat())).is_none());
        assert!(quoted_banks(&sel[..1], &v, &digest).is_none());
        assert!(quoted_banks(&sel, &v[..3], &digest).is_none());
        assert!(quoted_banks(&sel, &v, &[0; 32]).is_none());
    }
}
