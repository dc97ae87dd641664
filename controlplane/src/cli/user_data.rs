//! `user-data`: a `#cloud-config` that runs the install script on a
//! machine's first boot (`install/cloud-init.example.yaml` is an annotated
//! copy). For `--attestor join-token` it also writes the token, from
//! `--token-file`, to the 0600 file the script reads and then removes: a
//! token of this directory with one use left, since user data stays
//! readable through the metadata service for the VM's life (more uses only
//! with `--allow-multi-use`); for
//! `--attestor provisioned` it mints a single-use provisioned token bound to
//! the machine (`--expect-product-uuid U`, or `--node N` to re-key that node
//! in place) and writes it there the same way.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use bc_controlplane::machine::Expect;
use bc_wire::token::JoinToken;
use clap::Args;

use super::install_script::{self, Attestor, Target};
use super::{print_stdout, Dir};

/// A join token is one short line; anything longer is not one.
const MAX_TOKEN_BYTES: u64 = 4096;

#[derive(Args)]
pub(crate) struct UserDataArgs {
    #[command(flatten)]
    pub dir: Dir,
    #[command(flatten)]
    pub target: Target,
    /// With --attestor join-token: a file holding the token (never on the command line).
    #[arg(long, value_name = "F")]
    pub token_file: Option<PathBuf>,
    /// With --token-file: embed a token with more than one use left. User
    /// data stays readable through the cloud's metadata service for the
    /// VM's whole life, so anyone who reads it later could join with it.
    #[arg(long, requires = "token_file")]
    pub allow_multi_use: bool,
    #[command(flatten)]
    pub provisioned: ProvisionedArgs,
}

/// What `--attestor provisioned` mints the token for.
#[derive(Args)]
pub(crate) struct ProvisionedArgs {
    /// With --attestor provisioned: the machine's product UUID
    /// (/sys/class/dmi/id/product_uuid); it joins as a new node.
    #[arg(long, value_name = "UUID", value_parser = super::tokens::parse_expect_product_uuid, conflicts_with = "node")]
    pub expect_product_uuid: Option<String>,
    /// With --attestor provisioned: the node this machine is; the join
    /// re-keys it in place (it must claim that node's product UUID).
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// With --attestor provisioned: how long the token lasts (e.g. 24h).
    #[arg(long, default_value = "24h", value_parser = super::tokens::parse_ttl)]
    pub ttl: i64,
}

pub(crate) fn run(args: UserDataArgs) -> Result<()> {
    let p = &args.provisioned;
    let binds = p.expect_product_uuid.is_some() || p.node.is_some();
    if binds && args.target.attestor != Attestor::Provisioned {
        bail!("--expect-product-uuid and --node are for --attestor provisioned");
    }
    // Before any token is minted: a directory that cannot make the script
    // mints nothing.
    let script = install_script::script(&args.dir.dir, &args.target)?;
    let token = match (args.target.attestor, &args.token_file) {
        (Attestor::Provisioned, Some(_)) => {
            bail!("--attestor provisioned mints its own token: drop --token-file")
        }
        (Attestor::Provisioned, None) if !binds => {
            bail!("--attestor provisioned needs --expect-product-uuid U or --node N (the token is bound to one machine)")
        }
        (Attestor::Provisioned, None) => Some(mint(&args.dir.dir, p)?),
        (Attestor::JoinToken, Some(f)) => {
            let token = read_token(f)?;
            check_uses(&args.dir.dir, &token, args.allow_multi_use)?;
            Some(token.expose())
        }
        (Attestor::JoinToken, None) => {
            bail!("--attestor join-token needs --token-file F (the token goes into the user data, 0600 on the machine)")
        }
        (Attestor::Tpm, Some(_)) => {
            bail!("--attestor tpm reads no token: drop --token-file")
        }
        (Attestor::Tpm, None) => None,
        (Attestor::CloudIid, Some(_)) => {
            bail!("--attestor cloud-iid reads no token: drop --token-file")
        }
        (Attestor::CloudIid, None) => None,
    };
    print_stdout(&bc_controlplane::userdata::cloud_config(
        &script,
        token.as_deref(),
    ))
}

/// A single-use provisioned token for the machine `p` names.
fn mint(dir: &std::path::Path, p: &ProvisionedArgs) -> Result<String> {
    let db = super::open_db(dir)?;
    let opts = super::tokens::CreateOpts {
        pool: None,
        expect: Expect {
            product_uuid: p.expect_product_uuid.clone(),
            mac: None,
        },
        site: None,
        node: p.node.as_deref(),
        allow_reclaim: false,
    };
    super::tokens::create(&db, super::tokens::TokenRole::Provisioned, 1, p.ttl, &opts)
}

/// Refuses a token this directory did not issue, and (without
/// `--allow-multi-use`) one with more than one use left: the user data
/// outlives the join, readable through the metadata service by whoever
/// gets onto the VM or its metadata later.
fn check_uses(dir: &std::path::Path, token: &JoinToken, allow_multi_use: bool) -> Result<()> {
    let db = super::open_db(dir)?;
    let row = db
        .write(|tx| bc_controlplane::tokens::token_for_update(tx, &token.id))
        .context("cannot read the token's uses")?
        .map(|r| r.uses_left);
    let Some(uses_left) = row else {
        bail!(
            "{} has no token {}: user-data embeds only a token of this control plane (bc-controlplane token create)",
            dir.display(),
            token.id
        );
    };
    if uses_left > 1 && !allow_multi_use {
        bail!(
            "token {} has {uses_left} uses left: user data stays readable through the cloud's metadata service for the VM's whole life, so anyone who reads it later could join more machines with it; use --attestor provisioned (a single-use token bound to this machine), a token with --uses 1, or --allow-multi-use",
            token.id
        );
    }
    Ok(())
}

fn read_token(path: &std::path::Path) -> Result<JoinToken> {
    let bytes = bc_wire::file::read_regular(path, MAX_TOKEN_BYTES, bc_wire::file::Links::Follow)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{} is not UTF-8: not a join token", path.display()))?;
    JoinToken::parse(&text)
        .map_err(|e| anyhow::anyhow!("{} does not hold one join token: {e}", path.display()))
}
