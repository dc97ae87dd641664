//! `bcd join --reset`: moves the identity aside, deletes nothing.

use crate::harness::*;

#[test]
fn reset_without_yes_moves_nothing_and_exits_2() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let before = agent.files();

    let out = agent.run(&["join", "--reset"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        text.contains("identity.json") && text.contains("node.key"),
        "{text}"
    );
    assert_eq!(agent.files(), before, "nothing moved");
    assert_eq!(cp.nodes().len(), 1, "no join happened");
}

#[test]
fn reset_with_yes_moves_the_identity_aside_and_joins_as_new() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let first = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    let old_key = std::fs::read(agent.data_dir.join("node.key")).unwrap();
    std::fs::write(agent.data_dir.join("journal.db"), b"journal").unwrap();

    let token = cp.token("node", &[]);
    let out = output_within(agent.token_join(&token, &["--reset", "--yes"]), DEADLINE);
    assert_ok(&out);
    let second = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    assert_ne!(first, second, "a token join after a reset is a new machine");

    // Every old file is still there under <name>.reset-<UTC time>.
    let files = agent.files();
    for name in ["identity.json", "node.key", "journal.db"] {
        let moved: Vec<_> = files
            .iter()
            .filter(|f| f.starts_with(&format!("{name}.reset-")))
            .collect();
        assert_eq!(moved.len(), 1, "{name} moved aside once: {files:?}");
        let suffix = moved[0].rsplit_once(".reset-").unwrap().1;
        assert!(
            suffix.ends_with('Z') && suffix.len() >= 16,
            "UTC time suffix: {suffix}"
        );
    }
    let moved_key = files
        .iter()
        .find(|f| f.starts_with("node.key.reset-"))
        .unwrap();
    assert_eq!(
        std::fs::read(agent.data_dir.join(moved_key)).unwrap(),
        old_key,
        "nothing deleted"
    );
    let moved_journal = files
        .iter()
        .find(|f| f.starts_with("journal.db.reset-"))
        .unwrap();
    assert_eq!(
        std::fs::read(agent.data_dir.join(moved_journal)).unwrap(),
        b"journal",
        "the journal went with the identity"
    );
    assert_ne!(
        std::fs::read(agent.data_dir.join("journal.db")).unwrap(),
        b"journal",
        "the new node starts a journal of its own"
    );
}

#[test]
fn a_failed_join_after_a_reset_leaves_the_identity_moved_aside() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let bad = "tok_nosuch.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let out = cp.refused_once(Refusal::Join("join-token"), "token-unknown", || {
        output_within(agent.token_join(bad, &["--reset", "--yes"]), DEADLINE)
    });
    assert_access_denied(&out);
    assert_eq!(cp.nodes().len(), 1, "only the first join");
    agent.assert_nothing_written();
    assert!(agent
        .files()
        .iter()
        .any(|f| f.starts_with("identity.json.reset-")));
    // And a later join joins.
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
}

/// The recovery bcd prints for a node past the x509pop grace, run exactly
/// as printed: the first run (`bcd join --reset --yes`) carries no
/// credential, moves the identity aside and then fails for want of a
/// token; the identity stays moved aside, and the second run (`bcd join`,
/// the token in BCD_JOIN_TOKEN) joins as a new machine.
#[test]
fn the_printed_two_run_recovery_works() {
    let cp = ControlPlane::start();
    let agent = Agent::joined_at_offset(&cp, "-9d");
    let old = agent.status_json()["nodeId"].as_str().unwrap().to_owned();

    // Where bcd prints it: doctor's hint for a certificate past the grace.
    let doctor = stdout(&agent.run(&["doctor"]));
    let recipe = doctor
        .lines()
        .find_map(|l| l.split_once("join again: ").map(|(_, r)| r.to_owned()))
        .unwrap_or_else(|| panic!("no recipe in: {doctor}"));
    let runs: Vec<Vec<&str>> = recipe
        .split(", then ")
        .map(|run| run.split(' ').collect())
        .collect();
    assert_eq!(
        runs,
        [vec!["bcd", "join", "--reset", "--yes"], vec!["bcd", "join"]],
        "{recipe}"
    );

    // The first run, exactly: no token anywhere.
    let out = agent.run(&runs[0][1..]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("no join token"), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("moved ") && stdout(&out).contains("identity.json.reset-"),
        "{}",
        stdout(&out)
    );
    agent.assert_nothing_written();
    let moved = agent.files();
    for name in ["identity.json", "node.key"] {
        assert!(
            moved
                .iter()
                .any(|f| f.starts_with(&format!("{name}.reset-"))),
            "{name} moved aside: {moved:?}"
        );
    }

    // The second run, exactly, with the token in the environment.
    let out = agent
        .command(&runs[1][1..])
        .env("BCD_JOIN_TOKEN", cp.token("node", &[]))
        .within();
    assert_ok(&out);
    let new = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    assert_ne!(new, old, "a token join after a reset is a new machine");
    assert!(stdout(&out).contains(&format!("joined as {new}")));
}

/// An identity that loads is kept whatever state its certificate is in:
/// `bcd join` on a machine whose certificate expired answers `already
/// joined as <node>` and spends no token.
#[test]
fn an_expired_identity_is_already_joined() {
    let cp = ControlPlane::start();
    for offset in ["-25h", "-9d"] {
        let agent = Agent::joined_at_offset(&cp, offset);
        let node = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
        let before = agent.files();
        let token = cp.token("node", &[]);
        let out = agent.join_with_token(&token);
        assert_ok(&out);
        assert_eq!(stdout(&out).trim(), format!("already joined as {node}"));
        assert_eq!(agent.files(), before, "{offset}: nothing written");
        let id = token.split_once('.').unwrap().0;
        let tokens = cp.json(&["token", "list"]);
        let row = tokens
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .unwrap();
        assert_eq!(row["usesLeft"], 1, "{offset}: the token is not spent");
    }
}

/// A renewal that died after staging its next key leaves `node.key.next`
/// pending. `--reset` lists it without `--yes` and moves nothing; with
/// `--yes` it moves it aside with the others, under the same UTC time, and
/// deletes nothing.
#[cfg(feature = "failpoints")]
#[test]
fn reset_moves_a_pending_next_key_aside_with_the_others() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let out = agent
        .command(&["node", "--once", "--renew-now"])
        .env("BCD_FAILPOINT", "renew-before-request")
        .within();
    assert!(out.status.code().is_none(), "aborted: {}", stderr(&out));
    let pending = ["identity.json", "journal.db", "node.key", "node.key.next"];
    assert_eq!(agent.files(), pending);
    let contents: Vec<Vec<u8>> = pending
        .iter()
        .map(|n| std::fs::read(agent.data_dir.join(n)).unwrap())
        .collect();

    let out = agent.run(&["join", "--reset"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(text.contains("node.key.next"), "listed: {text}");
    assert_eq!(agent.files(), pending, "nothing moved");

    let out = output_within(
        agent.token_join(&cp.token("node", &[]), &["--reset", "--yes"]),
        DEADLINE,
    );
    assert_ok(&out);
    let files = agent.files();
    let mut stamps = Vec::new();
    for (name, before) in pending.iter().zip(&contents) {
        let moved: Vec<&String> = files
            .iter()
            .filter(|f| f.starts_with(&format!("{name}.reset-")))
            .collect();
        assert_eq!(moved.len(), 1, "{name} moved aside once: {files:?}");
        stamps.push(moved[0].rsplit_once(".reset-").unwrap().1.to_owned());
        assert_eq!(
            &std::fs::read(agent.data_dir.join(moved[0])).unwrap(),
            before,
            "{name}: nothing deleted or changed"
        );
    }
    assert!(
        stamps.iter().all(|s| *s == stamps[0] && s.ends_with('Z')),
        "one UTC time for all: {stamps:?}"
    );
    assert!(
        !files.contains(&"node.key.next".to_owned()),
        "the new node has no pending key: {files:?}"
    );
}
