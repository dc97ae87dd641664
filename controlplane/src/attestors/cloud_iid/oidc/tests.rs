//! The OIDC verifier over tokens signed here with fresh keys: ES256 and
//! RS256, every refusal by its reason, and the claims that name the VM.

use super::*;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine;
use p256::ecdsa::signature::Signer as _;
use serde_json::json;

const NOW_S: i64 = 1_800_000_000;

pub(crate) fn p256_key() -> p256::ecdsa::SigningKey {
    p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap()
}

/// The JWKS of `key` as `kid`.
pub(crate) fn p256_jwk(key: &p256::ecdsa::SigningKey, kid: &str) -> serde_json::Value {
    let point = key.verifying_key().to_sec1_point(false);
    let bytes = point.as_bytes();
    json!({
        "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
        "x": B64URL.encode(&bytes[1..33]), "y": B64URL.encode(&bytes[33..65]),
    })
}

pub(crate) fn es256(
    key: &p256::ecdsa::SigningKey,
    kid: &str,
    claims: &serde_json::Value,
) -> String {
    let header = json!({"alg": "ES256", "kid": kid, "typ": "JWT"});
    let signed = format!(
        "{}.{}",
        B64URL.encode(header.to_string()),
        B64URL.encode(claims.to_string())
    );
    let sig: p256::ecdsa::Signature = key.sign(signed.as_bytes());
    format!("{signed}.{}", B64URL.encode(sig.to_bytes()))
}

fn provider(keys: &Jwks) -> OidcProvider {
    OidcProvider {
        name: "wi".into(),
        issuer: "https://issuer.example/".into(),
        audience: "https://cp.example:8443".into(),
        keys: KeySource::File(keys.clone()),
        account_claim: Some("project".into()),
        zone_claim: Some("placement.zone".into()),
        instance_claim: "sub".into(),
        max_age_ms: 600_000,
    }
}

fn claims() -> serde_json::Value {
    json!({
        "iss": "https://issuer.example", "aud": ["x", "https://cp.example:8443"],
        "sub": "vm-1", "iat": NOW_S - 10, "exp": NOW_S + 3600, "nbf": NOW_S - 10,
        "project": "p1", "placement": {"zone": "z1"},
    })
}

fn run(p: &OidcProvider, keys: &Jwks, doc: &str) -> Result<CloudIdentity, CloudReason> {
    let fresh = Freshness {
        now: NOW_S * 1000,
        max_age_ms: 1,
    };
    verify(p, keys, &Token::parse(doc)?, &fresh)
}

#[test]
fn an_es256_token_names_the_vm_by_the_configured_claims() {
    let key = p256_key();
    let keys = Jwks::parse(
        json!({"keys": [p256_jwk(&key, "k1")]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let p = provider(&keys);
    let id = run(&p, &keys, &es256(&key, "k1", &claims())).unwrap();
    assert_eq!(
        (
            id.provider.as_str(),
            id.account.as_str(),
            id.zone.as_str(),
            id.instance.as_str()
        ),
        ("oidc:wi", "p1", "z1", "vm-1")
    );
    // Defaults: the issuer's host is the account, no zone.
    let p2 = OidcProvider {
        account_claim: None,
        zone_claim: None,
        ..p.clone()
    };
    let id = run(&p2, &keys, &es256(&key, "k1", &claims())).unwrap();
    assert_eq!(
        (id.account.as_str(), id.zone.as_str()),
        ("issuer.example", "")
    );
    assert_eq!(id.subject(), "oidc:wi/issuer.example/vm-1");
}

#[test]
fn every_bad_token_is_refused_by_its_reason() {
    let key = p256_key();
    let other = p256::ecdsa::SigningKey::from_slice(&[9u8; 32]).unwrap();
    let keys = Jwks::parse(
        json!({"keys": [p256_jwk(&key, "k1")]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let p = provider(&keys);
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = claims();
        f(&mut c);
        es256(&key, "k1", &c)
    };
    let cases: Vec<(String, CloudReason)> = vec![
        (es256(&other, "k1", &claims()), CloudReason::Signature),
        (es256(&key, "k2", &claims()), CloudReason::Signature),
        (
            with(&|c| c["iss"] = json!("https://evil.example")),
            CloudReason::Issuer,
        ),
        (
            with(&|c| c["aud"] = json!("https://other.example")),
            CloudReason::Audience,
        ),
        (with(&|c| c["iat"] = json!(NOW_S - 601)), CloudReason::Stale),
        (with(&|c| c["exp"] = json!(NOW_S)), CloudReason::Stale),
        (with(&|c| c["iat"] = json!(NOW_S + 61)), CloudReason::Future),
        (with(&|c| c["nbf"] = json!(NOW_S + 61)), CloudReason::Future),
        (with(&|c| c["sub"] = json!(["a"])), CloudReason::Malformed),
        (
            with(&|c| c["placement"] = json!({})),
            CloudReason::Malformed,
        ),
        (with(&|c| c["sub"] = json!("a/b")), CloudReason::Malformed),
        ("a.b".into(), CloudReason::Malformed),
        (
            format!("{}.e30.c2ln", B64URL.encode(r#"{"alg":"none"}"#)),
            CloudReason::Malformed,
        ),
        (
            format!("{}.e30.c2ln", B64URL.encode(r#"{"alg":"HS256"}"#)),
            CloudReason::Malformed,
        ),
    ];
    for (doc, want) in cases {
        assert_eq!(run(&p, &keys, &doc), Err(want), "{doc}");
    }
    // A numeric claim is taken in decimal.
    let id = run(&p, &keys, &with(&|c| c["sub"] = json!(4242))).unwrap();
    assert_eq!(id.instance, "4242");
}

#[test]
fn an_rs256_token_verifies_and_an_es256_key_never_checks_it() {
    use rsa::pkcs8::DecodePrivateKey as _;
    use rsa::traits::PublicKeyParts as _;
    let rsa_key = rsa::PrivateKey::from_pkcs8_pem(include_str!(
        "../../../../../tpmsim-fixtures/cloud-gcp.key"
    ))
    .unwrap();
    let public = rsa_key.to_public_key();
    let jwk = json!({
        "kty": "RSA", "kid": "r1",
        "n": B64URL.encode(public.n().to_be_bytes()),
        "e": B64URL.encode(public.e().to_be_bytes()),
    });
    let keys = Jwks::parse(
        json!({"keys": [jwk, p256_jwk(&p256_key(), "r1")]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let header = json!({"alg": "RS256", "kid": "r1"});
    let signed = format!(
        "{}.{}",
        B64URL.encode(header.to_string()),
        B64URL.encode(claims().to_string())
    );
    let sig = rsa_key
        .pkcs1v15_sign::<rsa::sha2::Sha256>(signed.as_bytes())
        .unwrap();
    let doc = format!("{signed}.{}", B64URL.encode(sig));
    let p = provider(&keys);
    assert_eq!(run(&p, &keys, &doc).unwrap().instance, "vm-1");
    // The same signature presented as ES256 finds no key that takes it.
    let es = doc.replacen(
        &B64URL.encode(header.to_string()),
        &B64URL.encode(json!({"alg":"ES256","kid":"r1"}).to_string()),
        1,
    );
    assert_eq!(run(&p, &keys, &es), Err(CloudReason::Signature));
}

#[test]
fn a_jwks_keeps_only_signing_keys_it_can_use() {
    let k = p256_jwk(&p256_key(), "k1");
    let enc = json!({"kty": "EC", "crv": "P-256", "use": "enc", "x": k["x"], "y": k["y"]});
    let p384 = json!({"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"});
    let oct = json!({"kty": "oct", "k": "AAAA"});
    let keys = Jwks::parse(
        json!({"keys": [enc, p384, oct.clone(), k]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(keys.keys.len(), 1);
    assert!(keys.knows(Some("k1")) && !keys.knows(Some("k2")) && keys.knows(None));
    assert!(Jwks::parse(json!({"keys": [oct]}).to_string().as_bytes()).is_err());
    let bad = json!({"keys": [{"kty": "EC", "crv": "P-256", "x": "AAAA", "y": "AAAA"}]});
    assert!(Jwks::parse(bad.to_string().as_bytes()).is_err());
    assert!(Jwks::parse(&vec![b' '; MAX_JWKS_LEN + 1]).is_err());
}

#[test]
fn names_issuers_and_claims_are_checked() {
    assert!(check_name("wi-1_a").is_ok());
    for bad in ["", "Wi", "a:b", "a/b", &"a".repeat(33)] {
        assert!(check_name(bad).is_err(), "{bad}");
    }
    assert!(check_issuer("https://issuer.example").is_ok());
    assert!(check_issuer("https://issuer.example:8443/tenant/").is_ok());
    for bad in [
        "http://issuer.example",
        "https://issuer.example/?a=b",
        "https://u@issuer.example",
        "issuer.example",
    ] {
        assert!(check_issuer(bad).is_err(), "{bad}");
    }
    assert!(check_claim("a.b.c").is_ok());
    for bad in ["", "a..b", "a.b.c.d.e", ".a"] {
        assert!(check_claim(bad).is_err(), "{bad}");
    }
}
