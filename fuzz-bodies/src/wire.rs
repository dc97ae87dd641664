//! The bc-wire parsers both sides share: TPM structures, x509pop evidence,
//! join tokens and sealed tokens.

use std::sync::OnceLock;

use bc_wire::agent::{tpm_attestation::Round, TpmAttestation};
use bc_wire::sealing::OpeningKey;
use bc_wire::token::JoinToken;
use bc_wire::tpm::{self, Attest, Public};
use bc_wire::x509pop::Evidence;
use prost::Message;

use crate::{fixtures, split_parts};

/// The AK of the captured TPM, and the SubjectPublicKeyInfo of its node key
/// (the CSR's): what signatures and certifications are checked against.
struct Tpm {
    ak: Public,
    csr_sha256: [u8; 32],
    csr_spki: Vec<u8>,
}

fn captured_tpm() -> Option<&'static Tpm> {
    static TPM: OnceLock<Option<Tpm>> = OnceLock::new();
    TPM.get_or_init(|| {
        let Some(Round::Hello(hello)) = TpmAttestation::decode(fixtures::TPM_HELLO).ok()?.round
        else {
            return None;
        };
        let ak = Public::parse(&hello.ak_public).ok()?;
        let answer = match TpmAttestation::decode(fixtures::TPM_ANSWER).ok()?.round {
            Some(Round::Answer(a)) => a,
            _ => return None,
        };
        let key = Public::parse(&answer.node_key?.public).ok()?;
        Some(Tpm {
            ak,
            csr_sha256: bc_wire::sha256(fixtures::TPM_CSR),
            csr_spki: key.p256_spki_der().ok()?,
        })
    })
    .as_ref()
}

/// The TPM structures of `wire/src/tpm.rs`; the first byte picks the parser.
pub fn tpm_wire(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 7 {
        0 => {
            if let Ok(p) = Public::parse(rest) {
                assert_eq!(p.raw, rest);
                public_name_holds(&p);
                let _ = p.p256_spki_der();
            }
        }
        1 => {
            if let Ok(a) = Attest::parse(rest) {
                assert_eq!(a.raw, rest);
            }
        }
        2 => {
            let _ = tpm::parse_ecdsa_signature(rest);
        }
        3 => {
            let Some(t) = captured_tpm() else { return };
            let [attest, signature] = split_parts(rest);
            let _ = tpm::verify_attest(&t.ak, attest, signature);
        }
        4 => {
            let Some(t) = captured_tpm() else { return };
            let [key_public, certify_info, signature] = split_parts(rest);
            let _ = tpm::verify_key_certification(
                &t.ak,
                key_public,
                certify_info,
                signature,
                &t.csr_sha256,
                &t.csr_spki,
            );
        }
        5 => {
            let Ok(uri) = std::str::from_utf8(rest) else {
                return;
            };
            if let Ok(name) = tpm::parse_ak_statement(uri) {
                assert_eq!(tpm::ak_statement(&name).as_deref(), Ok(uri));
            }
        }
        _ => {
            let [r, s] = split_parts(rest);
            let _ = tpm::p1363(r, s);
        }
    }
}

/// What `Public::parse` promises about the TPM name of any public area it
/// accepts: nameAlg (SHA-256, or SHA-384 for the high-range EK templates)
/// followed by that hash's digest. Only an attestation key is held to a
/// SHA-256 name, the one its `urn:bc:tpm-ak:sha256:` statement can carry.
fn public_name_holds(p: &Public) {
    let name = p.name();
    let digest_len = match p.name_alg {
        tpm::ALG_SHA256 => 32,
        tpm::ALG_SHA384 => 48,
        other => panic!("Public::parse accepted nameAlg {other:#06x}"),
    };
    assert_eq!(name[..2], p.name_alg.to_be_bytes());
    assert_eq!(name.len(), 2 + digest_len);
    if tpm::is_attestation_key(p) {
        assert_eq!(name.len(), 34);
        let statement = tpm::ak_statement(&name).expect("an AK's name has a statement");
        assert_eq!(tpm::parse_ak_statement(&statement), Ok(name));
    }
}

/// x509pop evidence as the control plane reads it from a join request:
/// parsed, re-serialized to the same evidence, and verified with the node
/// key of the agent-side targets.
pub fn x509pop_evidence(data: &[u8]) {
    let Ok(evidence) = Evidence::from_json(data) else {
        return;
    };
    assert_eq!(
        Evidence::from_json(&evidence.to_json()),
        Ok(evidence.clone())
    );
    let spki = fixtures::node_spki();
    let _ = evidence.verify(spki, &bc_wire::sha256(fixtures::AGENT_CSR));
}

/// A join token as the operator passes it (`--token-file`, the environment)
/// and as the control plane reads it once unsealed.
pub fn join_token(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(token) = JoinToken::parse(text) {
        assert_eq!(JoinToken::parse(&token.expose()), Ok(token));
    }
}

/// A sealed token, opened with the pinned encryption key for the agent-side
/// CSR, then read as a token, as `Join` does.
pub fn sealed_token(data: &[u8]) {
    static KEY: OnceLock<Option<OpeningKey>> = OnceLock::new();
    let Some(key) = KEY
        .get_or_init(|| OpeningKey::from_pkcs8_der(&fixtures::opening_key_pkcs8()).ok())
        .as_ref()
    else {
        return;
    };
    if let Ok(plain) = key.open(&bc_wire::sha256(fixtures::AGENT_CSR), data) {
        if let Ok(text) = std::str::from_utf8(&plain) {
            let _ = JoinToken::parse(text);
        }
    }
}
