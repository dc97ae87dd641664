//! `[discovery] approval = "unknown-machines"`: a discovery join of a boot
//! entry that expects no EK waits for an operator as a join request
//! (`requests list|approve|deny`), through the real `bcd site`, `bcd
//! ramdisk` and `bc-controlplane`. A neighbour on the boot LAN (here
//! loopback) that fetches the victim's script first and joins claiming its
//! MAC and UUID only files a request; the operator denies it, and the
//! entry stays open for the real machine, whose own join the operator
//! approves.

use std::process::{Command, Stdio};

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
fn boot_beside(mut cmd: Command) -> Running {
    Running::start(&mut cmd)
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
    let out = cp.refused_once(Refusal::Join("discovery"), "approval-denied", || {
        let deny = cp.cli(&["requests", "deny", &id]);
        assert_ok(&deny);
        assert!(stdout(&deny).contains(&format!("boot entry {wf} stays open")));
        thief_join.output()
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
    let out = machine_join.output();
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

/// The approval flood from one script (issue 27, item 3): a neighbour
/// that fetched the victim's script runs nine `bcd ramdisk` with fresh node
/// keys; they file one request between them, each answered with it. More
/// scripts fetched from the neighbour's address file up to four pending
/// requests; the next is refused `approval-busy`, while the victim, from
/// another address (127.0.0.2, through a relay: bcd cannot pick its source
/// address), still files its own, which `requests list` tells apart by
/// source. One `requests deny --entry --source` clears the neighbour for
/// good: the same script sent again is refused `approval-denied` (its
/// assertion is spent: ACCESS_DENIED), its token with another assertion
/// `token-revoked`, and the victim's approval admits it.
#[test]
fn an_approval_flood_from_one_script_leaves_the_victim_heard_and_one_deny_ends_it() {
    let (cp, _node, server, wf) = setup(APPROVAL);
    let fetch = |source: &str| {
        boot_cmdline(&String::from_utf8(server.get_from(source, &script_path()).1).unwrap())
    };
    let stolen = fetch("127.0.0.1");
    let mut flood: Vec<(Machine, Running)> = (0..9).map(|_| spawn_boot(&cp, &stolen)).collect();
    // Each is answered (a pending request named on its console) or gone.
    let answers: Vec<Option<String>> = wait_for(|| {
        flood
            .iter_mut()
            .map(|(m, child)| match pending_id(m) {
                Some(id) => Some(Some(id)),
                None => child.has_ended().then_some(None),
            })
            .collect()
    });
    assert!(
        answers.iter().all(|a| a.is_some() && *a == answers[0]),
        "each of the nine waits on one request: {answers:?}"
    );
    assert_eq!(
        requests(&cp).len(),
        1,
        "nine node keys, one script: one request"
    );

    // Three more scripts from the same address: a request each, up to four.
    for n in 2..=4 {
        let (m, child) = spawn_boot(&cp, &fetch("127.0.0.1"));
        wait_for(|| pending_id(&m));
        assert_eq!(requests(&cp).len(), n);
        flood.push((m, child));
    }
    let fifth = Machine::new(&cp, MAC, UUID);
    let line = fetch("127.0.0.1");
    let out = cp.refused_once(Refusal::Join("discovery"), "approval-busy", || {
        fifth.boot(&line)
    });
    assert_access_denied(&out);
    fifth.agent.assert_nothing_written();

    // The victim, from another address, is heard.
    let theirs: Vec<Value> = requests(&cp);
    let relay = SourceRelay::start(&cp, [127, 0, 0, 2]);
    let victim = Machine::new(&cp, MAC, UUID);
    victim.agent.set_api(&relay.url);
    let victim_join = boot_beside(victim.boot_command(&fetch("127.0.0.2")));
    let mine = new_request(&cp, &theirs.iter().collect::<Vec<_>>());
    assert_eq!(mine["source"], "127.0.0.2");
    assert_eq!(mine["ek"], "no TPM");
    assert!(theirs
        .iter()
        .all(|r| r["source"] == "127.0.0.1" && r["ek"] == "no TPM"));
    let text = stdout(&cp.cli(&["requests", "list"]));
    let mine_id = mine["id"].as_str().unwrap().to_owned();
    let line_of = |id: &str| text.lines().find(|l| l.starts_with(id)).unwrap().to_owned();
    assert!(
        line_of(&mine_id).contains("ek=no TPM source=127.0.0.2"),
        "{text}"
    );

    // One command denies the neighbour's requests, not the victim's.
    let deny = cp.cli(&["requests", "deny", "--entry", &wf, "--source", "127.0.0.1"]);
    assert_ok(&deny);
    assert!(
        stdout(&deny).contains(&format!(
            "denied 4 pending request(s) of boot entry {wf} from 127.0.0.1"
        )),
        "{}",
        stdout(&deny)
    );
    for (m, child) in flood {
        let out = child.output();
        assert_access_denied(&out);
        m.agent.assert_nothing_written();
    }
    let listed = requests(&cp);
    for r in &listed {
        let want = if r["id"] == mine["id"] {
            "pending"
        } else {
            "denied"
        };
        assert_eq!(r["status"], want, "{r}");
    }
    // For good: the same script again, with a fresh node key, files nothing.
    let again = Machine::new(&cp, MAC, UUID);
    let out = cp.refused_once(Refusal::Join("discovery"), "approval-denied", || {
        again.boot(&stolen)
    });
    assert_access_denied(&out);
    // Its token is revoked too: with the unspent assertion of the script
    // refused above, `token-revoked`.
    let word = |line: &str, key: &str| {
        line.split(' ')
            .find_map(|w| w.strip_prefix(key))
            .unwrap()
            .to_owned()
    };
    let mixed =
        crate::discovery::cmdline(&word(&stolen, "bc.token="), &word(&line, "bc.assertion="));
    let out = cp.refused_once(Refusal::Join("discovery"), "token-revoked", || {
        again.boot(&mixed)
    });
    assert_access_denied(&out);
    assert_eq!(requests(&cp).len(), listed.len());
    assert_eq!(boot_state(&cp, &wf), "vouched");

    assert_ok(&cp.cli(&["requests", "approve", &mine_id]));
    assert_ok(&victim_join.output());
    assert_eq!(boot_state(&cp, &wf), "joined");
}

/// `bcd ramdisk --once` with `cmdline`, started (its join waits), its
/// stdout in the agent's directory for [`pending_id`].
fn spawn_boot(cp: &ControlPlane, cmdline: &str) -> (Machine, Running) {
    let m = Machine::new(cp, MAC, UUID);
    let out = std::fs::File::create(m.agent.root.path().join("ramdisk.out")).unwrap();
    let child = Running::spawn(m.boot_command(cmdline).stdout(out).stderr(Stdio::piped()));
    (m, child)
}

/// The join request a [`spawn_boot`] ramdisk said it waits on, once it did.
fn pending_id(m: &Machine) -> Option<String> {
    let out = std::fs::read_to_string(m.agent.root.path().join("ramdisk.out")).ok()?;
    let rest = out
        .split("waiting for an operator to approve join request ")
        .nth(1)?;
    Some(
        rest.split_whitespace()
            .next()?
            .trim_end_matches(['.', ':', ','])
            .to_owned(),
    )
}

/// A TCP relay on 127.0.0.1 that opens each connection to the control
/// plane from `source` (any of 127/8 routes to lo): a real bcd talks TLS
/// straight through it, and the control plane sees that source address.
struct SourceRelay {
    url: String,
    _rt: tokio::runtime::Runtime,
}

impl SourceRelay {
    fn start(cp: &ControlPlane, source: [u8; 4]) -> SourceRelay {
        let upstream: std::net::SocketAddr = cp.url.trim_start_matches("https://").parse().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        rt.spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let socket = tokio::net::TcpSocket::new_v4()?;
                    socket.bind((source, 0).into())?;
                    let mut outbound = socket.connect(upstream).await?;
                    tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await?;
                    Ok::<_, std::io::Error>(())
                });
            }
        });
        SourceRelay { url, _rt: rt }
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
