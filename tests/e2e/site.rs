//! `bcd site`, the real boot server: a site node runs it, the test plays
//! iPXE (a plain HTTP GET of /boot.ipxe for a MAC) and boots the script's
//! command line with `bcd ramdisk`; a standby site node takes over when
//! the holder dies.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use crate::discovery::{
    assert_refused_as, boot_add, boot_state, cmdline, site, Machine, SiteNode, MAC, UUID,
};
use crate::harness::*;
use bc_wire::site_v1::DiscoveryAssertion;

const KERNEL: &[u8] = b"not a kernel, but served as one";
/// 30 bytes, not a multiple of 4: the appended archive needs 2 of padding.
const INITRD: &[u8] = b"070701 an initrd of 30 bytes..";

/// A running `bcd site` of a site node, its log lines as they come.
pub(crate) struct BootServer {
    server: Logged,
    port: u16,
}

impl BootServer {
    pub(crate) fn start(node: &SiteNode) -> BootServer {
        BootServer::start_with(node, "")
    }

    /// With `extra` lines in its `[site]` (written on the first start).
    pub(crate) fn start_with(node: &SiteNode, extra: &str) -> BootServer {
        BootServer::start_configured(node, "backoff_min = \"1s\"\nbackoff_max = \"1s\"\n", extra)
    }

    /// Retrying a failed lease call only after a minute: a test that counts
    /// one refusal of it sees one.
    pub(crate) fn start_slow_to_retry(node: &SiteNode) -> BootServer {
        BootServer::start_configured(node, "backoff_min = \"60s\"\nbackoff_max = \"60s\"\n", "")
    }

    /// With `backoff` lines in its `[node]` (the retries' backoff: 1 s in
    /// the other tests, the defaults with none) and `extra` in its `[site]`.
    fn start_configured(node: &SiteNode, backoff: &str, extra: &str) -> BootServer {
        BootServer::start_env(node, backoff, extra, &[])
    }

    /// [`BootServer::start_configured`] with `envs` for `bcd site`.
    fn start_env(node: &SiteNode, backoff: &str, extra: &str, envs: &[(&str, &str)]) -> BootServer {
        let dir = node.agent.root.path().join("ramdisk");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vmlinuz"), KERNEL).unwrap();
        std::fs::write(dir.join("initrd"), INITRD).unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut config = std::fs::read_to_string(&node.agent.config).unwrap();
        if !config.contains("[site]") {
            config.push_str(&format!(
                "\n[node]\n{backoff}\n[site]\nid = \"{}\"\nlisten = \"127.0.0.1:{port}\"\npublic_url = \"http://127.0.0.1:{port}/\"\nramdisk_dir = \"{}\"\nramdisk_api = \"https://guests.example:8443\"\n{extra}",
                node.site_id,
                dir.display()
            ));
            std::fs::write(&node.agent.config, &config).unwrap();
        }
        let port = config
            .lines()
            .find_map(|l| l.strip_prefix("listen = \"127.0.0.1:"))
            .and_then(|p| p.trim_end_matches('"').parse().ok())
            .unwrap();
        BootServer {
            server: Logged::spawn({
                let mut cmd = node.agent.command(&["site"]);
                cmd.envs(envs.iter().copied());
                cmd
            }),
            port,
        }
    }

    /// Waits for a log line containing `text` (bounded: a minute).
    #[track_caller]
    pub(crate) fn wait_for(&mut self, text: &str) -> String {
        self.wait_for_nth(text, 1)
    }

    /// Waits for the `n`th log line containing `text` (bounded: a minute in
    /// all, however chatty the server is meanwhile).
    #[track_caller]
    fn wait_for_nth(&mut self, text: &str, n: usize) -> String {
        self.server.wait_for(text, n)
    }

    /// Log lines so far containing `text`.
    fn count(&mut self, text: &str) -> usize {
        self.server.count(text)
    }

    /// A GET as iPXE sends it: (status, body).
    pub(crate) fn get(&self, target: &str) -> (u16, Vec<u8>) {
        self.get_from("127.0.0.1", target)
    }

    /// A connection from `source` (any of 127/8: Linux routes it to lo).
    fn connect_from(&self, source: &str) -> TcpStream {
        connect(self.port, source)
    }

    /// [`BootServer::get`] from `source`.
    pub(crate) fn get_from(&self, source: &str, target: &str) -> (u16, Vec<u8>) {
        get_at(self.port, source, target)
    }

    pub(crate) fn script(&self, mac: &str) -> String {
        script_at(self.port, mac)
    }
}

/// A connection to the boot server on `port` from `source`.
fn connect(port: u16, source: &str) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
        let s = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
        s.into_std().unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    stream
}

/// A GET as iPXE sends it to the boot server on `port`, from `source`.
fn get_at(port: u16, source: &str, target: &str) -> (u16, Vec<u8>) {
    let mut s = connect(port, source);
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: site\r\nUser-Agent: iPXE/1.21\r\n\r\n"
    )
    .unwrap();
    // The server closes after its answer; a hang fails here, not CI.
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .unwrap_or_else(|e| panic!("GET {target}: no whole answer within {DEADLINE:?}: {e}"));
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&answer[..end]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, answer[end + 4..].to_vec())
}

/// The script the boot server on `port` answers for `mac`.
fn script_at(port: u16, mac: &str) -> String {
    let (status, body) = get_at(
        port,
        "127.0.0.1",
        &format!("/boot.ipxe?mac={}&uuid={UUID}", mac.replace(':', "%3A")),
    );
    assert_eq!(status, 200);
    String::from_utf8(body).unwrap()
}

/// `bc.token=… bc.assertion=…` from a boot script's kernel line.
pub(crate) fn boot_cmdline(script: &str) -> String {
    let kernel = script
        .lines()
        .find(|l| l.starts_with("kernel "))
        .unwrap_or_else(|| panic!("no kernel line in\n{script}"));
    let value = |key: &str| {
        kernel
            .split(' ')
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {kernel}"))
            .to_owned()
    };
    cmdline(&value("bc.token="), &value("bc.assertion="))
}

/// The assertion a boot script's kernel line carries.
fn assertion_of(script: &str) -> DiscoveryAssertion {
    let kernel = script.lines().find(|l| l.starts_with("kernel ")).unwrap();
    let text = kernel
        .split(' ')
        .find_map(|w| w.strip_prefix("bc.assertion="))
        .unwrap();
    let bytes = bc_wire::site::from_cmdline(text).unwrap();
    bc_wire::site::parse_signed(&bytes).unwrap().1
}

/// `epoch=N` of a log line.
fn epoch_of(line: &str) -> u64 {
    line.split("epoch=")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|e| e.parse().ok())
        .unwrap_or_else(|| panic!("no epoch in {line}"))
}

#[track_caller]
pub(crate) fn assert_exit_script(script: &str) {
    assert!(script.starts_with("#!ipxe"), "{script}");
    assert!(script.contains("\nexit 1"), "{script}");
    assert!(!script.contains("bc.token"), "{script}");
}

#[test]
fn a_machine_pxe_booted_by_bcd_site_joins() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let node = SiteNode::join(&cp, &site_id);
    let mut server = BootServer::start(&node);
    server.wait_for("boot lease acquired");
    let wf = boot_add(&cp, "dc1", MAC, &["--product-uuid", UUID]);

    // Unknown MAC: the exit script, nothing signed.
    assert_exit_script(&server.script("52:54:00:00:00:99"));
    assert_exit_script(&String::from_utf8(server.get("/boot.ipxe?uuid=x").1).unwrap());
    assert_eq!(server.count("discovery assertion signed"), 0);

    let script = server.script(MAC);
    let base = format!("http://127.0.0.1:{}", server.port);
    assert!(
        script.contains(&format!("kernel {base}/ramdisk/vmlinuz ")),
        "{script}"
    );
    assert!(
        script.contains(&format!("initrd {base}/ramdisk/initrd")),
        "{script}"
    );
    // One assertion for one script (the log line may trail the answer).
    server.wait_for("boot script rendered: boot");
    assert_eq!(server.count("discovery assertion signed"), 1);
    assert_eq!(boot_state(&cp, &wf), "vouched");

    let machine = Machine::new(&cp, MAC, UUID);
    let out = machine.boot(&boot_cmdline(&script));
    assert_ok(&out);
    assert_eq!(machine.agent.status_json()["role"], "ramdisk");
    assert_eq!(boot_state(&cp, &wf), "joined");
    // A joined entry boots nothing more.
    assert_exit_script(&server.script(MAC));

    // The ramdisk: the kernel as it is, the initrd with the guests'
    // configuration appended 4-byte aligned.
    assert_eq!(server.get("/ramdisk/vmlinuz"), (200, KERNEL.to_vec()));
    let (status, initrd) = server.get("/ramdisk/initrd");
    assert_eq!(status, 200);
    assert!(initrd.starts_with(INITRD));
    assert_eq!(&initrd[INITRD.len()..INITRD.len() + 2], &[0, 0]);
    assert_eq!(&initrd[INITRD.len() + 2..INITRD.len() + 8], b"070701");
    let text = String::from_utf8_lossy(&initrd);
    assert!(text.contains("etc/bcd/config.toml"));
    assert!(
        text.contains("api = \"https://guests.example:8443\""),
        "{text}"
    );
    assert!(text.contains("join_signing_key"));
    assert_eq!(server.get("/etc/passwd").0, 404);
    // Bounded: a head past 8 KiB is refused; an idle connection holds up nobody.
    let long = format!("/boot.ipxe?mac={MAC}&pad={}", "x".repeat(9000));
    assert_eq!(server.get(&long).0, 431);
    let _idle = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    assert_exit_script(&server.script("52:54:00:00:00:98"));

    // bcd status shows the lease and the ramdisk.
    let status = node.agent.status_json();
    assert_eq!(status["site"]["siteId"], site_id.as_str());
    assert_eq!(status["site"]["held"], true);
    assert_eq!(status["site"]["initrdBytes"], initrd.len() as u64);
    let line = stdout(&node.agent.run(&["status"]));
    assert!(line.contains("boot lease held (epoch 1)"), "{line}");
    let doctor = stdout(&node.agent.run(&["doctor"]));
    assert!(
        doctor.contains(&format!(
            "vmlinuz {} bytes, initrd {} bytes",
            KERNEL.len(),
            INITRD.len()
        )),
        "{doctor}"
    );
    assert!(doctor.contains("held at epoch 1 until"), "{doctor}");
}

#[test]
fn a_standby_site_node_takes_over_when_the_holder_dies() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let first = SiteNode::join(&cp, &site_id);
    let second = SiteNode::join(&cp, &site_id);
    let mut holder = BootServer::start(&first);
    let acquired = holder.wait_for("boot lease acquired");
    let mut standby = BootServer::start(&second);
    standby.wait_for("standing by");
    let wf = boot_add(&cp, "dc1", MAC, &[]);
    // An entry that will have expired by the takeover.
    let brief = "52:54:00:00:00:77";
    boot_add(&cp, "dc1", brief, &["--not-after", "30s"]);

    // The standby signs nothing.
    assert_exit_script(&standby.script(MAC));
    assert_eq!(standby.count("discovery assertion signed"), 0);
    let stale = holder.script(MAC);

    // The holder dies without releasing; its lease runs out (30 s TTL).
    drop(holder);
    assert_ok(&cp.cli(&["clock", "set", "--offset", "31s"]));
    let taken = standby.wait_for("boot lease acquired");
    assert_eq!(
        second.agent.status_json()["site"]["epoch"],
        epoch_of(&taken)
    );
    assert!(
        epoch_of(&taken) > epoch_of(&acquired),
        "{acquired} / {taken}"
    );

    // The dead holder's assertion vouches for nothing now.
    let machine = Machine::new(&cp, MAC, UUID);
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&boot_cmdline(&stale)),
        "lease-not-held",
    );
    machine.agent.assert_nothing_written();
    // An expired entry boots nothing.
    assert_exit_script(&standby.script(brief));
    assert_eq!(standby.count("discovery assertion signed"), 0);
    // The new holder serves the next boot of the same entry.
    let fresh = standby.script(MAC);
    assert_ok(&machine.boot(&boot_cmdline(&fresh)));
    assert_eq!(boot_state(&cp, &wf), "joined");
}

/// `key=N` of a log line.
fn field(line: &str, key: &str) -> u64 {
    line.split(&format!(" {key}="))
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// The control plane away longer than the lease (3 s here; 30 s by
/// default), the site node on the default backoff (30 s doubling to
/// 600 s): the renewals retried within what the lease had left do not
/// carry into the wait after it is lost (attempt 1 again), no wait is
/// longer than the lease, and bcd site serves boot scripts again within a
/// lease TTL of the control plane's return. It stopped serving for 10
/// minutes (`attempt=13 retry_in_ms=600000`).
#[test]
fn bcd_site_serves_again_within_a_lease_ttl_of_the_control_planes_return() {
    const TTL_MS: u64 = 3000;
    let mut cp = ControlPlane::start_with_config("[discovery]\nlease_ttl = \"3s\"\n");
    let site_id = site(&cp, "dc1");
    let node = SiteNode::join(&cp, &site_id);
    let mut server = BootServer::start_configured(&node, "", "");
    server.wait_for("boot lease acquired");
    boot_add(&cp, "dc1", MAC, &[]);
    assert!(server.script(MAC).contains("bc.assertion="));
    let listen = cp.url.trim_start_matches("https://").to_owned();

    cp.stop();
    // Retried while the lease lasts, then lost: the backoff starts over,
    // and each wait is at most the lease's TTL (as the answers showed it).
    for n in 1..=2 {
        let line = server.wait_for_nth("held=false", n);
        assert_eq!(field(&line, "attempt"), n as u64, "{line}");
        let ttl = field(&line, "lease_ttl_ms");
        assert!(ttl <= TTL_MS && ttl > TTL_MS / 2, "{line}");
        assert!(field(&line, "retry_in_ms") <= ttl, "{line}");
    }
    assert_exit_script(&server.script(MAC));

    let _cp = cp.serve_on(&listen);
    let again = server.wait_for_nth("boot lease acquired", 2);
    // Back within a TTL of the control plane's return: what the site
    // decided, every wait while it was away at most a TTL (how long it
    // took on this machine is no check).
    let seen = &server.server.seen;
    let waits: Vec<u64> = seen[..seen.iter().position(|l| *l == again).unwrap()]
        .iter()
        .filter(|l| l.contains("boot lease call failed"))
        .map(|l| field(l, "retry_in_ms"))
        .collect();
    assert!(
        waits.len() >= 2 && waits.iter().all(|w| *w <= TTL_MS),
        "{waits:?}"
    );
    assert!(server.script(MAC).contains("bc.assertion="));
}

/// bcd node renews the site node beside a running bcd site; the site's
/// first certificate then runs out. A site that kept its first identity
/// could no longer hold the lease nor vouch (mTLS and the signer check both
/// refuse an expired certificate).
#[test]
fn bcd_site_follows_its_node_key_when_bcd_node_renews_it() {
    // A short lease, so that its loss is noticed in a second.
    let cp = ControlPlane::start_with_config("[discovery]\nlease_ttl = \"3s\"\n");
    let site_id = site(&cp, "dc1");
    // Joined 23 h ago: past its renewal point, its certificate runs out in
    // an hour (of the control plane's clock, moved below, never waited on).
    assert_ok(&cp.cli(&["clock", "set", "--offset", "-23h"]));
    let node = SiteNode::join(&cp, &site_id);
    assert_ok(&cp.cli(&["clock", "set", "--offset", "0s"]));
    let mut server = BootServer::start(&node);
    let first = server.wait_for("boot lease acquired");
    let before = node.identity();

    // Past its renewal point, `bcd node` renews: a next key, a certificate
    // for the next 24 h.
    assert_ok(&node.agent.run(&["node", "--once"]));
    let after = node.identity();
    assert_ne!(before.chain[0], after.chain[0], "bcd node did not renew");

    // An hour on, the first certificate has expired, and the lease with
    // it: the site takes the lease again over its renewed certificate …
    assert_ok(&cp.cli(&["clock", "set", "--offset", "3605s"]));
    let again = server.wait_for_nth("boot lease acquired", 2);
    assert!(epoch_of(&again) > epoch_of(&first), "{first} / {again}");
    assert!(server.count("identity reloaded") >= 1);
    // (back to the site's own time, so that what it signs is fresh: the
    // lease it took an hour on is held the more)
    assert_ok(&cp.cli(&["clock", "set", "--offset", "0s"]));
    // … and vouches with its renewed key: the machine joins.
    let wf = boot_add(&cp, "dc1", MAC, &[]);
    let script = server.script(MAC);
    let machine = Machine::new(&cp, MAC, UUID);
    assert_ok(&machine.boot(&boot_cmdline(&script)));
    assert_eq!(boot_state(&cp, &wf), "joined");

    // An identity.json that does not load keeps the last good identity,
    // and is tried once, not at every request.
    let file = node.agent.data_dir.join("identity.json");
    let damaged = node.agent.data_dir.join("identity.json.damaged");
    std::fs::write(&damaged, b"{ not json").unwrap();
    std::fs::set_permissions(
        &damaged,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    std::fs::rename(&damaged, &file).unwrap();
    let second = "52:54:00:00:00:42";
    let wf2 = boot_add(&cp, "dc1", second, &[]);
    for _ in 0..3 {
        assert_exit_script(&server.script("52:54:00:00:00:99"));
    }
    let script = server.script(second);
    assert!(script.contains("bc.assertion="), "{script}");
    server.wait_for("does not load; keeping the previous identity");
    assert_eq!(
        server.count("does not load; keeping the previous identity"),
        1
    );
    assert_eq!(boot_state(&cp, &wf2), "vouched");
}

/// A site node that joined with nothing but its TPM: `resolve add --site`
/// makes it a site node of that site, which holds the lease and vouches
/// with its TPM node key. An entry naming no site admits no site node.
#[test]
fn a_tpm_joined_site_node_serves_and_vouches() {
    let cp = ControlPlane::start_trusting_test_maker();
    let site_id = site(&cp, "dc1");
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    let join = ["join", "--role", "site", "--attestor", "tpm"];

    // An entry without a site: refused as a site node, nothing written.
    let ek = agent.allow_ek(&cp);
    assert_refused_as(&cp, Refusal::Join("tpm"), || agent.run(&join), "tpm-role");
    agent.assert_nothing_written();

    // An unknown site is refused by the command; the entry stays as it was.
    let out = cp.cli(&["resolve", "add", "--ek-sha256", &ek, "--site", "nowhere"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no site \"nowhere\""),
        "{}",
        stderr(&out)
    );
    assert!(cp.json(&["resolve", "list"])[0]["site"].is_null());

    let out = cp.cli(&["resolve", "add", "--ek-sha256", &ek, "--site", "dc1"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains(&format!("site={site_id}")),
        "{}",
        stdout(&out)
    );
    assert_eq!(cp.json(&["resolve", "list"])[0]["site"], site_id.as_str());
    // The place fixes the role: not a plain node any more.
    assert_refused_as(
        &cp,
        Refusal::Join("tpm"),
        || agent.run(&["join", "--attestor", "tpm"]),
        "tpm-role",
    );
    assert_ok(&agent.run(&join));
    let status = agent.status_json();
    assert_eq!(status["role"], "site");
    assert_eq!(status["nodeKey"], "tpm");
    let node_id = status["nodeId"].as_str().unwrap().to_owned();
    let listed = cp.nodes();
    let row = listed
        .iter()
        .find(|n| n["nodeId"] == node_id.as_str())
        .unwrap();
    assert_eq!(row["site"], site_id.as_str());
    assert_eq!(row["attestor"], "tpm");

    // It holds the lease and its TPM key signs the assertion a machine
    // joins with (the discovery attestor verifies it against this node's
    // certificate, whose key the TPM certified).
    let node = SiteNode {
        agent,
        site_id: site_id.clone(),
    };
    let mut server = BootServer::start(&node);
    server.wait_for("boot lease acquired");
    let wf = boot_add(&cp, "dc1", MAC, &["--product-uuid", UUID]);
    let script = server.script(MAC);
    server.wait_for("discovery assertion signed");
    let machine = Machine::new(&cp, MAC, UUID);
    assert_ok(&machine.boot(&boot_cmdline(&script)));
    assert_eq!(machine.agent.status_json()["role"], "ramdisk");
    assert_eq!(boot_state(&cp, &wf), "joined");
}

/// A neighbour on the boot LAN asks bcd site for a registered machine's
/// script before the machine does, with a UUID and an IP of its choosing.
/// A UUID that is not the entry's gets the exit script (nothing signed,
/// no SecretRequest); without one it gets a script whose assertion and
/// token name the entry's UUID and its own address, not the one it asked
/// for; its join from there is refused and leaves the entry open; the
/// machine then commissions with a script of its own.
#[test]
fn a_neighbour_that_fetches_a_machines_script_first_takes_nothing() {
    const FORGED: &str = "4c4c4544-0000-0000-0000-00000000beef";
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let node = SiteNode::join(&cp, &site_id);
    let mut server = BootServer::start(&node);
    server.wait_for("boot lease acquired");
    let wf = boot_add(&cp, "dc1", MAC, &["--product-uuid", UUID]);
    let mac = MAC.replace(':', "%3A");

    let (status, body) = server.get(&format!("/boot.ipxe?mac={mac}&uuid={FORGED}&ip=10.9.9.9"));
    assert_eq!(status, 200);
    assert_exit_script(&String::from_utf8(body).unwrap());
    assert_eq!(server.count("discovery assertion signed"), 0);
    assert_eq!(boot_state(&cp, &wf), "waiting", "no SecretRequest was made");

    let (_, body) = server.get(&format!("/boot.ipxe?mac={mac}&ip=10.9.9.9"));
    let stolen = String::from_utf8(body).unwrap();
    let asserted = assertion_of(&stolen);
    assert_eq!(asserted.ip, "127.0.0.1", "the peer, not the query");
    assert_eq!(asserted.product_uuid, UUID, "the entry's UUID");
    assert_eq!(asserted.workflow_id, wf);
    // The thief joins claiming the victim's MAC and its own UUID: refused.
    let thief = Machine::new(&cp, MAC, FORGED);
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || thief.boot(&boot_cmdline(&stolen)),
        "product-uuid-mismatch",
    );
    thief.agent.assert_nothing_written();
    assert_eq!(boot_state(&cp, &wf), "vouched", "the entry stays open");

    // The machine's own script carries a token of its own.
    let script = server.script(MAC);
    assert_ne!(boot_cmdline(&script), boot_cmdline(&stolen));
    let machine = Machine::new(&cp, MAC, UUID);
    assert_ok(&machine.boot(&boot_cmdline(&script)));
    assert_eq!(boot_state(&cp, &wf), "joined");
    let id = machine.agent.status_json()["nodeId"].clone();
    let row = cp.nodes().into_iter().find(|n| n["nodeId"] == id).unwrap();
    assert_eq!(row["hardwareKey"], format!("product-uuid:{UUID}"));
    // The stolen token died with the entry.
    let late = Machine::new(&cp, MAC, UUID);
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || late.boot(&boot_cmdline(&stolen)),
        "token-revoked",
    );
}

/// iPXE requests for MACs with no boot entry are answered from the site's
/// copy of its open entries: no SecretRequest, no signature, no row at the
/// control plane, however many (here 2,000: ten unregistered machines
/// asking 200 times each).
#[test]
fn unknown_macs_cost_the_control_plane_nothing() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let node = SiteNode::join(&cp, &site_id);
    let mut server = BootServer::start(&node);
    server.wait_for("boot lease acquired");
    boot_add(&cp, "dc1", MAC, &[]);
    let before = cp.events().len();
    let started = std::time::Instant::now();
    for i in 0..2000u32 {
        let (status, body) = server.get(&format!(
            "/boot.ipxe?mac=52:54:01:00:00:{:02x}&uuid={UUID}",
            i / 200
        ));
        assert_eq!(status, 200);
        assert!(!String::from_utf8_lossy(&body).contains("bc.token"));
    }
    let took = started.elapsed();
    let added = cp.events().len() - before;
    assert!(added <= 5, "{added} rows for 2,000 unknown MACs");
    assert_eq!(server.count("discovery assertion signed"), 0);
    eprintln!(
        "bench: 2,000 unknown-MAC boot script requests: {} ms, {added} rows",
        took.as_millis()
    );
    // The registered machine still boots.
    assert!(server.script(MAC).contains("bc.assertion="));
}

/// How many of `sockets` the server has closed (EOF or reset; the others
/// would block).
fn closed(sockets: &[TcpStream]) -> usize {
    sockets
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 1];
            let gone = !matches!((&**s).read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
            s.set_nonblocking(false).unwrap();
            gone
        })
        .count()
}

/// Waits (a minute at most) until the server has closed `n` of `sockets`.
#[track_caller]
fn wait_closed(sockets: &[TcpStream], n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while closed(sockets) < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {} closed, not {n}",
            closed(sockets),
            sockets.len()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// 200 idle sockets from one address (a neighbour holding them open) take
/// its 8 connections of the 16 this server holds, not the server: its 192
/// others are closed at once (logged), and another address's script is
/// answered, the longest-idle connection (of a third address) closed to
/// make room when the server is full, and no other: the answer waited for
/// no idle connection to time out. How fast it came (the issue allows 2 s;
/// 18.6 s before the fix) is a `scripts/bench` figure, not a check here.
#[test]
fn idle_sockets_from_one_source_do_not_delay_another() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let node = SiteNode::join(&cp, &site_id);
    // A head deadline of an hour: the idle connections below outlive this
    // test however slow the machine, so any one closed was closed to make
    // room (with 10 s, a slow run would see them time out).
    let mut server = BootServer::start_env(
        &node,
        "backoff_min = \"1s\"\nbackoff_max = \"1s\"\n",
        "max_connections = 16\nmax_connections_per_source = 8\n",
        &[("BCD_SITE_HEAD_TIMEOUT", "1h")],
    );
    server.wait_for("the head deadline is BCD_SITE_HEAD_TIMEOUT");
    server.wait_for("boot lease acquired");
    boot_add(&cp, "dc1", MAC, &[]);

    // Eight idle connections of a third address, the oldest …
    let third: Vec<TcpStream> = (0..8).map(|_| server.connect_from("127.0.0.3")).collect();
    // … then the neighbour's 200: 8 held, 192 closed at once.
    let flood: Vec<TcpStream> = (0..200).map(|_| server.connect_from("127.0.0.1")).collect();
    wait_closed(&flood, 192);
    let refused = server.wait_for("connections refused");
    assert!(refused.contains("last_peer=127.0.0.1"), "{refused}");
    assert!(
        refused.contains("its source holds max_connections_per_source"),
        "{refused}"
    );
    assert_eq!(closed(&third), 0);

    // The server is full of idle connections: another machine's script
    // comes at once, and its assertion names its own address.
    let started = std::time::Instant::now();
    let (status, body) = server.get_from(
        "127.0.0.2",
        &format!("/boot.ipxe?mac={}&uuid={UUID}", MAC.replace(':', "%3A")),
    );
    let took = started.elapsed();
    assert_eq!(status, 200);
    let script = String::from_utf8(body).unwrap();
    assert_eq!(assertion_of(&script).ip, "127.0.0.2");
    // The one closed to make room was the longest idle: the third's first.
    wait_closed(&third, 1);
    // Only it: none timed out (an hour), none else was made room for.
    assert!(closed(&third[..1]) == 1 && closed(&third) == 1 && closed(&flood) == 192);
    eprintln!(
        "bench: a boot script behind 200 idle sockets of another address: {} ms",
        took.as_millis()
    );
}

/// The ramdisk's files are opened at each answer: a rebuilt initrd (as
/// ramdisk/build writes it, renamed into place) is served whole at its new
/// size, a link in its place is refused (one to the data directory's
/// node.key was served before), and so is a directory.
#[test]
fn ramdisk_files_are_opened_at_each_answer_never_through_a_link() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let node = SiteNode::join(&cp, &site_id);
    let mut server = BootServer::start(&node);
    server.wait_for("bcd site serving");
    let dir = node.agent.root.path().join("ramdisk");

    let rebuilt: Vec<u8> = (0..100_001u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.join("initrd.tmp"), &rebuilt).unwrap();
    std::fs::rename(dir.join("initrd.tmp"), dir.join("initrd")).unwrap();
    let (status, initrd) = server.get("/ramdisk/initrd");
    assert_eq!(status, 200);
    assert!(initrd.starts_with(&rebuilt), "served whole");
    // 100,001 bytes: 3 of padding, then the configuration's archive.
    let rest = &initrd[rebuilt.len()..];
    assert_eq!(&rest[..9], b"\x00\x00\x00070701");
    assert!(String::from_utf8_lossy(rest).contains("etc/bcd/config.toml"));

    let key = node.agent.data_dir.join("node.key");
    let secret = std::fs::read(&key).unwrap();
    std::fs::remove_file(dir.join("vmlinuz")).unwrap();
    std::os::unix::fs::symlink(&key, dir.join("vmlinuz")).unwrap();
    let (status, body) = server.get("/ramdisk/vmlinuz");
    assert_eq!(status, 404);
    assert!(!body.windows(16).any(|w| secret.windows(16).any(|k| k == w)));
    let line = server.wait_for("ramdisk file not served");
    assert!(line.contains("is a symbolic link"), "{line}");

    std::fs::remove_file(dir.join("vmlinuz")).unwrap();
    std::fs::create_dir(dir.join("vmlinuz")).unwrap();
    assert_eq!(server.get("/ramdisk/vmlinuz").0, 404);
    let line = server.wait_for("is not a regular file");
    assert!(line.contains("vmlinuz"), "{line}");

    std::fs::remove_dir(dir.join("vmlinuz")).unwrap();
    std::fs::write(dir.join("vmlinuz"), KERNEL).unwrap();
    assert_eq!(server.get("/ramdisk/vmlinuz"), (200, KERNEL.to_vec()));
}

/// A running `bcd site` whose node the operator acts on (`action`, the
/// node id appended): its next lease call is refused as `reason` (exactly
/// once: it then backs off), logged by bcd site as ACCESS_DENIED, and it
/// vouches for no machine from then on.
#[track_caller]
fn a_running_site_is_refused(action: &[&str], reason: &str) {
    // Renewed every few seconds, so the refusal comes soon.
    let cp = ControlPlane::start_with_config("[discovery]\nlease_ttl = \"10s\"\n");
    let site_id = site(&cp, "dc1");
    let node = SiteNode::join(&cp, &site_id);
    let node_id = node.identity().node_id;
    let mut server = BootServer::start_slow_to_retry(&node);
    server.wait_for("boot lease acquired");
    boot_add(&cp, "dc1", MAC, &[]);
    let failed = cp.refused_once(Refusal::Site, reason, || {
        let mut args = action.to_vec();
        args.push(&node_id);
        assert_ok(&cp.cli(&args));
        server.wait_for("boot lease call failed")
    });
    assert!(
        failed.contains("access denied") && failed.contains("held=false"),
        "{failed}"
    );
    assert_exit_script(&server.script(MAC));
    assert_eq!(server.count("discovery assertion signed"), 0);
}

#[test]
fn a_running_site_whose_node_is_retired_is_refused_node_retired() {
    a_running_site_is_refused(&["nodes", "retire"], "node-retired");
}

#[test]
fn a_running_site_whose_identity_is_revoked_is_refused_certificate_stale() {
    a_running_site_is_refused(&["nodes", "revoke-identity"], "certificate-stale");
}

/// A `bcd site` configured with a site its node does not belong to (a
/// config copied from another site's node): its lease is refused
/// `not-site-node`, ACCESS_DENIED in its log, and it vouches for nobody.
#[test]
fn a_site_node_serving_another_site_is_refused_not_site_node() {
    let cp = ControlPlane::start();
    let node = SiteNode::join(&cp, &site(&cp, "dc1"));
    let elsewhere = SiteNode {
        site_id: site(&cp, "dc2"),
        ..node
    };
    boot_add(&cp, "dc2", MAC, &[]);
    let (server, failed) = cp.refused_once(Refusal::Site, "not-site-node", || {
        let mut server = BootServer::start_slow_to_retry(&elsewhere);
        let failed = server.wait_for("boot lease call failed");
        (server, failed)
    });
    assert!(failed.contains("access denied"), "{failed}");
    assert_exit_script(&server.script(MAC));
}

/// A running `bcd site` whose clock is more than a minute behind the
/// control plane's: its SecretRequest for a machine's script is refused
/// `secret-stale` (ACCESS_DENIED, which bcd site logs as the control
/// plane's refusal of its request, not as an entry it does not know), and
/// the machine is told to exit. (The lease lasts an hour so that only the request is stale.)
#[test]
fn a_running_sites_stale_secret_request_is_refused() {
    let cp = ControlPlane::start_with_config("[discovery]\nlease_ttl = \"1h\"\n");
    let node = SiteNode::join(&cp, &site(&cp, "dc1"));
    let mut server = BootServer::start_slow_to_retry(&node);
    server.wait_for("boot lease acquired");
    boot_add(&cp, "dc1", MAC, &[]);
    assert_ok(&cp.cli(&["clock", "set", "--offset", "2m"]));
    let script = cp.refused_once(Refusal::Site, "secret-stale", || server.script(MAC));
    assert_exit_script(&script);
    // bcd site says its request was refused: the entry is listed and open.
    let exit = server.wait_for("boot script rendered: exit");
    assert!(
        exit.contains("the control plane refused this site node's secret request"),
        "{exit}"
    );
    assert!(!exit.contains("no open boot entry"), "{exit}");
    assert_eq!(server.count("discovery assertion signed"), 0);
}

/// A running `bcd site` asked for one machine's script over and over (a
/// neighbour flooding it): the 33rd SecretRequest for the entry is refused
/// `workflow-busy` (32 unspent tokens at most), the machine told to exit.
#[test]
fn a_running_site_asked_for_one_entry_too_often_is_refused_workflow_busy() {
    let cp = ControlPlane::start();
    let node = SiteNode::join(&cp, &site(&cp, "dc1"));
    let mut server = BootServer::start_slow_to_retry(&node);
    server.wait_for("boot lease acquired");
    boot_add(&cp, "dc1", MAC, &[]);
    for _ in 0..32 {
        assert!(server.script(MAC).contains("bc.assertion="));
    }
    let script = cp.refused_once(Refusal::Site, "workflow-busy", || server.script(MAC));
    assert_exit_script(&script);
    // bcd site says its request was refused: the entry is listed and open.
    let exit = server.wait_for("boot script rendered: exit");
    assert!(
        exit.contains("the control plane refused this site node's secret request"),
        "{exit}"
    );
    assert!(!exit.contains("no open boot entry"), "{exit}");
}

/// A running `bcd site` whose lease ran out at the control plane (its clock
/// moved past the 10 s lease) while the site still counts it held: its
/// renewal is refused `lease-lost`, logged as ACCESS_DENIED, and it stops
/// vouching at once rather than at its own view of the expiry.
#[test]
fn a_running_site_renewing_a_lease_that_ran_out_is_refused_lease_lost() {
    let cp = ControlPlane::start_with_config("[discovery]\nlease_ttl = \"10s\"\n");
    let node = SiteNode::join(&cp, &site(&cp, "dc1"));
    let mut server = BootServer::start_slow_to_retry(&node);
    server.wait_for("boot lease acquired");
    boot_add(&cp, "dc1", MAC, &[]);
    let failed = cp.refused_once(Refusal::Site, "lease-lost", || {
        assert_ok(&cp.cli(&["clock", "set", "--offset", "11s"]));
        server.wait_for("boot lease call failed")
    });
    assert!(
        failed.contains("access denied") && failed.contains("held=false"),
        "{failed}"
    );
    assert_exit_script(&server.script(MAC));
    assert_eq!(server.count("discovery assertion signed"), 0);
}

/// A running `bcd site` whose lease is lost while its GetSecret for a
/// machine is in flight: a failpoint holds the answer until the lease has
/// moved (a GetSecret slower than the lease), and the control plane's
/// clock moves past the 30 s lease, so the site's next renewal is refused
/// `lease-lost`. It signs nothing with the token it got and tells the
/// machine to exit, naming the lost lease; another site node takes over.
#[test]
fn a_site_that_loses_its_lease_during_a_secret_call_tells_the_machine_to_exit() {
    let cp = ControlPlane::start_with_config("[discovery]\nlease_ttl = \"30s\"\n");
    let site_id = site(&cp, "dc1");
    let node = SiteNode::join(&cp, &site_id);
    let other = SiteNode::join(&cp, &site_id);
    let mut server = BootServer::start_env(
        &node,
        "backoff_min = \"60s\"\nbackoff_max = \"60s\"\n",
        "",
        &[("BCD_FAILPOINT", "site-secret-outlasts-lease")],
    );
    let acquired = server.wait_for("boot lease acquired");
    boot_add(&cp, "dc1", MAC, &[]);
    let port = server.port;
    let script = std::thread::scope(|s| {
        let asked = s.spawn(|| script_at(port, MAC));
        // The secret is issued under the lease; then the lease runs out.
        server.wait_for("the secret answer waits for the lease to move");
        let failed = cp.refused_once(Refusal::Site, "lease-lost", || {
            assert_ok(&cp.cli(&["clock", "set", "--offset", "31s"]));
            server.wait_for("boot lease call failed")
        });
        assert!(
            failed.contains("access denied") && failed.contains("held=false"),
            "{failed}"
        );
        asked.join().unwrap()
    });
    assert_exit_script(&script);
    assert!(
        script.contains("echo bc-site: this site node lost the boot lease"),
        "{script}"
    );
    let exit = server.wait_for("boot script rendered: exit");
    assert!(
        exit.contains("this site node lost the boot lease"),
        "{exit}"
    );
    assert_eq!(server.count("discovery assertion signed"), 0);
    // Another site node takes the lease over at a higher epoch (the first
    // one asks again only a good part of a TTL later).
    let mut standby = BootServer::start(&other);
    let taken = standby.wait_for("boot lease acquired");
    assert!(
        epoch_of(&taken) > epoch_of(&acquired),
        "{acquired} / {taken}"
    );
}

/// A running `bcd site` of a TPM-joined node whose TPM goes away (its
/// swtpm stopped) after the site served a machine: the next machine's
/// script cannot be vouched for, since the node key cannot sign its
/// SecretRequest. The machine is told to exit, naming the node key, and
/// the log says what the TPM answered. (The lease lasts an hour, so that no
/// renewal needs the key meanwhile.)
#[test]
fn a_site_whose_node_key_cannot_sign_tells_the_machine_to_exit() {
    let cp = ControlPlane::start_trusting_test_maker_with("[discovery]\nlease_ttl = \"1h\"\n");
    let site_id = site(&cp, "dc1");
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    let ek = agent.allow_ek(&cp);
    assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek, "--site", "dc1"]));
    assert_ok(&agent.run(&["join", "--role", "site", "--attestor", "tpm"]));
    let node = SiteNode { agent, site_id };
    let mut server = BootServer::start_slow_to_retry(&node);
    server.wait_for("boot lease acquired");
    boot_add(&cp, "dc1", MAC, &[]);
    assert!(server.script(MAC).contains("bc.assertion="));

    drop(tpm);
    let script = server.script(MAC);
    assert_exit_script(&script);
    assert!(
        script.contains("echo bc-site: the site's node key cannot sign"),
        "{script}"
    );
    let warned = server.wait_for("the node key cannot sign");
    assert!(warned.contains("error="), "{warned}");
    assert_eq!(server.count("discovery assertion signed"), 1);
}
