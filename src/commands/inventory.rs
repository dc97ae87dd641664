//! `inventory.refresh`: what this machine is, as JSON, read from sysfs and
//! procfs (a fake tree in tests) and the TPM.
//!
//! The same readings as the join's hardware claims
//! ([`crate::evidence::claims`]: MACs, product UUID), so the control plane
//! can compare an inventory with what the node proved at join. Nothing here
//! is an error: a file that cannot be read (DMI serials are root's; under
//! `[helper]` bcd node is not root) is `null` and named in `unreadable`.
use std::path::Path;

use serde::Serialize;

use super::{read_small, Done, Machine};
use crate::evidence::claims::{parse_mac, parse_product_uuid};
use crate::keys::TpmAccess;

#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct Inventory {
    dmi: Dmi,
    cpus: Cpus,
    memory: Memory,
    nics: Vec<Nic>,
    block_devices: Vec<BlockDevice>,
    tpm: Tpm,
    /// Files that exist and could not be read (relative to their root).
    unreadable: Vec<String>,
}

#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct Dmi {
    product_uuid: Option<String>,
    product_serial: Option<String>,
    sys_vendor: Option<String>,
    product_name: Option<String>,
    bios_vendor: Option<String>,
    bios_version: Option<String>,
    bios_date: Option<String>,
}

#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct Cpus {
    /// Logical CPUs.
    count: u32,
    /// Distinct physical packages (0 when /proc/cpuinfo does not say).
    sockets: u32,
    model: Option<String>,
}

#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct Memory {
    total_bytes: Option<u64>,
}

#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Nic {
    name: String,
    /// Lowercase `aa:bb:…`, as the join's claims have it; null for no
    /// Ethernet address.
    mac: Option<String>,
    driver: Option<String>,
    /// `operstate`: up, down, unknown, …
    link: Option<String>,
    speed_mbps: Option<u64>,
    /// No device behind it (a bridge, a bond, a tunnel).
    #[serde(rename = "virtual")]
    virtual_: bool,
}

#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct BlockDevice {
    name: String,
    size_bytes: Option<u64>,
    model: Option<String>,
    serial: Option<String>,
    rotational: Option<bool>,
    removable: Option<bool>,
}

#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct Tpm {
    present: bool,
    /// Where this was read: `tpm` (the TPM itself), `helper` (`bcd
    /// helper`'s words for its TPM, and sysfs), `sysfs` (when the TPM
    /// cannot be opened), or null.
    source: Option<&'static str>,
    /// `bcd helper`'s description of the TPM it holds (TCTI, maker,
    /// firmware), under `[helper]`.
    description: Option<String>,
    manufacturer: Option<String>,
    vendor: Option<String>,
    firmware: Option<String>,
    /// Hex SHA-256 of the EK's SubjectPublicKeyInfo (its certificate's key
    /// when there is one): what the control plane keys a TPM on.
    ek_sha256: Option<String>,
    /// The allocated PCR banks (`sha1`, `sha256`, …).
    pcr_banks: Vec<String>,
    /// Why the TPM itself was not read, when it was not.
    note: Option<String>,
}

pub(super) fn refresh(machine: &Machine) -> Done {
    let inventory = read(machine);
    match serde_json::to_vec(&inventory) {
        Ok(json) => Done::ok(
            format!(
                "{} NICs, {} block devices, tpm {}",
                inventory.nics.len(),
                inventory.block_devices.len(),
                inventory.tpm.source.unwrap_or("absent")
            ),
            &json,
        ),
        Err(e) => Done::failed(format!("cannot encode the inventory: {e}")),
    }
}

pub(super) fn read(machine: &Machine) -> Inventory {
    let mut unreadable = Vec::new();
    let sys = machine.sysfs.as_path();
    let mut dmi_field = |name: &str| {
        let rel = format!("class/dmi/id/{name}");
        read_noting(sys, &rel, &mut unreadable)
    };
    let mut dmi = Dmi {
        product_uuid: dmi_field("product_uuid")
            .map(|u| parse_product_uuid(&u))
            .filter(|u| !u.is_empty()),
        product_serial: dmi_field("product_serial"),
        sys_vendor: dmi_field("sys_vendor"),
        product_name: dmi_field("product_name"),
        bios_vendor: dmi_field("bios_vendor"),
        bios_version: dmi_field("bios_version"),
        bios_date: dmi_field("bios_date"),
    };
    let tpm = match &*machine.tpm {
        // Unprivileged: bcd helper reads what is root's.
        TpmAccess::Helper(helper) => match helper.machine() {
            Ok(m) => {
                let word = |s: String| Some(s).filter(|s| !s.is_empty());
                if dmi.product_uuid.is_none() {
                    dmi.product_uuid = word(parse_product_uuid(&m.product_uuid));
                }
                if dmi.product_serial.is_none() {
                    dmi.product_serial = word(m.product_serial);
                }
                unreadable.retain(|f| {
                    !(f.ends_with("/product_uuid") && dmi.product_uuid.is_some()
                        || f.ends_with("/product_serial") && dmi.product_serial.is_some())
                });
                Tpm {
                    present: true,
                    source: Some("helper"),
                    description: None,
                    manufacturer: word(m.manufacturer),
                    vendor: word(m.vendor),
                    firmware: word(m.firmware),
                    ek_sha256: Some(hex::encode(&m.ek_sha256)).filter(|h| !h.is_empty()),
                    pcr_banks: m.pcr_banks,
                    note: None,
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "bcd helper does not read the machine");
                tpm(sys, &machine.tpm)
            }
        },
        _ => tpm(sys, &machine.tpm),
    };
    Inventory {
        dmi,
        cpus: cpus(&machine.procfs),
        memory: Memory {
            total_bytes: mem_total(&machine.procfs),
        },
        nics: nics(sys),
        block_devices: block_devices(sys),
        tpm,
        unreadable,
    }
}

/// A file under `root`, or `None`; one that exists and cannot be read is
/// noted in `unreadable`. Empty values are `None`.
fn read_noting(root: &Path, rel: &str, unreadable: &mut Vec<String>) -> Option<String> {
    let path = root.join(rel);
    match read_small(&path) {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(printable(&v)),
        None => {
            if path.exists() {
                unreadable.push(rel.to_owned());
            }
            None
        }
    }
}

/// One line of machine text, safe to show.
fn printable(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(256).collect()
}

fn cpus(proc: &Path) -> Cpus {
    let Some(text) = read_small(&proc.join("cpuinfo")) else {
        return Cpus::default();
    };
    let mut cpus = Cpus::default();
    let mut packages = std::collections::BTreeSet::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "processor" => cpus.count += 1,
            "physical id" => {
                packages.insert(value.trim().to_owned());
            }
            "model name" if cpus.model.is_none() => cpus.model = Some(printable(value.trim())),
            _ => {}
        }
    }
    cpus.sockets = u32::try_from(packages.len()).unwrap_or(u32::MAX);
    cpus
}

fn mem_total(proc: &Path) -> Option<u64> {
    let text = read_small(&proc.join("meminfo"))?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line
        .trim_start_matches("MemTotal:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The directory entries of `dir`, sorted by name (none when absent).
pub(super) fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The last part of the link at `path` (a driver's name).
fn link_name(path: &Path) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    Some(printable(&target.file_name()?.to_string_lossy()))
}

fn nics(sys: &Path) -> Vec<Nic> {
    let net = sys.join("class/net");
    names(&net)
        .into_iter()
        .filter(|n| n != "lo")
        .map(|name| {
            let dir = net.join(&name);
            Nic {
                mac: read_small(&dir.join("address")).and_then(|a| parse_mac(&a)),
                driver: link_name(&dir.join("device/driver")),
                link: read_small(&dir.join("operstate")).map(|s| printable(&s)),
                // Unreadable (EINVAL) while the link is down.
                speed_mbps: read_small(&dir.join("speed"))
                    .and_then(|s| s.parse::<i64>().ok())
                    .and_then(|s| u64::try_from(s).ok()),
                virtual_: !dir.join("device").exists(),
                name: printable(&name),
            }
        })
        .collect()
}

/// Whether `/sys/block/<name>` is a disk of the inventory: not a loop, RAM
/// or zram disk (of no interest to commissioning), and not hidden (an NVMe
/// multipath controller path such as `nvme0c0n1`: the same namespace again,
/// with no `/dev` node; seen in scripts/pxetest's guest).
pub(super) fn disk(block: &Path, name: &str) -> bool {
    !["loop", "ram", "zram"].iter().any(|p| name.starts_with(p))
        && read_small(&block.join(name).join("hidden")).as_deref() != Some("1")
}

fn block_devices(sys: &Path) -> Vec<BlockDevice> {
    let block = sys.join("block");
    names(&block)
        .into_iter()
        .filter(|n| disk(&block, n))
        .map(|name| {
            let dir = block.join(&name);
            let flag = |rel: &str| read_small(&dir.join(rel)).map(|v| v == "1");
            BlockDevice {
                // `size` counts 512-byte sectors, whatever the device's own.
                size_bytes: read_small(&dir.join("size"))
                    .and_then(|s| s.parse::<u64>().ok())
                    .and_then(|s| s.checked_mul(512)),
                model: read_small(&dir.join("device/model"))
                    .filter(|m| !m.is_empty())
                    .map(|m| printable(&m)),
                serial: read_small(&dir.join("device/serial"))
                    .or_else(|| read_small(&dir.join("serial")))
                    .filter(|s| !s.is_empty())
                    .map(|s| printable(&s)),
                rotational: flag("queue/rotational"),
                removable: flag("removable"),
                name: printable(&name),
            }
        })
        .collect()
}

/// The TPM, read from the TPM when this process opens it, else what sysfs
/// shows (its PCR banks, on kernels since 5.12).
fn tpm(sys: &Path, access: &TpmAccess) -> Tpm {
    let mut description = None;
    let note = match access {
        TpmAccess::Direct(_) => match from_tpm(access) {
            Ok(t) => return t,
            Err(e) => format!("the TPM cannot be read: {e}"),
        },
        // An older helper (no machine.ids): the AK's answer names its TPM.
        TpmAccess::Helper(helper) => match helper.ak() {
            Ok(ak) => {
                description = Some(printable(&ak.tpm));
                "bcd node runs unprivileged through bcd helper: the TPM's EK is not read".to_owned()
            }
            Err(e) => format!("bcd helper does not answer: {e}"),
        },
        TpmAccess::Absent => "bcd uses no TPM on this machine".to_owned(),
    };
    let dir = sys.join("class/tpm/tpm0");
    if description.is_some() {
        return Tpm {
            present: true,
            source: Some("helper"),
            description,
            pcr_banks: pcr_banks(&dir),
            note: Some(note),
            ..Tpm::default()
        };
    }
    if !dir.exists() {
        return Tpm {
            note: Some(note),
            ..Tpm::default()
        };
    }
    Tpm {
        present: true,
        source: Some("sysfs"),
        pcr_banks: pcr_banks(&dir),
        note: Some(note),
        ..Tpm::default()
    }
}

/// The PCR banks sysfs shows (`pcr-sha256/`, kernels since 5.12).
fn pcr_banks(dir: &Path) -> Vec<String> {
    names(dir)
        .into_iter()
        .filter_map(|n| n.strip_prefix("pcr-").map(str::to_owned))
        .collect()
}

fn from_tpm(access: &TpmAccess) -> Result<Tpm, anyhow::Error> {
    let shared = access.open()?;
    let mut tpm = crate::keys::lock_tpm(&shared)?;
    let info = tpm.info()?;
    let ek = tpm.ek()?;
    let spki = crate::tpm::ek_spki_der(&ek);
    if let Err(e) = tpm.release_ek(&ek) {
        tracing::debug!(error = %e, "cannot flush the EK");
    }
    let banks = tpm.pcr_allocation()?;
    Ok(Tpm {
        present: true,
        source: Some("tpm"),
        manufacturer: Some(info.manufacturer.trim().to_owned()),
        vendor: Some(info.vendor),
        firmware: Some(info.firmware),
        ek_sha256: Some(hex::encode(bc_wire::sha256(&spki?))),
        pcr_banks: banks
            .0
            .iter()
            .filter(|(_, pcrs)| !pcrs.is_empty())
            .map(|(bank, _)| bank.name().to_owned())
            .collect(),
        description: None,
        note: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A small machine: DMI, two CPUs on one socket, 4 GiB, a NIC with a
    /// driver and a bridge, a disk, a loop device, and a TPM in sysfs.
    fn fake_machine(root: &Path) -> Machine {
        let sys = root.join("sys");
        let proc = root.join("proc");
        write(
            &sys,
            "class/dmi/id/product_uuid",
            "4C4C4544-0042-3510-8052-B4C04F4E4D32\n",
        );
        write(&sys, "class/dmi/id/product_serial", "SER123\n");
        write(&sys, "class/dmi/id/sys_vendor", "QEMU\n");
        write(&sys, "class/dmi/id/product_name", "Standard PC (Q35)\n");
        write(&sys, "class/dmi/id/bios_version", "1.16.3\n");
        write(
            &proc,
            "cpuinfo",
            "processor\t: 0\nphysical id\t: 0\nmodel name\t: Fake CPU @ 2GHz\n\nprocessor\t: 1\nphysical id\t: 0\nmodel name\t: Fake CPU @ 2GHz\n",
        );
        write(
            &proc,
            "meminfo",
            "MemTotal:        4194304 kB\nMemFree: 1 kB\n",
        );
        write(&sys, "class/net/lo/address", "00:00:00:00:00:00\n");
        write(&sys, "class/net/eth0/address", "52:54:00:AB:CD:EF\n");
        write(&sys, "class/net/eth0/operstate", "up\n");
        write(&sys, "class/net/eth0/speed", "1000\n");
        std::fs::create_dir_all(sys.join("drivers/virtio_net")).unwrap();
        std::fs::create_dir_all(sys.join("class/net/eth0/device")).unwrap();
        std::os::unix::fs::symlink(
            sys.join("drivers/virtio_net"),
            sys.join("class/net/eth0/device/driver"),
        )
        .unwrap();
        write(&sys, "class/net/br0/address", "52:54:00:00:00:01\n");
        write(&sys, "class/net/br0/operstate", "down\n");
        write(&sys, "class/net/br0/speed", "-1\n");
        write(&sys, "block/vda/size", "2097152\n");
        write(&sys, "block/vda/queue/rotational", "1\n");
        write(&sys, "block/vda/removable", "0\n");
        write(&sys, "block/vda/serial", "disk-serial\n");
        write(&sys, "block/vda/device/model", "QEMU HARDDISK   \n");
        write(&sys, "block/loop0/size", "0\n");
        // An NVMe multipath path of a namespace: hidden, not a disk.
        write(&sys, "block/nvme0c0n1/size", "2097152\n");
        write(&sys, "block/nvme0c0n1/hidden", "1\n");
        std::fs::create_dir_all(sys.join("class/tpm/tpm0/pcr-sha256")).unwrap();
        std::fs::create_dir_all(sys.join("class/tpm/tpm0/pcr-sha1")).unwrap();
        Machine {
            sysfs: sys,
            procfs: proc,
            devfs: root.join("dev"),
            data_dir: root.join("data"),
            config_path: root.join("config.toml"),
            tpm: Arc::new(TpmAccess::none()),
            role: bc_wire::agent::Role::Node,
            api: None,
        }
    }

    #[test]
    fn reads_a_fake_machine() {
        let dir = tempfile::tempdir().unwrap();
        let machine = fake_machine(dir.path());
        let inv = read(&machine);
        let json = serde_json::to_value(&inv).unwrap();
        assert_eq!(
            json["dmi"]["productUuid"],
            "4c4c4544-0042-3510-8052-b4c04f4e4d32"
        );
        assert_eq!(json["dmi"]["productSerial"], "SER123");
        assert_eq!(json["dmi"]["sysVendor"], "QEMU");
        assert_eq!(json["dmi"]["productName"], "Standard PC (Q35)");
        assert_eq!(json["dmi"]["biosVersion"], "1.16.3");
        assert_eq!(json["dmi"]["biosVendor"], serde_json::Value::Null);
        assert_eq!(json["cpus"]["count"], 2);
        assert_eq!(json["cpus"]["sockets"], 1);
        assert_eq!(json["cpus"]["model"], "Fake CPU @ 2GHz");
        assert_eq!(json["memory"]["totalBytes"], 4u64 << 30);
        assert_eq!(
            inv.nics,
            vec![
                Nic {
                    name: "br0".into(),
                    mac: Some("52:54:00:00:00:01".into()),
                    driver: None,
                    link: Some("down".into()),
                    speed_mbps: None,
                    virtual_: true,
                },
                Nic {
                    name: "eth0".into(),
                    mac: Some("52:54:00:ab:cd:ef".into()),
                    driver: Some("virtio_net".into()),
                    link: Some("up".into()),
                    speed_mbps: Some(1000),
                    virtual_: false,
                },
            ]
        );
        assert_eq!(
            inv.block_devices,
            vec![BlockDevice {
                name: "vda".into(),
                size_bytes: Some(1 << 30),
                model: Some("QEMU HARDDISK".into()),
                serial: Some("disk-serial".into()),
                rotational: Some(true),
                removable: Some(false),
            }]
        );
        assert_eq!(json["tpm"]["present"], true);
        assert_eq!(json["tpm"]["source"], "sysfs");
        assert_eq!(
            json["tpm"]["pcrBanks"],
            serde_json::json!(["sha1", "sha256"])
        );
        assert_eq!(json["tpm"]["ekSha256"], serde_json::Value::Null);
        assert!(inv.unreadable.is_empty());
        // The join's claims read the same machine the same way.
        let claims = crate::evidence::claims::collect_from(&machine.sysfs);
        assert_eq!(claims.product_uuid, json["dmi"]["productUuid"]);
        let macs: Vec<String> = inv.nics.iter().filter_map(|n| n.mac.clone()).collect();
        assert_eq!(claims.macs, macs);
    }

    /// Answers machine.ids with fixed words.
    struct Root;

    impl bc_helper::Backend for Root {
        fn ak(&mut self) -> Result<bc_helper::AkInfo, bc_helper::BackendError> {
            Err(bc_helper::BackendError("no AK".into()))
        }
        fn node_key(&mut self, _: &[u8; 32]) -> Result<Vec<u8>, bc_helper::BackendError> {
            Err(bc_helper::BackendError("no key".into()))
        }
        fn sign(
            &mut self,
            _: &[u8; 32],
            _: bc_helper::Hash,
            _: &[u8],
        ) -> Result<[u8; 64], bc_helper::BackendError> {
            Err(bc_helper::BackendError("no key".into()))
        }
        fn certify(
            &mut self,
            _: &[u8; 32],
            _: &[u8],
        ) -> Result<(Vec<u8>, Vec<u8>), bc_helper::BackendError> {
            Err(bc_helper::BackendError("no key".into()))
        }
        fn machine(
            &mut self,
        ) -> Result<bc_helper::proto::MachineResponse, bc_helper::BackendError> {
            Ok(bc_helper::proto::MachineResponse {
                product_uuid: "4C4C4544-0042-3510-8052-B4C04F4E4D32".into(),
                product_serial: "ROOTONLY".into(),
                ek_sha256: vec![0xab; 32],
                manufacturer: "IBM".into(),
                vendor: "SW TPM".into(),
                firmware: "2.0".into(),
                pcr_banks: vec!["sha256".into()],
            })
        }
    }

    /// Unprivileged, the node asks bcd helper for what is root's: DMI's
    /// identifiers and the TPM (its EK among them).
    #[test]
    fn through_the_helper_the_root_only_parts_come_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut machine = fake_machine(dir.path());
        for f in ["product_uuid", "product_serial"] {
            std::fs::remove_file(machine.sysfs.join("class/dmi/id").join(f)).unwrap();
        }
        let socket = dir.path().join("helper.sock");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(async { tokio::net::UnixListener::bind(&socket) })
            .unwrap();
        let me = nix::unistd::geteuid().as_raw();
        rt.spawn(bc_helper::serve(
            listener,
            Root,
            bc_helper::Allowed::root_and(me),
            bc_helper::Limits::default(),
            std::future::pending::<()>(),
        ));
        machine.tpm = Arc::new(TpmAccess::through_helper(&socket));
        let json = serde_json::to_value(read(&machine)).unwrap();
        assert_eq!(
            json["dmi"]["productUuid"],
            "4c4c4544-0042-3510-8052-b4c04f4e4d32"
        );
        assert_eq!(json["dmi"]["productSerial"], "ROOTONLY");
        assert_eq!(
            json["dmi"]["sysVendor"], "QEMU",
            "what the node reads itself"
        );
        assert_eq!(json["tpm"]["source"], "helper");
        assert_eq!(json["tpm"]["ekSha256"], "ab".repeat(32));
        assert_eq!(json["tpm"]["manufacturer"], "IBM");
        assert_eq!(json["tpm"]["pcrBanks"], serde_json::json!(["sha256"]));
        assert_eq!(json["unreadable"], serde_json::json!([]));
    }

    #[test]
    fn an_empty_tree_is_an_empty_inventory_and_unreadable_files_are_named() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mut machine = fake_machine(dir.path());
        let serial = machine.sysfs.join("class/dmi/id/product_serial");
        std::fs::set_permissions(&serial, std::fs::Permissions::from_mode(0o000)).unwrap();
        let inv = read(&machine);
        // Root reads it anyway.
        if inv.dmi.product_serial.is_none() {
            assert_eq!(inv.unreadable, vec!["class/dmi/id/product_serial"]);
        }
        machine.sysfs = dir.path().join("nothing");
        machine.procfs = dir.path().join("nothing");
        let inv = read(&machine);
        assert!(inv.nics.is_empty() && inv.block_devices.is_empty());
        assert_eq!(inv.cpus.count, 0);
        assert!(!inv.tpm.present);
        let d = refresh(&machine);
        assert_eq!(d.outcome, "0 NICs, 0 block devices, tpm absent");
    }
}
