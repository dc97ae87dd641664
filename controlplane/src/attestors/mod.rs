//! The attestors that ship with the control plane: `join-token` (built into
//! every [`crate::attestor::AttestorRegistry`]), `tpm`, `x509pop` and
//! `discovery`, `cloud-iid` (registered by [`crate::join::JoinService::open`]). Others
//! (provisioned) are added with
//! [`crate::attestor::AttestorRegistry::register`].

pub mod cloud_iid;
pub mod discovery;
pub mod join_token;
pub mod tpm;
pub mod x509pop;
