//! `bc-controlplane`: the command line of the reference control plane.
//!
//! Every command works on one DIR (`--dir`): the PKI bundle `init` writes and
//! the SQLite database. Errors print `bc-controlplane: <what and what to do>`
//! and exit 1; usage errors exit 2 (clap).

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use bc_controlplane::attestors::tpm::{ek, enroll};
use bc_controlplane::config::parse_duration_ms;
use bc_controlplane::{
    attestor, config, db, http, join::JoinService, nodes, pki, pools, records, tokens,
};
use bc_wire::agent::Role;
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "bc-controlplane",
    version,
    about = "Reference control plane for bcd: JoinService over HTTPS, PKI, SQLite"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args)]
struct Dir {
    /// The control plane directory (PKI bundle and controlplane.db).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
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
    },
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
        cmd: TokenCmd,
    },
    /// Joined nodes and their lifecycle.
    Nodes {
        #[command(subcommand)]
        cmd: NodesCmd,
    },
    /// The event log (joins, refusals).
    Events {
        #[command(subcommand)]
        cmd: ListCmd,
    },
    /// The database clock used for every expiry check and certificate validity.
    Clock {
        #[command(subcommand)]
        cmd: ClockCmd,
    },
    /// The TPM makers' CA certificates EK certificates must chain to (tpm attestor).
    EkRoots {
        #[command(subcommand)]
        cmd: EkRootsCmd,
    },
    /// The tpm attestor's allow-list: EKs that may join without enrollment.
    Resolve {
        #[command(subcommand)]
        cmd: ResolveCmd,
    },
    /// Join requests of TPMs waiting for an operator (tpm enrollment).
    Requests {
        #[command(subcommand)]
        cmd: RequestsCmd,
    },
    /// Pools: every node belongs to one; a pool can require attestors.
    Pools {
        #[command(subcommand)]
        cmd: PoolsCmd,
    },
}

#[derive(Subcommand)]
enum NodesCmd {
    /// List the nodes (deleted ones left out).
    List {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        json: bool,
    },
    /// List a node's certificates, oldest first.
    Certs {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Raise the node's identity generation and revoke every certificate it
    /// has: none of them ever renews or re-joins again.
    RevokeIdentity {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
    },
    /// Retire a node: it never renews, re-joins or is reclaimed again.
    Retire {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
    },
    /// Cordon a node, the step before deleting it.
    Cordon {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
    },
    /// Delete a cordoned node: revoke its certificates and free its
    /// hardware bindings, so the machine can join again as a new node.
    Delete {
        #[command(flatten)]
        dir: Dir,
        /// The node id (node_…).
        id: String,
        /// Confirm: deleting cannot be undone.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Subcommand)]
enum EkRootsCmd {
    /// Trust the CA certificates in FILE.pem (a maker's root or intermediate).
    Add {
        #[command(flatten)]
        dir: Dir,
        /// PEM file with one or more CA certificates.
        #[arg(value_name = "FILE.pem")]
        file: PathBuf,
    },
    /// List the trusted EK roots.
    List {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ResolveCmd {
    /// Let the TPM with this EK join (replaces its entry if there is one).
    Add {
        #[command(flatten)]
        dir: Dir,
        /// SHA-256 of the EK's SubjectPublicKeyInfo (ekSha256 of bcd tpm identify).
        #[arg(long, value_name = "HEX")]
        ek_sha256: String,
        /// The pool a new node joins (default: default).
        #[arg(long, value_name = "ID")]
        pool: Option<String>,
        /// Join as this existing node instead of a new one.
        #[arg(long, value_name = "ID")]
        node: Option<String>,
    },
    /// Remove the entry of an EK.
    Remove {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_name = "HEX")]
        ek_sha256: String,
    },
    /// List the entries.
    List {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum RequestsCmd {
    /// List join requests.
    List {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending request: the TPM's next join admits it once.
    Approve {
        #[command(flatten)]
        dir: Dir,
        /// The request id (req_…).
        id: String,
        /// The pool its node joins (default: default).
        #[arg(long, value_name = "P")]
        pool: Option<String>,
    },
    /// Deny a pending request: that TPM's joins are refused.
    Deny {
        #[command(flatten)]
        dir: Dir,
        /// The request id (req_…).
        id: String,
    },
}

#[derive(Subcommand)]
enum PoolsCmd {
    /// Create a pool.
    Create {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_name = "ID")]
        id: String,
        #[arg(long, value_name = "O", default_value = pools::DEFAULT_OWNER)]
        owner: String,
        /// The attestors that may admit a machine into it (default: any).
        #[arg(long, value_name = "A,B", value_delimiter = ',')]
        join_attestors: Option<Vec<String>>,
    },
    /// Replace a pool's joinAttestors.
    Update {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_name = "ID")]
        id: String,
        #[arg(
            long,
            value_name = "A,B",
            value_delimiter = ',',
            required_unless_present = "any_attestor"
        )]
        join_attestors: Option<Vec<String>>,
        /// Remove joinAttestors: any attestor may admit a machine.
        #[arg(long, conflicts_with = "join_attestors")]
        any_attestor: bool,
    },
    /// List pools.
    List {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Mint a token and print it (and nothing else) on stdout.
    Create {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, value_enum)]
        role: TokenRole,
        /// How many joins the token admits.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        uses: u32,
        /// Lifetime: an integer and a unit s, m, h or d (e.g. 15m, 24h, 7d).
        #[arg(long, default_value = "24h", value_parser = parse_ttl)]
        ttl: i64,
        /// The pool its nodes join (default: default).
        #[arg(long, value_name = "ID")]
        pool: Option<String>,
    },
    /// Revoke a token by id.
    Revoke {
        #[command(flatten)]
        dir: Dir,
        /// The token id (tok_…).
        id: String,
    },
    /// List tokens (never their secrets).
    List {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ListCmd {
    List {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ClockCmd {
    /// Set the database clock to system time plus OFFSET.
    Set {
        #[command(flatten)]
        dir: Dir,
        /// A signed duration: -1h, +25h, 0s, 90m, 7d.
        #[arg(long, allow_hyphen_values = true, value_parser = parse_offset)]
        offset: i64,
    },
    /// Print the clock offset and the database's time.
    Show {
        #[command(flatten)]
        dir: Dir,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum TokenRole {
    Node,
    Site,
}

impl From<TokenRole> for Role {
    fn from(r: TokenRole) -> Role {
        match r {
            TokenRole::Node => Role::Node,
            TokenRole::Site => Role::Site,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bc-controlplane: {e:#}");
            ExitCode::FAILURE
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
        Cmd::Init { dir, trust_domain } => init(&dir.dir, &trust_domain),
        Cmd::Serve { dir, listen } => serve(&dir.dir, listen),
        Cmd::AgentConfig { dir, api, data_dir } => agent_config(&dir.dir, &api, &data_dir),
        Cmd::Token { cmd } => match cmd {
            TokenCmd::Create {
                dir,
                role,
                uses,
                ttl,
                pool,
            } => token_create(&dir.dir, role.into(), uses, ttl, pool.as_deref()),
            TokenCmd::Revoke { dir, id } => token_revoke(&dir.dir, &id),
            TokenCmd::List { dir, json } => token_list(&dir.dir, json),
        },
        Cmd::Nodes { cmd } => match cmd {
            NodesCmd::List { dir, json } => nodes_list(&dir.dir, json),
            NodesCmd::Certs { dir, id, json } => nodes_certs(&dir.dir, &id, json),
            NodesCmd::RevokeIdentity { dir, id } => nodes_revoke_identity(&dir.dir, &id),
            NodesCmd::Retire { dir, id } => nodes_retire(&dir.dir, &id),
            NodesCmd::Cordon { dir, id } => nodes_cordon(&dir.dir, &id),
            NodesCmd::Delete { dir, id, yes } => nodes_delete(&dir.dir, &id, yes),
        },
        Cmd::Events {
            cmd: ListCmd::List { dir, json },
        } => events_list(&dir.dir, json),
        Cmd::Clock { cmd } => match cmd {
            ClockCmd::Set { dir, offset } => clock_set(&dir.dir, offset),
            ClockCmd::Show { dir } => clock_show(&dir.dir),
        },
        Cmd::EkRoots { cmd } => match cmd {
            EkRootsCmd::Add { dir, file } => ek_roots_add(&dir.dir, &file),
            EkRootsCmd::List { dir, json } => ek_roots_list(&dir.dir, json),
        },
        Cmd::Resolve { cmd } => match cmd {
            ResolveCmd::Add {
                dir,
                ek_sha256,
                pool,
                node,
            } => resolve_add(&dir.dir, &ek_sha256, pool.as_deref(), node.as_deref()),
            ResolveCmd::Remove { dir, ek_sha256 } => resolve_remove(&dir.dir, &ek_sha256),
            ResolveCmd::List { dir, json } => resolve_list(&dir.dir, json),
        },
        Cmd::Requests { cmd } => match cmd {
            RequestsCmd::List { dir, json } => requests_list(&dir.dir, json),
            RequestsCmd::Approve { dir, id, pool } => {
                requests_approve(&dir.dir, &id, pool.as_deref())
            }
            RequestsCmd::Deny { dir, id } => requests_deny(&dir.dir, &id),
        },
        Cmd::Pools { cmd } => match cmd {
            PoolsCmd::Create {
                dir,
                id,
                owner,
                join_attestors,
            } => pools_create(&dir.dir, &id, &owner, join_attestors.as_deref()),
            PoolsCmd::Update {
                dir,
                id,
                join_attestors,
                any_attestor: _,
            } => pools_update(&dir.dir, &id, join_attestors.as_deref()),
            PoolsCmd::List { dir, json } => pools_list(&dir.dir, json),
        },
    }
}

fn init(dir: &Path, trust_domain: &str) -> Result<()> {
    pki::init(dir, trust_domain)
        .with_context(|| format!("cannot initialize a control plane in {}", dir.display()))?;
    open_db(dir)?;
    println!(
        "initialized {} (trust domain {trust_domain}); agents pin {}",
        dir.display(),
        dir.join(pki::TLS_CA_CERT).display()
    );
    Ok(())
}

fn serve(dir: &Path, listen: SocketAddr) -> Result<()> {
    require_initialized(dir)?;
    let service = Arc::new(
        JoinService::open(dir)
            .with_context(|| format!("cannot load the control plane in {}", dir.display()))?,
    );
    let tls = http::tls_config(service.bundle()).context("cannot build the TLS configuration")?;
    let router = http::router(service);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| {
                format!("cannot listen on {listen} (in use? use port 0 for a free one)")
            })?;
        let addr = listener
            .local_addr()
            .context("cannot read the listening address")?;
        let shutdown = shutdown_signal().context("cannot install the signal handlers")?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on https://{addr}").context("cannot write to stdout")?;
        out.flush().context("cannot write to stdout")?;
        drop(out);
        tracing::info!(%addr, dir = %dir.display(), "serving");
        http::serve(listener, tls, router, shutdown)
            .await
            .context("the server failed")?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// Resolves on the first SIGTERM or SIGINT.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    })
}

fn agent_config(dir: &Path, api: &str, data_dir: &str) -> Result<()> {
    require_initialized(dir)?;
    if !api.starts_with("https://") || api.len() <= "https://".len() {
        bail!("--api must be an https:// URL, e.g. https://127.0.0.1:8443 (got {api:?})");
    }
    let bundle = pki::Bundle::load(dir)
        .with_context(|| format!("cannot load the control plane in {}", dir.display()))?;
    let pins = bundle.agent_pins_pem();
    let text = format!(
        "# bcd configuration, written by bc-controlplane agent-config\n\
         api = {}\n\
         trust_domain = {}\n\
         data_dir = {}\n\
         \n\
         [pins]\n\
         server_ca = \"\"\"\n{}\"\"\"\n\
         join_signing_key = \"\"\"\n{}\"\"\"\n\
         join_encryption_key = \"\"\"\n{}\"\"\"\n",
        toml_string(api),
        toml_string(&bundle.trust_domain),
        toml_string(data_dir),
        pins.server_ca,
        pins.join_signing_key,
        pins.join_encryption_key,
    );
    print_stdout(&text)
}

fn token_create(dir: &Path, role: Role, uses: u32, ttl_ms: i64, pool: Option<&str>) -> Result<()> {
    let db = open_db(dir)?;
    let (token, _) = tokens::create_token_in_pool(&db, role, uses, ttl_ms, pool)?;
    print_stdout(&format!("{}\n", token.expose()))
}

fn token_revoke(dir: &Path, id: &str) -> Result<()> {
    let db = open_db(dir)?;
    match tokens::revoke_token(&db, id).context("cannot revoke the token")? {
        tokens::RevokeOutcome::Revoked => print_stdout(&format!("revoked {id}\n")),
        tokens::RevokeOutcome::AlreadyRevoked => {
            print_stdout(&format!("{id} was already revoked\n"))
        }
        tokens::RevokeOutcome::Unknown => bail!(
            "no token {id:?} in {} (see bc-controlplane token list --dir {})",
            dir.display(),
            dir.display()
        ),
    }
}

fn token_list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = tokens::list_tokens(&db).context("cannot list tokens")?;
    let now = db
        .with_conn(|c| db::compute_now(c))
        .and_then(|r| r)
        .context("cannot read the database clock")?;
    if as_json {
        let v: Vec<_> = rows
            .iter()
            .map(|t| {
                json!({
                    "id": t.id,
                    "role": t.role,
                    "usesLeft": t.uses_left,
                    "expiresAt": db::rfc3339(t.expires_at),
                    "expired": now >= t.expires_at,
                    "revoked": t.revoked_at.is_some(),
                    "createdAt": db::rfc3339(t.created_at),
                    "pool": t.pool_id.as_deref().unwrap_or(pools::DEFAULT_POOL),
                })
            })
            .collect();
        return print_json(&v);
    }
    let mut text = String::new();
    for t in &rows {
        let state = if t.revoked_at.is_some() {
            "revoked"
        } else if now >= t.expires_at {
            "expired"
        } else if t.uses_left <= 0 {
            "exhausted"
        } else {
            "active"
        };
        text.push_str(&format!(
            "{} {} uses_left={} expires={} {state}\n",
            t.id,
            t.role,
            t.uses_left,
            db::rfc3339(t.expires_at)
        ));
    }
    print_stdout(&text)
}

fn nodes_list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = records::list_nodes(&db).context("cannot list nodes")?;
    if as_json {
        let node_keys = records::last_node_keys(&db).context("cannot list joins")?;
        let bindings = records::list_bindings(&db).context("cannot list bindings")?;
        let v: Vec<_> = rows
            .iter()
            .map(|n| {
                let bound: Vec<_> = bindings
                    .iter()
                    .filter(|b| b.node_id == n.id)
                    .map(|b| json!({ "kind": b.kind, "key": b.key }))
                    .collect();
                json!({
                    "nodeId": n.id,
                    "role": n.role,
                    "identityGeneration": n.identity_generation,
                    "attestor": n.attestor,
                    "joinedAt": db::rfc3339(n.joined_at),
                    "retired": n.retired_at.is_some(),
                    "cordoned": n.cordoned_at.is_some(),
                    "pool": n.pool_id,
                    "nodeKey": node_keys.get(&n.id),
                    "bindings": bound,
                })
            })
            .collect();
        return print_json(&v);
    }
    let mut text = String::new();
    for n in &rows {
        text.push_str(&format!(
            "{} {} generation={} attestor={} joined={}{}{}\n",
            n.id,
            n.role,
            n.identity_generation,
            n.attestor,
            db::rfc3339(n.joined_at),
            if n.retired_at.is_some() {
                " retired"
            } else {
                ""
            },
            if n.cordoned_at.is_some() {
                " cordoned"
            } else {
                ""
            }
        ));
    }
    print_stdout(&text)
}

fn nodes_certs(dir: &Path, id: &str, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = nodes::certs(&db, id)?;
    let now = db
        .with_conn(|c| db::compute_now(c))
        .and_then(|r| r)
        .context("cannot read the database clock")?;
    if as_json {
        let v: Vec<_> = rows
            .iter()
            .map(|c| {
                json!({
                    "serial": c.serial,
                    "identityGeneration": c.identity_generation,
                    "notBefore": db::rfc3339(c.not_before),
                    "notAfter": db::rfc3339(c.not_after),
                    "revoked": c.revoked_at.is_some(),
                    "revokedAt": c.revoked_at.map(db::rfc3339),
                    "expired": now >= c.not_after,
                })
            })
            .collect();
        return print_json(&v);
    }
    let mut text = String::new();
    for c in &rows {
        let state = if c.revoked_at.is_some() {
            "revoked"
        } else if now >= c.not_after {
            "expired"
        } else {
            "valid"
        };
        text.push_str(&format!(
            "{} generation={} not_before={} not_after={} {state}\n",
            c.serial,
            c.identity_generation,
            db::rfc3339(c.not_before),
            db::rfc3339(c.not_after)
        ));
    }
    print_stdout(&text)
}

fn nodes_revoke_identity(dir: &Path, id: &str) -> Result<()> {
    let db = open_db(dir)?;
    let r = nodes::revoke_identity(&db, id)?;
    print_stdout(&format!(
        "revoked the identity of {}: generation {}, {} certificate(s) revoked\n",
        r.node_id, r.identity_generation, r.revoked_certs
    ))
}

fn nodes_retire(dir: &Path, id: &str) -> Result<()> {
    let db = open_db(dir)?;
    if nodes::retire(&db, id)? {
        print_stdout(&format!("retired {id}\n"))
    } else {
        print_stdout(&format!("{id} was already retired\n"))
    }
}

fn nodes_cordon(dir: &Path, id: &str) -> Result<()> {
    let db = open_db(dir)?;
    if nodes::cordon(&db, id)? {
        print_stdout(&format!("cordoned {id}\n"))
    } else {
        print_stdout(&format!("{id} was already cordoned\n"))
    }
}

fn nodes_delete(dir: &Path, id: &str, yes: bool) -> Result<()> {
    if !yes {
        bail!("deleting {id} cannot be undone; add --yes to confirm");
    }
    let db = open_db(dir)?;
    let d = nodes::delete(&db, id)?;
    print_stdout(&format!(
        "deleted {}: {} certificate(s) revoked, {} binding(s) freed, {} resolve entr{} removed\n",
        d.node_id,
        d.revoked_certs,
        d.freed_bindings.len(),
        d.removed_resolve_entries,
        if d.removed_resolve_entries == 1 {
            "y"
        } else {
            "ies"
        }
    ))
}

fn events_list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = records::list_events(&db).context("cannot list events")?;
    if as_json {
        let v: Vec<_> = rows
            .iter()
            .map(|e| {
                json!({
                    "id": e.id,
                    "type": e.kind,
                    "at": db::rfc3339(e.at),
                    "attestor": e.attestor,
                    "reason": e.reason,
                    "tokenId": e.token_id,
                    "nodeId": e.node_id,
                    "data": e.data,
                })
            })
            .collect();
        return print_json(&v);
    }
    let mut text = String::new();
    for e in &rows {
        text.push_str(&format!("{} {} {}", e.id, db::rfc3339(e.at), e.kind));
        for (k, v) in [
            ("attestor", &e.attestor),
            ("reason", &e.reason),
            ("token", &e.token_id),
            ("node", &e.node_id),
        ] {
            if let Some(v) = v {
                text.push_str(&format!(" {k}={v}"));
            }
        }
        text.push('\n');
    }
    print_stdout(&text)
}

fn clock_set(dir: &Path, offset_ms: i64) -> Result<()> {
    let db = open_db(dir)?;
    let now = db
        .write(|tx| {
            db::set_clock_offset_ms(tx, offset_ms)?;
            db::compute_now(tx)
        })
        .context("cannot set the clock")?;
    print_stdout(&format!(
        "clock offset {} (database time {})\n",
        format_offset(offset_ms),
        db::rfc3339(now)
    ))
}

fn clock_show(dir: &Path) -> Result<()> {
    let db = open_db(dir)?;
    let (offset, now) = db
        .with_conn(|c| Ok::<_, db::DbError>((db::clock_offset_ms(c)?, db::compute_now(c)?)))
        .and_then(|r| r)
        .context("cannot read the clock")?;
    print_stdout(&format!(
        "clock offset {} (database time {})\n",
        format_offset(offset),
        db::rfc3339(now)
    ))
}

fn ek_roots_add(dir: &Path, file: &Path) -> Result<()> {
    let db = open_db(dir)?;
    let text = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let ders = ek::parse_roots_pem(&text).with_context(|| format!("{}", file.display()))?;
    let added = ek::add_roots(&db, &ders).context("cannot add the EK roots")?;
    let mut out = String::new();
    for (root, new) in added {
        let what = if new { "added" } else { "already present" };
        out.push_str(&format!("{what} {} {}\n", root.sha256, root.subject));
    }
    print_stdout(&out)
}

fn ek_roots_list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = ek::list_roots(&db).context("cannot list the EK roots")?;
    if as_json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "sha256": r.sha256,
                    "subject": r.subject,
                    "notAfter": db::rfc3339(r.not_after),
                    "addedAt": db::rfc3339(r.added_at),
                })
            })
            .collect();
        return print_json(&v);
    }
    let mut out = String::new();
    for r in &rows {
        out.push_str(&format!(
            "{} {} not_after={}\n",
            r.sha256,
            r.subject,
            db::rfc3339(r.not_after)
        ));
    }
    print_stdout(&out)
}

fn resolve_add(dir: &Path, ek_sha256: &str, pool: Option<&str>, node: Option<&str>) -> Result<()> {
    let db = open_db(dir)?;
    let (entry, replaced) = enroll::add_resolve(&db, ek_sha256, pool, node)?;
    print_stdout(&format!(
        "{} {} pool={} node={}\n",
        if replaced { "replaced" } else { "added" },
        entry.ek_sha256,
        entry.pool_id.as_deref().unwrap_or(pools::DEFAULT_POOL),
        entry.node_id.as_deref().unwrap_or("new"),
    ))
}

fn resolve_remove(dir: &Path, ek_sha256: &str) -> Result<()> {
    let db = open_db(dir)?;
    if enroll::remove_resolve(&db, ek_sha256)? {
        print_stdout(&format!("removed {}\n", ek_sha256.to_ascii_lowercase()))
    } else {
        bail!("NOT_FOUND: no resolve entry for {ek_sha256}")
    }
}

fn resolve_list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = enroll::list_resolve(&db).context("cannot list the resolve entries")?;
    if as_json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "ekSha256": r.ek_sha256,
                    "pool": r.pool_id.as_deref().unwrap_or(pools::DEFAULT_POOL),
                    "nodeId": r.node_id,
                    "createdAt": db::rfc3339(r.created_at),
                })
            })
            .collect();
        return print_json(&v);
    }
    let mut out = String::new();
    for r in &rows {
        out.push_str(&format!(
            "{} pool={} node={}\n",
            r.ek_sha256,
            r.pool_id.as_deref().unwrap_or(pools::DEFAULT_POOL),
            r.node_id.as_deref().unwrap_or("new")
        ));
    }
    print_stdout(&out)
}

fn requests_list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = enroll::list_requests(&db).context("cannot list join requests")?;
    if as_json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "id": r.id,
                    "attestor": r.attestor,
                    "ekSha256": r.ek_sha256,
                    "status": r.status,
                    "createdAt": db::rfc3339(r.created_at),
                    "decidedAt": r.decided_at.map(db::rfc3339),
                    "pool": r.pool_id.as_deref().unwrap_or(pools::DEFAULT_POOL),
                    "ekIssuer": r.ek_issuer,
                    "ekSerial": r.ek_serial,
                    "used": r.used_at.is_some(),
                })
            })
            .collect();
        return print_json(&v);
    }
    let mut out = String::new();
    for r in &rows {
        out.push_str(&format!(
            "{} {}{} ek={} pool={} created={} issuer={:?}\n",
            r.id,
            r.status,
            if r.used_at.is_some() { " (used)" } else { "" },
            r.ek_sha256,
            r.pool_id.as_deref().unwrap_or(pools::DEFAULT_POOL),
            db::rfc3339(r.created_at),
            r.ek_issuer
        ));
    }
    print_stdout(&out)
}

fn requests_approve(dir: &Path, id: &str, pool: Option<&str>) -> Result<()> {
    let db = open_db(dir)?;
    let row = enroll::approve(&db, id, pool)?;
    print_stdout(&format!(
        "approved {} (pool {})\n",
        row.id,
        row.pool_id.as_deref().unwrap_or(pools::DEFAULT_POOL)
    ))
}

fn requests_deny(dir: &Path, id: &str) -> Result<()> {
    let db = open_db(dir)?;
    let row = enroll::deny(&db, id)?;
    print_stdout(&format!("denied {}\n", row.id))
}

fn pools_create(
    dir: &Path,
    id: &str,
    owner: &str,
    join_attestors: Option<&[String]>,
) -> Result<()> {
    let db = open_db(dir)?;
    let known = attestor::default_attestor_ids();
    let pool = pools::create_pool(&db, id, owner, join_attestors, &known)?;
    print_stdout(&format!(
        "created pool {} owner={} join_attestors={}\n",
        pool.id,
        pool.owner,
        describe_attestors(&pool)?
    ))
}

fn pools_update(dir: &Path, id: &str, join_attestors: Option<&[String]>) -> Result<()> {
    let db = open_db(dir)?;
    let known = attestor::default_attestor_ids();
    let pool = pools::set_join_attestors(&db, id, join_attestors, &known)?;
    print_stdout(&format!(
        "updated pool {} join_attestors={}\n",
        pool.id,
        describe_attestors(&pool)?
    ))
}

fn describe_attestors(pool: &pools::PoolRow) -> Result<String> {
    Ok(match pool.join_attestors()? {
        Some(list) => list.join(","),
        None => "any".to_owned(),
    })
}

fn pools_list(dir: &Path, as_json: bool) -> Result<()> {
    let db = open_db(dir)?;
    let rows = pools::list_pools(&db).context("cannot list pools")?;
    if as_json {
        let v: Vec<_> = rows
            .iter()
            .map(|(p, nodes)| {
                json!({
                    "id": p.id,
                    "owner": p.owner,
                    "policy": p.policy,
                    "createdAt": db::rfc3339(p.created_at),
                    "nodes": nodes,
                })
            })
            .collect();
        return print_json(&v);
    }
    let mut out = String::new();
    for (p, nodes) in &rows {
        out.push_str(&format!(
            "{} owner={} join_attestors={} nodes={nodes}\n",
            p.id,
            p.owner,
            describe_attestors(p)?
        ));
    }
    print_stdout(&out)
}

/// Every command but `init` needs an initialized DIR; without this check a
/// typo in --dir would silently create an empty database somewhere.
fn require_initialized(dir: &Path) -> Result<()> {
    if !dir.join(pki::TRUST_DOMAIN_FILE).is_file() {
        bail!(
            "{} is not a control plane directory (no {}); run bc-controlplane init --dir {} first",
            dir.display(),
            pki::TRUST_DOMAIN_FILE,
            dir.display()
        );
    }
    Ok(())
}

/// Opens DIR's database, after checking DIR and its `controlplane.toml`
/// (a broken config is reported by every command, not only by `serve`).
fn open_db(dir: &Path) -> Result<db::Database> {
    require_initialized(dir)?;
    config::load(dir)?;
    db::Database::open_dir(dir)
        .with_context(|| format!("cannot open the database in {}", dir.display()))
}

fn print_json(v: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(v).context("cannot encode JSON")?;
    print_stdout(&format!("{text}\n"))
}

/// Writes to stdout and reports a closed pipe as an error instead of
/// panicking like `print!` would.
fn print_stdout(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("cannot write to stdout")
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A token lifetime: positive.
fn parse_ttl(s: &str) -> Result<i64, String> {
    if s.starts_with('-') {
        return Err(format!("the lifetime must be positive, not {s:?}"));
    }
    match parse_duration_ms(s)? {
        0 => Err("the lifetime must be positive, not 0".to_owned()),
        ms => Ok(ms),
    }
}

/// A clock offset: signed.
fn parse_offset(s: &str) -> Result<i64, String> {
    parse_duration_ms(s)
}

/// An offset in the largest unit that divides it exactly.
fn format_offset(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "+" };
    let abs = ms.unsigned_abs();
    if abs == 0 {
        return "+0s".to_owned();
    }
    for (unit, len) in [
        ("d", 86_400_000u64),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if abs % len == 0 {
            return format!("{sign}{}{unit}", abs / len);
        }
    }
    format!("{sign}{abs}ms")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_ttl("90s"), Ok(90_000));
        assert_eq!(parse_ttl("15m"), Ok(900_000));
        assert_eq!(parse_ttl("24h"), Ok(86_400_000));
        assert_eq!(parse_ttl("7d"), Ok(604_800_000));
        assert_eq!(parse_ttl("+1h"), Ok(3_600_000));
        for bad in [
            "",
            "h",
            "10",
            "1.5h",
            "1w",
            "-1h",
            "0s",
            " 1h",
            "1H",
            "99999999999999999d",
        ] {
            assert!(parse_ttl(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_offset("-1h"), Ok(-3_600_000));
        assert_eq!(parse_offset("+25h"), Ok(90_000_000));
        assert_eq!(parse_offset("0s"), Ok(0));
        assert!(parse_offset("-").is_err());
        assert!(parse_offset("--1h").is_err());
    }

    #[test]
    fn offsets_print_back() {
        assert_eq!(format_offset(0), "+0s");
        assert_eq!(format_offset(-3_600_000), "-1h");
        assert_eq!(format_offset(90_000_000), "+25h");
        assert_eq!(format_offset(1_500), "+1500ms");
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
        let svc = JoinService::open(&dir).unwrap();
        let (tok, _) = tokens::create_token(svc.database(), Role::Node, 1, 60_000).unwrap();
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
        let resp = svc
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

    #[test]
    fn toml_strings_escape() {
        assert_eq!(toml_string(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
