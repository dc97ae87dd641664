//! Which PCR bank to quote: one the control plane's policy names, that this
//! TPM allocates with every PCR the policy checks.
//!
//! Asked only when the challenge names PCRs (one GetCapability, TPM_CAP_PCRS):
//! a join without a PCR policy quotes an empty selection and pays no command
//! for it. The policy arrives in round 1's challenge, so this is the earliest
//! bcd can know; it decides before ActivateCredential and before round 2, so
//! a TPM that cannot meet the policy sends no quote and spends no challenge.
//! What to change is in the firmware's TPM settings, and the error says so.

use std::fmt;

use bc_wire::pcr::PcrBank;
use tss_esapi::constants::CapabilityType;
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::structures::CapabilityData;

use super::{cmd, Tpm, TpmError};

/// The PCRs each bank of a TPM has allocated (banks bcd does not quote, and
/// banks with no PCR, left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocation(pub Vec<(PcrBank, Vec<u32>)>);

impl Allocation {
    fn pcrs(&self, bank: PcrBank) -> Option<&[u32]> {
        self.0
            .iter()
            .find(|(b, pcrs)| *b == bank && !pcrs.is_empty())
            .map(|(_, p)| p.as_slice())
    }
}

/// Why no bank of this TPM can meet the control plane's PCR policy.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BankError {
    /// The challenge names only banks this bcd does not know.
    #[error("the control plane's PCR policy names only PCR banks this bcd cannot quote (TPM_ALG_IDs {0:?}): upgrade bcd")]
    Unknown(Vec<u32>),
    /// None of the banks the policy names is allocated.
    #[error("the control plane's PCR policy checks PCRs {pcrs} in the {wanted} bank, but this TPM has {has}: enable the {enable} PCR bank in the firmware's TPM settings (often \"TPM2 active PCR banks\"; it takes effect after a reboot)", pcrs = List(.pcrs), wanted = Banks(.wanted, " or "), has = Has(.allocated))]
    NotAllocated {
        /// The one to enable: the policy's preferred bank.
        enable: PcrBank,
        wanted: Vec<PcrBank>,
        pcrs: Vec<u32>,
        allocated: Allocation,
    },
    /// A boot policy's PCRs are allocated together in no bank.
    #[error("the control plane's boot policy checks PCRs {pcrs} against the event log, but no PCR bank of this TPM allocates all of them: allocate all PCRs of the SHA-256 bank in the firmware's TPM settings (\"TPM2 active PCR banks\")", pcrs = List(.pcrs))]
    NoneComplete { pcrs: Vec<u32> },
    /// The bank is there, without some of the PCRs.
    #[error("the control plane's PCR policy checks PCRs {pcrs} in the {bank} bank, but this TPM's {bank} bank lacks PCR {missing}: allocate all PCRs of the {bank} bank in the firmware's TPM settings", pcrs = List(.pcrs), missing = List(.missing))]
    Missing {
        bank: PcrBank,
        pcrs: Vec<u32>,
        missing: Vec<u32>,
    },
}

/// The bank to quote `pcrs` in: among those the challenge names (`algs`,
/// TPM_ALG_IDs; none is SHA-256), SHA-256 when the TPM allocates it with
/// every PCR, else SHA-1.
pub(super) fn choose(
    algs: &[u32],
    pcrs: &[u32],
    allocated: &Allocation,
) -> Result<PcrBank, BankError> {
    let wanted = PcrBank::from_challenge(algs);
    let Some(&enable) = wanted.first() else {
        return Err(BankError::Unknown(algs.to_vec()));
    };
    let mut pcrs = pcrs.to_vec();
    pcrs.sort_unstable();
    pcrs.dedup();
    let missing = |bank: PcrBank| -> Option<Vec<u32>> {
        let have = allocated.pcrs(bank)?;
        Some(pcrs.iter().filter(|p| !have.contains(p)).copied().collect())
    };
    if let Some(bank) = wanted
        .iter()
        .copied()
        .find(|b| missing(*b).is_some_and(|m| m.is_empty()))
    {
        return Ok(bank);
    }
    // Nothing fits: name the preferred bank that is there, else ask for one.
    match wanted.iter().find_map(|b| Some((*b, missing(*b)?))) {
        Some((bank, missing)) => Err(BankError::Missing {
            bank,
            pcrs,
            missing,
        }),
        None => Err(BankError::NotAllocated {
            enable,
            wanted,
            pcrs,
            allocated: allocated.clone(),
        }),
    }
}

impl Tpm {
    /// The allocated PCRs of each bank (GetCapability TPM_CAP_PCRS).
    pub(crate) fn pcr_allocation(&mut self) -> Result<Allocation, TpmError> {
        let (data, _) = cmd(
            "GetCapability",
            self.ctx.get_capability(CapabilityType::AssignedPcr, 0, 8),
        )?;
        let CapabilityData::AssignedPcr(list) = data else {
            return Err(TpmError::Unexpected("a capability of another kind"));
        };
        Ok(Allocation(
            list.get_selections()
                .iter()
                .filter_map(|s| {
                    let bank = bank_of(s.hashing_algorithm())?;
                    let pcrs = s
                        .selected()
                        .into_iter()
                        .map(|slot| u32::from(slot).trailing_zeros())
                        .collect();
                    Some((bank, pcrs))
                })
                .collect(),
        ))
    }

    /// The bank to quote the challenge's `pcrs` in ([`choose`]).
    pub(crate) fn pcr_bank_for(&mut self, algs: &[u32], pcrs: &[u32]) -> Result<PcrBank, TpmError> {
        let allocated = self.pcr_allocation()?;
        Ok(choose(algs, pcrs, &allocated)?)
    }
}

/// The banks a boot policy's quote selects ([`Tpm::populated_banks`]),
/// opaque outside this module: only `src/tpm/` speaks tss-esapi.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PopulatedBanks(pub(super) Vec<HashingAlgorithm>);

impl Tpm {
    /// The banks to quote `pcrs` in for a boot policy: every bank this TPM
    /// has allocated with all of them (any hash, SHA-384 and SM3 too), so
    /// the control plane replays the event log in each and no bank is left
    /// for a forged log to be extended into (one GetCapability). None: the
    /// error names what to enable.
    pub(crate) fn populated_banks(&mut self, pcrs: &[u32]) -> Result<PopulatedBanks, TpmError> {
        let (data, _) = cmd(
            "GetCapability",
            self.ctx.get_capability(CapabilityType::AssignedPcr, 0, 8),
        )?;
        let CapabilityData::AssignedPcr(list) = data else {
            return Err(TpmError::Unexpected("a capability of another kind"));
        };
        let banks: Vec<HashingAlgorithm> = list
            .get_selections()
            .iter()
            .filter(|s| {
                let have: Vec<u32> = s
                    .selected()
                    .into_iter()
                    .map(|slot| u32::from(slot).trailing_zeros())
                    .collect();
                !have.is_empty() && pcrs.iter().all(|p| have.contains(p))
            })
            .map(|s| s.hashing_algorithm())
            .collect();
        if banks.is_empty() {
            let mut pcrs = pcrs.to_vec();
            pcrs.sort_unstable();
            pcrs.dedup();
            return Err(BankError::NoneComplete { pcrs }.into());
        }
        Ok(PopulatedBanks(banks))
    }
}

/// The bank of a TPM hash, when bcd quotes it.
fn bank_of(alg: HashingAlgorithm) -> Option<PcrBank> {
    match alg {
        HashingAlgorithm::Sha256 => Some(PcrBank::Sha256),
        HashingAlgorithm::Sha1 => Some(PcrBank::Sha1),
        _ => None,
    }
}

/// The TPM hash of a bank.
pub(super) fn hashing(bank: PcrBank) -> HashingAlgorithm {
    match bank {
        PcrBank::Sha256 => HashingAlgorithm::Sha256,
        PcrBank::Sha1 => HashingAlgorithm::Sha1,
    }
}

/// "0, 7, 16".
struct List<'a>(&'a [u32]);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// "SHA-256 or SHA-1".
struct Banks<'a>(&'a [PcrBank], &'static str);

impl fmt::Display for Banks<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(self.1)?;
            }
            write!(f, "{b}")?;
        }
        Ok(())
    }
}

/// "only a SHA-1 bank", "no PCR bank bcd can quote".
struct Has<'a>(&'a Allocation);

impl fmt::Display for Has<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let banks: Vec<PcrBank> = (self.0)
            .0
            .iter()
            .filter(|(_, p)| !p.is_empty())
            .map(|(b, _)| *b)
            .collect();
        if banks.is_empty() {
            f.write_str("no SHA-256 or SHA-1 PCR bank")
        } else {
            write!(f, "only a {} bank", Banks(&banks, " and a "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(bank: PcrBank) -> (PcrBank, Vec<u32>) {
        (bank, (0..24).collect())
    }

    const SHA256: u32 = 0x0b;
    const SHA1: u32 = 0x04;

    #[test]
    fn sha256_when_allocated_else_sha1() {
        let both = Allocation(vec![all(PcrBank::Sha1), all(PcrBank::Sha256)]);
        let sha1 = Allocation(vec![all(PcrBank::Sha1)]);
        assert_eq!(choose(&[SHA1, SHA256], &[0], &both), Ok(PcrBank::Sha256));
        assert_eq!(choose(&[SHA256, SHA1], &[0], &sha1), Ok(PcrBank::Sha1));
        assert_eq!(choose(&[SHA1], &[0], &both), Ok(PcrBank::Sha1));
        // No pcr_banks: SHA-256, as control planes before the field meant.
        assert_eq!(choose(&[], &[0], &both), Ok(PcrBank::Sha256));
    }

    #[test]
    fn a_sha1_only_tpm_against_a_sha256_policy_is_told_what_to_enable() {
        let sha1 = Allocation(vec![all(PcrBank::Sha1), (PcrBank::Sha256, vec![])]);
        let e = choose(&[SHA256], &[7, 0], &sha1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the control plane's PCR policy checks PCRs 0, 7 in the SHA-256 bank, but this TPM \
             has only a SHA-1 bank: enable the SHA-256 PCR bank in the firmware's TPM settings \
             (often \"TPM2 active PCR banks\"; it takes effect after a reboot)"
        );
        let e = choose(&[], &[0], &Allocation::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("this TPM has no SHA-256 or SHA-1 PCR bank"),
            "{e}"
        );
    }

    #[test]
    fn a_bank_without_a_pcr_names_it() {
        let partial = Allocation(vec![(PcrBank::Sha256, (0..16).collect())]);
        let e = choose(&[SHA256, SHA1], &[23, 0, 17, 23], &partial).unwrap_err();
        assert_eq!(
            e,
            BankError::Missing {
                bank: PcrBank::Sha256,
                pcrs: vec![0, 17, 23],
                missing: vec![17, 23]
            }
        );
        assert!(e.to_string().contains("lacks PCR 17, 23"), "{e}");
        assert_eq!(
            choose(&[0x0c], &[0], &partial),
            Err(BankError::Unknown(vec![0x0c]))
        );
    }
}
