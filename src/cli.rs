//! The command line, dispatch only: it takes the join token out of the
//! environment, parses the command line, sets up logging, and turns errors
//! into `bcd: <message>` and exit codes (1 failure, 2 usage).

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};
use p256::elliptic_curve::zeroize::Zeroizing;

use crate::evidence::join_token::TokenText;
use crate::{doctor, gendocs, helper, identify, join, node, out, ramdisk, site, status};

/// The environment variable that may carry a join token.
const TOKEN_ENV: &str = "BCD_JOIN_TOKEN";

#[derive(Parser, Debug)]
#[command(
    name = "bcd",
    version,
    about = "Node agent: joins a Better Compute control plane and keeps the node's identity"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Join the control plane and save the node identity
    Join(join::JoinArgs),
    /// Run as a node: stay joined (renewals, re-joins)
    Node(node::NodeArgs),
    /// Run the root helper: serve [helper] user's node keys from the TPM
    Helper(helper::HelperArgs),
    /// As a PXE ramdisk: join with the boot server's assertion (bc.token, bc.assertion on the kernel command line) and stay joined
    Ramdisk(ramdisk::RamdiskArgs),
    /// As a site node: hold the site's boot lease and serve PXE ([site]): iPXE scripts with a signed discovery assertion, and the ramdisk
    Site(site::SiteArgs),
    /// Show the node identity
    Status(status::StatusArgs),
    /// Check the configuration, identity, TPM and control plane, and say what to do
    Doctor(doctor::DoctorArgs),
    /// The TPM, as an operator admitting this machine needs to know it
    #[command(subcommand)]
    Tpm(TpmCommand),
    /// The man page and shell completions, for packaging (scripts/package)
    #[command(hide = true)]
    GenerateDocs(gendocs::GenerateDocsArgs),
}

#[derive(Subcommand, Debug)]
enum TpmCommand {
    /// The EK's SHA-256, its certificate and the TPM's maker and firmware
    Identify(identify::IdentifyArgs),
}

/// The whole of `bcd`: called by `main` and nothing else.
pub fn main() -> ExitCode {
    let env_token = take_env_token();
    quiet_libtss2();
    let cli = Cli::parse();
    init_logging();
    // Everything builds its TLS config with the ring provider explicitly; the
    // process default is ring too, so nothing can fall back to another one.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let result = match cli.command {
        Command::Join(args) => join::run(args, env_token),
        Command::Status(args) => {
            drop(env_token);
            status::run(args)
        }
        Command::Node(args) => {
            drop(env_token);
            node::run(args)
        }
        Command::Helper(args) => {
            drop(env_token);
            helper::run(args)
        }
        Command::Ramdisk(args) => {
            drop(env_token);
            ramdisk::run(args)
        }
        Command::Site(args) => {
            drop(env_token);
            site::run(args)
        }
        Command::Doctor(args) => {
            drop(env_token);
            doctor::run(args)
        }
        Command::Tpm(TpmCommand::Identify(args)) => {
            drop(env_token);
            identify::run(args)
        }
        Command::GenerateDocs(args) => {
            drop(env_token);
            gendocs::run(args, Cli::command())
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            out::err_line(format_args!("bcd: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Reads `BCD_JOIN_TOKEN` once, overwrites its value where the kernel keeps
/// the process's initial environment, and removes it, so that no child
/// process, crash report or `/proc/<pid>/environ` reader sees it later,
/// whichever subcommand runs. (`remove_var` alone only unlinks the entry: the
/// bytes stay in `/proc/<pid>/environ`.)
///
/// Sound only while no other thread reads the environment: this runs first
/// thing in `main`, before the runtime, the logger or any library starts a
/// thread. (Edition 2021 marks `remove_var` safe; under edition 2024 it
/// becomes an `unsafe` block justified by the same reasoning.)
fn take_env_token() -> Option<TokenText> {
    let value = std::env::var_os(TOKEN_ENV)?;
    // Non-UTF-8 text is no token; the lossy form fails to parse with a clear message.
    let text = Zeroizing::new(value.to_string_lossy().into_owned());
    drop(Zeroizing::new(value.into_encoded_bytes()));
    crate::environ::erase_value(TOKEN_ENV);
    std::env::remove_var(TOKEN_ENV);
    Some(TokenText::new(text, TOKEN_ENV))
}

/// libtss2 prints WARNING/ERROR lines to stderr for every TPM error, which
/// bcd reports itself with the command and the response code's meaning. Set
/// before any thread starts (same reasoning as [`take_env_token`]); an
/// operator's own `TSS2_LOG` wins.
fn quiet_libtss2() {
    if std::env::var_os("TSS2_LOG").is_none() {
        std::env::set_var("TSS2_LOG", "all+none");
    }
}

/// Logs to stderr, `RUST_LOG` to filter (default `info`), no timestamps:
/// a CLI's lines are read as they come, and journald adds its own.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .with_target(false)
        .init();
}
