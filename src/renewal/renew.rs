//! One renewal (`renew_once`): the next key, its proof when the certificate
//! names an AK, `Renew` over mTLS with the current key, the answer checked,
//! and the identity rotated (see [`crate::identity::rotation`]).
use std::sync::Arc;

use bc_wire::agent::{RenewRequest, TpmKeyAttestation};

use crate::client::renew::{self as answer, RenewExpected};
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
        let chain = send(config, current, &next)
            .await
            .map_err(Unanswered::Retry)?;
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

/// The `Renew` call for `next` over mTLS with the current key: the answer's chain.
async fn send(
    config: &Config,
    current: &Identity,
    next: &NextKey,
) -> Result<Vec<Vec<u8>>, RenewError> {
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
        "renewing the certificate"
    );
    let request = RenewRequest {
        csr: next.csr.clone(),
        key_attestation: next.certified.clone(),
    };
    client.renew(&request).await.map_err(|e| match e {
        ClientError::AccessDenied => RenewError::Refused,
        e => RenewError::Failed(e.into()),
    })
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
