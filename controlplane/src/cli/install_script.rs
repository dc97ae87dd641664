//! `install-script`: the POSIX sh script that installs or upgrades bcd on a
//! machine and joins it to this control plane. What it trusts is embedded
//! in it, from DIR: the TLS CA it downloads the package with, the package's
//! SHA-256, and the agent configuration (the pins). It carries no secret: a
//! join token reaches the machine in a 0600 file, never in the script.

use std::path::Path;

use anyhow::{bail, Context, Result};
use bc_controlplane::{dist, pki};
use clap::{Args, ValueEnum};

use super::{print_stdout, require_initialized, server, Dir};

const TEMPLATE: &str = include_str!("install.sh");

#[derive(Args)]
pub(crate) struct InstallScriptArgs {
    #[command(flatten)]
    pub dir: Dir,
    #[command(flatten)]
    pub target: Target,
}

/// What a script installs and how it joins; shared with `user-data`.
#[derive(Args)]
pub(crate) struct Target {
    /// The control plane URL machines use (https; its host must be a name of
    /// the TLS certificate: see init --san).
    #[arg(long, value_name = "URL")]
    pub api: String,
    /// How the machine proves itself when it joins.
    #[arg(long, value_enum)]
    pub attestor: Attestor,
    /// The package in dist/ to install (default: the one added last).
    #[arg(long, value_name = "NAME")]
    pub package: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Attestor {
    /// The TPM is the credential: no token is read.
    Tpm,
    /// A join token from a 0600 file (BCD_TOKEN_FILE, default /run/bcd/join-token).
    JoinToken,
    /// A single-use provisioned token, bound to the machine's product UUID,
    /// from the same 0600 file (`user-data` mints it).
    Provisioned,
    /// A cloud VM's identity document (GCP, AWS): no token, no secret.
    CloudIid,
}

impl Attestor {
    fn name(self) -> &'static str {
        match self {
            Attestor::Tpm => "tpm",
            Attestor::JoinToken => "join-token",
            Attestor::Provisioned => "provisioned",
            Attestor::CloudIid => "cloud-iid",
        }
    }
}

pub(crate) fn run(args: InstallScriptArgs) -> Result<()> {
    print_stdout(&script(&args.dir.dir, &args.target)?)
}

/// The script's text for `target`.
pub(crate) fn script(dir: &Path, target: &Target) -> Result<String> {
    require_initialized(dir)?;
    check_api(&target.api)?;
    let package = match &target.package {
        Some(name) => dist::lookup(dir, name)?,
        None => dist::current(dir)?,
    };
    let bundle = pki::Bundle::load(dir)
        .with_context(|| format!("cannot load the control plane in {}", dir.display()))?;
    let ca = bundle.agent_pins_pem().server_ca;
    let config = server::agent_config_text(dir, &target.api, DATA_DIR)?;
    for (what, text) in [("the CA", &ca), ("the configuration", &config)] {
        if text.lines().any(|l| l.starts_with("BCD_")) || !text.ends_with('\n') {
            bail!("{what} cannot be embedded in a here-document");
        }
    }
    let (doc, vars, join) = match target.attestor {
        Attestor::Tpm => (TPM_DOC, "", TPM_JOIN.to_owned()),
        Attestor::JoinToken => (
            TOKEN_DOC,
            TOKEN_VARS,
            TOKEN_JOIN.replace("@JOIN_ATTESTOR@", ""),
        ),
        // The same flow as join-token: only the attestor the join names differs.
        Attestor::Provisioned => (
            TOKEN_DOC,
            TOKEN_VARS,
            TOKEN_JOIN.replace("@JOIN_ATTESTOR@", " --attestor provisioned"),
        ),
        Attestor::CloudIid => (CLOUD_DOC, "", CLOUD_JOIN.to_owned()),
    };
    Ok(TEMPLATE
        .replace("@ATTESTOR_DOC@\n", doc)
        .replace("@VARS@\n", vars)
        .replace("@JOIN@\n", &join)
        .replace("@VERSION@", package.version().unwrap_or(&package.name))
        .replace("@API@", &target.api)
        .replace("@PACKAGE@", &package.name)
        .replace("@SHA256@", &package.sha256_hex())
        .replace("@ATTESTOR@", target.attestor.name())
        .replace("@MAX_BYTES@", &dist::MAX_PACKAGE_BYTES.to_string())
        .replace("@CA@", &ca)
        .replace("@CONFIG@", &config))
}

/// The data directory of the package's units (ReadWritePaths, tmpfiles.d).
const DATA_DIR: &str = "/var/lib/bcd";

/// The URL goes into the script inside single quotes and into curl's
/// arguments: only the characters a plain https URL needs, no quote, space
/// or shell metacharacter, and no path (the script appends /dist/...).
fn check_api(api: &str) -> Result<()> {
    let Some(rest) = api.strip_prefix("https://") else {
        bail!("--api must be an https:// URL, e.g. https://cp.example:8443 (got {api:?})");
    };
    let host_port = rest;
    let ok = !host_port.is_empty()
        && host_port.len() <= 255
        && host_port
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
    if !ok {
        bail!("--api must be https://HOST[:PORT] with nothing after the port (got {api:?})");
    }
    Ok(())
}

const TPM_DOC: &str = "#\n# With --attestor tpm the TPM is the credential: the script reads no token\n# and stops at once on a machine without /dev/tpmrm0.\n";
const TOKEN_DOC: &str = "#\n# With --attestor join-token or provisioned the token is read from a 0600 root-owned file,\n# $BCD_TOKEN_FILE (default /run/bcd/join-token; cloud-init's write_files puts\n# it there), never from this script, and the file is removed once the join succeeds\n# (kept after a failure, so that the script can be run again).\n";

const TOKEN_VARS: &str = "token_file=${BCD_TOKEN_FILE:-/run/bcd/join-token}\n";

const CLOUD_DOC: &str = "#\n# With --attestor cloud-iid the VM's cloud vouches for it: bcd fetches the\n# identity document from the metadata service; the script reads no token\n# and the user data holds no secret.\n";
const CLOUD_JOIN: &str = "  bcd join --config \"$config\" --attestor cloud-iid </dev/null || die \"bcd join --attestor cloud-iid failed\"\n";
const TPM_JOIN: &str = "  bcd join --config \"$config\" --attestor tpm </dev/null || die \"bcd join --attestor tpm failed\"\n";
const TOKEN_JOIN: &str = r#"  [ -f "$token_file" ] ||
    die "no join token in $token_file: write it there (mode 0600, root's) or set BCD_TOKEN_FILE"
  perms=$(stat -c '%a %u' "$token_file")
  [ "$perms" = "600 0" ] || die "$token_file must be mode 0600 and root's (it is $perms)"
  bcd join --config "$config"@JOIN_ATTESTOR@ --token-file "$token_file" </dev/null || die "bcd join failed"
  rm -f "$token_file"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_urls() {
        for ok in [
            "https://cp.example",
            "https://10.0.2.100:8443",
            "https://[::1]:8443",
        ] {
            assert!(check_api(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://cp.example",
            "https://",
            "https://cp'x",
            "https://cp.example/path",
            "https://cp.example/",
            "https://cp example",
            "https://cp$(reboot)",
        ] {
            assert!(check_api(bad).is_err(), "{bad}");
        }
    }
}
