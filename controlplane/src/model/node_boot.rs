//! The last boot the control plane verified for each node (issue 31): what
//! its event log showed when a join or a renewal met its pool's boot policy,
//! so an operator sees in `nodes show` what the machine runs now, not only
//! that it passed. One row per node, replaced at each verified boot.

use bc_eventlog::{Alg, AuthorityEntry, BootFacts};
use serde::{Deserialize, Serialize};

use crate::model::boot_policy;
use crate::store::{params, DbError, Tx, UnixMs};

/// A boot application as `nodes show` prints it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootAppSeen {
    /// Its Authenticode digest (SHA-256 when the log has it), hex.
    pub digest: String,
    /// The db (or MOK) entries that verified it: a certificate's subject
    /// (else its SHA-256), a db hash entry's digest. Empty: none logged.
    pub authorities: Vec<String>,
    /// Its device path, when the firmware logged one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub path: Option<String>,
}

/// What a verified boot showed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifiedBoot {
    /// `on`, `off`, `setup mode`, `audit mode` or `not measured`.
    pub secure_boot: String,
    pub boot_apps: Vec<BootAppSeen>,
    /// The last kernel command line measured, if any.
    pub cmdline: Option<String>,
}

impl VerifiedBoot {
    pub(crate) fn of(facts: &BootFacts) -> Self {
        let on =
            |m: &Option<bc_eventlog::Measured<Vec<u8>>>| m.as_ref().is_some_and(|m| m.value == [1]);
        let secure_boot = match &facts.secure_boot {
            None => "not measured",
            Some(_) if !facts.secure_boot_enabled() => "off",
            Some(_) if on(&facts.setup_mode) => "setup mode",
            Some(_) if on(&facts.audit_mode) => "audit mode",
            Some(_) => "on",
        }
        .to_owned();
        let boot_apps = facts
            .boot_apps
            .iter()
            .enumerate()
            .map(|(i, app)| BootAppSeen {
                digest: app
                    .authenticode
                    .iter()
                    .find(|d| d.alg() == Some(Alg::Sha256))
                    .or(app.authenticode.first())
                    .map(|d| hex::encode(&d.value))
                    .unwrap_or_default(),
                authorities: boot_policy::app_authorities(facts, i)
                    .into_iter()
                    .map(|a| authority_name(&a.entry))
                    .collect(),
                path: app.path.clone().filter(|p| !p.is_empty()),
            })
            .collect();
        VerifiedBoot {
            secure_boot,
            boot_apps,
            cmdline: facts.kernel_cmdlines.last().map(|m| m.value.clone()),
        }
    }
}

/// One name for an authority entry: a certificate's subject (its SHA-256
/// when it does not parse), a db hash entry's digest, a value's hex.
fn authority_name(entry: &AuthorityEntry) -> String {
    match entry {
        AuthorityEntry::Certificate { der, .. } => boot_policy::authority_subject(der)
            .unwrap_or_else(|| format!("sha256:{}", hex::encode(bc_wire::sha256(der)))),
        AuthorityEntry::Sha256 { digest, .. } => format!("sha256:{}", hex::encode(digest)),
        AuthorityEntry::Value(v) => hex::encode(v),
    }
}

/// A node's last verified boot, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastBoot {
    pub boot: VerifiedBoot,
    /// `join` or `renew`.
    pub via: String,
    pub verified_at: UnixMs,
}

/// Records `boot` as `node_id`'s last verified boot (`via`: join or renew).
pub(crate) fn record(
    tx: &Tx<'_>,
    node_id: &str,
    via: &str,
    boot: &VerifiedBoot,
    now: UnixMs,
) -> Result<(), DbError> {
    let apps = serde_json::to_string(&boot.boot_apps).map_err(|e| DbError::Corrupt {
        what: "boot applications",
        detail: e.to_string(),
    })?;
    tx.execute(
        "INSERT INTO node_boots (node_id, verified_at, via, secure_boot, boot_apps, cmdline)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (node_id) DO UPDATE SET verified_at = excluded.verified_at,
             via = excluded.via, secure_boot = excluded.secure_boot,
             boot_apps = excluded.boot_apps, cmdline = excluded.cmdline",
        params![node_id, now, via, boot.secure_boot, apps, boot.cmdline],
    )?;
    Ok(())
}

/// `node_id`'s last verified boot, if one was ever verified.
pub(crate) fn last(tx: &Tx<'_>, node_id: &str) -> Result<Option<LastBoot>, DbError> {
    let row: Option<(UnixMs, String, String, String, Option<String>)> = tx.query_opt_map(
        "SELECT verified_at, via, secure_boot, boot_apps, cmdline FROM node_boots WHERE node_id = ?1",
        params![node_id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
    )?;
    row.map(|(verified_at, via, secure_boot, apps, cmdline)| {
        let boot_apps = serde_json::from_str(&apps).map_err(|e| DbError::Corrupt {
            what: "node boot applications",
            detail: format!("node {node_id}: {e}"),
        })?;
        Ok(LastBoot {
            boot: VerifiedBoot {
                secure_boot,
                boot_apps,
                cmdline,
            },
            via,
            verified_at,
        })
    })
    .transpose()
}
