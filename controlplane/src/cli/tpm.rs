//! The tpm attestor's operator commands: `ek-roots` (the makers' CAs an EK
//! certificate must chain to), `resolve` (the allow-list of EKs) and
//! `requests` (enrollment: TPMs waiting for an operator).

use bc_wire::AttestorId;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use bc_controlplane::attestors::tpm::ek;
use bc_controlplane::enroll;
use bc_controlplane::{pools, store};
use clap::Subcommand;
use serde_json::json;

use super::{open_db, print_line, print_list, print_stdout, Dir, ListArgs};

#[derive(Subcommand)]
pub(crate) enum EkRootsCmd {
    /// Add the CA certificates in PATH (a PEM or DER file, or a directory
    /// of them, as keylime's tpm_cert_store): each is a trust anchor,
    /// self-signed or not, unless --intermediate.
    Add {
        #[command(flatten)]
        dir: Dir,
        /// Keep the certificates as intermediates only: trusted through a
        /// path to an anchor, never an anchor themselves.
        #[arg(long)]
        intermediate: bool,
        /// Print a JSON array, one object per certificate kept or file skipped.
        #[arg(long)]
        json: bool,
        /// A PEM file with one or more CA certificates, one DER certificate,
        /// or a directory of such files (not read recursively; links, FIFOs,
        /// devices and subdirectories in it are skipped).
        #[arg(value_name = "PATH")]
        path: PathBuf,
    },
    /// List the trusted EK roots.
    List(ListArgs),
}

#[derive(Subcommand)]
pub(crate) enum ResolveCmd {
    /// Let the TPM with this EK join (replaces its entry if there is one).
    Add {
        #[command(flatten)]
        dir: Dir,
        /// SHA-256 of the EK's SubjectPublicKeyInfo (ekSha256 of bcd tpm identify).
        #[arg(long, value_name = "HEX")]
        ek_sha256: String,
        /// The pool a new node joins (default: default).
        #[arg(long, value_name = "ID")]
        pool: Option<String>,
        /// Join as this existing node instead of a new one.
        #[arg(long, value_name = "ID")]
        node: Option<String>,
        /// The new node is a site node of this site (id or name): it joins
        /// with role site, and only with it.
        #[arg(long, value_name = "SITE", conflicts_with = "node")]
        site: Option<String>,
        /// Admit this EK without an EK certificate (a TPM whose maker
        /// publishes none, such as AWS NitroTPM): the pin is the whole
        /// evidence of what the TPM is. A certificate it sends is still
        /// verified.
        #[arg(long)]
        uncertified: bool,
    },
    /// Remove the entry of an EK.
    Remove {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_name = "HEX")]
        ek_sha256: String,
    },
    /// List the entries.
    List(ListArgs),
}

#[derive(Subcommand)]
pub(crate) enum RequestsCmd {
    /// List join requests.
    List(ListArgs),
    /// Approve a pending request: the TPM's next join admits it once (a
    /// discovery request: that ramdisk's waiting join, once).
    Approve {
        #[command(flatten)]
        dir: Dir,
        /// The request id (req_…).
        id: String,
        /// The pool its node joins (default: default).
        #[arg(long, value_name = "P")]
        pool: Option<String>,
        /// Its node is a site node of this site (id or name): it joins with
        /// role site, and only with it.
        #[arg(long, value_name = "SITE")]
        site: Option<String>,
    },
    /// Deny a pending request: that TPM's joins are refused (a discovery
    /// request: that join, and the token and assertion it came with are
    /// spent; its boot entry stays open). With --entry: every pending
    /// request of that boot entry (of --source only, when given).
    Deny {
        #[command(flatten)]
        dir: Dir,
        /// The request id (req_…).
        #[arg(required_unless_present = "entry", conflicts_with = "entry")]
        id: Option<String>,
        /// Deny every pending discovery request of this boot entry (wf_…).
        #[arg(long, value_name = "WF")]
        entry: Option<String>,
        /// With --entry: only the requests from this source address.
        #[arg(long, value_name = "ADDR", requires = "entry")]
        source: Option<String>,
    },
}

/// A pool as the commands print it: `None` is the default pool.
fn pool_name(pool: Option<&str>) -> &str {
    pool.unwrap_or(pools::DEFAULT_POOL)
}

/// ` site=ID` for a place that names a site, else nothing.
fn site_part(site: Option<&str>) -> String {
    site.map(|s| format!(" site={s}")).unwrap_or_default()
}

pub(crate) fn run_ek_roots(cmd: EkRootsCmd) -> Result<()> {
    match cmd {
        EkRootsCmd::Add {
            dir,
            intermediate,
            json,
            path,
        } => {
            let kind = match intermediate {
                true => ek::RootKind::Intermediate,
                false => ek::RootKind::Anchor,
            };
            ek_roots_add(&dir.dir, &path, kind, json)
        }
        EkRootsCmd::List(ListArgs { dir, json }) => {
            let db = open_db(&dir.dir)?;
            let rows = ek::list_roots(&db).context("cannot list the EK roots")?;
            print_list(
                &rows,
                json,
                |r| {
                    json!({
                        "sha256": r.sha256,
                        "kind": r.kind.as_str(),
                        "subject": r.subject,
                        "notAfter": store::rfc3339(r.not_after),
                        "addedAt": store::rfc3339(r.added_at),
                    })
                },
                |r| {
                    Ok(format!(
                        "{} {} {} not_after={}",
                        r.sha256,
                        r.kind.as_str(),
                        r.subject,
                        store::rfc3339(r.not_after)
                    ))
                },
            )
        }
    }
}

/// Most files `ek-roots add` reads from a directory.
const MAX_DIR_FILES: usize = 1024;
/// Largest file `ek-roots add` reads (a bundle of every maker's CAs is
/// ~200 KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// What `ek-roots add` made of one file.
struct FileRoots {
    /// As given, or the directory's path joined with the file's name.
    file: PathBuf,
    /// The certificates to keep, or why the file is skipped.
    ders: Result<Vec<Vec<u8>>, String>,
}

/// One file's certificates, or why it is skipped. Only a regular file is
/// read (not a link, a FIFO, a device or a directory), and at most
/// [`MAX_FILE_BYTES`] of it: a directory of CAs is read unattended.
fn read_roots_file(file: &Path) -> Result<Vec<Vec<u8>>, String> {
    let bytes = bc_wire::file::read_regular(file, MAX_FILE_BYTES, bc_wire::file::Links::Refuse)
        .map_err(|e| e.to_string())?;
    ek::parse_roots(&bytes).map_err(|e| e.to_string())
}

/// The files of `path`: itself, or a directory's entries by name.
fn roots_files(path: &Path) -> Result<(bool, Vec<FileRoots>)> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_dir() {
        let ders = read_roots_file(path);
        return Ok((
            false,
            vec![FileRoots {
                file: path.to_owned(),
                ders,
            }],
        ));
    }
    let mut names = Vec::new();
    for entry in
        std::fs::read_dir(path).with_context(|| format!("cannot read {}", path.display()))?
    {
        let entry = entry.with_context(|| format!("cannot read {}", path.display()))?;
        names.push(entry.file_name());
        if names.len() > MAX_DIR_FILES {
            bail!(
                "{} holds more than {MAX_DIR_FILES} files: not an EK CA directory",
                path.display()
            );
        }
    }
    names.sort();
    let files = names
        .into_iter()
        .map(|name| {
            let file = path.join(name);
            let ders = read_roots_file(&file);
            FileRoots { file, ders }
        })
        .collect();
    Ok((true, files))
}

/// `ek-roots add`: one file's certificates all or nothing (a bad file is an
/// error); a directory's files each kept or skipped with the reason, at
/// least one certificate kept. Everything kept is written in one
/// transaction.
fn ek_roots_add(dir: &Path, path: &Path, kind: ek::RootKind, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let (is_dir, files) = roots_files(path)?;
    if !is_dir {
        if let Some(FileRoots { ders: Err(e), .. }) = files.first() {
            bail!("{}: {e}", path.display());
        }
    }
    let mut ders = Vec::new();
    let mut owners = Vec::new();
    for (i, f) in files.iter().enumerate() {
        for der in f.ders.iter().flatten() {
            ders.push(der.clone());
            owners.push(i);
        }
    }
    if ders.is_empty() {
        let why: Vec<String> = files
            .iter()
            .filter_map(|f| {
                f.ders
                    .as_ref()
                    .err()
                    .map(|e| format!("{}: {e}", f.file.display()))
            })
            .collect();
        bail!(
            "no CA certificate in {}{}",
            path.display(),
            if why.is_empty() {
                " (it is empty)".to_owned()
            } else {
                format!(" ({})", why.join("; "))
            }
        );
    }
    let added = ek::add_roots(&db, &ders, kind).context("cannot add the EK roots")?;
    let mut rows: Vec<(usize, serde_json::Value, String)> = Vec::new();
    for (owner, (root, what)) in owners.iter().zip(added) {
        let file = files[*owner].file.display().to_string();
        rows.push((
            *owner,
            json!({
                "file": file,
                "status": what.as_str(),
                "sha256": root.sha256,
                "kind": root.kind.as_str(),
                "subject": root.subject,
                "notAfter": store::rfc3339(root.not_after),
            }),
            format!(
                "{file}: {} {} {} {}",
                what.as_str(),
                root.sha256,
                root.kind.as_str(),
                root.subject
            ),
        ));
    }
    for (i, f) in files.iter().enumerate() {
        if let Err(why) = &f.ders {
            let file = f.file.display().to_string();
            rows.push((
                i,
                json!({ "file": file, "status": "skipped", "reason": why }),
                format!("{file}: skipped: {why}"),
            ));
        }
    }
    rows.sort_by_key(|(i, _, _)| *i);
    if as_json {
        let v: Vec<_> = rows.into_iter().map(|(_, j, _)| j).collect();
        let text = serde_json::to_string_pretty(&v).context("cannot encode JSON")?;
        return print_line(&text);
    }
    let mut out = String::new();
    for (_, _, line) in rows {
        out.push_str(&line);
        out.push('\n');
    }
    print_stdout(&out)
}

/// " uncertified" for an entry that admits its EK without a certificate.
fn uncertified_part(uncertified: bool) -> &'static str {
    match uncertified {
        true => " uncertified",
        false => "",
    }
}

pub(crate) fn run_resolve(cmd: ResolveCmd) -> Result<()> {
    match cmd {
        ResolveCmd::Add {
            dir,
            ek_sha256,
            pool,
            node,
            site,
            uncertified,
        } => {
            let db = open_db(&dir.dir)?;
            let target = enroll::ResolveTarget {
                pool: pool.as_deref(),
                node: node.as_deref(),
                site: site.as_deref(),
                uncertified,
            };
            let (entry, replaced) = enroll::add_resolve(&db, &ek_sha256, target)?;
            print_line(&format!(
                "{} {} pool={} node={}{}{}",
                if replaced { "replaced" } else { "added" },
                entry.ek_sha256,
                pool_name(entry.pool_id.as_deref()),
                entry.node_id.as_deref().unwrap_or("new"),
                site_part(entry.site_id.as_deref()),
                uncertified_part(entry.uncertified),
            ))
        }
        ResolveCmd::Remove { dir, ek_sha256 } => {
            let db = open_db(&dir.dir)?;
            if !enroll::remove_resolve(&db, &ek_sha256)? {
                bail!("NOT_FOUND: no resolve entry for {ek_sha256}")
            }
            print_line(&format!("removed {}", ek_sha256.to_ascii_lowercase()))
        }
        ResolveCmd::List(ListArgs { dir, json }) => {
            let db = open_db(&dir.dir)?;
            let rows = enroll::list_resolve(&db).context("cannot list the resolve entries")?;
            print_list(
                &rows,
                json,
                |r| {
                    json!({
                        "ekSha256": r.ek_sha256,
                        "pool": pool_name(r.pool_id.as_deref()),
                        "nodeId": r.node_id,
                        "site": r.site_id,
                        "uncertified": r.uncertified,
                        "createdAt": store::rfc3339(r.created_at),
                    })
                },
                |r| {
                    Ok(format!(
                        "{} pool={} node={}{}{}",
                        r.ek_sha256,
                        pool_name(r.pool_id.as_deref()),
                        r.node_id.as_deref().unwrap_or("new"),
                        site_part(r.site_id.as_deref()),
                        uncertified_part(r.uncertified),
                    ))
                },
            )
        }
    }
}

pub(crate) fn run_requests(cmd: RequestsCmd) -> Result<()> {
    match cmd {
        RequestsCmd::List(ListArgs { dir, json }) => requests_list(&dir.dir, json),
        RequestsCmd::Approve {
            dir,
            id,
            pool,
            site,
        } => {
            let db = open_db(&dir.dir)?;
            let row = enroll::approve(&db, &id, pool.as_deref(), site.as_deref())?;
            if row.attestor == AttestorId::Discovery {
                return print_line(&format!(
                    "approved {}: the waiting ramdisk of boot entry {} (mac {}) joins at its next try",
                    row.id,
                    row.workflow_id.as_deref().unwrap_or("-"),
                    row.mac.as_deref().unwrap_or("-")
                ));
            }
            print_line(&format!(
                "approved {} (pool {}{})",
                row.id,
                pool_name(row.pool_id.as_deref()),
                row.site_id
                    .as_deref()
                    .map(|s| format!(", site {s}"))
                    .unwrap_or_default()
            ))
        }
        RequestsCmd::Deny {
            dir,
            id,
            entry,
            source,
        } => {
            let db = open_db(&dir.dir)?;
            let (Some(id), None) = (id, entry.as_deref()) else {
                let wf = entry.as_deref().unwrap_or_default();
                return deny_entry(&db, wf, source.as_deref());
            };
            let row = enroll::deny(&db, &id)?;
            match row.workflow_id.as_deref() {
                Some(wf) => print_line(&format!(
                    "denied {}: its join is refused, its token and assertion are spent; boot entry {wf} stays open for the real machine",
                    row.id
                )),
                None => print_line(&format!("denied {}", row.id)),
            }
        }
    }
}

/// `requests deny --entry WF [--source ADDR]`: one line per request denied.
fn deny_entry(db: &store::Store, wf: &str, source: Option<&str>) -> Result<()> {
    let source = source
        .map(|s| {
            s.parse::<std::net::IpAddr>()
                .map(|ip| ip.to_string())
                .with_context(|| format!("--source must be an IP address, not {s:?}"))
        })
        .transpose()?;
    let rows = enroll::deny_entry(db, wf, source.as_deref())?;
    let from = source.map(|s| format!(" from {s}")).unwrap_or_default();
    if rows.is_empty() {
        return print_line(&format!("boot entry {wf} has no pending request{from}"));
    }
    for row in &rows {
        print_line(&format!(
            "denied {} (source {}, ek {})",
            row.id,
            row.source.as_deref().unwrap_or("-"),
            row.ek_sha256.as_deref().unwrap_or(NO_TPM)
        ))?;
    }
    print_line(&format!(
        "denied {} pending request(s) of boot entry {wf}{from}: their joins are refused, their tokens and assertions spent; the entry stays open for the real machine",
        rows.len()
    ))
}

/// A request's EK as `requests list` prints it: the hash, or "no TPM" for
/// a discovery join whose ramdisk proved none.
const NO_TPM: &str = "no TPM";

fn requests_list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = enroll::list_requests(&db).context("cannot list join requests")?;
    print_list(
        &rows,
        as_json,
        |r| {
            let mut v = json!({
                "id": r.id,
                "attestor": r.attestor.as_str(),
                "ekSha256": r.ek_sha256,
                "status": r.status.as_str(),
                "createdAt": store::rfc3339(r.created_at),
                "decidedAt": r.decided_at.map(store::rfc3339),
                "pool": pool_name(r.pool_id.as_deref()),
                "site": r.site_id,
                "ekIssuer": r.ek_issuer,
                "ekSerial": r.ek_serial,
                "used": r.used_at.is_some(),
            });
            if r.attestor == AttestorId::Discovery {
                v["workflowId"] = json!(r.workflow_id);
                v["mac"] = json!(r.mac);
                v["productUuid"] = json!(r.product_uuid);
                v["ek"] = json!(r.ek_sha256.as_deref().unwrap_or(NO_TPM));
                v["source"] = json!(r.source);
                v["nodeKeySha256"] = json!(r.node_key_sha256);
                v["tokenId"] = json!(r.token_id);
            }
            v
        },
        |r| {
            let state = format!(
                "{} {}{}",
                r.id,
                r.status,
                if r.used_at.is_some() { " (used)" } else { "" }
            );
            let ek = r.ek_sha256.as_deref().unwrap_or(NO_TPM);
            if r.attestor == AttestorId::Discovery {
                return Ok(format!(
                    "{state} discovery entry={} mac={} uuid={} ek={ek} source={}{} created={} token={} node_key={}",
                    r.workflow_id.as_deref().unwrap_or("-"),
                    r.mac.as_deref().unwrap_or("-"),
                    r.product_uuid.as_deref().unwrap_or("-"),
                    r.source.as_deref().unwrap_or("-"),
                    site_part(r.site_id.as_deref()),
                    store::rfc3339(r.created_at),
                    r.token_id.as_deref().unwrap_or("-"),
                    r.node_key_sha256.as_deref().map_or("-", |k| k.get(..16).unwrap_or(k)),
                ));
            }
            Ok(format!(
                "{state} ek={ek} pool={}{} created={} issuer={:?}",
                pool_name(r.pool_id.as_deref()),
                site_part(r.site_id.as_deref()),
                store::rfc3339(r.created_at),
                r.ek_issuer
            ))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::time::Duration;

    const ROOT: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../wire/src/ekcert/testdata/real/stm-tpm-ek-root-ca-f8e37a86.pem"
    );

    /// `roots_files` on another thread: on a FIFO it used to block for
    /// ever, on a link to /dev/zero to read until memory ran out.
    fn roots_files_within(path: &Path, limit: Duration) -> (bool, Vec<FileRoots>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let path = path.to_owned();
        std::thread::spawn(move || {
            let _ = tx.send(roots_files(&path).map_err(|e| e.to_string()));
        });
        rx.recv_timeout(limit)
            .expect("roots_files did not finish")
            .unwrap()
    }

    #[test]
    fn ek_roots_dir_skips_what_is_not_a_regular_file_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let root = std::fs::read(ROOT).unwrap();
        std::fs::write(d.join("a-root.pem"), &root).unwrap();
        let ok = std::process::Command::new("mkfifo")
            .arg(d.join("b-fifo"))
            .status()
            .unwrap();
        assert!(ok.success());
        symlink("/dev/zero", d.join("c-zero")).unwrap();
        symlink(d.join("a-root.pem"), d.join("d-link.pem")).unwrap();
        std::fs::write(d.join("e-big.pem"), vec![b'x'; MAX_FILE_BYTES as usize + 1]).unwrap();
        std::fs::create_dir(d.join("f-dir")).unwrap();
        std::fs::write(d.join("g-root.der"), &ek::parse_roots(&root).unwrap()[0]).unwrap();

        let (is_dir, files) = roots_files_within(d, Duration::from_secs(20));
        assert!(is_dir);
        let got: Vec<(String, Result<usize, String>)> = files
            .iter()
            .map(|f| {
                (
                    f.file.file_name().unwrap().to_string_lossy().into_owned(),
                    f.ders.as_ref().map(Vec::len).map_err(Clone::clone),
                )
            })
            .collect();
        let link = "it is a symbolic link, which is not followed here: name the file itself";
        assert_eq!(
            got,
            vec![
                ("a-root.pem".into(), Ok(1)),
                (
                    "b-fifo".into(),
                    Err("it is a FIFO, not a regular file".into())
                ),
                ("c-zero".into(), Err(link.into())),
                ("d-link.pem".into(), Err(link.into())),
                (
                    "e-big.pem".into(),
                    Err(format!("it is larger than {MAX_FILE_BYTES} bytes"))
                ),
                (
                    "f-dir".into(),
                    Err("it is a directory, not a regular file".into())
                ),
                ("g-root.der".into(), Ok(1)),
            ]
        );

        // A single file named on the command line: the same reasons.
        for (name, why) in [
            ("b-fifo", "FIFO"),
            ("c-zero", "symbolic link"),
            ("e-big.pem", "larger than"),
        ] {
            let (is_dir, files) = roots_files_within(&d.join(name), Duration::from_secs(20));
            assert!(!is_dir);
            let e = files[0].ders.as_ref().unwrap_err();
            assert!(e.contains(why), "{name}: {e}");
        }
    }
}
