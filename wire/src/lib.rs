//! The contract between bcd and the control plane.
//!
//! Both sides depend on this crate and nothing else for the bytes they
//! exchange: the protobuf messages, the one function that builds every
//! signing input, token sealing, and the identity URIs. Each of those is
//! pinned by vectors in `tests/vectors.rs`, so a change of the wire shows up
//! as a failing test rather than as a machine that can no longer join.

mod attestor_id;
pub mod cloud_iid;
pub mod command;
pub mod ekcert;
pub mod file;
pub mod image;
pub mod pcr;
pub mod sealing;
pub mod signing;
pub mod site;
pub mod spiffe;
pub mod token;
pub mod tpm;
pub mod x509pop;

/// The generated protobuf messages of `bettercompute.agent.v1`.
pub use attestor_id::{AttestorId, UnknownAttestor};

pub mod agent {
    include!(concat!(env!("OUT_DIR"), "/bettercompute.agent.v1.rs"));
}

/// The generated protobuf messages of `bettercompute.site.v1`.
pub mod site_v1 {
    include!(concat!(env!("OUT_DIR"), "/bettercompute.site.v1.rs"));
}

/// The generated protobuf messages of `bettercompute.command.v1`: the
/// frames of the command channel ([`command`] checks them).
pub mod command_v1 {
    include!(concat!(env!("OUT_DIR"), "/bettercompute.command.v1.rs"));
}

/// HTTPS endpoints. Unary calls are POSTs of a protobuf body answered with a
/// protobuf body; a non-2xx answer carries an [`agent::Error`].
pub mod endpoints {
    pub const JOIN: &str = "/bettercompute.agent.v1.JoinService/Join";
    pub const RENEW: &str = "/bettercompute.agent.v1.JoinService/Renew";
    pub const ACQUIRE_LEASE: &str = "/bettercompute.site.v1.SiteService/AcquireLease";
    pub const RENEW_LEASE: &str = "/bettercompute.site.v1.SiteService/RenewLease";
    pub const RELEASE_LEASE: &str = "/bettercompute.site.v1.SiteService/ReleaseLease";
    pub const GET_SECRET: &str = "/bettercompute.site.v1.SiteService/GetSecret";
    pub const LIST_BOOT_ENTRIES: &str = "/bettercompute.site.v1.SiteService/ListBootEntries";
    /// A `GET` upgraded to a WebSocket (mTLS, the node certificate) whose
    /// binary frames are `command_v1::ServerFrame` / `AgentFrame`.
    pub const COMMAND_CHANNEL: &str = "/bettercompute.command.v1.CommandService/Channel";
    pub const CONTENT_TYPE: &str = "application/x-protobuf";
    /// `GET` + an image name (mTLS, a ramdisk's node certificate): the
    /// deploy image's stored bytes (raw or zstd, as registered).
    pub const IMAGES: &str = "/v1/images/";
    /// `GET` (mTLS, a ramdisk's node certificate): the node's NoCloud seed
    /// document, `{"user-data": …, "meta-data": …}`.
    pub const DEPLOY_SEED: &str = "/v1/deploy/seed";
}

/// The role string used in certificates, the database and the CLI.
impl agent::Role {
    pub fn name(self) -> &'static str {
        match self {
            agent::Role::Unspecified => "unspecified",
            agent::Role::Node => "node",
            agent::Role::Site => "site",
            agent::Role::Ramdisk => "ramdisk",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "node" => Some(agent::Role::Node),
            "site" => Some(agent::Role::Site),
            "ramdisk" => Some(agent::Role::Ramdisk),
            _ => None,
        }
    }
}

/// SHA-256, the one digest of the wire.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}
