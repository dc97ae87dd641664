//! `migrate`: brings DIR's database (SQLite or PostgreSQL) to this build's
//! schema, under the same lock `serve` takes at start (SQLite's `BEGIN
//! IMMEDIATE`, PostgreSQL's advisory lock), so that it can run before a
//! rollout while replicas still serve. `--check` applies nothing: a rolling
//! upgrade asks it before its first new replica starts.

use std::path::Path;

use anyhow::{Context, Result};
use bc_controlplane::store;
use clap::Args;
use serde_json::json;

use super::{load_config, open_db, print_line, require_initialized, Dir, ExitWith};

/// `migrate --check`'s exit status when migrations are pending (1 stays
/// "something failed": an unreachable server, a database too new).
pub(crate) const PENDING_EXIT: u8 = 3;

#[derive(Args)]
pub(crate) struct MigrateArgs {
    #[command(flatten)]
    pub dir: Dir,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,
    /// Apply nothing; exit 3 when migrations are pending, 0 when the
    /// database is at this build's version.
    #[arg(long)]
    pub check: bool,
}

pub(crate) fn run(args: MigrateArgs) -> Result<()> {
    if args.check {
        check(&args.dir.dir, args.json)
    } else {
        migrate(&args.dir.dir, args.json)
    }
}

fn backend(db_is_pg: bool) -> &'static str {
    if db_is_pg {
        "postgres"
    } else {
        "sqlite"
    }
}

fn migrate(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let change = db.migrated();
    if as_json {
        let v = json!({
            "backend": backend(db.path().is_none()),
            "database": db.describe(),
            "from": change.from,
            "to": change.to,
            "applied": change.to - change.from,
        });
        return print_line(&v.to_string());
    }
    if change.from == change.to {
        print_line(&format!(
            "{}: already at schema version {}",
            db.describe(),
            change.to
        ))
    } else {
        print_line(&format!(
            "{}: schema version {} → {}",
            db.describe(),
            change.from,
            change.to
        ))
    }
}

fn check(dir: &Path, as_json: bool) -> Result<()> {
    require_initialized(dir)?;
    let config = load_config(dir)?;
    let (version, database) = store::pending_version(dir, config.database.as_ref())
        .with_context(|| format!("cannot read the schema version in {}", dir.display()))?;
    let latest = store::schema_version();
    let pending = latest - version.min(latest);
    if as_json {
        let v = json!({
            "backend": backend(config.database.is_some()),
            "database": database,
            "version": version,
            "latest": latest,
            "pending": pending,
        });
        print_line(&v.to_string())?;
    } else if pending == 0 {
        print_line(&format!(
            "{database}: at schema version {latest}, nothing to migrate"
        ))?;
    }
    if pending == 0 {
        return Ok(());
    }
    Err(ExitWith {
        code: PENDING_EXIT,
        message: format!(
            "{database}: schema version {version}, this bc-controlplane's is {latest}: \
             {pending} migration(s) pending (bc-controlplane migrate --dir {} applies them; \
             serve applies them at start)",
            dir.display()
        ),
    }
    .into())
}
