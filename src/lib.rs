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

pub mod backoff;
pub mod channel;
pub mod cli;
pub mod client;
pub mod clock;
mod commands;
pub mod config;
pub mod doctor;
mod environ;
pub mod evidence;
pub mod failpoint;
pub mod gendocs;
pub mod helper;
pub mod identify;
pub mod identity;
pub mod join;
pub mod joining;
pub mod journal;
pub mod keys;
pub mod node;
pub mod out;
pub mod pki;
pub mod ramdisk;
pub mod rejoin;
pub mod renewal;
pub mod site;
pub mod site_settings;
pub mod sitedata;
pub mod status;
pub mod tpm;
