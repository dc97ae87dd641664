//! `Renew` over mTLS, and the checks its answer must pass before bcd
//! replaces anything.
//!
//! The answer is not signed like a join answer: it comes over a TLS
//! connection to the pinned CA on which this node authenticated with its
//! current certificate. It is trusted for a certificate of this node, for
//! the next key, in this trust domain, carrying forward the AK statement the
//! current certificate has, and nothing else.
use bc_wire::agent::{RenewBootChallenge, RenewRequest, RenewResponse};
use bc_wire::signing;
use prost::Message;
use time::OffsetDateTime;

use super::{Client, ClientError};
use crate::pki::{self, rfc3339, CertError, NodeCert};

/// The most certificates a chain may hold; a node chain is leaf + a CA or two.
const MAX_CHAIN: usize = 8;

/// What a `Renew` call answered.
#[derive(Debug)]
pub enum RenewAnswer {
    /// The new chain (DER, leaf first), unchecked.
    Chain(Vec<Vec<u8>>),
    /// No certificate yet: the node's pool has a boot policy, and this
    /// challenge must be answered with the same CSR.
    Boot(RenewBootChallenge),
}

impl Client {
    /// One `Renew` call.
    pub async fn renew(&self, request: &RenewRequest) -> Result<RenewAnswer, ClientError> {
        if !self.mtls {
            return Err(ClientError::NoClientCertificate);
        }
        let answer = self.post(&self.renew_url, request.encode_to_vec()).await?;
        let resp =
            RenewResponse::decode(answer.body.as_slice()).map_err(|e| ClientError::BadAnswer {
                expected: "RenewResponse",
                cause: format!("{e}{}", answer.content_type_hint()),
            })?;
        Ok(match resp.boot {
            Some(challenge) if resp.chain.is_empty() => RenewAnswer::Boot(challenge),
            _ => RenewAnswer::Chain(resp.chain),
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RenewAnswerError {
    #[error("the renewal answer carries no certificate chain")]
    EmptyChain,
    #[error("the renewal answer's chain has {0} certificates, at most {MAX_CHAIN} are accepted")]
    LongChain(usize),
    #[error("the renewed certificate is unusable: {0}")]
    Cert(CertError),
    #[error("the renewed certificate certifies another key (key {cert_kid}, but the next node key is {node_kid})")]
    OtherKey { cert_kid: String, node_kid: String },
    #[error("the renewed certificate names {got}, but this node is {want}")]
    OtherIdentity { got: String, want: String },
    #[error("the renewed certificate drops the statement {0} the current one carries")]
    StatementDropped(String),
    #[error("the renewed certificate expired at {0}")]
    Expired(String),
    #[error("the renewed certificate is not signed by the node CA that signed the current one; it did not come from this control plane's CA")]
    OtherIssuer,
}

/// What a renewed certificate must be.
pub struct RenewExpected<'a> {
    pub node_id: &'a str,
    pub trust_domain: &'a str,
    /// The next key's SubjectPublicKeyInfo (DER): the CSR's.
    pub next_spki: &'a [u8],
    /// The current certificate's AK statement, carried forward.
    pub statement: Option<&'a str>,
    /// The CA certificate (DER) of the current chain: the renewed leaf must
    /// carry its signature (a certificate the control plane's TLS would not
    /// accept must not replace one it does). `None` for a chain without one.
    pub issuer: Option<&'a [u8]>,
    pub now: OffsetDateTime,
}

/// Checks a renewal answer; the parsed leaf when it passes.
pub fn verify_answer(
    chain: &[Vec<u8>],
    expected: &RenewExpected<'_>,
) -> Result<NodeCert, RenewAnswerError> {
    if chain.is_empty() {
        return Err(RenewAnswerError::EmptyChain);
    }
    if chain.len() > MAX_CHAIN {
        return Err(RenewAnswerError::LongChain(chain.len()));
    }
    let cert = pki::check_chain(chain).map_err(RenewAnswerError::Cert)?;
    if expected
        .issuer
        .is_some_and(|ca| !pki::signed_by(&chain[0], ca))
    {
        return Err(RenewAnswerError::OtherIssuer);
    }
    if cert.spki != expected.next_spki {
        return Err(RenewAnswerError::OtherKey {
            cert_kid: signing::key_id(&cert.spki),
            node_kid: signing::key_id(expected.next_spki),
        });
    }
    if cert.id.node_id != expected.node_id || cert.id.trust_domain != expected.trust_domain {
        return Err(RenewAnswerError::OtherIdentity {
            got: cert.id.to_string(),
            want: format!(
                "spiffe://{}/node/{}",
                expected.trust_domain, expected.node_id
            ),
        });
    }
    if let Some(want) = expected.statement {
        if !cert.statements.iter().any(|s| s == want) {
            return Err(RenewAnswerError::StatementDropped(want.to_owned()));
        }
    }
    if cert.not_after <= expected.now {
        return Err(RenewAnswerError::Expired(rfc3339(cert.not_after)));
    }
    Ok(cert)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{FileKey, NodeKey};
    use crate::pki::tests::issue;

    const AK: &str =
        "urn:bc:tpm-ak:sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn expected<'a>(spki: &'a [u8], statement: Option<&'a str>) -> RenewExpected<'a> {
        RenewExpected {
            node_id: "node_abc",
            trust_domain: "bc.test",
            next_spki: spki,
            statement,
            issuer: None,
            now: OffsetDateTime::now_utc(),
        }
    }

    #[test]
    fn refuses_a_certificate_another_ca_signed() {
        let k = FileKey::generate().unwrap();
        let uri = "spiffe://bc.test/node/node_abc";
        let chain = issue(k.spki_der(), &[uri], 1);
        let mut own = expected(k.spki_der(), None);
        own.issuer = Some(&chain[1]);
        assert!(verify_answer(&chain, &own).is_ok());
        let forged = issue(k.spki_der(), &[uri], 1);
        assert_eq!(
            verify_answer(&forged, &own).map(|_| ()),
            Err(RenewAnswerError::OtherIssuer)
        );
    }

    #[test]
    fn accepts_a_renewal_for_the_next_key_with_the_statement() {
        let k = FileKey::generate().unwrap();
        let chain = issue(k.spki_der(), &["spiffe://bc.test/node/node_abc", AK], 24);
        let cert = verify_answer(&chain, &expected(k.spki_der(), Some(AK))).unwrap();
        assert_eq!(cert.id.node_id, "node_abc");
    }

    /// A lease made or ended between two renewals changes the scope and
    /// lessee statements (the control plane writes them from the node's
    /// row): accepted, as long as the AK statement stays.
    #[test]
    fn accepts_changed_scope_and_lessee_statements_but_not_a_dropped_ak() {
        let k = FileKey::generate().unwrap();
        let id = "spiffe://bc.test/node/node_abc";
        let leased = [
            id,
            AK,
            "urn:bc:scope:node:diag.*,inventory.refresh",
            "urn:bc:tenant:acme",
        ];
        let cert = verify_answer(
            &issue(k.spki_der(), &leased, 24),
            &expected(k.spki_der(), Some(AK)),
        )
        .unwrap();
        assert_eq!(cert.statements, leased[1..]);
        let free = [id, AK, "urn:bc:scope:node"];
        assert!(verify_answer(
            &issue(k.spki_der(), &free, 24),
            &expected(k.spki_der(), Some(AK))
        )
        .is_ok());
        let no_ak = [id, leased[2], leased[3]];
        assert_eq!(
            verify_answer(
                &issue(k.spki_der(), &no_ak, 24),
                &expected(k.spki_der(), Some(AK))
            )
            .map(|_| ()),
            Err(RenewAnswerError::StatementDropped(AK.to_owned()))
        );
    }

    #[test]
    fn refuses_what_is_not_this_nodes_next_certificate() {
        let k = FileKey::generate().unwrap();
        let spki = k.spki_der();
        let other = FileKey::generate().unwrap();
        let check = |chain: &[Vec<u8>], statement| verify_answer(chain, &expected(spki, statement));
        assert_eq!(check(&[], None), Err(RenewAnswerError::EmptyChain));
        let nine = vec![issue(spki, &["spiffe://bc.test/node/node_abc"], 1)[0].clone(); 9];
        assert_eq!(check(&nine, None), Err(RenewAnswerError::LongChain(9)));
        assert!(matches!(
            check(&[b"junk".to_vec()], None),
            Err(RenewAnswerError::Cert(_))
        ));
        let theirs = issue(other.spki_der(), &["spiffe://bc.test/node/node_abc"], 1);
        assert!(matches!(
            check(&theirs, None),
            Err(RenewAnswerError::OtherKey { .. })
        ));
        for uri in [
            "spiffe://bc.test/node/node_xyz",
            "spiffe://other.test/node/node_abc",
        ] {
            assert!(matches!(
                check(&issue(spki, &[uri], 1), None),
                Err(RenewAnswerError::OtherIdentity { .. })
            ));
        }
        let dropped = issue(spki, &["spiffe://bc.test/node/node_abc"], 1);
        assert_eq!(
            check(&dropped, Some(AK)),
            Err(RenewAnswerError::StatementDropped(AK.to_owned()))
        );
        let mut late = expected(spki, None);
        late.now = OffsetDateTime::now_utc() + time::Duration::hours(2);
        assert!(matches!(
            verify_answer(&dropped, &late),
            Err(RenewAnswerError::Expired(_))
        ));
    }
}
