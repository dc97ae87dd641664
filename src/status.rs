//! `bcd status`: who this machine is, in one line or as JSON.
use std::process::ExitCode;

use anyhow::Context as _;
use serde::Serialize;
use time::OffsetDateTime;

use crate::config::{Config, ConfigArg};
use crate::identity::{Identity, JOURNAL_FILE};
use crate::journal::{Entry, Journal, Kind};
use crate::keys::{NodeKeyKind, TpmAccess};
use crate::pki::rfc3339;
use crate::{clock, out};

#[derive(clap::Args, Debug)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Print a JSON object instead of a line
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusJson<'a> {
    joined: bool,
    node_id: &'a str,
    role: &'a str,
    trust_domain: &'a str,
    not_after: String,
    /// When `bcd node` renews: a point 50-60 % into the lifetime, fixed by
    /// the certificate.
    renew_at: String,
    node_key: &'a str,
    /// The newest renewal attempt in the journal, or null.
    last_renewal: Option<LastRenewal>,
    /// The chain as PEM, leaf first.
    certificate: String,
    /// A site node's boot lease and ramdisk, as `bcd site` last wrote them.
    #[serde(skip_serializing_if = "Option::is_none")]
    site: Option<crate::sitedata::state::SiteState>,
}

/// `lastRenewal`: when, whether it worked, and the journal's one line.
#[derive(Serialize, Debug, PartialEq, Eq)]
struct LastRenewal {
    at: String,
    ok: bool,
    detail: String,
}

impl LastRenewal {
    fn of(entry: &Entry) -> LastRenewal {
        LastRenewal {
            at: rfc3339(entry.at),
            ok: entry.kind == Kind::Renewal,
            detail: entry.detail.clone(),
        }
    }
}

/// The last renewal in `journal.db`, if there is a journal (it is not
/// created here) and it reads.
fn last_renewal(data_dir: &std::path::Path) -> Option<LastRenewal> {
    if !data_dir.join(JOURNAL_FILE).exists() {
        return None;
    }
    match Journal::open(data_dir).and_then(|j| j.last_renewal()) {
        Ok(entry) => entry.as_ref().map(LastRenewal::of),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the last renewal from the journal");
            None
        }
    }
}

/// Exit 0 when joined, 1 when not (or when the identity does not load).
pub(crate) fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(&args.config.path)?;
    let dir = &config.data_dir;
    crate::identity::owner::trust_node_user(&config)?;
    let tpm = TpmAccess::for_node(&config);
    let identity = Identity::inspect(dir, &tpm)
        .with_context(|| format!("the identity in {} does not load", dir.display()))?;
    let Some(id) = identity else {
        if args.json {
            out::line(format_args!("{}", serde_json::json!({ "joined": false })))?;
        } else {
            out::line(format_args!(
                "not joined (no identity in {})",
                dir.display()
            ))?;
        }
        return Ok(ExitCode::FAILURE);
    };
    let not_after = rfc3339(id.cert.not_after);
    let last = last_renewal(dir);
    let site = crate::sitedata::state::load(dir, clock::now());
    if args.json {
        let out = StatusJson {
            joined: true,
            node_id: &id.node_id,
            role: id.role.name(),
            trust_domain: &id.trust_domain,
            not_after,
            renew_at: rfc3339(id.cert.renew_at()),
            node_key: id.key.kind().as_str(),
            last_renewal: last,
            certificate: id.chain_pem(),
            site,
        };
        out::line(format_args!(
            "{}",
            serde_json::to_string_pretty(&out).context("cannot encode the status")?
        ))?;
    } else {
        out::line(format_args!("{}", line(&id, last.as_ref(), clock::now())))?;
        if let Some(s) = &site {
            out::line(format_args!("{}", crate::sitedata::state::line(s)))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `node node_abc (node) in bc.test, certificate expires 2026-12-01T17:00:00Z (23h59m left), node key a file, last renewal 2026-11-30T17:00:00Z ok`
fn line(id: &Identity, last: Option<&LastRenewal>, now: OffsetDateTime) -> String {
    let not_after = id.cert.not_after;
    let expiry = if not_after > now {
        format!(
            "certificate expires {} ({} left)",
            rfc3339(not_after),
            out::human(not_after - now)
        )
    } else {
        format!(
            "certificate expired {} ({} ago)",
            rfc3339(not_after),
            out::human(now - not_after)
        )
    };
    let key = match id.key.kind() {
        NodeKeyKind::File => "node key a file",
        NodeKeyKind::Tpm => "node key in the TPM",
    };
    let renewal = match last {
        None => "no renewal yet".to_owned(),
        Some(r) if r.ok => format!("last renewal {} ok", r.at),
        Some(r) => format!("last renewal {} failed: {}", r.at, r.detail),
    };
    format!(
        "node {} ({}) in {}, {expiry}, {key}, {renewal}",
        id.node_id,
        id.role.name(),
        id.trust_domain
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::FileKey;

    #[test]
    fn one_identity_line() {
        let id = crate::identity::tests::sample(FileKey::generate().unwrap());
        let now = id.cert.not_after - time::Duration::seconds(3600 + 120);
        let l = line(&id, None, now);
        let expected = format!(
            "node node_abc (node) in bc.test, certificate expires {} (1h2m left), node key a file, no renewal yet",
            rfc3339(id.cert.not_after)
        );
        assert_eq!(l, expected);
        assert!(
            line(&id, None, id.cert.not_after + time::Duration::minutes(5))
                .contains("certificate expired")
        );
    }

    #[test]
    fn the_last_renewal_comes_from_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(last_renewal(dir.path()), None);
        assert!(
            !dir.path().join(JOURNAL_FILE).exists(),
            "status creates no journal"
        );
        let mut j = Journal::open(dir.path()).unwrap();
        let at = OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap();
        let entry = Entry {
            at,
            kind: Kind::RenewalFailed,
            node_id: "node_abc".into(),
            detail: "renewal refused by the control plane (Renew refused)".into(),
            not_after: None,
        };
        j.record(&entry).unwrap();
        let last = last_renewal(dir.path()).unwrap();
        assert_eq!(
            last,
            LastRenewal {
                at: "2026-09-21T14:13:20Z".into(),
                ok: false,
                detail: "renewal refused by the control plane (Renew refused)".into()
            }
        );
        let id = crate::identity::tests::sample(FileKey::generate().unwrap());
        assert!(line(&id, Some(&last), at).ends_with(
            ", last renewal 2026-09-21T14:13:20Z failed: renewal refused by the control plane (Renew refused)"
        ));
        j.record(&Entry {
            kind: Kind::Renewal,
            detail: "renewed".into(),
            ..entry
        })
        .unwrap();
        let last = last_renewal(dir.path()).unwrap();
        assert!(last.ok);
        assert!(line(&id, Some(&last), at).ends_with(", last renewal 2026-09-21T14:13:20Z ok"));
        let json = serde_json::to_value(&last).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"at": "2026-09-21T14:13:20Z", "ok": true, "detail": "renewed"})
        );
    }
}
