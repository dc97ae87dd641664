//! Evidence builders, one per attestor.
//!
//! Each is a pure function of its inputs (token, keys, CSR digest, claims,
//! clock), so each is tested with vectors and none does I/O. The join flow
//! picks the builder for the configured attestor.
pub mod join_token;

/// Attestor ids as the control plane names them.
pub mod attestor {
    /// The built-in attestor: a sealed join token, no further evidence.
    pub const JOIN_TOKEN: &str = "join-token";
}
