//! What a certificate lets its node run: the scope statement.
//!
//! A node certificate carries its role and, when the operator narrowed it
//! (a ramdisk's `discoveryAllowedKinds`), the kinds it may run, as one
//! `urn:bc:` statement after the SPIFFE ID:
//!
//! ```text
//! urn:bc:scope:<role>                      every kind of the role
//! urn:bc:scope:<role>:<pattern>,<pattern>  only those, within the role's
//! ```
//!
//! A pattern is a kind (`disk.wipe`) or a family (`diag.*`). The agent reads
//! its scope from its own certificate, so it needs nothing from the server
//! to refuse a kind outside it, and the control plane reads the same
//! statement from the certificate the channel presents. A certificate
//! without the statement (issued before the channel) runs nothing: the
//! next renewal brings one.

use crate::agent::Role;

use super::args::printable;
use super::kinds::KindSpec;

/// The statement's prefix.
pub const SCOPE_PREFIX: &str = "urn:bc:scope:";
/// The lessee statement's prefix: a leased node's certificate names the
/// tenant it is lent to (`urn:bc:tenant:<id>`), beside a scope narrowed to
/// what a lessee's node runs.
pub const TENANT_PREFIX: &str = "urn:bc:tenant:";

/// The lessee a certificate names, if it names one (the first such
/// statement; the control plane writes at most one).
pub fn lessee<S: AsRef<str>>(statements: &[S]) -> Option<&str> {
    statements
        .iter()
        .find_map(|s| s.as_ref().strip_prefix(TENANT_PREFIX))
}
/// The most patterns one statement lists (the control plane's config
/// takes no more).
pub const MAX_PATTERNS: usize = 64;
/// The longest pattern.
pub const MAX_PATTERN: usize = 64;

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScopeError {
    #[error("the certificate has no {SCOPE_PREFIX} statement (issued before the command channel: it runs no command until renewed)")]
    Missing,
    #[error("the certificate has more than one {SCOPE_PREFIX} statement")]
    Repeated,
    #[error("the scope statement names no role that runs commands: {0:?}")]
    Role(String),
    #[error("the scope statement lists {0} kinds, at most {MAX_PATTERNS}")]
    TooMany(usize),
    #[error("the scope statement lists an empty kind list")]
    Empty,
    #[error("{0:?} is not a kind or a family pattern (a.b or a.*)")]
    Pattern(String),
}

/// A kind (`disk.wipe`) or a family of kinds (`diag.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KindPattern(String);

impl KindPattern {
    /// Parses a pattern: dot-separated segments of `[a-z0-9_-]`, at least
    /// two, the last of which may be `*` (and nothing else may be).
    pub fn parse(s: &str) -> Result<Self, ScopeError> {
        let segments: Vec<&str> = s.split('.').collect();
        let (last, head) = segments.split_last().unwrap_or((&"", &[]));
        let word = |w: &str| {
            !w.is_empty()
                && w.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-')
                })
        };
        let ok = s.len() <= MAX_PATTERN
            && !head.is_empty()
            && head.iter().all(|w| word(w))
            && (*last == "*" || word(last));
        if ok {
            Ok(KindPattern(s.to_owned()))
        } else {
            Err(ScopeError::Pattern(printable(s)))
        }
    }

    /// Whether `kind` is this kind or of this family.
    pub fn matches(&self, kind: &str) -> bool {
        match self.0.strip_suffix('*') {
            // "diag.*" matches "diag.ping", not "diag." or "diagnose.x".
            Some(prefix) => kind.len() > prefix.len() && kind.starts_with(prefix),
            None => self.0 == kind,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A certificate's role and, when narrowed, its kinds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    pub role: Role,
    /// `None`: every kind the role runs.
    pub kinds: Option<Vec<KindPattern>>,
}

impl Scope {
    /// The scope of a certificate from its `urn:bc:` statements (the URI
    /// SANs after the SPIFFE ID): exactly one scope statement.
    pub fn from_statements<S: AsRef<str>>(statements: &[S]) -> Result<Scope, ScopeError> {
        let mut found = statements
            .iter()
            .filter_map(|s| s.as_ref().strip_prefix(SCOPE_PREFIX));
        let body = found.next().ok_or(ScopeError::Missing)?;
        if found.next().is_some() {
            return Err(ScopeError::Repeated);
        }
        Self::parse_body(body)
    }

    fn parse_body(body: &str) -> Result<Scope, ScopeError> {
        let (role, kinds) = match body.split_once(':') {
            Some((role, kinds)) => (role, Some(kinds)),
            None => (body, None),
        };
        let role = match Role::from_name(role) {
            Some(r) => r,
            None => return Err(ScopeError::Role(printable(role))),
        };
        let kinds = match kinds {
            None => None,
            Some("") => return Err(ScopeError::Empty),
            Some(list) => {
                let n = list.split(',').count();
                if n > MAX_PATTERNS {
                    return Err(ScopeError::TooMany(n));
                }
                Some(
                    list.split(',')
                        .map(KindPattern::parse)
                        .collect::<Result<Vec<_>, _>>()?,
                )
            }
        };
        Ok(Scope { role, kinds })
    }

    /// The statement that names this scope (what the control plane puts in
    /// a certificate).
    pub fn statement(&self) -> String {
        match &self.kinds {
            None => format!("{SCOPE_PREFIX}{}", self.role.name()),
            Some(k) => format!(
                "{SCOPE_PREFIX}{}:{}",
                self.role.name(),
                k.iter()
                    .map(KindPattern::as_str)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }

    /// Whether a node of this scope may run `kind`: its role must be one of
    /// the kind's, and the kind within the listed patterns when there are
    /// any. A list can narrow a role, never widen it.
    pub fn allows(&self, kind: &KindSpec) -> bool {
        kind.runs_as(self.role)
            && self
                .kinds
                .as_ref()
                .is_none_or(|k| k.iter().any(|p| p.matches(kind.name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::kinds::{lookup, DISCOVERY_ALLOWED_KINDS};

    fn ramdisk_default() -> Scope {
        Scope {
            role: Role::Ramdisk,
            kinds: Some(
                DISCOVERY_ALLOWED_KINDS
                    .iter()
                    .map(|p| KindPattern::parse(p).unwrap())
                    .collect(),
            ),
        }
    }

    #[test]
    fn the_statement_round_trips_and_is_pinned() {
        let s = ramdisk_default();
        let text = s.statement();
        assert_eq!(
            text,
            "urn:bc:scope:ramdisk:inventory.refresh,logs.collect,diag.*,disk.wipe,deploy.*,boot.kexec"
        );
        let back = Scope::from_statements(&["urn:bc:tpm-ak:sha256:00", text.as_str()]).unwrap();
        assert_eq!(back, s);
        let node = Scope::from_statements(&["urn:bc:scope:node"]).unwrap();
        assert_eq!((node.role, node.kinds.is_none()), (Role::Node, true));
        assert_eq!(node.statement(), "urn:bc:scope:node");
        // A lessee's node: narrowed, and the tenant named beside it.
        let leased = [
            "urn:bc:tpm-ak:sha256:00",
            "urn:bc:scope:node:diag.*,inventory.refresh",
            "urn:bc:tenant:acme",
        ];
        let scope = Scope::from_statements(&leased).unwrap();
        assert_eq!(scope.statement(), leased[1]);
        assert_eq!(lessee(&leased), Some("acme"));
        assert_eq!(lessee(&leased[..2]), None);
    }

    #[test]
    fn bad_statements_are_refused() {
        let none: [&str; 0] = [];
        assert_eq!(Scope::from_statements(&none), Err(ScopeError::Missing));
        assert_eq!(
            Scope::from_statements(&["urn:bc:tpm-ak:sha256:00"]),
            Err(ScopeError::Missing)
        );
        assert_eq!(
            Scope::from_statements(&["urn:bc:scope:node", "urn:bc:scope:ramdisk"]),
            Err(ScopeError::Repeated)
        );
        for (text, want) in [
            ("urn:bc:scope:admin", ScopeError::Role("admin".into())),
            (
                "urn:bc:scope:unspecified",
                ScopeError::Role("unspecified".into()),
            ),
            ("urn:bc:scope:", ScopeError::Role(String::new())),
            ("urn:bc:scope:ramdisk:", ScopeError::Empty),
            ("urn:bc:scope:ramdisk:*", ScopeError::Pattern("*".into())),
            (
                "urn:bc:scope:ramdisk:diag",
                ScopeError::Pattern("diag".into()),
            ),
            (
                "urn:bc:scope:ramdisk:di*.x",
                ScopeError::Pattern("di*.x".into()),
            ),
            (
                "urn:bc:scope:ramdisk:a.b,,c.d",
                ScopeError::Pattern(String::new()),
            ),
            (
                "urn:bc:scope:ramdisk:Disk.wipe",
                ScopeError::Pattern("Disk.wipe".into()),
            ),
        ] {
            assert_eq!(Scope::from_statements(&[text]), Err(want), "{text}");
        }
        let many = vec!["a.b"; MAX_PATTERNS + 1].join(",");
        assert_eq!(
            Scope::from_statements(&[format!("urn:bc:scope:ramdisk:{many}")]),
            Err(ScopeError::TooMany(MAX_PATTERNS + 1))
        );
    }

    #[test]
    fn a_scope_allows_its_roles_kinds_within_its_list() {
        let k = |n| lookup(n).unwrap();
        let ramdisk = ramdisk_default();
        for n in [
            "disk.wipe",
            "diag.ping",
            "deploy.image",
            "inventory.refresh",
        ] {
            assert!(ramdisk.allows(k(n)), "{n}");
        }
        let node = Scope::from_statements(&["urn:bc:scope:node"]).unwrap();
        assert!(node.allows(k("inventory.refresh")));
        assert!(!node.allows(k("disk.wipe")), "a node never wipes");
        // A list narrows; it cannot widen a role.
        let narrowed = Scope::from_statements(&["urn:bc:scope:ramdisk:diag.*"]).unwrap();
        assert!(narrowed.allows(k("diag.doctor")));
        assert!(!narrowed.allows(k("disk.wipe")));
        let widened = Scope::from_statements(&["urn:bc:scope:node:disk.wipe"]).unwrap();
        assert!(!widened.allows(k("disk.wipe")));
        let p = KindPattern::parse("diag.*").unwrap();
        assert!(p.matches("diag.ping") && !p.matches("diag.") && !p.matches("diagnose.x"));
    }
}
