//! deploy.image end to end (issue 30): `images add` on the real control
//! plane, a real `bcd ramdisk` (joined through discovery) fetching the image
//! over mTLS from `GET /v1/images/<name>` and writing it to a fake disk (a
//! file under its BCD_DEV_ROOT, a disk of its fake sysfs), each refusal and
//! failure seen at the agent's outcome; the deploy endpoints refuse a node
//! certificate.

use std::path::{Path, PathBuf};
use std::process::Output;

use sha2::{Digest, Sha256};

use crate::discovery::{boot_add, site, Machine, SiteNode, MAC, UUID};
use crate::harness::*;

/// The fake disk's size: 8 MiB.
const DISK: usize = 8 << 20;

struct Ramdisk {
    _machine: Machine,
    running: Logged,
    node_id: String,
    dev: PathBuf,
}

/// A ramdisk joined through discovery, its channel up, one disk `vda` of
/// [`DISK`] bytes (0xAA) in its fake /sys and /dev, nothing mounted.
fn ramdisk(cp: &ControlPlane) -> Ramdisk {
    let site_id = site(cp, "dc1");
    let holder = SiteNode::join(cp, &site_id);
    let lease = holder.acquire().unwrap();
    let wf = boot_add(cp, "dc1", MAC, &["--product-uuid", UUID]);
    let machine = Machine::new(cp, MAC, UUID);
    machine.agent.sysfs("block/vda/dev", "252:0\n");
    machine
        .agent
        .sysfs("block/vda/size", &format!("{}\n", DISK / 512));
    std::fs::create_dir_all(machine.agent.sysfs_root().join("block/vda/holders")).unwrap();
    let root = machine.agent.root.path().to_owned();
    let proc = root.join("proc");
    std::fs::create_dir_all(proc.join("self")).unwrap();
    std::fs::write(
        proc.join("self/mountinfo"),
        "22 1 0:21 / / rw - rootfs rootfs rw\n",
    )
    .unwrap();
    std::fs::write(proc.join("swaps"), "Filename Type Size Used Priority\n").unwrap();
    std::fs::write(proc.join("filesystems"), "nodev\tproc\n\text4\n").unwrap();
    std::fs::write(proc.join("cmdline"), "console=ttyS0\n").unwrap();
    let dev = root.join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("vda"), vec![0xAAu8; DISK]).unwrap();
    let file = root.join("cmdline");
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
    cmd.env("BCD_SYSFS_ROOT", machine.agent.sysfs_root())
        .env("BCD_PROC_ROOT", &proc)
        .env("BCD_DEV_ROOT", &dev)
        .env("BCD_FAILPOINT", "kexec-no-reboot");
    let mut running = Logged::spawn(cmd);
    running.wait_for("command channel up", 1);
    let status = machine.agent.status_json();
    assert_eq!(status["role"], "ramdisk");
    let node_id = status["nodeId"].as_str().unwrap().to_owned();
    Ramdisk {
        _machine: machine,
        running,
        node_id,
        dev: dev.join("vda"),
    }
}

/// A raw image of `n` bytes that compresses (and is not all one byte).
fn raw_image(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i / 4096) % 251) as u8 ^ (i % 7) as u8)
        .collect()
}

fn zstd(raw: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(raw, ruzstd::encoding::CompressionLevel::Fastest)
}

/// `images add NAME FILE --json`, the file holding `bytes`.
fn add_image(cp: &ControlPlane, dir: &Path, name: &str, bytes: &[u8]) -> serde_json::Value {
    let file = dir.join(format!("{name}.img"));
    std::fs::write(&file, bytes).unwrap();
    cp.json(&["images", "add", name, &file.to_string_lossy()])
}

fn deploy(cp: &ControlPlane, node: &str, args: &[(&str, &str)]) -> Output {
    let mut argv = vec![
        "commands".to_owned(),
        "send".to_owned(),
        "--node".to_owned(),
        node.to_owned(),
        "--kind".to_owned(),
        "deploy.image".to_owned(),
        "--timeout".to_owned(),
        "2m".to_owned(),
        "--wait".to_owned(),
        "--json".to_owned(),
    ];
    for (k, v) in args {
        argv.push("--arg".to_owned());
        argv.push(format!("{k}={v}"));
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    cp.cli(&argv)
}

fn zeros(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == 0)
}

#[test]
fn a_zstd_image_is_deployed_and_checked_and_a_wrong_digest_leaves_the_disk_wiped() {
    let cp = ControlPlane::start();
    let tmp = tempfile::tempdir().unwrap();
    let raw = raw_image(3 << 20);
    let image = add_image(&cp, tmp.path(), "debian", &zstd(&raw));
    let sha = hex::encode(Sha256::digest(&raw));
    assert_eq!(image["compression"], "zstd", "{image}");
    assert_eq!(image["sha256"], sha.as_str());
    assert_eq!(image["bytes"], raw.len() as u64);
    let listed = cp.json(&["images", "list"]);
    assert_eq!(listed[0]["name"], "debian", "{listed}");

    let r = ramdisk(&cp);
    let bytes = raw.len().to_string();
    let ok = deploy(
        &cp,
        &r.node_id,
        &[
            ("bytes", &bytes),
            ("compression", "zstd"),
            ("disk", "/dev/vda"),
            ("image", "debian"),
            ("sha256", &sha),
        ],
    );
    assert_ok(&ok);
    assert!(stdout(&ok).contains("sha256 verified"), "{}", stdout(&ok));
    let disk = std::fs::read(&r.dev).unwrap();
    assert_eq!(disk.len(), DISK);
    assert_eq!(&disk[..raw.len()], &raw[..], "the image is on the disk");
    assert!(
        disk[raw.len()..].iter().all(|b| *b == 0xAA),
        "nothing past it"
    );

    // A digest other than the image's: the step fails and the disk is wiped.
    let wrong = "0".repeat(64);
    let failed = deploy(
        &cp,
        &r.node_id,
        &[
            ("bytes", &bytes),
            ("compression", "zstd"),
            ("disk", "/dev/vda"),
            ("image", "debian"),
            ("sha256", &wrong),
        ],
    );
    assert_eq!(failed.status.code(), Some(3), "{}", stderr(&failed));
    let e = stderr(&failed);
    assert!(
        e.contains("image digest mismatch")
            && e.contains("the disk was wiped, nothing bootable left"),
        "{e}"
    );
    let disk = std::fs::read(&r.dev).unwrap();
    assert!(
        zeros(&disk[..1 << 20]) && zeros(&disk[DISK - (1 << 20)..]),
        "both ends wiped"
    );

    // A size smaller than the image: refused mid-stream, wiped.
    let failed = deploy(
        &cp,
        &r.node_id,
        &[
            ("bytes", "1000"),
            ("compression", "zstd"),
            ("disk", "/dev/vda"),
            ("image", "debian"),
            ("sha256", &sha),
        ],
    );
    assert!(
        stderr(&failed).contains("larger than its recorded 1000 bytes"),
        "{}",
        stderr(&failed)
    );

    // A disk not in the inventory: refused before anything is fetched.
    let refused = deploy(
        &cp,
        &r.node_id,
        &[
            ("bytes", &bytes),
            ("disk", "/dev/sdz"),
            ("image", "debian"),
            ("sha256", &sha),
        ],
    );
    assert!(
        stderr(&refused).contains(
            "refused: /dev/sdz: not a disk of this machine's inventory; nothing was written"
        ),
        "{}",
        stderr(&refused)
    );

    // A disk in use (mounted, as the fake mountinfo says): refused.
    let mountinfo = r
        .dev
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("proc/self/mountinfo");
    std::fs::write(
        &mountinfo,
        "22 1 0:21 / / rw - rootfs rootfs rw\n36 22 252:0 / /mnt rw - ext4 /dev/vda rw\n",
    )
    .unwrap();
    let refused = deploy(
        &cp,
        &r.node_id,
        &[
            ("bytes", &bytes),
            ("disk", "/dev/vda"),
            ("image", "debian"),
            ("sha256", &sha),
        ],
    );
    assert!(
        stderr(&refused).contains("refused: /dev/vda: mounted at /mnt; nothing was written"),
        "{}",
        stderr(&refused)
    );
    std::fs::write(&mountinfo, "22 1 0:21 / / rw - rootfs rootfs rw\n").unwrap();

    // The stored file changed behind the control plane's back: the
    // transfer is cut, the step fails, the disk is wiped.
    let stored = cp
        .path()
        .join("images")
        .join(image["storedSha256"].as_str().unwrap());
    let mut altered = std::fs::read(&stored).unwrap();
    let last = altered.len() - 1;
    altered[last] ^= 0xff;
    std::fs::write(&stored, &altered).unwrap();
    std::fs::write(&r.dev, vec![0xAAu8; DISK]).unwrap();
    let cut = deploy(
        &cp,
        &r.node_id,
        &[
            ("bytes", &bytes),
            ("compression", "zstd"),
            ("disk", "/dev/vda"),
            ("image", "debian"),
            ("sha256", &sha),
        ],
    );
    assert!(
        stderr(&cut).contains("the disk was wiped, nothing bootable left"),
        "{}",
        stderr(&cut)
    );
    assert!(zeros(&std::fs::read(&r.dev).unwrap()[..1 << 20]));

    // An image name the control plane does not have.
    let missing = deploy(
        &cp,
        &r.node_id,
        &[
            ("bytes", &bytes),
            ("disk", "/dev/vda"),
            ("image", "nosuch"),
            ("sha256", &sha),
        ],
    );
    assert!(
        stderr(&missing).contains("HTTP 404"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn images_add_refuses_a_corrupt_stream_and_a_name_in_use() {
    let cp = ControlPlane::start();
    let tmp = tempfile::tempdir().unwrap();
    let z = zstd(&raw_image(1 << 20));
    let file = tmp.path().join("cut.zst");
    std::fs::write(&file, &z[..z.len() / 2]).unwrap();
    let out = cp.cli(&["images", "add", "cut", &file.to_string_lossy()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("does not decode"), "{}", stderr(&out));
    assert_eq!(cp.json(&["images", "list"]), serde_json::json!([]));
    let plain = add_image(&cp, tmp.path(), "plain", b"raw bytes");
    assert_eq!(plain["compression"], "none");
    let again = tmp.path().join("again.img");
    std::fs::write(&again, b"other").unwrap();
    let out = cp.cli(&["images", "add", "plain", &again.to_string_lossy()]);
    assert!(stderr(&out).contains("pass --replace"), "{}", stderr(&out));
    assert_ok(&cp.cli(&[
        "images",
        "add",
        "--replace",
        "plain",
        &again.to_string_lossy(),
    ]));
    assert_ok(&cp.cli(&["images", "remove", "plain"]));
    assert_eq!(cp.json(&["images", "list"]), serde_json::json!([]));
}

/// GET `path` from the control plane with the TLS client identity in
/// `data_dir` (identity.json's chain, node.key): the status and body.
pub(crate) fn get_as(cp: &ControlPlane, data_dir: &Path, path: &str) -> (u16, String) {
    let ca = std::fs::read(cp.path().join("tls-ca.pem")).unwrap();
    let ca = ::pem::parse(ca).unwrap().into_contents();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca))
        .unwrap();
    let id: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data_dir.join("identity.json")).unwrap()).unwrap();
    let chain: Vec<rustls::pki_types::CertificateDer<'static>> = id["chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            ::pem::parse(p.as_str().unwrap())
                .unwrap()
                .into_contents()
                .into()
        })
        .collect();
    let key_pem = std::fs::read(data_dir.join("node.key")).unwrap();
    let key = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .unwrap()
        .unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let resp = client
            .get(format!("{}{path}", api_url(cp)))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap_or_default())
    })
}

fn api_url(cp: &ControlPlane) -> String {
    cp.url.trim_end_matches('/').to_owned()
}

#[test]
fn a_node_certificate_gets_403_from_the_deploy_endpoints() {
    let mut cp = ControlPlane::start();
    let tmp = tempfile::tempdir().unwrap();
    add_image(&cp, tmp.path(), "img", b"image bytes");
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    for path in ["/v1/images/img", "/v1/deploy/seed"] {
        let (status, body) = get_as(&cp, &agent.data_dir, path);
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("role ramdisk"), "{body}");
    }
    let line = cp.wait_for_log("deploy download refused", 2);
    assert!(line.contains("not a current ramdisk certificate"), "{line}");
}

/// A loop device over a file of `size` bytes, detached when dropped.
pub(crate) struct Loop {
    pub(crate) dev: String,
    _file: tempfile::NamedTempFile,
}

impl Loop {
    pub(crate) fn new(size: u64) -> Loop {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(size).unwrap();
        let out = std::process::Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file.path())
            .output()
            .unwrap();
        assert_ok(&out);
        Loop {
            dev: stdout(&out).trim().to_owned(),
            _file: file,
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.dev])
            .status();
    }
}

/// An ext4 image of `size` bytes holding `tree` (path, contents).
pub(crate) fn ext4_image(dir: &Path, size: u64, tree: &[(&str, &str)]) -> Vec<u8> {
    let root = dir.join("tree");
    for (path, text) in tree {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let img = dir.join("fs.img");
    std::fs::File::create(&img).unwrap().set_len(size).unwrap();
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&root)
        .arg(&img)
        .output()
        .unwrap();
    assert_ok(&out);
    std::fs::read(img).unwrap()
}

/// With a real filesystem (root, a loop device for the disk, mkfs.ext4):
/// the seed lands in the image's NoCloud directory 0600 and nowhere in the
/// result; a seed whose digest differs wipes the disk; boot.kexec finds
/// the image's kernel and its root (kept from rebooting by the failpoint),
/// after the result's acknowledgement.
#[test]
fn the_nocloud_seed_is_written_on_the_deployed_filesystem_and_kexec_finds_its_kernel() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a deployed filesystem needs root (proven in the VM test)");
        return;
    }
    let cp = ControlPlane::start();
    let tmp = tempfile::tempdir().unwrap();
    let raw = ext4_image(
        tmp.path(),
        8 << 20,
        &[
            ("etc/cloud/cloud.cfg", "datasource_list: [ NoCloud ]\n"),
            ("etc/fstab", "UUID=0a1b2c3d / ext4 rw 0 1\n"),
            ("boot/vmlinuz-6.1.0-9-amd64", "not a kernel"),
            ("boot/vmlinuz-6.1.0-10-amd64", "not a kernel"),
            ("boot/initrd.img-6.1.0-10-amd64", "not an initrd"),
        ],
    );
    let sha = hex::encode(Sha256::digest(&raw));
    add_image(&cp, tmp.path(), "debian", &zstd(&raw));
    let mut r = ramdisk(&cp);
    let disk = Loop::new(16 << 20);
    std::fs::remove_file(&r.dev).unwrap();
    std::os::unix::fs::symlink(&disk.dev, &r.dev).unwrap();

    let token_text = "bc1.secret-provisioned-token-text";
    let doc = serde_json::to_vec(&serde_json::json!({
        "user-data": format!("#cloud-config\nbc_token: {token_text}\n"),
        "meta-data": "instance-id: deployed\n",
    }))
    .unwrap();
    let state = bc_controlplane::ControlPlane::open(cp.path()).unwrap();
    let key = bc_controlplane::boot::BootKey::derive(
        &bc_controlplane::pki::load_or_create_challenge_key(cp.path()).unwrap(),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let seed_sha = state
        .database()
        .write(|tx| bc_controlplane::deploy::put_seed(tx, &key, &r.node_id, &doc, now + 600_000))
        .unwrap();
    assert_eq!(seed_sha, hex::encode(Sha256::digest(&doc)));
    let bytes = raw.len().to_string();
    let args = |seed: &str| {
        vec![
            ("bytes", bytes.clone()),
            ("compression", "zstd".to_owned()),
            ("disk", "/dev/vda".to_owned()),
            ("image", "debian".to_owned()),
            ("seed", seed.to_owned()),
            ("sha256", sha.clone()),
        ]
    };
    let send = |a: Vec<(&str, String)>| {
        let a: Vec<(&str, &str)> = a.iter().map(|(k, v)| (*k, v.as_str())).collect();
        deploy(&cp, &r.node_id, &a)
    };
    let ok = send(args(&seed_sha));
    assert_ok(&ok);
    assert!(
        stdout(&ok).contains("NoCloud seed written on /dev/vda"),
        "{}",
        stdout(&ok)
    );
    assert!(
        !stdout(&ok).contains(token_text),
        "the token is not in the result"
    );
    assert_eq!(r.running.count(token_text), 0, "nor in the agent's log");
    let mnt = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("mount")
        .args(["-o", "ro", &disk.dev])
        .arg(mnt.path())
        .output()
        .unwrap();
    assert_ok(&out);
    let nocloud = mnt.path().join("var/lib/cloud/seed/nocloud");
    let user_data = std::fs::read_to_string(nocloud.join("user-data"));
    let mode = std::fs::metadata(nocloud.join("user-data")).map(|m| {
        use std::os::unix::fs::PermissionsExt as _;
        m.permissions().mode() & 0o777
    });
    let meta = std::fs::read_to_string(nocloud.join("meta-data"));
    let _ = std::process::Command::new("umount")
        .arg(mnt.path())
        .status();
    assert!(user_data.unwrap().contains(token_text));
    assert_eq!(mode.unwrap(), 0o600);
    assert_eq!(meta.unwrap(), "instance-id: deployed\n");

    // boot.kexec: the newest kernel, root= from the image's fstab, the
    // ramdisk's consoles; the reboot waits for the result's ack.
    let out = cp.cli(&[
        "commands",
        "send",
        "--node",
        &r.node_id,
        "--kind",
        "boot.kexec",
        "--timeout",
        "2m",
        "--arg",
        "disk=/dev/vda",
        "--wait",
        "--json",
    ]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("vmlinuz-6.1.0-10-amd64 loaded from /dev/vda: rebooting into it"),
        "{}",
        stdout(&out)
    );
    let line = r
        .running
        .wait_for("test build: the kernel is not loaded", 1);
    assert!(
        line.contains("root=UUID=0a1b2c3d rw console=ttyS0"),
        "{line}"
    );
    r.running.wait_for("test build: would reboot", 1);
    assert_eq!(
        r.running.count("no acknowledgement of the result"),
        0,
        "the reboot followed the result's ack"
    );

    // A seed whose digest is not the command's: failed, the disk wiped.
    let failed = send(args(&"1".repeat(64)));
    assert_eq!(failed.status.code(), Some(3), "{}", stderr(&failed));
    assert!(
        stderr(&failed).contains("seed digest mismatch")
            && stderr(&failed).contains("the disk was wiped"),
        "{}",
        stderr(&failed)
    );
    let mut head = vec![0u8; 1 << 20];
    use std::io::Read as _;
    std::fs::File::open(&disk.dev)
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    assert!(zeros(&head), "wiped");
}

#[test]
fn boot_kexec_mode_reboot_answers_before_it_reboots() {
    let cp = ControlPlane::start();
    let mut r = ramdisk(&cp);
    let out = cp.cli(&[
        "commands",
        "send",
        "--node",
        &r.node_id,
        "--kind",
        "boot.kexec",
        "--timeout",
        "2m",
        "--arg",
        "disk=/dev/vda",
        "--arg",
        "mode=reboot",
        "--wait",
    ]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("rebooting through the firmware"),
        "{}",
        stdout(&out)
    );
    r.running.wait_for("test build: would reboot", 1);
    let refused = cp.cli(&[
        "commands",
        "send",
        "--node",
        &r.node_id,
        "--kind",
        "boot.kexec",
        "--timeout",
        "2m",
        "--arg",
        "disk=/dev/sdq",
        "--wait",
    ]);
    assert!(
        stderr(&refused).contains("refused: /dev/sdq: not a disk of this machine's inventory"),
        "{}",
        stderr(&refused)
    );
}
