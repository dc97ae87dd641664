//! `bc-controlplane`: the command line of the reference control plane.
//!
//! Every command works on one DIR (`--dir`): the PKI bundle `init` writes and
//! the SQLite database. Errors print `bc-controlplane: <what and what to do>`
//! and exit 1; usage errors exit 2 (clap). The commands live in [`cli`], one
//! module per command group.

mod cli;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Result;
use bc_controlplane::pki;
use clap::{Parser, Subcommand};

use cli::{
    bootlog, clock, cloud, commands, dist, events, images, install_script, leases, migrate, nodes,
    pools, server, sites, tenants, tokens, tpm, user_data, workflows, Dir,
};

#[derive(Parser)]
#[command(
    name = "bc-controlplane",
    version,
    about = "Reference control plane for bcd: JoinService over HTTPS, PKI, SQLite"
)]
struct Cli {
    /// The PostgreSQL database instead of DIR's `[database] url` (or
    /// SQLite): postgres://USER@HOST[:PORT]/DB[?sslmode=…]. Never a
    /// password: give it in a 0600 file, [database] password_file or
    /// BC_CONTROLPLANE_DATABASE_PASSWORD_FILE. Also
    /// BC_CONTROLPLANE_DATABASE_URL (this flag wins).
    #[arg(long, global = true, value_name = "URL")]
    database_url: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write a new PKI bundle into DIR (refuses a DIR that has one).
    Init {
        #[command(flatten)]
        dir: Dir,
        /// SPIFFE trust domain of the node identities.
        #[arg(long, default_value = pki::DEFAULT_TRUST_DOMAIN)]
        trust_domain: String,
        /// A host name or IP address to add to the TLS certificate (beside
        /// localhost, 127.0.0.1, ::1), so agents can reach it at the address
        /// they see. Repeatable.
        #[arg(long = "san", value_name = "HOST_OR_IP")]
        sans: Vec<String>,
    },
    /// Bring DIR's database to this build's schema (serve does it at start
    /// too): "schema version N → M" or "already at schema version M".
    Migrate(migrate::MigrateArgs),
    /// Serve the JoinService over HTTPS until SIGTERM or SIGINT.
    Serve {
        #[command(flatten)]
        dir: Dir,
        /// IP:PORT to listen on; port 0 picks a free port.
        #[arg(long, value_name = "ADDR")]
        listen: SocketAddr,
    },
    /// Print a bcd config.toml that pins this control plane.
    AgentConfig {
        #[command(flatten)]
        dir: Dir,
        /// The control plane URL agents use, e.g. https://127.0.0.1:8443.
        #[arg(long, value_name = "URL")]
        api: String,
        /// The agent's data directory.
        #[arg(long, value_name = "D", default_value = "/var/lib/bcd")]
        data_dir: String,
    },
    /// Join tokens.
    Token {
        #[command(subcommand)]
        cmd: tokens::TokenCmd,
    },
    /// Joined nodes and their lifecycle.
    Nodes {
        #[command(subcommand)]
        cmd: nodes::NodesCmd,
    },
    /// Commands for nodes over the command channel: send, list, show.
    Commands {
        #[command(subcommand)]
        cmd: commands::CommandsCmd,
    },
    /// The event log (joins, refusals) and its retention.
    Events {
        #[command(subcommand)]
        cmd: events::EventsCmd,
    },
    /// The database clock used for every expiry check and certificate validity.
    Clock {
        #[command(subcommand)]
        cmd: clock::ClockCmd,
    },
    /// The TPM makers' CA certificates EK certificates must chain to (tpm attestor).
    EkRoots {
        #[command(subcommand)]
        cmd: tpm::EkRootsCmd,
    },
    /// The tpm attestor's allow-list: EKs that may join without enrollment.
    Resolve {
        #[command(subcommand)]
        cmd: tpm::ResolveCmd,
    },
    /// Join requests of TPMs waiting for an operator (tpm enrollment).
    Requests {
        #[command(subcommand)]
        cmd: tpm::RequestsCmd,
    },
    /// TCG event logs, offline: show what a log says, verify it against
    /// PCR values, a quote and a boot policy.
    Eventlog {
        #[command(subcommand)]
        cmd: bootlog::EventlogCmd,
    },
    /// Boot policies (pools update --boot-policy).
    BootPolicy {
        #[command(subcommand)]
        cmd: bootlog::BootPolicyCmd,
    },
    /// Pools: every node belongs to one; a pool can require attestors.
    Pools {
        #[command(subcommand)]
        cmd: pools::PoolsCmd,
    },
    /// Tenants: they own pools, and events are attributed to them.
    Tenants {
        #[command(subcommand)]
        cmd: tenants::TenantsCmd,
    },
    /// Node leases: a node lent to a tenant runs only the lessee kinds.
    Leases {
        #[command(subcommand)]
        cmd: leases::LeasesCmd,
    },
    /// Packages machines install (served at GET /dist/<name>).
    Dist {
        #[command(subcommand)]
        cmd: dist::DistCmd,
    },
    /// Print a POSIX sh script that installs or upgrades bcd and joins.
    InstallScript(install_script::InstallScriptArgs),
    /// OS images deploy.image writes to disks (served to ramdisks at
    /// GET /v1/images/<name>).
    Images {
        #[command(subcommand)]
        cmd: images::ImagesCmd,
    },
    /// Print a #cloud-config that runs the install script on first boot.
    UserData(user_data::UserDataArgs),
    /// Sites: each has a boot server (site nodes holding its boot lease).
    Sites {
        #[command(subcommand)]
        cmd: sites::SitesCmd,
    },
    /// Cloud VMs joining with their identity document (cloud-iid).
    Cloud {
        #[command(subcommand)]
        cmd: cloud::CloudCmd,
    },
    /// Machines a site commissions over PXE (discovery).
    Boot {
        #[command(subcommand)]
        cmd: sites::BootCmd,
    },
    /// Commission and deploy machines: start, list, show, cancel.
    Workflows {
        #[command(subcommand)]
        cmd: workflows::WorkflowsCmd,
    },
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    init_tracing();
    match cli::set_database(cli.database_url.take()).and_then(|()| run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bc-controlplane: {e:#}");
            match e.downcast_ref::<cli::ExitWith>() {
                Some(exit) => ExitCode::from(exit.code),
                None => ExitCode::FAILURE,
            }
        }
    }
}

/// Logs go to stderr (stdout carries command output); `RUST_LOG` wins over
/// the default `info`.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Init {
            dir,
            trust_domain,
            sans,
        } => server::init(&dir.dir, &trust_domain, &sans),
        Cmd::Migrate(args) => migrate::run(args),
        Cmd::Serve { dir, listen } => server::serve(&dir.dir, listen),
        Cmd::AgentConfig { dir, api, data_dir } => server::agent_config(&dir.dir, &api, &data_dir),
        Cmd::Token { cmd } => tokens::run(cmd),
        Cmd::Nodes { cmd } => nodes::run(cmd),
        Cmd::Commands { cmd } => commands::run(cmd),
        Cmd::Events { cmd } => events::run(cmd),
        Cmd::Clock { cmd } => clock::run(cmd),
        Cmd::EkRoots { cmd } => tpm::run_ek_roots(cmd),
        Cmd::Resolve { cmd } => tpm::run_resolve(cmd),
        Cmd::Requests { cmd } => tpm::run_requests(cmd),
        Cmd::Pools { cmd } => pools::run(cmd),
        Cmd::Tenants { cmd } => tenants::run(cmd),
        Cmd::Leases { cmd } => leases::run(cmd),
        Cmd::Eventlog { cmd } => bootlog::run_eventlog(cmd),
        Cmd::BootPolicy { cmd } => bootlog::run_boot_policy(cmd),
        Cmd::Dist { cmd } => dist::run(cmd),
        Cmd::Images { cmd } => images::run(cmd),
        Cmd::InstallScript(args) => install_script::run(args),
        Cmd::UserData(args) => user_data::run(args),
        Cmd::Sites { cmd } => sites::run_sites(cmd),
        Cmd::Boot { cmd } => sites::run_boot(cmd),
        Cmd::Workflows { cmd } => workflows::run(cmd),
        Cmd::Cloud { cmd } => cloud::run(cmd),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_controlplane::{records, tokens as token_rows};
    use bc_controlplane::{ControlPlane, JoinService};
    use bc_wire::agent::Role;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn clock_offset_accepts_negative() {
        let cli = Cli::try_parse_from([
            "bc-controlplane",
            "clock",
            "set",
            "--dir",
            "/x",
            "--offset",
            "-1h",
        ]);
        assert!(cli.is_ok());
        let cli = Cli::try_parse_from([
            "bc-controlplane",
            "token",
            "create",
            "--dir",
            "/x",
            "--role",
            "node",
            "--uses",
            "0",
        ]);
        assert!(cli.is_err());
    }

    #[test]
    fn images_commands_parse() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["bc-controlplane", "images"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv)
        };
        assert!(parse(&["add", "--dir", "/x", "debian", "/tmp/d.raw.zst"]).is_ok());
        assert!(parse(&["add", "--dir", "/x", "--replace", "--json", "d", "/f"]).is_ok());
        assert!(parse(&["add", "--dir", "/x", "debian"]).is_err(), "no file");
        assert!(parse(&["list", "--dir", "/x", "--json"]).is_ok());
        assert!(parse(&["remove", "--dir", "/x", "debian"]).is_ok());
        assert!(parse(&["remove", "--dir", "/x"]).is_err());
    }

    /// The lifecycle commands on a real DIR with a node joined through
    /// the JoinService.
    #[test]
    fn node_lifecycle_commands() {
        use prost::Message;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cp");
        let d = dir.to_str().unwrap().to_owned();
        let cli = |args: &[&str]| {
            let mut argv = vec!["bc-controlplane"];
            argv.extend_from_slice(args);
            run(Cli::try_parse_from(argv).unwrap())
        };
        cli(&["init", "--dir", &d]).unwrap();
        let svc = ControlPlane::open(&dir).unwrap();
        let (tok, _) = token_rows::create_token(svc.database(), Role::Node, 1, 60_000).unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let csr = rcgen::CertificateParams::default()
            .serialize_request(&key)
            .unwrap()
            .der()
            .to_vec();
        let sealed =
            bc_wire::sealing::SealingKey::from_spki_der(svc.bundle().join_encryption_spki_der())
                .unwrap()
                .seal(&bc_wire::sha256(&csr), tok.expose().as_bytes())
                .unwrap();
        let resp = JoinService::new(&svc)
            .join(bc_wire::agent::JoinRequest {
                csr,
                role: Role::Node as i32,
                sealed_token: sealed,
                ..Default::default()
            })
            .unwrap();
        let id = bc_wire::agent::JoinResponseBody::decode(resp.body.as_slice())
            .unwrap()
            .node_id;

        cli(&["nodes", "list", "--dir", &d, "--json"]).unwrap();
        cli(&["nodes", "certs", "--dir", &d, &id, "--json"]).unwrap();
        cli(&["nodes", "certs", "--dir", &d, &id]).unwrap();
        assert!(cli(&["nodes", "certs", "--dir", &d, "node_nope"]).is_err());
        cli(&["nodes", "revoke-identity", "--dir", &d, &id]).unwrap();
        cli(&["nodes", "retire", "--dir", &d, &id]).unwrap();
        cli(&["nodes", "retire", "--dir", &d, &id]).unwrap();
        let e = cli(&["nodes", "delete", "--dir", &d, &id, "--yes"]).unwrap_err();
        assert!(e.to_string().contains("not cordoned"), "{e}");
        cli(&["nodes", "cordon", "--dir", &d, &id]).unwrap();
        let e = cli(&["nodes", "delete", "--dir", &d, &id]).unwrap_err();
        assert!(e.to_string().contains("--yes"), "{e}");
        cli(&["nodes", "delete", "--dir", &d, &id, "--yes"]).unwrap();
        assert!(cli(&["nodes", "cordon", "--dir", &d, &id]).is_err());

        let kinds: Vec<_> = records::list_events(svc.database())
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(
            kinds,
            [
                records::EVENT_NODE_JOINED,
                records::EVENT_IDENTITY_REVOKED,
                records::EVENT_NODE_RETIRED,
                records::EVENT_NODE_CORDONED,
                records::EVENT_NODE_DELETED,
            ]
        );
        assert!(records::list_nodes(svc.database()).unwrap().is_empty());
        // Pools may require x509pop now.
        cli(&[
            "pools",
            "create",
            "--dir",
            &d,
            "--id",
            "p",
            "--join-attestors",
            "tpm,x509pop",
        ])
        .unwrap();
    }
}
