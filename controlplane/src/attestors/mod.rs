//! The attestors that ship with the control plane: `join-token` (built into
//! every [`crate::attestor::AttestorRegistry`]) and `tpm` (registered by
//! [`crate::join::JoinService::open`]). Others (x509pop, discovery,
//! provisioned) are added with
//! [`crate::attestor::AttestorRegistry::register`].

pub mod join_token;
pub mod tpm;
