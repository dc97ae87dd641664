//! x509pop through JoinService, against a real control plane DIR: nodes
//! joined with a token, certificates issued by the node CA, proofs signed by
//! the certificates' keys as bcd signs them.

use bc_wire::agent::{JoinRequest, JoinResponseBody, Role};
use bc_wire::signing::{self, Purpose};
use p256::pkcs8::DecodePrivateKey;
use prost::Message;
use rcgen::{KeyPair, PublicKeyData};

use super::*;
use crate::model::records::NodeRow;
use crate::plane::api_error::ApiError;
use crate::store::{self, params, UnixMs};
use crate::test_support::{self, key, plain_csr as csr_for, Cp};

/// A control plane DIR for x509pop (the shared [`Cp`] and this module's
/// steps).
struct Fixture(Cp);

impl std::ops::Deref for Fixture {
    type Target = Cp;
    fn deref(&self) -> &Cp {
        &self.0
    }
}

fn fixture_with(toml: Option<&str>) -> Fixture {
    Fixture(test_support::cp_with(toml, |_| {}))
}

fn fixture() -> Fixture {
    fixture_with(None)
}

/// A node's identity as bcd holds it: its key and its last chain.
struct Identity {
    node_id: String,
    key: KeyPair,
    chain: Vec<Vec<u8>>,
}

/// The evidence bcd builds: a proof by `signer` over `csr`, the node id and
/// the client time.
fn evidence(id: &Identity, csr: &[u8], client_time: u64) -> Evidence {
    let sk = p256::ecdsa::SigningKey::from_pkcs8_der(&id.key.serialize_der()).unwrap();
    let sig = signing::sign(
        &sk,
        Purpose::X509Pop,
        &[
            &bc_wire::sha256(csr),
            id.node_id.as_bytes(),
            &client_time.to_be_bytes(),
        ],
    );
    Evidence {
        node_id: id.node_id.clone(),
        chain: id.chain.clone(),
        client_time_ms: client_time,
        sig,
    }
}

impl Fixture {
    /// Joins a node with a token.
    fn token_node(&self, role: Role) -> Identity {
        let (body, key) = self.token_join(role, None);
        Identity {
            node_id: body.node_id,
            key,
            chain: body.chain,
        }
    }

    /// Issues (and, when `store`, records) a certificate for `node_id`.
    fn issue_identity(
        &self,
        node_id: &str,
        statements: &[String],
        generation: i64,
        store: bool,
    ) -> Identity {
        let key = key();
        let leaf = self.issue(node_id, &key, statements, generation, store);
        Identity {
            node_id: node_id.to_owned(),
            key,
            chain: vec![leaf, self.svc.node_ca_der().to_vec()],
        }
    }

    /// Re-joins with a fresh key and a proof made at database time.
    fn rejoin(&self, id: &Identity, role: Role) -> Result<(JoinResponseBody, KeyPair), ApiError> {
        let t = u64::try_from(self.now()).unwrap();
        self.rejoin_with(role, |csr| evidence(id, csr, t).to_json())
    }

    fn rejoin_with(
        &self,
        role: Role,
        make: impl FnOnce(&[u8]) -> Vec<u8>,
    ) -> Result<(JoinResponseBody, KeyPair), ApiError> {
        let next = key();
        let csr = csr_for(&next);
        let attestation = make(&csr);
        self.send(csr, role, attestation).map(|b| (b, next))
    }

    fn send(
        &self,
        csr: Vec<u8>,
        role: Role,
        attestation: Vec<u8>,
    ) -> Result<JoinResponseBody, ApiError> {
        let resp = crate::plane::join::JoinService::new(&self.svc).join(JoinRequest {
            csr,
            role: role as i32,
            attestor: AttestorId::X509Pop.as_str().into(),
            attestation,
            ..Default::default()
        })?;
        Ok(JoinResponseBody::decode(resp.body.as_slice()).unwrap())
    }

    /// Every refusal's reason, an aggregated event counting as many.
    fn refusals(&self) -> Vec<String> {
        records::list_events(self.db())
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == records::EVENT_JOIN_REFUSED)
            .flat_map(|e| {
                assert_eq!(e.attestor.as_deref(), Some(AttestorId::X509Pop.as_str()));
                let n = e.data["count"].as_u64().unwrap() as usize;
                std::iter::repeat_n(e.reason.unwrap(), n)
            })
            .collect()
    }

    /// The reason of the one refusal `f` causes (the one reason whose count
    /// grew: repeats are aggregated into an earlier event).
    fn refused<T: std::fmt::Debug>(&self, f: impl FnOnce() -> Result<T, ApiError>) -> String {
        let mut before = self.refusals();
        let err = f().expect_err("admitted");
        assert!(matches!(err, ApiError::AccessDenied), "{err:?}");
        let mut all = self.refusals();
        assert_eq!(all.len(), before.len() + 1);
        all.sort();
        before.sort();
        let at = all.iter().zip(&before).position(|(a, b)| a != b);
        all[at.unwrap_or(before.len())].clone()
    }

    fn node(&self, id: &str) -> NodeRow {
        self.db()
            .read(|tx| records::node_including_deleted(tx, id))
            .unwrap()
            .unwrap()
    }
}

#[test]
fn rejoins_as_itself_after_an_offline_expiry() {
    let f = fixture();
    let old = f.token_node(Role::Node);
    // Powered off for three days: the certificate expired two days ago.
    f.move_clock(3 * 86_400_000);
    let (body, next) = f.rejoin(&old, Role::Node).unwrap();
    assert_eq!(body.node_id, old.node_id);
    assert_eq!(body.chain[1], f.svc.node_ca_der());
    let id = crate::pki::node_cert_identity(&body.chain[0]).unwrap();
    assert_eq!(id.node_id, old.node_id);
    assert_eq!(id.spki_der, next.subject_public_key_info());
    assert_eq!(id.statements, ["urn:bc:scope:node"]);

    // Reclaimed in place: generation raised, the old certificate revoked.
    let node = f.node(&old.node_id);
    assert_eq!(
        (node.identity_generation, node.attestor),
        (2, AttestorId::X509Pop)
    );
    let certs = records::list_certs(f.db(), &old.node_id).unwrap();
    assert_eq!(
        certs
            .iter()
            .map(|c| (c.identity_generation, c.revoked_at.is_some()))
            .collect::<Vec<_>>(),
        [(1, true), (2, false)]
    );
    let ev = records::list_events(f.db()).unwrap();
    let joined = ev.last().unwrap();
    assert_eq!(joined.kind, records::EVENT_NODE_JOINED);
    assert_eq!(
        joined.attestor.as_deref(),
        Some(AttestorId::X509Pop.as_str())
    );
    assert_eq!(joined.data["nodeKey"], "unattested");
    assert_eq!(joined.data["reclaim"], true);
    assert_eq!(joined.data["identityGeneration"], 2);

    // The old certificate never re-joins again; the new one can.
    let next_id = Identity {
        node_id: old.node_id.clone(),
        key: next,
        chain: body.chain.clone(),
    };
    assert_eq!(
        f.refused(|| f.rejoin(&old, Role::Node)),
        X509PopReason::StaleGeneration
    );
    // A certificate not expired yet re-joins too.
    let (again, _) = f.rejoin(&next_id, Role::Node).unwrap();
    assert_eq!(again.node_id, old.node_id);
    assert_eq!(f.node(&old.node_id).identity_generation, 3);
}

#[test]
fn a_site_rejoins_as_a_site_only() {
    let f = fixture();
    let site = f.token_node(Role::Site);
    assert_eq!(
        f.refused(|| f.rejoin(&site, Role::Node)),
        X509PopReason::Role
    );
    assert_eq!(
        f.refused(|| f.rejoin(&site, Role::Ramdisk)),
        X509PopReason::Role
    );
    let node = f.token_node(Role::Node);
    assert_eq!(
        f.refused(|| f.rejoin(&node, Role::Site)),
        X509PopReason::Role
    );
    let (body, _) = f.rejoin(&site, Role::Site).unwrap();
    assert_eq!(body.node_id, site.node_id);
}

#[test]
fn grace_and_clock_window() {
    let f = fixture();
    let id = f.token_node(Role::Node);
    let not_after = records::list_certs(f.db(), &id.node_id).unwrap()[0].not_after;
    // The clock offset that puts database time at `at`.
    let offset = |at: UnixMs| {
        let current = f.db().read(store::clock_offset_ms).unwrap();
        at - (f.now() - current)
    };

    // Expired 7 days and a minute ago: past the grace.
    f.move_clock(offset(not_after + DEFAULT_GRACE_MS + 60_000));
    assert_eq!(
        f.refused(|| f.rejoin(&id, Role::Node)),
        X509PopReason::PastGrace
    );

    // Within the grace, but a proof two minutes old, or from the future.
    f.move_clock(offset(not_after + DEFAULT_GRACE_MS - 3_600_000));
    let now = u64::try_from(f.now()).unwrap();
    for t in [now - 120_000, now + 120_000, 0, u64::MAX] {
        assert_eq!(
            f.refused(|| f.rejoin_with(Role::Node, |csr| evidence(&id, csr, t).to_json())),
            X509PopReason::ClockWindow,
            "{t}"
        );
    }
    // 50 seconds off is within the 60 s window.
    let t = u64::try_from(f.now()).unwrap() - 50_000;
    f.rejoin_with(Role::Node, |csr| evidence(&id, csr, t).to_json())
        .unwrap();
}

#[test]
fn configured_grace_and_window() {
    let f = fixture_with(Some("[x509pop]\ngrace = \"0s\"\nwindow = \"5s\"\n"));
    let id = f.token_node(Role::Node);
    let t = u64::try_from(f.now()).unwrap() - 10_000;
    assert_eq!(
        f.refused(|| f.rejoin_with(Role::Node, |csr| evidence(&id, csr, t).to_json())),
        X509PopReason::ClockWindow
    );
    f.move_clock(24 * 3_600_000 + 1_000);
    assert_eq!(
        f.refused(|| f.rejoin(&id, Role::Node)),
        X509PopReason::PastGrace
    );
}

#[test]
fn only_our_own_current_certificates_rejoin() {
    let f = fixture();
    let a = f.token_node(Role::Node);
    let b = f.token_node(Role::Node);

    // Malformed evidence.
    assert_eq!(
        f.refused(|| f.rejoin_with(Role::Node, |_| b"{}".to_vec())),
        X509PopReason::EvidenceMalformed
    );
    assert_eq!(
        f.refused(|| f.rejoin_with(Role::Node, |_| b"\xff".to_vec())),
        X509PopReason::EvidenceMalformed
    );
    let t = u64::try_from(f.now()).unwrap();
    assert_eq!(
        f.refused(|| f.rejoin_with(Role::Node, |csr| {
            let mut e = evidence(&a, csr, t);
            e.node_id = "spiffe://bc.test/node/x".into();
            e.to_json()
        })),
        X509PopReason::EvidenceMalformed
    );

    // A certificate signed by our CA but never issued to anyone.
    let forged = f.issue_identity(&a.node_id, &[], 1, false);
    assert_eq!(
        f.refused(|| f.rejoin(&forged, Role::Node)),
        X509PopReason::UnknownCertificate
    );
    // B's certificate, claimed for A (and signed by B's key).
    let stolen = Identity {
        node_id: a.node_id.clone(),
        key: KeyPair::try_from(b.key.serialize_der().as_slice()).unwrap(),
        chain: b.chain.clone(),
    };
    assert_eq!(
        f.refused(|| f.rejoin(&stolen, Role::Node)),
        X509PopReason::UnknownCertificate
    );

    // A's certificate with a proof by another key.
    let wrong_key = Identity {
        node_id: a.node_id.clone(),
        key: key(),
        chain: a.chain.clone(),
    };
    assert_eq!(
        f.refused(|| f.rejoin(&wrong_key, Role::Node)),
        X509PopReason::Signature
    );
    // A proof for another CSR.
    let t = u64::try_from(f.now()).unwrap();
    assert_eq!(
        f.refused(|| f.rejoin_with(Role::Node, |_| evidence(&a, b"other csr", t).to_json())),
        X509PopReason::Signature
    );
    // A renewal-purpose signature is no x509pop proof.
    assert_eq!(
        f.refused(|| f.rejoin_with(Role::Node, |csr| {
            let mut e = evidence(&a, csr, t);
            let sk = p256::ecdsa::SigningKey::from_pkcs8_der(&a.key.serialize_der()).unwrap();
            e.sig = signing::sign(
                &sk,
                Purpose::Renew,
                &[
                    &bc_wire::sha256(csr),
                    a.node_id.as_bytes(),
                    &t.to_be_bytes(),
                ],
            );
            e.to_json()
        })),
        X509PopReason::Signature
    );

    // Revoked, same generation.
    f.db()
        .write(|tx| {
            tx.execute(
                "UPDATE node_certs SET revoked_at = 1 WHERE node_id = ?1",
                params![&a.node_id],
            )
        })
        .unwrap();
    assert_eq!(
        f.refused(|| f.rejoin(&a, Role::Node)),
        X509PopReason::Revoked
    );

    // nodes revoke-identity: B's certificate is from before it.
    crate::model::nodes::revoke_identity(f.db(), &b.node_id).unwrap();
    assert_eq!(
        f.refused(|| f.rejoin(&b, Role::Node)),
        X509PopReason::StaleGeneration
    );
    // Retired.
    let c = f.token_node(Role::Node);
    crate::model::nodes::retire(f.db(), &c.node_id).unwrap();
    assert_eq!(
        f.refused(|| f.rejoin(&c, Role::Node)),
        X509PopReason::Retired
    );
    // Deleted.
    let d = f.token_node(Role::Node);
    crate::model::nodes::cordon(f.db(), &d.node_id).unwrap();
    crate::model::nodes::delete(f.db(), &d.node_id).unwrap();
    assert_eq!(
        f.refused(|| f.rejoin(&d, Role::Node)),
        X509PopReason::Deleted
    );

    // None of it touched a node.
    for n in [&a, &b, &c, &d] {
        assert_eq!(f.node(&n.node_id).attestor, AttestorId::JoinToken);
    }
}

#[test]
fn a_proof_admits_once_even_across_a_restart() {
    let f = fixture();
    // A pool that admits only tpm: x509pop passes, the pool refuses after
    // it, and the transaction (the proof's use with it) is rolled back.
    crate::model::pools::create_pool(f.db(), "tpm-only", "root", None, &[]).unwrap();
    let id = f.token_node(Role::Node);
    f.db()
        .write(|tx| {
            tx.execute(
                "UPDATE nodes SET pool_id = 'tpm-only' WHERE id = ?1",
                params![&id.node_id],
            )
        })
        .unwrap();
    crate::model::pools::set_join_attestors(
        f.db(),
        "tpm-only",
        Some(&["tpm".to_owned()]),
        &["tpm"],
    )
    .unwrap();
    let next = key();
    let csr = csr_for(&next);
    let t = u64::try_from(f.now()).unwrap();
    let proof = evidence(&id, &csr, t);
    assert_eq!(
        f.refused(|| f.send(csr.clone(), Role::Node, proof.to_json())),
        crate::model::join_reasons::JoinReason::PoolAttestor
    );
    assert_eq!(f.db().read(crate::model::uses::count).unwrap(), 0);
    crate::model::pools::set_join_attestors(f.db(), "tpm-only", None, &[]).unwrap();
    let body = f.send(csr.clone(), Role::Node, proof.to_json()).unwrap();
    assert_eq!(body.node_id, id.node_id);
    // Spent until clientTime + window.
    let expires_at: UnixMs = f
        .db()
        .read(|tx| {
            tx.query_one(
                "SELECT expires_at FROM attestation_uses WHERE attestor = 'x509pop'",
                params![],
            )
            .and_then(|r| r.get(0))
        })
        .unwrap();
    assert_eq!(expires_at, i64::try_from(t).unwrap() + DEFAULT_WINDOW_MS);
    // The replay is named as one (not as the stale certificate it now is).
    assert_eq!(
        f.refused(|| f.send(csr.clone(), Role::Node, proof.to_json())),
        X509PopReason::Replayed
    );
    // Its malleated twin (r, n - s) verifies too, and is the same proof.
    let sig = p256::ecdsa::Signature::from_slice(&proof.sig).unwrap();
    use p256::elliptic_curve::PrimeField;
    let (r, s) = sig.split_scalars();
    let twin = p256::ecdsa::Signature::from_scalars(r.to_repr(), (-*s).to_repr()).unwrap();
    let mut malleated = proof.clone();
    malleated.sig = twin.to_bytes().into();
    assert_ne!(malleated.sig, proof.sig);
    let sk = p256::ecdsa::SigningKey::from_pkcs8_der(&id.key.serialize_der()).unwrap();
    assert!(malleated
        .verify(
            &p256::pkcs8::EncodePublicKey::to_public_key_der(sk.verifying_key())
                .unwrap()
                .into_vec(),
            &bc_wire::sha256(&csr)
        )
        .is_ok());
    assert_eq!(
        f.refused(|| f.send(csr.clone(), Role::Node, malleated.to_json())),
        X509PopReason::Replayed
    );
    // A restart (another JoinService on the same DIR, as another replica
    // would be) still knows it.
    let restarted = crate::plane::ControlPlane::open(f.path()).unwrap();
    let err = crate::plane::join::JoinService::new(&restarted)
        .join(JoinRequest {
            csr: csr.clone(),
            role: Role::Node as i32,
            attestor: AttestorId::X509Pop.as_str().into(),
            attestation: proof.to_json(),
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(err, ApiError::AccessDenied));
    assert_eq!(
        f.refusals().last().map(String::as_str),
        Some(X509PopReason::Replayed.as_str())
    );
    assert_eq!(f.node(&id.node_id).identity_generation, 2);
}

#[test]
fn a_tpm_statement_is_not_carried_but_recorded() {
    let f = fixture();
    let ak_name = [&[0u8, 0x0b][..], &[0xab; 32]].concat();
    let statement = bc_wire::tpm::ak_statement(&ak_name).unwrap();
    let node_id = "node_tpmbound".to_owned();
    test_support::insert_node(f.db(), &node_id, AttestorId::Tpm, f.now());
    let id = f.issue_identity(&node_id, std::slice::from_ref(&statement), 1, true);
    f.move_clock(2 * 86_400_000);
    let (body, _) = f.rejoin(&id, Role::Node).unwrap();
    let leaf = crate::pki::node_cert_identity(&body.chain[0]).unwrap();
    // No AK statement; the scope statement every certificate carries.
    assert_eq!(leaf.statements, ["urn:bc:scope:node"]);
    let ev = records::list_events(f.db()).unwrap();
    let kinds: Vec<_> = ev.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            records::EVENT_NODE_KEY_DOWNGRADED,
            records::EVENT_NODE_JOINED
        ]
    );
    assert_eq!(ev[0].node_id.as_deref(), Some(node_id.as_str()));
    assert_eq!(ev[0].data["statements"][0], statement);
    assert_eq!(ev[1].data["nodeKey"], "unattested");
}
