//! Every reason the control plane refuses with, where it decides it and
//! which event records it: one list ([`PLACES`]), so that the e2e suite can
//! hold a test to each (`tests/e2e/reasons.rs` fails on a reason without
//! one), and the README can print them.
//!
//! The reasons stay where they are decided (each attestor's, JoinService's,
//! Renew's and the site API's constants); this module only lists them. The
//! test at the bottom reads this crate's source and fails when a refusal
//! reason is defined, imported into another place or spelled as a literal
//! without being listed here.
//!
//! A check that several attestors share through one function
//! ([`crate::attestors::join_token::live_token`]: `token-missing` …
//! `token-expired`, run by `provisioned` and `discovery` too) is listed once,
//! under the attestor whose module holds it.

use crate::attestors::{cloud_iid, discovery, join_token, provisioned, tpm, x509pop};
use crate::{hardware, join, records, renew, siteapi};

/// A place that refuses, and what it refuses with.
#[derive(Clone, Copy, Debug)]
pub struct Place {
    /// `join` (JoinService itself, whichever attestor the request named),
    /// an attestor's id (the event's `attestor`), `renew` or `site`.
    pub name: &'static str,
    /// The event type a refusal here is recorded as.
    pub event: &'static str,
    pub reasons: &'static [&'static str],
}

/// JoinService's own checks, for any attestor: the event's `attestor` is
/// the one the request named.
pub const JOIN: &str = "join";
/// Renew (`security.renew.refused`).
pub const RENEW: &str = "renew";
/// The site API (`security.site.refused`), whichever call.
pub const SITE: &str = "site";

/// The node-key certification reasons ([`bc_wire::tpm::CertificationError`]),
/// checked at a tpm join and at the renewal of an AK-bound certificate.
const NODE_KEY: [&str; 6] = [
    "node-key-malformed",
    "node-key-signature",
    "node-key-nonce",
    "node-key-name",
    "node-key-attributes",
    "node-key-not-csr",
];

/// Every place, in the order a request meets them.
pub const PLACES: &[Place] = &[
    Place {
        name: JOIN,
        event: records::EVENT_JOIN_REFUSED,
        reasons: &[
            join::CSR_KEY,
            join::CSR_NOT_VERIFIED,
            join::UNKNOWN_ATTESTOR,
            join::ROLE,
            join::TOKEN_UNOPENABLE,
            hardware::RECLAIM,
            join::NODE_KEY_STATEMENT,
            join::RECLAIM_UNKNOWN,
            join::RECLAIM_RETIRED,
            join::RECLAIM_ROLE,
            join::BOUND_ELSEWHERE,
            join::UNKNOWN_POOL,
            join::POOL_ATTESTOR,
            join::POOL_EK_ASSURANCE,
            join::EXPECT_PRODUCT_UUID,
            join::EXPECT_MAC,
        ],
    },
    Place {
        name: crate::attestor::JOIN_TOKEN,
        event: records::EVENT_JOIN_REFUSED,
        reasons: &[
            join_token::TOKEN_MISSING,
            join_token::TOKEN_MALFORMED,
            join_token::TOKEN_UNKNOWN,
            join_token::TOKEN_SECRET,
            join_token::TOKEN_REVOKED,
            join_token::TOKEN_EXPIRED,
            join_token::TOKEN_EXHAUSTED,
            join_token::TOKEN_ROLE,
        ],
    },
    Place {
        name: provisioned::PROVISIONED,
        event: records::EVENT_JOIN_REFUSED,
        reasons: &[
            join_token::TOKEN_ROLE,
            join_token::TOKEN_EXHAUSTED,
            provisioned::NOT_SINGLE_USE,
            provisioned::NO_PRODUCT_UUID,
            provisioned::UNBOUND,
            provisioned::PRODUCT_UUID_MISMATCH,
        ],
    },
    Place {
        name: discovery::DISCOVERY,
        event: records::EVENT_JOIN_REFUSED,
        reasons: &[
            discovery::DISCOVERY_ROLE_REASON,
            discovery::ASSERTION_MALFORMED,
            discovery::ASSERTION_REUSED,
            join_token::TOKEN_ROLE,
            join_token::TOKEN_EXHAUSTED,
            discovery::TOKEN_NOT_SINGLE_USE,
            discovery::TOKEN_SITE,
            discovery::TOKEN_MAC,
            discovery::SIGNER_UNKNOWN,
            discovery::SIGNER_RETIRED,
            discovery::SIGNER_NOT_SITE,
            discovery::LEASE_NOT_HELD,
            discovery::LEASE_EPOCH,
            discovery::SIGNER_CERTIFICATE,
            discovery::ASSERTION_SIGNATURE,
            discovery::ASSERTION_STALE,
            discovery::ASSERTION_FUTURE,
            discovery::MAC_NOT_CLAIMED,
            discovery::PRODUCT_UUID_MISMATCH,
            discovery::approval::APPROVAL_DENIED,
            discovery::approval::APPROVAL_BUSY,
        ],
    },
    Place {
        name: tpm::TPM,
        event: records::EVENT_JOIN_REFUSED,
        reasons: &[
            tpm::EVIDENCE_MALFORMED,
            tpm::ROLE,
            // tpm::ek::EkError::reason
            "ek-certificate",
            "ek-chain",
            "ek-roca",
            "ek-mismatch",
            tpm::AK_ATTRIBUTES,
            tpm::CHALLENGE_STATE,
            tpm::CHALLENGE_EXPIRED,
            tpm::CHALLENGE_REUSED,
            tpm::CHALLENGE_SECRET,
            tpm::QUOTE_SIGNATURE,
            tpm::QUOTE_NONCE,
            tpm::QUOTE_PCRS,
            tpm::PCR_POLICY,
            NODE_KEY[0],
            NODE_KEY[1],
            NODE_KEY[2],
            NODE_KEY[3],
            NODE_KEY[4],
            NODE_KEY[5],
            tpm::NODE_KEY_NOT_CERTIFIED,
            tpm::UNKNOWN_EK,
            tpm::ENROLLMENT_DENIED,
        ],
    },
    Place {
        name: x509pop::X509POP,
        event: records::EVENT_JOIN_REFUSED,
        reasons: &[
            x509pop::EVIDENCE_MALFORMED,
            x509pop::UNKNOWN_CERTIFICATE,
            x509pop::DELETED,
            x509pop::STALE_GENERATION,
            x509pop::REVOKED,
            x509pop::RETIRED,
            x509pop::ROLE,
            x509pop::PAST_GRACE,
            x509pop::CLOCK_WINDOW,
            x509pop::SIGNATURE,
            x509pop::REPLAYED,
        ],
    },
    Place {
        name: cloud_iid::CLOUD_IID,
        event: records::EVENT_JOIN_REFUSED,
        reasons: &[
            cloud_iid::CLOUD_MALFORMED,
            cloud_iid::CLOUD_UNKNOWN_PROVIDER,
            cloud_iid::CLOUD_SIGNATURE,
            cloud_iid::CLOUD_ISSUER,
            cloud_iid::CLOUD_CHAIN,
            cloud_iid::CLOUD_SIGNER,
            cloud_iid::CLOUD_AUDIENCE,
            cloud_iid::CLOUD_STALE,
            cloud_iid::CLOUD_FUTURE,
            cloud_iid::INSTANCE_REUSED,
            cloud_iid::UNKNOWN_INSTANCE,
            cloud_iid::CLOUD_ROLE,
        ],
    },
    Place {
        name: RENEW,
        event: records::EVENT_RENEW_REFUSED,
        reasons: &[
            renew::NO_CLIENT_CERTIFICATE,
            renew::CERTIFICATE_IDENTITY,
            renew::CSR_KEY,
            renew::CSR_SIGNATURE,
            renew::UNKNOWN_CERTIFICATE,
            renew::DELETED,
            renew::RETIRED,
            renew::STALE_GENERATION,
            renew::REVOKED,
            renew::EXPIRED,
            renew::STATEMENT_MALFORMED,
            renew::KEY_ATTESTATION_MISSING,
            renew::AK_MISMATCH,
            renew::AK_ATTRIBUTES,
            NODE_KEY[0],
            NODE_KEY[1],
            NODE_KEY[2],
            NODE_KEY[3],
            NODE_KEY[4],
            NODE_KEY[5],
        ],
    },
    Place {
        name: SITE,
        event: siteapi::EVENT_SITE_REFUSED,
        reasons: &[
            siteapi::NO_CLIENT_CERTIFICATE,
            siteapi::CERTIFICATE_IDENTITY,
            siteapi::UNKNOWN_CERTIFICATE,
            siteapi::NODE_RETIRED,
            siteapi::CERTIFICATE_STALE,
            siteapi::NOT_SITE_NODE,
            siteapi::LEASE_LOST,
            siteapi::NOT_LEASE_HOLDER,
            siteapi::SECRET_SIGNATURE,
            siteapi::SECRET_STALE,
            siteapi::UNKNOWN_WORKFLOW,
            siteapi::WORKFLOW_CLOSED,
            siteapi::WORKFLOW_MAC,
            siteapi::WORKFLOW_BUSY,
        ],
    },
];

/// Every (place, reason) pair of [`PLACES`].
pub fn all() -> impl Iterator<Item = (&'static Place, &'static str)> {
    PLACES
        .iter()
        .flat_map(|p| p.reasons.iter().map(move |r| (p, *r)))
}

#[cfg(test)]
mod tests;
