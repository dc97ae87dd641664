//! `x509pop` evidence: a node re-joins as itself with its last (possibly
//! expired) certificate chain and a proof by that certificate's key, bound to
//! the new CSR, its node id and the client's time (see the spec's *x509pop*).
//!
//! A pure function of its inputs: the chain, the key the leaf certifies, the
//! new CSR's digest, the node id and the time. Nothing here reads a clock or
//! talks to the network.
use bc_wire::x509pop::{signed_fields, Evidence};
use time::OffsetDateTime;

use crate::keys::{KeyError, NodeKey};
use crate::pki::{self, CertError};

#[derive(Debug, thiserror::Error)]
pub enum X509PopError {
    #[error("the last certificate is unusable for x509pop: {0}")]
    Cert(#[from] CertError),
    #[error("the node key is not the one the last certificate certifies; x509pop needs that certificate's key")]
    OtherKey,
    #[error("the clock is before 1970; x509pop needs the time")]
    Clock,
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// The evidence JSON (`JoinRequest.attestation`): `chain` (DER, leaf
/// first), signed by `key`, which must be the leaf's key, under purpose
/// `x509pop` over `sha256(csr)`, `node_id` and `now` in Unix milliseconds.
pub fn build(
    chain: &[Vec<u8>],
    key: &dyn NodeKey,
    csr_sha256: &[u8; 32],
    node_id: &str,
    now: OffsetDateTime,
) -> Result<Vec<u8>, X509PopError> {
    let leaf = pki::check_chain(chain)?;
    if leaf.spki != key.spki_der() {
        return Err(X509PopError::OtherKey);
    }
    let client_time_ms =
        u64::try_from(now.unix_timestamp_nanos() / 1_000_000).map_err(|_| X509PopError::Clock)?;
    let sig = key.sign(&signed_fields(csr_sha256, node_id, client_time_ms))?;
    Ok(Evidence {
        node_id: node_id.to_owned(),
        chain: chain.to_vec(),
        client_time_ms,
        sig,
    }
    .to_json())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::FileKey;
    use crate::pki::tests::issue;

    #[test]
    fn evidence_verifies_under_the_leafs_key_for_its_csr_only() {
        let key = FileKey::generate().unwrap();
        let chain = issue(key.spki_der(), &["spiffe://bc.test/node/node_abc"], 1);
        let csr = bc_wire::sha256(b"the new csr");
        let now = OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap();
        let json = build(&chain, &key, &csr, "node_abc", now).unwrap();

        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["v"], 1);
        assert_eq!(v["nodeId"], "node_abc");
        assert_eq!(v["clientTime"], 1_790_000_000_000u64);
        assert_eq!(v["chain"].as_array().unwrap().len(), 2);

        let ev = Evidence::from_json(&json).unwrap();
        assert_eq!(ev.chain, chain);
        ev.verify(key.spki_der(), &csr).unwrap();
        assert!(ev
            .verify(key.spki_der(), &bc_wire::sha256(b"other"))
            .is_err());
        // The signing input is the wire's, field for field.
        let vk = bc_wire::signing::verifying_key_from_spki(key.spki_der()).unwrap();
        bc_wire::signing::verify(
            &vk,
            bc_wire::signing::Purpose::X509Pop,
            &[&csr, b"node_abc", &1_790_000_000_000u64.to_be_bytes()],
            &ev.sig,
        )
        .unwrap();
    }

    #[test]
    fn only_the_leafs_key_can_sign() {
        let key = FileKey::generate().unwrap();
        let other = FileKey::generate().unwrap();
        let chain = issue(key.spki_der(), &["spiffe://bc.test/node/node_abc"], 1);
        let now = OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap();
        let csr = bc_wire::sha256(b"csr");
        assert!(matches!(
            build(&chain, &other, &csr, "node_abc", now),
            Err(X509PopError::OtherKey)
        ));
        assert!(matches!(
            build(&[], &key, &csr, "node_abc", now),
            Err(X509PopError::Cert(CertError::EmptyChain))
        ));
    }
}
