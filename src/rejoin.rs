//! The x509pop re-join: a node becomes itself again with its last
//! certificate (expired or not) and the key it certifies, and its identity
//! is rotated in place ([`rotation::rotate`]). `bcd join --attestor x509pop`
//! and `bcd node` (a certificate expired within its grace) both run it.
use std::sync::Arc;

use anyhow::anyhow;
use bc_wire::agent::JoinRequest;

use crate::client::answer::Expected;
use crate::client::join::{self as exchange, JoinError, NoChallenges, Policy};
use crate::client::{Client, ClientError};
use crate::config::Config;
use crate::evidence::attestor;
use crate::evidence::claims;
use crate::evidence::x509pop;
use crate::identity::rotation::{self, CrashPoints, NextKey, RotateError, Unanswered};
use crate::identity::Identity;
use crate::journal::{record, Kind};
use crate::keys::{self, NodeKey, TpmAccess};
use crate::pki::rfc3339;
use crate::{clock, failpoint};

/// The one answer to a refused re-join, where the last certificate is the credential.
pub(crate) const ACCESS_DENIED_X509POP: &str = "access denied: the control plane refused the x509pop re-join (the certificate may have expired more than 7 days ago, be revoked or older than the node's current identity, the node may be retired, or this clock may be more than 60 s off the control plane's; join again: bcd join --reset --yes, then bcd join with a token or --attestor tpm)";

/// Re-joins as `current` with x509pop and replaces the identity on disk
/// (see [`rotation`]): the new key (in the TPM when there is one) is staged
/// before the request, the new identity once the answer is verified.
/// Journals `rejoin` or `rejoin-failed`; returns the new identity.
///
/// `staged`: as for `bcd node`'s renewal, the next key of an earlier
/// failed attempt, sent again; left staged when this attempt fails before
/// an answer, for the next try.
pub(crate) async fn rejoin_x509pop(
    config: &Config,
    tpm: &TpmAccess,
    current: &Identity,
    staged: &mut Option<NextKey>,
) -> anyhow::Result<Identity> {
    let result = rejoin_inner(config, tpm, current, staged).await;
    match &result {
        Ok(next) => record(
            &config.data_dir,
            Kind::Rejoin,
            &next.node_id,
            format!(
                "re-joined with x509pop (node key {}, kid {})",
                next.key.kind().as_str(),
                next.key.kid()
            ),
            Some(next.cert.not_after),
        ),
        Err(e) => record(
            &config.data_dir,
            Kind::RejoinFailed,
            &current.node_id,
            format!("{e:#}"),
            None,
        ),
    }
    result
}

async fn rejoin_inner(
    config: &Config,
    tpm: &TpmAccess,
    current: &Identity,
    staged: &mut Option<NextKey>,
) -> anyhow::Result<Identity> {
    let dir = &config.data_dir;
    let client = Client::new(config)?;
    let make = || -> anyhow::Result<NextKey> {
        let key: Arc<dyn NodeKey> = Arc::from(keys::generate(tpm, false)?);
        let csr = keys::make_csr(key.as_ref())?;
        rotation::stage_key(dir, key.as_ref())?;
        Ok(NextKey {
            key,
            csr,
            certified: None,
        })
    };
    let exchange = |next: NextKey| async move {
        let NextKey { key, csr, .. } = next;
        let csr_sha256 = bc_wire::sha256(&csr);
        // A fresh proof at every try: it carries the client time.
        let attestation = x509pop::build(
            &current.chain,
            current.key.as_ref(),
            &csr_sha256,
            &current.node_id,
            clock::now(),
        )
        .map_err(|e| Unanswered::Retry(e.into()))?;
        failpoint::hit("rejoin-before-request");
        tracing::info!(api = %client.api(), node_id = %current.node_id, role = %current.role.name(), node_key = %key.kid(), key_in = key.kind().as_str(), "re-joining the control plane with x509pop");
        let request = JoinRequest {
            csr,
            role: current.role as i32,
            attestor: attestor::X509POP.to_owned(),
            attestation,
            sealed_token: Vec::new(),
            claims: Some(claims::collect()),
            tpm: None,
        };
        let expected = Expected::for_join(config, csr_sha256, key.spki_der());
        let accepted = exchange::run(
            &client,
            &mut NoChallenges(attestor::X509POP),
            request,
            attestor::X509POP,
            &expected,
            &Policy::default(),
        )
        .await
        // Unreachable, refused or a bad answer: the same key goes again
        // next time (a bad answer certified nothing of ours).
        .map_err(|e| {
            Unanswered::Retry(match e {
                JoinError::Client(ClientError::AccessDenied) => anyhow!(ACCESS_DENIED_X509POP),
                e => e.into(),
            })
        })?;
        if accepted.node_id != current.node_id {
            return Err(Unanswered::Abandon(anyhow!(
                "the control plane answered the x509pop re-join of {} with another node, {}; the identity is left as it was",
                current.node_id,
                accepted.node_id
            )));
        }
        Ok(Identity {
            node_id: accepted.node_id,
            role: current.role,
            trust_domain: config.trust_domain.clone(),
            attestor: attestor::X509POP.to_owned(),
            joined_at: clock::now_seconds(),
            chain: accepted.chain,
            cert: accepted.cert,
            key,
        })
    };
    let points = CrashPoints {
        after_answer: "rejoin-after-answer",
        between_renames: "rejoin-between-renames",
    };
    let next = match rotation::rotate(dir, staged, make, exchange, points).await {
        Ok(next) => next,
        Err(RotateError::Failed(e)) => return Err(e),
        Err(RotateError::Stage(e) | RotateError::Commit(e)) => {
            return Err(anyhow::Error::new(e).context(format!(
                "re-joined as {}, but the identity could not be saved in {}",
                current.node_id,
                dir.display()
            )))
        }
    };
    tracing::info!(node_id = %next.node_id, not_after = %rfc3339(next.cert.not_after), node_key = %next.key.kid(), key_in = next.key.kind().as_str(), "re-joined with x509pop");
    Ok(next)
}
