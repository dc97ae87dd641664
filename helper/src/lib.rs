//! bcd's root helper, after OpenSSH's privilege separation: the only
//! process that opens the TPM (`bcd helper`, root) serves the unprivileged
//! node (`bcd node`) a closed set of operations over a unix socket.
//!
//! - [`proto`]: the messages and their framing (length-bounded, protobuf);
//!   every request is checked into an [`proto::Operation`] before anything
//!   touches the TPM.
//! - `server`: the root side, generic over a [`Backend`] that the
//!   bcd binary implements with its TPM module (this crate never touches
//!   tss-esapi). It checks the peer's uid (SO_PEERCRED) before reading a byte.
//! - [`journal`]: `system.journal`, the system journal of bcd's own units,
//!   read by a fixed `journalctl` run, bounded in lines, bytes and time.
//! - `client`: the node's side. It trusts nothing it gets back: every
//!   signature is verified against the key's public half, and every
//!   certification against the AK the helper announced.
mod client;
pub mod journal;
pub mod proto;
mod server;

pub use client::{Ak, Client, ClientError, HelperKeyPublic};
pub use proto::{Hash, Operation};
pub use server::{
    serve, AkInfo, Allowed, Backend, BackendError, CertifiedQuote, Limits, ServeError, TOO_MANY,
};
