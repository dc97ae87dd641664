//! The join-token attestor end to end: a join, and every refusal the spec
//! names, each seen as ACCESS_DENIED at the agent and as its reason at the
//! server.

use crate::harness::*;
use std::os::unix::fs::PermissionsExt;

use x509_parser::prelude::*;

#[test]
fn token_join_issues_a_24h_certificate_with_one_spiffe_id() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let token = cp.token("node", &[]);

    let out = agent.join_with_token(&token);
    assert_ok(&out);
    let status = agent.status_json();
    let node_id = status["nodeId"].as_str().expect("nodeId").to_owned();
    assert!(
        stdout(&out).contains(&format!("joined as {node_id}")),
        "{}",
        stdout(&out)
    );
    assert_eq!(status["role"], "node");
    assert_eq!(status["trustDomain"], "bc.test");
    assert_eq!(status["nodeKey"], "file");

    // The certificate: signed by the node CA, at most 24 h, the SPIFFE ID
    // and the scope statement.
    let pem = status["certificate"].as_str().expect("certificate PEM");
    let chain: Vec<Vec<u8>> = ::pem::parse_many(pem)
        .expect("PEM chain")
        .into_iter()
        .map(|p| p.into_contents())
        .collect();
    assert!(chain.len() >= 2, "leaf and issuer");
    let (_, leaf) = X509Certificate::from_der(&chain[0]).expect("leaf");
    let ca_pem = std::fs::read(cp.path().join("node-ca.pem")).expect("node CA");
    let ca_der = ::pem::parse(ca_pem).expect("CA PEM").into_contents();
    let (_, ca) = X509Certificate::from_der(&ca_der).expect("CA");
    leaf.verify_signature(Some(ca.public_key()))
        .expect("leaf verifies against the node CA");
    let life = leaf.validity().not_after.timestamp() - leaf.validity().not_before.timestamp();
    assert!(life > 0 && life <= 24 * 3600, "lifetime {life}s");
    let uris = uri_sans(&chain[0]);
    assert_eq!(
        uris,
        vec![
            format!("spiffe://bc.test/node/{node_id}"),
            "urn:bc:scope:node".to_owned()
        ]
    );

    // Files: data dir 0700, node key 0600.
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&agent.data_dir), 0o700);
    assert_eq!(mode(&agent.data_dir.join("node.key")), 0o600);

    // The server knows it.
    let nodes = cp.nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["nodeId"], node_id.as_str());
    assert!(cp
        .events()
        .iter()
        .any(|e| e["type"] == "node.joined" && e["nodeId"] == node_id.as_str()));
}

#[test]
fn a_joined_machine_does_not_join_again() {
    let mut cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();

    // Without calling the server: stop it first.
    cp.stop();
    let out = agent.join_with_token("tok_unused.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    assert_ok(&out);
    assert!(
        stdout(&out).contains(&format!("already joined as {node_id}")),
        "{}",
        stdout(&out)
    );
}

#[test]
fn the_token_can_come_from_the_environment() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let token = cp.token("node", &[]);
    let out = agent
        .command(&["join"])
        .env("BCD_JOIN_TOKEN", &token)
        .within();
    assert_ok(&out);
    assert!(
        !stdout(&out).contains(&token) && !stderr(&out).contains(&token),
        "the token is never printed"
    );
    assert_eq!(cp.nodes().len(), 1);
}

/// Runs a join that the server must refuse with `reason`.
#[track_caller]
fn assert_refused(cp: &ControlPlane, agent: &Agent, token: &str, reason: &str) {
    let out = cp.refused_once(Refusal::Join("join-token"), reason, || {
        agent.join_with_token(token)
    });
    assert_access_denied(&out);
    agent.assert_nothing_written();
    let err = stderr(&out);
    assert!(
        !err.contains(reason),
        "the reason stays on the server: {err}"
    );
    let event = cp.refusal(reason);
    assert_eq!(event["attestor"], "join-token");
    assert!(cp.log().contains(reason), "the server log names the reason");
    assert!(cp.nodes().is_empty(), "no node was created");
}

#[test]
fn wrong_secret_is_refused() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let token = cp.token("node", &[]);
    let (id, _) = token.split_once('.').unwrap();
    let forged = format!("{id}.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    assert_refused(&cp, &agent, &forged, "token-secret");
    let last = cp.refusal("token-secret");
    assert_eq!(
        last["tokenId"], id,
        "the event names the token, never its secret"
    );
    assert!(!serde_json::to_string(&cp.events())
        .unwrap()
        .contains(token.split_once('.').unwrap().1));
}

#[test]
fn unknown_token_is_refused() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_refused(
        &cp,
        &agent,
        "tok_nosuch.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "token-unknown",
    );
}

#[test]
fn revoked_token_is_refused() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let token = cp.token("node", &[]);
    let id = token.split_once('.').unwrap().0;
    assert_ok(&cp.cli(&["token", "revoke", id]));
    assert_refused(&cp, &agent, &token, "token-revoked");
}

#[test]
fn expired_token_is_refused_at_database_time() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let token = cp.token("node", &["--ttl", "1h"]);
    // Move the database clock, not the test's.
    assert_ok(&cp.cli(&["clock", "set", "--offset", "2h"]));
    assert_refused(&cp, &agent, &token, "token-expired");
    // Back within the lifetime it admits again: the expiry is checked at
    // compute_now(), and a refusal consumed no use.
    assert_ok(&cp.cli(&["clock", "set", "--offset", "0s"]));
    assert_ok(&agent.join_with_token(&token));
}

#[test]
fn used_up_token_is_refused() {
    let cp = ControlPlane::start();
    let token = cp.token("node", &["--uses", "1"]);
    assert_ok(&Agent::new(&cp).join_with_token(&token));
    let second = Agent::new(&cp);
    let out = cp.refused_once(Refusal::Join("join-token"), "token-exhausted", || {
        second.join_with_token(&token)
    });
    assert_access_denied(&out);
    second.assert_nothing_written();
    assert_eq!(cp.refusal_reasons(), vec!["token-exhausted"]);
    assert_eq!(cp.nodes().len(), 1);
}

#[test]
fn a_token_admits_only_its_role() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let site_token = cp.token("site", &[]);
    assert_refused(&cp, &agent, &site_token, "token-role");
    // The refusal spent nothing: the same token joins a site.
    let out = output_within(agent.token_join(&site_token, &["--role", "site"]), DEADLINE);
    assert_ok(&out);
    assert_eq!(agent.status_json()["role"], "site");
}

#[test]
fn multi_use_tokens_admit_that_many_machines() {
    let cp = ControlPlane::start();
    let token = cp.token("node", &["--uses", "2"]);
    let a = Agent::new(&cp);
    let b = Agent::new(&cp);
    assert_ok(&a.join_with_token(&token));
    assert_ok(&b.join_with_token(&token));
    assert_ne!(a.status_json()["nodeId"], b.status_json()["nodeId"]);
    assert_access_denied(&Agent::new(&cp).join_with_token(&token));
}

#[test]
fn eight_parallel_joins_with_a_one_use_token_admit_exactly_one() {
    let cp = ControlPlane::start();
    let token = cp.token("node", &["--uses", "1"]);
    let agents: Vec<Agent> = (0..8).map(|_| Agent::new(&cp)).collect();
    let outputs: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = agents
            .iter()
            .map(|a| s.spawn(|| a.join_with_token(&token)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let joined = outputs.iter().filter(|o| o.status.success()).count();
    assert_eq!(joined, 1, "exactly one join succeeds");
    for out in outputs.iter().filter(|o| !o.status.success()) {
        assert_access_denied(out);
    }
    assert_eq!(cp.nodes().len(), 1);
    assert_eq!(cp.refusal_reasons(), vec!["token-exhausted"; 7]);
}

/// A token bound to one machine (`token create --expect-product-uuid
/// --expect-mac`). The agent reads its claims under a fake sysfs
/// (`BCD_SYSFS_ROOT`, honoured only by a `failpoints` build), so these
/// tests never depend on the hardware they run on.
#[cfg(feature = "failpoints")]
mod expect_binding {
    use super::*;
    use std::process::Output;

    const UUID: &str = "4c4c4544-0042-3510-8052-b4c04f4e4d32";
    const MAC: &str = "52:54:00:12:34:56";

    /// A machine with eth0 = `mac` and the product UUID `uuid`, written
    /// the way the kernel shows them (upper case UUID, trailing newline).
    fn fake_sysfs(agent: &Agent, mac: &str, uuid: &str) {
        agent.sysfs("class/net/lo/address", "00:00:00:00:00:00\n");
        agent.sysfs("class/net/eth0/address", &format!("{mac}\n"));
        agent.sysfs(
            "class/dmi/id/product_uuid",
            &format!("{}\n", uuid.to_uppercase()),
        );
    }

    fn join(agent: &Agent, token: &str) -> Output {
        agent.join_with_token(token)
    }

    fn machine(cp: &ControlPlane, mac: &str, uuid: &str) -> Agent {
        let agent = Agent::new(cp);
        fake_sysfs(&agent, mac, uuid);
        agent
    }

    fn uses_left(cp: &ControlPlane, id: &str) -> i64 {
        let tokens = cp.json(&["token", "list"]);
        let t = tokens
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .expect("the token is listed")
            .clone();
        t["usesLeft"].as_i64().unwrap()
    }

    #[track_caller]
    fn assert_refused_with(cp: &ControlPlane, agent: &Agent, token: &str, reason: &str) {
        let out = cp.refused_once(Refusal::Join("join-token"), reason, || join(agent, token));
        assert_access_denied(&out);
        agent.assert_nothing_written();
        assert!(
            !stderr(&out).contains(reason),
            "the reason stays on the server"
        );
        let last = cp.refusal(reason);
        assert_eq!(last["attestor"], "join-token");
        assert_eq!(last["tokenId"], token.split_once('.').unwrap().0);
    }

    #[test]
    fn a_bound_token_admits_its_machine() {
        let cp = ControlPlane::start();
        // Given in upper case; stored and compared lowercase.
        let token = cp.token(
            "node",
            &[
                "--expect-product-uuid",
                &UUID.to_uppercase(),
                "--expect-mac",
                &MAC.to_uppercase(),
            ],
        );
        let id = token.split_once('.').unwrap().0.to_owned();
        let listed = cp.json(&["token", "list"]);
        assert_eq!(listed[0]["expectProductUuid"], UUID);
        assert_eq!(listed[0]["expectMac"], MAC);

        let agent = machine(&cp, MAC, UUID);
        assert_ok(&join(&agent, &token));
        assert_eq!(cp.nodes().len(), 1);
        assert!(cp.refusals().is_empty());
        assert_eq!(uses_left(&cp, &id), 0);
    }

    #[test]
    fn an_unbound_token_lists_null_expects() {
        let cp = ControlPlane::start();
        cp.token("node", &[]);
        let listed = cp.json(&["token", "list"]);
        assert!(listed[0]["expectProductUuid"].is_null());
        assert!(listed[0]["expectMac"].is_null());
    }

    #[test]
    fn other_machines_are_refused_and_spend_no_use() {
        let cp = ControlPlane::start();
        let token = cp.token(
            "node",
            &["--expect-product-uuid", UUID, "--expect-mac", MAC],
        );
        let id = token.split_once('.').unwrap().0.to_owned();

        let other_uuid = machine(&cp, MAC, "00000000-0042-3510-8052-b4c04f4e4d32");
        assert_refused_with(&cp, &other_uuid, &token, "join:expect-product-uuid");
        let other_mac = machine(&cp, "52:54:00:12:34:57", UUID);
        assert_refused_with(&cp, &other_mac, &token, "join:expect-mac");
        // No DMI at all: an empty UUID never matches.
        let no_dmi = Agent::new(&cp);
        fake_sysfs(&no_dmi, MAC, UUID);
        std::fs::remove_file(no_dmi.root.path().join("sys/class/dmi/id/product_uuid")).unwrap();
        assert_refused_with(&cp, &no_dmi, &token, "join:expect-product-uuid");

        assert!(cp.nodes().is_empty());
        assert_eq!(uses_left(&cp, &id), 1, "a refusal spends no use");
        assert_ok(&join(&machine(&cp, MAC, UUID), &token));
        assert_eq!(cp.nodes().len(), 1);
        assert_eq!(uses_left(&cp, &id), 0);
    }

    #[test]
    fn a_mac_binding_alone_ignores_the_uuid() {
        let cp = ControlPlane::start();
        let token = cp.token("node", &["--expect-mac", MAC]);
        let agent = machine(&cp, MAC, "00000000-0000-0000-0000-000000000000");
        assert_ok(&join(&agent, &token));
    }

    #[test]
    fn malformed_expect_values_are_rejected_by_the_cli() {
        let cp = ControlPlane::start();
        for args in [
            ["--expect-product-uuid", "4c4c4544-0042-3510-8052"],
            ["--expect-mac", "52-54-00-12-34-56"],
        ] {
            let mut full = vec!["token", "create", "--role", "node"];
            full.extend_from_slice(&args);
            let out = cp.cli(&full);
            assert!(!out.status.success(), "{args:?} accepted");
            assert_eq!(out.status.code(), Some(2), "a usage error");
        }
        assert!(cp.json(&["token", "list"]).as_array().unwrap().is_empty());
    }
}

/// The kernel's copy of the environment (`/proc/<pid>/environ`) is the
/// process's own memory: bcd overwrites the token there, not only unsets it.
#[test]
fn the_environment_token_is_erased_from_proc_environ() {
    let cp = ControlPlane::init_only();
    let agent = Agent::new(&cp);
    let token = "tok_environ.c2VjcmV0LXRoYXQtbXVzdC1ub3QtbGluZ2VyLWluLXA";
    let text = agent.environ_at_connect(
        &["join"],
        &[("BCD_JOIN_TOKEN", token), ("BCD_OTHER", "kept")],
    );
    assert!(
        !text.contains("c2VjcmV0LXRoYXQtbXVzdC1ub3QtbGluZ2VyLWluLXA"),
        "the token is readable in /proc/<pid>/environ: {text:?}"
    );
    assert!(text.contains("BCD_OTHER=kept"), "other variables stay");
}

/// Why a refusal is checked by its count: a repeat within the minute grows
/// an older aggregated row, so the newest row names the refusal before it.
/// `refused_once` tells them apart; the newest row does not.
#[test]
fn a_repeated_refusal_is_told_apart_from_the_newest_row() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let token = cp.token("node", &[]);
    let (id, _) = token.split_once('.').unwrap();
    let wrong_secret = format!("{id}.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    let unknown = "tok_nosuch.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    for t in [&wrong_secret[..], &wrong_secret, unknown] {
        assert_access_denied(&agent.join_with_token(t));
    }
    // token-secret again: its count grows in the row before token-unknown.
    let out = cp.refused_once(Refusal::Join("join-token"), "token-secret", || {
        agent.join_with_token(&wrong_secret)
    });
    assert_access_denied(&out);
    let rows = cp.refusals();
    assert_eq!(
        rows.last().unwrap()["reason"],
        "token-unknown",
        "the newest row is not the newest refusal: {rows:?}"
    );
    let stale = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cp.refused_once(Refusal::Join("join-token"), "token-unknown", || {
            agent.join_with_token(&wrong_secret)
        })
    }));
    assert!(
        stale.is_err(),
        "refused_once is not fooled by the newest row"
    );
    // The same reason from another attestor is another refusal.
    let elsewhere = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cp.refused_once(Refusal::Join("x509pop"), "token-secret", || {
            agent.join_with_token(&wrong_secret)
        })
    }));
    assert!(elsewhere.is_err(), "refused_once checks the attestor");
}
