//! The registry of command kinds: what each is, which roles may run it, the
//! arguments it takes and how long it may run.
//!
//! Both sides read this one table: the control plane refuses to queue a kind
//! the node's role or certificate does not allow, and the agent refuses it
//! again from its own certificate ([`super::scope::Scope::allows`]). A kind
//! missing here is unknown to both, so adding one is a wire change.

use crate::agent::Role;

use super::args::ArgSpec;
use super::args::Check::{Device, Devices, Digest, Name, OneOf, Text, UnixMs, Within};
use super::caps::MAX_OUTPUT;

/// One kind of command.
#[derive(Debug, PartialEq, Eq)]
pub struct KindSpec {
    /// `family.action`, lowercase.
    pub name: &'static str,
    /// The roles whose certificates may run it.
    pub roles: &'static [Role],
    /// Its arguments; any other name is refused (`bad-args`).
    pub args: &'static [ArgSpec],
    /// How long the agent lets one run before it gives up and reports it
    /// `failed` (milliseconds).
    pub deadline_ms: i64,
}

impl KindSpec {
    /// Whether a certificate of `role` may run this kind at all (before any
    /// allowed-kinds list narrows it).
    pub fn runs_as(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }
}

const EVERY_ROLE: &[Role] = &[Role::Node, Role::Site, Role::Ramdisk];
/// Kinds that change the machine's disks or what it boots: only the
/// commissioning ramdisk runs them, never an installed system.
const RAMDISK: &[Role] = &[Role::Ramdisk];

const MINUTE: i64 = 60_000;

/// Every registered kind, sorted by name.
pub const KINDS: &[KindSpec] = &[
    KindSpec {
        name: "boot.kexec",
        roles: RAMDISK,
        args: &[
            // The deployed kernel's command line; by default `root=UUID=`
            // of the filesystem holding /boot, `rw`, and the ramdisk's own
            // `console=` entries.
            ArgSpec::optional("cmdline", Text(1024)),
            ArgSpec::required("disk", Device),
            // Where kexec cannot (firmware, no kernel found), reboot with the
            // boot entry closed so the next PXE boot falls through to disk.
            ArgSpec::optional("mode", OneOf(&["kexec", "reboot"])),
        ],
        deadline_ms: 5 * MINUTE,
    },
    KindSpec {
        name: "deploy.image",
        roles: RAMDISK,
        args: &[
            // The raw (decompressed) image's size: the agent writes no more.
            ArgSpec::required("bytes", Within(1, 1 << 50)),
            ArgSpec::optional("compression", OneOf(&["none", "zstd"])),
            ArgSpec::required("disk", Device),
            ArgSpec::required("image", Name),
            // The SHA-256 of the seed document (GET /v1/deploy/seed); absent:
            // no NoCloud seed is written.
            ArgSpec::optional("seed", Digest),
            // The raw image's digest is pinned in the signed command, so a
            // tampered download fails the step.
            ArgSpec::required("sha256", Digest),
        ],
        deadline_ms: 120 * MINUTE,
    },
    KindSpec {
        name: "diag.doctor",
        roles: EVERY_ROLE,
        args: &[],
        deadline_ms: MINUTE,
    },
    KindSpec {
        name: "diag.ping",
        roles: EVERY_ROLE,
        args: &[ArgSpec::optional("echo", Text(256))],
        deadline_ms: MINUTE / 6,
    },
    KindSpec {
        name: "disk.wipe",
        roles: RAMDISK,
        args: &[ArgSpec::required("devices", Devices)],
        deadline_ms: 30 * MINUTE,
    },
    KindSpec {
        name: "inventory.refresh",
        roles: EVERY_ROLE,
        args: &[],
        deadline_ms: MINUTE,
    },
    KindSpec {
        name: "logs.collect",
        roles: EVERY_ROLE,
        args: &[
            ArgSpec::optional("bytes", Within(1, MAX_OUTPUT as u64)),
            ArgSpec::optional("lines", Within(1, 100_000)),
            ArgSpec::optional("since", UnixMs),
        ],
        deadline_ms: 2 * MINUTE,
    },
];

/// The kinds a ramdisk certificate allows unless the operator narrows them
/// (the spec's `discoveryAllowedKinds`): exactly the registered kinds whose
/// roles include `ramdisk`, `diag.*` and `deploy.*` as prefix patterns (a
/// test checks the two agree).
pub const DISCOVERY_ALLOWED_KINDS: &[&str] = &[
    "inventory.refresh",
    "logs.collect",
    "diag.*",
    "disk.wipe",
    "deploy.*",
    "boot.kexec",
];

/// The registered kind named `name`.
pub fn lookup(name: &str) -> Option<&'static KindSpec> {
    KINDS.iter().find(|k| k.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::scope::KindPattern;

    #[test]
    fn kinds_are_sorted_unique_and_well_formed() {
        for w in KINDS.windows(2) {
            assert!(w[0].name < w[1].name, "{} before {}", w[0].name, w[1].name);
        }
        for k in KINDS {
            assert!(KindPattern::parse(k.name).is_ok(), "{}", k.name);
            assert!(!k.roles.is_empty() && k.deadline_ms > 0, "{}", k.name);
            for w in k.args.windows(2) {
                assert!(w[0].name < w[1].name, "{}: args sorted", k.name);
            }
        }
        assert!(lookup("disk.wipe").is_some());
        assert!(lookup("disk.*").is_none());
    }

    /// The spec: discoveryAllowedKinds is exactly the registered kinds whose
    /// roles include ramdisk.
    #[test]
    fn discovery_default_is_exactly_the_ramdisk_kinds() {
        let patterns: Vec<KindPattern> = DISCOVERY_ALLOWED_KINDS
            .iter()
            .map(|p| KindPattern::parse(p).unwrap())
            .collect();
        for k in KINDS {
            let listed = patterns.iter().any(|p| p.matches(k.name));
            assert_eq!(listed, k.runs_as(Role::Ramdisk), "{}", k.name);
        }
        for p in &patterns {
            assert!(
                KINDS.iter().any(|k| p.matches(k.name)),
                "{p:?} matches none"
            );
        }
    }

    #[test]
    fn destructive_kinds_are_the_ramdisks_alone() {
        for name in ["disk.wipe", "deploy.image", "boot.kexec"] {
            let k = lookup(name).unwrap();
            assert_eq!(k.roles, [Role::Ramdisk], "{name}");
        }
    }
}
