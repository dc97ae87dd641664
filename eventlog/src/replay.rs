//! Replay: the PCR values a log produces in each bank, and their
//! comparison with the values a TPM quoted. Known firmware defects are
//! handled only by name ([`Quirk`]), only when the caller allows them,
//! only when nothing else matches, and are reported when used.

use std::collections::BTreeMap;

use crate::alg::Alg;
use crate::parse::{EventLog, EV_NO_ACTION, MAX_PCR};

/// The number of PCRs of a PC Client TPM.
pub const PCRS: usize = MAX_PCR as usize + 1;

/// EV_EFI_ACTION.
const EV_EFI_ACTION: u32 = 0x8000_0007;
const EBS_INVOCATION: &[u8] = b"Exit Boot Services Invocation";
const EBS_SUCCESS: &[u8] = b"Exit Boot Services Returned with Success";
/// The EV_NO_ACTION event that says which locality started the TPM.
const STARTUP_LOCALITY: &[u8; 16] = b"StartupLocality\0";

/// A firmware defect a verifier may choose to accept, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Quirk {
    /// The firmware extended the two EV_EFI_ACTION Exit Boot Services
    /// strings ("Exit Boot Services Invocation", "... Returned with
    /// Success") into PCR 5 without logging them (go-attestation's
    /// ebs_event_missing_eventlog).
    ExitBootServicesNotLogged,
}

impl Quirk {
    pub fn name(self) -> &'static str {
        match self {
            Quirk::ExitBootServicesNotLogged => "ExitBootServicesNotLogged",
        }
    }
}

/// One bank's replayed PCRs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bank {
    pub alg: Alg,
    values: Vec<Vec<u8>>,
    /// PCRs the log sets (an extension, or the startup locality).
    touched: u32,
    /// PCRs an event extends without a digest for this bank: unknown.
    missing: u32,
    /// The last event that extended each PCR (for messages).
    last_event: [Option<usize>; PCRS],
}

impl Bank {
    /// The value the log produces for `pcr`, if the log extends it.
    pub fn value(&self, pcr: u32) -> Option<&[u8]> {
        if pcr as usize >= PCRS || self.touched & !self.missing & (1 << pcr) == 0 {
            return None;
        }
        self.values.get(pcr as usize).map(Vec::as_slice)
    }

    /// The PCRs the log extends in this bank, ascending (those with a
    /// value: see [`Bank::incomplete`]).
    pub fn pcrs(&self) -> impl Iterator<Item = u32> + '_ {
        (0..PCRS as u32).filter(|p| self.touched & !self.missing & (1 << p) != 0)
    }

    /// PCRs some event extends without a digest for this bank: the log
    /// cannot say their value in it.
    pub fn incomplete(&self) -> impl Iterator<Item = u32> + '_ {
        (0..PCRS as u32).filter(|p| self.missing & (1 << p) != 0)
    }

    /// The index of the last event extending `pcr`.
    pub fn last_event(&self, pcr: u32) -> Option<usize> {
        self.last_event.get(pcr as usize).copied().flatten()
    }
}

/// Every bank the log can be replayed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub banks: Vec<Bank>,
    /// The quirks this replay applied.
    pub quirks: Vec<Quirk>,
}

impl Replay {
    pub fn bank(&self, alg: Alg) -> Option<&Bank> {
        self.banks.iter().find(|b| b.alg == alg)
    }
}

/// Replays `log` in every bank it carries, applying `quirks`.
pub fn replay(log: &EventLog, quirks: &[Quirk]) -> Replay {
    let mut banks = Vec::new();
    for alg in log.banks() {
        let mut bank = Bank {
            alg,
            values: (0..PCRS)
                .map(|p| {
                    // PCRs 17-22 reset to all ones (the DRTM PCRs).
                    let fill = if (17..=22).contains(&p) { 0xff } else { 0 };
                    vec![fill; alg.size()]
                })
                .collect(),
            touched: 0,
            missing: 0,
            last_event: [None; PCRS],
        };
        let mut ebs_logged = false;
        for e in &log.events {
            let pcr = e.pcr as usize;
            if e.event_type == EV_NO_ACTION {
                // A locality-3 or -4 startup sets PCR 0's initial value
                // (PFP spec 10.4.5.3); nothing else of EV_NO_ACTION counts.
                if e.pcr == 0 && e.data.len() == 17 && e.data.starts_with(STARTUP_LOCALITY) {
                    let locality = e.data[16];
                    if locality == 3 || locality == 4 {
                        if let Some(last) = bank.values[0].last_mut() {
                            *last = locality;
                        }
                        bank.touched |= 1;
                    }
                }
                continue;
            }
            // parse() refuses these; an EventLog built by hand may not.
            if pcr >= PCRS {
                continue;
            }
            if e.pcr == 5 && e.event_type == EV_EFI_ACTION && e.data.starts_with(EBS_INVOCATION) {
                ebs_logged = true;
            }
            let Some(digest) = e.digest(alg) else {
                bank.missing |= 1 << pcr;
                continue;
            };
            alg.extend(&mut bank.values[pcr], digest);
            bank.touched |= 1 << pcr;
            bank.last_event[pcr] = Some(e.index);
        }
        if quirks.contains(&Quirk::ExitBootServicesNotLogged) && !ebs_logged {
            for s in [EBS_INVOCATION, EBS_SUCCESS] {
                let d = alg.hash(s);
                alg.extend(&mut bank.values[5], &d);
            }
            bank.touched |= 1 << 5;
        }
        banks.push(bank);
    }
    Replay {
        banks,
        quirks: quirks.to_vec(),
    }
}

/// PCR values as a TPM reported them: bank, then PCR index, then value.
pub type PcrValues = BTreeMap<Alg, BTreeMap<u32, Vec<u8>>>;

/// A PCR whose replayed value is not the supplied one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub alg: Alg,
    pub pcr: u32,
    pub replayed: Vec<u8>,
    pub supplied: Vec<u8>,
    /// The last event of the log extending this PCR.
    pub last_event: Option<usize>,
}

/// The outcome of comparing a log with supplied PCR values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verification {
    /// Supplied PCRs the log extends to a different value.
    pub mismatches: Vec<Mismatch>,
    /// PCRs the caller needs whose supplied value is all zeros or all
    /// ones: that bank was never extended, so anyone can extend it to
    /// match a forged log (CVE-2021-42299).
    pub never_extended: Vec<(Alg, u32)>,
    /// Supplied PCRs the log does not extend (in that bank, or at all):
    /// reported, not failed; a policy decides whether it needs them.
    pub not_in_log: Vec<(Alg, u32)>,
    /// Supplied PCRs the log reproduces.
    pub matched: Vec<(Alg, u32)>,
    /// The quirks that had to be applied for the values to match.
    pub quirks: Vec<Quirk>,
}

impl Verification {
    /// True when the log explains at least one supplied PCR, contradicts
    /// none, and no needed PCR sits in a never-extended bank.
    pub fn ok(&self) -> bool {
        self.mismatches.is_empty() && self.never_extended.is_empty() && !self.matched.is_empty()
    }
}

/// Compares the log's replay with `supplied`. `needed` are the PCRs the
/// caller's policy relies on (checked for never-extended banks).
/// `allowed` quirks are tried, one at a time, only if the plain replay
/// does not match.
pub fn verify(
    log: &EventLog,
    supplied: &PcrValues,
    needed: &[u32],
    allowed: &[Quirk],
) -> Verification {
    let plain = compare(&replay(log, &[]), supplied, needed);
    if plain.mismatches.is_empty() {
        return plain;
    }
    for quirk in allowed {
        let with = compare(&replay(log, &[*quirk]), supplied, needed);
        if with.mismatches.is_empty() && !with.matched.is_empty() {
            return with;
        }
    }
    plain
}

fn compare(replay: &Replay, supplied: &PcrValues, needed: &[u32]) -> Verification {
    let mut v = Verification {
        quirks: replay.quirks.clone(),
        ..Verification::default()
    };
    for (alg, values) in supplied {
        for (&pcr, value) in values {
            if needed.contains(&pcr)
                && (value.iter().all(|&b| b == 0) || value.iter().all(|&b| b == 0xff))
            {
                v.never_extended.push((*alg, pcr));
            }
            let bank = replay.bank(*alg);
            match bank.and_then(|b| b.value(pcr)) {
                None => v.not_in_log.push((*alg, pcr)),
                Some(r) if r == value.as_slice() => v.matched.push((*alg, pcr)),
                Some(r) => v.mismatches.push(Mismatch {
                    alg: *alg,
                    pcr,
                    replayed: r.to_vec(),
                    supplied: value.clone(),
                    last_event: bank.and_then(|b| b.last_event(pcr)),
                }),
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{Digest, Event, Format};

    fn event(
        index: usize,
        pcr: u32,
        event_type: u32,
        digests: &[(Alg, &[u8])],
        data: &[u8],
    ) -> Event {
        Event {
            index,
            offset: index * 100,
            pcr,
            event_type,
            digests: digests
                .iter()
                .map(|(a, v)| Digest {
                    alg_id: a.id(),
                    value: v.to_vec(),
                })
                .collect(),
            data: data.to_vec(),
        }
    }

    fn log(events: Vec<Event>) -> EventLog {
        EventLog {
            format: Format::CryptoAgile,
            algorithms: vec![(Alg::Sha256.id(), 32), (Alg::Sm3_256.id(), 32)],
            events,
            trailing_padding: 0,
        }
    }

    #[test]
    fn sm3_is_the_standard_hash() {
        assert_eq!(
            Alg::Sm3_256.hash(b"abc"),
            [
                0x66, 0xc7, 0xf0, 0xf4, 0x62, 0xee, 0xed, 0xd9, 0xd1, 0xf2, 0xd4, 0x6b, 0xdc, 0x10,
                0xe4, 0xe2, 0x41, 0x67, 0xc4, 0x87, 0x5c, 0xf2, 0xf7, 0xa2, 0x29, 0x7d, 0xa0, 0x2b,
                0x8f, 0x4b, 0xa8, 0xe0
            ]
        );
    }

    #[test]
    fn locality_3_startup_sets_pcr0_and_every_bank_replays() {
        let d = [7u8; 32];
        let mut locality = STARTUP_LOCALITY.to_vec();
        locality.push(3);
        let l = log(vec![
            event(0, 0, EV_NO_ACTION, &[], b"Spec ID Event03\0"),
            event(
                1,
                0,
                EV_NO_ACTION,
                &[(Alg::Sha256, &[0; 32]), (Alg::Sm3_256, &[0; 32])],
                &locality,
            ),
            event(2, 0, 8, &[(Alg::Sha256, &d), (Alg::Sm3_256, &d)], b"v"),
        ]);
        let r = replay(&l, &[]);
        for alg in [Alg::Sha256, Alg::Sm3_256] {
            let mut start = [0u8; 32];
            start[31] = 3;
            let want = alg.hash(&[&start[..], &d[..]].concat());
            assert_eq!(r.bank(alg).unwrap().value(0), Some(&want[..]), "{alg:?}");
            assert_eq!(r.bank(alg).unwrap().last_event(0), Some(2));
        }
    }

    #[test]
    fn a_bank_missing_a_digest_is_unknown_not_wrong() {
        let l = log(vec![
            event(0, 0, EV_NO_ACTION, &[], b""),
            event(
                1,
                4,
                5,
                &[(Alg::Sha256, &[1; 32]), (Alg::Sm3_256, &[1; 32])],
                b"",
            ),
            event(2, 4, 5, &[(Alg::Sha256, &[2; 32])], b""),
        ]);
        let r = replay(&l, &[]);
        let sm3 = r.bank(Alg::Sm3_256).unwrap();
        assert_eq!(sm3.value(4), None);
        assert_eq!(sm3.incomplete().collect::<Vec<_>>(), vec![4]);
        let mut supplied = PcrValues::new();
        supplied
            .entry(Alg::Sm3_256)
            .or_default()
            .insert(4, vec![9; 32]);
        let sha = r.bank(Alg::Sha256).unwrap().value(4).unwrap().to_vec();
        supplied.entry(Alg::Sha256).or_default().insert(4, sha);
        let v = verify(&l, &supplied, &[], &[]);
        assert!(v.ok(), "{v:?}");
        assert_eq!(v.not_in_log, vec![(Alg::Sm3_256, 4)]);
    }

    #[test]
    fn mismatch_names_bank_pcr_and_event_and_empty_banks_are_caught() {
        let l = log(vec![
            event(0, 0, EV_NO_ACTION, &[], b""),
            event(
                1,
                7,
                4,
                &[(Alg::Sha256, &[1; 32]), (Alg::Sm3_256, &[1; 32])],
                b"",
            ),
        ]);
        let mut supplied = PcrValues::new();
        supplied
            .entry(Alg::Sha256)
            .or_default()
            .insert(7, vec![3; 32]);
        let v = verify(&l, &supplied, &[7], &[Quirk::ExitBootServicesNotLogged]);
        assert!(!v.ok());
        assert_eq!(v.mismatches.len(), 1);
        let m = &v.mismatches[0];
        assert_eq!((m.alg, m.pcr, m.last_event), (Alg::Sha256, 7, Some(1)));
        assert!(v.quirks.is_empty(), "a quirk on PCR 5 cannot fix PCR 7");
        // A needed PCR quoted as all zeros or all ones: never extended.
        for fill in [0u8, 0xff] {
            let mut s = PcrValues::new();
            s.entry(Alg::Sm3_256).or_default().insert(0, vec![fill; 32]);
            let v = verify(&l, &s, &[0], &[]);
            assert_eq!(v.never_extended, vec![(Alg::Sm3_256, 0)]);
            assert!(!v.ok());
        }
    }
}
