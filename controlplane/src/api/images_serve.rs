//! `GET /v1/images/<name>` and `GET /v1/deploy/seed`: what `deploy.image`
//! fetches (docs/deploy.md), over mTLS, for a commissioning ramdisk only.
//!
//! The caller's TLS leaf must be what the command channel admits (a current,
//! unrevoked `node_certs` row of a live node, at database time) of a node
//! whose role is `ramdisk` ([`CommandService::deploy_auth`]); anything else
//! is 403. The seed is the caller's own node's, served until its
//! `not_after`.
//!
//! An image is served from its stored file, not from memory (images are
//! gigabytes): a blocking reader hands the connection [`CHUNK`]s through a
//! channel of two, hashing them, and ends the body with an error (the
//! client sees a cut transfer) if the file no longer matches its recorded
//! SHA-256. The limits are /dist's: [`MAX_DOWNLOADS_PER_SOURCE`] in flight
//! per source, and the request deadline, which an image's body moves to
//! give it [`MIN_RATE`] bytes a second.
//!
//! [`MAX_DOWNLOADS_PER_SOURCE`]: crate::api::dist_serve::MAX_DOWNLOADS_PER_SOURCE

use std::collections::HashMap;
use std::io::Read as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use bc_wire::endpoints;
use sha2::{Digest, Sha256};

use crate::api::dist_serve::{source_key, Download};
use crate::api::http::{ConnDeadline, PeerAddr, PeerCertificates};
use crate::model::images::{self, Image};
use crate::plane::commands::CommandService;
use crate::plane::ControlPlane;

/// What the connection is handed at a time.
const CHUNK: usize = 256 * 1024;
/// The slowest transfer an image's deadline allows for.
const MIN_RATE: u64 = 1 << 20;
/// Added to an image's deadline (the start of a transfer).
const BASE_DEADLINE: Duration = Duration::from_secs(60);

struct ImagesState {
    dir: PathBuf,
    cp: Arc<ControlPlane>,
    downloads: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// `router` with the two deploy routes; images are read from `dir`.
pub fn with_images(router: Router, dir: &std::path::Path, cp: Arc<ControlPlane>) -> Router {
    let state = Arc::new(ImagesState {
        dir: dir.to_owned(),
        cp,
        downloads: Arc::new(Mutex::new(HashMap::new())),
    });
    router
        .route(
            &format!("{}{{name}}", endpoints::IMAGES),
            get(image_handler).with_state(state.clone()),
        )
        .route(endpoints::DEPLOY_SEED, get(seed_handler).with_state(state))
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, text).into_response()
}

const FORBIDDEN: &str =
    "a current node certificate of a commissioning ramdisk (role ramdisk) is required\n";

/// The caller's node id, or the answer that refuses it.
async fn authorise(
    state: &ImagesState,
    certs: Option<Extension<PeerCertificates>>,
    what: &'static str,
) -> Result<String, Response> {
    let Some(leaf) = certs.and_then(|Extension(p)| p.0.first().map(|c| c.as_ref().to_vec())) else {
        return Err(plain(StatusCode::FORBIDDEN, FORBIDDEN));
    };
    let cp = state.cp.clone();
    match tokio::task::spawn_blocking(move || CommandService::new(&cp).deploy_auth(&leaf)).await {
        Ok(Ok(Some(node))) => Ok(node),
        Ok(Ok(None)) => {
            tracing::info!(
                what,
                "deploy download refused: not a current ramdisk certificate"
            );
            Err(plain(StatusCode::FORBIDDEN, FORBIDDEN))
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, what, "deploy download: database");
            Err(plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "database unavailable\n",
            ))
        }
        Err(_) => Err(plain(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")),
    }
}

async fn seed_handler(
    State(state): State<Arc<ImagesState>>,
    certs: Option<Extension<PeerCertificates>>,
) -> Response {
    let node = match authorise(&state, certs, "seed").await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let cp = state.cp.clone();
    let node2 = node.clone();
    match tokio::task::spawn_blocking(move || CommandService::new(&cp).deploy_seed(&node2)).await {
        Ok(Ok(Some(doc))) => {
            tracing::info!(node_id = %node, "deploy seed served");
            (
                StatusCode::OK,
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                doc,
            )
                .into_response()
        }
        Ok(Ok(None)) => plain(
            StatusCode::NOT_FOUND,
            "no current deploy seed for this node (none was put, or it is past its not_after)\n",
        ),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, node_id = %node, "deploy seed: database");
            plain(StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n")
        }
        Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n"),
    }
}

async fn image_handler(
    State(state): State<Arc<ImagesState>>,
    UrlPath(name): UrlPath<String>,
    peer: Option<Extension<PeerAddr>>,
    certs: Option<Extension<PeerCertificates>>,
    deadline: Option<Extension<ConnDeadline>>,
) -> Response {
    let download = match peer {
        Some(Extension(PeerAddr(addr))) => {
            match Download::start(&state.downloads, source_key(addr.ip())) {
                Some(d) => Some(d),
                None => {
                    return plain(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "too many downloads from this address; retry later\n",
                    )
                }
            }
        }
        None => None,
    };
    let node = match authorise(&state, certs, "image").await {
        Ok(n) => n,
        Err(r) => return r,
    };
    if !images::valid_name(&name) {
        return plain(StatusCode::NOT_FOUND, "no such image\n");
    }
    let (cp, dir) = (state.cp.clone(), state.dir.clone());
    let opened = tokio::task::spawn_blocking(move || open(&cp, &dir, &name)).await;
    let (image, file) = match opened {
        Ok(Ok(Some(found))) => found,
        Ok(Ok(None)) => return plain(StatusCode::NOT_FOUND, "no such image\n"),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "cannot serve an image");
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot serve this image\n",
            );
        }
        Err(_) => return plain(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n"),
    };
    tracing::info!(node_id = %node, image = %image.name, bytes = image.stored_bytes, "image download");
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    let expect = image.stored_sha256.clone();
    tokio::task::spawn_blocking(move || pump(file, &expect, &tx));
    let allow = BASE_DEADLINE + Duration::from_secs(image.stored_bytes / MIN_RATE);
    let content_type = match image.compression.as_str() {
        "zstd" => "application/zstd",
        _ => "application/octet-stream",
    };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CONTENT_LENGTH,
                HeaderValue::from(image.stored_bytes),
            ),
        ],
        Body::new(ImageBody {
            rx,
            left: image.stored_bytes,
            deadline: deadline.map(|Extension(d)| (d, allow)),
            _download: download,
        }),
    )
        .into_response()
}

/// The image's row and its stored file, opened and of the recorded size.
fn open(
    cp: &ControlPlane,
    dir: &std::path::Path,
    name: &str,
) -> Result<Option<(Image, std::fs::File)>, String> {
    let Some(image) = cp
        .database()
        .read(|tx| images::get(tx, name))
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let path = images::stored_path(dir, &image);
    let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    if len != image.stored_bytes {
        return Err(format!(
            "{}: {len} bytes, recorded {} (changed on disk?)",
            path.display(),
            image.stored_bytes
        ));
    }
    Ok(Some((image, file)))
}

type Chunk = Result<Bytes, std::io::Error>;

/// Reads `file` into `tx` chunk by chunk; an error instead of the last
/// chunk if what was read is not `expect` (the recorded SHA-256).
fn pump(mut file: std::fs::File, expect: &str, tx: &tokio::sync::mpsc::Sender<Chunk>) {
    let mut hash = Sha256::new();
    loop {
        let mut buf = vec![0u8; CHUNK];
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        };
        buf.truncate(n);
        hash.update(&buf);
        if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
            return; // The client went away.
        }
    }
    if hex::encode(hash.finalize()) != expect {
        tracing::error!(
            "an image file does not match its recorded SHA-256 (changed on disk?); transfer cut"
        );
        let _ = tx.blocking_send(Err(std::io::Error::other("image file altered")));
    }
}

struct ImageBody {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    left: u64,
    /// Moved once, when the body starts (after the handler's answer reset
    /// it to the request deadline).
    deadline: Option<(ConnDeadline, Duration)>,
    _download: Option<Download>,
}

impl hyper::body::Body for ImageBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        if let Some((ConnDeadline(d), allow)) = self.deadline.take() {
            d.reset(allow);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                self.left = self.left.saturating_sub(chunk.len() as u64);
                Poll::Ready(Some(Ok(hyper::body::Frame::data(chunk))))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) if self.left > 0 => {
                Poll::Ready(Some(Err(std::io::Error::other("image file cut short"))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}
