//! The join flow, shared by `bcd join` and `bcd ramdisk`: the attestor's
//! evidence prepared ([`Credential`]), the exchange with the control plane,
//! and the identity saved once the answer is verified.
//!
//! The new node key stays in memory until the control plane's answer has
//! been verified; only then is anything written, node key first and
//! `identity.json` last. A refused, garbled or unreachable join therefore
//! leaves the data directory exactly as it was.
use std::sync::Arc;

use anyhow::{anyhow, Context as _};
use bc_wire::agent::{JoinRequest, Role, TpmAttestation};
use bc_wire::token::JoinToken;

use crate::client::answer::Expected;
use crate::client::join::{
    self as exchange, Answerer, JoinError, NoChallenges, Policy, RefusedRetry,
};
use crate::client::{Client, ClientError};
use crate::config::Config;
use crate::evidence::attestor;
use crate::evidence::claims;
use crate::evidence::join_token;
use crate::evidence::provisioned;
use crate::evidence::tpm::{Beside, TpmEvidence};
use crate::identity::Identity;
use crate::journal::{record, Kind};
use crate::keys::{self, NodeKey, TpmAccess, TpmKey};
use crate::{clock, out};

/// The one answer to every refusal: the control plane keeps the reason, so
/// this lists what the operator can check on their side.
pub(crate) const ACCESS_DENIED: &str = "access denied: the control plane refused the join (check the token: wrong, expired, revoked, used up, or for another role; or this machine, the product UUID the token is bound to, is already another live node: delete that node first, or use a token that may take it over)";
/// The same for a TPM join, where the TPM is the credential.
pub(crate) const ACCESS_DENIED_TPM: &str = "access denied: the control plane refused the TPM join (check that it trusts the EK's maker (ek-roots), that this EK is allowed or approved, that it is not bound to another node, that no other live node holds this machine's hardware key (delete the old node first), and that the pool admits tpm; `bcd tpm identify` shows the EK)";
/// The same for a PXE ramdisk's discovery join.
pub(crate) const ACCESS_DENIED_DISCOVERY: &str = "access denied: the control plane refused the discovery join (the boot entry's token may be used, expired or for another MAC or site, the assertion stale or already used, the boot server no longer the site's lease holder, or the entry may expect another TPM's EK (boot add --ek-sha256 / --node) than this machine proved, or one this machine, without a usable TPM, could not prove; add a new boot entry and PXE-boot again)";
/// The same for a provisioned join (the token from the machine's user data).
pub(crate) const ACCESS_DENIED_PROVISIONED: &str = "access denied: the control plane refused the provisioned join (the token may be used, expired or revoked, minted for another machine (product UUID), or for a machine another node already is; deploy again for a new token)";
/// The same for a cloud VM's identity document.
pub(crate) const ACCESS_DENIED_CLOUD_IID: &str = "access denied: the control plane refused the cloud-iid join (check that it has keys for this cloud ([cloud_iid]) and audience = this bcd's api URL, that `cloud resolve list` covers this account and zone, and the role if not node ([cloud_iid] roles, cloud resolve add --role), that this instance never joined before (a known instance re-joins with --attestor x509pop), and that this clock's time is right)";

/// What the join proves itself with.
pub(crate) enum Credential {
    /// A sealed token, for `join-token` or `provisioned`.
    Token {
        token: JoinToken,
        attestor: &'static str,
    },
    /// A PXE ramdisk: its discovery token and the boot server's assertion.
    Discovery(crate::evidence::discovery::Discovery),
    /// The TPM is the credential: no token is read or sent.
    Tpm,
    /// A cloud VM: the evidence JSON with its identity document; no token.
    CloudIid(Vec<u8>),
}

/// The exchange's policy. A discovery join that waits for an operator
/// (`[discovery] approval`) waits no longer than its assertion lives, with
/// the server's backoff, and says on the console what the operator must do.
fn policy_for(credential: &Credential) -> Policy {
    match credential {
        Credential::Discovery(d) => Policy {
            give_up_after: Some(d.lifetime()),
            on_pending: tell_the_operator,
            ..Policy::default()
        },
        _ => Policy::default(),
    }
}

/// A ramdisk's console line while its join waits for an operator.
fn tell_the_operator(p: &bc_wire::agent::JoinPending, limit: Option<std::time::Duration>) {
    let id = crate::pki::printable(&p.request_id);
    let within = limit.map_or(String::new(), |l| {
        format!(" (this boot's assertion lasts {} s)", l.as_secs())
    });
    let told = out::line(format_args!(
        "join pending: waiting for an operator to approve join request {id}{within}. On the control plane, `bc-controlplane requests list` shows its boot entry, MAC, UUID, EK (or \"no TPM\") and source address; if it is this machine, run `bc-controlplane requests approve {id}`, else `bc-controlplane requests deny {id}`. To commission without an operator, bind the boot entry to the machine's EK (boot add --ek-sha256)."
    ));
    if let Err(e) = told {
        tracing::warn!(error = %e, request_id = %id, "join pending approval");
    }
}

/// Joins and saves the identity; returns the node id.
pub(crate) fn join(
    config: &Config,
    tpm: &TpmAccess,
    credential: Credential,
    role: Role,
) -> anyhow::Result<String> {
    let client = Client::new(config)?;
    let Prepared {
        key,
        csr,
        mut answerer,
        attestor_id,
        sealed_token,
        attestation,
        refused_retry,
        tpm: tpm_evidence,
    } = prepare(config, tpm, &credential, role, &client)?;
    let csr_sha256 = bc_wire::sha256(&csr);
    let request = JoinRequest {
        csr,
        role: role as i32,
        // Empty means join-token, the built-in attestor.
        attestor: if attestor_id == attestor::JOIN_TOKEN {
            String::new()
        } else {
            attestor_id.to_owned()
        },
        attestation,
        sealed_token,
        // Every join says which machine it is: a token bound to a machine
        // (and the attestors that bind to one) compare against these.
        claims: Some(claims::collect()),
        tpm: tpm_evidence,
    };

    let expected = Expected::for_join(config, csr_sha256, key.spki_der());
    let from_service = refused_retry.as_ref().map(|r| r.why);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(exchange::run(
        &client,
        answerer.as_mut(),
        request,
        attestor_id,
        &expected,
        &Policy {
            refused_retry,
            ..policy_for(&credential)
        },
    ));
    let accepted = match outcome {
        Ok(a) => a,
        Err(JoinError::RefusedAfterPending { request_id }) => {
            return Err(anyhow!(
                "access denied: the control plane refused the join after its join request {request_id} waited for an operator: an operator denied that request (bc-controlplane requests deny), or the join no longer holds otherwise{}",
                if attestor_id == attestor::DISCOVERY {
                    " (the boot assertion went stale before the approval, or the entry was joined or expired meanwhile: boot the machine again, and approve its new request)"
                } else {
                    ""
                }
            ))
        }
        Err(JoinError::Client(ClientError::AccessDenied)) => {
            if let Some(service) = from_service {
                return Err(anyhow!(
                    "{ACCESS_DENIED_TPM}; this TPM has no EK certificate in NV, and the control plane fetches it from {service}: check that it reaches that service ([tpm.ek_services]) and trusts the maker's roots"
                ));
            }
            return Err(anyhow!(match attestor_id {
                attestor::TPM => ACCESS_DENIED_TPM,
                attestor::DISCOVERY => ACCESS_DENIED_DISCOVERY,
                attestor::PROVISIONED => ACCESS_DENIED_PROVISIONED,
                attestor::CLOUD_IID => ACCESS_DENIED_CLOUD_IID,
                _ => ACCESS_DENIED,
            }));
        }
        Err(e) => return Err(e.into()),
    };
    drop(answerer);
    tracing::info!(node_id = %accepted.node_id, not_after = %crate::pki::rfc3339(accepted.cert.not_after), "the control plane accepted the join");

    let identity = Identity {
        node_id: accepted.node_id,
        role,
        trust_domain: config.trust_domain.clone(),
        attestor: attestor_id.to_owned(),
        joined_at: clock::now_seconds(),
        chain: accepted.chain,
        cert: accepted.cert,
        key,
    };
    identity.save(&config.data_dir).with_context(|| {
        format!(
            "joined as {}, but the identity could not be saved in {} (the token use is spent)",
            identity.node_id,
            config.data_dir.display()
        )
    })?;
    // The journal is the node's own history; losing an entry loses no identity.
    record(
        &config.data_dir,
        Kind::Join,
        &identity.node_id,
        format!(
            "joined with {} (node key {})",
            attestor_id,
            identity.key.kind().as_str()
        ),
        Some(identity.cert.not_after),
    );
    Ok(identity.node_id)
}

/// A join ready to send: the new key (in memory only), its CSR, and the
/// attestor's evidence and answerer.
struct Prepared {
    key: Arc<dyn NodeKey>,
    csr: Vec<u8>,
    answerer: Box<dyn Answerer>,
    attestor_id: &'static str,
    sealed_token: Vec<u8>,
    attestation: Vec<u8>,
    /// A refused first round may be worth sending again (see
    /// [`RefusedRetry`]).
    refused_retry: Option<RefusedRetry>,
    /// TPM evidence beside the attestor's (a ramdisk's discovery join).
    tpm: Option<TpmAttestation>,
}

/// A node key made in the machine's TPM, its CSR, and the TPM's evidence
/// (EK, AK, and the answer that certifies that key), for `tpm` and for a
/// ramdisk proving its TPM beside `discovery`.
fn tpm_evidence(
    config: &Config,
    tpm: &TpmAccess,
) -> anyhow::Result<(Arc<TpmKey>, Vec<u8>, TpmEvidence)> {
    let shared = tpm.open()?;
    let key =
        Arc::new(TpmKey::generate(shared.clone()).context("the TPM cannot make the node key")?);
    let csr = keys::make_csr(key.as_ref())?;
    let mut evidence = TpmEvidence::new(shared, key.clone(), bc_wire::sha256(&csr))
        .context("cannot read the TPM's endorsement and attestation keys")?;
    if let Some(file) = &config.tpm_ek_intermediates {
        evidence.add_intermediates(crate::pki::read_pem_bundle(file)?);
    }
    Ok((key, csr, evidence))
}

fn prepare(
    config: &Config,
    tpm: &TpmAccess,
    credential: &Credential,
    role: Role,
    client: &Client,
) -> anyhow::Result<Prepared> {
    match credential {
        Credential::Token { token, attestor } => {
            let key: Arc<dyn NodeKey> = Arc::from(keys::generate(tpm, false)?);
            let csr = keys::make_csr(key.as_ref())?;
            let sealed_token = join_token::seal(
                &config.pins.join_encryption_key,
                &bc_wire::sha256(&csr),
                token,
            )?;
            tracing::info!(api = %client.api(), token_id = %token.id, role = %role.name(), attestor = %attestor, node_key = %key.kid(), key_in = key.kind().as_str(), "joining the control plane");
            if *attestor == attestor::PROVISIONED {
                if let Some(problem) = provisioned::claims_problem(&claims::collect()) {
                    tracing::warn!("{problem}");
                }
            }
            Ok(Prepared {
                key,
                csr,
                answerer: Box::new(NoChallenges(attestor)),
                attestor_id: attestor,
                sealed_token,
                attestation: Vec::new(),
                refused_retry: None,
                tpm: None,
            })
        }
        Credential::Discovery(d) => {
            // A machine with a TPM proves it in the same join: a boot
            // entry may admit only that TPM's EK. One whose TPM fails
            // joins as one without (the entry decides whether that will do).
            let with_tpm = match matches!(tpm, TpmAccess::Direct(_)) {
                true => tpm_evidence(config, tpm)
                    .map_err(|e| tracing::warn!(error = %format!("{e:#}"), "the TPM cannot prove this machine; joining with discovery alone"))
                    .ok(),
                false => None,
            };
            let (key, csr, answerer, tpm_hello): (Arc<dyn NodeKey>, _, Box<dyn Answerer>, _) =
                match with_tpm {
                    Some((key, csr, evidence)) => {
                        let hello = evidence.hello_message();
                        (key, csr, Box::new(Beside(evidence)), Some(hello))
                    }
                    None => {
                        let key: Arc<dyn NodeKey> = Arc::from(keys::generate(tpm, false)?);
                        let csr = keys::make_csr(key.as_ref())?;
                        (key, csr, Box::new(NoChallenges(attestor::DISCOVERY)), None)
                    }
                };
            let sealed_token = join_token::seal(
                &config.pins.join_encryption_key,
                &bc_wire::sha256(&csr),
                &d.token,
            )?;
            tracing::info!(api = %client.api(), token_id = %d.token.id, role = %role.name(), node_key = %key.kid(), key_in = key.kind().as_str(), tpm = tpm_hello.is_some(), "joining the control plane as a PXE ramdisk (discovery)");
            Ok(Prepared {
                key,
                csr,
                answerer,
                attestor_id: attestor::DISCOVERY,
                sealed_token,
                attestation: d.assertion.clone(),
                refused_retry: None,
                tpm: tpm_hello,
            })
        }
        Credential::CloudIid(evidence) => {
            let key: Arc<dyn NodeKey> = Arc::from(keys::generate(tpm, false)?);
            let csr = keys::make_csr(key.as_ref())?;
            tracing::info!(api = %client.api(), role = %role.name(), node_key = %key.kid(), key_in = key.kind().as_str(), "joining the control plane with the cloud's identity document");
            Ok(Prepared {
                key,
                csr,
                answerer: Box::new(NoChallenges(attestor::CLOUD_IID)),
                attestor_id: attestor::CLOUD_IID,
                sealed_token: Vec::new(),
                attestation: evidence.clone(),
                refused_retry: None,
                tpm: None,
            })
        }
        Credential::Tpm => {
            // No fallback to a file key: a TPM join proves the key is the TPM's.
            let (key, csr, evidence) =
                tpm_evidence(config, tpm).context("--attestor tpm needs this machine's TPM")?;
            let attestation = evidence.hello();
            let refused_retry = evidence
                .certificate_from_service()
                .map(RefusedRetry::maker_service);
            tracing::info!(api = %client.api(), role = %role.name(), node_key = %key.kid(), "joining the control plane with the TPM");
            Ok(Prepared {
                key,
                csr,
                answerer: Box::new(evidence),
                attestor_id: attestor::TPM,
                sealed_token: Vec::new(),
                attestation,
                refused_retry,
                tpm: None,
            })
        }
    }
}
