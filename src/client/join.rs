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
//! A refusal ends it, but for a join the caller knows may be refused for a
//! passing reason ([`RefusedRetry`]): that one starts over (its first
//! round again) after a growing wait, for a bounded time.
use std::future::Future;
use std::time::Duration;

use bc_wire::agent::{JoinChallenge, JoinPending, JoinRequest, JoinResponse};

use super::answer::{self, Accepted, AnswerError, Expected, Opened};
use super::{Client, ClientError};
use crate::evidence::challenge::{AnswerChallenge, ChallengeError};
use crate::pki::printable;

#[derive(Debug, thiserror::Error)]
pub(crate) enum JoinError {
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
    #[error("the join was still waiting for an operator's approval (join request {request_id}) when its deadline passed, after {waited_s} s: approve it on the control plane (bc-controlplane requests approve {request_id}) and start the join again (a PXE ramdisk: boot the machine again, and approve its new request)")]
    StillPending { request_id: String, waited_s: u64 },
    /// ACCESS_DENIED after the join waited as a join request: denied, or
    /// its evidence stopped holding meanwhile (the reason stays on the
    /// server, as for every refusal).
    #[error("access denied after join request {request_id} waited for an operator")]
    RefusedAfterPending { request_id: String },
}

/// Sends one `Join`. The real one is [`Client`]; tests script their own.
pub(crate) trait Transport {
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
pub(crate) trait Answerer {
    fn answer(
        &mut self,
        challenge: &JoinChallenge,
        request: &mut JoinRequest,
    ) -> Result<(), JoinError>;
}

/// Evidence answers in its own terms; its error is the join's `Evidence`.
impl<T: AnswerChallenge> Answerer for T {
    fn answer(
        &mut self,
        challenge: &JoinChallenge,
        request: &mut JoinRequest,
    ) -> Result<(), JoinError> {
        AnswerChallenge::answer(self, challenge, request).map_err(JoinError::from)
    }
}

impl From<ChallengeError> for JoinError {
    fn from(e: ChallengeError) -> Self {
        JoinError::Evidence(e.0)
    }
}

/// For attestors that never challenge (join-token): a challenge is an error.
/// Holds the attestor's name for the message.
pub(crate) struct NoChallenges(pub &'static str);

impl Answerer for NoChallenges {
    fn answer(&mut self, challenge: &JoinChallenge, _: &mut JoinRequest) -> Result<(), JoinError> {
        Err(JoinError::Unanswerable {
            attestor: printable(&challenge.attestor),
            answerer: self.0,
        })
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub max_challenges: u32,
    /// The wait when a pending answer names none (the spec's default, 30 s).
    pub default_wait: Duration,
    pub min_wait: Duration,
    pub max_wait: Duration,
    /// How long to wait for an operator in all, when the evidence itself
    /// expires (a ramdisk's assertion): past it the join stops with
    /// [`JoinError::StillPending`] instead of asking with dead evidence.
    pub give_up_after: Option<Duration>,
    /// Called once per join request the answer names: tells the operator
    /// what to do (the console of a ramdisk).
    pub on_pending: fn(&JoinPending, Option<Duration>),
    /// Send a refused first round again (None: a refusal is final).
    pub refused_retry: Option<RefusedRetry>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_challenges: 3,
            default_wait: Duration::from_secs(30),
            min_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(300),
            give_up_after: None,
            on_pending: |_, _| {},
            refused_retry: None,
        }
    }
}

/// Asking again after a refused first round. Every refusal is the same
/// ACCESS_DENIED (the reason stays on the server), so this is for a join
/// the agent itself knows may be refused for a passing reason: a TPM join
/// without an EK certificate, which the control plane fetches from the
/// maker's service (refused `ek-service` while that is unreachable), in
/// round 1 for an EK it knows, else in round 2 once the TPM answered its
/// challenge. A refusal in either round starts over with round 1 after
/// the wait. The waits double from `first` up to `max_wait`; none starts
/// after `window` has passed since the first request, and the last refusal
/// is returned.
#[derive(Debug, Clone)]
pub(crate) struct RefusedRetry {
    pub first: Duration,
    pub max_wait: Duration,
    pub window: Duration,
    /// Why asking again may help, for the log line of each retry.
    pub why: &'static str,
}

impl RefusedRetry {
    /// A TPM join whose certificate comes from `service` (the maker's).
    pub(crate) fn maker_service(service: &'static str) -> Self {
        RefusedRetry {
            first: Duration::from_secs(5),
            max_wait: Duration::from_secs(60),
            window: Duration::from_secs(300),
            why: service,
        }
    }

    /// The wait before retry number `n` (from 0), `elapsed` after the first
    /// request; None when it would end past the window.
    pub(crate) fn wait(&self, n: u32, elapsed: Duration) -> Option<Duration> {
        let wait = self
            .first
            .checked_mul(1u32.checked_shl(n).unwrap_or(u32::MAX))
            .unwrap_or(self.max_wait)
            .min(self.max_wait);
        (elapsed + wait <= self.window).then_some(wait)
    }
}

impl Policy {
    /// How long to wait on a pending answer: the server's wish, within bounds
    /// so that it can neither spin bcd nor park it for days per round.
    pub(crate) fn wait_for(&self, pending: &JoinPending) -> Duration {
        match pending.retry_after_seconds {
            0 => self.default_wait,
            s => Duration::from_secs(u64::from(s)).clamp(self.min_wait, self.max_wait),
        }
    }
}

/// Runs the exchange for `request` until a verified final answer.
/// `attestor` is the request's attestor id as the control plane names it.
pub(crate) async fn run<T: Transport>(
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
    let started = tokio::time::Instant::now();
    let mut announced = None::<String>;
    let mut refusals = 0u32;
    loop {
        let response = match transport.join(&request).await {
            Err(ClientError::AccessDenied) if announced.is_some() => {
                return Err(JoinError::RefusedAfterPending {
                    request_id: printable(announced.as_deref().unwrap_or_default()),
                })
            }
            Err(ClientError::AccessDenied) if policy.refused_retry.is_some() => {
                let retry = policy.refused_retry.as_ref();
                let Some((wait, r)) =
                    retry.and_then(|r| Some((r.wait(refusals, started.elapsed())?, r)))
                else {
                    return Err(ClientError::AccessDenied.into());
                };
                refusals += 1;
                tracing::warn!(
                    wait_s = wait.as_secs(),
                    "the control plane refused the join; it fetches this TPM's EK certificate from {}, which may have been unreachable: asking again after the wait",
                    r.why
                );
                tokio::time::sleep(wait).await;
                request.attestation = first_attestation.clone();
                request.tpm = first_tpm.clone();
                challenges = 0;
                continue;
            }
            other => other?,
        };
        match answer::open(&response, expected)? {
            Opened::Pending(p) => {
                request.attestation = first_attestation.clone();
                request.tpm = first_tpm.clone();
                challenges = 0;
                let mut wait = policy.wait_for(&p);
                if let Some(limit) = policy.give_up_after {
                    let waited = started.elapsed();
                    if waited >= limit {
                        return Err(JoinError::StillPending {
                            request_id: printable(&p.request_id),
                            waited_s: waited.as_secs(),
                        });
                    }
                    // The last try comes at the deadline, not after it.
                    wait = wait.min(limit - waited);
                }
                if announced.as_deref() != Some(p.request_id.as_str()) {
                    (policy.on_pending)(&p, policy.give_up_after);
                    announced = Some(p.request_id.clone());
                }
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
        let policy = Policy {
            min_wait: Duration::ZERO,
            default_wait: Duration::ZERO,
            ..Policy::default()
        };
        exchange_with(bodies, answerer, &policy)
    }

    /// [`exchange`] under `policy`, on tokio's paused clock (waits pass at once).
    fn exchange_with(
        bodies: Vec<JoinResponseBody>,
        answerer: &mut dyn Answerer,
        policy: &Policy,
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
        let request = JoinRequest {
            csr: csr.clone(),
            ..Default::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let result = rt.block_on(run(&t, answerer, request, "tpm", &expected, policy));
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

    /// A join whose evidence expires (a ramdisk's assertion) waits for the
    /// operator with the server's backoff, its last try at the deadline,
    /// then stops naming the request; the operator is told once.
    #[test]
    fn a_pending_join_gives_up_at_its_deadline() {
        static TOLD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let pending = || {
            deferral(
                b"csr",
                Deferral::Pending(JoinPending {
                    request_id: "req_1".into(),
                    retry_after_seconds: 30,
                }),
            )
        };
        let policy = Policy {
            give_up_after: Some(Duration::from_secs(70)),
            on_pending: |p, limit| {
                assert_eq!(p.request_id, "req_1");
                assert_eq!(limit, Some(Duration::from_secs(70)));
                TOLD.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            },
            ..Policy::default()
        };
        let script = (0..10).map(|_| pending()).collect();
        let (r, sent, _) = exchange_with(script, &mut Echo, &policy);
        // At 0, 30, 60 and 70 s.
        assert_eq!(sent.len(), 4);
        match r {
            Err(JoinError::StillPending {
                request_id,
                waited_s,
            }) => {
                assert_eq!(request_id, "req_1");
                assert_eq!(waited_s, 70);
            }
            other => panic!("{:?}", other.map(|a| a.node_id)),
        }
        assert_eq!(TOLD.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn a_refusal_after_a_pending_answer_names_the_request() {
        let pending = Deferral::Pending(JoinPending {
            request_id: "req_2".into(),
            retry_after_seconds: 0,
        });
        // The script runs out after the pending answer: ACCESS_DENIED.
        let (r, sent, _) = exchange(vec![deferral(b"csr", pending)], &mut Echo);
        assert_eq!(sent.len(), 2);
        match r {
            Err(JoinError::RefusedAfterPending { request_id }) => assert_eq!(request_id, "req_2"),
            other => panic!("{:?}", other.map(|a| a.node_id)),
        }
        // Refused at once: the plain ACCESS_DENIED.
        let (r, _, _) = exchange(vec![], &mut Echo);
        assert!(matches!(
            r,
            Err(JoinError::Client(ClientError::AccessDenied))
        ));
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

    /// Refuses the first `refusals` requests, then answers `then`.
    struct Refusing {
        refusals: std::cell::Cell<u32>,
        then: JoinResponse,
        sent_at: RefCell<Vec<tokio::time::Instant>>,
    }

    impl Transport for Refusing {
        async fn join(&self, _: &JoinRequest) -> Result<JoinResponse, ClientError> {
            self.sent_at.borrow_mut().push(tokio::time::Instant::now());
            match self.refusals.get() {
                0 => Ok(self.then.clone()),
                n => {
                    self.refusals.set(n - 1);
                    Err(ClientError::AccessDenied)
                }
            }
        }
    }

    /// A refused first round is sent again after 5, 10, 20, 40, 60, 60 … s
    /// (tokio's clock, paused: no real wait), within 5 minutes; without
    /// the retry, or past the window, the refusal is returned.
    #[test]
    fn a_refused_first_round_is_asked_again_with_backoff_within_the_window() {
        let service = service_key();
        let node = FileKey::generate().unwrap();
        let csr = b"csr".to_vec();
        let joined = respond(
            &service,
            &joined_body(
                &csr,
                node.spki_der(),
                "spiffe://bc.test/node/node_abc",
                "node_abc",
            ),
        );
        let vk = *service.verifying_key();
        let expected = Expected {
            signing_key: &vk,
            csr_sha256: bc_wire::sha256(&csr),
            node_spki: node.spki_der(),
            trust_domain: "bc.test",
        };
        let request = JoinRequest {
            csr: csr.clone(),
            ..Default::default()
        };
        let go = |refusals: u32, retry: Option<RefusedRetry>| {
            let t = Refusing {
                refusals: std::cell::Cell::new(refusals),
                then: joined.clone(),
                sent_at: RefCell::new(vec![]),
            };
            let policy = Policy {
                refused_retry: retry,
                ..Policy::default()
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            let r = rt.block_on(run(
                &t,
                &mut Echo,
                request.clone(),
                "tpm",
                &expected,
                &policy,
            ));
            let at = t.sent_at.into_inner();
            let gaps: Vec<u64> = at.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
            (r, gaps)
        };
        let retry = || Some(RefusedRetry::maker_service("the maker's service"));
        let (r, gaps) = go(3, retry());
        assert_eq!(r.unwrap().node_id, "node_abc");
        assert_eq!(gaps, [5, 10, 20]);
        // 5+10+20+40+60+60+60 = 255 s; the next 60 s would end past 300 s.
        let (r, gaps) = go(100, retry());
        assert!(matches!(
            r,
            Err(JoinError::Client(ClientError::AccessDenied))
        ));
        assert_eq!(gaps, [5, 10, 20, 40, 60, 60, 60]);
        let (r, gaps) = go(1, None);
        assert!(matches!(
            r,
            Err(JoinError::Client(ClientError::AccessDenied))
        ));
        assert!(gaps.is_empty());
    }

    /// A join refused in round 2 (the control plane fetches the maker's
    /// certificate of an EK it did not know once the TPM answered its
    /// challenge, `ek-service` while that service is unreachable) starts
    /// over with its first evidence after the wait, as a refused round 1.
    #[test]
    fn a_refused_second_round_starts_over_with_the_first_evidence() {
        struct Steps {
            steps: RefCell<VecDeque<Option<JoinResponse>>>,
            sent: RefCell<Vec<(Vec<u8>, tokio::time::Instant)>>,
        }
        impl Transport for Steps {
            async fn join(&self, request: &JoinRequest) -> Result<JoinResponse, ClientError> {
                let at = tokio::time::Instant::now();
                self.sent
                    .borrow_mut()
                    .push((request.attestation.clone(), at));
                self.steps
                    .borrow_mut()
                    .pop_front()
                    .flatten()
                    .ok_or(ClientError::AccessDenied)
            }
        }
        let service = service_key();
        let node = FileKey::generate().unwrap();
        let csr = b"csr".to_vec();
        let ch = respond(&service, &challenge(&csr, "tpm", b"answer"));
        let joined = respond(
            &service,
            &joined_body(
                &csr,
                node.spki_der(),
                "spiffe://bc.test/node/node_abc",
                "node_abc",
            ),
        );
        let t = Steps {
            steps: RefCell::new(VecDeque::from([
                Some(ch.clone()),
                None,
                Some(ch),
                Some(joined),
            ])),
            sent: RefCell::default(),
        };
        let vk = *service.verifying_key();
        let expected = Expected {
            signing_key: &vk,
            csr_sha256: bc_wire::sha256(&csr),
            node_spki: node.spki_der(),
            trust_domain: "bc.test",
        };
        let request = JoinRequest {
            csr: csr.clone(),
            attestation: b"hello".to_vec(),
            ..Default::default()
        };
        let policy = Policy {
            refused_retry: Some(RefusedRetry::maker_service("the maker's service")),
            ..Policy::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let r = rt.block_on(run(&t, &mut Echo, request, "tpm", &expected, &policy));
        assert_eq!(r.unwrap().node_id, "node_abc");
        let sent = t.sent.into_inner();
        let evidence: Vec<&[u8]> = sent.iter().map(|(e, _)| e.as_slice()).collect();
        assert_eq!(
            evidence,
            [&b"hello"[..], b"answer", b"hello", b"answer"],
            "round 1 again after the refused round 2"
        );
        assert_eq!((sent[2].1 - sent[1].1).as_secs(), 5);
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
