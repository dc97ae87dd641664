//! Hardware keys and reclaims: one machine never becomes two live nodes
//! (the spec's *join-token* reclaim flag and *Recovering a node whose TPM
//! changed*). Product UUIDs come from a fake sysfs (failpoints builds).

use crate::harness::*;
use crate::provisioned::{assert_refused, join_as, machine, node, node_id, OTHER_UUID, UUID};

#[test]
fn a_known_machine_is_refused_unless_the_token_allows_a_reclaim() {
    let cp = ControlPlane::start();
    let first = machine(&cp, Some(UUID));
    let bound = cp.token("node", &["--expect-product-uuid", UUID]);
    assert_ok(&join_as(&first, "join-token", &bound));
    let id = node_id(&first);
    assert_eq!(
        node(&cp, &id)["hardwareKey"],
        format!("product-uuid:{UUID}")
    );

    // The same machine again, by a token bound to it or by its user data.
    let again = machine(&cp, Some(UUID));
    let bound = cp.token("node", &["--expect-product-uuid", UUID]);
    assert_refused(&cp, &again, "join-token", &bound, "reclaim");
    assert_eq!(cp.refusals().pop().unwrap()["nodeId"], id.as_str());
    let provisioned = cp.token("provisioned", &["--expect-product-uuid", UUID]);
    assert_refused(&cp, &again, "provisioned", &provisioned, "reclaim");

    // A token that proves no machine binds no hardware key: a new node.
    let unbound_machine = machine(&cp, Some(UUID));
    assert_ok(&unbound_machine.join_with_token(&cp.token("node", &[])));
    assert_ne!(node_id(&unbound_machine), id);
    assert_eq!(
        node(&cp, &node_id(&unbound_machine))["hardwareKey"],
        serde_json::Value::Null
    );

    // --allow-reclaim: the known machine reclaims its node in place.
    let reclaim = cp.token("node", &["--expect-product-uuid", UUID, "--allow-reclaim"]);
    assert_eq!(
        cp.json(&["token", "list"])
            .as_array()
            .unwrap()
            .last()
            .unwrap()["allowReclaim"],
        true
    );
    assert_ok(&join_as(&again, "join-token", &reclaim));
    assert_eq!(node_id(&again), id, "the same node");
    assert_eq!(node(&cp, &id)["identityGeneration"], 2);
    let certs = cp.json(&["nodes", "certs", &id]);
    let certs = certs.as_array().unwrap();
    assert_eq!(certs.len(), 2);
    for c in certs {
        assert_eq!(c["revoked"], c["identityGeneration"] == 1, "{c}");
    }
    assert_eq!(cp.nodes().len(), 2);
}

/// A pool that requires tpm refuses a token reclaim of its TPM-bound
/// machine (`join:pool-attestor`), while the TPM still reclaims it.
#[test]
fn a_tpm_pool_refuses_a_token_reclaim_of_a_tpm_machine() {
    let cp = ControlPlane::start_trusting_test_maker();
    assert_ok(&cp.cli(&[
        "pools",
        "create",
        "--id",
        "metal",
        "--join-attestors",
        "tpm",
    ]));
    let tpm = Swtpm::start();
    let agent = machine(&cp, Some(UUID));
    agent.set_tpm(&tpm);
    let ek = agent.identify()["ekSha256"].as_str().unwrap().to_owned();
    assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek, "--pool", "metal"]));
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let id = node_id(&agent);
    assert_eq!(node(&cp, &id)["hardwareKey"], format!("tpm-ek:{ek}"));

    let token = cp.token("node", &["--expect-product-uuid", UUID, "--allow-reclaim"]);
    let by_token = machine(&cp, Some(UUID));
    assert_refused(&cp, &by_token, "join-token", &token, "join:pool-attestor");
    let refusal = cp.refusals().pop().unwrap();
    assert_eq!(refusal["nodeId"], id.as_str());
    assert_eq!(refusal["data"]["poolId"], "metal");

    assert_ok(&agent.run(&["join", "--attestor", "tpm", "--reset", "--yes"]));
    assert_eq!(node_id(&agent), id);
    assert_eq!(node(&cp, &id)["identityGeneration"], 2);
}

/// The spec's recovery walk-through when the EK is new: the old node holds
/// the machine's product UUID, so the new TPM's join is a reclaim (refused:
/// a tpm join carries no allowReclaim) until the old node is cordoned and
/// deleted; then the machine joins as a new node.
#[test]
fn a_replaced_tpm_joins_only_after_the_old_node_is_deleted() {
    let cp = ControlPlane::start_trusting_test_maker();
    let old_tpm = Swtpm::start();
    let agent = machine(&cp, Some(UUID));
    agent.set_tpm(&old_tpm);
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let old = node_id(&agent);

    let new_tpm = Swtpm::start_another_machine();
    agent.set_tpm(&new_tpm);
    let new_ek = agent.allow_ek(&cp);
    let out = agent.run(&["join", "--reset", "--yes", "--attestor", "tpm"]);
    assert_access_denied(&out);
    let refusal = cp.refusals().pop().unwrap();
    assert_eq!(refusal["reason"], "reclaim");
    assert_eq!(refusal["attestor"], "tpm");
    assert_eq!(refusal["nodeId"], old.as_str());

    assert_ok(&cp.cli(&["nodes", "cordon", &old]));
    assert_ok(&cp.cli(&["nodes", "delete", &old, "--yes"]));
    assert_ok(&agent.run(&["join", "--reset", "--yes", "--attestor", "tpm"]));
    let new = node_id(&agent);
    assert_ne!(new, old, "a new node");
    assert_eq!(node(&cp, &new)["hardwareKey"], format!("tpm-ek:{new_ek}"));
    assert_eq!(cp.nodes().len(), 1);
}

/// A token that names the node it re-keys (`token create --role provisioned
/// --node N`) is refused, each by its own reason, when N was deleted
/// (`join:reclaim-unknown-node`), retired (`join:reclaim-retired`) or has
/// another role than the join (`join:reclaim-role`) by the time the machine
/// joins: ACCESS_DENIED at bcd, nothing written, the token keeps its use.
#[test]
fn a_reclaim_of_a_deleted_retired_or_other_role_node_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    const THIRD_UUID: &str = "4c4c4544-0042-3510-8052-b4c04f4e4d34";
    let cp = ControlPlane::start();
    let joined = |uuid: &str, extra: &[&str]| -> String {
        let agent = machine(&cp, Some(uuid));
        let role = if extra.is_empty() { "node" } else { "site" };
        let file = agent.root.path().join("token");
        std::fs::write(&file, cp.token(role, extra)).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_ok(&agent.run(&[
            "join",
            "--role",
            role,
            "--token-file",
            &file.to_string_lossy(),
        ]));
        node_id(&agent)
    };
    let rekey = |node: &str, uuid: &str| {
        cp.token(
            "provisioned",
            &["--node", node, "--expect-product-uuid", uuid],
        )
    };

    let deleted = joined(UUID, &[]);
    let token = rekey(&deleted, UUID);
    assert_ok(&cp.cli(&["nodes", "cordon", &deleted]));
    assert_ok(&cp.cli(&["nodes", "delete", &deleted, "--yes"]));
    let again = machine(&cp, Some(UUID));
    assert_refused(
        &cp,
        &again,
        "provisioned",
        &token,
        "join:reclaim-unknown-node",
    );
    assert_eq!(cp.refusals().pop().unwrap()["nodeId"], deleted.as_str());

    let retired = joined(OTHER_UUID, &[]);
    let token = rekey(&retired, OTHER_UUID);
    assert_ok(&cp.cli(&["nodes", "retire", &retired]));
    let again = machine(&cp, Some(OTHER_UUID));
    assert_refused(&cp, &again, "provisioned", &token, "join:reclaim-retired");
    assert_eq!(cp.refusals().pop().unwrap()["nodeId"], retired.as_str());

    assert_ok(&cp.cli(&["sites", "create", "dc1"]));
    let site_node = joined(THIRD_UUID, &["--site", "dc1"]);
    let token = rekey(&site_node, THIRD_UUID);
    let again = machine(&cp, Some(THIRD_UUID));
    assert_refused(&cp, &again, "provisioned", &token, "join:reclaim-role");
    assert_eq!(cp.refusals().pop().unwrap()["nodeId"], site_node.as_str());
    assert_eq!(cp.refusals().len(), 3);
}
