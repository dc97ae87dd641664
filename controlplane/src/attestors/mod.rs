//! The attestors that ship with the control plane: `join-token` (built into
//! every [`crate::attestor::AttestorRegistry`]), `tpm`, `x509pop` and
//! `discovery`, `provisioned` and `cloud-iid` (registered by
//! [`crate::join::JoinService::open`]). Others are added with
//! [`crate::attestor::AttestorRegistry::register`].

pub mod cloud_iid;
pub mod discovery;
pub mod join_token;
pub mod provisioned;
pub mod tpm;
pub mod x509pop;
