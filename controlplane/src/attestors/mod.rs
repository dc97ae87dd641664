//! The attestors that ship with the control plane: `join-token` (built into
//! every [`crate::attestor::AttestorRegistry`]), `tpm` and `x509pop`
//! (registered by [`crate::join::JoinService::open`]). Others (discovery,
//! provisioned) are added with
//! [`crate::attestor::AttestorRegistry::register`].

pub mod join_token;
pub mod tpm;
pub mod x509pop;
