//! The join exchange: send, then wait out or answer deferrals until a final
//! answer comes.
//!
//! A small state machine. Every answer, deferrals included, is opened first
//! (pinned signature, bound to this CSR), so an unsigned "pending" cannot
//! make bcd wait and an unsigned "challenge" cannot make it prove anything.
//! Pending: wait `retry_after_seconds` (clamped) and send the same request
//! again. Challenge: hand it to the attestor's [`Answerer`] and send the same
//! CSR with the answer, at most [`Policy::max_challenges`] times. Only a
//! final answer that [`answer::verify_final`] accepts ends the loop well.
use std::future::Future;
use std::time::Duration;

use bc_wire::agent::{JoinChallenge, JoinPending, JoinRequest, JoinResponse};

use super::answer::{self, Accepted, AnswerError, Expected, Opened};
use super::{Client, ClientError};
use crate::pki::printable;

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Answer(#[from] AnswerError),
    #[error("the control plane challenged the join (attestor {attestor:?}), but {answerer} answers no challenge")]
    Unanswerable {
        attestor: String,
        answerer: &'static str,
    },
    #[error("the control plane's challenge is for attestor {got:?}, but this join uses {want:?}")]
    OtherAttestor { got: String, want: String },
    #[error("the control plane challenged the join more than {0} times")]
    TooManyChallenges(u32),
    #[error("the control plane's challenge expired before it could be answered")]
    ChallengeExpired,
    #[error("cannot answer the challenge: {0}")]
    Evidence(String),
}

/// Sends one `Join`. The real one is [`Client`]; tests script their own.
pub trait Transport {
    fn join(
        &self,
        request: &JoinRequest,
    ) -> impl Future<Output = Result<JoinResponse, ClientError>>;
}

impl Transport for Client {
    fn join(
        &self,
        request: &JoinRequest,
    ) -> impl Future<Output = Result<JoinResponse, ClientError>> {
        Client::join(self, request)
    }
}

/// An attestor's answer to its challenge, written into the next request:
/// its `attestation`, or its `tpm` for TPM evidence beside another
/// attestor's (a ramdisk's discovery join).
pub trait Answerer {
    fn answer(
        &mut self,
        challenge: &JoinChallenge,
        request: &mut JoinRequest,
    ) -> Result<(), JoinError>;
}

/// For attestors that never challenge (join-token): a challenge is an error.
/// Holds the attestor's name for the message.
pub struct NoChallenges(pub &'static str);

impl Answerer for NoChallenges {
    fn answer(&mut self, challenge: &JoinChallenge, _: &mut JoinRequest) -> Result<(), JoinError> {
        Err(JoinError::Unanswerable {
            attestor: printable(&challenge.attestor),
            answerer: self.0,
        })
    }
}

#[derive(Debug, Clone)]
pub struct Policy {
    pub max_challenges: u32,
    /// The wait when a pending answer names none (the spec's default, 30 s).
    pub default_wait: Duration,
    pub min_wait: Duration,
    pub max_wait: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_challenges: 3,
            default_wait: Duration::from_secs(30),
            min_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(300),
        }
    }
}

impl Policy {
    /// How long to wait on a pending answer: the server's wish, within bounds
    /// so that it can neither spin bcd nor park it for days per round.
    pub fn wait_for(&self, pending: &JoinPending) -> Duration {
        match pending.retry_after_seconds {
            0 => self.default_wait,
            s => Duration::from_secs(u64::from(s)).clamp(self.min_wait, self.max_wait),
        }
    }
}

/// Runs the exchange for `request` until a verified final answer.
/// `attestor` is the request's attestor id as the control plane names it.
pub async fn run<T: Transport>(
    transport: &T,
    answerer: &mut dyn Answerer,
    mut request: JoinRequest,
    attestor: &str,
    expected: &Expected<'_>,
    policy: &Policy,
) -> Result<Accepted, JoinError> {
    let mut challenges = 0u32;
    // After a wait, the attestor starts over with its first evidence: a
    // challenge answered before the approval is stale by then.
    let first_attestation = request.attestation.clone();
    let first_tpm = request.tpm.clone();
    loop {
        let response = transport.join(&request).await?;
        match answer::open(&response, expected)? {
            Opened::Pending(p) => {
                request.attestation = first_attestation.clone();
                request.tpm = first_tpm.clone();
                challenges = 0;
                let wait = policy.wait_for(&p);
                tracing::info!(
                    request_id = %printable(&p.request_id),
                    wait_s = wait.as_secs(),
                    "the join is pending approval; asking again after the wait"
                );
                tokio::time::sleep(wait).await;
            }
            Opened::Challenge(c) => {
                challenges += 1;
                if challenges > policy.max_challenges {
                    return Err(JoinError::TooManyChallenges(policy.max_challenges));
                }
                if c.attestor != attestor {
                    return Err(JoinError::OtherAttestor {
                        got: printable(&c.attestor),
                        want: attestor.to_owned(),
                    });
                }
                if c.not_after_unix_ms > 0 && now_unix_ms() > c.not_after_unix_ms {
                    return Err(JoinError::ChallengeExpired);
                }
                tracing::info!(attestor = %attestor, round = challenges, "answering the control plane's challenge");
                answerer.answer(&c, &mut request)?;
            }
            joined @ Opened::Joined { .. } => return Ok(answer::verify_final(joined, expected)?),
        }
    }
}

fn now_unix_ms() -> i64 {
    let now = crate::clock::now();
    i64::try_from(now.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::answer::tests::{joined_body, respond, service_key};
    use crate::keys::{FileKey, NodeKey};
    use bc_wire::agent::join_response_body::Deferral;
    use bc_wire::agent::JoinResponseBody;
    use std::cell::RefCell;
    use std::collections::VecDeque;

    /// Answers from a script and records what was sent.
    struct Scripted {
        answers: RefCell<VecDeque<JoinResponse>>,
        sent: RefCell<Vec<JoinRequest>>,
    }

    impl Transport for Scripted {
        async fn join(&self, request: &JoinRequest) -> Result<JoinResponse, ClientError> {
            self.sent.borrow_mut().push(request.clone());
            self.answers
                .borrow_mut()
                .pop_front()
                .ok_or(ClientError::AccessDenied)
        }
    }

    struct Echo;
    impl Answerer for Echo {
        fn answer(&mut self, c: &JoinChallenge, r: &mut JoinRequest) -> Result<(), JoinError> {
            r.attestation = c.payload.clone();
            Ok(())
        }
    }

    fn deferral(csr: &[u8], d: Deferral) -> JoinResponseBody {
        JoinResponseBody {
            csr_sha256: bc_wire::sha256(csr).to_vec(),
            node_id: String::new(),
            chain: vec![],
            deferral: Some(d),
        }
    }

    fn challenge(csr: &[u8], attestor: &str, payload: &[u8]) -> JoinResponseBody {
        deferral(
            csr,
            Deferral::Challenge(JoinChallenge {
                attestor: attestor.into(),
                payload: payload.to_vec(),
                not_after_unix_ms: 0,
            }),
        )
    }

    fn exchange(
        bodies: Vec<JoinResponseBody>,
        answerer: &mut dyn Answerer,
    ) -> (Result<Accepted, JoinError>, Vec<JoinRequest>, FileKey) {
        let service = service_key();
        let node = FileKey::generate().unwrap();
        let csr = b"csr".to_vec();
        let bodies = bodies
            .into_iter()
            .map(|mut b| {
                if b.deferral.is_none() {
                    b = joined_body(
                        &csr,
                        node.spki_der(),
                        "spiffe://bc.test/node/node_abc",
                        "node_abc",
                    );
                }
                respond(&service, &b)
            })
            .collect();
        let t = Scripted {
            answers: RefCell::new(bodies),
            sent: RefCell::new(vec![]),
        };
        let vk = *service.verifying_key();
        let expected = Expected {
            signing_key: &vk,
            csr_sha256: bc_wire::sha256(&csr),
            node_spki: node.spki_der(),
            trust_domain: "bc.test",
        };
        let policy = Policy {
            min_wait: Duration::ZERO,
            default_wait: Duration::ZERO,
            ..Policy::default()
        };
        let request = JoinRequest {
            csr: csr.clone(),
            ..Default::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = rt.block_on(run(&t, answerer, request, "tpm", &expected, &policy));
        (result, t.sent.into_inner(), node)
    }

    /// A placeholder for "the final answer" in a script.
    fn fin() -> JoinResponseBody {
        JoinResponseBody::default()
    }

    #[test]
    fn pending_then_joined_resends_the_same_request() {
        let pending = Deferral::Pending(JoinPending {
            request_id: "jr_1".into(),
            retry_after_seconds: 0,
        });
        let (r, sent, _) = exchange(vec![deferral(b"csr", pending), fin()], &mut Echo);
        assert_eq!(r.unwrap().node_id, "node_abc");
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0], sent[1]);
    }

    #[test]
    fn challenges_are_answered_with_the_same_csr() {
        let (r, sent, _) = exchange(vec![challenge(b"csr", "tpm", b"one"), fin()], &mut Echo);
        assert!(r.is_ok());
        assert_eq!(sent[1].csr, sent[0].csr);
        assert_eq!(sent[1].attestation, b"one");
    }

    #[test]
    fn join_token_answers_no_challenge() {
        let (r, sent, _) = exchange(
            vec![challenge(b"csr", "tpm", b"x")],
            &mut NoChallenges("join-token"),
        );
        let e = r.unwrap_err();
        assert!(matches!(e, JoinError::Unanswerable { .. }), "{e}");
        assert_eq!(sent.len(), 1);
    }

    #[test]
    fn at_most_three_challenges() {
        let script = (0..4).map(|_| challenge(b"csr", "tpm", b"x")).collect();
        let (r, sent, _) = exchange(script, &mut Echo);
        assert!(matches!(r, Err(JoinError::TooManyChallenges(3))));
        assert_eq!(sent.len(), 4);
    }

    #[test]
    fn a_challenge_for_another_attestor_is_refused() {
        let (r, _, _) = exchange(vec![challenge(b"csr", "x509pop", b"x")], &mut Echo);
        assert!(matches!(r, Err(JoinError::OtherAttestor { .. })));
    }

    #[test]
    fn a_deferral_for_another_csr_is_refused() {
        let (r, sent, _) = exchange(vec![challenge(b"other", "tpm", b"x")], &mut Echo);
        assert!(matches!(
            r,
            Err(JoinError::Answer(AnswerError::OtherRequest))
        ));
        assert_eq!(sent.len(), 1);
    }

    #[test]
    fn waits_are_clamped() {
        let p = Policy::default();
        let w = |s| {
            p.wait_for(&JoinPending {
                request_id: String::new(),
                retry_after_seconds: s,
            })
        };
        assert_eq!(w(0), Duration::from_secs(30));
        assert_eq!(w(5), Duration::from_secs(5));
        assert_eq!(w(u32::MAX), Duration::from_secs(300));
    }
}
