//! CommandService against a real control plane DIR: token-joined nodes,
//! their real certificates (with the scope statement), signed commands and
//! results.

use bc_wire::agent::Role;
use bc_wire::command::{self, Output, Times};
use bc_wire::command_v1::{SignedCommand, Status};
use p256::pkcs8::DecodePrivateKey;
use rcgen::KeyPair;

use super::*;
use crate::model::commands::JoinFacts;
use crate::store::params;
use crate::test_support::{self, both_backends, uri_sans, Backend, Cp};

// The service on both databases.
both_backends!(
    a_queued_command_is_signed_once_for_its_node,
    every_queue_refusal_has_its_reason,
    a_result_is_stored_only_when_the_channel_key_signed_it,
    an_inventory_result_is_the_nodes_newest_inventory,
    commands_expire_by_database_time,
    a_channel_needs_a_current_certificate_and_closes_when_it_stops_being_one,
    a_leased_node_is_queued_and_delivered_only_the_lease_kinds,
);

/// A lease restricts at once (its certificate catches up at renewal): a
/// kind outside it is refused `leased` naming the lessee, and one queued
/// before the lease is held back until the lease ends.
fn a_leased_node_is_queued_and_delivered_only_the_lease_kinds(backend: Backend) {
    let cp = test_support::cp_on(backend);
    let s = svc(&cp);
    let node = join(&cp, Role::Node);
    let logs = s.queue(&node.id, "logs.collect", vec![], 60_000).unwrap();
    crate::model::tenants::create(cp.db(), "acme").unwrap();
    let kinds = crate::model::leases::LeasesConfig::default().allowed_kinds;
    let lease = crate::model::leases::create(cp.db(), &node.id, "acme", None, &kinds).unwrap();
    let err = s
        .queue(&node.id, "logs.collect", vec![], 60_000)
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("refused (leased): ") && text.contains("leased to tenant acme"),
        "{text}"
    );
    assert!(s.deliverable(&node.id).unwrap().is_empty());
    let ping = s.queue(&node.id, "diag.ping", vec![], 60_000).unwrap();
    let ids = |s: &CommandService<'_>| -> Vec<String> {
        s.deliverable(&node.id)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    };
    assert_eq!(ids(&s), std::slice::from_ref(&ping.id));
    crate::model::leases::end(cp.db(), crate::model::leases::LeaseRef::Id(&lease.id)).unwrap();
    assert_eq!(ids(&s), [logs.id, ping.id]);
}

struct Node {
    id: String,
    leaf: Vec<u8>,
    key: KeyPair,
}

fn join(cp: &Cp, role: Role) -> Node {
    let (body, key) = cp.token_join(role, None);
    Node {
        id: body.node_id,
        leaf: body.chain[0].clone(),
        key,
    }
}

fn svc(cp: &Cp) -> CommandService<'_> {
    CommandService::new(&cp.svc)
}

fn refusal(r: Result<CommandRow, QueueError>) -> &'static str {
    match r {
        Err(QueueError::Refused(r)) => r.reason(),
        other => panic!("not refused: {other:?}"),
    }
}

fn args(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn auth(cp: &Cp, node: &Node) -> ChannelAuth {
    svc(cp).channel_auth(&node.leaf).unwrap().unwrap()
}

/// `node`'s signed result for the command `id` of `kind`.
fn result_of(
    node: &Node,
    id: &str,
    kind: &str,
    status: Status,
    output: &[u8],
) -> SignedCommandResult {
    let mut out = Output::new();
    out.push(output);
    let result = command::new_result(
        id,
        &node.id,
        kind,
        status,
        "done",
        out,
        Times {
            started_ms: 1,
            finished_ms: 2,
        },
    );
    let sk = p256::ecdsa::SigningKey::from_pkcs8_der(&node.key.serialize_der()).unwrap();
    command::sign_result(&result, String::new(), |input| {
        let sig: p256::ecdsa::Signature = sk.sign(input);
        Ok::<_, Infallible>(sig.to_bytes().into())
    })
    .unwrap()
}

#[test]
fn certificates_carry_the_scope_statement() {
    let cp = test_support::cp();
    let node = join(&cp, Role::Node);
    let uris = uri_sans(&node.leaf);
    assert_eq!(uris.len(), 2, "{uris:?}");
    assert_eq!(uris[1], "urn:bc:scope:node");
    // A ramdisk's: its allowed kinds (the join stores the default); a
    // pattern that does not parse narrows, and none left is no statement.
    let mut scope = records::NodeScope::default();
    crate::plane::join::ramdisk_scope(&mut scope);
    assert_eq!(
        scope.statement(Role::Ramdisk).unwrap(),
        "urn:bc:scope:ramdisk:inventory.refresh,logs.collect,diag.*,disk.wipe,deploy.*,boot.kexec"
    );
    scope.allowed_kinds = Some(vec!["diag*".into(), "diag.ping".into()]);
    assert_eq!(
        scope.statement(Role::Ramdisk).unwrap(),
        "urn:bc:scope:ramdisk:diag.ping"
    );
    scope.allowed_kinds = Some(vec!["diag*".into()]);
    assert_eq!(scope.statement(Role::Ramdisk), None);
    assert_eq!(
        records::NodeScope::default().statement(Role::Site).unwrap(),
        "urn:bc:scope:site"
    );
}

/// A node turned ramdisk (the join-token attestor admits no ramdisk), with
/// a live certificate saying so.
fn ramdisk(cp: &Cp) -> Node {
    let mut node = join(cp, Role::Node);
    cp.db()
        .write(|tx| {
            tx.execute(
                "UPDATE nodes SET role = 'ramdisk' WHERE id = ?1",
                params![node.id],
            )
        })
        .unwrap();
    let mut scope = records::NodeScope::default();
    crate::plane::join::ramdisk_scope(&mut scope);
    let statement = scope.statement(Role::Ramdisk).unwrap();
    node.leaf = cp.issue(&node.id, &node.key, &[statement], 1, true);
    node
}

fn a_queued_command_is_signed_once_for_its_node(backend: Backend) {
    let cp = test_support::cp_on(backend);
    let node = join(&cp, Role::Node);
    let row = svc(&cp)
        .queue(&node.id, "diag.ping", args(&[("echo", "hi")]), 60_000)
        .unwrap();
    assert_eq!(
        (row.state.as_str(), row.kind.as_str()),
        ("queued", "diag.ping")
    );
    let signed = SignedCommand::decode(row.signed.as_slice()).unwrap();
    let key = *cp.svc.signing_key().verifying_key();
    let scope = Scope::from_statements(&["urn:bc:scope:node"]).unwrap();
    let verified = command::verify(
        &signed,
        &command::Expect {
            signing_key: &key,
            node_id: &node.id,
            scope: &scope,
            now_ms: cp.now(),
        },
    )
    .unwrap();
    assert_eq!(verified.id(), row.id);
    let delivered = svc(&cp).deliverable(&node.id).unwrap();
    assert_eq!(delivered, vec![(row.id.clone(), row.signed.clone())]);
    assert_eq!(
        svc(&cp).channels_tick(&[]).unwrap().queued,
        vec![node.id.clone()]
    );
}

fn every_queue_refusal_has_its_reason(backend: Backend) {
    let cp = test_support::cp_on(backend);
    let s = svc(&cp);
    let node = join(&cp, Role::Node);
    assert_eq!(
        refusal(s.queue("node_nobody", "diag.ping", vec![], 60_000)),
        "unknown-node"
    );
    assert_eq!(
        refusal(s.queue(&node.id, "diag.ping", vec![], 10)),
        "timeout"
    );
    assert_eq!(
        refusal(s.queue(&node.id, "diag.ping", vec![], 25 * 3_600_000)),
        "timeout"
    );
    assert_eq!(
        refusal(s.queue(&node.id, "no.such", vec![], 60_000)),
        "unknown-kind"
    );
    assert_eq!(
        refusal(s.queue(
            &node.id,
            "disk.wipe",
            args(&[("devices", "/dev/sda")]),
            60_000
        )),
        "kind-not-allowed"
    );
    assert_eq!(
        refusal(s.queue(&node.id, "diag.ping", args(&[("nope", "1")]), 60_000)),
        "bad-args"
    );
    // A ramdisk may wipe, with well-formed devices only.
    let ramdisk = ramdisk(&cp);
    s.queue(
        &ramdisk.id,
        "disk.wipe",
        args(&[("devices", "/dev/sda")]),
        60_000,
    )
    .unwrap();
    assert_eq!(
        refusal(s.queue(
            &ramdisk.id,
            "disk.wipe",
            args(&[("devices", "sda")]),
            60_000
        )),
        "bad-args"
    );

    // A certificate from before the channel (no scope statement).
    let old = join(&cp, Role::Node);
    cp.issue(&old.id, &old.key, &[], 1, true);
    assert_eq!(
        refusal(s.queue(&old.id, "diag.ping", vec![], 60_000)),
        "no-scope"
    );

    // Revoked: no live certificate.
    cp.db()
        .write(|tx| {
            tx.execute(
                "UPDATE node_certs SET revoked_at = 1 WHERE node_id = ?1",
                params![node.id],
            )
        })
        .unwrap();
    assert_eq!(
        refusal(s.queue(&node.id, "diag.ping", vec![], 60_000)),
        "no-live-certificate"
    );
    // Expired: none live either.
    let late = join(&cp, Role::Node);
    cp.move_clock(25 * 3_600_000);
    assert_eq!(
        refusal(s.queue(&late.id, "diag.ping", vec![], 60_000)),
        "no-live-certificate"
    );
    cp.move_clock(0);

    let retired = join(&cp, Role::Node);
    cp.db()
        .write(|tx| {
            tx.execute(
                "UPDATE nodes SET retired_at = 1 WHERE id = ?1",
                params![retired.id],
            )
        })
        .unwrap();
    assert_eq!(
        refusal(s.queue(&retired.id, "diag.ping", vec![], 60_000)),
        "retired"
    );
    // Nothing refused was stored.
    assert_eq!(s.list(None, None).unwrap().len(), 1);
}

fn a_result_is_stored_only_when_the_channel_key_signed_it(backend: Backend) {
    let cp = test_support::cp_on(backend);
    let s = svc(&cp);
    let node = join(&cp, Role::Node);
    let other = join(&cp, Role::Node);
    let a = auth(&cp, &node);
    let row = s.queue(&node.id, "diag.ping", vec![], 60_000).unwrap();

    // Signed by another node's key: forged; by this key for another
    // node: other-node.
    let forged = result_of(&other, &row.id, "diag.ping", Status::Ok, b"{}");
    match s.take_result(&a, &forged).unwrap() {
        Taken::Refused(e) => assert_eq!(e.reason(), "forged"),
        t => panic!("{t:?}"),
    }
    let posing = Node {
        id: other.id.clone(),
        leaf: Vec::new(),
        key: KeyPair::try_from(node.key.serialize_der()).unwrap(),
    };
    match s
        .take_result(
            &a,
            &result_of(&posing, &row.id, "diag.ping", Status::Ok, b"{}"),
        )
        .unwrap()
    {
        Taken::Refused(e) => assert_eq!(e.reason(), "other-node"),
        t => panic!("{t:?}"),
    }
    let mut forged = result_of(&node, &row.id, "diag.ping", Status::Ok, b"{}");
    forged.signature[10] ^= 1;
    match s.take_result(&a, &forged).unwrap() {
        Taken::Refused(e) => assert_eq!(e.reason(), "forged"),
        t => panic!("{t:?}"),
    }
    assert_eq!(s.get(&row.id).unwrap().unwrap().state, "queued");

    let good = result_of(&node, &row.id, "diag.ping", Status::Ok, b"{\"pong\":true}");
    assert_eq!(
        s.take_result(&a, &good).unwrap(),
        Taken::Stored(row.id.clone())
    );
    let stored = s.get(&row.id).unwrap().unwrap();
    assert_eq!(stored.state, "ok");
    assert_eq!(stored.result_checked, Some(true));
    assert_eq!(
        stored.result.as_deref(),
        Some(good.encode_to_vec().as_slice())
    );
    assert_eq!(
        stored.output_sha256.as_deref(),
        Some(hex::encode(bc_wire::sha256(b"{\"pong\":true}")).as_str())
    );
    // Sent again: acked, stored once.
    assert_eq!(
        s.take_result(&a, &good).unwrap(),
        Taken::Stored(row.id.clone())
    );
    assert!(s.deliverable(&node.id).unwrap().is_empty());

    // A verified result for a command never queued for this node.
    let stray = result_of(&node, "cmd_neverqueued", "diag.ping", Status::Refused, b"");
    assert_eq!(
        s.take_result(&a, &stray).unwrap(),
        Taken::Unknown("cmd_neverqueued".into())
    );
    let theirs = s.queue(&other.id, "diag.ping", vec![], 60_000).unwrap();
    let stray = result_of(&node, &theirs.id, "diag.ping", Status::Ok, b"");
    assert!(matches!(
        s.take_result(&a, &stray).unwrap(),
        Taken::Unknown(_)
    ));
    assert_eq!(s.get(&theirs.id).unwrap().unwrap().state, "queued");
}

fn an_inventory_result_is_the_nodes_newest_inventory(backend: Backend) {
    let cp = test_support::cp_on(backend);
    let s = svc(&cp);
    let node = join(&cp, Role::Node);
    let a = auth(&cp, &node);
    let row = s
        .queue(&node.id, "inventory.refresh", vec![], 60_000)
        .unwrap();
    let json = br#"{"dmi":{"productUuid":null},"nics":[{"name":"eth0","mac":"52:54:00:12:34:56"}],"tpm":{}}"#;
    let r = result_of(&node, &row.id, "inventory.refresh", Status::Ok, json);
    assert_eq!(
        s.take_result(&a, &r).unwrap(),
        Taken::Stored(row.id.clone())
    );
    let inv = s.inventories(&node.id).unwrap();
    assert_eq!(inv.len(), 1);
    assert_eq!(inv[0].command_id, row.id);
    assert!(
        inv[0].flags.is_empty(),
        "a token join proved nothing to differ from"
    );
    let v: serde_json::Value = serde_json::from_str(&inv[0].inventory).unwrap();
    assert_eq!(v["nics"][0]["mac"], "52:54:00:12:34:56");
}

#[test]
fn inventory_flags_name_what_differs_from_the_join() {
    let json: serde_json::Value = serde_json::json!({
        "dmi": {"productUuid": "4C4C4544-0042-3510-8052-B4C04F4E4D32"},
        "nics": [{"mac": "52:54:00:12:34:56"}, {"mac": null}],
        "tpm": {"ekSha256": "AB".repeat(32)},
    });
    let same = JoinFacts {
        ek_sha256: Some("ab".repeat(32)),
        product_uuid: Some("4c4c4544-0042-3510-8052-b4c04f4e4d32".into()),
        macs: Some(vec!["52:54:00:12:34:56".into()]),
    };
    assert!(inventory_flags(&json, &same).is_empty());
    let other = JoinFacts {
        ek_sha256: Some("cd".repeat(32)),
        product_uuid: Some("00000000-0000-0000-0000-000000000001".into()),
        macs: Some(vec!["52:54:00:00:00:01".into()]),
    };
    assert_eq!(
        inventory_flags(&json, &other),
        ["product-uuid", "macs", "ek"]
    );
    let nothing = JoinFacts {
        ek_sha256: None,
        product_uuid: None,
        macs: None,
    };
    assert!(inventory_flags(&serde_json::json!({}), &nothing).is_empty());
}

fn commands_expire_by_database_time(backend: Backend) {
    let cp = test_support::cp_on(backend);
    let s = svc(&cp);
    let node = join(&cp, Role::Node);
    let row = s.queue(&node.id, "diag.ping", vec![], 1_000).unwrap();
    assert_eq!(s.expire().unwrap(), 0);
    cp.move_clock(2_000);
    assert!(
        s.deliverable(&node.id).unwrap().is_empty(),
        "past not_after: not delivered"
    );
    assert_eq!(s.list(Some(&node.id), Some("expired")).unwrap().len(), 1);
    assert_eq!(s.get(&row.id).unwrap().unwrap().state, "expired");
    assert_eq!(s.expire().unwrap(), 0);
}

fn a_channel_needs_a_current_certificate_and_closes_when_it_stops_being_one(backend: Backend) {
    let cp = test_support::cp_on(backend);
    let s = svc(&cp);
    let node = join(&cp, Role::Node);
    let a = auth(&cp, &node);
    assert_eq!(a.node_id, node.id);
    assert!(still_good(&s, &a));
    // Renewed (a newer certificate): the channel must reconnect with it.
    cp.issue(
        &node.id,
        &node.key,
        &["urn:bc:scope:node".to_owned()],
        1,
        true,
    );
    assert!(!still_good(&s, &a));
    assert!(s.channel_auth(&node.leaf).unwrap().is_none());
    // A certificate the control plane never stored.
    let stranger = cp.issue(&node.id, &node.key, &[], 1, false);
    assert!(s.channel_auth(&stranger).unwrap().is_none());
    assert!(s.channel_auth(b"not a certificate").unwrap().is_none());
    // Revoked.
    let other = join(&cp, Role::Node);
    let b = auth(&cp, &other);
    cp.db()
        .write(|tx| {
            tx.execute(
                "UPDATE node_certs SET revoked_at = 1 WHERE node_id = ?1",
                params![other.id],
            )
        })
        .unwrap();
    assert!(!still_good(&s, &b));
    assert!(s.channel_auth(&other.leaf).unwrap().is_none());
    // One look for many channels: only the good one's pair comes back.
    let third = join(&cp, Role::Node);
    let c = auth(&cp, &third);
    let tick = s
        .channels_tick(&[other.id.clone(), third.id.clone(), node.id.clone()])
        .unwrap();
    assert!(tick.good.contains(&(c.node_id.clone(), c.serial.clone())));
    assert!(!tick.good.contains(&(b.node_id.clone(), b.serial.clone())));
    assert!(!tick.good.contains(&(a.node_id.clone(), a.serial.clone())));
}

/// Whether the channel `a` proved may stay open, as the channels' tick
/// decides.
fn still_good(s: &CommandService<'_>, a: &crate::plane::commands::ChannelAuth) -> bool {
    s.channels_tick(std::slice::from_ref(&a.node_id))
        .unwrap()
        .good
        .contains(&(a.node_id.clone(), a.serial.clone()))
}
