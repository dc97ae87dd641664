//! What clients may hold of a server, shared by both of the project's
//! servers (the control plane's HTTPS listener, `bcd site`'s plain-HTTP boot
//! server): the connection caps and deadlines ([`Tracker`], [`Deadline`])
//! and the accept loop that applies them ([`serve_connections`]). Server
//! infrastructure, kept out of the wire contract.

mod accept;
mod tracker;

pub use accept::{serve_connections, AcceptPolicy, RefusedCount, Stop};
pub use tracker::{source_key, Deadline, Refusal, Slot, Tracker};
