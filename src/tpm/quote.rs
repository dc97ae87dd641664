//! The quote of round 2: only the PCRs the control plane's policy checks, in
//! the bank [`super::banks`] chose, with their values.
//!
//! The values are read before the quote, and the quote's own PCR digest says
//! whether they are still the quoted ones: IMA extends PCR 10 at any time, so
//! a PCR that moved in between makes bcd quote again (3 attempts at most)
//! rather than send values the control plane would refuse. No PCR asked for:
//! an empty selection, and no PCR_Read at all.
//!
//! The quote's pcrDigest is the AK's signing hash (SHA-256) over the values,
//! whatever the bank: a SHA-1 bank's 20-byte values are hashed with SHA-256
//! too (TPM 2.0 Part 3, TPM2_Quote: `PCRComputeCurrentDigest(inScheme.hashAlg,
//! …)`; go-attestation checks it with the AK's hash as well).

use bc_wire::pcr::PcrBank;
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::interface_types::session_handles::AuthSession;
use tss_esapi::structures::{
    Data, PcrSelectionList, PcrSelectionListBuilder, PcrSlot, SignatureScheme,
};

use super::banks::{hashing, PopulatedBanks};
use super::{cmd, marshal_attest, LoadedKey, Tpm, TpmError};

/// The failpoint that extends PCR 16 between the first read and quote.
pub(super) const EXTEND_FAILPOINT: &str = "quote-extend-pcr16";

/// Quotes made before bcd gives up on PCRs that keep moving.
pub(super) const QUOTE_ATTEMPTS: usize = 3;

pub struct Quote {
    pub attest: Vec<u8>,
    pub signature: Vec<u8>,
    /// The quoted PCRs' values, in selection order (ascending index).
    pub pcr_values: Vec<Vec<u8>>,
}

impl Tpm {
    /// A quote by `ak` with `extra_data` of the PCRs `pcrs` (any order,
    /// duplicates ignored) in `bank`, whose values match the quote's digest.
    /// `bank` must allocate them (the TPM would drop the others from the
    /// selection): [`Tpm::pcr_bank_for`].
    pub fn quote(
        &mut self,
        ak: &LoadedKey,
        extra_data: &[u8],
        pcrs: &[u32],
        bank: PcrBank,
    ) -> Result<Quote, TpmError> {
        self.quote_in(ak, extra_data, pcrs, &PopulatedBanks(vec![hashing(bank)]))
    }

    /// A quote of `pcrs` in every bank of `hashes` at once (one selection
    /// per bank, one Quote): a boot policy's, whose event log the control
    /// plane replays in each ([`Tpm::populated_banks`]). The values follow
    /// the selection as the TPM digests it: bank by bank in the list's
    /// order, each ascending.
    pub fn quote_in(
        &mut self,
        ak: &LoadedKey,
        extra_data: &[u8],
        pcrs: &[u32],
        banks: &PopulatedBanks,
    ) -> Result<Quote, TpmError> {
        let slots = slots_of(pcrs)?;
        let mut builder = PcrSelectionListBuilder::new();
        for hash in &banks.0 {
            builder = builder.with_selection(*hash, &slots);
        }
        let selection = builder.build().map_err(|source| TpmError::Command {
            command: "Quote",
            source,
        })?;
        let mut first = true;
        consistent(|| {
            let extend = std::mem::take(&mut first) && crate::failpoint::active(EXTEND_FAILPOINT);
            self.quote_once(ak, extra_data, &selection, extend)
        })
    }

    /// PCR_Read of `selection`, then Quote: not checked against each other.
    fn quote_once(
        &mut self,
        ak: &LoadedKey,
        extra_data: &[u8],
        selection: &PcrSelectionList,
        extend: bool,
    ) -> Result<Quote, TpmError> {
        let mut values = Vec::new();
        for s in selection.get_selections() {
            let mut slots = s.selected();
            slots.sort_unstable_by_key(|slot| u32::from(*slot));
            values.extend(self.pcr_values(s.hashing_algorithm(), &slots)?);
        }
        if extend {
            self.extend_pcr16()?;
        }
        let data = Data::try_from(extra_data.to_vec()).map_err(|source| TpmError::Command {
            command: "Quote",
            source,
        })?;
        let handle = ak.handle;
        let selection = selection.clone();
        let (attest, sig) = cmd(
            "Quote",
            self.ctx
                .execute_with_session(Some(AuthSession::Password), |c| {
                    c.quote(handle, data, SignatureScheme::Null, selection)
                }),
        )?;
        let (attest, signature) = marshal_attest(&attest, &sig)?;
        Ok(Quote {
            attest,
            signature,
            pcr_values: values,
        })
    }

    /// Test only ([`EXTEND_FAILPOINT`]): PCR 16 extended with sha256("bcd"),
    /// as IMA would extend PCR 10 between the read and the quote.
    fn extend_pcr16(&mut self) -> Result<(), TpmError> {
        use tss_esapi::handles::PcrHandle;
        use tss_esapi::structures::{Digest, DigestValues};
        let digest = cmd(
            "PCR_Extend",
            Digest::try_from(bc_wire::sha256(b"bcd").to_vec()),
        )?;
        let mut values = DigestValues::new();
        values.set(HashingAlgorithm::Sha256, digest);
        cmd(
            "PCR_Extend",
            self.ctx
                .execute_with_session(Some(AuthSession::Password), |c| {
                    c.pcr_extend(PcrHandle::Pcr16, values)
                }),
        )
    }

    /// The values of `slots` in bank `hash`, in order; PCR_Read answers at
    /// most 8 digests at a time, and none is sent for no slot.
    fn pcr_values(
        &mut self,
        hash: HashingAlgorithm,
        slots: &[PcrSlot],
    ) -> Result<Vec<Vec<u8>>, TpmError> {
        let mut values = Vec::with_capacity(slots.len());
        for chunk in slots.chunks(8) {
            let sel = PcrSelectionListBuilder::new()
                .with_selection(hash, chunk)
                .build()
                .map_err(|source| TpmError::Command {
                    command: "PCR_Read",
                    source,
                })?;
            let (_, _, digests) = cmd("PCR_Read", self.ctx.pcr_read(sel))?;
            if digests.value().len() != chunk.len() {
                return Err(TpmError::Unexpected("fewer PCR values than asked for"));
            }
            values.extend(digests.value().iter().map(|d| d.value().to_vec()));
        }
        Ok(values)
    }
}

/// The PCR slots of `pcrs`, ascending, each once.
fn slots_of(pcrs: &[u32]) -> Result<Vec<PcrSlot>, TpmError> {
    let mut indices: Vec<u32> = pcrs.to_vec();
    indices.sort_unstable();
    indices.dedup();
    indices
        .into_iter()
        .map(|i| {
            if i > 23 {
                return Err(TpmError::Unexpected("a PCR index above 23 to quote"));
            }
            PcrSlot::try_from(1u32 << i).map_err(|source| TpmError::Command {
                command: "Quote",
                source,
            })
        })
        .collect()
}

/// Runs `attempt` until its values match its quote, [`QUOTE_ATTEMPTS`] times
/// at most; a PCR that never holds still is an error, not a refused join.
fn consistent(mut attempt: impl FnMut() -> Result<Quote, TpmError>) -> Result<Quote, TpmError> {
    for n in 1..=QUOTE_ATTEMPTS {
        let quote = attempt()?;
        if values_match(&quote.attest, &quote.pcr_values)? {
            return Ok(quote);
        }
        if n < QUOTE_ATTEMPTS {
            tracing::info!(
                attempt = n,
                "a quoted PCR was extended between PCR_Read and Quote; quoting again"
            );
        }
    }
    Err(TpmError::PcrsMoving(QUOTE_ATTEMPTS))
}

/// Whether `values` hash to the quote's PCR digest (SHA-256, the AK's
/// signing hash, whatever the bank).
fn values_match(attest: &[u8], values: &[Vec<u8>]) -> Result<bool, TpmError> {
    let parsed = bc_wire::tpm::Attest::parse(attest)
        .map_err(|_| TpmError::Unexpected("a quote that does not parse"))?;
    let bc_wire::tpm::Attested::Quote { pcr_digest, .. } = parsed.attested else {
        return Err(TpmError::Unexpected("an attestation that is not a quote"));
    };
    Ok(bc_wire::sha256(&values.concat()).as_slice() == pcr_digest.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TPMS_ATTEST of a quote of PCR 10 (SHA-256) whose digest is that of `quoted`.
    fn attest_of(quoted: &[u8]) -> Vec<u8> {
        let mut a = vec![0xff, 0x54, 0x43, 0x47, 0x80, 0x18];
        a.extend_from_slice(&[0, 0]); // qualifiedSigner
        a.extend_from_slice(&[0, 0]); // extraData
        a.extend_from_slice(&[0; 17]); // clockInfo
        a.extend_from_slice(&[0; 8]); // firmwareVersion
        a.extend_from_slice(&[0, 0, 0, 1, 0x00, 0x0b, 3, 0x00, 0x04, 0x00]);
        a.extend_from_slice(&[0, 32]);
        a.extend_from_slice(&bc_wire::sha256(quoted));
        a
    }

    fn quote_of(quoted_pcr10: u8, read_pcr10: u8) -> Quote {
        Quote {
            attest: attest_of(&[quoted_pcr10; 32]),
            signature: Vec::new(),
            pcr_values: vec![vec![read_pcr10; 32]],
        }
    }

    #[test]
    fn values_read_before_an_extend_are_quoted_again() {
        // PCR 10 moves once between the read and the quote, then holds.
        let mut attempts = 0;
        let q = consistent(|| {
            attempts += 1;
            Ok(if attempts == 1 {
                quote_of(2, 1)
            } else {
                quote_of(2, 2)
            })
        })
        .unwrap();
        assert_eq!(attempts, 2);
        assert_eq!(q.pcr_values, vec![vec![2; 32]]);
    }

    #[test]
    fn matching_values_need_one_quote() {
        let mut attempts = 0;
        consistent(|| {
            attempts += 1;
            Ok(quote_of(7, 7))
        })
        .unwrap();
        assert_eq!(attempts, 1);
    }

    #[test]
    fn a_pcr_that_never_holds_still_fails_after_three_quotes() {
        let mut attempts = 0u8;
        let e = consistent(|| {
            attempts += 1;
            Ok(quote_of(attempts + 1, attempts))
        })
        .err()
        .unwrap();
        assert_eq!(attempts, 3);
        assert!(e.to_string().contains("3 quotes"), "{e}");
    }

    #[test]
    fn no_pcr_is_an_empty_selection_with_no_value() {
        assert!(slots_of(&[]).unwrap().is_empty());
        assert_eq!(
            slots_of(&[10, 0, 10]).unwrap(),
            vec![PcrSlot::Slot0, PcrSlot::Slot10]
        );
        assert!(slots_of(&[24]).is_err());
        let empty = attest_of(&[]);
        assert!(values_match(&empty, &[]).unwrap());
    }
}
