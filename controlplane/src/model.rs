//! The tables and values the services and attestors decide over: nodes,
//! pools, sites, tokens, boot entries, hardware keys, enrolments, the event
//! log, and the attestation contract ([`attestor`]). Above [`crate::store`]
//! and [`crate::pki`]; imports no attestor, service or transport.

pub mod attestor;
pub mod boot;
pub mod dist;
pub mod enroll;
pub mod eventlog;
pub mod hardware;
pub mod join_reasons;
pub mod machine;
pub mod nodes;
pub mod pools;
pub mod records;
pub mod sites;
pub mod tokens;
pub mod uses;
