//! bc-controlplane: the reference control plane for bcd.
//!
//! A real server (HTTPS, SQLite) implementing the JoinService and its
//! attestors, used as the dev stack and as the test peer of bcd. Embeddable:
//! tests open a [`plane::ControlPlane`] from a DIR written by [`pki::init`]
//! (its APIs are services over it: [`join::JoinService`],
//! [`renew::RenewService`], [`siteapi::SiteService`]), build the
//! [`http::router`] and run [`http::serve`] with their own listener and
//! shutdown future.
//!
//! ```no_run
//! # async fn demo(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! bc_controlplane::pki::init(dir, "bc.test")?;
//! let service = Arc::new(bc_controlplane::ControlPlane::open(dir)?);
//! let tls = bc_controlplane::http::tls_config(service.bundle(), service.database())?;
//! let router = bc_controlplane::http::router(service.clone());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! bc_controlplane::http::serve(listener, tls, router, std::future::pending()).await?;
//! # Ok(()) }
//! ```

pub mod api;
pub mod attestors;
pub mod config;
pub mod fsutil;
pub mod http_client;
pub mod ids;
pub mod model;
// The tests' PostgreSQL server (bc-test-support, the e2e binary's too).
#[cfg(test)]
use bc_test_support::pg_cluster;
pub mod pki;
pub mod plane;
#[cfg(test)]
mod race_tests;
pub mod reason;
pub mod reasons;
pub mod store;
#[cfg(test)]
mod test_support;

// The short paths the binary, the e2e tests, fuzz-bodies and the examples
// name.
pub use api::{client_auth, connlimit, dist_serve, header_errors, http};
pub use model::{
    attestor, boot, dist, enroll, eventlog, hardware, machine, nodes, pools, records, sites,
    tokens, uses,
};
pub use plane::{api_error, join, renew, siteapi};

pub use api_error::ApiError;
pub use attestor::{
    AttestInput, AttestationResult, Attestor, Deferral, Fault, NodeKey, NodeKeyKind, OpenedToken,
    ProvenEk, Refusal, Roles, Verdict,
};
pub use attestors::AttestorRegistry;
pub use join::JoinService;
pub use plane::{ControlPlane, RefusalEvent};
pub use renew::RenewService;
pub use siteapi::SiteService;
