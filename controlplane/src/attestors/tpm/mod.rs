//! `tpm`: a machine joins with nothing but its TPM (spec "Attestation",
//! section *tpm*), in two rounds for the same CSR.
//!
//! **Round 1** (`TpmAttestation.hello`): the EK certificate chains to the
//! configured EK roots ([`ek`]), the EK public area is the certificate's key
//! in the default L-1 template, and the AK is a restricted P-256 signing key
//! (`ak-attributes`). The answer is a deferral: a MakeCredential challenge
//! computed in software ([`credential`]) that only the TPM holding that EK,
//! with that AK loaded, can open, plus a state sealed under `challengeKey`
//! and bound to the CSR ([`state`]). Nothing is written, so any replica can
//! take round 2.
//!
//! **A certificate from the maker's service** ([`ek_service`]), for a hello
//! without one: fetched in round 1 only for an EK an operator knows; any
//! other EK is challenged as it is (a TCG default template), the state
//! saying its certificate is pending, and round 2 fetches and verifies it
//! (the same checks and refusals as round 1's) right after the proof and
//! before placing the machine. Each fetch runs between two runs of the
//! join transaction ([`Verdict::Prepare`]).
//!
//! **Round 2** (`TpmAttestation.answer`), each failure a refusal with the
//! reason named: the state opens for this CSR (`challenge-state`), is not
//! past its deadline (`challenge-expired`) and was not answered before
//! (`challenge-reused`, see below); the secret is the credential
//! (`challenge-secret`, constant time); the quote is signed by the AK
//! (`quote-signature`) and is a quote whose extraData is
//! `sha256(secret ‖ sha256(csr))` (`quote-nonce`); the PCR values are those of
//! one SHA-256 or SHA-1 selection and hash to the quote's digest
//! (`quote-pcrs`); the configured PCR policy holds in that bank
//! (`pcr-policy`, [`pcr`]); then the node key: its
//! certification by the AK over `sha256(csr)` (`node-key-*`, see
//! [`bc_wire::tpm::verify_key_certification`]), required unless
//! `node_key = "any"` (`node-key-not-certified`). With no PCR policy the
//! challenge says `fresh_certification`, and an answer may leave the quote
//! out when the node key's certification is over the quote's extraData
//! instead: the same AK signature over the same fresh nonce, one TPM
//! command fewer for the agent (no quote and a policy: `quote-signature`;
//! no quote and no certification: `node-key-not-certified`, or
//! `quote-signature` with `node_key = "any"`).
//!
//! **A pool's boot policy** ([`crate::model::boot_policy`]): round 1 looks
//! up where the EK would join (its node, a resolve entry, an approved
//! request) and, when that pool has a policy, asks for its PCRs in every
//! populated bank and the event log (`TpmChallenge.event_log`); round 2,
//! once the machine is placed, checks the place it has then: the log
//! replays to the quote in every bank and the policy allows what booted
//! ([`boot`]: `eventlog-*`, `boot-*`, the value and event in the refusal's
//! detail). Not for a PXE ramdisk ([`TpmAttestor::for_ramdisk`]), which
//! boots another chain.
//!
//! **Each challenge admits once.** A captured round-2 request stays valid
//! until the challenge's deadline, so the final round spends the challenge
//! in `attestation_uses` ([`crate::model::uses`]) in the join transaction, until
//! that deadline. The subject is the SHA-256 of the sealed state: each
//! round 1 seals a fresh state (a fresh secret and nonce) and nobody else
//! can make another sealing of it, so one subject is one issued challenge.
//! A round 2 that only files or finds a pending enrollment request spends
//! nothing (the agent starts over with a new challenge).
//!
//! **Where it joins**, keyed by the SHA-256 of the EK certificate's SPKI: the
//! node that EK is bound to (a reclaim); else a resolve entry (a pool, or a
//! node); else an enrollment join request: pending (a `JoinPending`
//! deferral; the agent waits and starts over), approved (admitted once, into
//! the request's pool) or denied (`enrollment-denied`). Only a machine that
//! proved its EK in round 2 reaches this point, so an EK certificate copied
//! off a machine files no request and learns nothing.
//!
//! **As what.** A resolve entry or an approval may name a site (the spec's
//! resolved result carries one): the new node is then a site node of that
//! site, as a site token's is. Like a token's role, the place fixes the
//! role: a new node placed with a site joins only with role `site`, one
//! placed without only with role `node`, else `tpm-role`. Admitting the
//! other role would drop what the operator said (a site node without its
//! site, which the lease refuses, or a plain node that holds a site).
//! A reclaim keeps its node's role and site (JoinService checks the role).

pub(crate) mod boot;
pub(crate) mod credential;
mod credential_ecc;
pub mod ek;
pub(crate) mod ek_ecc;
pub(crate) mod ek_service;
mod ek_template;
pub(crate) mod pcr;
mod reasons;
pub(crate) mod state;

use bc_wire::agent::{tpm_attestation, Role, TpmAnswer, TpmAttestation, TpmChallenge, TpmHello};
use bc_wire::pcr::PcrBank;
use bc_wire::tpm::{self as wtpm, Public};
use bc_wire::AttestorId;
use prost::Message;
use subtle::ConstantTimeEq;

use crate::model::attestor::{
    AttestInput, AttestationResult, Attestor, Deferral, Fault, NodeKey, Prepared, ProvenEk,
    Refusal, Verdict, Work,
};
use crate::model::boot_policy;
use crate::model::enroll;
use crate::model::machine::{EkAssurance, BINDING_TPM_EK};
use crate::model::records;
use crate::store::{LockKey, Tx};
use ek_service::{known, Claim, EkServices, EkServicesConfig, Fetched};
pub(crate) use pcr::PcrPolicy;
pub(crate) use reasons::TpmReason;
use state::{ChallengeKey, ChallengeState};

/// The longest a challenge may stay open (the spec: at most 5 minutes).
pub(crate) const MAX_CHALLENGE_TTL_MS: i64 = 5 * 60 * 1000;

const SECRET_LEN: usize = 32;

/// Whether a join must prove that its node key lives in the TPM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NodeKeyPolicy {
    /// An answer without a certification is refused (`node-key-not-certified`).
    #[default]
    Certified,
    /// An answer without one is admitted; the result then claims nothing
    /// about the key. A certification that is present is still verified.
    Any,
}

/// The `[tpm]` section of `controlplane.toml`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpmConfig {
    pub node_key: NodeKeyPolicy,
    /// How long a challenge can be answered (at most 5 minutes).
    pub(crate) challenge_ttl_ms: i64,
    /// `JoinPending.retry_after_seconds` while a request waits for an operator.
    pub(crate) enrollment_retry_after_seconds: u32,
    /// Whether an unknown EK files a join request for an operator (`true`,
    /// the default) or is refused (`unknown-ek`): a fleet that admits only
    /// what its resolve entries list.
    pub enrollment: bool,
    /// The PCR values a quote must have, in SHA-256 and/or SHA-1; every PCR
    /// the quoted bank lists must be in the quote.
    pub pcr_policy: PcrPolicy,
    /// `[tpm.ek_services]`: the makers' EK certificate services.
    pub ek_services: EkServicesConfig,
}

impl Default for TpmConfig {
    fn default() -> Self {
        TpmConfig {
            node_key: NodeKeyPolicy::Certified,
            challenge_ttl_ms: MAX_CHALLENGE_TTL_MS,
            enrollment_retry_after_seconds: 30,
            enrollment: true,
            pcr_policy: PcrPolicy::default(),
            ek_services: EkServicesConfig::default(),
        }
    }
}

pub(crate) struct TpmAttestor {
    config: TpmConfig,
    key: ChallengeKey,
    /// Whether a pool's boot policy applies (not to a PXE ramdisk, which
    /// boots another chain than the installed system the policy is about).
    boot_policies: bool,
    /// Shared with [`Self::for_ramdisk`]'s copy: one limit on fetches.
    services: std::sync::Arc<EkServices>,
}

/// A round that may have to ask the maker's service first.
pub(crate) enum Step<T> {
    Done(T),
    /// Fetch outside the transaction ([`Verdict::Prepare`]), then run the
    /// round again.
    Prepare(Work),
}

/// The fetch a round asks for ([`TpmAttestor::prepare_work`]).
struct CertificateFetch {
    ek_sha256: String,
    addressing: ek_service::Addressing,
    url: String,
    claim: Claim,
}

/// What the maker's service said about one EK, for the round that asked.
struct ServiceAnswer {
    ek_sha256: String,
    said: Said,
}

enum Said {
    Certificate(Vec<u8>),
    /// `404`: as no certificate at all.
    NotFound,
    /// Unreachable, an error, too slow, too large, past the budget.
    Failed,
}

/// Where the certificate of an EK the agent sent none for comes from.
enum Missing {
    /// The maker's service's (cached, or just fetched), verified as NV's.
    Certificate(Vec<u8>),
    /// None: the EK joins only pinned (else `ek-chain`).
    None,
    /// The service failed: the EK joins only pinned (else `ek-service`).
    Failed,
    /// Not before the machine proved the EK (round 2).
    Later,
    /// Fetch it first.
    Fetch(CertificateFetch),
}

impl TpmAttestor {
    pub(crate) fn new(config: TpmConfig, key: ChallengeKey) -> Self {
        let mut config = config;
        config.challenge_ttl_ms = config.challenge_ttl_ms.clamp(1, MAX_CHALLENGE_TTL_MS);
        let services = std::sync::Arc::new(EkServices::new(config.ek_services.clone()));
        TpmAttestor {
            config,
            key,
            boot_policies: true,
            services,
        }
    }

    /// The certificate of an EK the agent sent none for, from a TPM whose
    /// maker has a configured service ([`ek_service`]): what the fetch this
    /// round asked for gave, else the cache, else a fetch to ask for: in
    /// round 1 only for an EK the operator knows ([`known::is_known`]), in
    /// round 2 (`proven`) for any. Nothing for a TPM of another maker, an
    /// EK that does not parse (round 1 refuses it) or that the maker's
    /// addressing cannot name.
    fn service_certificate(
        &self,
        tx: &Tx<'_>,
        input: &AttestInput<'_>,
        ek_public: &[u8],
        manufacturer: u32,
        proven: bool,
    ) -> Result<Missing, Refusal> {
        let Some(service) = self.services.config().service_for(manufacturer) else {
            return Ok(Missing::None);
        };
        let (Ok(public), Ok(spki)) = (
            Public::parse(ek_public),
            bc_wire::ekcert::spki::public_spki_der(ek_public),
        ) else {
            return Ok(Missing::None);
        };
        let ek_sha256 = hex::encode(bc_wire::sha256(&spki));
        let maker = service.addressing.as_str();
        let answer = input
            .prepared
            .get::<ServiceAnswer>()
            .filter(|a| a.ek_sha256 == ek_sha256);
        if let Some(a) = answer {
            return Ok(match &a.said {
                Said::Certificate(der) => Missing::Certificate(der.clone()),
                Said::NotFound => Missing::None,
                Said::Failed => Missing::Failed,
            });
        }
        if let Some(c) = ek_service::cached(tx, &ek_sha256)? {
            tracing::info!(ek_sha256, service = %c.service, "tpm: no EK certificate sent; the maker's service's, cached");
            return Ok(Missing::Certificate(c.der));
        }
        if self.services.recently_not_found(&ek_sha256) {
            tracing::info!(
                ek_sha256,
                service = maker,
                "tpm: no EK certificate sent, and the maker's service said lately it has none"
            );
            return Ok(Missing::None);
        }
        let address = match ek_service::address(service.addressing, &public) {
            Ok(a) => a,
            Err(why) => {
                tracing::info!(ek_sha256, service = maker, "tpm: no EK certificate sent, and the maker's service cannot address this EK: {why}");
                return Ok(Missing::None);
            }
        };
        let claim = match known::is_known(tx, &ek_sha256, input.now)? {
            true => Claim::Known,
            false if proven => Claim::Proven,
            false => {
                tracing::info!(
                    ek_sha256,
                    service = maker,
                    "tpm: no EK certificate sent, for an EK no operator knows: challenged first, its certificate fetched once it answers"
                );
                return Ok(Missing::Later);
            }
        };
        Ok(Missing::Fetch(CertificateFetch {
            ek_sha256,
            addressing: service.addressing,
            url: service.url.replace("{ek}", &address),
            claim,
        }))
    }

    /// The fetch a round asked for ([`Step::Prepare`]), outside the join
    /// transaction, within `source`'s budget; a certificate for the EK's
    /// own key is cached in a write transaction of its own. A failure is
    /// left to the round to decide on (a pinned EK joins without).
    pub(crate) fn prepare_work(
        &self,
        db: &crate::store::Store,
        work: &Work,
        source: Option<std::net::IpAddr>,
    ) -> Result<Prepared, Refusal> {
        let Some(f) = work.get::<CertificateFetch>() else {
            return Err(Refusal::fault(Fault::Internal(
                "tpm: work of another attestor".to_owned(),
            )));
        };
        let (ek_sha256, url, maker) = (f.ek_sha256.as_str(), f.url.as_str(), f.addressing.as_str());
        let claim = match f.claim {
            Claim::Known => "known",
            Claim::Proven => "proven",
        };
        let started = std::time::Instant::now();
        let fetched = self
            .services
            .fetch(ek_sha256, url, ek_service::Source::of(source), f.claim);
        let ms = started.elapsed().as_millis();
        let said = match fetched {
            Ok(Fetched::Certificate(der)) => {
                let key_sha256 = x509_parser::parse_x509_certificate(&der)
                    .ok()
                    .map(|(_, c)| hex::encode(bc_wire::sha256(c.public_key().raw)));
                if key_sha256.as_deref() == Some(ek_sha256) {
                    db.write(|tx| {
                        let now = tx.now()?;
                        ek_service::cache(tx, ek_sha256, maker, url, &der, now)
                    })?;
                    tracing::info!(
                        ek_sha256,
                        service = maker,
                        url,
                        ms,
                        claim,
                        "tpm: EK certificate fetched from the maker's service, cached"
                    );
                } else {
                    tracing::warn!(ek_sha256, service = maker, url, ms, claim, "tpm: the maker's service answered a certificate for another key (not cached)");
                }
                Said::Certificate(der)
            }
            Ok(Fetched::NotFound) => {
                tracing::info!(
                    ek_sha256,
                    service = maker,
                    url,
                    ms,
                    claim,
                    "tpm: the maker's service has no certificate for this EK"
                );
                Said::NotFound
            }
            Err(e) => {
                tracing::warn!(ek_sha256, service = maker, url, ms, claim, source = ?source, error = %e, "tpm: the maker's EK certificate service gave no certificate");
                Said::Failed
            }
        };
        Ok(Prepared::new(ServiceAnswer {
            ek_sha256: f.ek_sha256.clone(),
            said,
        }))
    }

    /// The same verification for a PXE ramdisk proving its TPM beside
    /// discovery: the same challenge key and node-key policy, no PCR policy
    /// (`[tpm] pcr_policy` describes the installed system's boot chain; a
    /// ramdisk booted over PXE measures another one).
    pub(crate) fn for_ramdisk(&self) -> TpmAttestor {
        TpmAttestor {
            config: TpmConfig {
                pcr_policy: PcrPolicy::default(),
                ..self.config.clone()
            },
            key: self.key.clone(),
            boot_policies: false,
            services: self.services.clone(),
        }
    }

    /// Round 1, for `attestor` (this one, or one that composes with it):
    /// the EK verified, the AK's attributes, and the credential challenge
    /// (payload a `TpmChallenge`). Writes nothing. An EK the agent sent no
    /// certificate for whose maker has a service: the certificate fetched
    /// first if the operator knows the EK ([`Step::Prepare`]), else the EK
    /// challenged as it is, its certificate pending for round 2.
    pub(crate) fn challenge(
        &self,
        tx: &Tx<'_>,
        input: &AttestInput<'_>,
        hello: &TpmHello,
        attestor: AttestorId,
    ) -> Result<Step<Challenge>, Refusal> {
        let mut pending = None;
        let (ek, assurance) = if !hello.ek_certificate.is_empty() {
            let ek = verified(
                tx,
                &hello.ek_certificate,
                &hello.ek_public,
                &hello.ek_intermediates,
                input.now,
            )?;
            (ek, reported_assurance(hello))
        } else {
            let missing = self.service_certificate(
                tx,
                input,
                &hello.ek_public,
                hello.tpm_manufacturer,
                false,
            )?;
            match missing {
                Missing::Fetch(f) => return Ok(Step::Prepare(Work::new(f))),
                Missing::Certificate(der) => {
                    let ek = verified(
                        tx,
                        &der,
                        &hello.ek_public,
                        &hello.ek_intermediates,
                        input.now,
                    )?;
                    (ek, EkAssurance::MakerService)
                }
                Missing::None => (uncertified(tx, &hello.ek_public)?, EkAssurance::Pinned),
                Missing::Failed => (service_failed(tx, &hello.ek_public)?, EkAssurance::Pinned),
                Missing::Later => {
                    let (ek, p) = pending_certificate(hello)?;
                    pending = Some(p);
                    (ek, EkAssurance::MakerService)
                }
            }
        };
        let ak = Public::parse(&hello.ak_public)
            .ok()
            .filter(wtpm::is_attestation_key)
            .ok_or_else(|| Refusal::new(TpmReason::AkAttributes))?;
        let secret: [u8; SECRET_LEN] = crate::ids::random_bytes()
            .map_err(|e| Refusal::fault(Fault::Internal(format!("random secret: {e}"))))?;
        let made = credential::make_credential(ek.template, &ek.spki_der, &ak.name(), &secret)
            .map_err(|e| Refusal::fault(Fault::Internal(format!("MakeCredential: {e}"))))?;
        // The boot policy of the pool this EK would join, if any: its PCRs
        // quoted in every bank, with the event log. Asked by the place it
        // has now (round 2 checks the place it has then).
        let boot_pcrs = match self.boot_policies {
            true => boot_policy_pcrs(tx, &hex::encode(ek.spki_sha256))?,
            false => None,
        };
        let mut pcrs = self.config.pcr_policy.pcrs();
        if let Some(boot) = &boot_pcrs {
            pcrs.extend(boot);
            pcrs.sort_unstable();
            pcrs.dedup();
        }
        let not_after = input.now.saturating_add(self.config.challenge_ttl_ms);
        let awaited = pending.is_some();
        let sealed = ChallengeState {
            ek_spki_sha256: ek.spki_sha256,
            ek_issuer: ek.issuer,
            ek_serial: ek.serial,
            ak_public: hello.ak_public.clone(),
            secret,
            not_after,
            ek_assurance: assurance.as_str().to_owned(),
            pending,
        }
        .seal(&self.key, &input.csr_sha256)
        .map_err(|e| Refusal::fault(Fault::Internal(e.to_string())))?;
        let payload = TpmChallenge {
            id_object: made.id_object,
            encrypted_secret: made.encrypted_secret,
            state: sealed,
            // The agent quotes only what the policies check: no PCR_Read without one.
            pcrs,
            pcr_banks: self.config.pcr_policy.bank_algs(),
            // With no PCR to quote, a certification over the nonce will do.
            fresh_certification: true,
            event_log: boot_pcrs.is_some(),
        }
        .encode_to_vec();
        tracing::info!(
            ek_sha256 = %hex::encode(ek.spki_sha256),
            ek = ek.template.as_str(),
            ek_assurance = assurance.as_str(),
            ek_certificate = if awaited { "pending" } else { "verified" },
            event_log = boot_pcrs.is_some(),
            tpm_manufacturer = %ek_service::manufacturer_text(hello.tpm_manufacturer),
            tpm_vendor = %ek_service::vendor_text(&hello.tpm_vendor),
            tpm_firmware = format_args!("{:016x}", hello.tpm_firmware),
            attestor = attestor.as_str(),
            "tpm: EK verified, credential challenge sent"
        );
        Ok(Step::Done(Challenge {
            ek_sha256: hex::encode(ek.spki_sha256),
            deferral: Deferral::Challenge {
                attestor,
                payload,
                not_after,
            },
        }))
    }

    /// Round 2's proof, whoever composes it: the state is ours, for this
    /// CSR, in time and not answered before; the secret; the quote (or its
    /// absence); the node key's certification; then, for an EK challenged
    /// before its certificate was known, that certificate (fetched now that
    /// the machine proved it holds the EK: [`Step::Prepare`]) verified as
    /// round 1 verifies one. Spends nothing: the final round calls
    /// [`Self::spend`].
    pub(crate) fn prove(
        &self,
        tx: &Tx<'_>,
        input: &AttestInput<'_>,
        answer: &TpmAnswer,
    ) -> Result<Step<TpmProof>, Refusal> {
        let mut st = ChallengeState::open(&self.key, &answer.state, &input.csr_sha256)
            .map_err(|_| Refusal::new(TpmReason::ChallengeState))?;
        if input.now > st.not_after {
            return Err(Refusal::new(TpmReason::ChallengeExpired));
        }
        let subject = challenge_subject(&answer.state);
        if crate::model::uses::is_spent(tx, AttestorId::Tpm, &subject)? {
            return Err(Refusal::new(TpmReason::ChallengeReused));
        }
        if !bool::from(answer.secret.as_slice().ct_eq(st.secret.as_slice())) {
            return Err(Refusal::new(TpmReason::ChallengeSecret));
        }
        // We sealed it, so it parsed in round 1.
        let ak =
            Public::parse(&st.ak_public).map_err(|_| Refusal::new(TpmReason::ChallengeState))?;
        let (qualifying, quoted) = self.check_quote(&ak, input, answer, &st.secret)?;
        let node_key = self.check_node_key(&ak, input, answer, &qualifying)?;
        if let Some(pending) = st.pending.take() {
            let (ek, assurance) = match self.certify_pending(tx, input, &pending)? {
                Step::Done(done) => done,
                Step::Prepare(work) => return Ok(Step::Prepare(work)),
            };
            tracing::info!(
                ek_sha256 = %hex::encode(ek.spki_sha256),
                ek_assurance = assurance.as_str(),
                "tpm: the EK that answered the challenge is verified"
            );
            st.ek_spki_sha256 = ek.spki_sha256;
            st.ek_issuer = ek.issuer;
            st.ek_serial = ek.serial;
            st.ek_assurance = assurance.as_str().to_owned();
        }
        Ok(Step::Done(TpmProof {
            ek_sha256: hex::encode(st.ek_spki_sha256),
            // We sealed it, so it is one of ours.
            ek_assurance: EkAssurance::parse(&st.ek_assurance),
            node_key,
            quoted,
            subject,
            st,
        }))
    }

    /// The certificate of an EK that round 1 challenged without one and
    /// that has now answered: the maker's service's (fetched first if need
    /// be), verified against the EK round 1 challenged and the
    /// intermediates it sent; else as round 1 would have refused it: no
    /// certificate is `ek-chain`, a failed service `ek-service`, unless the
    /// EK is pinned uncertified.
    fn certify_pending(
        &self,
        tx: &Tx<'_>,
        input: &AttestInput<'_>,
        pending: &state::PendingCertificate,
    ) -> Result<Step<(ek::VerifiedEk, EkAssurance)>, Refusal> {
        let missing =
            self.service_certificate(tx, input, &pending.ek_public, pending.manufacturer, true)?;
        Ok(Step::Done(match missing {
            Missing::Fetch(f) => return Ok(Step::Prepare(Work::new(f))),
            Missing::Certificate(der) => {
                let ek = verified(
                    tx,
                    &der,
                    &pending.ek_public,
                    &pending.intermediates,
                    input.now,
                )?;
                (ek, EkAssurance::MakerService)
            }
            // A service that is no longer configured, or cannot name it.
            Missing::None | Missing::Later => {
                (uncertified(tx, &pending.ek_public)?, EkAssurance::Pinned)
            }
            Missing::Failed => (service_failed(tx, &pending.ek_public)?, EkAssurance::Pinned),
        }))
    }

    /// Spends the challenge `proof` answered (with the join: rolled back
    /// with a refusal). Every attestor spends it under `tpm`, so one
    /// challenge admits one join whichever attestor it was answered to.
    pub(crate) fn spend(
        &self,
        tx: &Tx<'_>,
        proof: &TpmProof,
        now: crate::store::UnixMs,
    ) -> Result<(), Refusal> {
        if !crate::model::uses::spend(tx, AttestorId::Tpm, &proof.subject, proof.st.not_after, now)?
        {
            return Err(Refusal::new(TpmReason::ChallengeReused));
        }
        Ok(())
    }

    fn answer(
        &self,
        tx: &Tx<'_>,
        input: &AttestInput<'_>,
        answer: &TpmAnswer,
    ) -> Result<Verdict, Refusal> {
        let proof = match self.prove(tx, input, answer)? {
            Step::Done(proof) => proof,
            Step::Prepare(work) => return Ok(Verdict::Prepare(work)),
        };
        let place = place(tx, input, &proof.ek_sha256, &proof.st, &self.config)?;
        let (reclaim_node_id, pool_id, site_id) = match place {
            Place::Deferred(d) => return Ok(Verdict::Defer(d)),
            Place::Join { node, pool, site } => (node, pool, site),
        };
        let boot = match self.boot_policies {
            true => check_boot(
                tx,
                reclaim_node_id.as_deref(),
                pool_id.as_deref(),
                answer,
                &proof,
            )?,
            false => None,
        };
        // The final round.
        self.spend(tx, &proof, input.now)?;
        let TpmProof {
            ek_sha256,
            ek_assurance,
            node_key,
            ..
        } = proof;
        Ok(Verdict::Admit(Box::new(AttestationResult {
            roles: placed_roles(reclaim_node_id.as_deref(), site_id.as_deref()),
            reclaim_node_id,
            token_id: None,
            node_key,
            ek: Some(ProvenEk {
                sha256: ek_sha256,
                assurance: ek_assurance,
                bound: true,
            }),
            pool_id,
            // A site node of the site its place names, as a site token's.
            scope: site_id.map(|site_id| {
                Box::new(records::NodeScope {
                    site_id: Some(site_id),
                    ..Default::default()
                })
            }),
            // No token: nothing to bind.
            expect: Default::default(),
            // The claimed product UUID is only a claim (the joins row
            // records it): the EK is this machine's hardware key.
            proven_product_uuid: None,
            boot: boot.map(Box::new),
            ..AttestationResult::default()
        })))
    }

    /// The quote, or its absence (`fresh_certification`); returns what the
    /// node key's certification must be qualified by and, for an answer
    /// with an event log, the quoted values of every bank.
    fn check_quote(
        &self,
        ak: &Public,
        input: &AttestInput<'_>,
        answer: &TpmAnswer,
        secret: &[u8; SECRET_LEN],
    ) -> Result<([u8; 32], Option<bc_eventlog::PcrValues>), Refusal> {
        let mut nonce_input = secret.to_vec();
        nonce_input.extend_from_slice(&input.csr_sha256);
        let nonce = bc_wire::sha256(&nonce_input);
        if answer.quote.is_empty() {
            // The node key's certification over the nonce is then the AK's
            // signature over it, as a quote of no PCR would be.
            let bare = answer.quote_signature.is_empty() && answer.pcr_values.is_empty();
            if !bare || !self.config.pcr_policy.is_empty() {
                return Err(Refusal::new(TpmReason::QuoteSignature));
            }
            if answer.node_key.is_none() {
                return Err(Refusal::new(match self.config.node_key {
                    NodeKeyPolicy::Certified => TpmReason::NodeKeyNotCertified,
                    NodeKeyPolicy::Any => TpmReason::QuoteSignature,
                }));
            }
            return Ok((nonce, None));
        }
        let (selection, pcr_digest) =
            boot::verified_quote(ak, &answer.quote, &answer.quote_signature, &nonce)
                .map_err(|c| Refusal::new(TpmReason::from(c)))?;
        let (selection, pcr_digest) = (&selection, &pcr_digest);
        if !answer.event_log.is_empty() {
            // A boot policy's quote: every populated bank at once.
            let banks = pcr::quoted_banks(selection, &answer.pcr_values, pcr_digest)
                .ok_or_else(|| Refusal::new(TpmReason::QuotePcrs))?;
            let met = banks.iter().any(|(alg, values)| {
                PcrBank::from_alg(u32::from(alg.id())).is_some_and(|bank| {
                    let quoted = values.iter().map(|(i, v)| (*i, v.as_slice())).collect();
                    self.config.pcr_policy.is_met(bank, &quoted)
                })
            });
            if !met && !self.config.pcr_policy.is_empty() {
                return Err(Refusal::new(TpmReason::PcrPolicy));
            }
            return Ok((input.csr_sha256, Some(banks)));
        }
        let (bank, pcrs) = pcr::quoted_pcrs(selection, &answer.pcr_values, pcr_digest)
            .ok_or_else(|| Refusal::new(TpmReason::QuotePcrs))?;
        if !self.config.pcr_policy.is_met(bank, &pcrs) {
            return Err(Refusal::new(TpmReason::PcrPolicy));
        }
        Ok((input.csr_sha256, None))
    }

    fn check_node_key(
        &self,
        ak: &Public,
        input: &AttestInput<'_>,
        answer: &TpmAnswer,
        qualifying: &[u8],
    ) -> Result<NodeKey, Refusal> {
        let Some(cert) = &answer.node_key else {
            return match self.config.node_key {
                NodeKeyPolicy::Certified => Err(Refusal::new(TpmReason::NodeKeyNotCertified)),
                NodeKeyPolicy::Any => Ok(NodeKey::Unattested),
            };
        };
        wtpm::verify_key_certification(
            ak,
            &cert.public,
            &cert.certify_info,
            &cert.signature,
            qualifying,
            input.csr_spki_der,
        )
        .map_err(|e| Refusal::new(TpmReason::node_key(&e)))?;
        let statement = wtpm::ak_statement(&ak.name())
            .map_err(|e| Refusal::fault(Fault::Internal(format!("AK statement: {e}"))))?;
        Ok(NodeKey::Tpm { statement })
    }
}

/// Round 1's outcome: the challenge to send, and the EK it is for (not
/// proven yet: only round 2 proves it).
pub(crate) struct Challenge {
    pub ek_sha256: String,
    pub deferral: Deferral,
}

/// What a round 2 proved ([`TpmAttestor::prove`]).
pub(crate) struct TpmProof {
    /// The EK, lowercase hex SHA-256 of its SPKI.
    pub ek_sha256: String,
    pub ek_assurance: Option<EkAssurance>,
    /// With the AK statement, when the node key was certified.
    pub node_key: NodeKey,
    /// Every quoted bank's values, when the answer carried an event log.
    quoted: Option<bc_eventlog::PcrValues>,
    /// The challenge's `attestation_uses` subject.
    subject: String,
    st: ChallengeState,
}

impl TpmProof {
    /// The EK certificate's issuer, as round 1 verified it (empty: pinned).
    pub(crate) fn ek_issuer(&self) -> &str {
        &self.st.ek_issuer
    }

    /// The EK certificate's serial (empty: pinned).
    pub(crate) fn ek_serial(&self) -> &str {
        &self.st.ek_serial
    }
}

/// The assurance of a certificate the agent sent, by its report of where
/// it took it from (a bcd before the report read NV only).
fn reported_assurance(hello: &TpmHello) -> EkAssurance {
    use bc_wire::agent::EkCertificateSource as S;
    match S::try_from(hello.ek_certificate_source) {
        Ok(S::OperatorFile) => EkAssurance::OperatorFile,
        _ if hello.ek_nv_intermediates > 0 => EkAssurance::NvChain,
        _ => EkAssurance::Nv,
    }
}

/// An EK that sent no certificate: admitted only when a resolve entry pins
/// exactly that EK as uncertified (`resolve add --ek-sha256 H
/// --uncertified`, the spec's allowUncertifiedEk); any other is refused
/// `ek-chain`, as an EK certificate with no path to a root is. A pinned EK
/// that does send a certificate never comes here: it is verified as usual.
fn uncertified(tx: &Tx<'_>, ek_public: &[u8]) -> Result<ek::VerifiedEk, Refusal> {
    let ek = ek::uncertified_ek(ek_public).map_err(ek_refused)?;
    let ek_sha256 = hex::encode(ek.spki_sha256);
    match enroll::resolve_entry(tx, &ek_sha256)? {
        Some(entry) if entry.uncertified => {
            tracing::info!(
                ek_sha256,
                "tpm: no EK certificate; the EK is pinned (resolve add --uncertified)"
            );
            Ok(ek)
        }
        _ => {
            tracing::info!(
                ek_sha256,
                "tpm: no EK certificate and no resolve entry pins this EK as uncertified"
            );
            Err(Refusal::new(TpmReason::EkChain))
        }
    }
}

/// An EK certificate verified against the configured roots and the
/// agent's intermediates, for `ek_public`.
fn verified(
    tx: &Tx<'_>,
    certificate: &[u8],
    ek_public: &[u8],
    intermediates: &[Vec<u8>],
    now: crate::store::UnixMs,
) -> Result<ek::VerifiedEk, Refusal> {
    let trust = ek::trust(tx)?;
    ek::verify_ek(certificate, ek_public, &trust, intermediates, now).map_err(ek_refused)
}

/// The refusal of an EK (its certificate, or its public area).
fn ek_refused(e: ek::EkError) -> Refusal {
    tracing::debug!(error = %e, "tpm: EK refused");
    Refusal::new(e.reason())
}

/// An EK whose maker's service gave no usable answer: admitted only when
/// pinned as uncertified ([`uncertified`]), else `ek-service` (the agent
/// asks again).
fn service_failed(tx: &Tx<'_>, ek_public: &[u8]) -> Result<ek::VerifiedEk, Refusal> {
    let pinned = match bc_wire::ekcert::spki::public_spki_der(ek_public) {
        Ok(spki) => enroll::resolve_entry(tx, &hex::encode(bc_wire::sha256(&spki)))?
            .is_some_and(|entry| entry.uncertified),
        Err(_) => false,
    };
    match pinned {
        true => uncertified(tx, ek_public),
        false => Err(Refusal::new(TpmReason::EkService)),
    }
}

/// Round 1 of an EK no operator knows, sent without a certificate that its
/// maker's service may hold: the EK challenged as it is (it must be a TCG
/// default template, as a pinned one), and what round 2 needs to fetch and
/// verify its certificate. Intermediates past what a chain may hold are
/// refused now, as they would be with a certificate (`ek-chain`).
fn pending_certificate(
    hello: &TpmHello,
) -> Result<(ek::VerifiedEk, state::PendingCertificate), Refusal> {
    let ek = ek::uncertified_ek(&hello.ek_public).map_err(ek_refused)?;
    let bytes: usize = hello.ek_intermediates.iter().map(Vec::len).sum();
    if hello.ek_intermediates.len() > bc_wire::ekcert::MAX_AGENT_INTERMEDIATES
        || bytes > state::MAX_PENDING_INTERMEDIATES_LEN
    {
        tracing::info!(
            intermediates = hello.ek_intermediates.len(),
            bytes,
            "tpm: EK refused: more intermediates than a chain holds"
        );
        return Err(Refusal::new(TpmReason::EkChain));
    }
    Ok((
        ek,
        state::PendingCertificate {
            ek_public: hello.ek_public.clone(),
            manufacturer: hello.tpm_manufacturer,
            intermediates: hello.ek_intermediates.clone(),
        },
    ))
}

/// The `attestation_uses` subject of a challenge: the hex SHA-256 of its
/// sealed state (which opened, so it is one we issued).
fn challenge_subject(sealed_state: &[u8]) -> String {
    hex::encode(bc_wire::sha256(sealed_state))
}

/// The PCRs of the boot policy of the pool the EK would join now (none:
/// no policy there, or no place yet: a pending request starts over).
fn boot_policy_pcrs(tx: &Tx<'_>, ek_sha256: &str) -> Result<Option<Vec<u32>>, Refusal> {
    let pool = if let Some(b) = records::binding_by_key(tx, BINDING_TPM_EK, ek_sha256)? {
        joined_pool(tx, Some(&b.node_id), None)?
    } else if let Some(entry) = enroll::resolve_entry(tx, ek_sha256)? {
        joined_pool(tx, entry.node_id.as_deref(), entry.pool_id.as_deref())?
    } else {
        match enroll::open_request(tx, ek_sha256)? {
            Some(req) if matches!(req.status, enroll::RequestStatus::Approved) => {
                joined_pool(tx, None, req.pool_id.as_deref())?
            }
            _ => return Ok(None),
        }
    };
    Ok(boot_policy::pool_boot_policy(tx, &pool)?.map(|p| boot_policy::needed_pcrs(&p)))
}

/// The pool a join placed at `node` or `pool` ends in, as JoinService
/// decides it: a node's own, else the one named, else `default`.
fn joined_pool(
    tx: &Tx<'_>,
    node: Option<&str>,
    pool: Option<&str>,
) -> Result<String, crate::store::DbError> {
    if let Some(id) = node {
        if let Some(row) = records::node_including_deleted(tx, id)? {
            return Ok(row.pool_id);
        }
    }
    Ok(pool.unwrap_or(crate::model::pools::DEFAULT_POOL).to_owned())
}

/// The pool's boot policy, when it has one, against the answer's event log
/// and quote ([`boot::judge`]): the boot it verified, or a refusal naming
/// the pool, and the digest or value and event that failed.
fn check_boot(
    tx: &Tx<'_>,
    node: Option<&str>,
    pool: Option<&str>,
    answer: &TpmAnswer,
    proof: &TpmProof,
) -> Result<Option<crate::model::node_boot::VerifiedBoot>, Refusal> {
    let pool_id = joined_pool(tx, node, pool)?;
    let Some(policy) = boot_policy::pool_boot_policy(tx, &pool_id)? else {
        return Ok(None);
    };
    let owner = crate::model::pools::get(tx, &pool_id)?
        .map(|p| p.owner)
        .unwrap_or_default();
    let none = bc_eventlog::PcrValues::new();
    let quoted = proof.quoted.as_ref().unwrap_or(&none);
    let facts = boot::judge(&policy, &answer.event_log, quoted).map_err(|f| {
        tracing::info!(pool = %pool_id, reason = %TpmReason::from(f.check), detail = f.detail.as_deref().unwrap_or(""), "tpm: the boot does not meet the pool's boot policy");
        let r = Refusal::new(TpmReason::from(f.check));
        let r = match f.detail {
            Some(d) => r.with_detail(d, f.event),
            None => r,
        };
        r.with_node(node).with_pool(&pool_id, &owner)
    })?;
    tracing::info!(
        pool = %pool_id,
        secure_boot = facts.secure_boot_enabled(),
        "tpm: the event log replays and meets the pool's boot policy"
    );
    Ok(Some(crate::model::node_boot::VerifiedBoot::of(&facts)))
}

enum Place {
    Join {
        node: Option<String>,
        pool: Option<String>,
        /// A new node's site (it joins as a site node of it).
        site: Option<String>,
    },
    Deferred(Deferral),
}

/// The one role a new node's place admits: `site` when it names a site,
/// else `node` (JoinService refuses any other with `tpm-role`, and its
/// rollback un-marks the approval). A reclaim keeps its node's role, which
/// JoinService checks against the node.
fn placed_roles(reclaim: Option<&str>, site: Option<&str>) -> Option<Vec<Role>> {
    match (reclaim, site) {
        (Some(_), _) => None,
        (None, Some(_)) => Some(vec![Role::Site]),
        (None, None) => Some(vec![Role::Node]),
    }
}

/// Where a machine that proved its EK joins: its bound node, else the live
/// node (role node) whose hardware key is that EK, proven by the machine's
/// commissioning ramdisk (issue 30: the installed system reclaims the node
/// it was deployed as), else a resolve entry, else enrollment (when
/// `[tpm] enrollment` is on; else `unknown-ek`).
fn place(
    tx: &Tx<'_>,
    input: &AttestInput<'_>,
    ek_sha256: &str,
    st: &ChallengeState,
    config: &TpmConfig,
) -> Result<Place, Refusal> {
    let retry_after_seconds = config.enrollment_retry_after_seconds;
    // PG: an advisory lock on `tpm-ek:<sha>`: this EK's binding, resolve and
    // request reads stand until its writes commit (one pending request, an
    // approved request used once).
    tx.lock(&[LockKey {
        namespace: "tpm-ek",
        key: ek_sha256,
    }])?;
    if let Some(b) = records::binding_by_key(tx, BINDING_TPM_EK, ek_sha256)? {
        return Ok(Place::Join {
            node: Some(b.node_id),
            pool: None,
            site: None,
        });
    }
    let proven = crate::model::hardware::HardwareKey {
        key: format!("{BINDING_TPM_EK}:{ek_sha256}"),
        product_uuid: None,
    };
    if let Some(node) = crate::model::hardware::holder(tx, &proven, "node", None)? {
        return Ok(Place::Join {
            node: Some(node),
            pool: None,
            site: None,
        });
    }
    if let Some(entry) = enroll::resolve_entry(tx, ek_sha256)? {
        return Ok(Place::Join {
            node: entry.node_id,
            pool: entry.pool_id,
            site: entry.site_id,
        });
    }
    if !config.enrollment {
        tracing::info!(
            ek_sha256,
            "tpm: unknown TPM refused ([tpm] enrollment = false files no join request)"
        );
        return Err(Refusal::new(TpmReason::UnknownEk));
    }
    match enroll::open_request(tx, ek_sha256)? {
        None => {
            let req = enroll::insert_pending(
                tx,
                AttestorId::Tpm,
                ek_sha256,
                &st.ek_issuer,
                &st.ek_serial,
                input.now,
            )?;
            tracing::info!(request_id = %req.id, ek_sha256, "tpm: unknown TPM, join request filed");
            Ok(Place::Deferred(Deferral::Pending {
                request_id: req.id,
                retry_after_seconds,
            }))
        }
        Some(req) => match req.status {
            enroll::RequestStatus::Pending => Ok(Place::Deferred(Deferral::Pending {
                request_id: req.id,
                retry_after_seconds,
            })),
            enroll::RequestStatus::Approved => {
                enroll::mark_used(tx, &req.id, input.now)?;
                Ok(Place::Join {
                    node: None,
                    pool: req.pool_id,
                    site: req.site_id,
                })
            }
            _ => Err(Refusal::new(TpmReason::EnrollmentDenied)),
        },
    }
}

impl Attestor for TpmAttestor {
    fn id(&self) -> AttestorId {
        AttestorId::Tpm
    }

    fn roles(&self) -> crate::model::attestor::Roles {
        crate::model::attestor::Roles {
            admits: &[Role::Node, Role::Site],
            refusal: Some(TpmReason::Role.any()),
        }
    }

    fn prepare(
        &self,
        db: &crate::store::Store,
        work: &Work,
        source: Option<std::net::IpAddr>,
    ) -> Result<Prepared, Refusal> {
        self.prepare_work(db, work, source)
    }

    fn verify(&self, tx: &Tx<'_>, input: &AttestInput<'_>) -> Result<Verdict, Refusal> {
        let evidence = TpmAttestation::decode(input.evidence)
            .map_err(|_| Refusal::new(TpmReason::EvidenceMalformed))?;
        match &evidence.round {
            Some(tpm_attestation::Round::Hello(h)) => {
                Ok(match self.challenge(tx, input, h, AttestorId::Tpm)? {
                    Step::Done(c) => Verdict::Defer(c.deferral),
                    Step::Prepare(work) => Verdict::Prepare(work),
                })
            }
            Some(tpm_attestation::Round::Answer(a)) => self.answer(tx, input, a),
            None => Err(Refusal::new(TpmReason::EvidenceMalformed)),
        }
    }
}

#[cfg(test)]
mod tests;
