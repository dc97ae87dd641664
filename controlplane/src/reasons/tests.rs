//! What the types leave to a test. Each place's reasons are its enum's, so
//! a reason cannot be left out of its place's listing nor refused with as
//! a literal ([`crate::Refusal::new`] takes a [`crate::reason::Reason`]
//! only), and an error's reason is matched exhaustively where it is mapped
//! (`EkError::reason`, `TpmReason::node_key`, `RenewReason::node_key`).
//! Still checked here:
//! - no two reasons of a place share a spelling, and each place records its
//!   event;
//! - every enum declared with `reasons!` is a place of [`PLACES`] (a new
//!   place's enum must be listed; the source is read for the declarations);
//! - a place refuses with another place's enum only where [`BORROWED`] says
//!   why (the source is read for the enum paths it names), so an event's
//!   reason is listed under the place that records it;
//! - an attestor's place is its attestor id, the role table's reasons are
//!   their attestor's, and the node-key reasons are spelt as the wire crate
//!   spells them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::*;

/// JoinService's own checks, for any attestor: the event's `attestor` is
/// the one the request named.
const JOIN: &str = <JoinReason as Reason>::PLACE;
/// Renew (`security.renew.refused`).
const RENEW: &str = <RenewReason as Reason>::PLACE;
/// The site API (`security.site.refused`), whichever call.
const SITE: &str = <SiteReason as Reason>::PLACE;

/// The enums declared with `reasons!` that are no place: never recorded.
const NOT_PLACES: &[&str] = &[
    // Refusal::fault's: JoinService answers UNAVAILABLE or INTERNAL.
    "Unrecorded",
];

/// (file's place enum, another place's enum it names, why).
const BORROWED: &[(&str, &str, &str)] = &[(
    "DiscoveryReason",
    "TpmReason",
    "TPM evidence without a round is the tpm attestor's evidence-malformed",
)];

/// The place enum whose reasons a source file (relative to `src/`) decides.
fn place_of(path: &str) -> Option<&'static str> {
    Some(match path {
        "plane/join.rs" | "model/hardware.rs" => "JoinReason",
        "plane/renew.rs" => "RenewReason",
        "plane/siteapi.rs" => "SiteReason",
        "attestors/join_token.rs" => "TokenReason",
        "attestors/provisioned.rs" => "ProvisionedReason",
        "attestors/discovery.rs" => "DiscoveryReason",
        p if p.starts_with("attestors/discovery/") => "DiscoveryReason",
        "attestors/x509pop.rs" => "X509PopReason",
        p if p.starts_with("attestors/tpm/") => "TpmReason",
        p if p.starts_with("attestors/cloud_iid/") => "CloudReason",
        _ => return None,
    })
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, relative to `src/`, without test files.
fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let rel = path
            .strip_prefix(src())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if path.is_dir() {
            // Not the capture tools' data, nor this test.
            if name != "testdata" && rel != "reasons" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs")
            && !["tests.rs", "test_support.rs", "race_tests.rs"].contains(&name.as_str())
            // The listing itself names every enum.
            && rel != "reasons.rs"
        {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((rel, without_tests(&text)));
        }
    }
}

/// The text before the file's first `#[cfg(test)]` (test modules come last
/// in this crate), without `//` comments.
fn without_tests(text: &str) -> String {
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn all_sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    files
}

#[test]
fn the_list_names_each_pair_once_with_its_event() {
    let mut seen = BTreeSet::new();
    for (place, reason) in all() {
        assert!(
            seen.insert((place.name, reason)),
            "({}, {reason}) listed twice",
            place.name
        );
        assert!(!reason.is_empty() && reason.len() <= 64, "{reason:?}");
        let expected = match place.name {
            RENEW => records::EVENT_RENEW_REFUSED,
            SITE => siteapi::EVENT_SITE_REFUSED,
            _ => records::EVENT_JOIN_REFUSED,
        };
        assert_eq!(place.event, expected, "{}", place.name);
    }
    let names: BTreeSet<_> = PLACES.iter().map(|p| p.name).collect();
    assert_eq!(names.len(), PLACES.len(), "a place listed twice");
}

#[test]
fn every_reason_enum_of_the_crate_is_a_place() {
    let listed: BTreeSet<&str> = PLACES.iter().map(|p| p.enum_name).collect();
    let mut declared = BTreeSet::new();
    for (file, text) in all_sources() {
        for (i, _) in text.match_indices("reasons! {") {
            let rest = &text[i..];
            let name = rest
                .split_once(" enum ")
                .and_then(|(_, r)| r.split_whitespace().next())
                .unwrap_or_else(|| panic!("{file}: a reasons! without an enum"));
            if file != "reason.rs" {
                declared.insert(name.to_owned());
            }
        }
    }
    for name in &declared {
        assert!(
            listed.contains(name.as_str()) || NOT_PLACES.contains(&name.as_str()),
            "{name} is declared with reasons! but is no place of reasons::PLACES"
        );
    }
    for name in &listed {
        assert!(declared.contains(*name), "{name}: not found in the source");
    }
}

#[test]
fn a_place_refuses_with_another_places_reasons_only_where_borrowed() {
    let enums: Vec<&str> = PLACES.iter().map(|p| p.enum_name).collect();
    let mut problems = Vec::new();
    for (file, text) in all_sources() {
        let own = place_of(&file);
        for other in &enums {
            let path = format!("{other}::");
            let named = text.match_indices(&path).any(|(i, _)| {
                !text[..i]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            });
            if !named || own == Some(*other) {
                continue;
            }
            let allowed = own.is_some_and(|own| {
                BORROWED
                    .iter()
                    .any(|(place, borrowed, _)| *place == own && borrowed == other)
            });
            if !allowed {
                problems.push(format!(
                    "{file} ({}) names {other}: refuse with its place's own enum, or list why in BORROWED",
                    own.unwrap_or("no place")
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_attestor_places_are_attestor_ids() {
    let cp = crate::test_support::cp();
    let ids = cp.svc.attestor_ids();
    for place in PLACES {
        if ![JOIN, RENEW, SITE].contains(&place.name) {
            assert!(
                ids.iter().any(|id| id == place.name),
                "{} is no attestor's id ({ids:?})",
                place.name
            );
        }
    }
}

#[test]
fn the_role_reasons_are_listed_at_their_attestor() {
    let listed: BTreeSet<_> = all().map(|(p, r)| (p.name, r)).collect();
    let registry = crate::attestors::builtin(&crate::config::Config::default(), [0; 32]);
    for attestor in registry.ids() {
        let Some(reason) = registry.get(attestor).and_then(|a| a.roles().refusal) else {
            panic!("{attestor} names no role refusal");
        };
        assert_eq!(reason.place(), attestor.as_str(), "{reason:?}");
        assert!(
            listed.contains(&(attestor.as_str(), reason.as_str())),
            "({attestor}, {reason}) of Attestor::roles"
        );
    }
}

#[test]
fn the_node_key_reasons_are_spelt_as_the_wire_crate_spells_them() {
    use bc_wire::tpm::{CertificationError, TpmError};
    let certifications = [
        CertificationError::Malformed(TpmError::Magic),
        CertificationError::Signature,
        CertificationError::Nonce,
        CertificationError::Name,
        CertificationError::Attributes,
        CertificationError::NotCsr,
    ];
    for e in &certifications {
        assert_eq!(TpmReason::node_key(e).as_str(), e.reason());
        assert_eq!(RenewReason::node_key(e).as_str(), e.reason());
    }
}
