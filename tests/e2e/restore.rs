//! docs/operations.md's restore of the control plane's database, as an operator does
//! it, and what its nodes then see: a node that renewed after the backup
//! holds a certificate the restored database never issued, so its renewal
//! is refused `unknown-certificate`, and so is its x509pop re-join once the
//! certificate expired (a site's calls would be too). It recovers by joining again: a TPM node with
//! `bcd join --reset --yes --attestor tpm` (its EK's binding, in the backup,
//! takes its node back in place), a node bound to its product UUID with a
//! token that allows a reclaim (in place too), any other token node with
//! `bcd join --reset --yes` and a new token (a new node; the old one is
//! deleted). Product UUIDs come from a fake sysfs (failpoints builds).

use std::path::Path;
use std::process::Command;

use crate::harness::*;
use crate::provisioned::{join_as, machine, node_id, UUID};

fn renew(agent: &Agent) -> std::process::Output {
    agent.run(&["node", "--once", "--renew-now"])
}

/// docs/operations.md's backup: `sqlite3 DIR/controlplane.db ".backup FILE"`.
fn backup(cp: &ControlPlane, file: &Path) {
    let db = cp.path().join("controlplane.db");
    let out = Command::new("sqlite3")
        .arg(&db)
        .arg(format!(".backup {}", file.display()))
        .within();
    assert_ok(&out);
}

/// docs/operations.md's restore: stop `serve`, copy FILE over `DIR/controlplane.db`,
/// remove the `-wal`/`-shm` beside it, `migrate`, start `serve` again (on
/// the address the agents know).
fn restore(cp: ControlPlane, file: &Path) -> ControlPlane {
    let listen = cp.url.trim_start_matches("https://").to_owned();
    let mut cp = cp;
    cp.stop();
    let db = cp.path().join("controlplane.db");
    std::fs::copy(file, &db).unwrap();
    for side in ["controlplane.db-wal", "controlplane.db-shm"] {
        match std::fs::remove_file(cp.path().join(side)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("{side}: {e}"),
        }
    }
    assert_ok(&cp.cli(&["migrate"]));
    cp.serve_on(&listen)
}

/// On SQLite, docs/operations.md's `sqlite3 .backup` (PostgreSQL's `pg_dump` and
/// `pg_restore` move the database back the same way).
#[test]
fn nodes_that_renewed_after_a_restored_backup_recover_by_joining_again() {
    let cp = ControlPlane::start_trusting_test_maker_on(Backend::Sqlite, "");
    let tpm = Swtpm::start();
    let tpm_node = Agent::tpm_joined(&cp, &tpm);
    let token_node = Agent::new(&cp);
    assert_ok(&token_node.join_with_token(&cp.token("node", &[])));
    let uuid_node = machine(&cp, Some(UUID));
    let bound = cp.token("node", &["--expect-product-uuid", UUID]);
    assert_ok(&join_as(&uuid_node, "join-token", &bound));
    let (tpm_id, token_id, uuid_id) = (
        node_id(&tpm_node),
        node_id(&token_node),
        node_id(&uuid_node),
    );
    let all = [&tpm_node, &token_node, &uuid_node];

    let file = cp.path().join("backup.db");
    backup(&cp, &file);
    // After the backup both renew: their certificates are not in it.
    for agent in all {
        assert_ok(&renew(agent));
    }
    let cp = restore(cp, &file);

    // What they see: each renewal refused, ACCESS_DENIED at the agent and
    // `unknown-certificate` at the control plane, again at every try.
    for agent in all {
        for _ in 0..2 {
            let out = cp.refused_once(Refusal::Renew, "unknown-certificate", || renew(agent));
            assert_renew_refused(&out);
        }
    }
    // Nor does waiting for the certificate to expire help: the x509pop
    // re-join (the machine was off 25 hours: both clocks move) is refused
    // for the same reason, ACCESS_DENIED at the agent.
    assert_ok(&cp.cli(&["clock", "set", "--offset", "25h"]));
    let out = cp.refused_once(Refusal::Join("x509pop"), "unknown-certificate", || {
        token_node
            .command(&["node", "--once"])
            .env("BCD_CLOCK_OFFSET", "+25h")
            .within()
    });
    assert_access_denied(&out);
    assert!(
        stderr(&out).contains(&format!("re-joining with x509pop as {token_id}")),
        "{}",
        stderr(&out)
    );
    assert_ok(&cp.cli(&["clock", "set", "--offset", "0s"]));

    // A plain `bcd join` changes nothing: the identity still loads.
    let out = tpm_node.run(&["join", "--attestor", "tpm"]);
    assert_ok(&out);
    assert_eq!(stdout(&out).trim(), format!("already joined as {tpm_id}"));

    // The TPM node: reset and join with its TPM; its EK's binding (in the
    // backup) takes the same node back, no operator step.
    let out = tpm_node.run(&["join", "--reset", "--yes", "--attestor", "tpm"]);
    assert_ok(&out);
    assert_eq!(node_id(&tpm_node), tpm_id, "the same node, in place");
    assert_ok(&renew(&tpm_node));

    // The node bound to its product UUID: reset and join with a token that
    // allows the reclaim; the same node, in place.
    let reclaim = cp.token("node", &["--expect-product-uuid", UUID, "--allow-reclaim"]);
    let out = output_within(
        uuid_node.token_join(&reclaim, &["--reset", "--yes"]),
        DEADLINE,
    );
    assert_ok(&out);
    assert_eq!(node_id(&uuid_node), uuid_id, "the same node, in place");
    assert_ok(&renew(&uuid_node));

    // The token node: reset and join with a new token: a new node. The old
    // one renews no more; the operator deletes it.
    let out = output_within(
        token_node.token_join(&cp.token("node", &[]), &["--reset", "--yes"]),
        DEADLINE,
    );
    assert_ok(&out);
    let new_id = node_id(&token_node);
    assert_ne!(new_id, token_id);
    assert_ok(&renew(&token_node));
    assert_ok(&cp.cli(&["nodes", "cordon", &token_id]));
    assert_ok(&cp.cli(&["nodes", "delete", "--yes", &token_id]));
    let listed: Vec<String> = cp
        .nodes()
        .iter()
        .map(|n| n["nodeId"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        listed.contains(&tpm_id)
            && listed.contains(&uuid_id)
            && listed.contains(&new_id)
            && !listed.contains(&token_id),
        "{listed:?}"
    );
}

/// A site node that renewed after the backup: `bcd site`, started on the
/// restored control plane, calls with a certificate the database never
/// issued: its lease is refused `unknown-certificate` (ACCESS_DENIED in its
/// log) and it vouches for no machine.
#[test]
fn a_site_node_that_renewed_after_a_restored_backup_is_refused_its_lease() {
    use crate::discovery::{boot_add, site, SiteNode, MAC};
    use crate::site::{assert_exit_script, BootServer};
    let cp =
        ControlPlane::start_with_config_on(Backend::Sqlite, "[discovery]\nlease_ttl = \"10s\"\n");
    let site_id = site(&cp, "dc1");
    let node = SiteNode::join(&cp, &site_id);
    boot_add(&cp, "dc1", MAC, &[]);
    let file = cp.path().join("backup.db");
    backup(&cp, &file);
    assert_ok(&renew(&node.agent));
    let cp = restore(cp, &file);

    let (server, failed) = cp.refused_once(Refusal::Site, "unknown-certificate", || {
        let mut server = BootServer::start_slow_to_retry(&node);
        let failed = server.wait_for("boot lease call failed");
        (server, failed)
    });
    assert!(
        failed.contains("access denied") && failed.contains("held=false"),
        "{failed}"
    );
    assert_exit_script(&server.script(MAC));
}
