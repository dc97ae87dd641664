//! `bcd helper` and the node under `[helper]`: the real helper binary as
//! root on a swtpm, the real node as another user (`daemon`, uid 1) whose
//! config names a TPM that does not exist (so it cannot have used one), and
//! purpose-built helpers in this process (a lying one, a dying one) serving
//! the same protocol with bcd's own TPM backend.

use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use bc_helper::{AkInfo, Backend, BackendError, Hash};
use bcd::helper::TpmBackend;

use crate::harness::*;

/// The node's user: present on every Debian system, not root.
const NODE_USER: &str = "daemon";
const NODE_UID: u32 = 1;
const NODE_GID: u32 = 1;
/// A caller the helper must refuse (in the node's group, so the socket's
/// mode lets it connect and only the uid check stands in its way).
const OTHER_UID: u32 = 65534;

/// A TPM-joined machine whose node runs under `[helper]`.
struct Machine {
    agent: Agent,
    /// The node's config: the agent's, with a TPM that does not exist.
    node_config: PathBuf,
    socket: PathBuf,
}

impl Machine {
    fn join(cp: &ControlPlane, tpm: &Swtpm) -> Machine {
        Machine::join_with(cp, tpm, |_| {})
    }

    /// [`Machine::join`], with `prepare` done to the agent's machine first.
    fn join_with(cp: &ControlPlane, tpm: &Swtpm, prepare: impl FnOnce(&Agent)) -> Machine {
        let agent = Agent::with_tpm(cp, tpm);
        prepare(&agent);
        let socket = agent.root.path().join("helper.sock");
        let mut config = std::fs::read_to_string(&agent.config).unwrap();
        config.push_str(&format!(
            "\n[helper]\nsocket = \"{}\"\nuser = \"{NODE_USER}\"\n\n[node]\nbackoff_min = \"1s\"\nbackoff_max = \"1s\"\n",
            socket.display()
        ));
        std::fs::write(&agent.config, &config).unwrap();
        let node_config = agent.root.path().join("node.toml");
        let dead = config.replace(&tpm.tcti(), "swtpm:host=127.0.0.1,port=1");
        assert_ne!(dead, config);
        std::fs::write(&node_config, dead).unwrap();
        // The node's user reaches its config and the socket through here.
        std::fs::set_permissions(agent.root.path(), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        agent.allow_ek(cp);
        assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
        Machine {
            agent,
            node_config,
            socket,
        }
    }

    /// `bcd ARGS --config node.toml` as `uid` (the node's user by default).
    fn as_user(&self, uid: u32, args: &[&str]) -> Command {
        let mut cmd = Command::new(bcd_for_any_user());
        cmd.args(args)
            .arg("--config")
            .arg(&self.node_config)
            .env_remove("BCD_JOIN_TOKEN")
            .env_remove("TPM2TOOLS_TCTI")
            .env_remove("TCTI")
            .env("TSS2_LOG", "all+none")
            .stdin(Stdio::null())
            .uid(uid)
            .gid(NODE_GID);
        cmd
    }

    fn node(&self, args: &[&str]) -> Output {
        let mut all = vec!["node"];
        all.extend_from_slice(args);
        self.as_user(NODE_UID, &all).within()
    }

    fn identity(&self) -> bcd::identity::Identity {
        // This (root) process reads the node user's files, as bcd status does.
        bcd::identity::guard::trust_owner(NODE_UID);
        let access = bcd::keys::TpmAccess::through_helper(&self.socket);
        bcd::identity::Identity::load(&self.agent.data_dir, &access)
            .expect("the identity loads")
            .expect("an identity")
    }

    /// The helper's TPM backend, as `bcd helper` opens it.
    fn backend(&self) -> TpmBackend {
        let config = bcd::config::Config::load(&self.agent.config).unwrap();
        bcd::helper::open_backend(&config).expect("open the helper's TPM")
    }
}

impl Logged {
    /// The real `bcd helper`, as root, serving once it says so.
    fn helper(m: &Machine) -> Logged {
        let mut h = Logged::spawn(m.agent.command(&["helper"]));
        h.wait_for("bcd helper serving", 1);
        h
    }
}

/// A helper in this process: the protocol's server with `backend`.
struct InProcessHelper {
    rt: Option<tokio::runtime::Runtime>,
}

impl InProcessHelper {
    fn start(m: &Machine, backend: impl Backend) -> InProcessHelper {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let _ = std::fs::remove_file(&m.socket);
        let listener = rt
            .block_on(async { tokio::net::UnixListener::bind(&m.socket) })
            .unwrap();
        std::os::unix::fs::chown(&m.socket, Some(0), Some(NODE_GID)).unwrap();
        std::fs::set_permissions(&m.socket, std::fs::Permissions::from_mode(0o660)).unwrap();
        rt.spawn(bc_helper::serve(
            listener,
            backend,
            bc_helper::Allowed::root_and(NODE_UID),
            bc_helper::Limits::default(),
            std::future::pending(),
        ));
        InProcessHelper { rt: Some(rt) }
    }

    /// Gone at once, as a killed helper: connections dropped mid-request.
    fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for InProcessHelper {
    fn drop(&mut self) {
        self.kill();
    }
}

fn mode(path: &std::path::Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.uid(), m.mode() & 0o777)
}

#[test]
fn the_node_renews_through_the_helper_with_a_certified_next_key() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let m = Machine::join(&cp, &tpm);
    // bcd join (root, its own TPM connection) left everything to the node's user.
    assert_eq!(mode(&m.agent.data_dir), (NODE_UID, 0o700));
    for f in m.agent.files() {
        assert_eq!(mode(&m.agent.data_dir.join(&f)), (NODE_UID, 0o600), "{f}");
    }
    let _helper = Logged::helper(&m);
    assert_eq!(mode(&m.socket), (0, 0o660));
    let first = m.identity();
    let statement = bcd::pki::NodeCert::parse(&first.chain[0])
        .unwrap()
        .statements;
    assert!(statement[0].starts_with("urn:bc:tpm-ak:sha256:"));

    let out = m.node(&["--once", "--renew-now"]);
    assert_ok(&out);
    assert!(stderr(&out).contains("certified=true"), "{}", stderr(&out));
    let renewed = m.identity();
    assert_ne!(renewed.key.spki_der(), first.key.spki_der(), "a new key");
    assert_eq!(renewed.key.kind().as_str(), "tpm");
    assert_eq!(
        bcd::pki::NodeCert::parse(&renewed.chain[0])
            .unwrap()
            .statements,
        statement,
        "the control plane accepted the AK's certification of the next key"
    );
    for f in m.agent.files() {
        assert_eq!(mode(&m.agent.data_dir.join(&f)), (NODE_UID, 0o600), "{f}");
    }

    // The node's user sees a TPM node key, and its doctor the helper. The
    // helper keeps the key loaded: loading it again derives nothing.
    let create_primaries = || tpm.command_codes().iter().filter(|c| **c == 0x131).count();
    let before = create_primaries();
    for _ in 0..2 {
        let status = m.as_user(NODE_UID, &["status", "--json"]).within();
        let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(json["nodeKey"], "tpm", "{json}");
    }
    assert_eq!(
        create_primaries(),
        before,
        "the helper kept the node key loaded"
    );
    let doctor = m.as_user(NODE_UID, &["doctor"]).within();
    let text = stdout(&doctor);
    assert!(
        text.contains("ok    helper: bcd helper at ")
            && text.contains(&format!("serves uid {NODE_UID}; its TPM: swtpm:"))
            && text
                .contains("ok    tpm: held by bcd helper; the node's user daemon cannot open it")
            && text.contains("ok    node key: in the TPM")
            && text.contains("ok    data dir:"),
        "{text}"
    );
}

/// Under a pool's boot policy the node (which cannot read the event log,
/// and has no TPM) renews with the log the helper read and the quote the
/// helper took beside the next key's certification (`tpm.certify_quote`).
#[cfg(feature = "failpoints")]
#[test]
fn under_a_boot_policy_the_node_renews_with_the_helpers_log_and_quote() {
    use crate::mboot::{extend, install_log, policy_from_log, read_log, set_policy, LOG};
    let log = read_log(LOG);
    let cp = ControlPlane::start_trusting_test_maker();
    set_policy(&cp, &policy_from_log(&cp));
    let tpm = Swtpm::start();
    extend(&tpm, &log);
    let m = Machine::join_with(&cp, &tpm, |agent| install_log(agent, &log));
    let _helper = Logged::helper(&m);
    let quotes = || tpm.command_codes().iter().filter(|c| **c == 0x158).count();
    let before = quotes();
    let out = m.node(&["--once", "--renew-now"]);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("boot_evidence=true"),
        "{}",
        stderr(&out)
    );
    assert_eq!(quotes(), before + 1, "one quote, by the helper");
    // The node's own read would have failed: it has no BCD_SYSFS_ROOT,
    // and this machine no event log; the log is the helper's.
    assert!(std::env::var_os("BCD_SYSFS_ROOT").is_none());
    let nodes = cp.nodes();
    let id = nodes[0]["nodeId"].as_str().unwrap();
    let shown = cp.cli(&["nodes", "show", id, "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["lastVerifiedBoot"]["via"], "renew", "{shown}");
}

#[test]
fn the_helper_serves_root_and_its_user_and_refuses_others() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let m = Machine::join(&cp, &tpm);
    let mut helper = Logged::helper(&m);
    let helper_line = |uid: u32| {
        let out = m.as_user(uid, &["doctor"]).within();
        stdout(&out)
            .lines()
            .find(|l| l.contains(" helper: "))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        helper_line(0).starts_with("ok    helper:"),
        "{}",
        helper_line(0)
    );
    assert!(helper_line(NODE_UID).starts_with("ok    helper:"));
    let refused = helper_line(OTHER_UID);
    assert!(
        refused.starts_with("fail  helper:") && refused.contains("does not serve uid 65534"),
        "{refused}"
    );
    helper.wait_for(
        "refused a caller that is neither root nor the helper's user",
        1,
    );
    assert!(
        helper.seen.iter().any(|l| l.contains("uid=65534")),
        "{:#?}",
        helper.seen
    );

    // A malformed and an oversized request close their own connections; the
    // helper goes on serving, and says so once a minute, not per frame.
    let bad_frames = [&[0u8, 0, 0, 2, 0xff, 0xff][..], &[0, 1, 0, 0][..]];
    for bad in bad_frames.iter().cycle().take(20) {
        let mut s = std::os::unix::net::UnixStream::connect(&m.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bad).unwrap();
        let mut buf = [0u8; 1];
        assert!(matches!(
            std::io::Read::read(&mut s, &mut buf),
            Ok(0) | Err(_)
        ));
    }
    helper.wait_for("closed a connection", 1);
    assert_ok(&m.node(&["--once", "--renew-now"]));
    // Every line is written before its connection closes: all are in by
    // the helper's last line.
    helper.stop();
    helper.wait_for("bcd helper stopped", 1);
    let closed = helper
        .seen
        .iter()
        .filter(|l| l.contains("closed a connection"))
        .count();
    assert_eq!(closed, 1, "{:#?}", helper.seen);

    // A node user in the tss group could open the TPM itself: doctor's tpm
    // check fails. (`tss`, whose primary group that is, where it exists.)
    if nix::unistd::User::from_name("tss").ok().flatten().is_some() {
        let config = std::fs::read_to_string(&m.agent.config).unwrap();
        let in_tss = m.agent.root.path().join("tss.toml");
        std::fs::write(
            &in_tss,
            config.replace("user = \"daemon\"", "user = \"tss\""),
        )
        .unwrap();
        let out = Command::new(bin("bcd"))
            .args(["doctor", "--config"])
            .arg(&in_tss)
            .within();
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(
            text.contains("fail  tpm: the node's user tss is in the tss group")
                && text.contains("gpasswd -d tss tss"),
            "{text}"
        );
    }
}

/// Lies on one operation, tells the truth (its TPM's) otherwise.
struct Liar {
    honest: TpmBackend,
    lie: Lie,
}

enum Lie {
    /// Signs with a key of its own.
    Signature,
    /// Certifies with another TPM's AK (the other machine's key of the same unique).
    Certification(Box<TpmBackend>),
    /// Announces a node key (an unrestricted one) as its AK.
    AkNotAttestation,
    /// Announces its AK under another name than its public area's.
    AkName,
    /// Answers a node key with its AK's public area (a restricted key).
    NodeKeyRestricted,
}

impl Backend for Liar {
    fn ak(&mut self) -> Result<AkInfo, BackendError> {
        let mut ak = self.honest.ak()?;
        match self.lie {
            Lie::AkNotAttestation => {
                ak.public = self.honest.node_key(&[3; 32])?;
                ak.name = bc_wire::tpm::Public::parse(&ak.public).unwrap().name();
            }
            Lie::AkName => ak.name[5] ^= 1,
            _ => {}
        }
        Ok(ak)
    }
    fn node_key(&mut self, unique: &[u8; 32]) -> Result<Vec<u8>, BackendError> {
        match self.lie {
            Lie::NodeKeyRestricted => Ok(self.honest.ak()?.public),
            _ => self.honest.node_key(unique),
        }
    }
    fn sign(&mut self, u: &[u8; 32], h: Hash, digest: &[u8]) -> Result<[u8; 64], BackendError> {
        match self.lie {
            Lie::Signature => {
                use p256::ecdsa::signature::hazmat::PrehashSigner as _;
                let other = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
                let sig: p256::ecdsa::Signature = other.sign_prehash(digest).unwrap();
                Ok(sig.to_bytes().into())
            }
            _ => self.honest.sign(u, h, digest),
        }
    }
    fn certify(&mut self, u: &[u8; 32], q: &[u8]) -> Result<(Vec<u8>, Vec<u8>), BackendError> {
        match &mut self.lie {
            Lie::Certification(other) => other.certify(u, q),
            _ => self.honest.certify(u, q),
        }
    }
}

/// `bcd helper` whose kernel cannot say who a caller is (SO_PEERCRED
/// failing, which only a failpoint makes happen on Linux) serves nobody: the
/// connection is closed, the helper's log says why, and the node's identity
/// does not load (its key is the helper's), with nothing changed.
#[cfg(feature = "failpoints")]
#[test]
fn a_caller_whose_credentials_are_unknown_is_refused() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let m = Machine::join(&cp, &tpm);
    let before = std::fs::read(m.agent.data_dir.join("identity.json")).unwrap();
    let files = m.agent.files();
    let mut helper = {
        let mut cmd = m.agent.command(&["helper"]);
        cmd.env("BCD_FAILPOINT", "helper-peer-credentials-unknown");
        let mut h = Logged::spawn(cmd);
        h.wait_for("bcd helper serving", 1);
        h
    };
    let out = m.node(&["--once", "--renew-now"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("bcd helper closed the connection without answering")
            && err.contains("see its log"),
        "{err}"
    );
    helper.wait_for("refused a caller whose credentials are unknown", 1);
    assert_eq!(
        std::fs::read(m.agent.data_dir.join("identity.json")).unwrap(),
        before
    );
    assert_eq!(m.agent.files(), files);
}

/// `machine.ids`: the real helper reads, as root, what the unprivileged
/// node's inventory needs: DMI's root-only identifiers (here the machine's
/// fake sysfs) and its TPM's EK, the one `bcd tpm identify` names. (A
/// fake sysfs needs a failpoints build.)
#[cfg(feature = "failpoints")]
#[test]
fn the_helper_reads_the_machine_for_the_inventory() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let m = Machine::join(&cp, &tpm);
    let ek = m.agent.identify()["ekSha256"]
        .as_str()
        .expect("ekSha256")
        .to_owned();
    m.agent.sysfs(
        "class/dmi/id/product_uuid",
        "4C4C4544-0042-3510-8052-B4C04F4E4D32\n",
    );
    m.agent.sysfs("class/dmi/id/product_serial", "SER-42\n");
    let _helper = Logged::helper(&m);
    let ids = bc_helper::Client::new(&m.socket)
        .machine()
        .expect("machine.ids");
    assert_eq!(ids.product_uuid, "4c4c4544-0042-3510-8052-b4c04f4e4d32");
    assert_eq!(ids.product_serial, "SER-42");
    assert_eq!(hex::encode(&ids.ek_sha256), ek);
    assert!(
        !ids.manufacturer.is_empty() && !ids.firmware.is_empty(),
        "{ids:?}"
    );
    assert!(ids.pcr_banks.iter().any(|b| b == "sha256"), "{ids:?}");
    // And the node key still works after it (the EK was flushed).
    assert_ok(&m.node(&["--once", "--renew-now"]));
}

#[test]
fn a_lying_helper_is_caught_and_nothing_is_sent() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let other_tpm = Swtpm::start_another_machine();
    let m = Machine::join(&cp, &tpm);
    let before = std::fs::read(m.agent.data_dir.join("identity.json")).unwrap();
    let files = m.agent.files();

    let other = {
        let agent = Agent::with_tpm(&cp, &other_tpm);
        let config = bcd::config::Config::load(&agent.config).unwrap();
        bcd::helper::open_backend(&config).unwrap()
    };
    // (the lie, what bcd was doing when it caught it, what it says of it)
    let renewing = "renewal failed";
    for (lie, doing, caught) in [
        (
            Lie::Signature,
            renewing,
            "a signature that does not verify against the key's public half",
        ),
        (
            Lie::Certification(Box::new(other)),
            renewing,
            "the certification is not the announced AK's of this key: node-key-signature",
        ),
        (
            Lie::AkNotAttestation,
            renewing,
            "the AK is not a restricted P-256 signing key of the TPM",
        ),
        (
            Lie::AkName,
            renewing,
            "the AK's name is not its public area's",
        ),
        // The current node key is the helper's too: caught as it loads.
        (
            Lie::NodeKeyRestricted,
            "does not load",
            "the node key is not an unrestricted signing key bound to the TPM",
        ),
    ] {
        let liar = Liar {
            honest: m.backend(),
            lie,
        };
        let helper = InProcessHelper::start(&m, liar);
        let out = m.node(&["--once", "--renew-now"]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(doing)
                && err.contains("bcd helper's answer does not check out")
                && err.contains(caught),
            "{err}"
        );
        // Nothing changed: the same identity, no next key left behind.
        assert_eq!(
            std::fs::read(m.agent.data_dir.join("identity.json")).unwrap(),
            before
        );
        assert_eq!(m.agent.files(), files);
        drop(helper);
    }
    // The control plane never saw a renewal request.
    let log = cp.log();
    assert!(
        !log.contains("node renewed") && !log.contains("renew refused"),
        "{log}"
    );
}

/// Answers `tpm.certify` only once the test lets it: the test kills the
/// helper while the node waits for it.
struct Stalls {
    inner: TpmBackend,
    reached: mpsc::Sender<()>,
    release: mpsc::Receiver<()>,
}

impl Backend for Stalls {
    fn ak(&mut self) -> Result<AkInfo, BackendError> {
        self.inner.ak()
    }
    fn node_key(&mut self, unique: &[u8; 32]) -> Result<Vec<u8>, BackendError> {
        self.inner.node_key(unique)
    }
    fn sign(&mut self, u: &[u8; 32], h: Hash, d: &[u8]) -> Result<[u8; 64], BackendError> {
        self.inner.sign(u, h, d)
    }
    fn certify(&mut self, _: &[u8; 32], _: &[u8]) -> Result<(Vec<u8>, Vec<u8>), BackendError> {
        let _ = self.reached.send(());
        let _ = self.release.recv();
        Err(BackendError("killed".into()))
    }
}

#[test]
fn a_helper_killed_mid_renewal_is_retried_until_it_is_back() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let m = Machine::join(&cp, &tpm);

    // A real helper, killed (-9) with the node's key loaded in the TPM.
    let mut real = Logged::helper(&m);
    let first = m.identity().chain;
    assert_ok(&m.node(&["--once"]));
    real.kill();

    let (reached, reached_rx) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let mut stalling = InProcessHelper::start(
        &m,
        Stalls {
            inner: m.backend(),
            reached,
            release: release_rx,
        },
    );
    let mut node = Logged::spawn(m.as_user(NODE_UID, &["node", "--renew-now"]));
    reached_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the node asks for the certification");
    stalling.kill();
    drop(release);
    node.wait_for("renewal failed", 2);
    let failures: Vec<&String> = node
        .seen
        .iter()
        .filter(|l| l.contains("renewal failed"))
        .collect();
    assert!(
        failures[0].contains("attempt=1") && failures[1].contains("attempt=2"),
        "{failures:#?}"
    );
    assert!(
        failures.iter().all(|l| l.contains("retryIn=1s")),
        "{failures:#?}"
    );
    assert!(
        failures[1].contains("cannot reach bcd helper"),
        "{}",
        failures[1]
    );

    // The helper is back (it flushes what its killed predecessor left).
    let _helper = Logged::helper(&m);
    node.wait_for("renewed the certificate", 1);
    node.stop();
    let renewed = m.identity();
    assert_ne!(renewed.chain, first);
    assert_eq!(
        m.agent.files(),
        vec!["identity.json", "journal.db", "node.key"]
    );
    for f in m.agent.files() {
        assert_eq!(mode(&m.agent.data_dir.join(&f)), (NODE_UID, 0o600), "{f}");
    }
}

#[test]
fn a_socket_activated_helper_serves_the_node() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let m = Machine::join(&cp, &tpm);
    // systemd's socket activation, as bcd-helper.socket does it: the
    // socket exists first, the helper starts at the first connection with
    // it as descriptor 3 (LISTEN_PID, LISTEN_FDS).
    let mut activate = Command::new("systemd-socket-activate");
    activate
        .arg("-l")
        .arg(&m.socket)
        .arg(bin("bcd"))
        .args(["helper", "--config"])
        .arg(&m.agent.config)
        .env("TSS2_LOG", "all+none");
    let mut helper = Logged::spawn(activate);
    helper.wait_for("Listening on", 1);
    // SocketMode=0660, SocketGroup= the node's group.
    std::os::unix::fs::chown(&m.socket, Some(0), Some(NODE_GID)).unwrap();
    std::fs::set_permissions(&m.socket, std::fs::Permissions::from_mode(0o660)).unwrap();

    let out = m.node(&["--once", "--renew-now"]);
    assert_ok(&out);
    assert!(stderr(&out).contains("certified=true"), "{}", stderr(&out));
    helper.wait_for("bcd helper serving", 1);
    assert!(
        helper
            .seen
            .iter()
            .any(|l| l.contains("socket=(from systemd)")),
        "{:#?}",
        helper.seen
    );
}

/// `bcd`, copied once into a directory every user may enter: the build's own
/// may sit under a 0700 directory (a `mktemp -d` clone), which the node's
/// user cannot reach.
///
/// The copy is written by `install(1)`, not by this process: a descriptor
/// open for writing here would be inherited by whatever another test
/// thread forks meanwhile, and exec'ing the copy then fails with "Text file
/// busy" (ETXTBSY) until that child execs in turn.
fn bcd_for_any_user() -> &'static std::path::Path {
    static COPY: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("bcd-e2e-bin-{}", std::process::id()));
        let copy = dir.join("bcd");
        assert_ok(
            &Command::new("install")
                .args(["-D", "-m", "0755"])
                .arg(bin("bcd"))
                .arg(&copy)
                .within(),
        );
        // install -D makes the directory with the umask's mode.
        assert_ok(&Command::new("chmod").arg("0755").arg(&dir).within());
        copy
    })
}

/// The node's user holding many idle connections (more than the helper's
/// limit) does not lock root out: root's `bcd status` still loads the TPM
/// node key through the helper, and the node user's `bcd doctor` says the
/// helper has too many connections (not that it does not serve the uid).
#[test]
fn the_node_user_holding_every_connection_does_not_lock_root_out() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let m = Machine::join(&cp, &tpm);
    let mut helper = Logged::helper(&m);
    // 40 connections as the node's uid, held open and idle.
    let mut holder = Command::new("perl");
    holder
        .args([
            "-MIO::Socket::UNIX",
            "-e",
            "$| = 1; my @s; for (1..40) { push @s, IO::Socket::UNIX->new(Peer => $ARGV[0]) or die \"connect: $!\\n\" } print STDERR \"held 40\\n\"; sleep 600",
        ])
        .arg(&m.socket)
        .uid(NODE_UID)
        .gid(NODE_GID);
    let mut holder = Logged::spawn(holder);
    holder.wait_for("held 40", 1);
    helper.wait_for("refused a connection: too many open", 1);
    assert!(
        helper
            .seen
            .iter()
            .any(|l| l.contains("too many open") && l.contains(&format!("uid={NODE_UID}"))),
        "{:#?}",
        helper.seen
    );

    let status = m.as_user(0, &["status", "--json"]).within();
    assert_ok(&status);
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["nodeKey"], "tpm", "{json}");

    let doctor = m.as_user(NODE_UID, &["doctor"]).within();
    let text = stdout(&doctor);
    assert!(
        text.contains("too many connections open to bcd helper"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("helper:"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        line.starts_with("fail  helper:") && line.contains("too many connections"),
        "{line}"
    );
    assert!(!line.contains("does not serve"), "{line}");
    holder.kill();
}

/// `bcd helper` refuses a socket directory another user could write to
/// (where the fresh socket could be swapped for a symlink before its
/// chown), names it, exits nonzero and binds nothing.
#[test]
fn the_helper_refuses_a_socket_directory_others_can_write() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let m = Machine::join(&cp, &tpm);
    let open = m.agent.root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let owned = m.agent.root.path().join("owned");
    std::fs::create_dir(&owned).unwrap();
    std::os::unix::fs::chown(&owned, Some(NODE_UID), Some(NODE_GID)).unwrap();
    std::fs::set_permissions(&owned, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = std::fs::read_to_string(&m.agent.config).unwrap();
    for (dir, why) in [
        (&open, "writable by others"),
        (&owned, "owned by uid 1, not root"),
    ] {
        let socket = dir.join("helper.sock");
        let moved = config.replace(
            &format!("socket = \"{}\"", m.socket.display()),
            &format!("socket = \"{}\"", socket.display()),
        );
        assert_ne!(moved, config);
        let file = m.agent.root.path().join("moved.toml");
        std::fs::write(&file, moved).unwrap();
        let mut helper = Command::new(bin("bcd"));
        helper
            .args(["helper", "--config"])
            .arg(&file)
            .env("TSS2_LOG", "all+none")
            .stdin(Stdio::null());
        // A helper that binds serves until killed: a failure, not a hang.
        let out = output_within(helper, Duration::from_secs(30));
        let err = stderr(&out);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains("refusing the socket directory")
                && err.contains(&dir.display().to_string())
                && err.contains(why),
            "{err}"
        );
        assert!(!socket.exists(), "nothing bound in {}", dir.display());
    }
}

/// swtpm behind a TCP proxy that can lose a command: what a TPM whose
/// response never comes (a timeout, a bus reset) does to a TSS context.
struct LossyTpm {
    port: u16,
    lose_next: Arc<AtomicBool>,
}

impl LossyTpm {
    fn start(tpm: &Swtpm) -> LossyTpm {
        // The swtpm TCTI wants the control port at port+1.
        let (commands, control) = loop {
            let a = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = a.local_addr().unwrap().port();
            if let Ok(b) = TcpListener::bind(("127.0.0.1", port + 1)) {
                break (a, b);
            }
        };
        let port = commands.local_addr().unwrap().port();
        let lose_next = Arc::new(AtomicBool::new(false));
        let lose = lose_next.clone();
        let (up, up_control) = (tpm.port, tpm.port + 1);
        std::thread::spawn(move || proxy(commands, up, Some(lose)));
        std::thread::spawn(move || proxy(control, up_control, None));
        LossyTpm { port, lose_next }
    }

    fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// The next command is read and never answered.
    fn lose_next_command(&self) {
        self.lose_next.store(true, Ordering::SeqCst);
    }
}

/// Forwards each connection to `upstream`, but one that `lose` marks.
fn proxy(listener: TcpListener, upstream: u16, lose: Option<Arc<AtomicBool>>) {
    for client in listener.incoming() {
        let Ok(mut client) = client else { return };
        if lose
            .as_ref()
            .is_some_and(|l| l.swap(false, Ordering::SeqCst))
        {
            let mut header = [0u8; 10];
            let _ = std::io::Read::read_exact(&mut client, &mut header);
            continue; // dropped: the TSS sees its connection close
        }
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
            continue;
        };
        let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let (mut client, mut server) = (client, server);
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut c2, &mut s2);
            let _ = s2.shutdown(std::net::Shutdown::Write);
        });
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut server, &mut client);
            let _ = client.shutdown(std::net::Shutdown::Write);
        });
    }
}

#[test]
fn the_helper_opens_a_new_tpm_connection_when_a_command_is_lost() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let m = Machine::join(&cp, &tpm);
    let lossy = LossyTpm::start(&tpm);
    let config = std::fs::read_to_string(&m.agent.config).unwrap();
    std::fs::write(&m.agent.config, config.replace(&tpm.tcti(), &lossy.tcti())).unwrap();
    let mut helper = Logged::helper(&m);
    assert_ok(&m.node(&["--once", "--renew-now"]));
    // ESYS is left waiting for the lost response: the old context fails
    // every later command too, so the helper takes a new one.
    lossy.lose_next_command();
    assert_ok(&m.node(&["--once", "--renew-now"]));
    helper.wait_for("opened a new TPM connection", 1);
    let broke = helper
        .seen
        .iter()
        .find(|l| l.contains("the TPM connection failed"))
        .cloned()
        .unwrap_or_default();
    // The code and its layer, not only tss-esapi's "not recognized".
    assert!(broke.contains("TSS2_RC 0x"), "{:#?}", helper.seen);
    assert!(!broke.contains("from the TPM)"), "{broke}");
    assert_ok(&m.node(&["--once", "--renew-now"]));
}

/// The node running unprivileged answers inventory.refresh and diag.doctor
/// over its command channel, its handshake, proof and results signed by its
/// TPM key through the helper; the control plane checks each result
/// against the certificate the channel was proven with.
#[test]
fn the_unprivileged_node_answers_commands_through_the_helper() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let m = Machine::join(&cp, &tpm);
    let _helper = Logged::helper(&m);
    let node_id = m.identity().node_id.clone();
    let mut node = Logged::spawn(m.as_user(NODE_UID, &["node"]));
    node.wait_for("command channel up", 1);
    for kind in ["inventory.refresh", "diag.doctor"] {
        let out = cp.cli(&[
            "commands",
            "send",
            "--node",
            &node_id,
            "--kind",
            kind,
            "--wait",
            "--timeout",
            "2m",
            "--json",
        ]);
        assert_ok(&out);
        let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(shown["state"], "ok", "{kind}: {shown}");
        assert_eq!(shown["signatureChecked"], true, "{kind}");
        assert!(shown["output"].is_object(), "{kind}: JSON output: {shown}");
    }
    let inv = cp.json(&["nodes", "inventory", &node_id]);
    // Read through the helper (root's files and the TPM), not as the node.
    assert_eq!(inv["inventory"]["tpm"]["source"], "helper", "{inv}");
    assert_eq!(
        inv["inventory"]["tpm"]["ekSha256"],
        m.agent.identify()["ekSha256"],
        "{inv}"
    );
}

/// One raw request frame to the helper at `socket` and its response (None
/// when the helper closed the connection instead).
fn raw_request(socket: &std::path::Path, body: &[u8]) -> Option<bc_helper::proto::Response> {
    use std::io::Read as _;
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix).ok()?;
    let mut response = vec![0u8; u32::from_be_bytes(prefix) as usize];
    s.read_exact(&mut response).unwrap();
    Some(prost::Message::decode(response.as_slice()).unwrap())
}

/// A `system.journal` request as raw protobuf: `since`, `lines`, `bytes`
/// and, after them, `extra` (fields the protocol does not have).
fn journal_request(lines: u32, bytes: u32, extra: &[u8]) -> Vec<u8> {
    let mut inner = prost::Message::encode_to_vec(&bc_helper::proto::JournalRequest {
        since_ms: 0,
        lines,
        bytes,
    });
    inner.extend_from_slice(extra);
    // Request.op = 6 (journal), length-delimited.
    let mut body = vec![(6 << 3) | 2];
    prost::encoding::encode_varint(inner.len() as u64, &mut body);
    body.extend(inner);
    body
}

/// `system.journal`: the real helper reads, as root, the system journal of
/// bcd's units for the unprivileged node, bounded by what the caller asks
/// (lines, bytes; a bound out of range closes the connection), and a
/// caller naming a unit of its own (a field the request does not have,
/// or an argument in its place) gets the very same answer: the units are
/// the helper's. Where this machine has no journal (a container), the
/// answer is "not available" and the node's logs.collect says so; where it
/// has one, the lines are within the bounds. The test says which ran.
#[test]
fn the_helper_reads_the_system_journal_of_bcd_units_only_and_bounded() {
    use bc_helper::journal::{Query, UNITS};
    use bc_helper::proto::response::Result as R;
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let m = Machine::join(&cp, &tpm);
    let _helper = Logged::helper(&m);

    let client = bc_helper::Client::new(&m.socket);
    let query = Query::checked(0, 3, 400).unwrap();
    let plain = client.journal(&query);
    let available = match &plain {
        Ok(text) => {
            assert!(text.len() <= 400 && text.lines().count() <= 3, "{text}");
            eprintln!(
                "system journal path: available ({} lines)",
                text.lines().count()
            );
            true
        }
        Err(bc_helper::ClientError::Helper(why)) => {
            eprintln!("system journal path: not available ({why})");
            assert!(
                why == "no journal files on this machine"
                    || why == "journalctl is not installed"
                    || why.starts_with("journalctl failed"),
                "{why}"
            );
            false
        }
        Err(e) => panic!("system.journal: {e}"),
    };
    // Units named by the caller: unknown fields (4: a string, 15: a
    // `--unit=` argument) are dropped by the decoder; what the helper runs
    // is the same fixed argv, so the answer is the same kind.
    let mut extra = Vec::new();
    for (tag, text) in [(4u32, "ssh.service"), (15, "--unit=ssh.service")] {
        prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, &mut extra);
        prost::encoding::encode_varint(text.len() as u64, &mut extra);
        extra.extend_from_slice(text.as_bytes());
    }
    let named = raw_request(&m.socket, &journal_request(3, 400, &extra)).expect("an answer");
    match (&plain, named.result) {
        (Ok(_), Some(R::Journal(j))) => {
            assert!(bc_helper::journal::within(&j.text, &query), "{}", j.text);
            assert!(!j.text.contains("ssh"), "{}", j.text);
        }
        (Err(bc_helper::ClientError::Helper(why)), Some(R::Error(e))) => {
            assert_eq!(&e.message, why)
        }
        (_, other) => panic!("a request naming a unit was answered otherwise: {other:?}"),
    }
    // Out of bounds: refused unread, the connection closed.
    for (lines, bytes) in [(0, 400), (100_001, 400), (3, 0), (3, (1 << 20) + 1)] {
        assert!(
            raw_request(&m.socket, &journal_request(lines, bytes, &[])).is_none(),
            "lines {lines}, bytes {bytes} answered"
        );
    }
    assert_eq!(UNITS.len(), 4);
    assert!(UNITS.iter().all(|u| u.starts_with("bcd-")));

    // The unprivileged node's logs.collect goes through the helper.
    let node_id = m.identity().node_id.clone();
    let mut node = Logged::spawn(m.as_user(NODE_UID, &["node"]));
    node.wait_for("command channel up", 1);
    let out = cp.cli(&[
        "commands",
        "send",
        "--node",
        &node_id,
        "--kind",
        "logs.collect",
        "--arg",
        "lines=5",
        "--arg",
        "bytes=2000",
        "--wait",
        "--timeout",
        "2m",
        "--json",
    ]);
    assert_ok(&out);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["state"], "ok", "{shown}");
    let outcome = shown["outcome"].as_str().unwrap_or_default();
    if available {
        assert!(
            outcome.contains("system journal: ") && outcome.ends_with(" lines"),
            "{outcome}"
        );
    } else {
        assert!(
            outcome.contains("system journal: not available (bcd helper: "),
            "{outcome}"
        );
    }
}
