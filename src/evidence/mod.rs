//! Evidence builders, one per attestor.
//!
//! Each is a function of its inputs (token, keys, CSR digest, claims,
//! clock, and for `tpm` the TPM itself); none talks to the control plane
//! (`cloud-iid` asks the VM's own metadata service for its document). The join flow
//! picks the builder for the configured attestor.
pub mod challenge;
pub mod claims;
pub mod cloud_iid;
pub mod discovery;
pub mod join_token;
pub mod provisioned;
pub mod tpm;
pub mod x509pop;

/// Attestor ids as the control plane names them.
pub mod attestor {
    /// The built-in attestor: a sealed join token, no further evidence.
    pub const JOIN_TOKEN: &str = "join-token";
    /// The TPM's EK and AK, two rounds, the node key certified by the AK.
    pub const TPM: &str = "tpm";
    /// Re-joining as itself with the last certificate and its key.
    pub const X509POP: &str = "x509pop";
    /// A PXE ramdisk vouched for by its site's boot server.
    pub const DISCOVERY: &str = "discovery";
    /// An installed system's single-use token from its user data, bound to
    /// its product UUID.
    pub const PROVISIONED: &str = "provisioned";
    /// A cloud VM's identity document, signed by its cloud; no token.
    pub const CLOUD_IID: &str = "cloud-iid";
}
