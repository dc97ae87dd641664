//! The control plane's TCG event-log handling (bc-eventlog): parse,
//! replay, verify and extract, on whatever bytes an agent could send.

use bc_eventlog::{
    extract, parse, parse_signature_update, replay, verify, Limits, PcrValues, Quirk,
};

/// The whole input is a log. What must hold: events within the input and
/// the limits; a bank's values are its digest size; a log verifies
/// against its own replay without any quirk; extraction never panics.
pub fn eventlog(data: &[u8]) {
    let limits = Limits {
        max_entries: 256,
        ..Limits::default()
    };
    let _ = parse_signature_update(data, limits.max_entries);
    let Ok(log) = parse(data, &limits) else {
        return;
    };
    assert!(!log.events.is_empty() && log.events.len() <= limits.max_events);
    for (i, e) in log.events.iter().enumerate() {
        assert_eq!(e.index, i);
        assert!(e.offset < data.len() && e.data.len() <= limits.max_event_bytes);
    }
    let r = replay(&log, &[]);
    let mut own = PcrValues::new();
    for bank in &r.banks {
        for pcr in bank.pcrs() {
            let value = bank.value(pcr).unwrap_or_default();
            assert_eq!(value.len(), bank.alg.size());
            own.entry(bank.alg).or_default().insert(pcr, value.to_vec());
        }
    }
    let v = verify(&log, &own, &[0, 7], &[Quirk::ExitBootServicesNotLogged]);
    assert!(v.mismatches.is_empty() && v.quirks.is_empty());
    assert_eq!(v.ok(), !v.matched.is_empty() && v.never_extended.is_empty());
    let facts = extract(&log, &limits);
    for a in &facts.boot_apps {
        for i in &a.new_authorities {
            assert!(*i < facts.authorities.len());
        }
    }
}
