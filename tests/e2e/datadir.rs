//! The data directory is bcd's alone: no link in it is followed, and a
//! directory or file that another user owns or can write is refused with
//! what to fix.

use std::os::unix::fs::{symlink, PermissionsExt};

use crate::harness::*;

fn chmod(path: &std::path::Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A `journal.db` link planted in the data directory: bcd writes nothing
/// through it (the journal entry is lost, with a warning), the renewal works.
#[cfg(feature = "failpoints")]
#[test]
fn a_planted_journal_link_is_not_followed() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    // An empty file is one SQLite would happily make a database of.
    let victim = agent.root.path().join("victim");
    std::fs::write(&victim, b"").unwrap();
    std::fs::remove_file(agent.data_dir.join("journal.db")).unwrap();
    symlink(&victim, agent.data_dir.join("journal.db")).unwrap();
    // And one that points nowhere, which a create would make.
    let nowhere = agent.root.path().join("created-through-a-link");

    let out = agent.run(&["node", "--once", "--renew-now"]);
    assert_ok(&out);
    let err = stderr(&out);
    assert!(
        err.contains("journal.db is a symbolic link, and bcd follows no link in its data directory: remove it"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"",
        "nothing written through the link"
    );

    std::fs::remove_file(agent.data_dir.join("journal.db")).unwrap();
    symlink(&nowhere, agent.data_dir.join("journal.db")).unwrap();
    assert_ok(&agent.run(&["node", "--once", "--renew-now"]));
    assert!(!nowhere.exists(), "nothing created through the link");
    let doctor = stdout(&agent.run(&["doctor"]));
    assert!(doctor.contains("journal.db is a symbolic link"), "{doctor}");
}

/// An identity file that is a link, a data directory that others can
/// write, a file another user owns: refused, saying what to fix.
#[test]
fn links_loose_directories_and_foreign_files_are_refused() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let dir = &agent.data_dir;
    let identity = dir.join("identity.json");

    // identity.json moved away and linked back.
    let elsewhere = agent.root.path().join("identity.json");
    std::fs::rename(&identity, &elsewhere).unwrap();
    symlink(&elsewhere, &identity).unwrap();
    let out = agent.run(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("identity.json is a symbolic link"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_file(&identity).unwrap();
    std::fs::rename(&elsewhere, &identity).unwrap();
    assert_ok(&agent.run(&["status"]));

    chmod(dir, 0o777);
    let out = agent.run(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!(
            "is writable by group or others (mode 0777): chmod 700 {}",
            dir.display()
        )),
        "{}",
        stderr(&out)
    );
    let out = agent.join_with_token(&cp.token("node", &[]));
    assert_eq!(out.status.code(), Some(1), "join refuses too");
    chmod(dir, 0o700);

    chmod(&dir.join("node.key"), 0o666);
    let out = agent.run(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("chmod 600"), "{}", stderr(&out));
    chmod(&dir.join("node.key"), 0o600);

    // Another owner: only root can make one.
    if std::fs::metadata(dir).is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0) {
        std::os::unix::fs::chown(&identity, Some(65534), None).unwrap();
        let out = agent.run(&["status"]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            stderr(&out).contains(
                "is owned by uid 65534, but bcd runs as uid 0: give it to bcd's user (chown 0 "
            ),
            "{}",
            stderr(&out)
        );
    }
}
