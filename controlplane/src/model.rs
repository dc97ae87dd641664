//! The tables and values the services and attestors decide over: nodes,
//! pools, tenants, node leases, sites, tokens, boot entries, hardware keys, enrolments, the event
//! log, and the attestation contract ([`attestor`]). Above [`crate::store`]
//! and [`crate::pki`]; imports no attestor, service or transport.

pub(crate) mod attestor;
pub(crate) mod boot;
pub(crate) mod boot_policy;
pub(crate) mod commands;
pub(crate) mod dist;
pub(crate) mod enroll;
pub(crate) mod eventlog;
pub(crate) mod hardware;
pub(crate) mod images;
pub(crate) mod join_reasons;
pub(crate) mod leases;
pub(crate) mod machine;
pub(crate) mod node_boot;
pub(crate) mod nodes;
pub(crate) mod pools;
pub(crate) mod records;
pub(crate) mod seeds;
pub(crate) mod sites;
pub(crate) mod tenants;
pub(crate) mod tokens;
pub(crate) mod uses;
pub(crate) mod workflows;
