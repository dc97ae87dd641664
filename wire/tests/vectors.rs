//! Pinned wire vectors. A failure here means the bytes on the wire changed:
//! every deployed agent or control plane would stop talking to this one.

use bc_wire::agent::{JoinResponseBody, Role};
use bc_wire::sealing::{OpeningKey, SealError, SealingKey};
use bc_wire::signing::{self, Purpose};
use bc_wire::spiffe::NodeSpiffeId;
use bc_wire::token::JoinToken;
use p256::ecdsa::SigningKey;
use p256::pkcs8::DecodePrivateKey;

const VECTOR_PKCS8: &str = "308187020100301306072a8648ce3d020106082a8648ce3d030107046d306b0201010420e6b6ed3dce75bd47b2a4d99dd75960cba06d48e819f24fbfed218a286d6aa6bea1440342000426dfe7285bebf654f4edff101234921e4ed4312a1824875e9bf36209fcc62a95481539a582349df760a3e2ee2be6219e4dc4117c35eeeb001fa99cafa0d0e5ca";
const VECTOR_SPKI: &str = "3059301306072a8648ce3d020106082a8648ce3d0301070342000426dfe7285bebf654f4edff101234921e4ed4312a1824875e9bf36209fcc62a95481539a582349df760a3e2ee2be6219e4dc4117c35eeeb001fa99cafa0d0e5ca";
/// Sealed with `aad = sha256("csr")` by an earlier build; must keep opening.
const VECTOR_SEALED: &str = "04618f6247cfb8ba7e8574a9c6cbb29b0a0507e136cf537c71c6b734357c0fdee27b4dbb6784ae92a39320d41f72fe0ce290556e1d6145c6f1a83acfae5ba56b69646b4b1817d942fd49e674f4a1c58f70cba69863e5566a83b0009e1c619563683589e3f0ed66fa0caa248758d8cd98b222d135a5df153ad9fbc49bb0a153e8169889d79d3351";
const VECTOR_TOKEN: &str = "tok_vector.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

/// signing_input("discovery-assertion", [the assertion below]).
const PINNED_ASSERTION_INPUT: &str = "62632d7369672d763100646973636f766572792d617373657274696f6e00000000440a06736974655f6112066e6f64655f621807221135323a35343a30303a31323a33343a35362a0931302e302e322e31353a0477665f634080d8c1a28c3448a0cff8a28c34";

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s).expect("vector hex")
}

#[test]
fn signing_input_layout_is_pinned() {
    let si = signing::signing_input(Purpose::X509Pop, &[b"ab", b"", &[1, 2, 3]]);
    assert_eq!(
        hex::encode(si),
        "62632d7369672d76310078353039706f70000000000261620000000000000003010203"
    );
}

#[test]
fn purposes_are_pinned_and_distinct() {
    let all = [
        (Purpose::JoinResponse, "join-response"),
        (Purpose::X509Pop, "x509pop"),
        (Purpose::DiscoveryAssertion, "discovery-assertion"),
        (Purpose::Renew, "renew"),
        (Purpose::SecretRequest, "secret-request"),
        (Purpose::Command, "command"),
        (Purpose::CommandResult, "command-result"),
        (Purpose::CommandChannel, "command-channel"),
    ];
    for (p, s) in all {
        assert_eq!(p.as_str(), s);
    }
    let a = signing::signing_input(Purpose::Renew, &[b"x"]);
    let b = signing::signing_input(Purpose::X509Pop, &[b"x"]);
    assert_ne!(a, b);
}

#[test]
fn field_boundaries_are_unambiguous() {
    let a = signing::signing_input(Purpose::Renew, &[b"ab", b"c"]);
    let b = signing::signing_input(Purpose::Renew, &[b"a", b"bc"]);
    assert_ne!(a, b);
}

#[test]
fn signature_names_its_purpose() {
    let sk = SigningKey::from_pkcs8_der(&unhex(VECTOR_PKCS8)).unwrap();
    let vk = signing::verifying_key_from_spki(&unhex(VECTOR_SPKI)).unwrap();
    let sig = signing::sign(&sk, Purpose::JoinResponse, &[b"body"]);
    assert_eq!(
        signing::verify(&vk, Purpose::JoinResponse, &[b"body"], &sig),
        Ok(())
    );
    assert_eq!(
        signing::verify(&vk, Purpose::X509Pop, &[b"body"], &sig),
        Err(signing::SignatureError::Invalid)
    );
    assert_eq!(
        signing::verify(&vk, Purpose::JoinResponse, &[b"body"], &sig[..63]),
        Err(signing::SignatureError::Malformed)
    );
    assert_eq!(
        signing::key_id(&unhex(VECTOR_SPKI)),
        signing::key_id_of(&vk),
        "key id is SHA-256 of the SPKI"
    );
}

#[test]
fn pinned_sealed_token_opens_to_the_known_value() {
    let key = OpeningKey::from_pkcs8_der(&unhex(VECTOR_PKCS8)).unwrap();
    let aad = bc_wire::sha256(b"csr");
    let opened = key.open(&aad, &unhex(VECTOR_SEALED)).unwrap();
    assert_eq!(opened, VECTOR_TOKEN.as_bytes());
    let token = JoinToken::parse(std::str::from_utf8(&opened).unwrap()).unwrap();
    assert_eq!(token.id, "tok_vector");
    assert_eq!(token.secret, [0u8; 32]);
}

#[test]
fn sealed_token_is_bound_to_its_request() {
    let key = OpeningKey::from_pkcs8_der(&unhex(VECTOR_PKCS8)).unwrap();
    let other = bc_wire::sha256(b"another csr");
    assert_eq!(
        key.open(&other, &unhex(VECTOR_SEALED)),
        Err(SealError::Open)
    );
    let mut tampered = unhex(VECTOR_SEALED);
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    assert_eq!(
        key.open(&bc_wire::sha256(b"csr"), &tampered),
        Err(SealError::Open)
    );
    assert_eq!(key.open(&other, &[4u8; 10]), Err(SealError::Malformed));
}

#[test]
fn seal_then_open_round_trips() {
    let (sk, pk) = bc_wire::sealing::generate_keypair().unwrap();
    let aad = bc_wire::sha256(b"some csr");
    let sealed = SealingKey::from_spki_der(&pk)
        .unwrap()
        .seal(&aad, b"hello")
        .unwrap();
    assert_eq!(
        OpeningKey::from_pkcs8_der(&sk)
            .unwrap()
            .open(&aad, &sealed)
            .unwrap(),
        b"hello"
    );
    assert!(SealingKey::from_spki_der(b"garbage").is_err());
}

#[test]
fn spiffe_ids_parse_strictly() {
    let id = NodeSpiffeId::parse("spiffe://bc.test/node/node_abc123").unwrap();
    assert_eq!(id.trust_domain, "bc.test");
    assert_eq!(id.node_id, "node_abc123");
    assert_eq!(id.to_string(), "spiffe://bc.test/node/node_abc123");
    for bad in [
        "spiffe://bc.test/node/node_abc123/x",
        "spiffe://bc.test/node/",
        "spiffe://bc.test/site/node_abc",
        "spiffe://BC.test/node/node_abc",
        "spiffe://bc.test:443/node/node_abc",
        "https://bc.test/node/node_abc",
        "spiffe://bc.test/node/node_ABC",
        "urn:bc:tpm-ak:sha256:00",
    ] {
        assert!(NodeSpiffeId::parse(bad).is_err(), "{bad} must not parse");
    }
}

#[test]
fn tokens_parse_strictly_and_never_debug_print_the_secret() {
    let t = JoinToken::parse(VECTOR_TOKEN).unwrap();
    assert_eq!(t.expose(), VECTOR_TOKEN);
    assert!(!format!("{t:?}").contains("AAAA"));
    for bad in [
        "",
        "tok_x",
        "tok_.AAAA",
        "x_1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "tok_a.short",
    ] {
        assert!(JoinToken::parse(bad).is_err(), "{bad:?} must not parse");
    }
}

#[test]
fn roles_round_trip() {
    for r in [Role::Node, Role::Site, Role::Ramdisk] {
        assert_eq!(Role::from_name(r.name()), Some(r));
    }
    assert_eq!(Role::from_name("admin"), None);
    // Prost gives every message a decode that rejects truncation.
    use prost::Message;
    let body = JoinResponseBody {
        node_id: "node_a".into(),
        ..Default::default()
    };
    let bytes = body.encode_to_vec();
    assert!(JoinResponseBody::decode(&bytes[..bytes.len() - 1]).is_err());
}

#[test]
fn x509pop_evidence_round_trips_and_binds_csr_node_and_time() {
    use bc_wire::x509pop::{signed_fields, Evidence};
    let sk = SigningKey::from_pkcs8_der(&unhex(VECTOR_PKCS8)).unwrap();
    let csr = bc_wire::sha256(b"csr");
    let si = signed_fields(&csr, "node_a", 1_790_000_000_000);
    assert_eq!(
        si,
        signing::signing_input(
            Purpose::X509Pop,
            &[&csr, b"node_a", &1_790_000_000_000u64.to_be_bytes()]
        )
    );
    let sig: p256::ecdsa::Signature = p256::ecdsa::signature::Signer::sign(&sk, &si);
    let ev = Evidence {
        node_id: "node_a".into(),
        chain: vec![vec![0x30, 0x00]],
        client_time_ms: 1_790_000_000_000,
        sig: sig.to_bytes().into(),
    };
    let json = ev.to_json();
    assert!(std::str::from_utf8(&json)
        .unwrap()
        .starts_with("{\"v\":1,\"nodeId\":\"node_a\",\"chain\":[\"MAA\"],"));
    let back = Evidence::from_json(&json).unwrap();
    assert_eq!(back, ev);
    let spki = unhex(VECTOR_SPKI);
    assert_eq!(back.verify(&spki, &csr), Ok(()));
    // Another CSR, node or time: the proof does not verify.
    assert!(back.verify(&spki, &bc_wire::sha256(b"other")).is_err());
    let mut other = back.clone();
    other.client_time_ms += 1;
    assert!(other.verify(&spki, &csr).is_err());
    other = back.clone();
    other.node_id = "node_b".into();
    assert!(other.verify(&spki, &csr).is_err());
    assert!(Evidence::from_json(
        b"{\"v\":2,\"nodeId\":\"n\",\"chain\":[],\"clientTime\":0,\"sig\":\"\"}"
    )
    .is_err());
    assert!(Evidence::from_json(b"not json").is_err());
}

/// The discovery assertion: its signing input is purpose
/// `discovery-assertion` over the one serialized DiscoveryAssertion, and the
/// command line form is unpadded base64url of the envelope.
#[test]
fn discovery_assertion_signing_input_is_pinned() {
    use bc_wire::site;
    use bc_wire::site_v1::DiscoveryAssertion;
    let a = DiscoveryAssertion {
        site_id: "site_a".into(),
        node_id: "node_b".into(),
        lease_epoch: 7,
        mac: "52:54:00:12:34:56".into(),
        ip: "10.0.2.15".into(),
        product_uuid: String::new(),
        workflow_id: "wf_c".into(),
        issued_at_unix_ms: 1_790_000_000_000,
        not_after_unix_ms: 1_790_000_900_000,
    };
    let mut seen = Vec::new();
    let signed = site::sign_assertion(&a, "kid".into(), |input| {
        seen = input.to_vec();
        Ok::<_, ()>([0u8; 64])
    })
    .unwrap();
    assert_eq!(hex::encode(&seen), PINNED_ASSERTION_INPUT);
    assert_eq!(
        signed.assertion,
        seen[seen.len() - signed.assertion.len()..]
    );
    assert_eq!(a.valid_until_ms(), 1_790_000_900_000);
    let text = site::to_cmdline(&signed);
    let back = site::from_cmdline(&text).unwrap();
    let (s2, a2) = site::parse_signed(&back).unwrap();
    assert_eq!((s2, a2), (signed, a));
    assert_eq!(site::boot_lease_name("site_a"), "site:site_a:boot");
}

#[test]
fn discovery_assertion_verifies_only_under_its_purpose() {
    use bc_wire::site;
    use bc_wire::site_v1::{DiscoveryAssertion, SecretRequestBody};
    let sk = SigningKey::from_pkcs8_der(&unhex(VECTOR_PKCS8)).unwrap();
    let spki = unhex(VECTOR_SPKI);
    let a = DiscoveryAssertion {
        site_id: "s".into(),
        ..Default::default()
    };
    let signed = site::sign_assertion(&a, String::new(), |m| {
        use p256::ecdsa::signature::Signer;
        let s: p256::ecdsa::Signature = sk.sign(m);
        Ok::<_, ()>(s.to_bytes().into())
    })
    .unwrap();
    assert_eq!(site::verify_assertion(&spki, &signed), Ok(()));
    // The same bytes signed under another purpose do not verify.
    let other = signing::sign(&sk, Purpose::SecretRequest, &[&signed.assertion]);
    let forged = bc_wire::site_v1::SignedDiscoveryAssertion {
        signature: other.to_vec(),
        ..signed.clone()
    };
    assert_eq!(
        site::verify_assertion(&spki, &forged),
        Err(signing::SignatureError::Invalid)
    );
    let body = SecretRequestBody {
        workflow_id: "wf".into(),
        ..Default::default()
    };
    let req = site::sign_secret_request(&body, |m| {
        use p256::ecdsa::signature::Signer;
        let s: p256::ecdsa::Signature = sk.sign(m);
        Ok::<_, ()>(s.to_bytes().into())
    })
    .unwrap();
    assert_eq!(site::verify_secret_request(&spki, &req), Ok(Some(body)));
    assert_eq!(
        signing::signing_input(Purpose::SecretRequest, &[])[..24],
        *b"bc-sig-v1\0secret-request"
    );
}

/// signing_input("command", [a disk.wipe command for node_a]).
const PINNED_COMMAND_INPUT: &str = "62632d7369672d763100636f6d6d616e6400000000360a05636d645f3112066e6f64655f611a096469736b2e7769706522130a076465766963657312082f6465762f76646128e0acc5a28c34";
/// signing_input("command-result", [its result]).
const PINNED_RESULT_INPUT: &str = "62632d7369672d763100636f6d6d616e642d726573756c7400000000590a05636d645f3112066e6f64655f611a096469736b2e7769706520012a05776970656432026f6b380242202689367b205c16ce32ed4200942b8b8b1e262dfc70d9bc9fbc77c49699a4f1df48e8dfc1a28c3450d0e7c1a28c34";
/// signing_input("command-channel", [nonce 32 x 0x07, node_a, 1790000000000]).
const PINNED_PROOF_INPUT: &str = "62632d7369672d763100636f6d6d616e642d6368616e6e656c00000000200707070707070707070707070707070707070707070707070707070707070707000000066e6f64655f6100000008000001a0c4506c00";

/// The command channel's three signatures: each signing input is pinned,
/// each verifies only under its purpose, and the ramdisk's scope statement
/// is pinned as the certificate carries it.
#[test]
fn command_channel_signing_inputs_are_pinned() {
    use bc_wire::command::{self, channel, Output, Scope, Times};
    use bc_wire::command_v1::{ChannelHello, Status};
    let sk = SigningKey::from_pkcs8_der(&unhex(VECTOR_PKCS8)).unwrap();
    let spki = unhex(VECTOR_SPKI);
    let c = command::new_command(
        "cmd_1",
        "node_a",
        "disk.wipe",
        [("devices".to_owned(), "/dev/vda".to_owned())],
        1_790_000_060_000,
    );
    let mut seen = Vec::new();
    let signed = command::sign(&c, "kid".into(), |m| {
        seen = m.to_vec();
        Ok::<_, ()>(p256_sign(&sk, m))
    })
    .unwrap();
    assert_eq!(hex::encode(&seen), PINNED_COMMAND_INPUT);
    assert_eq!(signed.command, seen[seen.len() - signed.command.len()..]);
    assert_eq!(
        signing::verify(
            &signing::verifying_key_from_spki(&spki).unwrap(),
            Purpose::Command,
            &[&signed.command],
            &signed.signature
        ),
        Ok(())
    );

    let mut out = Output::new();
    out.push(b"ok");
    let r = command::new_result(
        "cmd_1",
        "node_a",
        "disk.wipe",
        Status::Ok,
        "wiped",
        out,
        Times {
            started_ms: 1_790_000_001_000,
            finished_ms: 1_790_000_002_000,
        },
    );
    let mut seen = Vec::new();
    let sr = command::sign_result(&r, "kid".into(), |m| {
        seen = m.to_vec();
        Ok::<_, ()>(p256_sign(&sk, m))
    })
    .unwrap();
    assert_eq!(hex::encode(&seen), PINNED_RESULT_INPUT);
    assert_eq!(command::verify_result(&sr, &spki, "node_a"), Ok(r));

    let hello = ChannelHello {
        nonce: vec![7; 32],
        server_time_unix_ms: 0,
    };
    let mut seen = Vec::new();
    let proof = channel::sign_proof(&hello, "node_a", 1_790_000_000_000, "kid".into(), |m| {
        seen = m.to_vec();
        Ok::<_, ()>([0u8; 64])
    })
    .unwrap();
    assert_eq!(hex::encode(&seen), PINNED_PROOF_INPUT);
    assert_eq!(
        seen,
        channel::proof_input(&proof.nonce, "node_a", 1_790_000_000_000)
    );

    let scope = Scope::from_statements(&[
        "urn:bc:scope:ramdisk:inventory.refresh,logs.collect,diag.*,disk.wipe,deploy.*,boot.kexec",
    ])
    .unwrap();
    assert_eq!(scope.role, Role::Ramdisk);
    assert!(scope.allows(command::lookup("disk.wipe").unwrap()));
}

/// ES256 over exactly the bytes given (what a node key or the control
/// plane's signer does with a signing input).
fn p256_sign(sk: &SigningKey, m: &[u8]) -> [u8; 64] {
    let s: p256::ecdsa::Signature = p256::ecdsa::signature::Signer::sign(sk, m);
    s.to_bytes().into()
}
