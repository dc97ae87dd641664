//! [`PLACES`] is complete: every refusal reason this crate's source can
//! refuse with is listed, at the place that refuses with it.
//!
//! What the source scan holds the code to (a reason written another way
//! fails here rather than slipping past the list):
//! - a reason is a `const NAME: &str = "…";` of its place's files (each
//!   such constant is a reason unless [`NOT_REASONS`] says otherwise);
//! - another place refusing with it imports it by name (`use …::{NAME}`);
//! - no refusal is made with a string literal;
//! - a reason computed by an error's `reason()` is one of the enums below,
//!   whose every variant is matched here (a new variant does not compile).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::*;

/// Constants of the refusing places that are not reasons: attestor ids,
/// event types, statuses, defaults.
const NOT_REASONS: &[(&str, &str)] = &[
    (JOIN, "KNOWN_STATEMENT_PREFIX"),
    ("tpm", "TPM"),
    ("tpm", "STATUS_PENDING"),
    ("tpm", "STATUS_APPROVED"),
    ("tpm", "STATUS_DENIED"),
    ("tpm", "REQUEST_SELECT"),
    ("x509pop", "X509POP"),
    ("cloud-iid", "CLOUD_IID"),
    ("cloud-iid", "DEFAULT_SIGNER"),
    ("discovery", "DISCOVERY"),
    ("provisioned", "PROVISIONED"),
    (SITE, "EVENT_SITE_REFUSED"),
];

/// Imports of another place's reason that do not refuse with it here.
const NOT_REFUSED_HERE: &[(&str, &str)] = &[];

/// The calls a literal reason would be passed to.
const REFUSING_CALLS: &[&str] = &[
    "Refusal::new(",
    "refuse(",
    "refused(",
    "refuse_renew(",
    "Stop::Refused(",
];

/// The places' source files, relative to `src/`.
fn place_of(path: &str) -> Option<&'static str> {
    Some(match path {
        "join.rs" | "hardware.rs" => JOIN,
        "renew.rs" => RENEW,
        "siteapi.rs" => SITE,
        "attestors/join_token.rs" => "join-token",
        "attestors/provisioned.rs" => "provisioned",
        "attestors/discovery.rs" => "discovery",
        p if p.starts_with("attestors/discovery/") => "discovery",
        "attestors/x509pop.rs" => "x509pop",
        p if p.starts_with("attestors/tpm/") => "tpm",
        p if p.starts_with("attestors/cloud_iid/") => "cloud-iid",
        _ => return None,
    })
}

/// The module a `use crate::…` path names, as a file under `src/`.
fn module_file(path: &str) -> Option<&'static str> {
    Some(match path {
        "crate::join" => "join.rs",
        "crate::hardware" => "hardware.rs",
        "crate::renew" => "renew.rs",
        "crate::siteapi" => "siteapi.rs",
        "crate::attestors::join_token" => "attestors/join_token.rs",
        "crate::attestors::provisioned" => "attestors/provisioned.rs",
        "crate::attestors::discovery" => "attestors/discovery.rs",
        "crate::attestors::discovery::approval" => "attestors/discovery/approval.rs",
        "crate::attestors::x509pop" => "attestors/x509pop.rs",
        "crate::attestors::tpm" => "attestors/tpm/mod.rs",
        "crate::attestors::cloud_iid" => "attestors/cloud_iid/mod.rs",
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
        if path.is_dir() {
            if name != "testdata" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && name != "test_support.rs" {
            let rel = path
                .strip_prefix(src())
                .unwrap()
                .to_string_lossy()
                .into_owned();
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

/// `const NAME: &str = "value";` items, by name.
fn str_consts(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().split("const ").nth(1) else {
            continue;
        };
        let Some((name, value)) = rest.split_once(": &str = ") else {
            continue;
        };
        let Some(value) = value.strip_prefix('"').and_then(|v| v.strip_suffix("\";")) else {
            // A multi-line string: SQL, never a reason (listed in NOT_REASONS).
            out.insert(name.to_owned(), String::new());
            continue;
        };
        out.insert(name.to_owned(), value.to_owned());
    }
    out
}

/// `use PATH::{A, B as C};` and `use PATH::A;`: (PATH, imported name, local name).
fn imports(text: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let flat = text.replace('\n', " ");
    for item in flat.split(';') {
        let Some(path) = item.trim().strip_prefix("use ").or_else(|| {
            item.trim()
                .strip_prefix("pub use ")
                .or_else(|| item.trim().strip_prefix("pub(crate) use "))
        }) else {
            continue;
        };
        let (module, names) = match path.split_once("::{") {
            Some((m, rest)) => (m.trim().to_owned(), rest.trim_end_matches('}').to_owned()),
            None => match path.rsplit_once("::") {
                Some((m, n)) => (m.trim().to_owned(), n.to_owned()),
                None => continue,
            },
        };
        for name in names.split(',') {
            let name = name.trim();
            let (orig, local) = name.split_once(" as ").unwrap_or((name, name));
            out.push((
                module.clone(),
                orig.trim().to_owned(),
                local.trim().to_owned(),
            ));
        }
    }
    out
}

fn registered() -> BTreeSet<(&'static str, &'static str)> {
    all().map(|(p, r)| (p.name, r)).collect()
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
fn every_reason_in_the_source_is_listed_at_its_place() {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let consts: BTreeMap<&str, BTreeMap<String, String>> = files
        .iter()
        .map(|(f, text)| (f.as_str(), str_consts(text)))
        .collect();
    let listed = registered();
    let mut missing = Vec::new();
    for (file, text) in &files {
        let Some(place) = place_of(file) else {
            for call in ["Refusal::new(", "record_refusal("] {
                // (`plane.rs` defines `record_refusal`; it refuses nothing.)
                let defined = text.contains(&format!("fn {call}"));
                assert!(
                    defined || !text.contains(call),
                    "{file} refuses ({call}) but is no place of reasons.rs: map it in place_of"
                );
            }
            continue;
        };
        // Defined here.
        for (name, value) in &consts[file.as_str()] {
            if NOT_REASONS.contains(&(place, name.as_str())) {
                continue;
            }
            if !listed.contains(&(place, value.as_str())) {
                missing.push(format!("({place}, {value:?}) from {file}'s {name}"));
            }
        }
        // Imported from another place.
        for (module, name, local) in imports(text) {
            let Some(from) = module_file(&module) else {
                continue;
            };
            if place_of(from) == Some(place) || NOT_REFUSED_HERE.contains(&(place, local.as_str()))
            {
                continue;
            }
            let Some(value) = consts.get(from).and_then(|c| c.get(&name)) else {
                continue;
            };
            let from_place = place_of(from).unwrap();
            if NOT_REASONS.contains(&(from_place, name.as_str())) {
                continue;
            }
            if !listed.contains(&(place, value.as_str())) {
                missing.push(format!(
                    "({place}, {value:?}) imported by {file} as {local}"
                ));
            }
        }
        // Never a literal.
        for call in REFUSING_CALLS {
            for (i, _) in text.match_indices(call) {
                let args = &text[i + call.len()..];
                let args = &args[..args.find(')').unwrap_or(args.len())];
                assert!(
                    !args.contains('"'),
                    "{file}: a refusal with a literal reason ({call}{args}): make it a constant"
                );
            }
        }
        // Computed by an enum's reason(): the enums below only.
        let computed = text.matches(".reason()").count();
        let known = match file.as_str() {
            // One EkError (ek_refused: a certificate, an EK without one), one
            // CertificationError.
            "attestors/tpm/mod.rs" => 2,
            "renew.rs" => 1,
            _ => 0,
        };
        assert_eq!(
            computed, known,
            "{file}: a reason() call this test does not know: list its enum below"
        );
    }
    assert!(
        missing.is_empty(),
        "reasons missing from reasons.rs PLACES:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_role_table_reasons_are_listed_at_their_attestor() {
    let listed = registered();
    let registry = crate::attestors::builtin(&crate::config::Config::default(), [0; 32]);
    for attestor in registry.ids() {
        let reason = registry.get(attestor).unwrap().roles().refusal.unwrap();
        assert!(
            listed.contains(&(attestor, reason)),
            "({attestor}, {reason}) of Attestor::roles"
        );
    }
}

#[test]
fn the_reasons_of_error_enums_are_listed() {
    use bc_wire::tpm::{CertificationError, TpmError};
    use tpm::ek::EkError;
    // Exhaustive: a new variant must be added here, and so to the list.
    fn ek(e: &EkError) {
        match e {
            EkError::Certificate(_) | EkError::Chain(_) | EkError::Roca | EkError::Mismatch(_) => {}
        }
    }
    fn certification(e: &CertificationError) {
        match e {
            CertificationError::Malformed(_)
            | CertificationError::Signature
            | CertificationError::Nonce
            | CertificationError::Name
            | CertificationError::Attributes
            | CertificationError::NotCsr => {}
        }
    }
    let listed = registered();
    let eks = [
        EkError::Certificate(String::new()),
        EkError::Chain(String::new()),
        EkError::Roca,
        EkError::Mismatch(""),
    ];
    for e in &eks {
        ek(e);
        assert!(listed.contains(&("tpm", e.reason())), "{}", e.reason());
    }
    let certifications = [
        CertificationError::Malformed(TpmError::Magic),
        CertificationError::Signature,
        CertificationError::Nonce,
        CertificationError::Name,
        CertificationError::Attributes,
        CertificationError::NotCsr,
    ];
    for e in &certifications {
        certification(e);
        for place in ["tpm", RENEW] {
            assert!(
                listed.contains(&(place, e.reason())),
                "({place}, {})",
                e.reason()
            );
        }
    }
    assert_eq!(NODE_KEY.len(), certifications.len());
}
