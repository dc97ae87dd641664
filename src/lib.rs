//! `bcd`: the node agent, as a library under a thin binary (`src/main.rs`).
//!
//! One module per subcommand (`join`, `node`, `helper`, `status`, `doctor`, `identify`), plus the shared
//! parts: `config`, `keys` (the node key signer and its holders), `identity`
//! (the data directory), `client` (the control plane), `evidence` (one
//! builder per attestor), `pki` (reading node certificates) and `tpm` (the
//! only module that touches tss-esapi). The end-to-end tests use the same
//! modules to produce real TPM output.
//!
//! Subcommands import shared modules, never each other: the flows two of them
//! run are shared modules (`joining`, `rejoin`, `renewal`, `sitedata`, `site_settings`).

mod backoff;
pub mod channel;
pub mod cli;
pub mod client;
mod clock;
mod commands;
pub mod config;
mod doctor;
mod environ;
pub mod evidence;
mod failpoint;
mod gendocs;
pub mod helper;
mod http_builder;
mod identify;
pub mod identity;
mod join;
mod joining;
pub mod journal;
pub mod keys;
mod node;
mod out;
pub mod pki;
mod ramdisk;
mod rejoin;
mod renewal;
pub mod site;
mod site_settings;
mod sitedata;
mod status;
pub mod tpm;

/// The NoCloud seed document `deploy.image` parses (its fuzz target's).
pub use commands::DeploySeed;
