//! The whole join through JoinService, on a real control plane DIR.

use super::*;
use crate::model::attestor::NodeKey;
use crate::model::tokens;
use bc_wire::AttestorId;
use std::sync::{Arc, Mutex};

use crate::test_support::{both_backends, cp as fixture, cp_on, uri_sans, Backend, Cp as Fixture};

// The whole join on both databases.
both_backends!(
    joins_with_a_token,
    refusals_reach_event_and_hook_only,
    parallel_joins_spend_a_token_once,
);

fn new_csr() -> (rcgen::KeyPair, Vec<u8>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["evil.example".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "node_chosenbyme");
    let der = params.serialize_request(&key).unwrap().der().to_vec();
    (key, der)
}

fn request(svc: &ControlPlane, csr: &[u8], token: Option<&str>, role: Role) -> JoinRequest {
    let sealed = token.map(|t| {
        bc_wire::sealing::SealingKey::from_spki_der(svc.bundle().join_encryption_spki_der())
            .unwrap()
            .seal(&bc_wire::sha256(csr), t.as_bytes())
            .unwrap()
    });
    JoinRequest {
        csr: csr.to_vec(),
        role: role as i32,
        sealed_token: sealed.unwrap_or_default(),
        ..Default::default()
    }
}

fn open_body(svc: &ControlPlane, resp: &JoinResponse) -> JoinResponseBody {
    let vk = signing::verifying_key_from_spki(svc.bundle().join_signing_spki_der()).unwrap();
    signing::verify(&vk, Purpose::JoinResponse, &[&resp.body], &resp.signature).unwrap();
    assert_eq!(
        resp.key_id,
        signing::key_id(svc.bundle().join_signing_spki_der())
    );
    JoinResponseBody::decode(resp.body.as_slice()).unwrap()
}

/// Every refusal's reason, an aggregated event counting as many.
fn refusals(svc: &ControlPlane) -> Vec<String> {
    records::list_events(svc.database())
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == records::EVENT_JOIN_REFUSED)
        .flat_map(|e| {
            let n = e.data["count"].as_u64().unwrap() as usize;
            std::iter::repeat_n(e.reason.unwrap(), n)
        })
        .collect()
}

#[test]
fn expect_binding_refuses_other_machines_and_spends_nothing() {
    use crate::model::machine::Expect;
    let f = fixture();
    let expect = Expect {
        product_uuid: Some("4c4c4544-0042-3510-8052-b4c04f4e4d32".to_owned()),
        mac: Some("52:54:00:12:34:56".to_owned()),
    };
    let (tok, row) =
        tokens::create_bound_token(f.svc.database(), Role::Node, 1, 3_600_000, None, &expect)
            .unwrap();
    assert_eq!(row.expect, expect);
    let claims = |uuid: &str, macs: &[&str]| agent::HardwareClaims {
        macs: macs.iter().map(|m| (*m).to_owned()).collect(),
        product_uuid: uuid.to_owned(),
    };
    let right_uuid = "4C4C4544-0042-3510-8052-B4C04F4E4D32";
    for (c, reason) in [
        (
            claims("", &["52:54:00:12:34:56"]),
            JoinReason::ExpectProductUuid.as_str(),
        ),
        (
            claims(
                "00000000-0042-3510-8052-b4c04f4e4d32",
                &["52:54:00:12:34:56"],
            ),
            JoinReason::ExpectProductUuid.as_str(),
        ),
        (claims(right_uuid, &[]), JoinReason::ExpectMac.as_str()),
        (
            claims(right_uuid, &["52:54:00:12:34:57"]),
            JoinReason::ExpectMac.as_str(),
        ),
    ] {
        let (_, csr) = new_csr();
        let mut req = request(&f.svc, &csr, Some(&tok.expose()), Role::Node);
        req.claims = Some(c);
        assert!(matches!(
            JoinService::new(&f.svc).join(req),
            Err(ApiError::AccessDenied)
        ));
        let events = records::list_events(f.svc.database()).unwrap();
        let last = events.last().unwrap();
        assert_eq!(last.reason.as_deref(), Some(reason));
        assert_eq!(last.token_id.as_deref(), Some(tok.id.as_str()));
    }
    let left = tokens::list_tokens(f.svc.database()).unwrap()[0].uses_left;
    assert_eq!(left, 1, "a refusal spends no use");
    assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());

    // The right machine (any case, the MAC among others) joins.
    let (_, csr) = new_csr();
    let mut req = request(&f.svc, &csr, Some(&tok.expose()), Role::Node);
    req.claims = Some(claims(
        right_uuid,
        &["02:00:00:00:00:01", "52:54:00:12:34:56"],
    ));
    JoinService::new(&f.svc).join(req).unwrap();
    assert_eq!(records::list_nodes(f.svc.database()).unwrap().len(), 1);
}

fn joins_with_a_token(backend: Backend) {
    use rcgen::PublicKeyData;
    let f = cp_on(backend);
    let (tok, _) = tokens::create_token(f.svc.database(), Role::Node, 1, 3_600_000).unwrap();
    let (key, csr) = new_csr();
    let resp = JoinService::new(&f.svc)
        .join(request(&f.svc, &csr, Some(&tok.expose()), Role::Node))
        .unwrap();
    let body = open_body(&f.svc, &resp);
    assert_eq!(body.csr_sha256, bc_wire::sha256(&csr));
    assert!(body.deferral.is_none());
    bc_wire::spiffe::check_node_id(&body.node_id).unwrap();
    assert_eq!(body.chain.len(), 2);
    assert_eq!(body.chain[1], f.svc.node_ca_der());
    let (_, leaf) = x509_parser::parse_x509_certificate(&body.chain[0]).unwrap();
    assert_eq!(
        leaf.public_key().raw,
        key.subject_public_key_info().as_slice()
    );
    let cn = leaf.subject().iter_common_name().next().unwrap();
    assert_eq!(cn.as_str().unwrap(), body.node_id);

    let nodes = records::list_nodes(f.svc.database()).unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].id, body.node_id);
    let events = records::list_events(f.svc.database()).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, records::EVENT_NODE_JOINED);
    assert_eq!(events[0].data["nodeKey"], "unattested");
    assert_eq!(events[0].token_id.as_deref(), Some(tok.id.as_str()));

    // The same token again: exhausted, the same ACCESS_DENIED.
    let (_, csr2) = new_csr();
    let err = JoinService::new(&f.svc)
        .join(request(&f.svc, &csr2, Some(&tok.expose()), Role::Node))
        .unwrap_err();
    assert!(matches!(err, ApiError::AccessDenied));
    assert_eq!(err.public_message(), "join refused");
    assert_eq!(refusals(&f.svc), ["token-exhausted"]);
}

fn refusals_reach_event_and_hook_only(backend: Backend) {
    let f = cp_on(backend);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    f.svc.set_on_refusal(Box::new(move |e: &RefusalEvent| {
        s.lock().unwrap().push(e.clone())
    }));
    let (tok, _) = tokens::create_token(f.svc.database(), Role::Node, 1, 3_600_000).unwrap();
    let (_, csr) = new_csr();

    // No token.
    let err = JoinService::new(&f.svc)
        .join(request(&f.svc, &csr, None, Role::Node))
        .unwrap_err();
    assert!(matches!(err, ApiError::AccessDenied));
    // Sealed for another CSR.
    let (_, other) = new_csr();
    let mut req = request(&f.svc, &other, Some(&tok.expose()), Role::Node);
    req.csr = csr.clone();
    assert!(matches!(
        JoinService::new(&f.svc).join(req),
        Err(ApiError::AccessDenied)
    ));
    // Unknown attestor.
    let mut req = request(&f.svc, &csr, Some(&tok.expose()), Role::Node);
    req.attestor = "nope".into();
    assert!(matches!(
        JoinService::new(&f.svc).join(req),
        Err(ApiError::AccessDenied)
    ));
    // A CSR whose signature does not verify.
    let mut bad = csr.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let req = request(&f.svc, &bad, Some(&tok.expose()), Role::Node);
    assert!(matches!(
        JoinService::new(&f.svc).join(req),
        Err(ApiError::AccessDenied)
    ));
    // Not DER at all: a broken request, not a refusal.
    let req = request(&f.svc, b"garbage", None, Role::Node);
    assert!(matches!(
        JoinService::new(&f.svc).join(req),
        Err(ApiError::InvalidInput(_))
    ));

    let want = [
        "token-missing",
        "token-unopenable",
        "join:unknown-attestor",
        "join:csr-signature",
    ];
    assert_eq!(refusals(&f.svc), want);
    let hooked: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.reason.as_str())
        .collect();
    // onRefusal spells every reason as the event does (`join:` included).
    assert_eq!(hooked, want);
    assert_eq!(seen.lock().unwrap()[2].attestor, "nope");
    // Nothing was spent.
    assert_eq!(
        tokens::list_tokens(f.svc.database()).unwrap()[0].uses_left,
        1
    );
    assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());
}

fn parallel_joins_spend_a_token_once(backend: Backend) {
    let f = cp_on(backend);
    let (tok, _) = tokens::create_token(f.svc.database(), Role::Node, 1, 3_600_000).unwrap();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let svc = f.svc.clone();
            let t = tok.expose();
            std::thread::spawn(move || {
                let (_, csr) = new_csr();
                JoinService::new(&svc)
                    .join(request(&svc, &csr, Some(&t), Role::Node))
                    .is_ok()
            })
        })
        .collect();
    let ok = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|ok| *ok)
        .count();
    assert_eq!(ok, 1);
    assert_eq!(records::list_nodes(f.svc.database()).unwrap().len(), 1);
    assert_eq!(refusals(&f.svc).len(), 7);
}

struct Deferring;
impl Attestor for Deferring {
    fn id(&self) -> AttestorId {
        AttestorId::JoinToken
    }
    fn verify(&self, _: &Tx<'_>, _: &AttestInput<'_>) -> Result<Verdict, Refusal> {
        Ok(Verdict::Defer(Deferral::Pending {
            request_id: "req_1".into(),
            retry_after_seconds: 30,
        }))
    }
}

struct BadStatement;
impl Attestor for BadStatement {
    fn id(&self) -> AttestorId {
        AttestorId::Provisioned
    }
    fn verify(&self, _: &Tx<'_>, _: &AttestInput<'_>) -> Result<Verdict, Refusal> {
        Ok(Verdict::Admit(Box::new(AttestationResult {
            node_key: NodeKey::Tpm {
                statement: "urn:bc:other:1".into(),
            },
            ..AttestationResult::default()
        })))
    }
}

/// Admits with whatever result the test put in.
struct Scripted {
    id: AttestorId,
    roles: crate::model::attestor::Roles,
    result: Mutex<AttestationResult>,
}

impl Scripted {
    fn new(id: AttestorId) -> Arc<Self> {
        Arc::new(Scripted {
            id,
            roles: crate::model::attestor::Roles {
                admits: &[Role::Node],
                refusal: None,
            },
            result: Mutex::new(AttestationResult::default()),
        })
    }
    /// One standing in for a built-in attestor, with its roles.
    fn replacing(f: &Fixture, id: AttestorId) -> Arc<Self> {
        Arc::new(Scripted {
            id,
            roles: f.svc.attestor(id).unwrap().roles(),
            result: Mutex::new(AttestationResult::default()),
        })
    }
    fn set(&self, r: AttestationResult) {
        *self.result.lock().unwrap() = r;
    }
}

impl Attestor for Scripted {
    fn id(&self) -> AttestorId {
        self.id
    }
    fn roles(&self) -> crate::model::attestor::Roles {
        self.roles
    }
    fn verify(&self, _: &Tx<'_>, _: &AttestInput<'_>) -> Result<Verdict, Refusal> {
        Ok(Verdict::Admit(Box::new(
            self.result.lock().unwrap().clone(),
        )))
    }
}

/// Every attestor `serve` runs says which roles it admits: one that
/// forgot would admit `node` only, refused as `join:role`, silently.
#[test]
fn every_attestor_serve_runs_names_its_roles() {
    let cp = crate::test_support::cp();
    let ids = cp.svc.attestor_ids();
    assert_eq!(ids.len(), 6, "{ids:?}");
    for id in ids {
        let a = cp.svc.attestor(id.parse().unwrap()).unwrap();
        let roles = a.roles();
        assert!(
            roles.refusal.is_some() && !roles.admits.is_empty(),
            "{id}: {roles:?}"
        );
    }
}

/// A role the attestor's row does not list is refused before it runs
/// (an unlisted attestor admits `node` only, `join:role`), and one its
/// result narrows away after it ran, with the attestor's own reason.
#[test]
fn roles_are_checked_in_one_place() {
    let f = fixture();
    let a = Scripted::new(AttestorId::Tpm);
    f.svc.register_attestor(a.clone());
    let join_as = |id: &str, role: Role| {
        let (_, csr) = new_csr();
        let mut req = request(&f.svc, &csr, None, role);
        req.attestor = id.into();
        JoinService::new(&f.svc).join(req)
    };
    assert!(matches!(
        join_as("tpm", Role::Site),
        Err(ApiError::AccessDenied)
    ));
    assert_eq!(refusals(&f.svc).last().unwrap(), JoinReason::Role.as_str());
    a.set(AttestationResult {
        roles: Some(vec![Role::Site]),
        ..AttestationResult::default()
    });
    assert!(matches!(
        join_as("tpm", Role::Node),
        Err(ApiError::AccessDenied)
    ));
    assert_eq!(refusals(&f.svc).last().unwrap(), JoinReason::Role.as_str());
    assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());
    a.set(AttestationResult::default());
    assert!(join_as("tpm", Role::Node).is_ok());

    let x = Scripted::replacing(&f, AttestorId::CloudIid);
    f.svc.register_attestor(x.clone());
    x.set(AttestationResult {
        roles: Some(vec![Role::Node]),
        ..AttestationResult::default()
    });
    assert!(matches!(
        join_as("cloud-iid", Role::Site),
        Err(ApiError::AccessDenied)
    ));
    assert_eq!(refusals(&f.svc).last().unwrap(), "cloud-role");
    x.set(AttestationResult {
        roles: Some(vec![Role::Node, Role::Site]),
        ..AttestationResult::default()
    });
    assert!(join_as("cloud-iid", Role::Site).is_ok());
}

fn scripted_join(f: &Fixture, id: &str) -> Result<JoinResponseBody, ApiError> {
    let (_, csr) = new_csr();
    let mut req = request(&f.svc, &csr, None, Role::Node);
    req.attestor = id.into();
    JoinService::new(&f.svc)
        .join(req)
        .map(|r| open_body(&f.svc, &r))
}

fn binding(key: &str) -> Option<crate::model::attestor::ProvenEk> {
    Some(crate::model::attestor::ProvenEk {
        sha256: key.into(),
        assurance: None,
        bound: true,
    })
}

#[test]
fn bindings_admit_only_their_node() {
    let f = fixture();
    let a = Scripted::new(AttestorId::Tpm);
    f.svc.register_attestor(a.clone());
    a.set(AttestationResult {
        ek: binding("k1"),
        ..Default::default()
    });
    let node_a = scripted_join(&f, "tpm").unwrap().node_id;
    let b = records::list_bindings(f.svc.database()).unwrap();
    assert_eq!(
        (b.len(), b[0].node_id.as_str(), b[0].key.as_str()),
        (1, node_a.as_str(), "k1")
    );

    // The same key for a new node: refused.
    assert!(matches!(
        scripted_join(&f, "tpm"),
        Err(ApiError::AccessDenied)
    ));
    // The same key reclaiming its node: fine, and the binding is kept.
    a.set(AttestationResult {
        reclaim_node_id: Some(node_a.clone()),
        ek: binding("k1"),
        ..Default::default()
    });
    assert_eq!(scripted_join(&f, "tpm").unwrap().node_id, node_a);
    // The key bound to A, joining as B.
    a.set(AttestationResult::default());
    let node_b = scripted_join(&f, "tpm").unwrap().node_id;
    a.set(AttestationResult {
        reclaim_node_id: Some(node_b.clone()),
        ek: binding("k1"),
        ..Default::default()
    });
    assert!(matches!(
        scripted_join(&f, "tpm"),
        Err(ApiError::AccessDenied)
    ));
    // Another key of the same kind for A, which already has one.
    a.set(AttestationResult {
        reclaim_node_id: Some(node_a.clone()),
        ek: binding("k2"),
        ..Default::default()
    });
    assert!(matches!(
        scripted_join(&f, "tpm"),
        Err(ApiError::AccessDenied)
    ));
    assert_eq!(
        refusals(&f.svc),
        [
            JoinReason::BoundElsewhere.as_str(),
            JoinReason::BoundElsewhere.as_str(),
            JoinReason::BoundElsewhere.as_str()
        ]
    );
    assert_eq!(records::list_bindings(f.svc.database()).unwrap().len(), 1);
    let nodes = records::list_nodes(f.svc.database()).unwrap();
    assert_eq!(nodes.len(), 2);
    let gen_a = nodes
        .iter()
        .find(|n| n.id == node_a)
        .unwrap()
        .identity_generation;
    assert_eq!(gen_a, 2);
}

#[test]
fn pool_policy_refuses_unlisted_attestors_before_writing() {
    let f = fixture();
    let known = ["join-token", "tpm"];
    crate::model::tenants::create(f.svc.database(), "alice").unwrap();
    crate::model::pools::create_pool(
        f.svc.database(),
        "metal",
        "alice",
        Some(&["tpm".to_owned()]),
        &known,
    )
    .unwrap();
    let (tok, _) =
        tokens::create_token_in_pool(f.svc.database(), Role::Node, 2, 3_600_000, Some("metal"))
            .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    f.svc.set_on_refusal(Box::new(move |e: &RefusalEvent| {
        s.lock().unwrap().push(e.clone())
    }));
    let (_, csr) = new_csr();
    let err = JoinService::new(&f.svc)
        .join(request(&f.svc, &csr, Some(&tok.expose()), Role::Node))
        .unwrap_err();
    assert!(matches!(err, ApiError::AccessDenied));
    let events = records::list_events(f.svc.database()).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].reason.as_deref(),
        Some(JoinReason::PoolAttestor.as_str())
    );
    assert_eq!(events[0].attestor.as_deref(), Some("join-token"));
    assert_eq!(events[0].token_id.as_deref(), Some(tok.id.as_str()));
    assert_eq!(events[0].data["poolOwner"], "alice");
    assert_eq!(events[0].data["poolId"], "metal");
    assert_eq!(seen.lock().unwrap()[0].tenant_id.as_deref(), Some("alice"));
    assert_eq!(events[0].tenant_id.as_deref(), Some("alice"));
    assert_eq!(
        seen.lock().unwrap()[0].reason.as_str(),
        JoinReason::PoolAttestor.as_str(),
        "onRefusal: the event's spelling"
    );
    // Nothing written, nothing spent.
    assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());
    assert_eq!(
        tokens::list_tokens(f.svc.database()).unwrap()[0].uses_left,
        2
    );

    // Listing join-token too admits it, into that pool.
    crate::model::pools::set_join_attestors(
        f.svc.database(),
        "metal",
        Some(&["join-token".to_owned(), "tpm".to_owned()]),
        &known,
    )
    .unwrap();
    let body = open_body(
        &f.svc,
        &JoinService::new(&f.svc)
            .join(request(&f.svc, &csr, Some(&tok.expose()), Role::Node))
            .unwrap(),
    );
    let nodes = records::list_nodes(f.svc.database()).unwrap();
    assert_eq!(
        (nodes[0].id.as_str(), nodes[0].pool_id.as_str()),
        (body.node_id.as_str(), "metal")
    );
    let joins = records::list_joins(f.svc.database()).unwrap();
    assert_eq!(joins.len(), 1);
    assert_eq!(
        (joins[0].node_key.as_str(), joins[0].identity_generation),
        ("unattested", 1)
    );

    // A reclaim checks the node's pool, not the one the attestor names.
    crate::model::pools::set_join_attestors(
        f.svc.database(),
        "metal",
        Some(&["tpm".to_owned()]),
        &known,
    )
    .unwrap();
    let a = Scripted::replacing(&f, AttestorId::JoinToken);
    f.svc.register_attestor(a.clone());
    a.set(AttestationResult {
        reclaim_node_id: Some(body.node_id.clone()),
        pool_id: Some("default".into()),
        ..Default::default()
    });
    assert!(matches!(scripted_join(&f, ""), Err(ApiError::AccessDenied)));
    assert_eq!(
        refusals(&f.svc),
        [
            JoinReason::PoolAttestor.as_str(),
            JoinReason::PoolAttestor.as_str()
        ]
    );
    assert_eq!(
        records::list_nodes(f.svc.database()).unwrap()[0].identity_generation,
        1
    );
    // An attestor resolving a pool that does not exist.
    a.set(AttestationResult {
        pool_id: Some("nope".into()),
        ..Default::default()
    });
    assert!(matches!(scripted_join(&f, ""), Err(ApiError::AccessDenied)));
    assert_eq!(refusals(&f.svc)[2], JoinReason::UnknownPool.as_str());
}

#[test]
fn only_parseable_ak_statements_are_written() {
    let f = fixture();
    let a = Scripted::new(AttestorId::X509Pop);
    f.svc.register_attestor(a.clone());
    for bad in [
        "urn:bc:tpm-ak:sha256:zz",
        "urn:bc:tpm-ak:sha1:00",
        "urn:bc:tpm-akx",
        "spiffe://bc.test/node/node_x",
    ] {
        a.set(AttestationResult {
            node_key: NodeKey::Tpm {
                statement: bad.into(),
            },
            ..Default::default()
        });
        assert!(
            matches!(scripted_join(&f, "x509pop"), Err(ApiError::AccessDenied)),
            "{bad}"
        );
    }
    assert_eq!(refusals(&f.svc), [JoinReason::NodeKeyStatement.as_str(); 4]);
    let good = bc_wire::tpm::ak_statement(&[&[0u8, 0x0b][..], &[0xab; 32]].concat()).unwrap();
    a.set(AttestationResult {
        node_key: NodeKey::Tpm {
            statement: good.clone(),
        },
        ..Default::default()
    });
    let body = scripted_join(&f, "x509pop").unwrap();
    let uris = uri_sans(&body.chain[0]);
    assert_eq!(
        uris,
        [
            format!("spiffe://bc.test/node/{}", body.node_id),
            good,
            "urn:bc:scope:node".to_owned()
        ]
    );
    let events = records::list_events(f.svc.database()).unwrap();
    assert_eq!(events.last().unwrap().data["nodeKey"], "tpm");
    assert_eq!(
        records::list_joins(f.svc.database()).unwrap()[0].node_key,
        "tpm"
    );
}

#[test]
fn registered_join_token_replaces_builtin_and_defers() {
    let f = fixture();
    f.svc.register_attestor(Arc::new(Deferring));
    let (_, csr) = new_csr();
    let resp = JoinService::new(&f.svc)
        .join(request(&f.svc, &csr, None, Role::Node))
        .unwrap();
    let body = open_body(&f.svc, &resp);
    assert!(body.node_id.is_empty() && body.chain.is_empty());
    assert_eq!(
        body.deferral,
        Some(join_response_body::Deferral::Pending(agent::JoinPending {
            request_id: "req_1".into(),
            retry_after_seconds: 30
        }))
    );
    assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());
}

#[test]
fn unknown_statement_is_refused() {
    let f = fixture();
    f.svc.register_attestor(Arc::new(BadStatement));
    let (_, csr) = new_csr();
    let mut req = request(&f.svc, &csr, None, Role::Node);
    req.attestor = "provisioned".into();
    assert!(matches!(
        JoinService::new(&f.svc).join(req),
        Err(ApiError::AccessDenied)
    ));
    assert_eq!(refusals(&f.svc), [JoinReason::NodeKeyStatement.as_str()]);
    assert!(records::list_nodes(f.svc.database()).unwrap().is_empty());
}
