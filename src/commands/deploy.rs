//! `deploy.image` (the commissioning ramdisk only): streams an image
//! registered with the control plane (`GET /v1/images/<name>`, over the
//! node's pinned mTLS) onto a disk, decoding zstd on the way, and checks
//! it: no more than the command's `bytes`, and the SHA-256 of what was
//! written, then of what reads back from the disk, must be the `sha256` the
//! signed command pins. Any failure once the disk was written to (a digest
//! that differs, a transfer cut, a write error) wipes the disk with
//! `disk.wipe`'s code: it is never left half bootable, and the outcome says
//! so.
//!
//! With `seed` it then fetches the node's NoCloud seed (`GET
//! /v1/deploy/seed`, its SHA-256 pinned too), finds the filesystem on the
//! disk holding `/etc/cloud`, and writes `var/lib/cloud/seed/nocloud/`
//! `user-data` and `meta-data` there (0600). The seed carries a single-use
//! token: it is never logged, never in an outcome or an error.
//!
//! The disk passes `disk.wipe`'s checks first (of the inventory, not
//! mounted, not swap, not held, opened `O_EXCL`).
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::Path;

use bc_wire::agent::Role;
use bc_wire::command::args::Args;
use sha2::{Digest, Sha256};

use super::{disk, mount, ApiAccess, Done, Machine};

/// What is read and written at a time.
const BLOCK: usize = 1 << 20;
/// The largest seed document the control plane serves.
const MAX_SEED: usize = 256 * 1024;
/// Where cloud-init's NoCloud datasource looks, under the image's root.
const SEED_DIR: &str = "var/lib/cloud/seed/nocloud";

pub(super) fn image(machine: &Machine, args: &Args) -> Done {
    if machine.role != Role::Ramdisk {
        return Done::failed("refused: only the commissioning ramdisk deploys images");
    }
    let (Some(device), Some(name), Some(sha256), Some(bytes)) = (
        args.get("disk"),
        args.get("image"),
        args.get("sha256"),
        args.number("bytes"),
    ) else {
        return Done::failed("bad-args: disk, image, sha256 and bytes are required");
    };
    let zstd = args.get("compression") == Some("zstd");
    let dev = device.strip_prefix("/dev/").unwrap_or(device);
    if let Err(why) = disk::check(machine, dev) {
        return Done::failed(format!("refused: {device}: {why}; nothing was written"));
    }
    let Some(api) = machine.api.as_deref() else {
        return Done::failed("this bcd has no control plane to fetch images from");
    };
    let path = machine.devfs.join(dev);
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_EXCL)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) => {
            return Done::failed(format!(
                "refused: cannot open {device} exclusively ({e}); nothing was written"
            ))
        }
    };
    let size = match disk::size(&file) {
        Ok(s) => s,
        Err(e) => return Done::failed(format!("cannot find the size of {device}: {e}")),
    };
    if bytes > size {
        return Done::failed(format!(
            "refused: the image is {bytes} bytes, {device} only {size}; nothing was written"
        ));
    }
    let body = match api.get(&format!("{}{name}", bc_wire::endpoints::IMAGES)) {
        Ok(b) => b,
        Err(e) => {
            return Done::failed(format!(
                "cannot fetch image {name}: {e}; nothing was written"
            ))
        }
    };
    tracing::info!(image = name, device, bytes, zstd, "deploying an image");
    let written = match write_image(&file, body, zstd, bytes) {
        Ok(digest) if digest == sha256 => read_back(&file, bytes).and_then(|back| {
            (back == sha256)
                .then_some(())
                .ok_or_else(|| "image digest mismatch: the disk reads back other bytes".to_owned())
        }),
        Ok(_) => Err(
            "image digest mismatch: the image received is not the one the command pins".to_owned(),
        ),
        Err(e) => Err(e),
    };
    if let Err(why) = written {
        return wiped(machine, dev, &why);
    }
    disk::reread_partitions(&file, device);
    drop(file);
    let mut outcome = format!("deployed {name} to {device} ({bytes} bytes, sha256 verified)");
    if let Some(seed_sha256) = args.get("seed") {
        match seed(machine, api, dev, seed_sha256) {
            Ok(at) => outcome.push_str(&format!("; NoCloud seed written on {at}")),
            Err(why) => return wiped(machine, dev, &why),
        }
    }
    let output = serde_json::json!({
        "device": device, "image": name, "bytes": bytes, "sha256": sha256,
        "seed": args.get("seed").is_some(),
    });
    Done::ok(outcome, output.to_string().as_bytes())
}

/// Wipes `dev` after a failed deploy; the outcome says what failed and
/// that nothing bootable is left (or, if the wipe failed too, that).
fn wiped(machine: &Machine, dev: &str, why: &str) -> Done {
    let w = disk::wipe_one(machine, dev);
    match w.error {
        None => Done::failed(format!("{why}: the disk was wiped, nothing bootable left")),
        Some(e) => Done::failed(format!(
            "{why}; wiping /dev/{dev} failed too ({e}): do not boot from it, wipe it again"
        )),
    }
}

/// Writes `body` (decoded when `zstd`) from offset 0, at most `bytes`
/// bytes; the SHA-256 of what was written.
fn write_image(file: &File, body: Box<dyn Read>, zstd: bool, bytes: u64) -> Result<String, String> {
    let mut reader: Box<dyn Read> = if zstd {
        Box::new(bc_wire::image::Decoder::new(io::BufReader::with_capacity(
            BLOCK, body,
        )))
    } else {
        body
    };
    let mut hash = Sha256::new();
    let mut at = 0u64;
    let mut buf = vec![0u8; BLOCK];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("the image transfer failed at byte {at}: {e}")),
        };
        if at + n as u64 > bytes {
            return Err(format!(
                "the image is larger than its recorded {bytes} bytes"
            ));
        }
        file.write_all_at(&buf[..n], at)
            .map_err(|e| format!("cannot write the disk at byte {at}: {e}"))?;
        hash.update(&buf[..n]);
        at += n as u64;
    }
    if at != bytes {
        return Err(format!(
            "image digest mismatch: {at} bytes received, {bytes} recorded"
        ));
    }
    file.sync_all()
        .map_err(|e| format!("cannot sync the disk: {e}"))?;
    Ok(hex::encode(hash.finalize()))
}

/// The SHA-256 of the disk's first `bytes`, read from the device (its
/// cached pages dropped first).
fn read_back(file: &File, bytes: u64) -> Result<String, String> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: advice only, on an open descriptor.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; BLOCK];
    let mut at = 0u64;
    while at < bytes {
        let n = usize::try_from((bytes - at).min(BLOCK as u64)).unwrap_or(BLOCK);
        file.read_exact_at(&mut buf[..n], at)
            .map_err(|e| format!("cannot read the disk back at byte {at}: {e}"))?;
        hash.update(&buf[..n]);
        at += n as u64;
    }
    Ok(hex::encode(hash.finalize()))
}

/// The seed's two files, from its document (public for the `deploy_seed`
/// fuzz target, which feeds [`Seed::parse`] hostile documents).
#[derive(Debug, PartialEq, Eq)]
pub struct Seed {
    user_data: String,
    meta_data: String,
}

impl Seed {
    /// The document, which must hash to `sha256`. Errors never quote it.
    pub fn parse(doc: &[u8], sha256: &str) -> Result<Seed, String> {
        if hex::encode(Sha256::digest(doc)) != sha256 {
            return Err(
                "seed digest mismatch: the seed received is not the one the command pins".into(),
            );
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Doc {
            #[serde(rename = "user-data")]
            user_data: String,
            #[serde(rename = "meta-data")]
            meta_data: String,
        }
        let not_seed = || "the seed is not {\"user-data\", \"meta-data\"} JSON".to_owned();
        // A struct also deserializes from a JSON array, which the control
        // plane never stores as a seed.
        if doc.trim_ascii_start().first() != Some(&b'{') {
            return Err(not_seed());
        }
        let d: Doc = serde_json::from_slice(doc).map_err(|_| not_seed())?;
        Ok(Seed {
            user_data: d.user_data,
            meta_data: d.meta_data,
        })
    }

    /// Writes the NoCloud files under `root` (an image's mounted root).
    pub(super) fn write(&self, root: &Path) -> Result<(), String> {
        use std::os::unix::fs::DirBuilderExt as _;
        let dir = root.join(SEED_DIR);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .map_err(|e| format!("cannot create {SEED_DIR} on the image: {e}"))?;
        for (name, text) in [
            ("user-data", &self.user_data),
            ("meta-data", &self.meta_data),
        ] {
            let path = dir.join(name);
            let _ = std::fs::remove_file(&path);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| format!("cannot create {SEED_DIR}/{name} on the image: {e}"))?;
            io::Write::write_all(&mut f, text.as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| format!("cannot write {SEED_DIR}/{name} on the image: {e}"))?;
        }
        Ok(())
    }
}

/// Fetches and checks the seed, then writes it on the filesystem of `dev`
/// that holds `/etc/cloud`; where it went (`/dev/vda1`).
fn seed(machine: &Machine, api: &ApiAccess, dev: &str, sha256: &str) -> Result<String, String> {
    let mut doc = Vec::new();
    api.get(bc_wire::endpoints::DEPLOY_SEED)
        .map_err(|e| format!("cannot fetch the NoCloud seed: {e}"))?
        .take(MAX_SEED as u64 + 1)
        .read_to_end(&mut doc)
        .map_err(|e| format!("cannot fetch the NoCloud seed: {e}"))?;
    if doc.len() > MAX_SEED {
        return Err(format!("the NoCloud seed is larger than {MAX_SEED} bytes"));
    }
    let seed = Seed::parse(&doc, sha256)?;
    let found = mount::each_filesystem(machine, dev, false, |root| {
        root.join("etc/cloud").is_dir().then(|| seed.write(root))
    })?;
    match found {
        Some((at, Ok(()))) => Ok(at),
        Some((_, Err(e))) => Err(e),
        None => Err(format!(
            "no filesystem on /dev/{dev} holds /etc/cloud (an image without cloud-init?), so the NoCloud seed has nowhere to go"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only an object is a seed, as the control plane checks it (the
    /// `deploy_seed` fuzz target's finding: serde reads a struct from an
    /// array too).
    #[test]
    fn an_array_is_not_a_seed() {
        let doc = br##" ["#cloud-config\n", "instance-id: n\n"]"##;
        let e = Seed::parse(doc, &hex::encode(Sha256::digest(doc))).unwrap_err();
        assert!(e.starts_with("the seed is not"), "{e}");
    }

    #[test]
    fn a_seed_is_checked_and_written_0600() {
        let doc = br##"{"user-data":"#cloud-config\nx: 1\n","meta-data":"instance-id: n\n"}"##;
        let sha = hex::encode(Sha256::digest(doc));
        let e = Seed::parse(doc, &"0".repeat(64)).unwrap_err();
        assert!(e.starts_with("seed digest mismatch"), "{e}");
        let bad = br#"{"user-data":"secret-token-text"}"#;
        let e = Seed::parse(bad, &hex::encode(Sha256::digest(bad))).unwrap_err();
        assert!(!e.contains("secret-token-text"), "{e}");
        let seed = Seed::parse(doc, &sha).unwrap();
        let root = tempfile::tempdir().unwrap();
        seed.write(root.path()).unwrap();
        seed.write(root.path()).unwrap(); // again: replaced
        use std::os::unix::fs::PermissionsExt as _;
        let ud = root.path().join(SEED_DIR).join("user-data");
        assert_eq!(
            std::fs::read_to_string(&ud).unwrap(),
            "#cloud-config\nx: 1\n"
        );
        assert_eq!(ud.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        let md = root.path().join(SEED_DIR).join("meta-data");
        assert_eq!(std::fs::read_to_string(md).unwrap(), "instance-id: n\n");
    }

    #[test]
    fn writes_at_most_bytes_and_hashes_what_it_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        std::fs::write(&path, vec![9u8; 4096]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let raw = vec![5u8; 3000];
        let digest =
            write_image(&file, Box::new(io::Cursor::new(raw.clone())), false, 3000).unwrap();
        assert_eq!(digest, hex::encode(Sha256::digest(&raw)));
        assert_eq!(read_back(&file, 3000).unwrap(), digest);
        let e =
            write_image(&file, Box::new(io::Cursor::new(raw.clone())), false, 2000).unwrap_err();
        assert!(e.contains("larger than its recorded 2000"), "{e}");
        let e = write_image(&file, Box::new(io::Cursor::new(raw)), false, 3001).unwrap_err();
        assert!(e.starts_with("image digest mismatch"), "{e}");
        let z = ruzstd::encoding::compress_to_vec(
            &[1u8; 5000][..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        let digest = write_image(&file, Box::new(io::Cursor::new(z)), true, 5000).unwrap();
        assert_eq!(digest, hex::encode(Sha256::digest([1u8; 5000])));
    }
}
