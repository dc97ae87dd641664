//! `token create|revoke|list`: join tokens. The secret is printed once, by
//! `create`, and never again.

use std::path::Path;

use anyhow::{bail, Context, Result};
use bc_controlplane::config::parse_duration_ms;
use bc_controlplane::machine::{Expect, Mac, ProductUuid};
use bc_controlplane::{pools, store, tokens};
use bc_wire::agent::Role;
use clap::{Subcommand, ValueEnum};
use serde_json::json;

use super::{db_now, open_db, print_change, print_line, print_list, Dir, ListArgs};

#[derive(Subcommand)]
pub(crate) enum TokenCmd {
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
        /// Bind the token to one machine: a join must claim this product
        /// UUID (8-4-4-4-12 hex, /sys/class/dmi/id/product_uuid).
        #[arg(long, value_name = "UUID", value_parser = parse_expect_product_uuid)]
        expect_product_uuid: Option<String>,
        /// Bind the token to one machine: a join must claim this MAC among
        /// its interfaces' (aa:bb:cc:dd:ee:ff).
        #[arg(long, value_name = "MAC", value_parser = parse_expect_mac)]
        expect_mac: Option<String>,
        /// The site (id or name) a site token's node serves (role site only).
        #[arg(long, value_name = "SITE")]
        site: Option<String>,
        /// The node a provisioned token re-keys in place (role provisioned
        /// only): the join must claim the product UUID of that node's newest join.
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
        /// A join of a machine whose hardware key a live node holds
        /// reclaims that node in place (same id, next identity generation)
        /// instead of being refused.
        #[arg(long)]
        allow_reclaim: bool,
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
pub(crate) enum TokenRole {
    Node,
    Site,
    /// Single use, bound to one machine, for an installed system's user
    /// data (`bcd join --attestor provisioned`).
    Provisioned,
}

impl TokenRole {
    fn name(self) -> &'static str {
        match self {
            TokenRole::Node => Role::Node.name(),
            TokenRole::Site => Role::Site.name(),
            TokenRole::Provisioned => bc_wire::AttestorId::Provisioned.as_str(),
        }
    }
}

/// `token create`'s options beyond role, uses and lifetime.
pub(crate) struct CreateOpts<'a> {
    pub pool: Option<&'a str>,
    pub expect: Expect,
    pub site: Option<&'a str>,
    pub node: Option<&'a str>,
    pub allow_reclaim: bool,
}

pub(crate) fn run(cmd: TokenCmd) -> Result<()> {
    match cmd {
        TokenCmd::Create {
            dir,
            role,
            uses,
            ttl,
            pool,
            expect_product_uuid,
            expect_mac,
            site,
            node,
            allow_reclaim,
        } => {
            let db = open_db(&dir.dir)?;
            let token = create(
                &db,
                role,
                uses,
                ttl,
                &CreateOpts {
                    pool: pool.as_deref(),
                    expect: Expect {
                        product_uuid: expect_product_uuid,
                        mac: expect_mac,
                    },
                    site: site.as_deref(),
                    node: node.as_deref(),
                    allow_reclaim,
                },
            )?;
            print_line(&token)
        }
        TokenCmd::Revoke { dir, id } => revoke(&dir.dir, &id),
        TokenCmd::List(ListArgs { dir, json }) => list(&dir.dir, json),
    }
}

/// Mints a token; returns its text (shown once). Also `user-data`'s.
pub(crate) fn create(
    db: &store::Store,
    role: TokenRole,
    uses: u32,
    ttl_ms: i64,
    opts: &CreateOpts<'_>,
) -> Result<String> {
    if opts.site.is_some() && !matches!(role, TokenRole::Site) {
        bail!("--site is for site tokens (--role site)");
    }
    if opts.node.is_some() && !matches!(role, TokenRole::Provisioned) {
        bail!("--node is for provisioned tokens (--role provisioned)");
    }
    let (token, _) = db.write(|tx| {
        let site_id = match opts.site {
            Some(site) => Some(bc_controlplane::sites::resolve(tx, site)?),
            None => None,
        };
        let scope = tokens::TokenScope {
            pool: opts.pool,
            expect: opts.expect.clone(),
            site: site_id.as_deref(),
            target_node: opts.node,
            allow_reclaim: opts.allow_reclaim,
        };
        tokens::insert_token(tx, role.name(), uses, ttl_ms, &scope)
    })?;
    Ok(token.expose())
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
                "expiresAt": store::rfc3339(t.expires_at),
                "expired": now >= t.expires_at,
                "revoked": t.revoked_at.is_some(),
                "createdAt": store::rfc3339(t.created_at),
                "pool": t.pool_id.as_deref().unwrap_or(pools::DEFAULT_POOL),
                "expectProductUuid": t.expect.product_uuid,
                "expectMac": t.expect.mac,
                "site": t.site_id,
                "node": t.target_node_id,
                "allowReclaim": t.allow_reclaim,
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
            let mut bound = String::new();
            if let Some(u) = &t.expect.product_uuid {
                bound.push_str(&format!(" expect_product_uuid={u}"));
            }
            if let Some(m) = &t.expect.mac {
                bound.push_str(&format!(" expect_mac={m}"));
            }
            if let Some(n) = &t.target_node_id {
                bound.push_str(&format!(" node={n}"));
            }
            if t.allow_reclaim {
                bound.push_str(" allow_reclaim");
            }
            Ok(format!(
                "{} {} uses_left={} expires={} {state}{bound}",
                t.id,
                t.role,
                t.uses_left,
                store::rfc3339(t.expires_at)
            ))
        },
    )
}

/// `--expect-product-uuid`: validated here, stored lowercase.
pub(super) fn parse_expect_product_uuid(s: &str) -> Result<String, String> {
    ProductUuid::parse(s)
        .map(ProductUuid::into_string)
        .map_err(|e| e.to_string())
}

/// `--expect-mac`: validated here, stored lowercase.
fn parse_expect_mac(s: &str) -> Result<String, String> {
    Mac::parse(s)
        .map(Mac::into_string)
        .map_err(|e| e.to_string())
}

/// A token lifetime: positive.
pub(super) fn parse_ttl(s: &str) -> Result<i64, String> {
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
    fn expect_flags_are_validated_and_lowercased() {
        assert_eq!(
            parse_expect_product_uuid("4C4C4544-0042-3510-8052-B4C04F4E4D32"),
            Ok("4c4c4544-0042-3510-8052-b4c04f4e4d32".to_owned())
        );
        assert_eq!(
            parse_expect_mac("52:54:00:AB:CD:EF"),
            Ok("52:54:00:ab:cd:ef".to_owned())
        );
        assert!(parse_expect_product_uuid("4c4c4544-0042-3510-8052").is_err());
        assert!(parse_expect_mac("52-54-00-ab-cd-ef").is_err());
    }

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
