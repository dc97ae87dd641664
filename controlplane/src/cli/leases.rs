//! `leases create|end|list`: nodes lent to tenants. While a lease holds,
//! the node's certificates name the lessee and run only `[leases]
//! allowed_kinds` (docs/control-plane.md, "Leases").

use anyhow::{anyhow, Context, Result};
use bc_controlplane::config::parse_duration_ms;
use bc_controlplane::leases::{self, LeaseRef, LeaseRow, Until};
use bc_controlplane::store;
use clap::Subcommand;
use serde_json::json;

use super::{load_config, open_db, print_change, print_line, print_list, Dir, ListArgs};

#[derive(Subcommand)]
pub(crate) enum LeasesCmd {
    /// Lend a node (role node) to a tenant. From its next certificate
    /// (renewal or re-join) the node names the lessee and runs only
    /// `[leases] allowed_kinds` (diag.*, inventory.refresh by default); the
    /// control plane refuses other kinds at once.
    Create {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_name = "N")]
        node: String,
        /// The lessee (tenants create makes one).
        #[arg(long, value_name = "T")]
        tenant: String,
        /// When the lease ends by itself: a duration from now (7d, 12h,
        /// as token create --ttl) or an RFC 3339 time, by database time.
        /// Default: until leases end.
        #[arg(long, value_name = "TIME", value_parser = parse_until)]
        until: Option<Until>,
    },
    /// End a lease now; the node's next certificate is unrestricted.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["id", "node"])))]
    End {
        #[command(flatten)]
        dir: Dir,
        /// The lease (leases list shows them).
        #[arg(value_name = "ID")]
        id: Option<String>,
        /// The node's open lease instead.
        #[arg(long, value_name = "N")]
        node: Option<String>,
    },
    /// List leases with their state (active, expired, ended).
    List(ListArgs),
}

/// `--until`: a duration from now, or an RFC 3339 time.
fn parse_until(s: &str) -> Result<Until, String> {
    if let Ok(ms) = parse_duration_ms(s) {
        return if ms > 0 {
            Ok(Until::In(ms))
        } else {
            Err(format!("{s:?} is not a positive duration"))
        };
    }
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map(|t| Until::At(store::from_datetime(t)))
        .map_err(|_| {
            format!("{s:?} is neither a duration (7d, 12h, 30m) nor an RFC 3339 time (2026-01-02T03:04:05Z)")
        })
}

pub(crate) fn run(cmd: LeasesCmd) -> Result<()> {
    match cmd {
        LeasesCmd::Create {
            dir,
            node,
            tenant,
            until,
        } => {
            let kinds = load_config(&dir.dir)?.leases.allowed_kinds;
            let db = open_db(&dir.dir)?;
            let l = leases::create(&db, &node, &tenant, until, &kinds)?;
            print_line(&format!(
                "created lease {} node={} tenant={} until={} kinds={}",
                l.id,
                l.node_id,
                l.tenant_id,
                l.until.map_or("-".to_owned(), store::rfc3339),
                l.allowed_kinds.join(",")
            ))
        }
        LeasesCmd::End { dir, id, node } => {
            let db = open_db(&dir.dir)?;
            let which = match (&id, &node) {
                (Some(id), _) => LeaseRef::Id(id),
                (None, Some(n)) => LeaseRef::Node(n),
                (None, None) => return Err(anyhow!("name the lease (ID) or --node")),
            };
            let (l, changed) = leases::end(&db, which)?;
            print_change(changed, "ended", &l.id)
        }
        LeasesCmd::List(ListArgs { dir, json }) => {
            let db = open_db(&dir.dir)?;
            let (rows, now) = leases::list(&db).context("cannot list leases")?;
            let time = |t: Option<i64>| t.map(store::rfc3339);
            print_list(
                &rows,
                json,
                |l: &LeaseRow| {
                    json!({
                        "id": l.id,
                        "nodeId": l.node_id,
                        "tenantId": l.tenant_id,
                        "allowedKinds": l.allowed_kinds,
                        "createdAt": store::rfc3339(l.created_at),
                        "until": time(l.until),
                        "endedAt": time(l.ended_at),
                        "state": l.state(now),
                    })
                },
                |l| {
                    Ok(format!(
                        "{} node={} tenant={} {} until={} kinds={}",
                        l.id,
                        l.node_id,
                        l.tenant_id,
                        l.state(now),
                        time(l.until).unwrap_or_else(|| "-".to_owned()),
                        l.allowed_kinds.join(",")
                    ))
                },
            )
        }
    }
}
