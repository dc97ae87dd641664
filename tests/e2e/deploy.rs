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
    _running: Logged,
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
        _running: running,
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
fn get_as(cp: &ControlPlane, data_dir: &Path, path: &str) -> (u16, String) {
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
    let cp = ControlPlane::start();
    let tmp = tempfile::tempdir().unwrap();
    add_image(&cp, tmp.path(), "img", b"image bytes");
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    for path in ["/v1/images/img", "/v1/deploy/seed"] {
        let (status, body) = get_as(&cp, &agent.data_dir, path);
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("role ramdisk"), "{body}");
    }
}
