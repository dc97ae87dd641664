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
    let file = agent.root.path().join("token2");
    std::fs::write(&file, &token).unwrap();
    let out = agent.run(&[
        "join",
        "--reset",
        "--yes",
        "--token-file",
        &file.to_string_lossy(),
    ]);
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
    let file = agent.root.path().join("bad");
    std::fs::write(
        &file,
        "tok_nosuch.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    )
    .unwrap();
    let out = agent.run(&[
        "join",
        "--reset",
        "--yes",
        "--token-file",
        &file.to_string_lossy(),
    ]);
    assert_access_denied(&out);
    agent.assert_nothing_written();
    assert!(agent
        .files()
        .iter()
        .any(|f| f.starts_with("identity.json.reset-")));
    // And a later join joins.
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
}
