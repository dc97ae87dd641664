//! End-to-end tests: the real `bcd` and `bc-controlplane` binaries, over real
//! HTTPS on loopback, with real SQLite files. One test binary, one harness.
//!
//! The binaries must be built first (`cargo build --workspace --bins`, which
//! `scripts/test` does): Cargo builds only this package's own binary for its
//! integration tests.

mod harness;
// Joins routed through a proxy to one control plane or several.
mod joinproxy;
// The tests' PostgreSQL server, the unit tests' too.
use bc_test_support::pg_cluster;

mod answers;
mod bootpolicy;
mod commands;
mod datadir;
mod doctor;
mod ecc;
mod ekchain;
mod ekservice;
mod eksource;
mod ektemplate;
mod events;
mod helper;
mod install;
mod join_token;
mod load;
mod maker;
mod migrate;
mod package;
mod pcr;
mod pcrbanks;
mod realek;
mod renew_answers;
// Every refusal reason of the control plane, and the test that sees it.
mod reasons;
// Several `serve` processes on one PostgreSQL database.
mod replicas;
// A PostgreSQL restart under a running control plane.
mod pgrestart;
// These move bcd's clock (BCD_CLOCK_OFFSET), crash it at failpoints or give
// it a fake sysfs (BCD_SYSFS_ROOT), which only a `--features bcd/failpoints`
// build honours; scripts/test builds so, and a plain `cargo test` leaves
// them out (scripts/release-check proves the release build ignores all three).
#[cfg(feature = "failpoints")]
mod cloud_cms;
#[cfg(feature = "failpoints")]
mod cloud_iid;
#[cfg(feature = "failpoints")]
mod cloud_oidc;
#[cfg(feature = "failpoints")]
mod discovery;
// A ramdisk (discovery's helpers) with a fake /dev and /proc.
#[cfg(feature = "failpoints")]
mod deploy;
// Reuses discovery's helpers (and its fake sysfs).
#[cfg(feature = "failpoints")]
mod discovery_tpm;
#[cfg(feature = "failpoints")]
mod node;
#[cfg(feature = "failpoints")]
mod provisioned;
#[cfg(feature = "failpoints")]
mod reclaim;
#[cfg(feature = "failpoints")]
mod refusals;
#[cfg(feature = "failpoints")]
mod renewboot;
#[cfg(feature = "failpoints")]
mod tenants;
// Commission and deploy workflows over discovery (fake sysfs).
mod replay;
mod reset;
#[cfg(feature = "failpoints")]
mod restore;
#[cfg(feature = "failpoints")]
mod workflows;
// Reuses discovery's helpers (and its fake sysfs).
#[cfg(feature = "failpoints")]
mod site;
// bcd site and bcd ramdisk under `[discovery] approval` (site's and
// discovery's helpers).
#[cfg(feature = "failpoints")]
mod approval;
// Measured boot at join: the event log under the fake sysfs.
#[cfg(feature = "failpoints")]
mod mboot;
mod tpm;
mod tpmcount;
mod usage;
