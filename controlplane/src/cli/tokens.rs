//! `token create|revoke|list`: join tokens. The secret is printed once, by
//! `create`, and never again.

use std::path::Path;

use anyhow::{bail, Context, Result};
use bc_controlplane::config::parse_duration_ms;
use bc_controlplane::{db, pools, tokens};
use bc_wire::agent::Role;
use clap::{Subcommand, ValueEnum};
use serde_json::json;

use super::{db_now, open_db, print_change, print_line, print_list, Dir, ListArgs};

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Mint a token and print it (and nothing else) on stdout.
    Create {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_enum)]
        role: TokenRole,
        /// How many joins the token admits.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        uses: u32,
        /// Lifetime: an integer and a unit s, m, h or d (e.g. 15m, 24h, 7d).
        #[arg(long, default_value = "24h", value_parser = parse_ttl)]
        ttl: i64,
        /// The pool its nodes join (default: default).
        #[arg(long, value_name = "ID")]
        pool: Option<String>,
    },
    /// Revoke a token by id.
    Revoke {
        #[command(flatten)]
        dir: Dir,
        /// The token id (tok_…).
        id: String,
    },
    /// List tokens (never their secrets).
    List(ListArgs),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum TokenRole {
    Node,
    Site,
}

impl From<TokenRole> for Role {
    fn from(r: TokenRole) -> Role {
        match r {
            TokenRole::Node => Role::Node,
            TokenRole::Site => Role::Site,
        }
    }
}

pub fn run(cmd: TokenCmd) -> Result<()> {
    match cmd {
        TokenCmd::Create {
            dir,
            role,
            uses,
            ttl,
            pool,
        } => create(&dir.dir, role.into(), uses, ttl, pool.as_deref()),
        TokenCmd::Revoke { dir, id } => revoke(&dir.dir, &id),
        TokenCmd::List(ListArgs { dir, json }) => list(&dir.dir, json),
    }
}

fn create(dir: &Path, role: Role, uses: u32, ttl_ms: i64, pool: Option<&str>) -> Result<()> {
    let db = open_db(dir)?;
    let (token, _) = tokens::create_token_in_pool(&db, role, uses, ttl_ms, pool)?;
    print_line(&token.expose())
}

fn revoke(dir: &Path, id: &str) -> Result<()> {
    // A whole token pasted here carries its secret: never echo it.
    if id.contains('.') {
        bail!("token revoke takes the token's id (tok_…, the part before the '.'), not the whole token");
    }
    let db = open_db(dir)?;
    match tokens::revoke_token(&db, id).context("cannot revoke the token")? {
        tokens::RevokeOutcome::Revoked => print_change(true, "revoked", id),
        tokens::RevokeOutcome::AlreadyRevoked => print_change(false, "revoked", id),
        tokens::RevokeOutcome::Unknown => bail!(
            "no token {id:?} in {} (see bc-controlplane token list --dir {})",
            dir.display(),
            dir.display()
        ),
    }
}

fn list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = tokens::list_tokens(&db).context("cannot list tokens")?;
    let now = db_now(&db)?;
    print_list(
        &rows,
        as_json,
        |t| {
            json!({
                "id": t.id,
                "role": t.role,
                "usesLeft": t.uses_left,
                "expiresAt": db::rfc3339(t.expires_at),
                "expired": now >= t.expires_at,
                "revoked": t.revoked_at.is_some(),
                "createdAt": db::rfc3339(t.created_at),
                "pool": t.pool_id.as_deref().unwrap_or(pools::DEFAULT_POOL),
            })
        },
        |t| {
            let state = if t.revoked_at.is_some() {
                "revoked"
            } else if now >= t.expires_at {
                "expired"
            } else if t.uses_left <= 0 {
                "exhausted"
            } else {
                "active"
            };
            Ok(format!(
                "{} {} uses_left={} expires={} {state}",
                t.id,
                t.role,
                t.uses_left,
                db::rfc3339(t.expires_at)
            ))
        },
    )
}

/// A token lifetime: positive.
fn parse_ttl(s: &str) -> Result<i64, String> {
    if s.starts_with('-') {
        return Err(format!("the lifetime must be positive, not {s:?}"));
    }
    match parse_duration_ms(s)? {
        0 => Err("the lifetime must be positive, not 0".to_owned()),
        ms => Ok(ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes() {
        assert_eq!(parse_ttl("90s"), Ok(90_000));
        assert_eq!(parse_ttl("15m"), Ok(900_000));
        assert_eq!(parse_ttl("24h"), Ok(86_400_000));
        assert_eq!(parse_ttl("7d"), Ok(604_800_000));
        assert_eq!(parse_ttl("+1h"), Ok(3_600_000));
        for bad in [
            "",
            "h",
            "10",
            "1.5h",
            "1w",
            "-1h",
            "0s",
            " 1h",
            "1H",
            "99999999999999999d",
        ] {
            assert!(parse_ttl(bad).is_err(), "{bad:?} accepted");
        }
    }
}
