//! Every reason the control plane refuses with, where it decides it and
//! which event records it: one list ([`PLACES`]), so that the e2e suite can
//! hold a test to each (`tests/e2e/reasons.rs` fails on a reason without
//! one), and the README can print them.
//!
//! The reasons stay where they are decided: one enum per place (JoinService's,
//! each attestor's, Renew's and the site API's), declared with
//! [`crate::reason::reasons!`]. This module lists the places only; each
//! place's reasons are its enum's [`Reason::SPELLINGS`], so a reason added to an
//! enum is listed with it. The test at the bottom checks what the types do
//! not: that every enum declared in the crate is a place here, and that a
//! place refuses with another place's reasons only where listed.
//!
//! A check that several attestors share through one function
//! ([`crate::attestors::join_token::live_token`]: `token-missing` …
//! `token-expired`, run by `provisioned` and `discovery` too) is listed once,
//! under the attestor whose module holds it.

use crate::attestors::cloud_iid::CloudReason;
use crate::attestors::discovery::DiscoveryReason;
use crate::attestors::join_token::TokenReason;
use crate::attestors::provisioned::ProvisionedReason;
use crate::attestors::tpm::TpmReason;
use crate::attestors::x509pop::X509PopReason;
use crate::model::join_reasons::JoinReason;
use crate::model::records;
use crate::plane::renew::RenewReason;
use crate::plane::siteapi::{self, SiteReason};
use crate::reason::Reason;

/// A place that refuses, and what it refuses with.
#[derive(Clone, Copy, Debug)]
pub struct Place {
    /// `join` (JoinService itself, whichever attestor the request named),
    /// an attestor's id (the event's `attestor`), `renew` or `site`.
    pub name: &'static str,
    /// The event type a refusal here is recorded as.
    pub event: &'static str,
    /// The spellings of the place's enum, in its order.
    pub reasons: &'static [&'static str],
    /// The place's enum (its Rust name).
    pub enum_name: &'static str,
}

impl Place {
    const fn of<R: Reason>(event: &'static str) -> Place {
        Place {
            name: R::PLACE,
            event,
            reasons: R::SPELLINGS,
            enum_name: R::NAME,
        }
    }
}

/// Every place, in the order a request meets them.
pub const PLACES: &[Place] = &[
    Place::of::<JoinReason>(records::EVENT_JOIN_REFUSED),
    Place::of::<TokenReason>(records::EVENT_JOIN_REFUSED),
    Place::of::<ProvisionedReason>(records::EVENT_JOIN_REFUSED),
    Place::of::<DiscoveryReason>(records::EVENT_JOIN_REFUSED),
    Place::of::<TpmReason>(records::EVENT_JOIN_REFUSED),
    Place::of::<X509PopReason>(records::EVENT_JOIN_REFUSED),
    Place::of::<CloudReason>(records::EVENT_JOIN_REFUSED),
    Place::of::<RenewReason>(records::EVENT_RENEW_REFUSED),
    Place::of::<SiteReason>(siteapi::EVENT_SITE_REFUSED),
];

/// Every (place, reason) pair of [`PLACES`].
pub fn all() -> impl Iterator<Item = (&'static Place, &'static str)> {
    PLACES
        .iter()
        .flat_map(|p| p.reasons.iter().map(move |r| (p, *r)))
}

#[cfg(test)]
mod tests;
