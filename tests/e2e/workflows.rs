//! Workflows (docs/workflows.md): a commission through a site's discovery
//! join, its steps advanced by the control plane's poller; a restart that
//! carries on (waiting for the join, and with a command queued and not
//! answered); each step's failure with its reason (the entry's end, a
//! refused or expired inventory.refresh, a refused disk.wipe, a failed
//! deploy.image, the provisioned token's expiry); cancel; the refusals of
//! `workflows start deploy`; and the provisioned join re-keying a node
//! bound by its newest inventory (provisionedTargetResolver).

use serde_json::Value;

use crate::discovery::{site, Machine, SiteNode, MAC, UUID};
use crate::harness::*;

fn start_commission(cp: &ControlPlane, extra: &[&str]) -> String {
    let mut args = vec![
        "workflows",
        "start",
        "commission",
        "--site",
        "dc1",
        "--mac",
        MAC,
        "--product-uuid",
        UUID,
    ];
    args.extend_from_slice(extra);
    let out = cp.cli(&args);
    assert_ok(&out);
    let id = stdout(&out).trim().to_owned();
    assert!(id.starts_with("wf_"), "{id}");
    id
}

fn show(cp: &ControlPlane, id: &str) -> Value {
    cp.json(&["workflows", "show", id])
}

/// Waits until the workflow leaves `running`; returns it.
#[track_caller]
fn finished(cp: &ControlPlane, id: &str) -> Value {
    wait_for(|| Some(show(cp, id)).filter(|w| w["state"] != "running"))
}

fn step<'a>(w: &'a Value, name: &str) -> &'a Value {
    w["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("step {name} in {w}"))
}

/// The machine's ramdisk (`bcd ramdisk`, not --once: it holds the channel)
/// booted from the site's answer for workflow `wf`; its /dev and /proc are
/// the machine's fake ones when [`with_disk`] made them.
fn boot_ramdisk(holder: &SiteNode, epoch: u64, machine: &Machine, wf: &str) -> Logged {
    write_cmdline(holder, epoch, machine, wf);
    Logged::spawn(ramdisk_command(machine, &[]))
}

/// Writes the kernel command line the site gives the machine for `wf`.
fn write_cmdline(holder: &SiteNode, epoch: u64, machine: &Machine, wf: &str) {
    std::fs::write(
        machine.agent.root.path().join("cmdline"),
        format!(
            "console=ttyS0 {} ip=dhcp\n",
            holder.boot_line(epoch, wf, MAC, UUID)
        ),
    )
    .unwrap();
}

/// `bcd ramdisk [EXTRA]` booted with what [`write_cmdline`] wrote (a
/// restarted one keeps the identity it joined with).
fn ramdisk_command(machine: &Machine, extra: &[&str]) -> std::process::Command {
    let root = machine.agent.root.path();
    let file = root.join("cmdline").to_string_lossy().into_owned();
    let mut args = vec!["ramdisk", "--cmdline", file.as_str()];
    args.extend_from_slice(extra);
    let mut cmd = machine.agent.command(&args);
    cmd.env("BCD_SYSFS_ROOT", machine.agent.sysfs_root());
    if root.join("dev").is_dir() {
        cmd.env("BCD_DEV_ROOT", root.join("dev"))
            .env("BCD_PROC_ROOT", root.join("proc"))
            .env("BCD_FAILPOINT", "kexec-no-reboot");
    }
    cmd
}

/// A machine with a disk ([`with_disk`]) commissioned at site dc1: its
/// ramdisk stopped once the commission succeeded. The site's holder, its
/// lease epoch and the node.
fn commissioned(cp: &ControlPlane) -> (SiteNode, u64, String) {
    let site_id = site(cp, "dc1");
    let holder = SiteNode::join(cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let wf = start_commission(cp, &[]);
    let first = with_disk(cp);
    let mut ramdisk = boot_ramdisk(&holder, epoch, &first, &wf);
    let w = finished(cp, &wf);
    assert_eq!(w["state"], "succeeded", "{w}");
    ramdisk.stop();
    let node = w["node"].as_str().unwrap().to_owned();
    (holder, epoch, node)
}

/// Registers `image` as "debian" and a package in dist/, then starts a
/// deploy of `node`: its id, and `images add`'s answer.
fn start_deploy(
    cp: &ControlPlane,
    node: &str,
    dir: &std::path::Path,
    image: &[u8],
) -> (String, Value) {
    let file = dir.join("debian.img");
    std::fs::write(&file, image).unwrap();
    let added = cp.json(&["images", "add", "debian", &file.to_string_lossy()]);
    let pkg = dir.join("bcd_0.1.0+test_amd64.deb");
    std::fs::write(&pkg, b"not really a package").unwrap();
    assert_ok(&cp.cli(&["dist", "add", &pkg.to_string_lossy()]));
    let out = cp.cli(&[
        "workflows",
        "start",
        "deploy",
        "--node",
        node,
        "--image",
        "debian",
        "--api",
        &cp.url,
    ]);
    assert_ok(&out);
    (stdout(&out).trim().to_owned(), added)
}

/// `token list`'s row of token `id`.
fn token_row(cp: &ControlPlane, id: &str) -> Value {
    cp.json(&["token", "list"])
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("token {id} is listed"))
}

/// `boot list`'s row of workflow `wf`'s entry.
fn boot_entry(cp: &ControlPlane, wf: &str) -> Value {
    cp.json(&["boot", "list"])
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["workflowId"] == wf)
        .cloned()
        .unwrap_or_else(|| panic!("the entry of {wf} is listed"))
}

/// A machine with one 64 MiB disk, vda (a sparse file under its fake
/// /dev), nothing mounted.
fn with_disk(cp: &ControlPlane) -> Machine {
    let machine = Machine::new(cp, MAC, UUID);
    machine.agent.sysfs("block/vda/size", "131072\n");
    machine.agent.sysfs("block/vda/dev", "252:0\n");
    std::fs::create_dir_all(machine.agent.sysfs_root().join("block/vda/holders")).unwrap();
    let root = machine.agent.root.path();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::create_dir_all(root.join("proc/self")).unwrap();
    std::fs::write(root.join("proc/self/mountinfo"), "").unwrap();
    std::fs::write(root.join("proc/filesystems"), "nodev\tproc\n\text4\n").unwrap();
    std::fs::write(root.join("proc/cmdline"), "console=ttyS0\n").unwrap();
    std::fs::write(
        root.join("proc/swaps"),
        "Filename\tType\tSize\tUsed\tPriority\n",
    )
    .unwrap();
    let disk = std::fs::File::create(root.join("dev/vda")).unwrap();
    disk.set_len(64 << 20).unwrap();
    machine
}

/// A commission: the ramdisk joins by discovery, the poller queues
/// inventory.refresh, the workflow succeeds once its result is in, every
/// step's state and times shown; a control plane restarted after the start
/// carries on from the stored step.
#[test]
fn a_commission_succeeds_after_inventory_and_survives_a_restart() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let wf = start_commission(&cp, &[]);
    let w = show(&cp, &wf);
    assert_eq!(w["state"], "running", "{w}");
    assert_eq!(step(&w, "boot.entry")["state"], "done", "{w}");
    assert_eq!(step(&w, "ramdisk.join")["state"], "running", "{w}");

    // Restarted before the machine boots: the workflow waits on.
    let cp = cp.restart();
    let holder = SiteNode::join(&cp, &site_id);
    let lease = holder.acquire().unwrap();
    let machine = Machine::new(&cp, MAC, UUID);
    let _ramdisk = boot_ramdisk(&holder, lease.epoch, &machine, &wf);

    let w = finished(&cp, &wf);
    assert_eq!(w["state"], "succeeded", "{w}");
    let node = machine.agent.status_json()["nodeId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(w["node"], node.as_str(), "{w}");
    assert_eq!(step(&w, "ramdisk.join")["state"], "done", "{w}");
    let inv = step(&w, "inventory.refresh");
    assert_eq!(inv["state"], "done", "{w}");
    assert!(
        inv["commandId"].as_str().unwrap().starts_with("cmd_"),
        "{w}"
    );
    assert!(inv["startedAt"].is_string() && inv["finishedAt"].is_string());
    assert_eq!(step(&w, "disk.wipe")["state"], "skipped", "{w}");
    let inventory = cp.json(&["nodes", "inventory", &node]);
    assert_eq!(inventory["inventory"]["dmi"]["productUuid"], UUID);
    let list = cp.json(&["workflows", "list"]);
    assert_eq!(list[0]["id"], wf.as_str(), "{list}");
}

/// A known machine re-commissioned with `--node N` (resolveWorkflowNode)
/// joins as N: the same node id, a new identity generation, its older
/// certificates revoked; a retired or unknown `--node` is refused.
#[test]
fn a_known_machine_recommissioned_keeps_its_node_id() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let wf = start_commission(&cp, &[]);
    let first = Machine::new(&cp, MAC, UUID);
    let mut ramdisk = boot_ramdisk(&holder, epoch, &first, &wf);
    let w = finished(&cp, &wf);
    assert_eq!(w["state"], "succeeded", "{w}");
    let node = w["node"].as_str().unwrap().to_owned();
    ramdisk.stop();

    let unknown = cp.cli(&[
        "workflows",
        "start",
        "commission",
        "--site",
        "dc1",
        "--mac",
        MAC,
        "--node",
        "node_nosuchnode",
    ]);
    assert!(!unknown.status.success());
    assert!(
        stderr(&unknown).contains("no such node"),
        "{}",
        stderr(&unknown)
    );

    let again = start_commission(&cp, &["--node", &node]);
    // A fresh ramdisk (nothing kept from the first boot) of the same machine.
    let second = Machine::new(&cp, MAC, UUID);
    let _ramdisk = boot_ramdisk(&holder, epoch, &second, &again);
    let w = finished(&cp, &again);
    assert_eq!(w["state"], "succeeded", "{w}");
    assert_eq!(w["node"], node.as_str(), "{w}");
    assert_eq!(second.agent.status_json()["nodeId"], node.as_str());
    let listed = cp
        .nodes()
        .into_iter()
        .find(|n| n["nodeId"] == node.as_str())
        .unwrap();
    assert_eq!(listed["identityGeneration"], 2, "{listed}");
    let certs = cp.json(&["nodes", "certs", &node]);
    for c in certs.as_array().unwrap() {
        assert_eq!(
            c["revoked"],
            c["identityGeneration"] == 1,
            "generation 1 revoked, 2 live: {certs}"
        );
    }
}

/// A step whose command the node may not be sent fails the workflow with
/// the step and the refusal named, and the entry stays closed.
#[test]
fn a_refused_command_fails_the_workflow_with_its_reason() {
    let cp =
        ControlPlane::start_with_config("[discovery]\nallowed_kinds = [\"inventory.refresh\"]\n");
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let lease = holder.acquire().unwrap();
    let wf = start_commission(&cp, &["--wipe", "--disk", "/dev/vda"]);
    let machine = Machine::new(&cp, MAC, UUID);
    let _ramdisk = boot_ramdisk(&holder, lease.epoch, &machine, &wf);
    let w = finished(&cp, &wf);
    assert_eq!(w["state"], "failed", "{w}");
    let failure = w["failure"].as_str().unwrap();
    assert!(
        failure.starts_with("disk.wipe: command refused (kind-not-allowed)"),
        "{failure}"
    );
    assert_eq!(step(&w, "inventory.refresh")["state"], "done", "{w}");
    assert_eq!(step(&w, "disk.wipe")["state"], "failed", "{w}");
    assert_eq!(step(&w, "disk.wipe")["detail"], failure, "{w}");
    let text = stdout(&cp.cli(&["workflows", "show", &wf]));
    assert!(
        text.contains("failed: disk.wipe: command refused"),
        "{text}"
    );
}

/// Cancel closes the boot entry (the site serves it no more); a second
/// cancel, or one of an unknown workflow, is refused naming why.
#[test]
fn cancel_closes_the_entry() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let wf = start_commission(&cp, &[]);
    let out = cp.cli(&["workflows", "cancel", &wf]);
    assert_ok(&out);
    assert_eq!(stdout(&out).trim(), format!("{wf} cancelled"));
    let w = show(&cp, &wf);
    assert_eq!(w["state"], "cancelled", "{w}");
    assert_eq!(w["failure"], "cancelled by an operator", "{w}");
    assert_eq!(crate::discovery::boot_state(&cp, &wf), "expired");
    let again = cp.cli(&["workflows", "cancel", &wf]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("is cancelled already: only a running workflow is cancelled"),
        "{}",
        stderr(&again)
    );
    let unknown = cp.cli(&["workflows", "cancel", "wf_nosuch"]);
    assert!(stderr(&unknown).contains("no workflow \"wf_nosuch\""));
    // The site's holder gets no token for it.
    let holder = SiteNode::join(&cp, &site_id);
    holder.acquire().unwrap();
    assert!(holder.secret(&wf).is_err());
}

/// `workflows start deploy` is refused for an unknown node, a retired
/// node, and an image that is not registered, each naming what to do.
#[test]
fn deploy_refusals() {
    let cp = ControlPlane::start();
    site(&cp, "dc1");
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    let deploy = |node: &str| {
        cp.cli(&[
            "workflows",
            "start",
            "deploy",
            "--node",
            node,
            "--image",
            "debian",
            "--api",
            "https://cp.example:8443",
            "--site",
            "dc1",
            "--mac",
            MAC,
            "--disk",
            "/dev/vda",
        ])
    };
    // No package in dist/: the install script cannot be made.
    let out = deploy(&node);
    assert!(!out.status.success());
    let pkg = cp.path().join("bcd_0.1.0+test_amd64.deb");
    std::fs::write(&pkg, b"not really a package").unwrap();
    assert_ok(&cp.cli(&["dist", "add", &pkg.to_string_lossy()]));
    let out = deploy(&node);
    assert!(
        stderr(&out).contains("workflow refused: no image \"debian\""),
        "{}",
        stderr(&out)
    );
    let out = deploy("node_nosuch");
    assert!(
        stderr(&out).contains("workflow refused: no node \"node_nosuch\""),
        "{}",
        stderr(&out)
    );
    assert_ok(&cp.cli(&["nodes", "retire", &node]));
    let out = deploy(&node);
    assert!(
        stderr(&out).contains(&format!("node {node} is retired")),
        "{}",
        stderr(&out)
    );
    assert!(cp
        .json(&["workflows", "list"])
        .as_array()
        .unwrap()
        .is_empty());
}

/// provisionedTargetResolver: a token targeted at a node binds to the
/// product UUID of its newest inventory, not its join's claim: the old
/// UUID is `product-uuid-mismatch` (the token keeps its use), the
/// inventory's re-keys the same node.
#[test]
fn a_targeted_token_binds_to_the_newest_inventory() {
    use crate::provisioned::{join_as, machine, OTHER_UUID};
    let cp = ControlPlane::start();
    let agent = machine(&cp, Some(UUID));
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    // The board was swapped: the inventory reports another UUID.
    agent.sysfs(
        "class/dmi/id/product_uuid",
        &format!("{}\n", OTHER_UUID.to_uppercase()),
    );
    let mut run = agent.command(&["node"]);
    run.env("BCD_SYSFS_ROOT", agent.sysfs_root());
    let mut running = Logged::spawn(run);
    running.wait_for("command channel up", 1);
    let out = cp.cli(&[
        "commands",
        "send",
        "--node",
        &node,
        "--kind",
        "inventory.refresh",
        "--wait",
    ]);
    assert_ok(&out);
    running.stop();
    let token = cp.token("provisioned", &["--node", &node]);
    let old = machine(&cp, Some(UUID));
    let out = join_as(&old, "provisioned", &token);
    assert_access_denied(&out);
    assert_eq!(cp.refusal("product-uuid-mismatch")["nodeId"], node.as_str());
    let new = machine(&cp, Some(OTHER_UUID));
    assert_ok(&join_as(&new, "provisioned", &token));
    assert_eq!(new.status_json()["nodeId"], node.as_str());
}

/// A deploy of a commissioned machine: its ramdisk joins AS the node (same
/// id, identity generation 2, generation 1's certificates revoked, role
/// ramdisk), inventory.refresh and disk.wipe run, userdata.render mints a
/// provisioned token targeted at the node (its id shown, its text never:
/// not in `workflows show`, not in the log), deploy.image is queued with
/// the image's digest and the seed's. (The ramdisk's deploy.image is helper
/// B's; whatever it answers, the workflow ends by cancel or by that answer,
/// and the token it minted is revoked.)
#[test]
fn a_deploy_joins_as_the_node_and_queues_the_image() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let wf = start_commission(&cp, &[]);
    let first = with_disk(&cp);
    let mut ramdisk = boot_ramdisk(&holder, epoch, &first, &wf);
    assert_eq!(finished(&cp, &wf)["state"], "succeeded");
    let node = first.agent.status_json()["nodeId"]
        .as_str()
        .unwrap()
        .to_owned();
    ramdisk.stop();

    let files = tempfile::tempdir().unwrap();
    let image = files.path().join("debian.img");
    std::fs::write(&image, vec![0x5a; 1 << 20]).unwrap();
    assert_ok(&cp.cli(&["images", "add", "debian", &image.to_string_lossy()]));
    let pkg = files.path().join("bcd_0.1.0+test_amd64.deb");
    std::fs::write(&pkg, b"not really a package").unwrap();
    assert_ok(&cp.cli(&["dist", "add", &pkg.to_string_lossy()]));
    let out = cp.cli(&[
        "workflows",
        "start",
        "deploy",
        "--node",
        &node,
        "--image",
        "debian",
        "--api",
        &cp.url,
    ]);
    assert_ok(&out);
    let deploy = stdout(&out).trim().to_owned();
    let w = show(&cp, &deploy);
    assert_eq!(
        (&w["site"], &w["mac"], &w["disk"]),
        (&site_id.as_str().into(), &MAC.into(), &"/dev/vda".into()),
        "defaults from the last workflow and the inventory: {w}"
    );
    // A second deploy of the node while this one runs is refused.
    let again = cp.cli(&[
        "workflows",
        "start",
        "deploy",
        "--node",
        &node,
        "--image",
        "debian",
        "--api",
        &cp.url,
    ]);
    assert!(
        stderr(&again).contains(&format!("has a running workflow {deploy}")),
        "{}",
        stderr(&again)
    );

    let second = with_disk(&cp);
    let _ramdisk = boot_ramdisk(&holder, epoch, &second, &deploy);
    let w = wait_for(|| {
        let w = show(&cp, &deploy);
        let queued = step(&w, "deploy.image")["commandId"].is_string();
        (queued || w["state"] != "running").then_some(w)
    });
    assert_eq!(second.agent.status_json()["nodeId"], node.as_str(), "{w}");
    let listed = cp
        .nodes()
        .into_iter()
        .find(|n| n["nodeId"] == node.as_str())
        .unwrap();
    assert_eq!(listed["identityGeneration"], 2, "{listed}");
    assert_eq!(listed["role"], "ramdisk", "{listed}");
    let certs = cp.json(&["nodes", "certs", &node]);
    for c in certs.as_array().unwrap() {
        if c["identityGeneration"] == 1 {
            assert_eq!(c["revoked"], true, "{certs}");
        }
    }
    for s in [
        "ramdisk.join",
        "inventory.refresh",
        "disk.wipe",
        "userdata.render",
    ] {
        assert_eq!(step(&w, s)["state"], "done", "{s}: {w}");
    }
    let token_id = w["tokenId"].as_str().expect("a minted token").to_owned();
    let secret_prefix = format!("{token_id}.");
    let shown = stdout(&cp.cli(&["workflows", "show", &deploy])) + &w.to_string();
    assert!(!shown.contains(&secret_prefix), "{shown}");
    assert!(!cp.log().contains(&secret_prefix));
    let cmd = step(&w, "deploy.image")["commandId"]
        .as_str()
        .unwrap()
        .to_owned();
    let queued = cp.json(&["commands", "show", &cmd]);
    let args = queued["args"].to_string();
    assert!(
        args.contains("debian") && args.contains("/dev/vda"),
        "{queued}"
    );
    assert!(args.contains("seed"), "{queued}");

    // Cancelled (or already ended by the ramdisk's answer): the token the
    // workflow minted is revoked.
    let _ = cp.cli(&["workflows", "cancel", &deploy]);
    let w = show(&cp, &deploy);
    assert_ne!(w["state"], "running", "{w}");
    let tokens = cp.json(&["token", "list"]);
    let minted = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == token_id.as_str())
        .unwrap();
    assert_eq!(minted["revoked"], true, "{minted}");
}

/// On PostgreSQL with two replicas: a commission started through replica A
/// finishes through replica B once A is killed while it waits for the
/// join: the state is the database's, and whichever replica's poller
/// locks the row advances it (with B and C both polling, each step runs
/// once).
#[test]
fn a_workflow_started_on_one_replica_finishes_on_another() {
    let mut a = ControlPlane::start_on(Backend::Postgres);
    let mut others = a.replicas(2);
    let (b, _c) = (others.remove(0), others.remove(0));
    let site_id = site(&a, "dc1");
    let wf = start_commission(&a, &[]);
    a.kill9();
    let holder = SiteNode::join(&b, &site_id);
    let lease = holder.acquire().unwrap();
    let machine = Machine::new(&b, MAC, UUID);
    let _ramdisk = boot_ramdisk(&holder, lease.epoch, &machine, &wf);
    let w = finished(&b, &wf);
    assert_eq!(w["state"], "succeeded", "{w}");
    assert_eq!(step(&w, "inventory.refresh")["state"], "done", "{w}");
    // B and C poll at once: each step ran once (one inventory.refresh).
    let node = w["node"].as_str().unwrap();
    let commands = b.json(&["commands", "list", "--node", node]);
    assert_eq!(commands.as_array().unwrap().len(), 1, "{commands}");
}

/// Whether this test may mount the deployed filesystem (root); says it
/// skipped when not.
fn root_or_skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: mounting the deployed filesystem needs root");
    }
    root
}

/// A deploy run (root: a loop device for the disk, mkfs.ext4) up to its
/// last step: deploy.image wrote an ext4 image whose cloud-init finds the
/// seed, boot.kexec loaded its kernel (kept from rebooting by the
/// failpoint), and the workflow waits for the installed system's
/// provisioned join. `token` is what the seed on the disk holds.
struct AtTheJoin {
    node: String,
    deploy: String,
    token: String,
    /// Dropped in this order: the ramdisk first.
    _keep: (
        Logged,
        crate::deploy::Loop,
        Machine,
        SiteNode,
        tempfile::TempDir,
    ),
}

fn deploy_to_the_provisioned_join(cp: &ControlPlane) -> AtTheJoin {
    use crate::deploy::{ext4_image, Loop};
    let (holder, epoch, node) = commissioned(cp);
    let tmp = tempfile::tempdir().unwrap();
    let raw = ext4_image(
        tmp.path(),
        8 << 20,
        &[
            ("etc/cloud/cloud.cfg", "datasource_list: [ NoCloud ]\n"),
            ("etc/fstab", "UUID=0a1b2c3d / ext4 rw 0 1\n"),
            ("boot/vmlinuz-6.1.0-10-amd64", "not a kernel"),
        ],
    );
    let (deploy, _) = start_deploy(cp, &node, tmp.path(), &raw);

    let second = with_disk(cp);
    let disk = Loop::new(16 << 20);
    let dev = second.agent.root.path().join("dev/vda");
    std::fs::remove_file(&dev).unwrap();
    std::os::unix::fs::symlink(&disk.dev, &dev).unwrap();
    second
        .agent
        .sysfs("block/vda/size", &format!("{}\n", (16 << 20) / 512));
    let ramdisk = boot_ramdisk(&holder, epoch, &second, &deploy);
    let w = wait_for(|| {
        let w = show(cp, &deploy);
        let waiting = step(&w, "provisioned.join")["state"] == "running";
        (waiting || w["state"] != "running").then_some(w)
    });
    assert_eq!(w["state"], "running", "{w}");
    for s in ["deploy.image", "boot.close", "boot.kexec"] {
        assert_eq!(step(&w, s)["state"], "done", "{s}: {w}");
    }

    // What cloud-init will find on the installed system.
    let mnt = tempfile::tempdir().unwrap();
    assert_ok(
        &std::process::Command::new("mount")
            .args(["-o", "ro", &disk.dev])
            .arg(mnt.path())
            .output()
            .unwrap(),
    );
    let user_data =
        std::fs::read_to_string(mnt.path().join("var/lib/cloud/seed/nocloud/user-data"));
    let _ = std::process::Command::new("umount")
        .arg(mnt.path())
        .status();
    let user_data = user_data.unwrap();
    assert!(user_data.starts_with("#cloud-config\n"), "{user_data}");
    assert!(user_data.contains("--attestor provisioned"), "{user_data}");
    let token = user_data
        .lines()
        .find_map(|l| l.trim().strip_prefix("content: '"))
        .and_then(|l| l.strip_suffix('\''))
        .expect("the token line")
        .to_owned();
    assert!(!cp.log().contains(&token), "the token is in no log");
    AtTheJoin {
        node,
        deploy,
        token,
        _keep: (ramdisk, disk, second, holder, tmp),
    }
}

/// The whole loop on this host (root, a loop device for the disk,
/// mkfs.ext4): commission, then deploy an ext4 image whose cloud-init
/// finds the seed; deploy.image writes it and the seed, boot.kexec loads
/// its kernel (kept from rebooting by the failpoint), and the installed
/// system's `bcd join --attestor provisioned` with the token from the seed
/// re-keys the same node, role node, and the workflow succeeds. A machine
/// claiming another product UUID first is refused `product-uuid-mismatch`
/// and spends nothing.
#[test]
fn a_deploy_runs_to_the_installed_systems_provisioned_join() {
    use crate::provisioned::{join_as, machine, OTHER_UUID};
    if !root_or_skip() {
        return;
    }
    let cp = ControlPlane::start();
    let d = deploy_to_the_provisioned_join(&cp);
    let node = d.node.as_str();

    // Another machine with the token: refused, nothing spent.
    let other = machine(&cp, Some(OTHER_UUID));
    assert_access_denied(&join_as(&other, "provisioned", &d.token));
    assert_eq!(cp.refusal("product-uuid-mismatch")["nodeId"], node);
    // The installed system (the inventory's UUID) re-keys the node.
    let installed = machine(&cp, Some(UUID));
    assert_ok(&join_as(&installed, "provisioned", &d.token));
    assert_eq!(installed.status_json()["nodeId"], node);
    let w = finished(&cp, &d.deploy);
    assert_eq!(w["state"], "succeeded", "{w}");
    let listed = cp
        .nodes()
        .into_iter()
        .find(|n| n["nodeId"] == node)
        .unwrap();
    assert_eq!(listed["role"], "node", "{listed}");
    assert_eq!(listed["identityGeneration"], 3, "{listed}");
}

/// The installed system never joins: past the provisioned token's expiry
/// (6 h after userdata.render; the control plane's clock moved, not
/// waited for) the workflow fails at provisioned.join naming the token;
/// the token is revoked, not only expired: with the clock back, the
/// installed system's join with it is refused, and the node stays the
/// ramdisk it was.
#[test]
fn a_provisioned_join_past_the_tokens_expiry_fails_the_workflow() {
    use crate::provisioned::{join_as, machine};
    if !root_or_skip() {
        return;
    }
    let cp = ControlPlane::start();
    let d = deploy_to_the_provisioned_join(&cp);
    let token_id = show(&cp, &d.deploy)["tokenId"].as_str().unwrap().to_owned();
    assert_ok(&cp.cli(&["clock", "set", "--offset", "7h"]));
    let w = finished(&cp, &d.deploy);
    assert_eq!(w["state"], "failed", "{w}");
    let failure = w["failure"].as_str().unwrap();
    assert!(
        failure.starts_with(&format!("provisioned.join: token {token_id} expired at "))
            && failure.ends_with(" before the installed system joined"),
        "{failure}"
    );
    assert_eq!(step(&w, "provisioned.join")["state"], "failed", "{w}");
    assert_eq!(step(&w, "provisioned.join")["detail"], failure, "{w}");

    assert_ok(&cp.cli(&["clock", "set", "--offset", "0s"]));
    assert_eq!(token_row(&cp, &token_id)["revoked"], true);
    let installed = machine(&cp, Some(UUID));
    assert_access_denied(&join_as(&installed, "provisioned", &d.token));
    let listed = cp
        .nodes()
        .into_iter()
        .find(|n| n["nodeId"] == d.node.as_str())
        .unwrap();
    assert_eq!(listed["role"], "ramdisk", "{listed}");
}

/// deploy.image fails inside a deploy (the stored image file altered after
/// `images add`: the control plane cuts the transfer, or what arrives is
/// not the pinned digest): the workflow fails at deploy.image with the
/// agent's reason; the disk is left wiped, after the image's bytes had
/// reached it; the provisioned token userdata.render minted is revoked and
/// the node's seed is no longer served.
#[test]
fn a_failed_deploy_image_fails_the_workflow_and_leaves_the_disk_wiped() {
    let cp = ControlPlane::start();
    let (holder, epoch, node) = commissioned(&cp);
    let files = tempfile::tempdir().unwrap();
    // 6 MiB with no zero byte: what reached the disk shows.
    let raw: Vec<u8> = (0..6usize << 20).map(|i| (i % 251) as u8 + 1).collect();
    let (deploy, image) = start_deploy(&cp, &node, files.path(), &raw);
    assert_eq!(image["compression"], "none", "{image}");
    let stored = cp
        .path()
        .join("images")
        .join(image["storedSha256"].as_str().unwrap());
    let mut altered = std::fs::read(&stored).unwrap();
    let last = altered.len() - 1;
    altered[last] ^= 0xff;
    std::fs::write(&stored, &altered).unwrap();

    let second = with_disk(&cp);
    let _ramdisk = boot_ramdisk(&holder, epoch, &second, &deploy);
    let w = finished(&cp, &deploy);
    assert_eq!(w["state"], "failed", "{w}");
    let failure = w["failure"].as_str().unwrap();
    let cmd = step(&w, "deploy.image")["commandId"].as_str().unwrap();
    assert!(
        failure.starts_with(&format!("deploy.image: command {cmd} failed: "))
            && failure.ends_with(": the disk was wiped, nothing bootable left"),
        "{failure}"
    );
    for s in [
        "ramdisk.join",
        "inventory.refresh",
        "disk.wipe",
        "userdata.render",
    ] {
        assert_eq!(step(&w, s)["state"], "done", "{s}: {w}");
    }
    assert_eq!(step(&w, "deploy.image")["state"], "failed", "{w}");
    assert_eq!(step(&w, "boot.close")["state"], "pending", "{w}");

    // The image's bytes reached the disk, then the wipe zeroed both ends.
    let disk = std::fs::read(second.agent.root.path().join("dev/vda")).unwrap();
    let edge = 1 << 20;
    assert!(disk[..edge].iter().all(|b| *b == 0), "the head is wiped");
    assert!(
        disk[disk.len() - edge..].iter().all(|b| *b == 0),
        "the tail is wiped"
    );
    assert!(
        disk[edge..3 * edge] == raw[edge..3 * edge],
        "the image was written before it failed"
    );

    let token = w["tokenId"].as_str().expect("a minted token");
    assert_eq!(token_row(&cp, token)["revoked"], true);
    let (status, body) = crate::deploy::get_as(&cp, &second.agent.data_dir, "/v1/deploy/seed");
    assert_eq!(status, 404, "the seed is removed: {body}");
    assert!(body.contains("no current deploy seed"), "{body}");
}

/// The machine never boots: past its boot entry's end (the control plane's
/// clock moved, not waited for) the workflow fails at ramdisk.join naming
/// the entry's end; nothing is queued, and the entry is closed: expired,
/// its discovery token revoked, not only past its time.
#[test]
fn a_machine_that_never_joins_fails_the_workflow_at_the_entrys_end() {
    let cp = ControlPlane::start();
    site(&cp, "dc1");
    let wf = start_commission(&cp, &["--ttl", "1m"]);
    let entry = boot_entry(&cp, &wf);
    assert_eq!(entry["state"], "waiting", "{entry}");
    let end = entry["notAfter"].as_str().unwrap().to_owned();
    let token = entry["tokenId"].as_str().unwrap().to_owned();
    assert_eq!(show(&cp, &wf)["state"], "running");

    assert_ok(&cp.cli(&["clock", "set", "--offset", "2m"]));
    let w = finished(&cp, &wf);
    assert_eq!(w["state"], "failed", "{w}");
    assert_eq!(
        w["failure"],
        format!("ramdisk.join: the boot entry ended at {end} before the machine joined").as_str(),
        "{w}"
    );
    assert_eq!(step(&w, "ramdisk.join")["state"], "failed", "{w}");
    let inv = step(&w, "inventory.refresh");
    assert_eq!(inv["state"], "pending", "{w}");
    assert!(inv["commandId"].is_null(), "{w}");
    assert_eq!(boot_entry(&cp, &wf)["state"], "expired");
    assert_eq!(token_row(&cp, &token)["revoked"], true);
}

/// A commission whose ramdisk joined once and stopped (`--once`), so its
/// inventory.refresh command waits, queued, for a node that is gone.
struct Waiting {
    cp: ControlPlane,
    wf: String,
    machine: Machine,
    node: String,
    cmd: String,
    /// Holds the site's boot lease for as long as the test runs.
    _holder: SiteNode,
}

fn a_command_waits() -> Waiting {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let wf = start_commission(&cp, &[]);
    let machine = Machine::new(&cp, MAC, UUID);
    write_cmdline(&holder, epoch, &machine, &wf);
    assert_ok(&ramdisk_command(&machine, &["--once"]).within());
    let node = machine.agent.status_json()["nodeId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cmd = wait_for(|| {
        let w = show(&cp, &wf);
        step(&w, "inventory.refresh")["commandId"]
            .as_str()
            .map(str::to_owned)
    });
    Waiting {
        cp,
        wf,
        machine,
        node,
        cmd,
        _holder: holder,
    }
}

/// A control plane restarted while a command step runs (inventory.refresh
/// queued, its result not in: the ramdisk joined and stopped before it
/// took it) carries on from the stored step: the ramdisk started again
/// gets that same command, the workflow succeeds, and the step ran once
/// (one command, the one stored on the step).
#[test]
fn a_restart_while_a_command_waits_carries_on_with_the_same_command() {
    let Waiting {
        cp,
        wf,
        machine,
        node,
        cmd,
        _holder,
    } = a_command_waits();
    assert_eq!(cp.json(&["commands", "show", &cmd])["state"], "queued");
    assert_eq!(
        step(&show(&cp, &wf), "inventory.refresh")["state"],
        "running"
    );

    let cp = cp.restart();
    machine.agent.set_api(&cp.url);
    let _ramdisk = Logged::spawn(ramdisk_command(&machine, &[]));
    let w = finished(&cp, &wf);
    assert_eq!(w["state"], "succeeded", "{w}");
    assert_eq!(w["node"], node.as_str(), "{w}");
    assert_eq!(
        step(&w, "inventory.refresh")["commandId"],
        cmd.as_str(),
        "{w}"
    );
    let commands = cp.json(&["commands", "list", "--node", &node]);
    assert_eq!(commands.as_array().unwrap().len(), 1, "{commands}");
    assert_eq!(commands[0]["id"], cmd.as_str(), "{commands}");
    assert_eq!(commands[0]["state"], "ok", "{commands}");
}

/// A workflow cancelled while its step's command waits for the node (the
/// ramdisk joined and stopped before it took it) recalls that command:
/// `expired` at once, its outcome naming the workflow, and the ramdisk
/// started again never gets it (a diag.ping sent after it comes back ok,
/// the recalled command still without a result).
#[test]
fn a_cancelled_workflow_recalls_its_queued_command() {
    let Waiting {
        cp,
        wf,
        machine,
        node,
        cmd,
        _holder,
    } = a_command_waits();
    assert_ok(&cp.cli(&["workflows", "cancel", &wf]));
    let recalled = cp.json(&["commands", "show", &cmd]);
    assert_eq!(recalled["state"], "expired", "{recalled}");
    assert_eq!(
        recalled["outcome"],
        format!("recalled: workflow {wf} cancelled"),
        "{recalled}"
    );

    let mut ramdisk = Logged::spawn(ramdisk_command(&machine, &[]));
    ramdisk.wait_for("command channel up", 1);
    let ping = cp.cli(&[
        "commands",
        "send",
        "--node",
        &node,
        "--kind",
        "diag.ping",
        "--timeout",
        "2m",
        "--wait",
    ]);
    assert_ok(&ping);
    let after = cp.json(&["commands", "show", &cmd]);
    assert_eq!(after["state"], "expired", "{after}");
    assert!(after["signatureChecked"].is_null(), "{after}");
    let commands = cp.json(&["commands", "list", "--node", &node]);
    assert_eq!(commands.as_array().unwrap().len(), 2, "{commands}");
}

/// inventory.refresh refused at queue time (the ramdisk's certificate does
/// not allow it: `[discovery] allowed_kinds`) fails the workflow at that
/// step with the refusal named; the steps after it never run. (The agent's
/// inventory itself never fails: an unreadable file is a null and named in
/// `unreadable`; its other failure is the expiry, below.)
#[test]
fn a_refused_inventory_refresh_fails_the_workflow_at_that_step() {
    let cp = ControlPlane::start_with_config("[discovery]\nallowed_kinds = [\"diag.ping\"]\n");
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let wf = start_commission(&cp, &["--wipe", "--disk", "/dev/vda"]);
    let machine = Machine::new(&cp, MAC, UUID);
    let _ramdisk = boot_ramdisk(&holder, epoch, &machine, &wf);
    let w = finished(&cp, &wf);
    assert_eq!(w["state"], "failed", "{w}");
    let failure = w["failure"].as_str().unwrap();
    assert!(
        failure.starts_with("inventory.refresh: command refused (kind-not-allowed)"),
        "{failure}"
    );
    assert_eq!(step(&w, "ramdisk.join")["state"], "done", "{w}");
    assert_eq!(step(&w, "inventory.refresh")["state"], "failed", "{w}");
    assert_eq!(step(&w, "disk.wipe")["state"], "pending", "{w}");
    let node = w["node"].as_str().unwrap();
    let commands = cp.json(&["commands", "list", "--node", node]);
    assert!(commands.as_array().unwrap().is_empty(), "{commands}");
}

/// An inventory.refresh the node never answers (the ramdisk joined and
/// stopped) fails the workflow at that step once the command's not_after
/// passes (the control plane's clock moved), naming the command.
#[test]
fn an_unanswered_inventory_refresh_fails_the_workflow_when_it_expires() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let wf = start_commission(&cp, &[]);
    let machine = Machine::new(&cp, MAC, UUID);
    write_cmdline(&holder, epoch, &machine, &wf);
    assert_ok(&ramdisk_command(&machine, &["--once"]).within());
    let cmd = wait_for(|| {
        let w = show(&cp, &wf);
        step(&w, "inventory.refresh")["commandId"]
            .as_str()
            .map(str::to_owned)
    });
    assert_ok(&cp.cli(&["clock", "set", "--offset", "2m"]));
    let w = finished(&cp, &wf);
    assert_eq!(w["state"], "failed", "{w}");
    let failure = w["failure"].as_str().unwrap();
    assert!(
        failure.starts_with(&format!("inventory.refresh: command {cmd} expired")),
        "{failure}"
    );
    assert_eq!(step(&w, "inventory.refresh")["state"], "failed", "{w}");
    assert_eq!(step(&w, "disk.wipe")["state"], "pending", "{w}");
}

/// An inventory.refresh whose output is not an inventory (a machine whose
/// sysfs lists NICs enough for more than the 1 MiB a result carries: the
/// output is cut, so nothing is stored) fails the workflow at that step
/// naming the command, rather than going on with no inventory of the
/// machine (or an older one).
#[test]
fn an_inventory_cut_at_the_output_cap_fails_the_workflow_at_that_step() {
    let cp = ControlPlane::start();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let wf = start_commission(&cp, &[]);
    let machine = Machine::new(&cp, MAC, UUID);
    // About 280 bytes of JSON each: 6000 of them are well past 1 MiB.
    let net = machine.agent.sysfs_root().join("class/net");
    let long = "n".repeat(200);
    for i in 0..6000 {
        std::fs::create_dir_all(net.join(format!("{long}{i}"))).unwrap();
    }
    let _ramdisk = boot_ramdisk(&holder, epoch, &machine, &wf);
    let w = finished(&cp, &wf);
    assert_eq!(w["state"], "failed", "{w}");
    let inv = step(&w, "inventory.refresh");
    let cmd = inv["commandId"].as_str().unwrap();
    assert_eq!(cp.json(&["commands", "show", cmd])["state"], "ok");
    let failure = w["failure"].as_str().unwrap();
    assert!(
        failure.starts_with(&format!(
            "inventory.refresh: command {cmd} ok, but its output is not an inventory (cut at 1 MiB"
        )),
        "{failure}"
    );
    assert_eq!(inv["state"], "failed", "{w}");
    let node = w["node"].as_str().unwrap();
    let out = cp.cli(&["nodes", "inventory", node]);
    assert!(
        stderr(&out).contains("has no inventory"),
        "none stored: {}",
        stderr(&out)
    );
}
