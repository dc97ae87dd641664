//! bc-controlplane: the reference control plane for bcd.
//!
//! A real server (HTTPS, SQLite) implementing the JoinService and its
//! attestors, used as the dev stack and as the test peer of bcd. Embeddable:
//! tests open a [`ControlPlane`] from a DIR written by [`pki::init`]
//! (its APIs are services over it: [`JoinService`],
//! [`RenewService`], [`SiteService`]), build the
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

mod api;
pub mod attestors;
pub mod config;
mod fsutil;
mod http_client;
mod ids;
mod model;
// The tests' PostgreSQL server (bc-test-support, the e2e binary's too).
#[cfg(test)]
use bc_test_support::pg_cluster;
pub mod pki;
mod plane;
#[cfg(test)]
mod race_tests;
mod reason;
pub mod reasons;
pub mod store;
#[cfg(test)]
mod test_support;

// What the binary (main.rs, cli/), the e2e tests, fuzz-bodies and the
// examples use, and no more: the rest is the crate's own, so the compiler
// reports what nothing uses. The namespaces below keep the paths they call
// (`tokens::insert_token`), each holding only what they call.

// The attestation contract, whole: what a plugin attestor (the e2e tests')
// names in its impl.
pub use model::attestor::{
    AttestInput, AttestationResult, Attestor, Deferral, Fault, NodeKey, NodeKeyKind, OpenedToken,
    ProvenEk, Refusal, Roles, Verdict,
};
pub use plane::api_error::ApiError;
pub use plane::commands::CommandService;
pub use plane::join::JoinService;
pub use plane::renew::RenewService;
pub use plane::siteapi::SiteService;
pub use plane::workflows::WorkflowService;
pub use plane::{ControlPlane, RefusalEvent};

/// The HTTPS API ([`api`]'s transport).
pub mod http {
    pub use crate::api::http::{error_response, router, serve, serve_with, tls_config};
}

/// The command channel's commands and inventories, as stored.
pub mod commands {
    pub use crate::model::commands::{CommandRow, InventoryRow, STATES};
    pub use crate::plane::commands::{QueueError, QueueRefusal, MAX_TIMEOUT_MS};
}

/// Commission and deploy workflows (docs/workflows.md).
pub mod workflows {
    pub use crate::model::workflows::{StepRow, WorkflowRow, STATES};
    pub use crate::plane::workflows::{Commission, Deploy, Shown, WorkflowError};
}

/// The user data that installs bcd and joins a machine on first boot.
pub mod userdata {
    pub use crate::plane::userdata::cloud_config;
}

/// The connection limits `serve` runs with.
pub mod connlimit {
    pub use crate::api::connlimit::{raise_nofile_limit, Limits};
}

/// The agent packages served beside the API.
pub mod dist_serve {
    pub use crate::api::dist_serve::with_dist;
}

/// The deploy routes served beside the API (`/v1/images/…`, `/v1/deploy/seed`).
pub mod images_serve {
    pub use crate::api::images_serve::with_images;
}

/// Deploy images and the NoCloud seeds `deploy.image` writes.
pub mod deploy {
    pub use crate::model::images::{add, list, remove, Image, ImageError};
    pub use crate::model::seeds::{
        check_doc as check_seed, put as put_seed, remove as remove_seed, MAX_SEED_BYTES,
    };
}

/// Boot entries (the site's machines).
pub mod boot {
    pub use crate::model::boot::{add, list, BootKey, NewEntry};
}

/// The agent packages an install script fetches.
pub mod dist {
    pub use crate::model::dist::{add, current, lookup, MAX_PACKAGE_BYTES};
}

/// The TPM resolve list and the join requests awaiting an operator.
pub mod enroll {
    pub use crate::model::enroll::{
        add_resolve, approve, deny, deny_entry, list_requests, list_resolve, remove_resolve,
        ResolveTarget,
    };
}

/// The event log.
pub mod eventlog {
    pub use crate::model::eventlog::prune;
}

/// The hardware keys nodes are bound to.
pub mod hardware {
    pub use crate::model::hardware::keys;
}

/// Machine-identity values.
pub mod machine {
    pub use crate::model::machine::{Expect, Mac, ProductUuid};
}

/// Node lifecycle: cordon, retire, revoke, delete.
pub mod nodes {
    pub use crate::model::node_boot::{BootAppSeen, LastBoot, VerifiedBoot};
    pub use crate::model::nodes::{certs, cordon, delete, retire, revoke_identity, show};
}

/// Pools and their policy.
pub mod pools {
    pub use crate::model::pools::{
        boot_policies, create_pool, get, list_pools, parse_ek_assurance, set_boot_policy,
        set_join_attestors, set_min_ek_assurance, PoolRow, DEFAULT_OWNER, DEFAULT_POOL,
    };
}

/// Boot policies (issue 31): parsed, judged against an event log's facts;
/// the offline `eventlog` and `boot-policy` commands use them.
pub mod boot_policy {
    pub use crate::model::boot_policy::{
        always_extended, app_authorities, authority_subject, from_facts, judge, needed_pcrs,
        version_text, BootPolicy, BootReason, BootRefusal,
    };
}

/// Nodes, certificates, bindings and events, as recorded.
pub mod records {
    pub use crate::model::records::{
        insert_cert, insert_node, last_ek_assurances, last_node_keys, list_bindings, list_events,
        list_events_of, list_nodes, node_scopes, NodeRow, NodeScope, EVENT_IDENTITY_REVOKED,
        EVENT_NODE_CORDONED, EVENT_NODE_DELETED, EVENT_NODE_JOINED, EVENT_NODE_RETIRED,
    };
}

/// Tenants: who owns pools, and whom events are attributed to.
pub mod tenants {
    pub use crate::model::tenants::{create, list, TenantError, TenantRow, ROOT_TENANT};
}

/// Node leases: a node lent to a tenant, restricted while it lasts.
pub mod leases {
    pub use crate::model::leases::{
        create, end, list, of_node, LeaseError, LeaseRef, LeaseRow, LeasesConfig, Until,
        DEFAULT_LEASE_ALLOWED_KINDS,
    };
}

/// Sites.
pub mod sites {
    pub use crate::model::sites::{create, list, resolve};
}

/// Join tokens.
pub mod tokens {
    pub use crate::model::tokens::{
        create_token, insert_token, list_tokens, revoke_token, token_for_update, RevokeOutcome,
        TokenScope,
    };
}
