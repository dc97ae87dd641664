//! The event log's retention: `events prune` and `[events] retention`.

use crate::harness::*;

#[test]
fn events_prune_deletes_what_the_retention_expired() {
    let cp = ControlPlane::start_with_config("[events]\nretention = \"1d\"\n");
    let agent = Agent::new(&cp);
    let token = cp.token("node", &[]);
    let (id, _) = token.split_once('.').unwrap();
    let forged = format!("{id}.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    assert_access_denied(&agent.join_with_token(&forged));
    assert_eq!(cp.refusal_reasons(), ["token-secret"]);

    // Nothing is a day old yet.
    let out = cp.cli(&["events", "prune"]);
    assert_ok(&out);
    assert!(
        stdout(&out).starts_with("deleted 0 events"),
        "{}",
        stdout(&out)
    );
    assert_eq!(cp.events().len(), 1);
    let out = cp.cli(&["events", "prune", "--older-than", "5m"]);
    assert!(!out.status.success(), "--older-than below 1h is refused");

    // Two days later, the refusal has expired.
    assert_ok(&cp.cli(&["clock", "set", "--offset", "2d"]));
    let out = cp.cli(&["events", "prune"]);
    assert_ok(&out);
    assert!(
        stdout(&out).starts_with("deleted 1 events"),
        "{}",
        stdout(&out)
    );
    assert!(cp.events().is_empty());
}
