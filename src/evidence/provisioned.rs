//! `provisioned` evidence: the single-use token the deploy rendered into
//! this machine's user data, sealed exactly as for `join-token`
//! ([`super::join_token::seal`]), and no attestation of its own. What binds
//! the token to this machine is the product UUID in the join's claims
//! (`/sys/class/dmi/id/product_uuid`), which the control plane compares with
//! the machine the token was minted for.

use bc_wire::agent::HardwareClaims;

/// Why the control plane will refuse this machine before it asks, if it
/// can tell: a provisioned join without a product UUID is always refused.
/// The join is still sent, so the refusal is recorded where the operator
/// looks (the control plane's events).
pub(crate) fn claims_problem(claims: &HardwareClaims) -> Option<&'static str> {
    claims.product_uuid.is_empty().then_some(
        "this machine shows no product UUID (/sys/class/dmi/id/product_uuid): a provisioned token binds to it, so the join will be refused",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_a_product_uuid_is_flagged() {
        assert!(claims_problem(&HardwareClaims::default()).is_some());
        let claims = HardwareClaims {
            product_uuid: "4c4c4544-0042-3510-8052-b4c04f4e4d32".into(),
            ..HardwareClaims::default()
        };
        assert_eq!(claims_problem(&claims), None);
    }
}
