//! `bcd status`: who this machine is, in one line or as JSON.
use std::process::ExitCode;

use anyhow::Context as _;
use serde::Serialize;
use time::OffsetDateTime;

use crate::config::{Config, ConfigArg};
use crate::identity::Identity;
use crate::keys::{NodeKeyKind, TpmAccess};
use crate::out;
use crate::pki::rfc3339;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
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
    node_key: &'a str,
    /// The chain as PEM, leaf first.
    certificate: String,
}

/// Exit 0 when joined, 1 when not (or when the identity does not load).
pub fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(&args.config.path)?;
    let dir = &config.data_dir;
    let tpm = TpmAccess::new(config.tpm_tcti.as_deref());
    let identity = Identity::load(dir, &tpm)
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
    if args.json {
        let out = StatusJson {
            joined: true,
            node_id: &id.node_id,
            role: id.role.name(),
            trust_domain: &id.trust_domain,
            not_after,
            node_key: id.key.kind().as_str(),
            certificate: id.chain_pem(),
        };
        out::line(format_args!(
            "{}",
            serde_json::to_string_pretty(&out).context("cannot encode the status")?
        ))?;
    } else {
        out::line(format_args!("{}", line(&id, OffsetDateTime::now_utc())))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `node node_abc (node) in bc.test, certificate expires 2026-12-01T17:00:00Z (23h59m left), node key a file`
fn line(id: &Identity, now: OffsetDateTime) -> String {
    let not_after = id.cert.not_after;
    let expiry = if not_after > now {
        format!(
            "certificate expires {} ({} left)",
            rfc3339(not_after),
            human(not_after - now)
        )
    } else {
        format!(
            "certificate expired {} ({} ago)",
            rfc3339(not_after),
            human(now - not_after)
        )
    };
    let key = match id.key.kind() {
        NodeKeyKind::File => "node key a file",
        NodeKeyKind::Tpm => "node key in the TPM",
    };
    format!(
        "node {} ({}) in {}, {expiry}, {key}",
        id.node_id,
        id.role.name(),
        id.trust_domain
    )
}

/// `23h59m`, `2d3h`, `5m`, `12s`: coarse enough to read at a glance.
fn human(d: time::Duration) -> String {
    let s = d.whole_seconds().max(0);
    let (days, hours, mins) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60);
    if days > 0 {
        format!("{days}d{hours}h")
    } else if hours > 0 {
        format!("{hours}h{mins}m")
    } else if mins > 0 {
        format!("{mins}m")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::FileKey;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(
            human(time::Duration::seconds(23 * 3600 + 59 * 60 + 30)),
            "23h59m"
        );
        assert_eq!(
            human(time::Duration::seconds(2 * 86_400 + 3 * 3600)),
            "2d3h"
        );
        assert_eq!(human(time::Duration::seconds(300)), "5m");
        assert_eq!(human(time::Duration::seconds(12)), "12s");
    }

    #[test]
    fn one_identity_line() {
        let id = crate::identity::tests::sample(FileKey::generate().unwrap());
        let now = id.cert.not_after - time::Duration::seconds(3600 + 120);
        let l = line(&id, now);
        let expected = format!(
            "node node_abc (node) in bc.test, certificate expires {} (1h2m left), node key a file",
            rfc3339(id.cert.not_after)
        );
        assert_eq!(l, expected);
        assert!(line(&id, id.cert.not_after + time::Duration::minutes(5))
            .contains("certificate expired"));
    }
}
