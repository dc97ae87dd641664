//! `bcd doctor`: one line per check, `ok` / `warn` / `fail` (or `skip` when
//! a check it depends on failed), each warning and failure with what to do
//! next. Exit 1 when any check fails; warnings alone exit 0.
//!
//! The checks, in order: the config; the data directory (owner, modes); the
//! identity (loads, key matches the certificate); the certificate's time
//! left and the last renewal in the journal; where the node key is held; the
//! TPM and its EK certificate (under `[helper]`: that the node's user
//! cannot open the TPM, and the helper); the control plane (reachable with
//! the pinned CA) and the clock against it.
//!
//! Every check is a function from what was found to a [`Check`], so that the
//! wording is tested without a machine in that state; `run` only gathers.
mod cert;
mod files;
mod helper;
mod net;
mod site;
mod tpm;

use std::path::Path;
use std::process::ExitCode;

use crate::config::{Config, ConfigArg};
use crate::identity::{Identity, IdentityError};
use crate::keys::{KeyError, NodeKeyKind, TpmAccess};
use crate::out;
use anyhow::Context as _;
use serde::Serialize;

#[derive(clap::Args, Debug)]
pub(crate) struct DoctorArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Print a JSON object instead of lines
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    Ok,
    Warn,
    Fail,
    /// Not run: a check it depends on failed (the message says which).
    Skip,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Check {
    pub check: &'static str,
    pub status: Status,
    pub message: String,
    /// What to do next; `null` when there is nothing to do.
    pub hint: Option<String>,
}

impl Check {
    fn ok(check: &'static str, message: impl Into<String>) -> Check {
        Check {
            check,
            status: Status::Ok,
            message: message.into(),
            hint: None,
        }
    }

    fn warn(check: &'static str, message: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            check,
            status: Status::Warn,
            message: message.into(),
            hint: Some(hint.into()),
        }
    }

    fn fail(check: &'static str, message: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            check,
            status: Status::Fail,
            message: message.into(),
            hint: Some(hint.into()),
        }
    }

    fn skip(check: &'static str, reason: impl Into<String>) -> Check {
        Check {
            check,
            status: Status::Skip,
            message: reason.into(),
            hint: None,
        }
    }

    /// `ok    identity: node node_abc …` / `fail  identity: <message>; <hint>`.
    pub(crate) fn line(&self) -> String {
        let mut s = format!(
            "{:<6}{}: {}",
            self.status.as_str(),
            self.check,
            self.message
        );
        if let Some(h) = &self.hint {
            s.push_str("; ");
            s.push_str(h);
        }
        s
    }
}

/// Everything doctor found: `{"checks": [...], "ok": bool}`.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub checks: Vec<Check>,
    /// No check failed (warnings allowed).
    pub ok: bool,
}

impl Report {
    fn new(checks: Vec<Check>) -> Report {
        let ok = !checks.iter().any(|c| c.status == Status::Fail);
        Report { checks, ok }
    }
}

// The checks' names, as the lines and the JSON show them.
const CONFIG: &str = "config";
const DATA_DIR: &str = "data dir";
const IDENTITY: &str = "identity";
const CERTIFICATE: &str = "certificate";
const LAST_RENEWAL: &str = "last renewal";
const NODE_KEY: &str = "node key";
const TPM: &str = "tpm";
const EK_CERTIFICATE: &str = "ek certificate";
const HELPER: &str = "helper";
const CONTROL_PLANE: &str = "control plane";
const CLOCK: &str = "clock";

/// Exit 0 when nothing failed, 1 when a check failed.
pub(crate) fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let report = diagnose(&args.config.path);
    if args.json {
        out::line(format_args!(
            "{}",
            serde_json::to_string_pretty(&report).context("cannot encode the report")?
        ))?;
    } else {
        for c in &report.checks {
            out::line(format_args!("{}", c.line()))?;
        }
    }
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs every check against the config at `path`.
pub(crate) fn diagnose(path: &Path) -> Report {
    let mut checks = Vec::new();
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            checks.push(Check::fail(
                CONFIG,
                e.to_string(),
                format!(
                    "fix {} (bc-controlplane agent-config prints a valid one), or pass --config F",
                    path.display()
                ),
            ));
            let why = "the config does not load";
            for name in [
                DATA_DIR,
                IDENTITY,
                CERTIFICATE,
                LAST_RENEWAL,
                NODE_KEY,
                TPM,
                EK_CERTIFICATE,
                CONTROL_PLANE,
                CLOCK,
            ] {
                checks.push(Check::skip(name, why));
            }
            return Report::new(checks);
        }
    };
    checks.push(Check::ok(
        CONFIG,
        format!(
            "{} (control plane {}, data dir {})",
            path.display(),
            config.api.as_str().trim_end_matches('/'),
            config.data_dir.display()
        ),
    ));

    let dir = &config.data_dir;
    // Under [helper] the data directory is the node user's, whoever runs this.
    let owner = match crate::identity::owner::trust_node_user(&config) {
        Ok(Some((uid, _))) => Some(uid),
        Ok(None) => files::effective_uid(),
        Err(e) => {
            tracing::warn!(error = %e, "[helper] user");
            files::effective_uid()
        }
    };
    checks.push(files::check_data_dir(dir, owner));

    let access = TpmAccess::for_node(&config);
    let loaded = Identity::inspect(dir, &access);
    checks.push(identity_check(&loaded, dir));
    // bcd's own clock (moved in test builds), as bcd node judges expiry by it.
    let now = crate::clock::now();
    match &loaded {
        Ok(Some(id)) => {
            checks.push(cert::certificate(
                id.cert.not_before,
                id.cert.not_after,
                now,
            ));
            checks.push(cert::last_renewal(dir, now));
            checks.push(node_key(id.key.kind(), access.present()));
        }
        _ => {
            let why = "the identity does not load";
            checks.push(Check::skip(CERTIFICATE, why));
            checks.push(Check::skip(LAST_RENEWAL, why));
            checks.push(Check::skip(NODE_KEY, why));
        }
    }
    // The node key leaves the TPM now: the TPM checks load what they need.
    drop(loaded);

    match &config.helper {
        Some(settings) => checks.extend(helper::checks(settings, access.helper().map(|c| &**c))),
        None => checks.extend(tpm::checks(
            &access,
            config.tpm_ek_roots.as_deref(),
            config.tpm_ek_intermediates.as_deref(),
        )),
    }
    checks.extend(net::checks(&config));
    if let Some(settings) = &config.site {
        checks.extend(site::checks(settings, dir, crate::clock::now()));
    }
    Report::new(checks)
}

/// The identity loads and its key is the certificate's.
fn identity_check(loaded: &Result<Option<Identity>, IdentityError>, dir: &Path) -> Check {
    let again = "join again: bcd join --reset --yes, then bcd join";
    match loaded {
        Ok(Some(id)) => Check::ok(
            IDENTITY,
            format!(
                "node {} ({}) in {}, joined with {}; the node key matches the certificate",
                id.node_id,
                id.role.name(),
                id.trust_domain,
                id.attestor
            ),
        ),
        Ok(None) => Check::fail(
            IDENTITY,
            format!("not joined (no identity in {})", dir.display()),
            "run bcd join",
        ),
        Err(e @ IdentityError::TpmKeyMismatch) => {
            // The spec's sentence, whole: its hint is the part after "; ".
            let text = e.to_string();
            match text.rsplit_once("; ") {
                Some((message, hint)) => Check::fail(IDENTITY, message, hint),
                None => Check::fail(IDENTITY, text, again),
            }
        }
        Err(e @ IdentityError::Key(KeyError::NoTpm)) => Check::fail(
            IDENTITY,
            e.to_string(),
            "point [tpm] tcti at this machine's TPM; if the TPM is gone, join again: bcd join --reset --yes, then bcd join",
        ),
        Err(e @ IdentityError::Key(KeyError::Tpm(_) | KeyError::TpmBusy)) => Check::fail(
            IDENTITY,
            format!("the node key is in the TPM and cannot be loaded: {e}"),
            "see the tpm check",
        ),
        Err(e @ IdentityError::Key(KeyError::Helper(_))) => Check::fail(
            IDENTITY,
            format!("the node key is in the TPM and cannot be reached through bcd helper: {e}"),
            "see the helper check",
        ),
        Err(e @ (IdentityError::Read { .. } | IdentityError::Key(KeyError::Read { .. }))) => {
            Check::fail(
                IDENTITY,
                e.to_string(),
                "run bcd doctor as the user that runs bcd node (or as root)",
            )
        }
        Err(e) => Check::fail(IDENTITY, e.to_string(), again),
    }
}

/// The spec's node key check, word for word.
fn node_key(kind: NodeKeyKind, host_has_tpm: bool) -> Check {
    match (kind, host_has_tpm) {
        (NodeKeyKind::Tpm, _) => Check::ok(NODE_KEY, "in the TPM"),
        (NodeKeyKind::File, false) => Check::ok(NODE_KEY, "a file key (this host has no TPM)"),
        (NodeKeyKind::File, true) => Check::warn(
            NODE_KEY,
            "a file key on a host with a TPM",
            "the next renewal moves it into the TPM (through bcd helper when bcd node runs unprivileged)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_pad_the_status_and_append_the_hint() {
        assert_eq!(
            Check::ok("tpm", "none (node keys are file keys)").line(),
            "ok    tpm: none (node keys are file keys)"
        );
        assert_eq!(
            Check::fail("identity", "not joined", "run bcd join").line(),
            "fail  identity: not joined; run bcd join"
        );
        assert_eq!(Check::warn("x", "m", "h").line(), "warn  x: m; h");
        assert_eq!(Check::skip("x", "why").line(), "skip  x: why");
    }

    #[test]
    fn the_tpm_mismatch_line_is_the_specs_sentence() {
        let c = identity_check(&Err(IdentityError::TpmKeyMismatch), Path::new("/d"));
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            c.line(),
            "fail  identity: the node key does not match the node certificate: the TPM derives another key from node.key (was the TPM cleared?); join again: bcd join --reset --yes, then bcd join"
        );
    }

    #[test]
    fn node_key_as_the_spec_words_it() {
        assert_eq!(
            node_key(NodeKeyKind::Tpm, true).line(),
            "ok    node key: in the TPM"
        );
        assert_eq!(node_key(NodeKeyKind::File, false).status, Status::Ok);
        let w = node_key(NodeKeyKind::File, true);
        assert_eq!(w.status, Status::Warn);
        assert!(w.line().ends_with("the next renewal moves it into the TPM (through bcd helper when bcd node runs unprivileged)"));
    }

    #[test]
    fn a_config_that_does_not_load_fails_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "api = 1\n").unwrap();
        let r = diagnose(&path);
        assert!(!r.ok);
        assert_eq!(r.checks[0].status, Status::Fail);
        assert!(
            r.checks[0]
                .message
                .starts_with(&format!("{}:1: ", path.display())),
            "{}",
            r.checks[0].message
        );
        assert!(r.checks[1..].iter().all(|c| c.status == Status::Skip));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["ok"], false);
        assert_eq!(json["checks"][0]["check"], "config");
        assert_eq!(json["checks"][0]["status"], "fail");
        assert_eq!(json["checks"][1]["hint"], serde_json::Value::Null);
    }
}
