//! `init`, `serve` and `agent-config`: making a control plane DIR, serving
//! it, and pinning agents to it.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use bc_controlplane::{connlimit, http, pki, ControlPlane};

use super::{open_db, print_stdout, require_initialized};

pub(crate) fn init(dir: &Path, trust_domain: &str, sans: &[String]) -> Result<()> {
    pki::init_with_sans(dir, trust_domain, sans)
        .with_context(|| format!("cannot initialize a control plane in {}", dir.display()))?;
    open_db(dir)?;
    super::print_line(&format!(
        "initialized {} (trust domain {trust_domain}); agents pin {}",
        dir.display(),
        dir.join(pki::TLS_CA_CERT).display()
    ))
}

pub(crate) fn serve(dir: &Path, listen: SocketAddr) -> Result<()> {
    require_initialized(dir)?;
    // Every connection costs a descriptor: take all the hard limit allows,
    // and derive the connection cap from it.
    let nofile = connlimit::raise_nofile_limit();
    tracing::info!(nofile, "file descriptor limit");
    let config = super::load_config(dir)?;
    let limits = connlimit::Limits::new(&config.server, nofile);
    let service = Arc::new(
        ControlPlane::open_with(dir, config)
            .with_context(|| format!("cannot load the control plane in {}", dir.display()))?,
    );
    let tls = http::tls_config(service.bundle(), service.database())
        .context("cannot build the TLS configuration")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let svc = service.clone();
    runtime.block_on(async move {
        // Inside the runtime, so that the router starts the poller now: the
        // workflows advance (and fail at their deadlines) with no channel open.
        let router = bc_controlplane::dist_serve::with_dist(http::router(svc.clone()), dir);
        let router = bc_controlplane::images_serve::with_images(router, dir, svc);
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
        http::serve_with(listener, tls, router, limits, shutdown)
            .await
            .context("the server failed")?;
        Ok::<_, anyhow::Error>(())
    })?;
    // The refusals still in memory go to the database before exit.
    service.shutdown_events();
    tracing::info!("stopped");
    Ok(())
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

pub(crate) fn agent_config(dir: &Path, api: &str, data_dir: &str) -> Result<()> {
    print_stdout(&agent_config_text(dir, api, data_dir)?)
}

/// The text `agent-config` prints (the install script embeds it too).
pub(crate) fn agent_config_text(dir: &Path, api: &str, data_dir: &str) -> Result<String> {
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
    Ok(text)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_escape() {
        assert_eq!(toml_string(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
