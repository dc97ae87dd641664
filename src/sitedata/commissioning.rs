//! What admits a machine's commissioning at this site, as the control plane
//! said it in its last lease answer (`LeaseResponse.commissioning`, over the
//! site node's mTLS connection): `bcd site` keeps it in `site.json`, `bcd
//! doctor` names it. One of three policies, strongest first:
//!
//! 1. **EK-bound entries**: every open boot entry names its machine's EK
//!    (`boot add --ek-sha256`, `--node`), so only that TPM joins;
//! 2. **operator approval** (`[discovery] approval = "unknown-machines"`):
//!    a join of an entry that names no EK waits for `requests approve`;
//! 3. **trusted boot LAN** (the spec's default): the first machine that
//!    brings an entry's script joins as its machine.

use bc_wire::site_v1::commissioning_policy::Unbound;
use bc_wire::site_v1::CommissioningPolicy;
use serde::{Deserialize, Serialize};

/// The control plane's word, as `site.json` keeps it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Commissioning {
    /// What admits an entry that names no EK: `trusted-lan` or
    /// `operator-approval`.
    pub unbound: String,
    pub open_entries: u32,
    pub ek_bound_entries: u32,
}

const TRUSTED_LAN: &str = "trusted-lan";
const OPERATOR_APPROVAL: &str = "operator-approval";

/// The policy the site runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    EkBound,
    OperatorApproval,
    TrustedLan,
}

impl Commissioning {
    /// From a lease answer; `None` when the control plane said nothing (one
    /// from before) or something this bcd does not know.
    pub(crate) fn from_wire(p: Option<&CommissioningPolicy>) -> Option<Commissioning> {
        let p = p?;
        let unbound = match Unbound::try_from(p.unbound).ok()? {
            Unbound::TrustedLan => TRUSTED_LAN,
            Unbound::OperatorApproval => OPERATOR_APPROVAL,
            Unbound::Unspecified => return None,
        };
        Some(Commissioning {
            unbound: unbound.to_owned(),
            open_entries: p.open_entries,
            ek_bound_entries: p.ek_bound_entries.min(p.open_entries),
        })
    }

    pub(crate) fn policy(&self) -> Option<Policy> {
        if self.open_entries > 0 && self.ek_bound_entries == self.open_entries {
            return Some(Policy::EkBound);
        }
        match self.unbound.as_str() {
            TRUSTED_LAN => Some(Policy::TrustedLan),
            OPERATOR_APPROVAL => Some(Policy::OperatorApproval),
            _ => None,
        }
    }

    /// One line: the policy and what it means for a neighbour on the boot
    /// LAN.
    pub(crate) fn line(&self) -> String {
        let unbound = self.open_entries - self.ek_bound_entries.min(self.open_entries);
        let of = format!(
            "{unbound} of {} open boot entries name no EK",
            self.open_entries
        );
        match self.policy() {
            Some(Policy::EkBound) => format!(
                "EK-bound entries: each of the site's {} open boot entries admits only its machine's TPM (boot add --ek-sha256 / --node); a neighbour on the boot LAN cannot commission as one",
                self.open_entries
            ),
            Some(Policy::OperatorApproval) => format!(
                "operator approval ([discovery] approval = \"unknown-machines\"): a join of a boot entry that names no EK ({of}) waits until an operator runs `bc-controlplane requests approve`; a neighbour on the boot LAN can file requests, not commission"
            ),
            Some(Policy::TrustedLan) => format!(
                "trusted boot LAN (the control plane's [discovery] approval is unset): any host on the boot LAN that fetches a boot entry's script can commission as its machine ({of})"
            ),
            None => format!("unknown ({:?}, from a newer control plane)", self.unbound),
        }
    }
}

/// What to do when the site runs on a trusted boot LAN.
pub(crate) const HARDEN: &str = "to harden: bind each boot entry to its machine's TPM (boot add --ek-sha256 H, or --node N), or set [discovery] approval = \"unknown-machines\" in the control plane's controlplane.toml";

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(unbound: Unbound, open: u32, bound: u32) -> CommissioningPolicy {
        CommissioningPolicy {
            unbound: unbound as i32,
            open_entries: open,
            ek_bound_entries: bound,
        }
    }

    #[test]
    fn the_strongest_policy_that_holds_for_every_open_entry() {
        let p = |u, o, b| Commissioning::from_wire(Some(&wire(u, o, b))).and_then(|c| c.policy());
        assert_eq!(p(Unbound::TrustedLan, 0, 0), Some(Policy::TrustedLan));
        assert_eq!(p(Unbound::TrustedLan, 3, 2), Some(Policy::TrustedLan));
        assert_eq!(p(Unbound::TrustedLan, 3, 3), Some(Policy::EkBound));
        assert_eq!(
            p(Unbound::OperatorApproval, 0, 0),
            Some(Policy::OperatorApproval)
        );
        assert_eq!(p(Unbound::OperatorApproval, 2, 2), Some(Policy::EkBound));
        // A control plane from before says nothing; a bound count over the
        // open one is capped.
        assert_eq!(Commissioning::from_wire(None), None);
        assert_eq!(p(Unbound::Unspecified, 1, 1), None);
        let c = Commissioning::from_wire(Some(&wire(Unbound::TrustedLan, 1, 5))).unwrap();
        assert_eq!(c.ek_bound_entries, 1);
        assert!(
            Commissioning::from_wire(Some(&wire(Unbound::TrustedLan, 4, 1)))
                .unwrap()
                .line()
                .contains("(3 of 4 open boot entries name no EK)")
        );
    }
}
