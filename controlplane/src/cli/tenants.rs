//! `tenants create|list`: who owns pools, and whom events are attributed
//! to (`root` always exists).

use anyhow::{Context, Result};
use bc_controlplane::{store, tenants};
use clap::Subcommand;
use serde_json::json;

use super::{open_db, print_line, print_list, Dir, ListArgs};

#[derive(Subcommand)]
pub(crate) enum TenantsCmd {
    /// Create a tenant: then `pools create --tenant ID` gives it pools,
    /// and `leases create --tenant ID` lends it nodes.
    Create {
        #[command(flatten)]
        dir: Dir,
        /// 1 to 64 letters, digits, '.', '_' or '-', starting with a letter
        /// or digit.
        #[arg(value_name = "ID")]
        id: String,
    },
    /// List tenants.
    List(ListArgs),
}

pub(crate) fn run(cmd: TenantsCmd) -> Result<()> {
    match cmd {
        TenantsCmd::Create { dir, id } => {
            let db = open_db(&dir.dir)?;
            let t = tenants::create(&db, &id)?;
            print_line(&format!("created tenant {}", t.id))
        }
        TenantsCmd::List(ListArgs { dir, json }) => {
            let db = open_db(&dir.dir)?;
            let rows = tenants::list(&db).context("cannot list tenants")?;
            print_list(
                &rows,
                json,
                |t| json!({ "id": t.id, "createdAt": store::rfc3339(t.created_at) }),
                |t| Ok(format!("{} created={}", t.id, store::rfc3339(t.created_at))),
            )
        }
    }
}
