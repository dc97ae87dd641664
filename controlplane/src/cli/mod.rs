//! The commands of `bc-controlplane`, one module per command group, and what
//! they share: the DIR argument, opening it, and printing to stdout.
//!
//! Output is part of the interface (scripts and the e2e tests read it):
//! every list command prints one line per row, or a JSON array with `--json`.

pub(crate) mod bootlog;
pub(crate) mod clock;
pub(crate) mod cloud;
pub(crate) mod commands;
pub(crate) mod dist;
pub(crate) mod events;
pub(crate) mod images;
pub(crate) mod install_script;
pub(crate) mod leases;
pub(crate) mod migrate;
pub(crate) mod nodes;
pub(crate) mod pools;
pub(crate) mod server;
pub(crate) mod sites;
pub(crate) mod tenants;
pub(crate) mod tokens;
pub(crate) mod tpm;
pub(crate) mod user_data;
pub(crate) mod workflows;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use bc_controlplane::{config, pki, store};
use clap::Args;

#[derive(Args)]
pub(crate) struct Dir {
    /// The control plane directory (PKI bundle and controlplane.db).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// The arguments of every `list` command.
#[derive(Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    pub dir: Dir,
    /// Print a JSON array instead of one line per row.
    #[arg(long)]
    pub json: bool,
}

/// Every command but `init` needs an initialized DIR; without this check a
/// typo in --dir would silently create an empty database somewhere.
pub(crate) fn require_initialized(dir: &Path) -> Result<()> {
    if !dir.join(pki::TRUST_DOMAIN_FILE).is_file() {
        bail!(
            "{} is not a control plane directory (no {}); run bc-controlplane init --dir {} first",
            dir.display(),
            pki::TRUST_DOMAIN_FILE,
            dir.display()
        );
    }
    Ok(())
}

/// What `--database-url` (a global flag: every command takes it) and the
/// `BC_CONTROLPLANE_DATABASE_*` variables say, set once by `main` after
/// parsing; [`load_config`] applies it, so no command can forget it.
static DATABASE: OnceLock<config::DatabaseOverrides> = OnceLock::new();

/// Records the command line's and the environment's database settings
/// (`flag`: `--database-url`). The URL is checked when a command opens the
/// database, by the same checks as `[database] url`.
pub(crate) fn set_database(flag: Option<String>) -> Result<()> {
    let overrides = config::DatabaseOverrides::from_env(flag)?;
    // Set once, by main; a second call would change nothing.
    let _ = DATABASE.set(overrides);
    Ok(())
}

/// DIR's `controlplane.toml` with the database the command line and the
/// environment name: the one way every command reads it.
pub(crate) fn load_config(dir: &Path) -> Result<config::Config> {
    let overrides = DATABASE.get().cloned().unwrap_or_default();
    Ok(config::load_with(dir, &overrides)?)
}

/// Opens DIR's database, after checking DIR and its `controlplane.toml`
/// (a broken config is reported by every command, not only by `serve`).
pub(crate) fn open_db(dir: &Path) -> Result<store::Store> {
    require_initialized(dir)?;
    let config = load_config(dir)?;
    store::Store::open_configured(dir, config.database.as_ref())
        .with_context(|| format!("cannot open the database in {}", dir.display()))
}

/// An exit status other than 1 that a command chose (`migrate --check`:
/// 3, migrations pending), with the message for stderr.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct ExitWith {
    pub code: u8,
    pub message: String,
}

/// The database's time: what every "expired" a command prints is judged by.
pub(crate) fn db_now(db: &store::Store) -> Result<store::UnixMs> {
    db.read(|tx| tx.now())
        .context("cannot read the database clock")
}

/// Prints `rows` as a JSON array (`--json`), else one `line` per row.
pub(crate) fn print_list<T>(
    rows: &[T],
    as_json: bool,
    json: impl Fn(&T) -> serde_json::Value,
    line: impl Fn(&T) -> Result<String>,
) -> Result<()> {
    if as_json {
        let v: Vec<_> = rows.iter().map(json).collect();
        let text = serde_json::to_string_pretty(&v).context("cannot encode JSON")?;
        return print_line(&text);
    }
    let mut text = String::new();
    for r in rows {
        text.push_str(&line(r)?);
        text.push('\n');
    }
    print_stdout(&text)
}

/// `<done> <id>`, or `<id> was already <done>` when nothing changed.
pub(crate) fn print_change(changed: bool, done: &str, id: &str) -> Result<()> {
    if changed {
        print_line(&format!("{done} {id}"))
    } else {
        print_line(&format!("{id} was already {done}"))
    }
}

/// One line on stdout.
pub(crate) fn print_line(line: &str) -> Result<()> {
    print_stdout(&format!("{line}\n"))
}

/// Writes to stdout and reports a closed pipe as an error instead of
/// panicking like `print!` would.
pub(crate) fn print_stdout(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("cannot write to stdout")
}
