//! `[discovery] approval = "unknown-machines"`: a discovery join of a boot
//! entry that expects no EK waits for an operator as a join request
//! (`requests list|approve|deny`), through the real `bcd site`, `bcd
//! ramdisk` and `bc-controlplane`. A neighbour on the boot LAN (here
//! loopback) that fetches the victim's script first and joins claiming its
//! MAC and UUID only files a request; the operator denies it, and the
//! entry stays open for the real machine, whose own join the operator
//! approves.

use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

use crate::discovery::{boot_add, boot_state, site, Machine, SiteNode, MAC, UUID};
use crate::harness::*;
use crate::site::{boot_cmdline, BootServer};

const APPROVAL: &str =
    "[discovery]\napproval = \"unknown-machines\"\napproval_retry_after = \"1s\"\n";

fn requests(cp: &ControlPlane) -> Vec<Value> {
    cp.json(&["requests", "list"]).as_array().unwrap().clone()
}

/// Waits until a request other than `known` is listed, and returns it.
#[track_caller]
fn new_request(cp: &ControlPlane, known: &[&Value]) -> Value {
    wait_for(|| {
        requests(cp)
            .into_iter()
            .find(|r| known.iter().all(|k| k["id"] != r["id"]))
    })
}

/// A `bcd ramdisk --once` that runs beside the test (its join waits).
fn boot_beside(cmd: Command) -> std::thread::JoinHandle<Output> {
    std::thread::spawn(move || output_within(cmd, DEADLINE))
}

/// A site with a running `bcd site` holding its lease, and one boot entry
/// for MAC (with its UUID), under `config`.
fn setup(config: &str) -> (ControlPlane, SiteNode, BootServer, String) {
    let cp = ControlPlane::start_with_config(config);
    let site_id = site(&cp, "dc1");
    let node = SiteNode::join(&cp, &site_id);
    let mut server = BootServer::start(&node);
    server.wait_for("boot lease acquired");
    let wf = boot_add(&cp, "dc1", MAC, &["--product-uuid", UUID]);
    (cp, node, server, wf)
}

#[test]
fn a_neighbours_join_waits_for_the_operator_who_denies_it_and_approves_the_machine() {
    let (cp, _node, server, wf) = setup(APPROVAL);

    // The thief fetches the victim's script first and joins claiming the
    // victim's MAC and UUID (claims are software), with no TPM.
    let stolen = String::from_utf8(server.get_from("127.0.0.1", &script_path()).1).unwrap();
    let thief = Machine::new(&cp, MAC, UUID);
    let thief_join = boot_beside(thief.boot_command(&boot_cmdline(&stolen)));
    let pending = new_request(&cp, &[]);
    assert_eq!(pending["status"], "pending");
    assert_eq!(pending["attestor"], "discovery");
    assert_eq!(pending["workflowId"], wf.as_str());
    assert_eq!(pending["mac"], MAC);
    assert_eq!(pending["productUuid"], UUID);
    assert_eq!(pending["ek"], "no TPM");
    assert_eq!(pending["ekSha256"], Value::Null);
    assert_eq!(pending["source"], "127.0.0.1");
    let id = pending["id"].as_str().unwrap().to_owned();
    let text = stdout(&cp.cli(&["requests", "list"]));
    assert!(
        text.contains(&format!(
            "{id} pending discovery entry={wf} mac={MAC} uuid={UUID} ek=no TPM source=127.0.0.1"
        )),
        "{text}"
    );
    // Pending spends nothing: the entry stays open, no node, no token use.
    assert_eq!(boot_state(&cp, &wf), "vouched");
    assert!(cp.nodes().iter().all(|n| n["role"] != "ramdisk"));
    // Approving it with a pool or a site is a tpm enrollment's business.
    let out = cp.cli(&["requests", "approve", &id, "--pool", "default"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is a discovery join"),
        "{}",
        stderr(&out)
    );

    // Denied: the waiting join is refused at its next try.
    let out = cp.refused_once(JOIN_REFUSED, "approval-denied", || {
        let deny = cp.cli(&["requests", "deny", &id]);
        assert_ok(&deny);
        assert!(stdout(&deny).contains(&format!("boot entry {wf} stays open")));
        thief_join.join().expect("the thief's join")
    });
    assert_access_denied(&out);
    assert!(
        stdout(&out).contains(&format!(
            "join pending: waiting for an operator to approve join request {id}"
        )) && stdout(&out).contains(&format!("bc-controlplane requests approve {id}")),
        "the console says what the operator must do: {}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains(&format!(
            "after its join request {id} waited for an operator: an operator denied that request"
        )),
        "{}",
        stderr(&out)
    );
    thief.agent.assert_nothing_written();
    let refusal = cp.refusal("approval-denied");
    assert_eq!(refusal["attestor"], "discovery");
    assert_eq!(boot_state(&cp, &wf), "vouched", "the entry stays open");

    // The machine's own join (its own script, its own node key) files a
    // request of its own; approved, it joins.
    let script = String::from_utf8(server.get_from("127.0.0.2", &script_path()).1).unwrap();
    let machine = Machine::new(&cp, MAC, UUID);
    let machine_join = boot_beside(machine.boot_command(&boot_cmdline(&script)));
    let mine = new_request(&cp, &[&pending]);
    assert_eq!(mine["status"], "pending");
    assert_eq!(mine["workflowId"], wf.as_str());
    assert_ne!(mine["nodeKeySha256"], pending["nodeKeySha256"]);
    let mine_id = mine["id"].as_str().unwrap();
    assert_ok(&cp.cli(&["requests", "approve", mine_id]));
    let out = machine_join.join().expect("the machine's join");
    assert_ok(&out);
    let node_id = machine.agent.status_json()["nodeId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(stdout(&out).contains(&format!("joined as {node_id}")));
    assert_eq!(boot_state(&cp, &wf), "joined");
    let listed = requests(&cp);
    let by_id = |id: &str| listed.iter().find(|r| r["id"] == id).unwrap().clone();
    assert_eq!(by_id(mine_id)["status"], "approved");
    assert_eq!(by_id(mine_id)["used"], true);
    assert_eq!(by_id(&id)["status"], "denied");
    // The approval admitted that join once: it is spent.
    let out = cp.cli(&["requests", "deny", mine_id]);
    assert!(!out.status.success());
}

/// A neighbour minting a node key per join cannot fill the table: an
/// entry has at most 8 pending requests; the next join is refused
/// `approval-busy` (ACCESS_DENIED at bcd ramdisk), and still spends
/// nothing. Once one of them is approved and joins, the others' requests
/// cannot be approved any more.
#[test]
fn an_entry_has_at_most_eight_pending_requests() {
    let (cp, _node, server, wf) = setup(APPROVAL);
    let stolen = String::from_utf8(server.get(&script_path()).1).unwrap();
    let line = boot_cmdline(&stolen);
    let mut waiting: Vec<(Machine, Child)> = Vec::new();
    for n in 1..=8 {
        let m = Machine::new(&cp, MAC, UUID);
        let child = m
            .boot_command(&line)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        waiting.push((m, child));
        wait_for(|| (requests(&cp).len() == n).then_some(()));
    }
    let ninth = Machine::new(&cp, MAC, UUID);
    let out = cp.refused_once(JOIN_REFUSED, "approval-busy", || ninth.boot(&line));
    assert_access_denied(&out);
    ninth.agent.assert_nothing_written();
    assert_eq!(requests(&cp).len(), 8);
    assert_eq!(boot_state(&cp, &wf), "vouched");
    // One approved joins; the others then wait on a closed entry, which no
    // approval can help.
    let listed = requests(&cp);
    assert_ok(&cp.cli(&["requests", "approve", listed[0]["id"].as_str().unwrap()]));
    wait_for(|| (boot_state(&cp, &wf) == "joined").then_some(()));
    let out = cp.cli(&["requests", "approve", listed[1]["id"].as_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!("is for boot entry {wf}, which is joined")),
        "{}",
        stderr(&out)
    );
    for (_, mut child) in waiting {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Without `[discovery] approval` (the spec's default), the same join is
/// admitted at once and files nothing: the boot LAN is trusted.
#[test]
fn without_approval_the_boot_lan_is_trusted() {
    let (cp, _node, server, wf) = setup("");
    let stolen = String::from_utf8(server.get(&script_path()).1).unwrap();
    let thief = Machine::new(&cp, MAC, UUID);
    assert_ok(&thief.boot(&boot_cmdline(&stolen)));
    assert_eq!(boot_state(&cp, &wf), "joined");
    assert!(requests(&cp).is_empty());
}

fn script_path() -> String {
    format!("/boot.ipxe?mac={}", MAC.replace(':', "%3A"))
}

/// `bcd doctor` on the site node names the policy its site runs under, as
/// the control plane's lease answer said it: the trusted boot LAN (the
/// default, a warning with what to do to harden it) or operator approval.
/// (EK-bound entries need entries that name an EK: see the unit test of
/// `site::commissioning`.)
#[test]
fn doctor_on_the_site_node_names_the_commissioning_policy() {
    for (config, says) in [
        (
            "",
            "warn  commissioning: trusted boot LAN (the control plane's [discovery] approval is unset): any host on the boot LAN that fetches a boot entry's script can commission as its machine",
        ),
        (
            APPROVAL,
            "ok    commissioning: operator approval ([discovery] approval = \"unknown-machines\"): a join of a boot entry that names no EK",
        ),
    ] {
        let (_cp, node, _server, _wf) = setup(config);
        let doctor = stdout(&node.agent.run(&["doctor"]));
        let line = doctor
            .lines()
            .find(|l| l.contains("commissioning:"))
            .unwrap_or_else(|| panic!("no commissioning line in\n{doctor}"));
        assert!(line.starts_with(says), "{line}");
        let hardens = line.contains("to harden: bind each boot entry to its machine's TPM (boot add --ek-sha256 H, or --node N), or set [discovery] approval = \"unknown-machines\"");
        assert_eq!(hardens, config.is_empty(), "{line}");
    }
}
