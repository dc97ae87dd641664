//! `bcd site`: the boot server of a site. A site node (role `site`) holds
//! its site's boot lease ([`lease`]) and serves iPXE over plain HTTP on
//! `[site] listen` ([`http`]): for a machine with an open boot entry, a
//! script that boots the platform ramdisk with the entry's discovery token
//! and an assertion this node signs ([`service`], [`render`]); for any
//! other, or without the lease, a script that exits. It also serves the
//! ramdisk, its initrd with the ramdisk's configuration appended
//! ([`image`], [`cpio`]).

mod cpio;
mod entries;
pub mod http;
mod identity;
mod image;
mod lease;
pub mod render;
pub mod service;

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, Context as _};

use crate::config::{Config, ConfigArg};
use crate::sitedata::state;

#[derive(clap::Args, Debug)]
pub(crate) struct SiteArgs {
    #[command(flatten)]
    config: ConfigArg,
}

pub(crate) fn run(args: SiteArgs) -> anyhow::Result<ExitCode> {
    let path = &args.config.path;
    let config = Config::load(path)?;
    let settings = config.site.clone().ok_or_else(|| {
        anyhow!(
            "{} has no [site] section: bcd site needs one",
            path.display()
        )
    })?;
    crate::identity::owner::trust_node_user(&config)?;
    let config = Arc::new(config);
    let identity = Arc::new(identity::NodeIdentity::load(config.clone())?);
    let image = image::Image::prepare(&config, path, &settings.ramdisk_dir)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("[site] listen: cannot listen on {}", settings.listen))?;
        let schedule = lease::Schedule::new(config.node.backoff_min, config.node.backoff_max);
        let state = state::StateFile {
            dir: config.data_dir.clone(),
            base: state::SiteState {
                site_id: settings.id.clone(),
                held: false,
                epoch: 0,
                expires_at: String::new(),
                vmlinuz_bytes: image.kernel_bytes,
                initrd_bytes: image.initrd_bytes,
                commissioning: None,
            },
        };
        let (holder, view) =
            lease::Holder::new(identity.clone(), settings.id.clone(), schedule, state);
        tracing::info!(
            site_id = %settings.id,
            node_id = %identity.current().await.node_id,
            listen = %listener.local_addr().map_or(settings.listen, |a| a),
            public_url = %settings.public_url,
            initrd_bytes = image.initrd_bytes,
            max_connections = settings.max_connections,
            max_connections_per_source = settings.max_per_source,
            "bcd site serving"
        );
        let limits = http::Limits {
            head_timeout: test_head_timeout().unwrap_or(http::HEAD_TIMEOUT),
            ..http::Limits::new(settings.max_connections, settings.max_per_source)
        };
        let site = Arc::new(service::Site {
            settings,
            identity,
            lease: view,
            image,
            entries: entries::Entries::default(),
        });
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let lease_task = tokio::spawn(holder.run(shutdown.clone()));
        let server = tokio::spawn(http::serve(listener, site, limits, shutdown));
        wait_for_signal().await;
        tracing::info!("bcd site stopping");
        let _ = stop.send(true);
        let _ = server.await;
        let _ = lease_task.await;
        Ok(ExitCode::SUCCESS)
    })
}

/// SIGINT or SIGTERM.
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// `BCD_SITE_HEAD_TIMEOUT` (`+10m`...) in test builds only: an end-to-end
/// test that holds idle connections while it checks what the server did
/// with them is then not racing the 10 s head deadline on a slow machine.
#[cfg(feature = "failpoints")]
fn test_head_timeout() -> Option<std::time::Duration> {
    let v = std::env::var("BCD_SITE_HEAD_TIMEOUT").ok()?;
    match crate::clock::parse_offset(&v).map(std::time::Duration::try_from) {
        Ok(Ok(d)) => {
            tracing::warn!(head_timeout = %v, "test build: the head deadline is BCD_SITE_HEAD_TIMEOUT");
            Some(d)
        }
        _ => {
            tracing::warn!(value = %v, "test build: BCD_SITE_HEAD_TIMEOUT ignored");
            None
        }
    }
}

#[cfg(not(feature = "failpoints"))]
fn test_head_timeout() -> Option<std::time::Duration> {
    None
}
