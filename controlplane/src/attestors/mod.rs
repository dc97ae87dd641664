//! The attestors that ship with the control plane. Only `join-token` is
//! built in; the others (tpm, x509pop, discovery, provisioned) are added
//! with [`crate::attestor::AttestorRegistry::register`].

pub mod join_token;
