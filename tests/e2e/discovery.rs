//! Discovery: a site node holds its site's boot lease and vouches for a
//! machine it served; `bcd ramdisk` joins with that assertion and the boot
//! entry's discovery token from its kernel command line. The site side is
//! driven here through bcd's own site client and node key (what `bcd site`
//! uses); every refusal reason of the attestor, the lease and the
//! SecretRequest is checked at the control plane's event log.

use std::time::{SystemTime, UNIX_EPOCH};

use bc_wire::signing::{self, Purpose};
use bc_wire::site;
use bc_wire::site_v1::{DiscoveryAssertion, LeaseResponse, SecretRequestBody};
use bcd::client::{Client, ClientError};
use bcd::identity::Identity;
use bcd::keys::TpmAccess;

use crate::harness::*;

pub(crate) const MAC: &str = "52:54:00:12:34:56";
pub(crate) const UUID: &str = "4c4c4544-0042-3510-8052-b4c04f4e4d32";

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// A site node: a bcd that joined with a site token of `site_id`.
pub(crate) struct SiteNode {
    pub agent: Agent,
    pub site_id: String,
}

impl SiteNode {
    pub(crate) fn join(cp: &ControlPlane, site_id: &str) -> SiteNode {
        let agent = Agent::new(cp);
        let token = cp.token("site", &["--site", site_id]);
        assert_ok(&output_within(
            agent.token_join(&token, &["--role", "site"]),
            DEADLINE,
        ));
        SiteNode {
            agent,
            site_id: site_id.to_owned(),
        }
    }

    pub(crate) fn identity(&self) -> Identity {
        Identity::load(&self.agent.data_dir, &TpmAccess::none())
            .expect("identity loads")
            .expect("an identity")
    }

    pub(crate) fn client(&self) -> Client {
        let config = bcd::config::Config::load(&self.agent.config).expect("config");
        let id = self.identity();
        Client::with_identity(&config, &id.chain, id.key.clone()).expect("client")
    }

    pub(crate) fn acquire(&self) -> Result<LeaseResponse, ClientError> {
        block_on(self.client().acquire_lease(&self.site_id))
    }

    /// The holder's SecretRequest for a workflow: the discovery token.
    pub(crate) fn secret(&self, workflow: &str) -> Result<String, ClientError> {
        self.secret_for(workflow, "")
    }

    /// A SecretRequest naming `workflow` and `mac` (either may be empty).
    fn secret_for(&self, workflow: &str, mac: &str) -> Result<String, ClientError> {
        let id = self.identity();
        let body = SecretRequestBody {
            node_id: id.node_id.clone(),
            site_id: self.site_id.clone(),
            workflow_id: workflow.to_owned(),
            issued_at_unix_ms: now_ms(),
            mac: mac.to_owned(),
        };
        let req = site::sign_secret_request(&body, |m| id.key.sign(m)).expect("sign");
        block_on(self.client().get_secret(&req)).map(|r| r.token)
    }

    /// The kernel command line the site gives `mac` for entry `wf`: a
    /// token of the entry's own and an assertion naming the entry, the MAC
    /// and `uuid`.
    pub(crate) fn boot_line(&self, epoch: u64, wf: &str, mac: &str, uuid: &str) -> String {
        let token = self.secret(wf).unwrap();
        let assertion = self.assertion(epoch, |a| {
            a.mac = mac.to_owned();
            a.workflow_id = wf.to_owned();
            a.product_uuid = uuid.to_owned();
        });
        cmdline(&token, &assertion)
    }

    /// An assertion for `mac` at `epoch`, fresh, signed under its purpose.
    pub(crate) fn assertion(
        &self,
        epoch: u64,
        edit: impl FnOnce(&mut DiscoveryAssertion),
    ) -> String {
        let id = self.identity();
        let mut a = DiscoveryAssertion {
            site_id: self.site_id.clone(),
            node_id: id.node_id.clone(),
            lease_epoch: epoch,
            mac: MAC.to_owned(),
            ip: "10.0.2.15".to_owned(),
            product_uuid: String::new(),
            workflow_id: String::new(),
            issued_at_unix_ms: now_ms(),
            not_after_unix_ms: now_ms() + 10 * 60_000,
        };
        edit(&mut a);
        let signed = site::sign_assertion(&a, id.key.kid(), |m| id.key.sign(m)).expect("sign");
        site::to_cmdline(&signed)
    }
}

/// A bare machine booted into the ramdisk: its own config, data dir and
/// sysfs (MACs, product UUID).
pub(crate) struct Machine {
    pub agent: Agent,
    sysfs: std::path::PathBuf,
}

impl Machine {
    pub(crate) fn new(cp: &ControlPlane, mac: &str, uuid: &str) -> Machine {
        let agent = Agent::new(cp);
        agent.sysfs("class/net/eth0/address", &format!("{mac}\n"));
        agent.sysfs("class/net/lo/address", "00:00:00:00:00:00\n");
        agent.sysfs("class/dmi/id/product_uuid", &format!("{uuid}\n"));
        let sysfs = agent.sysfs_root();
        Machine { agent, sysfs }
    }

    pub(crate) fn boot(&self, cmdline: &str) -> std::process::Output {
        self.boot_command(cmdline).within()
    }

    /// `bcd ramdisk --once` booted with `cmdline`, not started yet (for a
    /// join that waits, run beside the test).
    pub(crate) fn boot_command(&self, cmdline: &str) -> std::process::Command {
        let file = self.agent.root.path().join("cmdline");
        std::fs::write(&file, format!("console=ttyS0 {cmdline} ip=dhcp\n")).unwrap();
        let mut cmd =
            self.agent
                .command(&["ramdisk", "--once", "--cmdline", &file.to_string_lossy()]);
        cmd.env("BCD_SYSFS_ROOT", &self.sysfs);
        cmd
    }
}

pub(crate) fn site(cp: &ControlPlane, name: &str) -> String {
    let out = cp.cli(&["sites", "create", name]);
    assert_ok(&out);
    stdout(&out).trim().to_owned()
}

pub(crate) fn boot_add(cp: &ControlPlane, site: &str, mac: &str, extra: &[&str]) -> String {
    let mut args = vec!["boot", "add", "--site", site, "--mac", mac];
    args.extend_from_slice(extra);
    let out = cp.cli(&args);
    assert_ok(&out);
    stdout(&out).trim().to_owned()
}

pub(crate) fn boot_state(cp: &ControlPlane, workflow: &str) -> String {
    let list = cp.json(&["boot", "list"]);
    list.as_array()
        .unwrap()
        .iter()
        .find(|e| e["workflowId"] == workflow)
        .map(|e| e["state"].as_str().unwrap().to_owned())
        .expect("the boot entry is listed")
}

pub(crate) fn cmdline(token: &str, assertion: &str) -> String {
    format!("bc.token={token} bc.assertion={assertion}")
}

/// Runs a join that must be refused: ACCESS_DENIED at bcd and exactly one
/// more `reason` at the control plane.
#[track_caller]
pub(crate) fn assert_refused_as(
    cp: &ControlPlane,
    refusal: Refusal<'_>,
    run: impl FnOnce() -> std::process::Output,
    reason: &str,
) {
    let out = cp.refused_once(refusal, reason, run);
    assert_access_denied(&out);
}

/// Runs a site API call that must be refused: ACCESS_DENIED at bcd's
/// client and exactly one more `reason` at the control plane.
#[track_caller]
pub(crate) fn assert_site_refused<T: std::fmt::Debug>(
    cp: &ControlPlane,
    call: impl FnOnce() -> Result<T, ClientError>,
    reason: &str,
) {
    let r = cp.refused_once(Refusal::Site, reason, call);
    assert!(matches!(r, Err(ClientError::AccessDenied)), "{r:?}");
}

#[test]
fn a_ramdisk_joins_once_with_its_site_nodes_assertion() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let lease = holder.acquire().unwrap();
    assert!(lease.held);
    assert_eq!(lease.name, format!("site:{site_id}:boot"));
    let wf = boot_add(&cp, "dc1", "52:54:00:12:34:56", &["--product-uuid", UUID]);
    assert_eq!(boot_state(&cp, &wf), "waiting");
    let token = holder.secret(&wf).unwrap();
    assert_eq!(boot_state(&cp, &wf), "vouched");
    let assertion = holder.assertion(lease.epoch, |a| {
        a.workflow_id = wf.clone();
        a.product_uuid = UUID.to_owned();
    });

    let machine = Machine::new(&cp, MAC, UUID);
    let out = machine.boot(&cmdline(&token, &assertion));
    assert_ok(&out);
    let id = Identity::load(&machine.agent.data_dir, &TpmAccess::none())
        .unwrap()
        .unwrap();
    assert!(stdout(&out).contains(&format!("joined as {}", id.node_id)));
    assert_eq!(machine.agent.status_json()["role"], "ramdisk");
    let lifetime = id.cert.not_after - id.cert.not_before;
    assert!(lifetime <= time::Duration::hours(2), "{lifetime}");
    let node = cp
        .nodes()
        .into_iter()
        .find(|n| n["nodeId"] == id.node_id.as_str())
        .unwrap();
    assert_eq!(node["role"], "ramdisk");
    assert_eq!(node["attestor"], "discovery");
    assert_eq!(node["site"], site_id.as_str());
    assert_eq!(
        node["allowedKinds"],
        serde_json::json!([
            "inventory.refresh",
            "logs.collect",
            "diag.*",
            "disk.wipe",
            "deploy.*",
            "boot.kexec"
        ])
    );
    assert_eq!(boot_state(&cp, &wf), "joined");
    // Its renewals stay as short as its first certificate.
    assert_ok(&machine.agent.run(&["node", "--once", "--renew-now"]));
    let renewed = Identity::load(&machine.agent.data_dir, &TpmAccess::none())
        .unwrap()
        .unwrap();
    assert_ne!(renewed.chain[0], id.chain[0], "renewed");
    assert!(renewed.cert.not_after - renewed.cert.not_before <= time::Duration::hours(2));
    // A spent entry's token is no longer handed out.
    assert_site_refused(&cp, || holder.secret(&wf), "workflow-closed");

    // The same command line again (a replayed boot): the assertion admitted
    // its one join.
    let replay = Machine::new(&cp, MAC, UUID);
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || replay.boot(&cmdline(&token, &assertion)),
        "assertion-reused",
    );
    replay.agent.assert_nothing_written();
    // A fresh assertion with the spent token: the token admitted its one join.
    let fresh = holder.assertion(lease.epoch, |_| {});
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || replay.boot(&cmdline(&token, &fresh)),
        "token-exhausted",
    );
    // A new boot entry for the same MAC gets a new token: it joins.
    let wf2 = boot_add(&cp, "dc1", MAC, &[]);
    let token2 = holder.secret(&wf2).unwrap();
    assert_ok(&replay.boot(&cmdline(&token2, &fresh)));
    assert_eq!(boot_state(&cp, &wf2), "joined");
}

#[test]
fn malformed_command_lines_send_nothing() {
    let cp = ControlPlane::start();
    let machine = Machine::new(&cp, MAC, UUID);
    for (line, says) in [
        ("quiet", "no bc.token="),
        (
            "bc.token=tok_x.AAAA bc.assertion=AAAA",
            "not a discovery token",
        ),
        (
            "bc.token=tok_abc.AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8 bc.assertion=%%%",
            "not unpadded base64url",
        ),
    ] {
        let out = machine.boot(line);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(stderr(&out).contains(says), "{}", stderr(&out));
        assert!(
            !stderr(&out).contains("AAECAwQF"),
            "the token is never quoted"
        );
    }
    machine.agent.assert_nothing_written();
    assert!(cp.refusal_reasons().is_empty(), "nothing was sent");
}

/// One signed assertion admits one join, whatever is done to what its
/// signature does not cover: after it admitted its machine, the same
/// assertion under another `key_id` (which bcd ramdisk sends as it is) is
/// refused `assertion-reused` even with a fresh token of a new entry; with
/// an unknown field appended to its envelope, or as the high-S twin of its
/// signature (both sent raw: bcd ramdisk refuses them on its command line),
/// it is `assertion-malformed`. ACCESS_DENIED at the agent each time.
#[test]
fn a_used_assertion_rewrapped_admits_nothing() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let wf = boot_add(&cp, "dc1", MAC, &[]);
    let token = holder.secret(&wf).unwrap();
    let assertion = holder.assertion(epoch, |a| a.workflow_id = wf.clone());
    assert_ok(&Machine::new(&cp, MAC, UUID).boot(&cmdline(&token, &assertion)));

    let (signed, _) = site::parse_signed(&site::from_cmdline(&assertion).unwrap()).unwrap();
    let rewrapped = bc_wire::site_v1::SignedDiscoveryAssertion {
        key_id: "0".repeat(64),
        ..signed.clone()
    };
    let wf2 = boot_add(&cp, "dc1", MAC, &[]);
    let token2 = holder.secret(&wf2).unwrap();
    let thief = Machine::new(&cp, MAC, UUID);
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || thief.boot(&cmdline(&token2, &site::to_cmdline(&rewrapped))),
        "assertion-reused",
    );
    thief.agent.assert_nothing_written();
    assert_eq!(boot_state(&cp, &wf2), "vouched", "the new entry stays open");

    let mut extra = prost::Message::encode_to_vec(&signed);
    extra.extend_from_slice(&[0x78, 0x01]);
    let s = p256::ecdsa::Signature::from_slice(&signed.signature).unwrap();
    let twin = p256::ecdsa::Signature::from_scalars(s.r(), -s.s()).unwrap();
    let high = bc_wire::site_v1::SignedDiscoveryAssertion {
        signature: twin.to_bytes().to_vec(),
        ..signed.clone()
    };
    let config = bcd::config::Config::load(&thief.agent.config).unwrap();
    let csr = throwaway_csr();
    for attestation in [extra, prost::Message::encode_to_vec(&high)] {
        let req = bc_wire::agent::JoinRequest {
            csr: csr.clone(),
            role: bc_wire::agent::Role::Ramdisk as i32,
            attestor: "discovery".into(),
            attestation,
            ..Default::default()
        };
        let answer = cp.refused_once(Refusal::Join("discovery"), "assertion-malformed", || {
            block_on(Client::new(&config).unwrap().join(&req))
        });
        assert!(
            matches!(answer, Err(ClientError::AccessDenied)),
            "{:?}",
            answer.err()
        );
    }
    assert_eq!(boot_state(&cp, &wf2), "vouched");
}

/// Evidence that bcd ramdisk would never send (it parses its command line
/// first), sent raw over HTTPS: `assertion-malformed`, before any token is
/// looked at.
#[test]
fn a_malformed_assertion_is_refused_by_name() {
    let cp = ControlPlane::start();
    let machine = Machine::new(&cp, MAC, UUID);
    let config = bcd::config::Config::load(&machine.agent.config).unwrap();
    let csr = throwaway_csr();
    // Not protobuf; a SignedDiscoveryAssertion with no body; one whose body
    // is not a DiscoveryAssertion.
    let empty = bc_wire::site_v1::SignedDiscoveryAssertion::default();
    let not_a_body = bc_wire::site_v1::SignedDiscoveryAssertion {
        assertion: vec![0xff; 7],
        ..Default::default()
    };
    for attestation in [
        vec![0xff, 0xff, 0xff],
        prost::Message::encode_to_vec(&empty),
        prost::Message::encode_to_vec(&not_a_body),
    ] {
        let req = bc_wire::agent::JoinRequest {
            csr: csr.clone(),
            role: bc_wire::agent::Role::Ramdisk as i32,
            attestor: "discovery".into(),
            attestation,
            ..Default::default()
        };
        let answer = cp.refused_once(Refusal::Join("discovery"), "assertion-malformed", || {
            block_on(Client::new(&config).unwrap().join(&req))
        });
        assert!(
            matches!(answer, Err(ClientError::AccessDenied)),
            "{:?}",
            answer.err()
        );
    }
    assert_eq!(cp.refusal_reasons().len(), 3);
}

/// Every refusal of the attestor, of the lease and of the SecretRequest,
/// each naming its reason in the control plane's events.
#[test]
fn every_discovery_refusal_names_its_reason() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let other_site = site(&cp, "dc2");
    let a = SiteNode::join(&cp, &site_id);
    let b = SiteNode::join(&cp, &site_id);
    let epoch = a.acquire().unwrap().epoch;
    // b stands by.
    let standby = b.acquire().unwrap();
    assert!(!standby.held);
    assert_eq!(standby.holder_node_id, a.identity().node_id);
    // SecretRequest by a site node that does not hold the lease.
    let wf = boot_add(&cp, "dc1", MAC, &[]);
    assert_site_refused(&cp, || b.secret(&wf), "not-lease-holder");
    // A site node of another site cannot even ask.
    let c = SiteNode::join(&cp, &other_site);
    assert_site_refused(
        &cp,
        || block_on(c.client().acquire_lease(&site_id)),
        "not-site-node",
    );

    let machine = Machine::new(&cp, MAC, UUID);
    let token = |cp: &ControlPlane| a.secret(&boot_add(cp, "dc1", MAC, &[])).unwrap();
    let good = |edit: &dyn Fn(&mut DiscoveryAssertion)| a.assertion(epoch, |x| edit(x));
    let t = token(&cp);

    // The signer: not the holder; wrong epoch.
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&t, &b.assertion(epoch, |_| {}))),
        "lease-not-held",
    );
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&t, &a.assertion(epoch + 1, |_| {}))),
        "lease-epoch",
    );
    // A signature by another key, and the node key's under another purpose.
    let id = a.identity();
    let other_key = b.identity().key;
    let forged = |purpose: Option<Purpose>| {
        let aa = DiscoveryAssertion {
            site_id: site_id.clone(),
            node_id: id.node_id.clone(),
            lease_epoch: epoch,
            mac: MAC.to_owned(),
            issued_at_unix_ms: now_ms(),
            not_after_unix_ms: now_ms() + 60_000,
            ..Default::default()
        };
        let signed = site::sign_assertion(&aa, id.key.kid(), |m| match purpose {
            None => other_key.sign(m),
            Some(p) => {
                let bytes = &m[m.len() - prost::Message::encoded_len(&aa)..];
                id.key.sign(&signing::signing_input(p, &[bytes]))
            }
        })
        .unwrap();
        site::to_cmdline(&signed)
    };
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&t, &forged(None))),
        "assertion-signature",
    );
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&t, &forged(Some(Purpose::SecretRequest)))),
        "assertion-signature",
    );
    // Freshness: 16 minutes old, or past its not_after.
    let stale = good(&|x| {
        x.issued_at_unix_ms = now_ms() - 16 * 60_000;
        x.not_after_unix_ms = now_ms() + 60_000;
    });
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&t, &stale)),
        "assertion-stale",
    );
    let past = good(&|x| x.not_after_unix_ms = now_ms() - 1);
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&t, &past)),
        "assertion-stale",
    );
    let ahead = good(&|x| {
        x.issued_at_unix_ms = now_ms() + 5 * 60_000;
        x.not_after_unix_ms = now_ms() + 10 * 60_000;
    });
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&t, &ahead)),
        "assertion-future",
    );
    let nobody = good(&|x| x.node_id = "node_nobody".into());
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&t, &nobody)),
        "signer-unknown",
    );
    // The machine: the asserted MAC is not among its own; another product UUID.
    let elsewhere = Machine::new(&cp, "52:54:00:aa:bb:cc", UUID);
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || elsewhere.boot(&cmdline(&t, &good(&|_| {}))),
        "mac-not-claimed",
    );
    let other_uuid = good(&|x| x.product_uuid = "00000000-0000-0000-0000-000000000001".into());
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&t, &other_uuid)),
        "product-uuid-mismatch",
    );
    // The token: of another role, of another site, for another MAC.
    let node_token = cp.token("node", &[]);
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&node_token, &good(&|_| {}))),
        "token-role",
    );
    let elsewhere_wf = boot_add(&cp, "dc2", MAC, &[]);
    let c_epoch = c.acquire().unwrap().epoch;
    let c_token = c.secret(&elsewhere_wf).unwrap();
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&c_token, &good(&|_| {}))),
        "token-site",
    );
    let _ = c_epoch;
    // A site node of another site vouching for this one.
    let c_for_dc1 = c.assertion(c_epoch, |x| x.site_id = site_id.clone());
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&t, &c_for_dc1)),
        "signer-not-site",
    );
    let other_mac_token = a
        .secret(&boot_add(&cp, "dc1", "52:54:00:aa:bb:cc", &[]))
        .unwrap();
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&other_mac_token, &good(&|_| {}))),
        "token-mac",
    );
    // Nothing above spent the token: it still joins.
    machine.agent.assert_nothing_written();
    assert_ok(&machine.boot(&cmdline(&t, &good(&|_| {}))));

    // a stops renewing: 31 s later b takes over with a higher epoch, and a
    // is fenced: its renewal is refused, its assertions too (not the
    // holder), and b's under the old epoch are refused (wrong epoch).
    assert_ok(&cp.cli(&["clock", "set", "--offset", "31s"]));
    let taken = b.acquire().unwrap();
    assert!(taken.held);
    assert_eq!(taken.epoch, epoch + 1);
    assert_site_refused(
        &cp,
        || block_on(a.client().renew_lease(&site_id, epoch)),
        "lease-lost",
    );
    let soon = |x: &mut DiscoveryAssertion| {
        x.issued_at_unix_ms = now_ms() + 31_000;
        x.not_after_unix_ms = now_ms() + 600_000;
    };
    let m2 = Machine::new(&cp, MAC, UUID);
    let t2 = b.secret(&boot_add(&cp, "dc1", MAC, &[])).unwrap();
    assert_site_refused(
        &cp,
        || a.secret(&boot_add(&cp, "dc1", MAC, &[])),
        "not-lease-holder",
    );
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || m2.boot(&cmdline(&t2, &a.assertion(epoch, soon))),
        "lease-not-held",
    );
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || m2.boot(&cmdline(&t2, &b.assertion(epoch, soon))),
        "lease-epoch",
    );
    // A retired signer vouches for nobody, lease or not.
    let b_id = b.identity().node_id;
    assert_ok(&cp.cli(&["nodes", "retire", &b_id]));
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || m2.boot(&cmdline(&t2, &b.assertion(taken.epoch, soon))),
        "signer-retired",
    );
    m2.agent.assert_nothing_written();
}

/// The signer's certificate expired while it still held the lease (a lease
/// TTL longer than a certificate): its assertions no longer verify.
#[test]
fn an_expired_signer_certificate_vouches_for_nobody() {
    let cp = ControlPlane::start_with_config("[discovery]\nlease_ttl = \"2d\"\n");
    let site_id = site(&cp, "dc1");
    let a = SiteNode::join(&cp, &site_id);
    let epoch = a.acquire().unwrap().epoch;
    let t = a
        .secret(&boot_add(&cp, "dc1", MAC, &["--not-after", "3d"]))
        .unwrap();
    assert_ok(&cp.cli(&["clock", "set", "--offset", "25h"]));
    let later = a.assertion(epoch, |x| {
        x.issued_at_unix_ms = now_ms() + 25 * 3_600_000;
        x.not_after_unix_ms = x.issued_at_unix_ms + 600_000;
    });
    let machine = Machine::new(&cp, MAC, UUID);
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&t, &later)),
        "signer-certificate",
    );
}

/// What bcd never sends but a caller could: a discovery token minted for
/// two machines (tokens of the CLI are single-use, so it is written to the
/// database directly), and a discovery join for another role (sent to the
/// control plane's JoinService in process, on the same directory).
#[test]
fn only_single_use_tokens_and_ramdisks_are_admitted() {
    use bc_controlplane::machine::Expect;
    use bc_controlplane::tokens::{insert_token, TokenScope};
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let a = SiteNode::join(&cp, &site_id);
    let epoch = a.acquire().unwrap().epoch;
    // The database `controlplane.toml` names (PostgreSQL under BCD_TEST_DB).
    let config = bc_controlplane::config::load(cp.path()).unwrap();
    let db = bc_controlplane::store::Store::open_configured(cp.path(), config.database.as_ref())
        .unwrap();
    let (two, _) = db
        .write(|tx| {
            let scope = TokenScope {
                pool: None,
                expect: Expect {
                    mac: Some(MAC.to_owned()),
                    product_uuid: None,
                },
                site: Some(&site_id),
                ..TokenScope::default()
            };
            insert_token(tx, "discovery", 2, 600_000, &scope)
        })
        .unwrap();
    let machine = Machine::new(&cp, MAC, UUID);
    let assertion = a.assertion(epoch, |_| {});
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&two.expose(), &assertion)),
        "token-not-single-use",
    );

    let cp_state = bc_controlplane::ControlPlane::open(cp.path()).unwrap();
    let svc = bc_controlplane::JoinService::new(&cp_state);
    let csr = throwaway_csr();
    let req = bc_wire::agent::JoinRequest {
        csr,
        role: bc_wire::agent::Role::Node as i32,
        attestor: "discovery".into(),
        attestation: site::from_cmdline(&assertion).unwrap(),
        ..Default::default()
    };
    cp.refused_once(Refusal::Join("discovery"), "discovery-role", || {
        assert!(matches!(
            svc.join(req),
            Err(bc_controlplane::ApiError::AccessDenied)
        ));
        svc.flush_events();
    });
}

/// The spec's "a SecretRequest bound to the workflow": the request names
/// its boot entry, never "the newest entry for this MAC"; each answer is a
/// new single-use token of that entry, and the join one of them admits
/// spends the entry and revokes the others.
#[test]
fn secret_requests_name_their_workflow_and_each_gets_its_own_token() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let wf = boot_add(&cp, "dc1", MAC, &["--product-uuid", UUID]);
    // What bcd site answers iPXE from: the open entries, to the holder only.
    let listed = block_on(holder.client().list_boot_entries(&site_id)).unwrap();
    assert_eq!(listed.entries.len(), 1);
    let e = &listed.entries[0];
    assert_eq!((e.workflow_id.as_str(), e.mac.as_str()), (wf.as_str(), MAC));
    assert_eq!(e.product_uuid, UUID);
    let standby = SiteNode::join(&cp, &site_id);
    assert_site_refused(
        &cp,
        || block_on(standby.client().list_boot_entries(&site_id)),
        "not-lease-holder",
    );
    // No workflow (only the MAC), or a MAC that is not the workflow's.
    assert_site_refused(&cp, || holder.secret_for("", MAC), "unknown-workflow");
    assert_site_refused(
        &cp,
        || holder.secret_for(&wf, "52:54:00:aa:bb:cc"),
        "workflow-mac",
    );
    assert_eq!(boot_state(&cp, &wf), "waiting");

    // Two boot scripts, two tokens, each bound to the entry's MAC and UUID.
    let first = holder.secret_for(&wf, MAC).unwrap();
    let second = holder.secret_for(&wf, MAC).unwrap();
    assert_ne!(first, second);
    let tokens = cp.json(&["token", "list"]);
    let of = |t: &str| {
        let id = t.split_once('.').unwrap().0;
        tokens
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap()
    };
    for t in [&first, &second] {
        let row = of(t);
        assert_eq!(row["usesLeft"], 1, "{row}");
        assert_eq!(row["expectProductUuid"], UUID, "{row}");
        assert_eq!(row["expectMac"], MAC, "{row}");
    }
    let assertion = |wf: &str| {
        holder.assertion(epoch, |a| {
            a.workflow_id = wf.to_owned();
            a.product_uuid = UUID.to_owned();
        })
    };
    // A machine claiming another UUID is refused by the token's binding
    // too (the assertion names none here), and nothing is spent.
    let impostor = Machine::new(&cp, MAC, "4c4c4544-0000-0000-0000-000000000001");
    let unnamed = holder.assertion(epoch, |a| a.workflow_id = wf.clone());
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || impostor.boot(&cmdline(&first, &unnamed)),
        "join:expect-product-uuid",
    );
    assert_eq!(boot_state(&cp, &wf), "vouched");

    // The second joins; the entry is spent and the first is revoked.
    let machine = Machine::new(&cp, MAC, UUID);
    assert_ok(&machine.boot(&cmdline(&second, &assertion(&wf))));
    assert_eq!(boot_state(&cp, &wf), "joined");
    let late = Machine::new(&cp, MAC, UUID);
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || late.boot(&cmdline(&first, &assertion(&wf))),
        "token-revoked",
    );
    assert_site_refused(&cp, || holder.secret_for(&wf, MAC), "workflow-closed");

    // A flood of requests for one entry is capped (32 unspent tokens).
    let wf2 = boot_add(&cp, "dc1", "52:54:00:aa:bb:cc", &[]);
    for _ in 0..32 {
        holder.secret(&wf2).unwrap();
    }
    assert_site_refused(&cp, || holder.secret(&wf2), "workflow-busy");
}

/// Site refusals are counted like join refusals: a flood of identical ones
/// is a few rows, whose counts add up.
#[test]
fn site_refusals_are_aggregated_per_minute() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let a = SiteNode::join(&cp, &site_id);
    let b = SiteNode::join(&cp, &site_id);
    a.acquire().unwrap();
    let wf = boot_add(&cp, "dc1", MAC, &[]);
    let before = cp.events().len();
    let client = b.client();
    let id = b.identity();
    block_on(async {
        for _ in 0..300 {
            let body = SecretRequestBody {
                node_id: id.node_id.clone(),
                site_id: site_id.clone(),
                workflow_id: wf.clone(),
                issued_at_unix_ms: now_ms(),
                mac: String::new(),
            };
            let req = site::sign_secret_request(&body, |m| id.key.sign(m)).unwrap();
            let r = client.get_secret(&req).await;
            assert!(matches!(r, Err(ClientError::AccessDenied)), "{r:?}");
        }
    });
    let events = cp.events();
    let added = &events[before..];
    // The first of a minute, then one aggregated row (twice if a minute
    // boundary passes).
    assert!(added.len() <= 4, "{} rows: {added:?}", added.len());
    let count: u64 = added
        .iter()
        .filter(|e| e["type"] == "security.site.refused" && e["reason"] == "not-lease-holder")
        .map(|e| e["data"]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(count, 300);
    assert_eq!(added[0]["data"]["call"], "get-secret");
    assert_eq!(added[0]["data"]["source"], "127.0.0.1");
}

/// Re-commissioning: the same machine PXE-boots into the ramdisk again
/// with a new boot entry (the same MAC and operator-bound UUID). Its first
/// ramdisk node is retired by the second join instead of blocking it, and
/// neither node's certificates outlive its entry.
#[test]
fn the_same_machine_commissions_twice() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let commission = |not_after: &str| {
        let wf = boot_add(
            &cp,
            "dc1",
            MAC,
            &["--product-uuid", UUID, "--not-after", not_after],
        );
        let machine = Machine::new(&cp, MAC, UUID);
        assert_ok(&machine.boot(&holder.boot_line(epoch, &wf, MAC, UUID)));
        let id = Identity::load(&machine.agent.data_dir, &TpmAccess::none())
            .unwrap()
            .unwrap();
        (wf, machine, id)
    };
    let (_, first_machine, first) = commission("30m");
    let lifetime = first.cert.not_after - first.cert.not_before;
    assert!(lifetime <= time::Duration::minutes(30), "{lifetime}");
    let node = |id: &str| cp.nodes().into_iter().find(|n| n["nodeId"] == id).unwrap();
    assert_eq!(
        node(&first.node_id)["hardwareKey"],
        format!("product-uuid:{UUID}")
    );
    // Renewing does not stretch it past the entry either.
    assert_ok(&first_machine.agent.run(&["node", "--once", "--renew-now"]));
    let renewed = Identity::load(&first_machine.agent.data_dir, &TpmAccess::none())
        .unwrap()
        .unwrap();
    assert_ne!(renewed.chain[0], first.chain[0]);
    assert!(renewed.cert.not_after <= first.cert.not_after);

    let (wf2, _, second) = commission("1h");
    assert_ne!(second.node_id, first.node_id);
    assert_eq!(boot_state(&cp, &wf2), "joined");
    assert_eq!(node(&first.node_id)["retired"], true);
    assert_eq!(node(&second.node_id)["retired"], false);
    // And a third time.
    let (_, _, third) = commission("1h");
    assert_eq!(node(&second.node_id)["retired"], true);
    assert_eq!(
        node(&third.node_id)["hardwareKey"],
        format!("product-uuid:{UUID}")
    );
    // The retired ramdisk renews no more.
    let out = cp.refused_once(Refusal::Renew, "retired", || {
        first_machine.agent.run(&["node", "--once", "--renew-now"])
    });
    assert_renew_refused(&out);
    let refused = cp
        .events()
        .into_iter()
        .rfind(|e| e["type"] == RENEW_REFUSED)
        .expect("a renewal refusal");
    assert_eq!(refused["nodeId"], first.node_id.as_str());
}

/// Thousands of boards ship the same firmware UUID: two machines bound to
/// it both commission, and neither holds it as a hardware key.
#[test]
fn two_machines_with_the_placeholder_uuid_both_commission() {
    const PLACEHOLDER: &str = "03000200-0400-0500-0006-000700080009";
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let mut ids = Vec::new();
    for mac in [MAC, "52:54:00:aa:bb:cc"] {
        let wf = boot_add(&cp, "dc1", mac, &["--product-uuid", PLACEHOLDER]);
        let machine = Machine::new(&cp, mac, PLACEHOLDER);
        assert_ok(&machine.boot(&holder.boot_line(epoch, &wf, mac, PLACEHOLDER)));
        ids.push(machine.agent.status_json()["nodeId"].clone());
    }
    for n in cp.nodes().iter().filter(|n| ids.contains(&n["nodeId"])) {
        assert_eq!(n["hardwareKey"], serde_json::Value::Null, "{n}");
        assert_eq!(n["retired"], false, "{n}");
    }
    assert_eq!(ids.len(), 2);
}

/// `[discovery] max_age` (the spec's maxAgeMs) replaces the fixed 15
/// minutes: an assertion whose not_after is later is stale once it passed.
/// The clock is moved a minute either side of the 5 minutes, never to the
/// edge: the offsets count from the real time the assertion was made, and
/// a loaded machine spends seconds between the steps.
#[test]
fn assertions_are_stale_after_the_configured_max_age() {
    let cp = ControlPlane::start_with_config("[discovery]\nmax_age = \"5m\"\nlease_ttl = \"1h\"\n");
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let wf = boot_add(&cp, "dc1", MAC, &[]);
    let token = holder.secret(&wf).unwrap();
    let assertion = holder.assertion(epoch, |a| {
        a.not_after_unix_ms = a.issued_at_unix_ms + 10 * 60_000;
    });
    let machine = Machine::new(&cp, MAC, UUID);
    // Within its not_after (10 min), past max_age: stale.
    assert_ok(&cp.cli(&["clock", "set", "--offset", "6m"]));
    assert_refused_as(
        &cp,
        Refusal::Join("discovery"),
        || machine.boot(&cmdline(&token, &assertion)),
        "assertion-stale",
    );
    assert_ok(&cp.cli(&["clock", "set", "--offset", "4m"]));
    assert_ok(&machine.boot(&cmdline(&token, &assertion)));
}

/// `[discovery] cert_ttl` shortens a ramdisk's certificate below the 2 h
/// default (the entry here lives longer, so the setting is what caps it),
/// and a renewal keeps to it.
#[test]
fn discovery_cert_ttl_shortens_the_ramdisk_certificate() {
    let cp = ControlPlane::start_with_config("[discovery]\ncert_ttl = \"10m\"\n");
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let wf = boot_add(
        &cp,
        "dc1",
        MAC,
        &["--product-uuid", UUID, "--not-after", "4h"],
    );
    let machine = Machine::new(&cp, MAC, UUID);
    assert_ok(&machine.boot(&holder.boot_line(epoch, &wf, MAC, UUID)));
    let id = Identity::load(&machine.agent.data_dir, &TpmAccess::none())
        .unwrap()
        .unwrap();
    let lifetime = id.cert.not_after - id.cert.not_before;
    assert!(
        lifetime <= time::Duration::minutes(10) && lifetime > time::Duration::minutes(9),
        "a 10 min certificate, got {lifetime}"
    );
    assert_ok(&machine.agent.run(&["node", "--once", "--renew-now"]));
    let renewed = Identity::load(&machine.agent.data_dir, &TpmAccess::none())
        .unwrap()
        .unwrap();
    assert_ne!(renewed.chain[0], id.chain[0]);
    let lifetime = renewed.cert.not_after - renewed.cert.not_before;
    assert!(
        lifetime <= time::Duration::minutes(10),
        "renewed: {lifetime}"
    );
}

/// Every check of the site API's caller and of a SecretRequest's signature,
/// through bcd's site client over mTLS: ACCESS_DENIED at the client, the
/// reason in a `security.site.refused` event, one each. The caller must
/// present a certificate (`no-client-certificate`) naming a node of this
/// trust domain (`certificate-identity`) that the control plane issued to
/// that node (`unknown-certificate`: a certificate the node CA's key signed
/// but that was never stored), current (`certificate-stale`: revoked by
/// `nodes revoke-identity`), of a node not retired (`node-retired`); a
/// SecretRequest is signed by the caller's key for the caller
/// (`secret-signature`) within a minute of database time (`secret-stale`).
#[test]
fn the_site_api_refuses_callers_and_secret_requests_by_name() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    assert!(holder.acquire().unwrap().held);
    let wf = boot_add(&cp, "dc1", MAC, &[]);
    let id = holder.identity();

    // No client certificate at all (bcd's client never calls so).
    let lease = bc_wire::site_v1::AcquireLeaseRequest {
        site_id: site_id.clone(),
    };
    let (status, message) = cp.refused_once(Refusal::Site, "no-client-certificate", || {
        cp.post_without_client_certificate(
            bc_wire::endpoints::ACQUIRE_LEASE,
            prost::Message::encode_to_vec(&lease),
        )
    });
    assert_eq!((status, message.as_str()), (403, "site request refused"));
    // Certificates the node CA signed that this control plane never issued.
    let elsewhere = holder
        .agent
        .client_with_forged_certificate(&cp, &format!("spiffe://other.test/node/{}", id.node_id));
    assert_site_refused(
        &cp,
        || block_on(elsewhere.acquire_lease(&site_id)),
        "certificate-identity",
    );
    let copy = holder
        .agent
        .client_with_forged_certificate(&cp, &format!("spiffe://bc.test/node/{}", id.node_id));
    assert_site_refused(
        &cp,
        || block_on(copy.acquire_lease(&site_id)),
        "unknown-certificate",
    );

    // SecretRequests: signed by another key, or for another node; stale.
    let request = |node_id: &str, issued_at: i64, key: &dyn bcd::keys::NodeKey| {
        let body = SecretRequestBody {
            node_id: node_id.to_owned(),
            site_id: site_id.clone(),
            workflow_id: wf.clone(),
            issued_at_unix_ms: issued_at,
            mac: String::new(),
        };
        site::sign_secret_request(&body, |m| key.sign(m)).unwrap()
    };
    let other_key = bcd::keys::FileKey::generate().unwrap();
    for req in [
        request(&id.node_id, now_ms(), &other_key),
        request("node_someone_else", now_ms(), id.key.as_ref()),
    ] {
        assert_site_refused(
            &cp,
            || block_on(holder.client().get_secret(&req)),
            "secret-signature",
        );
    }
    for issued_at in [now_ms() - 2 * 60_000, now_ms() + 2 * 60_000] {
        let req = request(&id.node_id, issued_at, id.key.as_ref());
        assert_site_refused(
            &cp,
            || block_on(holder.client().get_secret(&req)),
            "secret-stale",
        );
    }
    assert_eq!(boot_state(&cp, &wf), "waiting", "no token was issued");
    // The same node's good request still gets one.
    holder.secret(&wf).expect("a token");

    // Its certificate revoked: stale, whatever else it asks.
    assert_ok(&cp.cli(&["nodes", "revoke-identity", &id.node_id]));
    assert_site_refused(&cp, || holder.acquire(), "certificate-stale");
    assert_site_refused(&cp, || holder.secret(&wf), "certificate-stale");

    // A retired node: refused as one, before its certificate is looked at.
    let standby = SiteNode::join(&cp, &site_id);
    let standby_id = standby.identity().node_id;
    assert_ok(&cp.cli(&["nodes", "retire", &standby_id]));
    assert_site_refused(&cp, || standby.acquire(), "node-retired");

    let refused: Vec<_> = cp
        .events()
        .into_iter()
        .filter(|e| e["type"] == SITE_REFUSED)
        .collect();
    assert!(
        refused
            .iter()
            .filter(
                |e| e["reason"] != "no-client-certificate" && e["reason"] != "certificate-identity"
            )
            .all(|e| e["nodeId"].is_string()),
        "a refusal names the node its certificate names: {refused:?}"
    );
}
