//! `GET /dist/<name>`: the packages `dist add` recorded (see [`crate::model::dist`]),
//! unauthenticated like any package download (the install script pins the
//! SHA-256 it expects).
//!
//! What one source can cost the server is bounded:
//! - **memory**: each package is read and verified once and kept as one
//!   reference-counted [`Bytes`]; every response shares it and hands it to
//!   the connection in [`CHUNK`]-sized slices, which the connection asks for
//!   only as the reader takes them. A reader that stops reading holds one
//!   chunk's buffering, not a copy of the package.
//! - **downloads**: at most [`MAX_DOWNLOADS_PER_SOURCE`] in flight per
//!   source address (an IPv6 /64 counts as one), from the response until the
//!   connection is done with its body; more are answered 503 at once.
//! - **time**: the connection's request deadline (`[server] request_timeout`,
//!   30 s by default) runs from the response to the end of the body, so a
//!   transfer that does not finish by then is cut ([`crate::api::http`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};

use crate::api::http::PeerAddr;
use crate::model::dist::{self, DistError, Package};

/// How many packages are read (and verified) at once: each read holds a
/// second copy of its package until it is cached.
const READ_CONCURRENCY: usize = 2;
/// Verified packages kept in memory (the newest few a fleet installs).
const CACHED_PACKAGES: usize = 4;
/// Downloads one source address may have in flight.
pub(crate) const MAX_DOWNLOADS_PER_SOURCE: usize = 16;
/// What the connection is handed at a time.
const CHUNK: usize = 64 * 1024;

struct DistState {
    dir: PathBuf,
    reads: tokio::sync::Semaphore,
    /// Newest last.
    cache: Mutex<Vec<Cached>>,
    downloads: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A verified package, valid while its recorded hash and its file (size,
/// modification time) are the ones it was read from: a file changed behind
/// the control plane's back is read again, and refused.
struct Cached {
    package: Package,
    file: FileStamp,
    bytes: Bytes,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
}

/// `router` with `GET /dist/<name>`. A name that is not a recorded package
/// is NOT_FOUND, whatever it tries.
pub fn with_dist(router: Router, dir: &std::path::Path) -> Router {
    let state = Arc::new(DistState {
        dir: dir.to_owned(),
        reads: tokio::sync::Semaphore::new(READ_CONCURRENCY),
        cache: Mutex::new(Vec::new()),
        downloads: Arc::new(Mutex::new(HashMap::new())),
    });
    router.route("/dist/{name}", get(handler).with_state(state))
}

/// One download in flight for a source; counted down when dropped (with
/// the response body, once the connection is done with it).
pub(crate) struct Download {
    source: IpAddr,
    downloads: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Download {
    pub(crate) fn start(
        downloads: &Arc<Mutex<HashMap<IpAddr, usize>>>,
        source: IpAddr,
    ) -> Option<Self> {
        let mut map = downloads.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(source).or_insert(0);
        if *n >= MAX_DOWNLOADS_PER_SOURCE {
            return None;
        }
        *n += 1;
        Some(Download {
            source,
            downloads: downloads.clone(),
        })
    }
}

impl Drop for Download {
    fn drop(&mut self) {
        let mut map = self.downloads.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.source);
            }
        }
    }
}

/// An IPv6 source counts by its /64 (one host's addresses), IPv4 as is.
pub(crate) fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// The shared package, handed out in [`CHUNK`]s; holds its [`Download`].
struct PackageBody {
    rest: Bytes,
    _download: Option<Download>,
}

impl hyper::body::Body for PackageBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        if self.rest.is_empty() {
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(CHUNK);
        let chunk = self.rest.split_to(n);
        Poll::Ready(Some(Ok(hyper::body::Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.rest.len() as u64)
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, text).into_response()
}

async fn handler(
    State(state): State<Arc<DistState>>,
    UrlPath(name): UrlPath<String>,
    peer: Option<Extension<PeerAddr>>,
) -> Response {
    let download = match peer {
        Some(Extension(PeerAddr(addr))) => {
            match Download::start(&state.downloads, source_key(addr.ip())) {
                Some(d) => Some(d),
                None => {
                    tracing::debug!(source = %addr.ip(), "dist: too many downloads from one source");
                    return plain(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "too many downloads from this address; retry later\n",
                    );
                }
            }
        }
        None => None,
    };
    match package(&state, name).await {
        Ok(bytes) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/vnd.debian.binary-package"),
            )],
            Body::new(PackageBody {
                rest: bytes,
                _download: download,
            }),
        )
            .into_response(),
        Err(DistError::BadName(_) | DistError::NotFound(_)) => {
            plain(StatusCode::NOT_FOUND, "no such package\n")
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot serve a package");
            plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot serve this package\n",
            )
        }
    }
}

/// The verified bytes of `name`: from the cache while its recorded hash is
/// the one they were verified against, else read and verified once.
async fn package(state: &Arc<DistState>, name: String) -> Result<Bytes, DistError> {
    let dir = state.dir.clone();
    let lookup_name = name.clone();
    let (recorded, file) = tokio::task::spawn_blocking(move || {
        let recorded = dist::lookup(&dir, &lookup_name)?;
        let path = dir.join(dist::DIST_DIR).join(&lookup_name);
        let meta = std::fs::metadata(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => DistError::NotFound(lookup_name.clone()),
            _ => DistError::Io { path, source },
        })?;
        let stamp = FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
        };
        Ok::<_, DistError>((recorded, stamp))
    })
    .await
    .map_err(task_failed)??;
    if let Some(bytes) = cached(state, &recorded, file) {
        return Ok(bytes);
    }
    let Ok(_read) = state.reads.acquire().await else {
        return Err(task_failed("shutting down"));
    };
    // Another request may have read it while this one waited.
    if let Some(bytes) = cached(state, &recorded, file) {
        return Ok(bytes);
    }
    let dir = state.dir.clone();
    let (package, bytes) = tokio::task::spawn_blocking(move || dist::read(&dir, &name))
        .await
        .map_err(task_failed)??;
    let bytes = Bytes::from(bytes);
    let mut cache = state.cache.lock().unwrap_or_else(|p| p.into_inner());
    cache.retain(|c| c.package.name != package.name);
    if cache.len() >= CACHED_PACKAGES {
        cache.remove(0);
    }
    cache.push(Cached {
        package,
        file,
        bytes: bytes.clone(),
    });
    Ok(bytes)
}

fn cached(state: &DistState, recorded: &Package, file: FileStamp) -> Option<Bytes> {
    state
        .cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|c| c.package == *recorded && c.file == file)
        .map(|c| c.bytes.clone())
}

fn task_failed(e: impl std::fmt::Display) -> DistError {
    DistError::Io {
        path: PathBuf::from("dist"),
        source: std::io::Error::other(format!("the dist task failed: {e}")),
    }
}
