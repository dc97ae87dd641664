//! Tenants and leases (issue 33) through the real binaries: events and
//! refusals attributed to the tenant the spec names; a leased node's
//! certificates (renewed by `bcd node` over HTTPS, re-joined with x509pop
//! after an offline expiry) name the lessee and run only the lessee kinds,
//! refused at both sides; free again once the lease ends. Clocks are moved
//! (`clock set`, `BCD_CLOCK_OFFSET`), never waited on.

use serde_json::Value;

use crate::commands::{inject, settled};
use crate::harness::*;

fn node_id(agent: &Agent) -> String {
    agent.status_json()["nodeId"].as_str().unwrap().to_owned()
}

/// The `urn:bc:` statements of the agent's certificate on disk.
fn statements(agent: &Agent, tpm: Option<&Swtpm>) -> Vec<String> {
    let access = match tpm {
        Some(t) => bcd::keys::TpmAccess::new(Some(&t.tcti())),
        None => bcd::keys::TpmAccess::none(),
    };
    let id = bcd::identity::Identity::load(&agent.data_dir, &access)
        .expect("the identity loads")
        .expect("an identity");
    bcd::pki::NodeCert::parse(&id.chain[0]).unwrap().statements
}

/// `bcd node --once --renew-now` with bcd's clock at `offset`.
fn renew(agent: &Agent, offset: &str) -> String {
    let out = agent
        .command(&["node", "--once", "--renew-now"])
        .env("BCD_CLOCK_OFFSET", offset)
        .within();
    assert_ok(&out);
    stderr(&out)
}

/// (type, tenant) of each event `events list [--tenant T]` shows.
fn kinds(cp: &ControlPlane, tenant: Option<&str>) -> Vec<(String, Value)> {
    let mut args = vec!["events", "list"];
    if let Some(t) = tenant {
        args.extend(["--tenant", t]);
    }
    cp.json(&args)
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["tenantId"].clone(),
            )
        })
        .collect()
}

#[test]
fn refusals_and_events_are_attributed_to_their_tenant() {
    let cp = ControlPlane::start();
    // A pool needs a tenant that exists.
    let out = cp.cli(&["pools", "create", "--id", "metal", "--tenant", "acme"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(r#"no tenant "acme" to own the pool"#)
            && stderr(&out).contains("tenants create acme"),
        "{}",
        stderr(&out)
    );
    assert_ok(&cp.cli(&["tenants", "create", "acme"]));
    let out = cp.cli(&["tenants", "create", "acme"]);
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
    let listed: Vec<Value> = cp.json(&["tenants", "list"]).as_array().unwrap().clone();
    assert_eq!(
        listed.iter().map(|t| t["id"].clone()).collect::<Vec<_>>(),
        ["root", "acme"]
    );
    assert_ok(&cp.cli(&[
        "pools",
        "create",
        "--id",
        "metal",
        "--tenant",
        "acme",
        "--join-attestors",
        "tpm",
    ]));
    // --owner is the older spelling of --tenant.
    assert_ok(&cp.cli(&["pools", "create", "--id", "open", "--owner", "acme"]));

    // acme's node joins; the operator's (root's) joins the default pool.
    let mine = Agent::new(&cp);
    assert_ok(&mine.join_with_token(&cp.token("node", &["--pool", "open"])));
    let mine_id = node_id(&mine);
    let root = Agent::new(&cp);
    assert_ok(&root.join_with_token(&cp.token("node", &[])));

    // A pool-policy refusal: to the pool's owner.
    let refused = Agent::new(&cp);
    let token = cp.token("node", &["--pool", "metal"]);
    let out = cp.refused_once(Refusal::Join("join-token"), "join:pool-attestor", || {
        refused.join_with_token(&token)
    });
    assert_access_denied(&out);
    assert_eq!(cp.refusal("join:pool-attestor")["tenantId"], "acme");

    // A refusal with no pool known: the operator's.
    let out = cp.refused_once(Refusal::Join("join-token"), "token-unknown", || {
        Agent::new(&cp).join_with_token("tok_nosuch.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
    });
    assert_access_denied(&out);
    assert_eq!(cp.refusal("token-unknown")["tenantId"], Value::Null);

    // A refused renewal: to the node owner.
    assert_ok(&cp.cli(&["nodes", "revoke-identity", &mine_id]));
    let out = cp.refused_once(Refusal::Renew, "stale-generation", || {
        mine.command(&["node", "--once", "--renew-now"]).within()
    });
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));

    let acme = Value::from("acme");
    assert_eq!(
        kinds(&cp, Some("acme")),
        [
            ("node.joined".to_owned(), acme.clone()),
            ("security.join.refused".to_owned(), acme.clone()),
            ("node.identity.revoked".to_owned(), acme.clone()),
            ("security.renew.refused".to_owned(), acme),
        ]
    );
    assert_eq!(
        kinds(&cp, Some("root")),
        [("node.joined".to_owned(), Value::from("root"))]
    );
    let all = kinds(&cp, None);
    assert!(
        all.contains(&("security.join.refused".to_owned(), Value::Null)),
        "{all:?}"
    );
    let text = stdout(&cp.cli(&["events", "list", "--tenant", "acme"]));
    assert_eq!(text.lines().count(), 4, "{text}");
    assert!(text.lines().all(|l| l.contains(" tenant=acme")), "{text}");
    let out = cp.cli(&["events", "list", "--tenant", "nobody"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(r#"no tenant "nobody""#),
        "{}",
        stderr(&out)
    );
}

/// A TPM node leased to acme: its renewal keeps the AK statement and adds
/// the narrowed scope and the lessee (four URIs, the most a certificate
/// carries); the control plane refuses a kind outside the lease at once,
/// and a leased node's agent refuses one from its certificate until it
/// renews after the lease; an x509pop re-join after an offline expiry
/// comes back restricted while a lease lasts; an ended lease drops both
/// statements at the next renewal.
#[test]
fn a_leased_node_runs_only_the_lessee_kinds_across_renewal_and_rejoin() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::tpm_joined(&cp, &tpm);
    let id = node_id(&agent);
    let joined = statements(&agent, Some(&tpm));
    assert_eq!(joined.len(), 2, "{joined:?}");
    let ak = joined[0].clone();
    assert!(ak.starts_with("urn:bc:tpm-ak:"), "{ak}");
    assert_eq!(joined[1], "urn:bc:scope:node");

    let out = cp.cli(&["leases", "create", "--node", &id, "--tenant", "acme"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("tenants create acme"),
        "{}",
        stderr(&out)
    );
    assert_ok(&cp.cli(&["tenants", "create", "acme"]));
    let out = cp.cli(&["leases", "create", "--node", &id, "--tenant", "acme"]);
    assert_ok(&out);
    let lease = stdout(&out).split_whitespace().nth(2).unwrap().to_owned();
    assert!(lease.starts_with("lease_"), "{}", stdout(&out));
    let shown = cp.json(&["nodes", "show", &id]);
    assert_eq!(shown["lease"]["id"], lease.as_str(), "{shown}");
    assert_eq!(shown["lease"]["tenant"], "acme", "{shown}");
    assert!(
        stdout(&cp.cli(&["nodes", "show", &id])).contains("leased:       to acme"),
        "nodes show names the lessee"
    );
    let out = cp.cli(&["leases", "create", "--node", &id, "--tenant", "root"]);
    assert!(
        stderr(&out).contains("already leased to acme"),
        "{}",
        stderr(&out)
    );

    // At once, before any renewal: the control plane refuses, naming why.
    let out = cp.cli(&["commands", "send", "--node", &id, "--kind", "logs.collect"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("command refused (leased)")
            && err.contains("leased to tenant acme")
            && err.contains("diag.*, inventory.refresh"),
        "{err}"
    );

    // Renewed: the AK statement stays, the scope narrows, the lessee is named.
    let log = renew(&agent, "+0s");
    assert!(log.contains("certified=true"), "{log}");
    let leased = [
        ak.clone(),
        "urn:bc:scope:node:diag.*,inventory.refresh".to_owned(),
        "urn:bc:tenant:acme".to_owned(),
    ];
    assert_eq!(statements(&agent, Some(&tpm)), leased);

    // The node runs the lessee kinds.
    let mut node = Logged::spawn(agent.command(&["node"]));
    let up = node.wait_for("command channel up", 1);
    assert!(up.contains("lessee=acme"), "{up}");
    let out = cp.cli(&[
        "commands",
        "send",
        "--node",
        &id,
        "--kind",
        "diag.ping",
        "--timeout",
        "2m",
        "--wait",
    ]);
    assert_ok(&out);

    // The lease ends; until the next renewal, the certificate still
    // restricts: the control plane refuses from it, and the agent refuses
    // a command delivered anyway.
    assert_ok(&cp.cli(&["leases", "end", &lease]));
    assert!(cp.json(&["nodes", "show", &id])["lease"].is_null());
    let out = cp.cli(&["leases", "end", &lease]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("was already ended"),
        "{}",
        stdout(&out)
    );
    let out = cp.cli(&["commands", "send", "--node", &id, "--kind", "logs.collect"]);
    assert!(
        stderr(&out).contains("command refused (kind-not-allowed)"),
        "{}",
        stderr(&out)
    );
    let logs = inject(&cp, &id, "logs.collect", &[], None);
    let shown = settled(&cp, &logs);
    assert_eq!(shown["state"], "refused", "{shown}");
    assert!(
        shown["outcome"]
            .as_str()
            .unwrap()
            .starts_with("kind-not-allowed"),
        "{shown}"
    );
    node.stop();
    // A node stopped while its channel holds the node key may leave it
    // loaded, and swtpm's TCP TCTI has no resource manager to flush it
    // (tpmrm0 does): flushed here so that the next process has the slots.
    assert_ok(&tpm.tool("tpm2_flushcontext", &["--transient-object"]));

    // The next renewal is unrestricted.
    renew(&agent, "+0s");
    assert_eq!(
        statements(&agent, Some(&tpm)),
        [ak.clone(), "urn:bc:scope:node".to_owned()]
    );

    // Leased again, until two days from now; the machine is off for 25
    // hours, its certificate expires, and it re-joins with x509pop:
    // restricted while the lease lasts (the AK statement is not carried
    // over by x509pop).
    let out = cp.cli(&[
        "leases", "create", "--node", &id, "--tenant", "acme", "--until", "2d",
    ]);
    assert_ok(&out);
    let second = stdout(&out).split_whitespace().nth(2).unwrap().to_owned();
    assert_ok(&cp.cli(&["clock", "set", "--offset", "25h"]));
    let out = agent
        .command(&["node", "--once"])
        .env("BCD_CLOCK_OFFSET", "+25h")
        .within();
    assert_ok(&out);
    assert!(
        stderr(&out).contains(&format!("re-joining with x509pop as {id}")),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        statements(&agent, Some(&tpm)),
        [leased[1].clone(), leased[2].clone()]
    );

    // It ends; the next renewal is unrestricted.
    assert_ok(&cp.cli(&["leases", "end", "--node", &id]));
    renew(&agent, "+25h");
    assert_eq!(statements(&agent, Some(&tpm)), ["urn:bc:scope:node"]);

    let listed = cp.json(&["leases", "list"]);
    let states: Vec<_> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["id"].as_str().unwrap().to_owned(), l["state"].clone()))
        .collect();
    assert_eq!(
        states,
        [
            (lease.clone(), Value::from("ended")),
            (second.clone(), Value::from("ended"))
        ]
    );
    // The lessee sees its leases; the node's own events stay the owner's.
    let acme: Vec<String> = kinds(&cp, Some("acme")).into_iter().map(|k| k.0).collect();
    assert_eq!(
        acme,
        [
            "lease.created",
            "lease.ended",
            "lease.created",
            "lease.ended"
        ]
    );
    let root = kinds(&cp, Some("root"));
    assert!(
        root.iter().any(|k| k.0 == "node.renewed")
            && root.iter().any(|k| k.0 == "node.joined")
            && root.iter().all(|k| !k.0.starts_with("lease.")),
        "{root:?}"
    );
}
