//! End-to-end tests: the real `bcd` and `bc-controlplane` binaries, over real
//! HTTPS on loopback, with real SQLite files. One test binary, one harness.
//!
//! The binaries must be built first (`cargo build --workspace --bins`, which
//! `scripts/test` does): Cargo builds only this package's own binary for its
//! integration tests.

mod harness;

mod answers;
mod doctor;
mod join_token;
mod node;
mod reset;
mod tpm;
mod usage;
