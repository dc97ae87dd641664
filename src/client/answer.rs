//! Opening and verifying join answers.
//!
//! A `JoinResponse` is trusted for what it is signed for and nothing more:
//! the pinned JoinService key must have signed it, it must be bound to this
//! request's CSR, and a final answer must certify this node key under one
//! SPIFFE ID of the configured trust domain. Deferrals are opened (so the
//! loop can wait or answer) but never verify as a final answer.
use bc_wire::agent::{
    join_response_body::Deferral, JoinChallenge, JoinPending, JoinResponse, JoinResponseBody,
};
use bc_wire::signing::{self, Purpose};
use p256::ecdsa::VerifyingKey;
use p256::elliptic_curve::subtle::ConstantTimeEq;
use prost::Message;

use crate::pki::{self, printable, CertError, NodeCert};

/// The most certificates a chain may hold; a node chain is leaf + a CA or two.
const MAX_CHAIN: usize = 8;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AnswerError {
    #[error("the control plane's answer is not signed by the pinned join signing key{0}")]
    BadSignature(String),
    #[error("the control plane's answer is not a JoinResponseBody: {0}")]
    NotABody(String),
    #[error("the answer is for another request (csr_sha256 mismatch)")]
    OtherRequest,
    #[error("the control plane deferred the join; a deferral is not a final answer")]
    Deferred,
    #[error("the answer carries no certificate chain")]
    EmptyChain,
    #[error("the answer's chain has {0} certificates, at most {MAX_CHAIN} are accepted")]
    LongChain(usize),
    #[error("the answer's node id {0:?} is not a node id")]
    BadNodeId(String),
    #[error("the answer's certificate is unusable: {0}")]
    Cert(CertError),
    #[error(
        "the certificate certifies another key (key {cert_kid}, but the node key is {node_kid})"
    )]
    OtherKey { cert_kid: String, node_kid: String },
    #[error(
        "the certificate is for trust domain {got:?}, but this node is configured for {want:?}"
    )]
    OtherTrustDomain { got: String, want: String },
    #[error("the certificate names node {cert}, but the answer names node {body}")]
    OtherNode { cert: String, body: String },
}

/// A signed answer bound to this request, not yet judged as final.
#[derive(Debug, PartialEq)]
pub enum Opened {
    Joined {
        node_id: String,
        chain: Vec<Vec<u8>>,
    },
    Pending(JoinPending),
    Challenge(JoinChallenge),
}

/// The final answer, verified.
#[derive(Debug)]
pub struct Accepted {
    pub node_id: String,
    pub chain: Vec<Vec<u8>>,
    pub cert: NodeCert,
}

/// What the agent knows and the answer must match.
pub struct Expected<'a> {
    pub signing_key: &'a VerifyingKey,
    pub csr_sha256: [u8; 32],
    pub node_spki: &'a [u8],
    pub trust_domain: &'a str,
}

impl<'a> Expected<'a> {
    /// What a join answer must be for this config's pins and trust domain,
    /// the CSR with digest `csr_sha256` and the node key `node_spki`.
    pub(crate) fn for_join(
        config: &'a crate::config::Config,
        csr_sha256: [u8; 32],
        node_spki: &'a [u8],
    ) -> Self {
        Expected {
            signing_key: &config.pins.join_signing_key,
            csr_sha256,
            node_spki,
            trust_domain: &config.trust_domain,
        }
    }
}

/// Checks the signature and the request binding, then reads the body.
pub fn open(resp: &JoinResponse, expected: &Expected<'_>) -> Result<Opened, AnswerError> {
    if signing::verify(
        expected.signing_key,
        Purpose::JoinResponse,
        &[&resp.body],
        &resp.signature,
    )
    .is_err()
    {
        let pinned = signing::key_id_of(expected.signing_key);
        let hint = if !resp.key_id.is_empty() && resp.key_id != pinned {
            format!(
                " (signed by key {}, pinned {pinned})",
                printable(&resp.key_id)
            )
        } else {
            String::new()
        };
        return Err(AnswerError::BadSignature(hint));
    }
    read_body(&resp.body, expected)
}

/// Reads a body whose signature [`open`] checked, and its request binding.
/// Public for the fuzz target, which reaches it without signing each input.
#[doc(hidden)]
pub fn read_body(body: &[u8], expected: &Expected<'_>) -> Result<Opened, AnswerError> {
    let body = JoinResponseBody::decode(body).map_err(|e| AnswerError::NotABody(e.to_string()))?;
    let bound: bool =
        body.csr_sha256.len() == 32 && bool::from(body.csr_sha256.ct_eq(&expected.csr_sha256));
    if !bound {
        return Err(AnswerError::OtherRequest);
    }
    Ok(match body.deferral {
        Some(Deferral::Pending(p)) => Opened::Pending(p),
        Some(Deferral::Challenge(c)) => Opened::Challenge(c),
        None => Opened::Joined {
            node_id: body.node_id,
            chain: body.chain,
        },
    })
}

/// Judges an opened answer as the final one.
pub fn verify_final(opened: Opened, expected: &Expected<'_>) -> Result<Accepted, AnswerError> {
    let (node_id, chain) = match opened {
        Opened::Joined { node_id, chain } => (node_id, chain),
        Opened::Pending(_) | Opened::Challenge(_) => return Err(AnswerError::Deferred),
    };
    if chain.is_empty() {
        return Err(AnswerError::EmptyChain);
    }
    if chain.len() > MAX_CHAIN {
        return Err(AnswerError::LongChain(chain.len()));
    }
    bc_wire::spiffe::check_node_id(&node_id)
        .map_err(|_| AnswerError::BadNodeId(printable(&node_id)))?;
    let cert = pki::check_chain(&chain).map_err(AnswerError::Cert)?;
    if cert.spki != expected.node_spki {
        return Err(AnswerError::OtherKey {
            cert_kid: signing::key_id(&cert.spki),
            node_kid: signing::key_id(expected.node_spki),
        });
    }
    if cert.id.trust_domain != expected.trust_domain {
        return Err(AnswerError::OtherTrustDomain {
            got: cert.id.trust_domain,
            want: expected.trust_domain.to_owned(),
        });
    }
    if cert.id.node_id != node_id {
        return Err(AnswerError::OtherNode {
            cert: cert.id.node_id,
            body: node_id,
        });
    }
    Ok(Accepted {
        node_id,
        chain,
        cert,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::keys::{FileKey, NodeKey};
    use crate::pki::tests::issue;
    use p256::ecdsa::SigningKey;

    pub(crate) fn service_key() -> SigningKey {
        SigningKey::from_slice(&[5u8; 32]).unwrap()
    }

    /// A response as the JoinService would send it, signed by `signer`.
    pub(crate) fn respond(signer: &SigningKey, body: &JoinResponseBody) -> JoinResponse {
        let bytes = body.encode_to_vec();
        JoinResponse {
            signature: signing::sign(signer, Purpose::JoinResponse, &[&bytes]).to_vec(),
            key_id: signing::key_id_of(signer.verifying_key()),
            body: bytes,
        }
    }

    pub(crate) fn joined_body(
        csr: &[u8],
        spki: &[u8],
        uri: &str,
        node_id: &str,
    ) -> JoinResponseBody {
        JoinResponseBody {
            csr_sha256: bc_wire::sha256(csr).to_vec(),
            node_id: node_id.into(),
            chain: issue(spki, &[uri], 24),
            deferral: None,
        }
    }

    struct Case {
        service: SigningKey,
        node: FileKey,
        csr: Vec<u8>,
    }

    impl Case {
        fn new() -> Case {
            Case {
                service: service_key(),
                node: FileKey::generate().unwrap(),
                csr: b"the csr".to_vec(),
            }
        }
        fn good(&self) -> JoinResponseBody {
            joined_body(
                &self.csr,
                self.node.spki_der(),
                "spiffe://bc.test/node/node_abc",
                "node_abc",
            )
        }
        fn check(&self, resp: &JoinResponse) -> Result<Accepted, AnswerError> {
            let vk = *self.service.verifying_key();
            let expected = Expected {
                signing_key: &vk,
                csr_sha256: bc_wire::sha256(&self.csr),
                node_spki: self.node.spki_der(),
                trust_domain: "bc.test",
            };
            verify_final(open(resp, &expected)?, &expected)
        }
    }

    #[test]
    fn accepts_a_good_answer() {
        let c = Case::new();
        let a = c.check(&respond(&c.service, &c.good())).unwrap();
        assert_eq!(a.node_id, "node_abc");
        assert_eq!(a.chain.len(), 2);
    }

    #[test]
    fn refuses_another_signer() {
        let c = Case::new();
        let other = SigningKey::from_slice(&[6u8; 32]).unwrap();
        let e = c.check(&respond(&other, &c.good())).unwrap_err();
        assert!(
            matches!(e, AnswerError::BadSignature(ref hint) if hint.contains("signed by key")),
            "{e}"
        );
        assert!(e.to_string().starts_with(
            "the control plane's answer is not signed by the pinned join signing key"
        ));
    }

    #[test]
    fn refuses_a_tampered_body() {
        let c = Case::new();
        let mut resp = respond(&c.service, &c.good());
        let n = resp.body.len();
        resp.body[n - 1] ^= 1;
        assert!(matches!(c.check(&resp), Err(AnswerError::BadSignature(_))));
        resp.signature = vec![0; 10];
        assert!(matches!(c.check(&resp), Err(AnswerError::BadSignature(_))));
    }

    #[test]
    fn refuses_an_answer_for_another_csr() {
        let c = Case::new();
        let mut body = c.good();
        body.csr_sha256 = bc_wire::sha256(b"another csr").to_vec();
        assert_eq!(
            c.check(&respond(&c.service, &body)).unwrap_err(),
            AnswerError::OtherRequest
        );
        body.csr_sha256.clear();
        assert_eq!(
            c.check(&respond(&c.service, &body)).unwrap_err(),
            AnswerError::OtherRequest
        );
    }

    #[test]
    fn refuses_a_deferral_as_final() {
        let c = Case::new();
        let mut body = c.good();
        body.deferral = Some(Deferral::Pending(JoinPending {
            request_id: "r".into(),
            retry_after_seconds: 1,
        }));
        assert_eq!(
            c.check(&respond(&c.service, &body)).unwrap_err(),
            AnswerError::Deferred
        );
    }

    #[test]
    fn refuses_a_certificate_for_another_key() {
        let c = Case::new();
        let other = FileKey::generate().unwrap();
        let body = joined_body(
            &c.csr,
            other.spki_der(),
            "spiffe://bc.test/node/node_abc",
            "node_abc",
        );
        let e = c.check(&respond(&c.service, &body)).unwrap_err();
        assert!(matches!(e, AnswerError::OtherKey { .. }), "{e}");
        assert!(e
            .to_string()
            .starts_with("the certificate certifies another key"));
    }

    #[test]
    fn refuses_other_identities() {
        let c = Case::new();
        let spki = c.node.spki_der();
        let td = joined_body(
            &c.csr,
            spki,
            "spiffe://other.test/node/node_abc",
            "node_abc",
        );
        assert!(matches!(
            c.check(&respond(&c.service, &td)),
            Err(AnswerError::OtherTrustDomain { .. })
        ));
        let node = joined_body(&c.csr, spki, "spiffe://bc.test/node/node_abc", "node_xyz");
        assert!(matches!(
            c.check(&respond(&c.service, &node)),
            Err(AnswerError::OtherNode { .. })
        ));
        let bad = joined_body(&c.csr, spki, "spiffe://bc.test/node/node_abc", "../etc");
        assert!(matches!(
            c.check(&respond(&c.service, &bad)),
            Err(AnswerError::BadNodeId(_))
        ));
    }

    #[test]
    fn refuses_empty_or_garbage_chains() {
        let c = Case::new();
        let mut body = c.good();
        body.chain.clear();
        assert_eq!(
            c.check(&respond(&c.service, &body)).unwrap_err(),
            AnswerError::EmptyChain
        );
        body.chain = vec![b"not der".to_vec()];
        assert_eq!(
            c.check(&respond(&c.service, &body)).unwrap_err(),
            AnswerError::Cert(CertError::NotDer { index: 1 })
        );
    }

    #[test]
    fn refuses_a_body_that_is_not_a_body() {
        let c = Case::new();
        let bytes = vec![0xff, 0xff, 0xff];
        let resp = JoinResponse {
            signature: signing::sign(&c.service, Purpose::JoinResponse, &[&bytes]).to_vec(),
            key_id: String::new(),
            body: bytes,
        };
        assert!(matches!(c.check(&resp), Err(AnswerError::NotABody(_))));
    }
}
