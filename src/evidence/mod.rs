//! Evidence builders, one per attestor.
//!
//! Each is a function of its inputs (token, keys, CSR digest, claims,
//! clock, and for `tpm` the TPM itself); none talks to the control plane
//! (`cloud-iid` asks the VM's own metadata service for its document). The join flow
//! picks the builder for the configured attestor.
pub(crate) mod challenge;
pub(crate) mod claims;
pub(crate) mod cloud_iid;
pub mod discovery;
pub(crate) mod eventlog;
pub mod join_token;
pub(crate) mod provisioned;
pub mod tpm;
pub mod x509pop;

/// Attestor ids as the control plane names them (the wire's
/// [`bc_wire::AttestorId`]).
pub(crate) mod attestor {
    use bc_wire::AttestorId;

    /// The built-in attestor: a sealed join token, no further evidence.
    pub(crate) const JOIN_TOKEN: &str = AttestorId::JoinToken.as_str();
    /// The TPM's EK and AK, two rounds, the node key certified by the AK.
    pub(crate) const TPM: &str = AttestorId::Tpm.as_str();
    /// Re-joining as itself with the last certificate and its key.
    pub(crate) const X509POP: &str = AttestorId::X509Pop.as_str();
    /// A PXE ramdisk vouched for by its site's boot server.
    pub(crate) const DISCOVERY: &str = AttestorId::Discovery.as_str();
    /// An installed system's single-use token from its user data, bound to
    /// its product UUID.
    pub(crate) const PROVISIONED: &str = AttestorId::Provisioned.as_str();
    /// A cloud VM's identity document, signed by its cloud; no token.
    pub(crate) const CLOUD_IID: &str = AttestorId::CloudIid.as_str();
}
