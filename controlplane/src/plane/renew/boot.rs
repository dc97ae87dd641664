//! `Renew` under a pool's boot policy: the node proves what it booted at
//! every renewal, as it did at its join, with a quote under its AK taken
//! beside the TPM2_Certify of its next key.
//!
//! The request that carries no evidence (every renewal's first: the node
//! does not know its pool's policy, which the operator may set or change at
//! any time) is answered with a [`RenewBootChallenge`]: the PCRs the policy
//! needs now and a nonce. The node sends the same CSR again with the event
//! log and a quote whose extraData is `sha256(nonce ‖ sha256(csr))`. The
//! nonce is stateless, as the join's challenge state is (any replica checks
//! it): an HMAC under a key derived from `challenge.key`, over the node id,
//! the CSR's SHA-256 and the deadline, so a quote answers this node's
//! renewal of this key, within [`CHALLENGE_TTL_MS`], and no other. The
//! evidence is then judged by the join's own flow
//! ([`crate::attestors::tpm::boot`]).

use aes_gcm::aead::KeyInit;
use bc_eventlog::{BootFacts, PcrValues};
use bc_wire::agent::{RenewBootChallenge, RenewBootEvidence};
use bc_wire::tpm::Public;
use hmac::Mac;
use subtle::ConstantTimeEq;

use crate::attestors::tpm::boot::{self, BootCheck, BootFailure};
use crate::attestors::tpm::pcr;
use crate::model::boot_policy::{self, BootPolicy};
use crate::store::UnixMs;

/// How long a boot challenge may be answered: a quote and a certification
/// take well under a second, a helper's a few.
pub(crate) const CHALLENGE_TTL_MS: i64 = 5 * 60 * 1000;

/// The key boot-challenge nonces are MACed under.
pub(crate) struct RenewBootKey([u8; 32]);

impl RenewBootKey {
    /// HMAC-SHA256(challenge key, label): a key of its own for this use.
    pub(crate) fn derive(challenge_key: &[u8]) -> RenewBootKey {
        let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(challenge_key) else {
            // HMAC takes a key of any length.
            return RenewBootKey([0; 32]);
        };
        mac.update(b"bc renew boot-challenge key v1");
        RenewBootKey(mac.finalize().into_bytes().into())
    }

    fn nonce(&self, node_id: &str, csr_sha256: &[u8], not_after: UnixMs) -> [u8; 32] {
        let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0) else {
            return [0; 32];
        };
        let id = node_id.as_bytes();
        mac.update(&(id.len() as u64).to_be_bytes());
        mac.update(id);
        mac.update(csr_sha256);
        mac.update(&not_after.to_be_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The challenge a renewal of `node_id` for the CSR `csr_sha256` under
    /// `policy` is answered with at `now`.
    pub(crate) fn challenge(
        &self,
        policy: &BootPolicy,
        node_id: &str,
        csr_sha256: &[u8],
        now: UnixMs,
    ) -> RenewBootChallenge {
        let not_after = now.saturating_add(CHALLENGE_TTL_MS);
        RenewBootChallenge {
            pcrs: boot_policy::needed_pcrs(policy),
            nonce: self.nonce(node_id, csr_sha256, not_after).to_vec(),
            not_after_unix_ms: not_after,
        }
    }

    /// Whether `ev` answers a challenge of ours for this node and CSR that
    /// is still open at `now` (else the node is challenged again).
    pub(crate) fn is_current(
        &self,
        ev: &RenewBootEvidence,
        node_id: &str,
        csr_sha256: &[u8],
        now: UnixMs,
    ) -> bool {
        let want = self.nonce(node_id, csr_sha256, ev.not_after_unix_ms);
        bool::from(ev.nonce.as_slice().ct_eq(&want))
            && now <= ev.not_after_unix_ms
            && ev.not_after_unix_ms <= now.saturating_add(CHALLENGE_TTL_MS)
    }
}

/// The boot `ev` proves under `ak` (the leaf's, already checked), judged by
/// `policy`: the quote over `sha256(nonce ‖ csr_sha256)`, its values in
/// every bank, then the join's [`boot::judge`].
pub(crate) fn verify(
    policy: &BootPolicy,
    ak: &Public,
    ev: &RenewBootEvidence,
    csr_sha256: &[u8],
) -> Result<BootFacts, BootFailure> {
    let mut input = ev.nonce.clone();
    input.extend_from_slice(csr_sha256);
    let extra = bc_wire::sha256(&input);
    let (selection, digest) = boot::verified_quote(ak, &ev.quote, &ev.quote_signature, &extra)?;
    let quoted: PcrValues =
        pcr::quoted_banks(&selection, &ev.pcr_values, &digest).ok_or(BootCheck::QuotePcrs)?;
    boot::judge(policy, &ev.event_log, &quoted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BootPolicy {
        BootPolicy {
            secure_boot_required: true,
            ..BootPolicy::default()
        }
    }

    #[test]
    fn a_challenge_answers_only_this_node_this_csr_in_time() {
        let key = RenewBootKey::derive(&[7; 32]);
        let csr = [1u8; 32];
        let now = 1_800_000_000_000;
        let c = key.challenge(&policy(), "node_a", &csr, now);
        assert_eq!(c.pcrs, vec![0, 7]);
        let ev = |c: &RenewBootChallenge| RenewBootEvidence {
            nonce: c.nonce.clone(),
            not_after_unix_ms: c.not_after_unix_ms,
            ..RenewBootEvidence::default()
        };
        let answer = ev(&c);
        assert!(key.is_current(&answer, "node_a", &csr, now + 1000));
        // Another node, another CSR, too late, another key.
        assert!(!key.is_current(&answer, "node_b", &csr, now));
        assert!(!key.is_current(&answer, "node_a", &[2; 32], now));
        assert!(!key.is_current(&answer, "node_a", &csr, now + CHALLENGE_TTL_MS + 1));
        assert!(!RenewBootKey::derive(&[8; 32]).is_current(&answer, "node_a", &csr, now));
        // A deadline moved later is not ours, nor one further out than a
        // challenge gives.
        let mut later = ev(&c);
        later.not_after_unix_ms += 1;
        assert!(!key.is_current(&later, "node_a", &csr, now));
        let far = key.challenge(&policy(), "node_a", &csr, now + CHALLENGE_TTL_MS);
        assert!(!key.is_current(&ev(&far), "node_a", &csr, now - 1));
    }
}
