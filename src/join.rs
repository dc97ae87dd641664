//! `bcd join`: become a node of the control plane. The flow itself is
//! [`crate::joining`] (`bcd ramdisk` joins with it too); this is the
//! command: its arguments, the token, `--reset`, the x509pop re-join, and
//! the data directory handed to the node user.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context as _};
use bc_wire::agent::Role;
use p256::elliptic_curve::zeroize::Zeroizing;

use crate::config::{Config, ConfigArg};
use crate::evidence::attestor;
use crate::evidence::join_token::TokenText;
use crate::identity::rotation;
use crate::identity::{reset, Identity};
use crate::joining::{self, Credential};
use crate::keys::TpmAccess;
use crate::rejoin;
use crate::{clock, out};

/// The largest token file read; a token is under 120 bytes.
const MAX_TOKEN_FILE: u64 = 4096;

#[derive(clap::Args, Debug)]
pub(crate) struct JoinArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Read the join token from this file (else from BCD_JOIN_TOKEN; never from the command line)
    #[arg(long, value_name = "F")]
    token_file: Option<PathBuf>,
    /// The role to join as; the token must be for it
    #[arg(long, value_enum, default_value_t = JoinRole::Node)]
    role: JoinRole,
    /// Move the present identity aside (renamed, not deleted) and join as a new machine
    #[arg(long)]
    reset: bool,
    /// Confirm --reset
    #[arg(long, requires = "reset")]
    yes: bool,
    /// How the machine proves it may join: a join token, its TPM (no token), its last
    /// certificate (x509pop: re-join as itself, with the role it has), the single-use
    /// token of its user data (provisioned: bound to this machine's product UUID), or its
    /// cloud's identity document (cloud-iid: a cloud VM, no token)
    #[arg(long, value_enum, default_value_t = AttestorArg::JoinToken)]
    attestor: AttestorArg,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum AttestorArg {
    JoinToken,
    Tpm,
    X509pop,
    Provisioned,
    CloudIid,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum JoinRole {
    Node,
    Site,
}

impl JoinRole {
    fn wire(self) -> Role {
        match self {
            JoinRole::Node => Role::Node,
            JoinRole::Site => Role::Site,
        }
    }
}

/// `env_token` is `BCD_JOIN_TOKEN` as `main` took it out of the environment.
pub(crate) fn run(args: JoinArgs, env_token: Option<TokenText>) -> anyhow::Result<ExitCode> {
    if args.attestor == AttestorArg::X509pop {
        drop(env_token);
        return run_x509pop(&args);
    }
    let token_attestor = if args.attestor == AttestorArg::Provisioned {
        if args.role != JoinRole::Node {
            out::err_line(format_args!(
                "bcd: --attestor provisioned joins a node: leave out --role"
            ));
            return Ok(ExitCode::from(2));
        }
        attestor::PROVISIONED
    } else {
        attestor::JOIN_TOKEN
    };
    let tokenless = match args.attestor {
        AttestorArg::Tpm => Some("the TPM is the credential"),
        AttestorArg::CloudIid => Some("the cloud's identity document is the credential"),
        _ => None,
    };
    if let (Some(why), true) = (tokenless, args.token_file.is_some()) {
        out::err_line(format_args!(
            "bcd: --token-file with --attestor {}: {why}, no token is read",
            if args.attestor == AttestorArg::Tpm {
                "tpm"
            } else {
                "cloud-iid"
            }
        ));
        return Ok(ExitCode::from(2));
    }
    // A tokenless join reads no token: BCD_JOIN_TOKEN, already out of the
    // environment, is dropped unread.
    let env_token = if tokenless.is_some() { None } else { env_token };
    let config = Config::load(&args.config.path)?;
    let obtain = |env_token| -> anyhow::Result<Credential> {
        match args.attestor {
            AttestorArg::Tpm => Ok(Credential::Tpm),
            AttestorArg::CloudIid => Ok(Credential::CloudIid(match &config.cloud_oidc {
                Some(oidc) => crate::evidence::cloud_iid::oidc(oidc)?,
                None => crate::evidence::cloud_iid::fetch(
                    config.cloud_metadata_url.as_deref(),
                    config.api.as_str(),
                )?,
            })),
            _ => Ok(Credential::Token {
                token: obtain_token(args.token_file.as_deref(), env_token)?.parse()?,
                attestor: token_attestor,
            }),
        }
    };
    let dir = &config.data_dir;
    // bcd join opens the TPM itself, [helper] or not; under [helper] it
    // leaves the data directory to the node's user.
    let node_user = crate::identity::owner::trust_node_user(&config)?;
    let tpm = TpmAccess::configured(&config);

    let credential = if args.reset {
        let moves = reset::plan(dir, clock::now())?;
        if !args.yes {
            if moves.is_empty() {
                out::line(format_args!("nothing to reset in {}", dir.display()))?;
            }
            for m in &moves {
                out::line(format_args!(
                    "would move {} to {}",
                    m.from.display(),
                    m.to.display()
                ))?;
            }
            out::err_line(format_args!(
                "bcd: --reset moves the identity aside; run again with --reset --yes to do it"
            ));
            return Ok(ExitCode::from(2));
        }
        // The spec: the reset happens before the join reads any credential,
        // and a join that then fails leaves the identity moved aside. So the
        // two-run recovery bcd prints (`bcd join --reset --yes`, then `bcd
        // join`) works, and its first run may carry no token at all.
        reset::apply(dir, &moves)?;
        for m in &moves {
            out::line(format_args!(
                "moved {} to {}",
                m.from.display(),
                m.to.display()
            ))?;
        }
        match obtain(env_token) {
            Ok(credential) => credential,
            Err(e) if !moves.is_empty() => {
                return Err(e.context("the identity is moved aside; a later `bcd join` joins"))
            }
            Err(e) => return Err(e),
        }
    } else {
        match Identity::load(dir, &tpm) {
            Ok(Some(id)) => {
                hand_over(dir, node_user)?;
                out::line(format_args!("already joined as {}", id.node_id))?;
                return Ok(ExitCode::SUCCESS);
            }
            Ok(None) => {}
            // The spec: a join proceeds when the old identity no longer
            // loads (e.g. after TPM2_Clear); `--reset --yes` would keep the
            // old files instead of overwriting them.
            Err(e) => tracing::warn!(
                dir = %dir.display(),
                error = %e,
                "the identity here does not load; joining again replaces it (bcd join --reset --yes keeps the old files)"
            ),
        }
        obtain(env_token)?
    };

    let node_id = joining::join(&config, &tpm, credential, args.role.wire())?;
    hand_over(dir, node_user)?;
    out::line(format_args!("joined as {node_id}"))?;
    Ok(ExitCode::SUCCESS)
}

/// Under `[helper]` (`node_user`): the data directory and its files to the
/// node's user, 0700/0600.
fn hand_over(dir: &std::path::Path, node_user: Option<(u32, u32)>) -> anyhow::Result<()> {
    let Some((uid, gid)) = node_user else {
        return Ok(());
    };
    crate::identity::owner::hand_over(dir, uid, gid).with_context(|| {
        format!(
            "cannot give {} to the [helper] user (uid {uid})",
            dir.display()
        )
    })
}

/// `bcd join --attestor x509pop`: re-join as the node this machine already
/// is, with its last certificate (expired or not) and the key it certifies.
fn run_x509pop(args: &JoinArgs) -> anyhow::Result<ExitCode> {
    let usage = |what: &str| -> anyhow::Result<ExitCode> {
        out::err_line(format_args!("bcd: {what} with --attestor x509pop: x509pop re-joins with the identity this machine has"));
        Ok(ExitCode::from(2))
    };
    if args.token_file.is_some() {
        return usage("--token-file");
    }
    if args.reset {
        return usage("--reset");
    }
    let config = Config::load(&args.config.path)?;
    let dir = &config.data_dir;
    let tpm = TpmAccess::configured(&config);
    let current = match Identity::load(dir, &tpm) {
        Ok(Some(id)) => id,
        Ok(None) => {
            return Err(anyhow!(
                "no identity in {} to re-join with: x509pop re-joins a node with its last certificate; join with a token or --attestor tpm",
                dir.display()
            ))
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "the identity in {} does not load, and x509pop needs its certificate's key",
                dir.display()
            )))
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut staged = None;
    let rejoined = runtime.block_on(rejoin::rejoin_x509pop(&config, &tpm, &current, &mut staged));
    if staged.is_some() {
        // A one-off command: no retry will send the staged key.
        rotation::abandon(&config.data_dir);
    }
    let next = rejoined?;
    out::line(format_args!("re-joined as {}", next.node_id))?;
    Ok(ExitCode::SUCCESS)
}

/// The token from `--token-file` (contents trimmed) or else from the
/// environment; never from argv, where every user of the machine sees it.
fn obtain_token(file: Option<&Path>, env_token: Option<TokenText>) -> anyhow::Result<TokenText> {
    let Some(path) = file else {
        return env_token
            .ok_or_else(|| anyhow!("no join token: pass --token-file F or set BCD_JOIN_TOKEN (never on the command line)"));
    };
    if env_token.is_some() {
        tracing::info!("both --token-file and BCD_JOIN_TOKEN are set; using the file");
    }
    let origin = format!("the token file {}", path.display());
    let bytes =
        match bc_wire::file::read_regular(path, MAX_TOKEN_FILE, bc_wire::file::Links::Follow) {
            Ok(b) => b,
            Err(e @ bc_wire::file::FileError::TooLarge(_)) => {
                return Err(anyhow!("{origin} does not hold a join token ({e})"))
            }
            Err(bc_wire::file::FileError::Io(e)) => {
                return Err(anyhow!(e).context(format!("cannot read {origin}")))
            }
            Err(e) => return Err(anyhow!("{origin}: {e}")),
        };
    let text = match String::from_utf8(bytes) {
        Ok(t) => Zeroizing::new(t),
        Err(e) => {
            drop(Zeroizing::new(e.into_bytes()));
            return Err(anyhow!("{origin} does not hold a join token (not UTF-8)"));
        }
    };
    let trimmed = Zeroizing::new(text.trim().to_owned());
    if trimmed.is_empty() {
        return Err(anyhow!("{origin} is empty; expected a join token"));
    }
    Ok(TokenText::new(trimmed, origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_from_file_is_trimmed_and_preferred() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("t");
        std::fs::write(&f, "  tok_a.AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8\n").unwrap();
        let env = TokenText::new(Zeroizing::new("tok_b.x".into()), "BCD_JOIN_TOKEN");
        let t = obtain_token(Some(&f), Some(env)).unwrap();
        assert_eq!(t.parse().unwrap().id, "tok_a");
        std::fs::write(&f, "tok_a.short").unwrap();
        let e = obtain_token(Some(&f), None)
            .unwrap()
            .parse()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("the token file ")
                && e.ends_with(" does not hold a join token (expected tok_<id>.<secret>)"),
            "{e}"
        );
    }

    #[test]
    fn no_token_is_a_clear_error() {
        let e = obtain_token(None, None).unwrap_err().to_string();
        assert!(e.starts_with("no join token"), "{e}");
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("empty");
        std::fs::write(&f, "\n").unwrap();
        assert!(obtain_token(Some(&f), None)
            .unwrap_err()
            .to_string()
            .ends_with("is empty; expected a join token"));
        let missing = format!(
            "{:#}",
            obtain_token(Some(&tmp.path().join("nope")), None).unwrap_err()
        );
        assert!(
            missing.starts_with("cannot read the token file"),
            "{missing}"
        );
    }
}
