//! What clients may hold of a server, shared by both of the project's
//! servers (the control plane's HTTPS listener, `bcd site`'s plain-HTTP boot
//! server): server infrastructure, kept out of the wire contract.

mod tracker;

pub use tracker::{source_key, Deadline, Refusal, Slot, Tracker};
