//! `provisioned`: an installed system joining with the single-use token its
//! deploy rendered into its user data (spec "provisioned").
//!
//! In the join transaction, in this order (each failure is a refusal with the
//! reason named; the transaction rolls back, so nothing is spent): the
//! join-token checks (`token-missing` … `token-expired`), role `provisioned`
//! (`token-role`; that it is a node join is JoinService's role table's
//! check, with the same reason), uses left (`token-exhausted`), exactly one
//! (`not-single-use`), a product UUID in the claims (`no-product-uuid`), a
//! binding to one machine: the token's expected product UUID, else the
//! product UUID of its target node's newest inventory, or of its newest
//! join when it has no inventory (`unbound` when there is none, or the
//! target is gone), and the claimed UUID equal to it
//! (`product-uuid-mismatch`). Then one use is spent. With a target node the
//! join re-keys that node in place (JoinService reclaims it; a deploy
//! workflow's token turns the ramdisk it joined as back into a node); without one
//! the machine joins as a new node. Either way the UUID is proven, so it
//! becomes the node's trusted hardware key.

use bc_wire::AttestorId;

use crate::attestors::join_token::live_token;
use crate::model::attestor::{AttestInput, AttestationResult, Attestor, NodeKey, Refusal, Verdict};
use crate::model::machine::ProductUuid;
use crate::model::{commands, hardware, records, tokens, workflows};
use crate::store::Tx;

crate::reason::reasons! {
    /// The provisioned attestor's reasons, after [`live_token`]'s.
    pub(crate) enum ProvisionedReason in "provisioned" {
        TokenRole = "token-role",
        TokenExhausted = "token-exhausted",
        NotSingleUse = "not-single-use",
        NoProductUuid = "no-product-uuid",
        Unbound = "unbound",
        ProductUuidMismatch = "product-uuid-mismatch",
    }
}

pub(crate) struct ProvisionedAttestor;

impl Attestor for ProvisionedAttestor {
    fn id(&self) -> AttestorId {
        AttestorId::Provisioned
    }

    fn roles(&self) -> crate::model::attestor::Roles {
        crate::model::attestor::Roles {
            admits: &[bc_wire::agent::Role::Node],
            refusal: Some(ProvisionedReason::TokenRole.any()),
        }
    }

    fn verify(&self, tx: &Tx<'_>, input: &AttestInput<'_>) -> Result<Verdict, Refusal> {
        let (token, row) = live_token(tx, input)?;
        let target = row.target_node_id.as_deref();
        let refuse = |reason: ProvisionedReason| {
            Refusal::new(reason)
                .with_token(Some(&token.id))
                .with_node(target)
        };
        // A node join only: JoinService's role table (`token-role`).
        if row.role != AttestorId::Provisioned.as_str() {
            return Err(refuse(ProvisionedReason::TokenRole));
        }
        if row.uses_left <= 0 {
            return Err(refuse(ProvisionedReason::TokenExhausted));
        }
        if row.uses_left != 1 {
            return Err(refuse(ProvisionedReason::NotSingleUse));
        }
        let claimed = ProductUuid::parse(&input.claims.product_uuid)
            .map_err(|_| refuse(ProvisionedReason::NoProductUuid))?
            .into_string();
        let expected = match (&row.expect.product_uuid, target) {
            (Some(uuid), _) => uuid.clone(),
            (None, Some(node)) => {
                target_uuid(tx, node)?.ok_or_else(|| refuse(ProvisionedReason::Unbound))?
            }
            (None, None) => return Err(refuse(ProvisionedReason::Unbound)),
        };
        if claimed != expected {
            return Err(refuse(ProvisionedReason::ProductUuidMismatch));
        }
        tokens::consume_use(tx, &token.id)?;
        // A workflow's token: the node its ramdisk joined as becomes a node
        // again (docs/workflows.md).
        let change_role = target.is_some() && workflows::of_token(tx, &token.id)?.is_some();
        Ok(Verdict::Admit(Box::new(AttestationResult {
            change_role,
            reclaim_node_id: row.target_node_id,
            token_id: Some(token.id.clone()),
            node_key: NodeKey::Unattested,
            pool_id: row.pool_id,
            expect: row.expect,
            proven_product_uuid: Some(claimed),
            allow_reclaim: row.allow_reclaim,
            ..AttestationResult::default()
        })))
    }
}

/// The product UUID of the live node a token was minted for (spec:
/// provisionedTargetResolver): its newest inventory's, and only when it has
/// no inventory its newest join's claims. `None` when the node is gone, or
/// its newest inventory or (without one) its joins name none.
fn target_uuid(tx: &Tx<'_>, node_id: &str) -> Result<Option<String>, Refusal> {
    let live = records::node_for_update(tx, node_id)?.is_some_and(|n| n.retired_at.is_none());
    if !live {
        return Ok(None);
    }
    if commands::has_inventory(tx, node_id)? {
        return Ok(commands::newest_inventory_uuid(tx, node_id)?);
    }
    Ok(hardware::newest_claimed_product_uuid(tx, node_id)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attestor::OpenedToken;
    use crate::model::machine::Expect;
    use crate::model::tokens::TokenScope;
    use crate::store::{DbError, Store};
    use crate::test_support::temp_db as fixture;
    use bc_wire::agent::{HardwareClaims, Role};
    use bc_wire::token::JoinToken;

    const UUID: &str = "4c4c4544-0042-3510-8052-b4c04f4e4d32";

    fn mint(db: &Store, uses: u32, expect: Option<&str>) -> JoinToken {
        let scope = TokenScope {
            expect: Expect {
                product_uuid: expect.map(str::to_owned),
                mac: None,
            },
            ..TokenScope::default()
        };
        db.write(|tx| {
            tokens::insert_token(tx, AttestorId::Provisioned.as_str(), uses, 60_000, &scope)
        })
        .unwrap()
        .0
    }

    /// The attestor in a transaction committed whatever the outcome, so a
    /// refusal that (wrongly) spent a use would show.
    fn run(db: &Store, token: &JoinToken, uuid: &str) -> String {
        let claims = HardwareClaims {
            product_uuid: uuid.to_owned(),
            ..HardwareClaims::default()
        };
        let opened = OpenedToken::Parsed(token.clone());
        db.write(|tx| {
            let input = AttestInput {
                role: Role::Node,
                evidence: &[],
                token: Some(&opened),
                csr_der: &[],
                csr_sha256: [0; 32],
                csr_spki_der: &[],
                csr_spki_sha256: [0; 32],
                claims: &claims,
                tpm: None,
                now: tx.now().unwrap(),
                source: None,
                prepared: &crate::model::attestor::Prepared::default(),
            };
            let out = match ProvisionedAttestor.verify(tx, &input) {
                Ok(Verdict::Admit(r)) => {
                    assert_eq!(r.proven_product_uuid.as_deref(), Some(UUID));
                    "admitted".to_owned()
                }
                Ok(Verdict::Defer(_)) => "deferred".to_owned(),
                Ok(Verdict::Prepare(_)) => "prepare".to_owned(),
                Err(r) => r.reason.to_string(),
            };
            Ok::<_, DbError>(out)
        })
        .unwrap()
    }

    #[test]
    fn refusals_in_order_then_one_admission() {
        let f = fixture();
        let several = mint(&f.db, 2, Some(UUID));
        assert_eq!(run(&f.db, &several, UUID), ProvisionedReason::NotSingleUse);
        let bound = mint(&f.db, 1, Some(UUID));
        assert_eq!(run(&f.db, &bound, ""), ProvisionedReason::NoProductUuid);
        assert_eq!(
            run(&f.db, &bound, "not-a-uuid"),
            ProvisionedReason::NoProductUuid
        );
        assert_eq!(
            run(&f.db, &bound, "4c4c4544-0042-3510-8052-b4c04f4e4d33"),
            ProvisionedReason::ProductUuidMismatch
        );
        assert_eq!(
            run(&f.db, &mint(&f.db, 1, None), UUID),
            ProvisionedReason::Unbound
        );
        // Claims compare case-insensitively; the one use is then spent.
        assert_eq!(run(&f.db, &bound, &UUID.to_uppercase()), "admitted");
        assert_eq!(run(&f.db, &bound, UUID), ProvisionedReason::TokenExhausted);
    }
}
