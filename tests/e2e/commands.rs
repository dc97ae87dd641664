//! The command channel end to end (issue 29): the real `bcd node` holds the
//! WebSocket to the real control plane over HTTPS and answers what
//! `bc-controlplane commands send` queues; refusals at queue time; the
//! channel closed at revocation; an expired command runs nothing.

use std::process::Output;

use crate::harness::*;

#[cfg(feature = "failpoints")]
const UUID: &str = "4C4C4544-0042-3510-8052-B4C04F4E4D32";
#[cfg(feature = "failpoints")]
const MAC: &str = "52:54:00:c0:ff:ee";

fn send(cp: &ControlPlane, node: &str, kind: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "commands",
        "send",
        "--node",
        node,
        "--kind",
        kind,
        "--timeout",
        "2m",
    ];
    args.extend_from_slice(extra);
    cp.cli(&args)
}

/// `bcd node` running, its channel up.
fn running_node(agent: &Agent) -> Logged {
    let mut node = Logged::spawn(agent.command(&["node"]));
    node.wait_for("command channel up", 1);
    node
}

fn node_id(agent: &Agent) -> String {
    agent.status_json()["nodeId"].as_str().unwrap().to_owned()
}

/// A machine with a product UUID and one NIC in its fake sysfs, joined
/// with its TPM: the control plane knows its EK, its claimed UUID and MAC.
#[cfg(feature = "failpoints")]
fn tpm_machine(cp: &ControlPlane, tpm: &Swtpm) -> Agent {
    let agent = Agent::with_tpm(cp, tpm);
    agent.sysfs("class/dmi/id/product_uuid", &format!("{UUID}\n"));
    agent.sysfs("class/net/eth0/address", &format!("{MAC}\n"));
    agent.sysfs("class/net/eth0/operstate", "up\n");
    agent.sysfs("class/net/lo/address", "00:00:00:00:00:00\n");
    // One NVMe disk, and its multipath path (hidden: the same namespace
    // again, no /dev node), as scripts/pxetest's guest shows them.
    agent.sysfs("block/nvme0n1/size", "131072\n");
    agent.sysfs("block/nvme0c0n1/size", "131072\n");
    agent.sysfs("block/nvme0c0n1/hidden", "1\n");
    agent.allow_ek(cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    agent
}

#[cfg(feature = "failpoints")]
#[test]
fn a_tpm_joined_node_answers_inventory_refresh_and_diag_ping() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = tpm_machine(&cp, &tpm);
    let id = node_id(&agent);
    let _node = running_node(&agent);

    let out = send(&cp, &id, "inventory.refresh", &["--wait", "--json"]);
    assert_ok(&out);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["state"], "ok", "{shown}");
    assert_eq!(shown["signatureChecked"], true);

    // Stored as the node's newest inventory, as its fake sysfs says, and
    // matching what it showed at join (its EK, UUID and MAC): no flag.
    let inv = cp.json(&["nodes", "inventory", &id]);
    let i = &inv["inventory"];
    assert_eq!(
        i["dmi"]["productUuid"]
            .as_str()
            .unwrap()
            .to_ascii_lowercase(),
        UUID.to_ascii_lowercase()
    );
    let nics = i["nics"].as_array().unwrap();
    assert!(
        nics.iter().any(|n| n["name"] == "eth0" && n["mac"] == MAC),
        "{nics:?}"
    );
    let disks: Vec<&str> = i["blockDevices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["name"].as_str())
        .collect();
    assert_eq!(disks, ["nvme0n1"], "the hidden path is no disk: {i}");
    assert_eq!(i["blockDevices"][0]["sizeBytes"], 64u64 << 20);
    let ek = agent.identify()["ekSha256"].as_str().unwrap().to_owned();
    assert_eq!(i["tpm"]["ekSha256"].as_str(), Some(ek.as_str()));
    assert_eq!(inv["flags"], serde_json::json!([]), "{inv}");
    assert_eq!(inv["history"].as_array().unwrap().len(), 1);

    // A changed machine is flagged, not silently stored.
    agent.sysfs("class/net/eth0/address", "52:54:00:00:00:99\n");
    assert_ok(&send(&cp, &id, "inventory.refresh", &["--wait"]));
    let inv = cp.json(&["nodes", "inventory", &id]);
    assert_eq!(inv["flags"], serde_json::json!(["macs"]), "{inv}");
    assert!(cp
        .events()
        .iter()
        .any(|e| e["type"] == "node.inventory.mismatch"));

    let out = send(
        &cp,
        &id,
        "diag.ping",
        &["--arg", "echo=hello", "--wait", "--json"],
    );
    assert_ok(&out);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["output"]["echo"], "hello", "{shown}");
    let listed = cp.json(&["commands", "list", "--node", &id, "--status", "ok"]);
    assert_eq!(listed.as_array().unwrap().len(), 3);
}

#[test]
fn a_token_joined_node_answers_diag_ping_over_its_channel() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let id = node_id(&agent);
    let _node = running_node(&agent);
    let out = send(&cp, &id, "diag.ping", &["--wait"]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(
        text.contains("state: ok") && text.contains("signature checked: yes"),
        "{text}"
    );
    // `commands show` says the same.
    let listed = cp.json(&["commands", "list", "--node", &id]);
    let cmd = listed[0]["id"].as_str().unwrap().to_owned();
    let shown = cp.json(&["commands", "show", &cmd]);
    assert_eq!(shown["state"], "ok");
    assert_eq!(shown["signatureChecked"], true);
}

#[test]
fn what_a_node_may_not_run_is_refused_at_queue_time() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let id = node_id(&agent);
    for (kind, args, reason) in [
        (
            "disk.wipe",
            vec!["--arg", "devices=/dev/sda"],
            "kind-not-allowed",
        ),
        ("no.such", vec![], "unknown-kind"),
        ("diag.ping", vec!["--arg", "bogus=1"], "bad-args"),
    ] {
        let out = send(&cp, &id, kind, &args);
        assert!(!out.status.success(), "{kind} queued");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("command refused ({reason})")),
            "{kind}: {err}"
        );
    }
    let out = send(&cp, "node_nosuchnode", "diag.ping", &[]);
    assert!(stderr(&out).contains("(unknown-node)"), "{}", stderr(&out));
    assert_ok(&cp.cli(&["nodes", "retire", &id]));
    let out = send(&cp, &id, "diag.ping", &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("(retired)"), "{}", stderr(&out));
    assert_eq!(
        cp.json(&["commands", "list"]),
        serde_json::json!([]),
        "nothing stored"
    );
}

#[test]
fn revocation_closes_the_channel_and_nothing_more_is_queued() {
    let mut cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let id = node_id(&agent);
    let mut node = running_node(&agent);
    cp.wait_for_log("command channel open", 1);
    assert_ok(&cp.cli(&["nodes", "revoke-identity", &id]));
    cp.wait_for_log("command channel closed", 1);
    // Its reconnection is refused at the upgrade: nothing kept, no channel.
    node.wait_for("HTTP 403", 1);
    assert_eq!(cp.log().matches("command channel open").count(), 1);
    let out = send(&cp, &id, "diag.ping", &[]);
    assert!(
        stderr(&out).contains("(no-live-certificate)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_expired_command_is_never_delivered() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let id = node_id(&agent);
    // No channel: the command waits, then expires by database time.
    let out = cp.cli(&[
        "commands",
        "send",
        "--node",
        &id,
        "--kind",
        "diag.ping",
        "--timeout",
        "1m",
    ]);
    assert_ok(&out);
    let cmd = stdout(&out).trim().to_owned();
    assert_ok(&cp.cli(&["clock", "set", "--offset", "2m"]));
    assert_eq!(cp.json(&["commands", "show", &cmd])["state"], "expired");
    // Back to the agent's time, or its channel proof is out of the window.
    assert_ok(&cp.cli(&["clock", "set", "--offset", "0s"]));
    let _node = running_node(&agent);
    // A command queued after it is delivered and answered, so the channel
    // is up and has delivered what it had: the expired one was not sent.
    assert_ok(&send(&cp, &id, "diag.ping", &["--wait"]));
    let delivered: Vec<String> = cp
        .log()
        .lines()
        .filter(|l| l.contains("command delivered"))
        .map(str::to_owned)
        .collect();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert!(!delivered[0].contains(&cmd), "{delivered:?}");
    assert_eq!(cp.json(&["commands", "show", &cmd])["state"], "expired");
}

/// PostgreSQL, two replicas: a command queued through replica A reaches
/// the node whose channel replica B holds (B's poll of the shared database).
#[test]
fn a_command_queued_on_one_replica_reaches_a_node_on_another() {
    let a = ControlPlane::start_on(Backend::Postgres);
    let b = a.replica();
    let agent = Agent::new(&b);
    assert_ok(&agent.join_with_token(&a.token("node", &[])));
    let id = node_id(&agent);
    let _node = running_node(&agent);
    let out = send(
        &a,
        &id,
        "diag.ping",
        &["--arg", "echo=across", "--wait", "--json"],
    );
    assert_ok(&out);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["state"], "ok", "{shown}");
    assert_eq!(shown["output"]["echo"], "across");
    assert!(b.log().contains("command delivered"), "B delivered it");
    assert!(!a.log().contains("command delivered"), "A holds no channel");
}

/// A renewal moves the channel to the new certificate: the server closes
/// the old one's channel, the agent reconnects with the new one, and the
/// next result is checked against that certificate's key.
#[test]
fn a_renewal_moves_the_channel_to_the_new_certificate() {
    let mut cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let id = node_id(&agent);
    let mut node = Logged::spawn(agent.command(&["node", "--renew-now"]));
    node.wait_for("renewed the certificate", 1);
    cp.wait_for_log("command channel open", 1);
    let out = send(&cp, &id, "diag.ping", &["--wait", "--json"]);
    assert_ok(&out);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let certs = cp.json(&["nodes", "certs", &id]);
    let certs = certs.as_array().unwrap();
    assert_eq!(certs.len(), 2, "joined, then renewed: {certs:?}");
    assert!(shown["resultCertSerial"].is_string(), "{shown}");
    assert_eq!(
        shown["resultCertSerial"], certs[1]["serial"],
        "the result came over the renewed certificate's channel"
    );
}

/// A test-only path past `commands send`'s checks: `kind` signed with
/// `key` (the control plane's own signing key, read from DIR, unless
/// another is given) and written straight into the `commands` table, where
/// the channel delivers it like any queued command. Returns its id.
pub(crate) fn inject(
    cp: &ControlPlane,
    node: &str,
    kind: &str,
    args: &[(&str, &str)],
    key: Option<p256::ecdsa::SigningKey>,
) -> String {
    use p256::ecdsa::signature::Signer;
    use p256::pkcs8::DecodePrivateKey;
    use prost::Message;
    let key = key.unwrap_or_else(|| {
        let pem = std::fs::read_to_string(cp.path().join("join-signing.key")).unwrap();
        p256::ecdsa::SigningKey::from_pkcs8_pem(&pem).unwrap()
    });
    let id = format!("cmd_injected{}", std::process::id());
    let id = format!("{id}{}", kind.replace('.', ""));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let args: Vec<(String, String)> = args
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let cmd = bc_wire::command::new_command(&id, node, kind, args, now + 120_000);
    let signed = bc_wire::command::sign(&cmd, String::new(), |input| {
        let sig: p256::ecdsa::Signature = key.sign(input);
        Ok::<_, std::convert::Infallible>(sig.to_bytes().into())
    })
    .unwrap();
    // Through the harness: the same statement on SQLite and PostgreSQL
    // (`id`, `node` and `kind` are the test's own: no quoting to escape).
    cp.sql(&format!(
        "INSERT INTO commands (id, node_id, kind, args, signed, state, queued_at, not_after)
         VALUES ('{id}', '{node}', '{kind}', '[]', {}, 'queued', {now}, {})",
        cp.blob_literal(&signed.encode_to_vec()),
        now + 120_000
    ));
    id
}

/// Waits (bounded) until the command has left `queued`; its `show`.
pub(crate) fn settled(cp: &ControlPlane, id: &str) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let shown = cp.json(&["commands", "show", id]);
        if shown["state"] != "queued" || std::time::Instant::now() > deadline {
            return shown;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// What the control plane refuses to queue, delivered anyway (signed by
/// its key, past its checks), is refused by the agent from its own
/// certificate; a command signed by another key is refused as forged.
/// Nothing runs: each comes back `refused`, signed by the node key.
#[test]
fn the_agent_refuses_what_its_certificate_does_not_allow_and_forgeries() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let id = node_id(&agent);
    let _node = running_node(&agent);

    let wipe = inject(&cp, &id, "disk.wipe", &[("devices", "/dev/sda")], None);
    let shown = settled(&cp, &wipe);
    assert_eq!(shown["state"], "refused", "{shown}");
    assert!(
        shown["outcome"]
            .as_str()
            .unwrap()
            .starts_with("kind-not-allowed"),
        "{shown}"
    );
    assert_eq!(shown["signatureChecked"], true);

    let other = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
    let forged = inject(&cp, &id, "diag.ping", &[], Some(other));
    let shown = settled(&cp, &forged);
    assert_eq!(shown["state"], "refused", "{shown}");
    assert!(
        shown["outcome"].as_str().unwrap().starts_with("forged"),
        "{shown}"
    );
}

/// A PXE ramdisk (`bcd ramdisk`, joined by discovery) holds the channel
/// and runs only its kinds: `[discovery] allowed_kinds` narrows them, the
/// narrowing is in its certificate, and what is outside it is refused at
/// queue time.
#[cfg(feature = "failpoints")]
#[test]
fn a_ramdisk_runs_only_its_kinds() {
    use crate::discovery::{boot_add, site, Machine, SiteNode, MAC, UUID};
    let cp = ControlPlane::start_with_config(
        "[discovery]\nallowed_kinds = [\"inventory.refresh\", \"diag.*\"]\n",
    );
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let lease = holder.acquire().unwrap();
    let wf = boot_add(&cp, "dc1", MAC, &["--product-uuid", UUID]);
    let machine = Machine::new(&cp, MAC, UUID);
    let file = machine.agent.root.path().join("cmdline");
    std::fs::write(
        &file,
        format!(
            "console=ttyS0 {} ip=dhcp\n",
            holder.boot_line(lease.epoch, &wf, MAC, UUID)
        ),
    )
    .unwrap();
    let mut cmd = machine
        .agent
        .command(&["ramdisk", "--cmdline", &file.to_string_lossy()]);
    cmd.env("BCD_SYSFS_ROOT", machine.agent.sysfs_root());
    let mut ramdisk = Logged::spawn(cmd);
    ramdisk.wait_for("command channel up", 1);
    let status = machine.agent.status_json();
    assert_eq!(status["role"], "ramdisk");
    let id = status["nodeId"].as_str().unwrap().to_owned();

    for (kind, args) in [
        ("disk.wipe", vec!["--arg", "devices=/dev/vda"]),
        ("logs.collect", vec![]),
    ] {
        let out = send(&cp, &id, kind, &args);
        assert!(
            stderr(&out).contains("command refused (kind-not-allowed)"),
            "{kind}: {}",
            stderr(&out)
        );
    }
    let out = send(&cp, &id, "inventory.refresh", &["--wait", "--json"]);
    assert_ok(&out);
    let inv = cp.json(&["nodes", "inventory", &id]);
    assert_eq!(inv["inventory"]["dmi"]["productUuid"], UUID, "{inv}");
    assert_ok(&send(&cp, &id, "diag.ping", &["--wait"]));
}

/// Retiring a node closes its channel too.
#[test]
fn retirement_closes_the_channel() {
    let mut cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let id = node_id(&agent);
    let _node = running_node(&agent);
    cp.wait_for_log("command channel open", 1);
    assert_ok(&cp.cli(&["nodes", "retire", &id]));
    let line = cp.wait_for_log("command channel closed", 1);
    assert!(line.contains("no longer good"), "{line}");
}
