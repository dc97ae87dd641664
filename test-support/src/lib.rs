//! What the tests share across crates (the control plane's unit tests, the
//! e2e binary, the fuzz bodies): one crate instead of source files compiled
//! into each with `#[path]`. Never a dependency of a shipped binary.

pub mod captured;
pub mod pg_cluster;
pub mod tls;
