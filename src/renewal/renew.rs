//! One renewal (`renew_once`): the next key, its proof when the certificate
//! names an AK, `Renew` over mTLS with the current key, the answer checked,
//! and the identity rotated (see [`crate::identity::rotation`]).
//!
//! Under a pool's boot policy the control plane answers the first request
//! with a boot challenge (the PCRs the policy needs now, and a nonce bound
//! to this CSR): the same request goes again with the event log and a quote
//! over `sha256(nonce ‖ sha256(csr))` of those PCRs in every populated bank,
//! taken beside a new certification of the next key in one TPM connection
//! ([`boot_evidence`]). The node learns of the policy from that answer
//! alone, so one the operator sets or changes applies at the next renewal,
//! and a node whose pool has none sends exactly what it sent before.
use std::sync::Arc;

use bc_wire::agent::{RenewBootChallenge, RenewBootEvidence, RenewRequest, TpmKeyAttestation};

use crate::client::renew::{self as answer, RenewAnswer, RenewExpected};
use crate::client::{Client, ClientError};
use crate::config::Config;
use crate::identity::rotation::{self, CrashPoints, NextKey, RotateError, Unanswered};
use crate::identity::Identity;
use crate::keys::{self, Holder, KeyHolder, NodeKey, TpmAccess};
use crate::pki::rfc3339;
use crate::{clock, failpoint};

/// What the log and the journal say when the control plane refuses.
pub(crate) const REFUSED: &str = "renewal refused by the control plane (Renew refused)";

/// The spec's words when the TPM holds another AK than the certificate names.
pub(crate) const OTHER_AK: &str =
    "the TPM's AK is not the one the certificate names (another TPM, or its endorsement seed changed)";

#[derive(Debug, thiserror::Error)]
pub(crate) enum RenewError {
    /// ACCESS_DENIED: the reason stays on the control plane.
    #[error("{REFUSED}")]
    Refused,
    /// ACCESS_DENIED for this machine's boot, in the control plane's words
    /// (its reason and what failed).
    #[error("renewal refused by the control plane, {0}: boot what the pool's boot policy allows (or have its operator allow this boot: bc-controlplane pools update --boot-policy), and bcd node renews at its next attempt")]
    BootRefused(String),
    /// Nothing changed on disk (a staged next key aside).
    #[error("{0:#}")]
    Failed(anyhow::Error),
    /// The answer was accepted, but the rotation did not finish: what is on
    /// disk must be loaded again (it loads as the old or the new identity).
    #[error("{0:#}")]
    Unsaved(anyhow::Error),
}

impl From<anyhow::Error> for RenewError {
    fn from(e: anyhow::Error) -> Self {
        RenewError::Failed(e)
    }
}

/// Renews `current`; the new identity, already on disk, when it worked.
///
/// `staged` is the next key of an earlier failed attempt for `current`, if
/// any: it is sent again (made and staged here otherwise) and stays staged
/// when the control plane cannot be reached or refuses, for the next try.
pub(crate) async fn renew_once(
    config: &Config,
    tpm: &TpmAccess,
    current: &Identity,
    staged: &mut Option<NextKey>,
) -> Result<Identity, RenewError> {
    let dir = &config.data_dir;
    let statement = current.cert.ak_statement();
    // A key staged for a re-join carries no certification; one is made.
    if statement.is_some() && staged.as_ref().is_some_and(|s| s.certified.is_none()) {
        *staged = None;
    }
    let make = || next_key(config, tpm, statement).inspect_err(|_| rotation::abandon(dir));
    let exchange = |next: NextKey| async move {
        let chain = match send(config, current, &next, None)
            .await
            .map_err(Unanswered::Retry)?
        {
            RenewAnswer::Chain(chain) => chain,
            RenewAnswer::Boot(challenge) => {
                let proof = boot_evidence(config, tpm, statement, &next, &challenge)
                    .map_err(|e| Unanswered::Retry(RenewError::Failed(e)))?;
                match send(config, current, &next, Some(proof))
                    .await
                    .map_err(Unanswered::Retry)?
                {
                    RenewAnswer::Chain(chain) => chain,
                    RenewAnswer::Boot(_) => {
                        return Err(Unanswered::Retry(RenewError::Failed(anyhow::anyhow!(
                            "the control plane asked for boot evidence again after this node sent it (its challenge expired, or the pool's boot policy changed meanwhile): the next attempt starts over"
                        ))))
                    }
                }
            }
        };
        let expected = RenewExpected {
            node_id: &current.node_id,
            trust_domain: &current.trust_domain,
            next_spki: next.key.spki_der(),
            statement,
            issuer: current.chain.get(1).map(Vec::as_slice),
            now: clock::now(),
        };
        let cert = answer::verify_answer(&chain, &expected)
            .map_err(|e| Unanswered::Abandon(RenewError::Failed(e.into())))?;
        Ok(Identity {
            node_id: current.node_id.clone(),
            role: current.role,
            trust_domain: current.trust_domain.clone(),
            attestor: current.attestor.clone(),
            joined_at: current.joined_at,
            chain,
            cert,
            key: next.key,
        })
    };
    let points = CrashPoints {
        after_answer: "renew-after-answer",
        between_renames: "renew-between-renames",
    };
    let renewed = rotation::rotate(dir, staged, make, exchange, points)
        .await
        .map_err(|e| match e {
            RotateError::Failed(e) => e,
            RotateError::Stage(e) => {
                rotation::abandon(dir);
                RenewError::Failed(anyhow::Error::new(e).context(
                    "the control plane renewed the certificate, but it could not be saved",
                ))
            }
            RotateError::Commit(e) => RenewError::Unsaved(
                anyhow::Error::new(e).context("the renewed identity could not be moved into place"),
            ),
        })?;
    tracing::info!(
        node_id = %renewed.node_id,
        not_after = %rfc3339(renewed.cert.not_after),
        node_key = %renewed.key.kid(),
        key_in = renewed.key.kind().as_str(),
        statement = statement.unwrap_or(""),
        "renewed the certificate"
    );
    Ok(renewed)
}

/// A new next key, staged to `node.key.next`, with its CSR and, when the
/// certificate names an AK (`statement`), that AK's certification of it.
fn next_key(
    config: &Config,
    tpm: &TpmAccess,
    statement: Option<&str>,
) -> Result<NextKey, RenewError> {
    let dir = &config.data_dir;
    match statement {
        Some(statement) => {
            let (key, csr, proof) = certified_next_key(tpm, statement, |k| {
                rotation::stage_key(dir, k).map_err(anyhow::Error::new)
            })?;
            Ok(NextKey {
                key: Arc::from(key),
                csr,
                certified: Some(proof),
            })
        }
        None => {
            // TPM when there is one (a file key moves in here), else a file.
            let key: Arc<dyn NodeKey> =
                Arc::from(keys::generate(tpm, false).map_err(anyhow::Error::new)?);
            rotation::stage_key(dir, key.as_ref()).map_err(anyhow::Error::new)?;
            let csr = keys::make_csr(key.as_ref()).map_err(anyhow::Error::new)?;
            Ok(NextKey {
                key,
                csr,
                certified: None,
            })
        }
    }
}

/// The `Renew` call for `next` over mTLS with the current key, with the
/// answer to a boot challenge (a new certification of the key and the boot
/// evidence) when there is one.
async fn send(
    config: &Config,
    current: &Identity,
    next: &NextKey,
    boot: Option<(TpmKeyAttestation, RenewBootEvidence)>,
) -> Result<RenewAnswer, RenewError> {
    failpoint::hit("renew-before-request");
    let client = Client::with_identity(config, &current.chain, current.key.clone())
        .map_err(anyhow::Error::new)?;
    tracing::info!(
        api = %client.api(),
        node_id = %current.node_id,
        current_key = %current.key.kid(),
        next_key = %next.key.kid(),
        key_in = next.key.kind().as_str(),
        certified = next.certified.is_some(),
        boot_evidence = boot.is_some(),
        "renewing the certificate"
    );
    let (key_attestation, boot) = match boot {
        Some((certified, evidence)) => (Some(certified), Some(evidence)),
        None => (next.certified.clone(), None),
    };
    let request = RenewRequest {
        csr: next.csr.clone(),
        key_attestation,
        boot,
    };
    client.renew(&request).await.map_err(|e| match e {
        ClientError::AccessDenied => RenewError::Refused,
        ClientError::BootRefused(why) => RenewError::BootRefused(why),
        e => RenewError::Failed(e.into()),
    })
}

/// The answer to a boot challenge for `next`: the staged next key certified
/// again over sha256(csr) and the AK's quote of the challenge's PCRs over
/// `sha256(nonce ‖ sha256(csr))`, in one TPM connection (one helper call
/// under `[helper]`), and the event log (read by the helper there).
fn boot_evidence(
    config: &Config,
    tpm: &TpmAccess,
    statement: Option<&str>,
    next: &NextKey,
    challenge: &RenewBootChallenge,
) -> anyhow::Result<(TpmKeyAttestation, RenewBootEvidence)> {
    let Some(statement) = statement else {
        anyhow::bail!("the control plane asked for boot evidence, but this node's certificate names no TPM AK to quote with: join again with the tpm attestor");
    };
    if challenge.pcrs.is_empty() {
        anyhow::bail!("the control plane asked for boot evidence of no PCR: a control plane this bcd does not understand");
    }
    let want = bc_wire::tpm::parse_ak_statement(statement).map_err(|_| {
        anyhow::anyhow!("the certificate's AK statement {statement:?} is not one bcd can prove")
    })?;
    let csr_sha256 = bc_wire::sha256(&next.csr);
    let mut input = challenge.nonce.clone();
    input.extend_from_slice(&csr_sha256);
    let mut extra = bc_wire::sha256(&input);
    // Test builds: a quote over another nonce, as a replayed one would be.
    if failpoint::active(QUOTE_OTHER_NONCE) {
        extra[0] ^= 1;
    }
    let path = config.data_dir.join(crate::identity::NODE_KEY_NEXT_FILE);
    let holder = tpm.holder().map_err(|e| cannot_provide("the TPM", &e))?;
    // Its slot for the staged copy certified and the AK beside the current
    // key (a connection has three); the renewed identity derives it again.
    next.key.unload();
    let ask = BootAsk {
        want: &want,
        path: &path,
        spki: next.key.spki_der(),
        csr_sha256: &csr_sha256,
        extra: &extra,
        pcrs: &challenge.pcrs,
    };
    let (certified, mut quote, log) = match holder {
        Holder::Direct(shared) => quoted_by(&shared, &ask),
        Holder::Helper(client) => quoted_by(&client, &ask),
    }?;
    // Test builds: evidence altered on its way, as a forger's would be.
    if failpoint::active(QUOTE_BAD_SIGNATURE) {
        if let Some(b) = quote.quote_signature.last_mut() {
            *b ^= 1;
        }
    }
    if failpoint::active(QUOTE_VALUE_DROPPED) {
        quote.pcr_values.pop();
    }
    Ok((
        certified,
        RenewBootEvidence {
            nonce: challenge.nonce.clone(),
            not_after_unix_ms: challenge.not_after_unix_ms,
            quote: quote.quote,
            quote_signature: quote.quote_signature,
            pcr_values: quote.pcr_values,
            event_log: log,
        },
    ))
}

/// Failpoints (test builds) that alter a renewal's boot evidence: the
/// quote's signature, the nonce it is over, one of its PCR values.
const QUOTE_BAD_SIGNATURE: &str = "renew-boot-quote-signature";
const QUOTE_OTHER_NONCE: &str = "renew-boot-quote-nonce";
const QUOTE_VALUE_DROPPED: &str = "renew-boot-quote-pcrs";

/// What [`quoted_by`] certifies and quotes.
struct BootAsk<'a> {
    /// The AK's name, from the certificate's statement.
    want: &'a [u8],
    /// The staged next key's file, and its SPKI (the CSR's).
    path: &'a std::path::Path,
    spki: &'a [u8],
    csr_sha256: &'a [u8],
    extra: &'a [u8],
    pcrs: &'a [u32],
}

/// [`boot_evidence`] by `holder`.
fn quoted_by<H: KeyHolder>(
    holder: &H,
    ask: &BootAsk<'_>,
) -> anyhow::Result<(TpmKeyAttestation, bc_helper::CertifiedQuote, Vec<u8>)> {
    let who = holder.who();
    let log = holder.event_log()?;
    let ak = holder.load_ak().map_err(|e| cannot_provide(who, &e))?;
    if H::ak_name(&ak) != ask.want {
        anyhow::bail!(OTHER_AK);
    }
    let key = holder.load_key(ask.path).map_err(|e| {
        anyhow::anyhow!(
            "{who} cannot load the staged next node key {}: {e}",
            ask.path.display()
        )
    })?;
    if key.spki_der() != ask.spki {
        anyhow::bail!(
            "the staged next node key {} is not the key of this renewal's CSR: the next attempt makes a new one",
            ask.path.display()
        );
    }
    let quote = holder
        .certify_quote(&ak, &key, ask.csr_sha256, ask.extra, ask.pcrs)
        .map_err(|e| {
            anyhow::anyhow!("the AK cannot certify the next node key and quote the boot PCRs: {e}")
        })?;
    let certified = TpmKeyAttestation {
        ak_public: H::ak_public(&ak).to_vec(),
        key_public: H::key_public(&key).to_vec(),
        certify_info: quote.certify_info.clone(),
        signature: quote.signature.clone(),
    };
    Ok((certified, quote, log))
}

/// The next key for a certificate that names an AK: the AK derived alone
/// and checked against the statement, the key made in the same TPM (or
/// through `bcd helper`, under `[helper]`) and staged by `stage`, its CSR,
/// and the AK's certification of it over sha256(csr). No fallback: without
/// that AK or that TPM, nothing is sent.
fn certified_next_key(
    tpm: &TpmAccess,
    statement: &str,
    stage: impl FnOnce(&dyn NodeKey) -> anyhow::Result<()>,
) -> anyhow::Result<(Box<dyn NodeKey>, Vec<u8>, TpmKeyAttestation)> {
    let want = bc_wire::tpm::parse_ak_statement(statement).map_err(|_| {
        anyhow::anyhow!("the certificate's AK statement {statement:?} is not one bcd can prove")
    })?;
    let holder = tpm.holder().map_err(|e| cannot_provide("the TPM", &e))?;
    match holder {
        Holder::Direct(shared) => certified_by(&shared, &want, stage),
        Holder::Helper(client) => certified_by(&client, &want, stage),
    }
}

fn cannot_provide(who: &str, e: &keys::KeyError) -> anyhow::Error {
    anyhow::anyhow!(
        "the certificate names a TPM AK, but {who} cannot provide it: {e}; a renewal of this certificate needs that TPM, so nothing was sent"
    )
}

/// [`certified_next_key`] by `holder`.
fn certified_by<H: KeyHolder>(
    holder: &H,
    want: &[u8],
    stage: impl FnOnce(&dyn NodeKey) -> anyhow::Result<()>,
) -> anyhow::Result<(Box<dyn NodeKey>, Vec<u8>, TpmKeyAttestation)> {
    let who = holder.who();
    let ak = holder.load_ak().map_err(|e| cannot_provide(who, &e))?;
    if H::ak_name(&ak) != want {
        anyhow::bail!(OTHER_AK);
    }
    let key = holder.make_key().map_err(|e| {
        anyhow::anyhow!("{who} cannot make the next node key: {e}; nothing was sent")
    })?;
    stage(&key)?;
    let csr = keys::make_csr(&key)?;
    let (certify_info, signature) = holder
        .certify(&ak, &key, &bc_wire::sha256(&csr))
        .map_err(|e| anyhow::anyhow!("the AK cannot certify the next node key: {e}"))?;
    let proof = TpmKeyAttestation {
        ak_public: H::ak_public(&ak).to_vec(),
        key_public: H::key_public(&key).to_vec(),
        certify_info,
        signature,
    };
    Ok((Box::new(key), csr, proof))
}
