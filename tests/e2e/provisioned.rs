//! `bcd join --attestor provisioned`: an installed system joining with the
//! single-use token its user data carries, bound to its product UUID (the
//! spec's *provisioned*). Machines' product UUIDs come from a fake sysfs
//! (`BCD_SYSFS_ROOT`, failpoints builds), so no test depends on this host.

use std::process::Output;

use crate::harness::*;

pub(crate) const UUID: &str = "4c4c4544-0042-3510-8052-b4c04f4e4d32";
pub(crate) const OTHER_UUID: &str = "4c4c4544-0042-3510-8052-b4c04f4e4d33";

/// A machine whose DMI shows `uuid` (upper case and a newline, as the
/// kernel prints it); `None`: no product UUID at all.
pub(crate) fn machine(cp: &ControlPlane, uuid: Option<&str>) -> Agent {
    let agent = Agent::new(cp);
    std::fs::create_dir_all(agent.sysfs_root().join("class/dmi/id")).unwrap();
    if let Some(uuid) = uuid {
        agent.sysfs(
            "class/dmi/id/product_uuid",
            &format!("{}\n", uuid.to_uppercase()),
        );
    }
    agent
}

/// `bcd join [--attestor A] --token-file F`, the token in a 0600 file.
pub(crate) fn join_as(agent: &Agent, attestor: &str, token: &str) -> Output {
    output_within(agent.token_join(token, &["--attestor", attestor]), DEADLINE)
}

pub(crate) fn node_id(agent: &Agent) -> String {
    agent.status_json()["nodeId"].as_str().unwrap().to_owned()
}

pub(crate) fn node(cp: &ControlPlane, id: &str) -> serde_json::Value {
    cp.nodes()
        .into_iter()
        .find(|n| n["nodeId"] == id)
        .unwrap_or_else(|| panic!("node {id} is listed"))
}

fn uses_left(cp: &ControlPlane, token: &str) -> i64 {
    let id = token.split_once('.').unwrap().0;
    cp.json(&["token", "list"])
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .expect("the token is listed")["usesLeft"]
        .as_i64()
        .unwrap()
}

/// Refused: the agent sees the one ACCESS_DENIED message and writes
/// nothing, the server keeps `reason`, and the token keeps its uses.
#[track_caller]
pub(crate) fn assert_refused(
    cp: &ControlPlane,
    agent: &Agent,
    attestor: &str,
    token: &str,
    reason: &str,
) {
    let before = uses_left(cp, token);
    let out = cp.refused_once(Refusal::Join(attestor), reason, || {
        join_as(agent, attestor, token)
    });
    assert_access_denied(&out);
    agent.assert_nothing_written();
    assert!(
        !stderr(&out).contains(reason),
        "the reason stays on the server"
    );
    let last = cp.refusal(reason);
    assert_eq!(last["attestor"], attestor);
    assert_eq!(last["tokenId"], token.split_once('.').unwrap().0);
    assert_eq!(uses_left(cp, token), before, "a refusal spends nothing");
}

#[test]
fn a_provisioned_token_joins_its_machine_once_as_a_new_node() {
    let cp = ControlPlane::start();
    let token = cp.token("provisioned", &["--expect-product-uuid", UUID]);
    let agent = machine(&cp, Some(UUID));
    let out = join_as(&agent, "provisioned", &token);
    assert_ok(&out);
    let id = node_id(&agent);
    let n = node(&cp, &id);
    assert_eq!(n["attestor"], "provisioned");
    assert_eq!(n["identityGeneration"], 1);
    assert_eq!(n["hardwareKey"], format!("product-uuid:{UUID}"));
    // Single use: another machine with the same user data is refused.
    let copy = machine(&cp, Some(UUID));
    let out = cp.refused_once(Refusal::Join("provisioned"), "token-exhausted", || {
        join_as(&copy, "provisioned", &token)
    });
    assert_access_denied(&out);
    assert_eq!(cp.refusal_reasons(), ["token-exhausted"]);
}

#[test]
fn provisioned_refusals() {
    let cp = ControlPlane::start();
    let right = machine(&cp, Some(UUID));

    // Minted for several machines: never a machine credential.
    let several = cp.token(
        "provisioned",
        &["--expect-product-uuid", UUID, "--uses", "2"],
    );
    assert_refused(&cp, &right, "provisioned", &several, "not-single-use");

    let bound = cp.token("provisioned", &["--expect-product-uuid", UUID]);
    let no_dmi = machine(&cp, None);
    assert_refused(&cp, &no_dmi, "provisioned", &bound, "no-product-uuid");
    let other = machine(&cp, Some(OTHER_UUID));
    assert_refused(&cp, &other, "provisioned", &bound, "product-uuid-mismatch");

    // Bound to nothing: neither an expected UUID nor a node.
    let unbound = cp.token("provisioned", &[]);
    assert_refused(&cp, &right, "provisioned", &unbound, "unbound");

    // A node token is not a provisioned one, nor the other way round.
    let node_token = cp.token("node", &["--expect-product-uuid", UUID]);
    assert_refused(&cp, &right, "provisioned", &node_token, "token-role");
    assert_refused(&cp, &right, "join-token", &bound, "token-role");

    // And the bound token still admits its machine.
    assert_ok(&join_as(&right, "provisioned", &bound));
}

/// `--node`: the user data of a redeployed node re-keys it in place.
#[test]
fn a_provisioned_token_for_a_node_rekeys_it_in_place() {
    let cp = ControlPlane::start();
    assert_ok(&cp.cli(&["pools", "create", "--id", "gpu"]));
    let first = machine(&cp, Some(UUID));
    assert_ok(&first.join_with_token(&cp.token("node", &["--pool", "gpu"])));
    let id = node_id(&first);
    let old_certs = cp.json(&["nodes", "certs", &id]);
    assert_eq!(old_certs.as_array().unwrap().len(), 1);

    let token = cp.token("provisioned", &["--node", &id]);
    let listed = cp.json(&["token", "list"]);
    assert_eq!(
        listed.as_array().unwrap().last().unwrap()["node"],
        id.as_str()
    );

    // The target's product UUID comes from its newest join's claims.
    let elsewhere = machine(&cp, Some(OTHER_UUID));
    assert_refused(
        &cp,
        &elsewhere,
        "provisioned",
        &token,
        "product-uuid-mismatch",
    );
    assert_eq!(cp.refusal("product-uuid-mismatch")["nodeId"], id.as_str());

    // The reinstalled system (a fresh data directory, same machine).
    let reinstalled = machine(&cp, Some(UUID));
    assert_ok(&join_as(&reinstalled, "provisioned", &token));
    assert_eq!(node_id(&reinstalled), id, "the same node");
    let n = node(&cp, &id);
    assert_eq!(n["identityGeneration"], 2);
    assert_eq!(n["pool"], "gpu", "its state is kept");
    assert_eq!(cp.nodes().len(), 1);
    let certs = cp.json(&["nodes", "certs", &id]);
    let certs = certs.as_array().unwrap();
    assert_eq!(certs.len(), 2);
    for c in certs {
        assert_eq!(c["revoked"], c["identityGeneration"] == 1, "{c}");
    }
    let joined = cp
        .events()
        .into_iter()
        .rev()
        .find(|e| e["type"] == "node.joined")
        .unwrap();
    assert_eq!(joined["data"]["reclaim"], true);
    assert_eq!(joined["attestor"], "provisioned");

    // A token for a node that is gone is bound to nothing.
    let gone = cp.token("provisioned", &["--node", &id]);
    assert_ok(&cp.cli(&["nodes", "cordon", &id]));
    assert_ok(&cp.cli(&["nodes", "delete", &id, "--yes"]));
    assert_refused(
        &cp,
        &machine(&cp, Some(UUID)),
        "provisioned",
        &gone,
        "unbound",
    );
}

/// `user-data --attestor provisioned` mints the single-use token into the
/// `#cloud-config` (a 0600 file the script joins with, then removes); the
/// machine it names joins with it, another machine with the same user data
/// is refused. (The guest VM that boots such user data is not run here.)
#[test]
fn user_data_mints_a_provisioned_token_for_one_machine() {
    let cp = ControlPlane::start();
    let files = tempfile::tempdir().unwrap();
    let deb = files.path().join("bcd_0.1.0+test_amd64.deb");
    std::fs::write(&deb, b"package").unwrap();
    assert_ok(&cp.cli(&["dist", "add", deb.to_str().unwrap()]));
    let user_data = |extra: &[&str]| {
        let mut args = vec![
            "user-data",
            "--api",
            "https://cp.example",
            "--attestor",
            "provisioned",
        ];
        args.extend_from_slice(extra);
        cp.cli(&args)
    };
    let out = user_data(&[]);
    assert!(!out.status.success() && stderr(&out).contains("--expect-product-uuid"));
    assert!(
        cp.json(&["token", "list"]).as_array().unwrap().is_empty(),
        "nothing minted"
    );

    let out = user_data(&["--expect-product-uuid", &UUID.to_uppercase()]);
    assert_ok(&out);
    let text = stdout(&out);
    let head = "  - path: /run/bcd/join-token\n    owner: root:root\n    permissions: '0600'\n    content: '";
    let token = text
        .split_once(head)
        .and_then(|(_, rest)| rest.split_once("'\n"))
        .expect("the token file in write_files")
        .0
        .to_owned();
    assert!(text.contains("--attestor provisioned --token-file \"$token_file\""));
    assert!(text.contains("rm -f \"$token_file\""));
    let listed = cp.json(&["token", "list"]);
    let row = &listed.as_array().unwrap()[0];
    assert_eq!(row["role"], "provisioned");
    assert_eq!(row["usesLeft"], 1);
    assert_eq!(row["expectProductUuid"], UUID);

    let other = machine(&cp, Some(OTHER_UUID));
    assert_refused(&cp, &other, "provisioned", &token, "product-uuid-mismatch");
    let right = machine(&cp, Some(UUID));
    assert_ok(&join_as(&right, "provisioned", &token));

    // --node: the token re-keys that node.
    let id = node_id(&right);
    let out = user_data(&["--node", &id]);
    assert_ok(&out);
    let listed = cp.json(&["token", "list"]);
    assert_eq!(listed.as_array().unwrap()[1]["node"], id.as_str());
    let out = user_data(&["--node", "node_nosuchnode"]);
    assert!(!out.status.success(), "{}", stdout(&out));
}
