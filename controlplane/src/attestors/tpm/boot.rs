//! The event log of a tpm join or renewal whose pool has a boot policy:
//! the quote verified under the AK ([`verified_quote`]), the log parsed
//! (`eventlog-malformed`), replayed in every bank the quote selects and
//! compared with the quoted values (`eventlog-replay`, naming the PCR, the
//! bank and the last event extending it), a PCR every boot extends never
//! extended in a quoted bank refused (`eventlog-bank-empty`,
//! CVE-2021-42299), then the facts the policy judges extracted and judged
//! ([`judge`]). One flow for the join and `Renew`: each maps a
//! [`BootFailure`] to its own place's reason of the same spelling. Known
//! firmware defects pass only by name ([`bc_eventlog::Quirk`]; none yet:
//! [`ALLOWED_QUIRKS`]).

use bc_eventlog::{BootFacts, Limits, PcrValues, Quirk};
use bc_wire::tpm::{self as wtpm, Attested, Public};

use crate::model::boot_policy::{self, BootPolicy, BootReason};

/// The firmware defects a log may pass with: none yet. The one
/// known ([`Quirk::ExitBootServicesNotLogged`]) lands in PCR 5, which no
/// boot policy needs, so it is never quoted; a policy key naming quirks
/// comes with the first defect in a PCR a policy needs (as the offline
/// `eventlog verify --allow-quirk` names it).
const ALLOWED_QUIRKS: &[Quirk] = &[];

/// Which check of the boot evidence failed: the join and `Renew` refuse
/// with the reason of their own place spelt the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BootCheck {
    QuoteSignature,
    QuoteNonce,
    QuotePcrs,
    EventlogMalformed,
    EventlogReplay,
    EventlogBankEmpty,
    Policy(BootReason),
}

/// `impl From<BootCheck> for $reason`: a place's reasons for the boot
/// checks are spelt as the join's and named alike (`QuoteSignature` …
/// `EventlogBankEmpty`, `BootSecureBoot` … `BootFirmware`), so the join and
/// `Renew` map them with this one table.
macro_rules! boot_check_reasons {
    ($reason:ident) => {
        impl From<$crate::attestors::tpm::boot::BootCheck> for $reason {
            fn from(c: $crate::attestors::tpm::boot::BootCheck) -> Self {
                use $crate::attestors::tpm::boot::BootCheck as C;
                use $crate::model::boot_policy::BootReason as B;
                match c {
                    C::QuoteSignature => $reason::QuoteSignature,
                    C::QuoteNonce => $reason::QuoteNonce,
                    C::QuotePcrs => $reason::QuotePcrs,
                    C::EventlogMalformed => $reason::EventlogMalformed,
                    C::EventlogReplay => $reason::EventlogReplay,
                    C::EventlogBankEmpty => $reason::EventlogBankEmpty,
                    C::Policy(B::SecureBoot) => $reason::BootSecureBoot,
                    C::Policy(B::App) => $reason::BootApp,
                    C::Policy(B::Dbx) => $reason::BootDbx,
                    C::Policy(B::Cmdline) => $reason::BootCmdline,
                    C::Policy(B::Firmware) => $reason::BootFirmware,
                }
            }
        }
    };
}
pub(crate) use boot_check_reasons;

/// A failed check, with what exactly failed and the event that decided it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BootFailure {
    pub check: BootCheck,
    pub detail: Option<String>,
    pub event: Option<usize>,
}

impl BootFailure {
    fn new(check: BootCheck, detail: String, event: Option<usize>) -> Self {
        BootFailure {
            check,
            detail: Some(detail),
            event,
        }
    }
}

impl From<BootCheck> for BootFailure {
    /// A quote that failed its own checks, said in words.
    fn from(check: BootCheck) -> Self {
        let detail = match check {
            BootCheck::QuoteSignature => "the quote is not signed by the node's AK",
            BootCheck::QuoteNonce => {
                "the quote is not over this request's challenge (a quote of another moment)"
            }
            BootCheck::QuotePcrs => {
                "the PCR values sent are not the ones the quote's digest covers"
            }
            _ => "",
        };
        BootFailure {
            check,
            detail: (!detail.is_empty()).then(|| detail.to_owned()),
            event: None,
        }
    }
}

/// A quote's PCR selection, as (hash, bitmap) entries, and its PCR digest.
pub(crate) type QuoteSelection = (Vec<(u16, Vec<u8>)>, Vec<u8>);

/// A quote by `ak` (already known to be the node's) over `nonce`: its PCR
/// selection and digest. Signed by the AK but not a quote (a
/// certification, say), or over another nonce: `quote-nonce`.
pub(crate) fn verified_quote(
    ak: &Public,
    quote: &[u8],
    signature: &[u8],
    nonce: &[u8],
) -> Result<QuoteSelection, BootCheck> {
    let attest = match wtpm::verify_attest(ak, quote, signature) {
        Ok(q) => q,
        Err(wtpm::TpmError::AttestType(_)) => return Err(BootCheck::QuoteNonce),
        Err(_) => return Err(BootCheck::QuoteSignature),
    };
    let Attested::Quote {
        selection,
        pcr_digest,
    } = attest.attested
    else {
        return Err(BootCheck::QuoteNonce);
    };
    if attest.extra_data != nonce {
        return Err(BootCheck::QuoteNonce);
    }
    Ok((selection, pcr_digest))
}

/// The pool's `policy` against `log` and the quoted values of every bank:
/// the facts that met it, or the check that failed.
pub(crate) fn judge(
    policy: &BootPolicy,
    log: &[u8],
    quoted: &PcrValues,
) -> Result<BootFacts, BootFailure> {
    let needed = boot_policy::needed_pcrs(policy);
    let always = boot_policy::always_extended(&needed);
    let facts = verified_facts(log, quoted, &needed, &always)?;
    boot_policy::judge(policy, &facts)
        .map_err(|b| BootFailure::new(BootCheck::Policy(b.reason), b.detail, b.event))?;
    Ok(facts)
}

/// The facts of `log`, once it replays to `quoted` (the quote's values, by
/// bank): `needed` are the policy's PCRs, each of which must be quoted and
/// explained by the log in every bank the log carries; `always` those of
/// them every boot extends (never-extended there: `eventlog-bank-empty`).
fn verified_facts(
    log: &[u8],
    quoted: &PcrValues,
    needed: &[u32],
    always: &[u32],
) -> Result<BootFacts, BootFailure> {
    let limits = Limits::default();
    if log.is_empty() {
        return Err(BootFailure::new(
            BootCheck::EventlogMalformed,
            "no event log was sent, and the node's pool has a boot policy (a policy set since the node asked: try again)".to_owned(),
            None,
        ));
    }
    let parsed = bc_eventlog::parse(log, &limits)
        .map_err(|e| BootFailure::new(BootCheck::EventlogMalformed, e.to_string(), None))?;
    for &pcr in needed {
        if !quoted.values().any(|bank| bank.contains_key(&pcr)) {
            return Err(BootFailure::new(
                BootCheck::QuotePcrs,
                format!("the quote does not select PCR {pcr}, which the pool's boot policy needs (a policy changed since the node asked: try again)"),
                None,
            ));
        }
    }
    let v = bc_eventlog::verify(&parsed, quoted, always, ALLOWED_QUIRKS);
    if let Some(&(alg, pcr)) = v.never_extended.first() {
        return Err(BootFailure::new(
            BootCheck::EventlogBankEmpty,
            format!(
                "PCR {pcr} in the {} bank was never extended (all zeros or all ones), though every boot extends it",
                alg.name()
            ),
            None,
        ));
    }
    if let Some(m) = v.mismatches.first() {
        return Err(BootFailure::new(
            BootCheck::EventlogReplay,
            format!(
                "PCR {} in the {} bank: the event log replays to {}, the TPM quoted {}",
                m.pcr,
                m.alg.name(),
                hex::encode(&m.replayed),
                hex::encode(&m.supplied)
            ),
            m.last_event,
        ));
    }
    // A needed PCR the log leaves out, in a bank it carries, that the TPM
    // shows extended: events the log does not show.
    let banks = parsed.banks();
    for &(alg, pcr) in &v.not_in_log {
        let value = quoted.get(&alg).and_then(|b| b.get(&pcr));
        let untouched =
            value.is_none_or(|x| x.iter().all(|&b| b == 0) || x.iter().all(|&b| b == 0xff));
        if needed.contains(&pcr) && banks.contains(&alg) && !untouched {
            return Err(BootFailure::new(
                BootCheck::EventlogReplay,
                format!(
                    "PCR {pcr} in the {} bank: the event log never extends it, the TPM quoted {}",
                    alg.name(),
                    value.map(hex::encode).unwrap_or_default()
                ),
                None,
            ));
        }
    }
    if v.matched.is_empty() {
        return Err(BootFailure::new(
            BootCheck::EventlogReplay,
            "the event log explains none of the quoted PCRs (no bank in common with the quote)"
                .to_owned(),
            None,
        ));
    }
    Ok(bc_eventlog::extract(&parsed, &limits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_eventlog::Alg;

    fn data(name: &str) -> Vec<u8> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../eventlog/tests/data")
            .join(name);
        std::fs::read(p).unwrap()
    }

    /// The replayed values of `log` in every bank, for `pcrs`.
    fn replayed(log: &[u8], pcrs: &[u32]) -> PcrValues {
        let parsed = bc_eventlog::parse(log, &Limits::default()).unwrap();
        let r = bc_eventlog::replay(&parsed, &[]);
        let mut out = PcrValues::new();
        for bank in &r.banks {
            for &p in pcrs {
                if let Some(v) = bank.value(p) {
                    out.entry(bank.alg).or_default().insert(p, v.to_vec());
                }
            }
        }
        out
    }

    fn reason(r: BootFailure) -> (String, String, Option<usize>) {
        let spelt = crate::attestors::tpm::TpmReason::from(r.check).as_str();
        (spelt.to_owned(), r.detail.unwrap(), r.event)
    }

    #[test]
    fn a_log_that_replays_gives_its_facts_and_one_altered_is_named() {
        let log = data("tpm2-tools/event-bootorder.bin");
        let pcrs = [0, 2, 4, 7];
        let quoted = replayed(&log, &pcrs);
        assert!(verified_facts(&log, &quoted, &pcrs, &pcrs).is_ok());
        // The TPM's PCR 4 is another value: that PCR, that bank, its last event.
        let mut other = quoted.clone();
        other.get_mut(&Alg::Sha256).unwrap().insert(4, vec![7; 32]);
        let (r, detail, event) = reason(verified_facts(&log, &other, &pcrs, &pcrs).unwrap_err());
        assert_eq!(r, "eventlog-replay");
        assert!(detail.starts_with("PCR 4 in the sha256 bank"), "{detail}");
        assert!(event.is_some());
        // A bank nobody extended, for a PCR every boot extends.
        let mut empty = quoted.clone();
        empty.get_mut(&Alg::Sha1).unwrap().insert(7, vec![0; 20]);
        let (r, detail, _) = reason(verified_facts(&log, &empty, &pcrs, &pcrs).unwrap_err());
        assert_eq!(r, "eventlog-bank-empty");
        assert!(detail.contains("PCR 7 in the sha1 bank"), "{detail}");
        // Not a log; no log; a needed PCR not quoted.
        let (r, _, _) = reason(verified_facts(b"bogus", &quoted, &pcrs, &pcrs).unwrap_err());
        assert_eq!(r, "eventlog-malformed");
        let (r, _, _) = reason(verified_facts(b"", &quoted, &pcrs, &pcrs).unwrap_err());
        assert_eq!(r, "eventlog-malformed");
        let (r, detail, _) = reason(verified_facts(&log, &quoted, &[12], &[]).unwrap_err());
        assert_eq!(r, "quote-pcrs");
        assert!(detail.contains("PCR 12"), "{detail}");
    }

    #[test]
    fn missing_exit_boot_services_events_are_no_quirk_a_join_allows() {
        let log = data("go-attestation/ebs_event_missing_eventlog");
        let parsed = bc_eventlog::parse(&log, &Limits::default()).unwrap();
        let r = bc_eventlog::replay(&parsed, &[Quirk::ExitBootServicesNotLogged]);
        let mut quoted = PcrValues::new();
        for bank in &r.banks {
            for p in [0, 5, 7] {
                if let Some(v) = bank.value(p) {
                    quoted.entry(bank.alg).or_default().insert(p, v.to_vec());
                }
            }
        }
        // PCRs 0 and 7 replay; PCR 5, quoted, shows the events the log lacks.
        let (r, detail, _) = reason(verified_facts(&log, &quoted, &[0, 7], &[0, 7]).unwrap_err());
        assert_eq!(r, "eventlog-replay");
        assert!(detail.starts_with("PCR 5 in the"), "{detail}");
        quoted.values_mut().for_each(|bank| {
            bank.remove(&5);
        });
        assert!(verified_facts(&log, &quoted, &[0, 7], &[0, 7]).is_ok());
    }
}
