//! `join-token`: someone with access to the control plane minted a token for
//! this machine.
//!
//! In the join transaction, in this order (each failure is a refusal with the
//! reason named, and writes nothing but the refusal event):
//! `token-missing`, `token-malformed`, `token-unknown` (row selected under the
//! transaction's write lock), `token-secret` (SHA-256 compared in constant
//! time), `token-revoked`, `token-expired` (at the database's time),
//! `token-exhausted`, `token-role` (a token of another kind); then one use is
//! consumed, and the result holds the request to the token's role
//! (JoinService's role check: `token-role`, the use rolled back). The token's
//! expect binding travels in the result: JoinService enforces it (and rolls
//! the use back when the claims do not match).

use bc_wire::agent::Role;
use bc_wire::token::JoinToken;
use bc_wire::AttestorId;
use subtle::ConstantTimeEq;

use crate::model::attestor::{
    AttestInput, AttestationResult, Attestor, NodeKey, OpenedToken, Refusal, Verdict,
};
use crate::model::tokens;
use crate::store::Tx;

crate::reason::reasons! {
    /// The join-token attestor's reasons; `token-missing` … `token-expired` are
    /// also those of every attestor that runs [`live_token`] (listed once, here).
    pub(crate) enum TokenReason in "join-token" {
        Missing = "token-missing",
        Malformed = "token-malformed",
        Unknown = "token-unknown",
        Secret = "token-secret",
        Revoked = "token-revoked",
        Expired = "token-expired",
        Exhausted = "token-exhausted",
        Role = "token-role",
    }
}

/// Roles a join token can admit: a node token admits a node, a site token a site.
const TOKEN_ROLES: &[&str] = &["node", "site"];

pub(crate) struct JoinTokenAttestor;

/// The checks every token-based attestor starts with: a token that opened,
/// parses, exists (row locked by the transaction), whose secret matches
/// (constant time), not revoked, not expired at the database's time.
pub(crate) fn live_token<'t>(
    tx: &Tx<'_>,
    input: &AttestInput<'t>,
) -> Result<(&'t JoinToken, tokens::TokenRow), Refusal> {
    let token = match input.token {
        None => return Err(Refusal::new(TokenReason::Missing)),
        Some(OpenedToken::Malformed) => return Err(Refusal::new(TokenReason::Malformed)),
        Some(OpenedToken::Parsed(t)) => t,
    };
    let refuse = |reason: TokenReason| Refusal::new(reason).with_token(Some(&token.id));
    let row =
        tokens::token_for_update(tx, &token.id)?.ok_or_else(|| refuse(TokenReason::Unknown))?;
    let presented = tokens::secret_sha256(&token.secret);
    if !bool::from(presented.ct_eq(&row.secret_sha256)) {
        return Err(refuse(TokenReason::Secret));
    }
    if row.revoked_at.is_some() {
        return Err(refuse(TokenReason::Revoked));
    }
    if input.now >= row.expires_at {
        return Err(refuse(TokenReason::Expired));
    }
    Ok((token, row))
}

/// Whether [`live_token`] refused the token as revoked (a caller that read
/// something before taking the token's lock may have to read it again).
pub(crate) fn is_revoked(refusal: &Refusal) -> bool {
    refusal.reason == TokenReason::Revoked.any()
}

impl Attestor for JoinTokenAttestor {
    fn id(&self) -> AttestorId {
        AttestorId::JoinToken
    }

    fn roles(&self) -> crate::model::attestor::Roles {
        crate::model::attestor::Roles {
            admits: &[Role::Node, Role::Site],
            refusal: Some(TokenReason::Role.any()),
        }
    }

    fn verify(&self, tx: &Tx<'_>, input: &AttestInput<'_>) -> Result<Verdict, Refusal> {
        let (token, row) = live_token(tx, input)?;
        let refuse = |reason: TokenReason| Refusal::new(reason).with_token(Some(&token.id));
        if row.uses_left <= 0 {
            return Err(refuse(TokenReason::Exhausted));
        }
        // A token of another kind (provisioned, discovery) is for its own
        // attestor; JoinService holds the request to the token's role.
        let role = TOKEN_ROLES
            .contains(&row.role.as_str())
            .then(|| Role::from_name(&row.role))
            .flatten()
            .ok_or_else(|| refuse(TokenReason::Role))?;
        tokens::consume_use(tx, &token.id)?;
        Ok(Verdict::Admit(Box::new(AttestationResult {
            token_id: Some(token.id.clone()),
            node_key: NodeKey::Unattested,
            pool_id: row.pool_id,
            // JoinService enforces both (for every token-based attestor).
            expect: row.expect,
            allow_reclaim: row.allow_reclaim,
            roles: Some(vec![role]),
            // A site token makes a site node of its site.
            scope: row.site_id.map(|site_id| {
                Box::new(crate::model::records::NodeScope {
                    site_id: Some(site_id),
                    ..Default::default()
                })
            }),
            ..AttestationResult::default()
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Commit, DbError, Store};
    use bc_wire::agent::{HardwareClaims, Role};
    use bc_wire::token::JoinToken;

    use crate::test_support::temp_db as fixture;

    /// Runs the attestor in a transaction that is committed whatever the
    /// outcome, so a test sees anything a refusal would (wrongly) write,
    /// with JoinService's role check around it (whose refusal rolls back).
    fn run(db: &Store, role: Role, token: Option<OpenedToken>) -> Result<Verdict, Refusal> {
        db.write_if(|tx| {
            let run = || -> Result<Result<Verdict, Refusal>, Refusal> {
                let now = tx.now().unwrap();
                let claims = HardwareClaims::default();
                let input = AttestInput {
                    role,
                    evidence: &[],
                    token: token.as_ref(),
                    csr_der: &[],
                    csr_sha256: [0; 32],
                    csr_spki_der: &[],
                    csr_spki_sha256: [0; 32],
                    claims: &claims,
                    tpm: None,
                    now,
                    source: None,
                    prepared: &crate::model::attestor::Prepared::default(),
                };
                crate::plane::join::check_role(&JoinTokenAttestor, role, None)?;
                let out = JoinTokenAttestor.verify(tx, &input);
                if let Ok(Verdict::Admit(result)) = &out {
                    crate::plane::join::check_role(&JoinTokenAttestor, role, Some(result))?;
                }
                Ok(out)
            };
            Ok::<_, DbError>(match run() {
                Ok(out) => (out, Commit::Yes),
                Err(r) => (Err(r), Commit::No),
            })
        })
        .unwrap()
    }

    fn reason(r: Result<Verdict, Refusal>) -> String {
        match r {
            Ok(_) => "admitted".into(),
            Err(r) => r.reason.to_string(),
        }
    }

    fn uses_left(db: &Store, id: &str) -> i64 {
        tokens::list_tokens(db)
            .unwrap()
            .into_iter()
            .find(|t| t.id == id)
            .unwrap()
            .uses_left
    }

    #[test]
    fn admits_once_then_exhausted() {
        let f = fixture();
        let (tok, _) = tokens::create_token(&f.db, Role::Node, 1, 60_000).unwrap();
        let r = run(&f.db, Role::Node, Some(OpenedToken::Parsed(tok.clone())));
        match r {
            Ok(Verdict::Admit(a)) => assert_eq!(a.token_id.as_deref(), Some(tok.id.as_str())),
            _ => panic!("not admitted"),
        }
        assert_eq!(uses_left(&f.db, &tok.id), 0);
        let r = run(&f.db, Role::Node, Some(OpenedToken::Parsed(tok.clone())));
        let Err(refusal) = r else {
            panic!("admitted twice")
        };
        assert_eq!(refusal.reason, TokenReason::Exhausted);
        assert_eq!(refusal.token_id.as_deref(), Some(tok.id.as_str()));
    }

    #[test]
    fn refusals_in_order_and_spend_nothing() {
        let f = fixture();
        let (tok, _) = tokens::create_token(&f.db, Role::Node, 2, 60_000).unwrap();
        assert_eq!(reason(run(&f.db, Role::Node, None)), TokenReason::Missing);
        assert_eq!(
            reason(run(&f.db, Role::Node, Some(OpenedToken::Malformed))),
            TokenReason::Malformed
        );
        let unknown = JoinToken {
            id: "tok_nosuchtoken".into(),
            secret: tok.secret,
        };
        assert_eq!(
            reason(run(&f.db, Role::Node, Some(OpenedToken::Parsed(unknown)))),
            TokenReason::Unknown
        );
        let mut wrong = tok.clone();
        wrong.secret[0] ^= 1;
        assert_eq!(
            reason(run(&f.db, Role::Node, Some(OpenedToken::Parsed(wrong)))),
            TokenReason::Secret
        );
        assert_eq!(
            reason(run(
                &f.db,
                Role::Site,
                Some(OpenedToken::Parsed(tok.clone()))
            )),
            TokenReason::Role
        );
        assert_eq!(
            reason(run(
                &f.db,
                Role::Ramdisk,
                Some(OpenedToken::Parsed(tok.clone()))
            )),
            TokenReason::Role
        );
        assert_eq!(uses_left(&f.db, &tok.id), 2);

        // Expiry is checked at the database's time.
        f.db.write(|tx| crate::store::set_clock_offset_ms(tx, 61_000))
            .unwrap();
        assert_eq!(
            reason(run(
                &f.db,
                Role::Node,
                Some(OpenedToken::Parsed(tok.clone()))
            )),
            TokenReason::Expired
        );
        f.db.write(|tx| crate::store::set_clock_offset_ms(tx, 0))
            .unwrap();

        assert_eq!(
            tokens::revoke_token(&f.db, &tok.id).unwrap(),
            tokens::RevokeOutcome::Revoked
        );
        assert_eq!(
            reason(run(
                &f.db,
                Role::Node,
                Some(OpenedToken::Parsed(tok.clone()))
            )),
            TokenReason::Revoked
        );
        assert_eq!(uses_left(&f.db, &tok.id), 2);
    }

    #[test]
    fn site_token_admits_site() {
        let f = fixture();
        let (tok, _) = tokens::create_token(&f.db, Role::Site, 1, 60_000).unwrap();
        assert_eq!(
            reason(run(
                &f.db,
                Role::Node,
                Some(OpenedToken::Parsed(tok.clone()))
            )),
            TokenReason::Role
        );
        assert_eq!(
            reason(run(&f.db, Role::Site, Some(OpenedToken::Parsed(tok)))),
            "admitted"
        );
    }
}
