//! `bettercompute.site.v1.SiteService`: the boot lease and SecretRequest,
//! for site nodes over mTLS.
//!
//! The caller is the TLS client's leaf certificate (verified against the
//! node CA in the handshake, which its key signed). Every call first checks,
//! in one transaction at database time, that the leaf is a current
//! certificate of a live site node of the site named in the request: a
//! `node_certs` row of its current identity generation, not revoked, not
//! expired; the node not retired; role `site` with that site. Any failure is
//! ACCESS_DENIED ("site request refused") with the reason in a
//! `security.site.refused` event and the log. Those events go through the
//! refusal log ([`crate::model::eventlog`]) as join refusals do: identical ones
//! (same call, site, node, reason and source) are counted per minute, not
//! stored one by one, and only the first of a minute is logged at warn.
//!
//! Reasons: of the caller `no-client-certificate`, `certificate-identity`,
//! `unknown-certificate`, `certificate-stale`, `node-retired`,
//! `not-site-node`; of the lease `lease-lost`, `not-lease-holder`; of a
//! SecretRequest `secret-signature`, `secret-stale`, `unknown-workflow`
//! (none named, or not of this site), `workflow-closed` (joined or expired),
//! `workflow-mac` (its MAC is not the entry's), `workflow-busy` (the entry
//! has [`crate::model::boot::MAX_LIVE_TOKENS`] unspent tokens).

use bc_wire::site;
use std::net::IpAddr;

use bc_wire::site_v1::commissioning_policy::Unbound;
use bc_wire::site_v1::{
    AcquireLeaseRequest, BootEntries, BootEntryInfo, CommissioningPolicy, LeaseResponse,
    ListBootEntriesRequest, ReleaseLeaseRequest, RenewLeaseRequest, SecretRequest, SecretResponse,
};
use prost::Message;

use crate::model::eventlog::Refused as Counted;
use crate::model::records;
use crate::model::sites::{self, Lease, LeaseOutcome};
use crate::plane::api_error::ApiError;
use crate::plane::ControlPlane;
use crate::store::{Commit, DbError, Tx, UnixMs};

pub(crate) const EVENT_SITE_REFUSED: &str = "security.site.refused";

crate::reason::reasons! {
    /// The site API's reasons (`security.site.refused`), whichever call.
    pub(crate) enum SiteReason in "site" {
        NoClientCertificate = "no-client-certificate",
        CertificateIdentity = "certificate-identity",
        UnknownCertificate = "unknown-certificate",
        NodeRetired = "node-retired",
        CertificateStale = "certificate-stale",
        NotSiteNode = "not-site-node",
        LeaseLost = "lease-lost",
        NotLeaseHolder = "not-lease-holder",
        SecretSignature = "secret-signature",
        SecretStale = "secret-stale",
        UnknownWorkflow = "unknown-workflow",
        WorkflowClosed = "workflow-closed",
        /// The SecretRequest's MAC is not its workflow's.
        WorkflowMac = "workflow-mac",
        /// The entry has [`crate::model::boot::MAX_LIVE_TOKENS`] unspent tokens already.
        WorkflowBusy = "workflow-busy",
    }
}

/// A SecretRequest's issued_at must be this close to database time.
const SECRET_WINDOW_MS: i64 = 60_000;

/// The authenticated caller.
struct Caller {
    node_id: String,
    spki_der: Vec<u8>,
}

/// A refusal: the reason and the node it names.
struct Refused {
    reason: SiteReason,
    node_id: Option<String>,
}

fn refused(reason: SiteReason, node_id: Option<&str>) -> Refused {
    Refused {
        reason,
        node_id: node_id.map(str::to_owned),
    }
}

enum Stop {
    Refused(Refused),
    Failed(ApiError),
}

impl From<DbError> for Stop {
    fn from(e: DbError) -> Self {
        Stop::Failed(e.into())
    }
}

impl From<Refused> for Stop {
    fn from(r: Refused) -> Self {
        Stop::Refused(r)
    }
}

/// `bettercompute.site.v1.SiteService`: a service over the control
/// plane's shared state (see [`crate::plane`]).
#[derive(Clone, Copy)]
pub struct SiteService<'a> {
    cp: &'a ControlPlane,
}

impl<'a> SiteService<'a> {
    pub(crate) fn new(cp: &'a ControlPlane) -> Self {
        SiteService { cp }
    }
}

/// The shared state's accessors, as the service's own.
impl std::ops::Deref for SiteService<'_> {
    type Target = ControlPlane;
    fn deref(&self) -> &ControlPlane {
        self.cp
    }
}

impl SiteService<'_> {
    /// `AcquireLease`: takes or keeps `site:<id>:boot` for the caller, or
    /// says who holds it.
    pub(crate) fn acquire_lease_bytes(
        &self,
        leaf: Option<&[u8]>,
        body: &[u8],
        source: Option<IpAddr>,
    ) -> Result<Vec<u8>, ApiError> {
        let req = AcquireLeaseRequest::decode(body)
            .map_err(|e| ApiError::InvalidInput(format!("not an AcquireLeaseRequest: {e}")))?;
        let ttl = self.lease_ttl_ms();
        self.site_call(
            "acquire-lease",
            leaf,
            source,
            &req.site_id,
            |tx, caller, now| {
                let name = site::boot_lease_name(&req.site_id);
                let out = sites::acquire(tx, &name, &caller.node_id, now, ttl)?;
                Ok(lease_response(
                    &name,
                    &out,
                    &caller.node_id,
                    self.commissioning(tx, &req.site_id, now)?,
                ))
            },
        )
    }

    /// `RenewLease`: extends the caller's hold at the epoch it names.
    pub(crate) fn renew_lease_bytes(
        &self,
        leaf: Option<&[u8]>,
        body: &[u8],
        source: Option<IpAddr>,
    ) -> Result<Vec<u8>, ApiError> {
        let req = RenewLeaseRequest::decode(body)
            .map_err(|e| ApiError::InvalidInput(format!("not a RenewLeaseRequest: {e}")))?;
        let ttl = self.lease_ttl_ms();
        self.site_call(
            "renew-lease",
            leaf,
            source,
            &req.site_id,
            |tx, caller, now| {
                let name = site::boot_lease_name(&req.site_id);
                match sites::renew(tx, &name, &caller.node_id, req.epoch, now, ttl)? {
                    LeaseOutcome::Lost(_) => {
                        Err(refused(SiteReason::LeaseLost, Some(&caller.node_id)).into())
                    }
                    out => Ok(lease_response(
                        &name,
                        &out,
                        &caller.node_id,
                        self.commissioning(tx, &req.site_id, now)?,
                    )),
                }
            },
        )
    }

    /// `ReleaseLease`: gives the lease up so a standby takes it at once.
    pub(crate) fn release_lease_bytes(
        &self,
        leaf: Option<&[u8]>,
        body: &[u8],
        source: Option<IpAddr>,
    ) -> Result<Vec<u8>, ApiError> {
        let req = ReleaseLeaseRequest::decode(body)
            .map_err(|e| ApiError::InvalidInput(format!("not a ReleaseLeaseRequest: {e}")))?;
        self.site_call(
            "release-lease",
            leaf,
            source,
            &req.site_id,
            |tx, caller, now| {
                let name = site::boot_lease_name(&req.site_id);
                let out = sites::release(tx, &name, &caller.node_id, req.epoch, now)?;
                Ok(lease_response(
                    &name,
                    &out,
                    &caller.node_id,
                    self.commissioning(tx, &req.site_id, now)?,
                ))
            },
        )
    }

    /// `GetSecret`: a new single-use discovery token of the boot entry the
    /// request names, of the caller's site, for the current lease holder
    /// only, on a request signed by the key of the certificate it called
    /// with (see [`crate::model::boot::issue_token`]).
    pub(crate) fn get_secret_bytes(
        &self,
        leaf: Option<&[u8]>,
        body: &[u8],
        source: Option<IpAddr>,
    ) -> Result<Vec<u8>, ApiError> {
        let req = SecretRequest::decode(body)
            .map_err(|e| ApiError::InvalidInput(format!("not a SecretRequest: {e}")))?;
        let Some(key) = self.boot_key() else {
            return Err(ApiError::Unavailable("no boot entry key loaded".to_owned()));
        };
        // The site is in the signed body; read it before the signature is
        // checked only to know which site to authenticate the caller for.
        let unverified = bc_wire::site_v1::SecretRequestBody::decode(req.body.as_slice())
            .map_err(|e| ApiError::InvalidInput(format!("not a SecretRequestBody: {e}")))?;
        let site_id = unverified.site_id;
        self.site_call("get-secret", leaf, source, &site_id, |tx, caller, now| {
            let me = Some(caller.node_id.as_str());
            let body = match bc_wire::site::verify_secret_request(&caller.spki_der, &req) {
                Ok(Some(body)) if body.node_id == caller.node_id => body,
                _ => return Err(refused(SiteReason::SecretSignature, me).into()),
            };
            if (body.issued_at_unix_ms - now).abs() > SECRET_WINDOW_MS {
                return Err(refused(SiteReason::SecretStale, me).into());
            }
            self.require_holder(tx, &body.site_id, me, now)?;
            // Bound to the workflow named, never "the newest for the MAC".
            let entry = Some(body.workflow_id.as_str())
                .filter(|w| !w.is_empty())
                .map(|w| crate::model::boot::get_for_update(tx, w))
                .transpose()?
                .flatten()
                .filter(|e| e.site_id == body.site_id)
                .ok_or_else(|| refused(SiteReason::UnknownWorkflow, me))?;
            if entry.state(now).is_closed() {
                return Err(refused(SiteReason::WorkflowClosed, me).into());
            }
            if !body.mac.is_empty() && body.mac != entry.mac {
                return Err(refused(SiteReason::WorkflowMac, me).into());
            }
            let token = match crate::model::boot::issue_token(tx, key, &entry, now) {
                Ok(Ok(token)) => token,
                Ok(Err(crate::model::boot::NoToken::TooMany)) => {
                    return Err(refused(SiteReason::WorkflowBusy, me).into())
                }
                Err(crate::model::pools::PoolError::Db(e)) => return Err(e.into()),
                Err(e) => return Err(Stop::Failed(ApiError::Internal(e.to_string()))),
            };
            tracing::info!(node_id = %caller.node_id, workflow = %entry.workflow_id, token_id = %token.id, "discovery token issued");
            Ok(SecretResponse {
                token: token.expose(),
                mac: entry.mac,
                product_uuid: entry.product_uuid.unwrap_or_default(),
                not_after_unix_ms: entry.not_after,
                workflow_id: entry.workflow_id,
            }
            .encode_to_vec())
        })
    }

    /// `ListBootEntries`: the open boot entries of the caller's site, for
    /// its lease holder (what `bcd site` answers iPXE from).
    pub(crate) fn list_boot_entries_bytes(
        &self,
        leaf: Option<&[u8]>,
        body: &[u8],
        source: Option<IpAddr>,
    ) -> Result<Vec<u8>, ApiError> {
        let req = ListBootEntriesRequest::decode(body)
            .map_err(|e| ApiError::InvalidInput(format!("not a ListBootEntriesRequest: {e}")))?;
        self.site_call(
            "list-boot-entries",
            leaf,
            source,
            &req.site_id,
            |tx, caller, now| {
                self.require_holder(tx, &req.site_id, Some(caller.node_id.as_str()), now)?;
                let entries = crate::model::boot::list_open(tx, &req.site_id, now)?
                    .into_iter()
                    .map(|e| BootEntryInfo {
                        workflow_id: e.workflow_id,
                        mac: e.mac,
                        product_uuid: e.product_uuid.unwrap_or_default(),
                        not_after_unix_ms: e.not_after,
                    })
                    .collect();
                Ok(BootEntries { entries }.encode_to_vec())
            },
        )
    }

    /// Refuses (`not-lease-holder`) unless `me` holds `site_id`'s boot lease.
    fn require_holder(
        &self,
        tx: &Tx<'_>,
        site_id: &str,
        me: Option<&str>,
        now: UnixMs,
    ) -> Result<(), Stop> {
        let name = bc_wire::site::boot_lease_name(site_id);
        let holds = sites::get_lease(tx, &name)?.is_some_and(|l: Lease| l.holder_at(now) == me);
        if holds {
            Ok(())
        } else {
            Err(refused(SiteReason::NotLeaseHolder, me).into())
        }
    }

    /// Authenticates the caller as a site node of `site_id`, runs `f` in the
    /// same transaction, commits on success; records a refusal otherwise.
    fn site_call(
        &self,
        call: &'static str,
        leaf: Option<&[u8]>,
        source: Option<IpAddr>,
        site_id: &str,
        // FnMut: PostgreSQL may re-run the transaction.
        mut f: impl FnMut(&Tx<'_>, &Caller, UnixMs) -> Result<Vec<u8>, Stop>,
    ) -> Result<Vec<u8>, ApiError> {
        let outcome = self.database().write_if(
            |tx| -> Result<(Result<Vec<u8>, Refused>, Commit), ApiError> {
                let now = tx.now()?;
                let result = self
                    .site_caller(tx, leaf, site_id, now)
                    .and_then(|caller| f(tx, &caller, now));
                match result {
                    Ok(out) => Ok((Ok(out), Commit::Yes)),
                    Err(Stop::Refused(r)) => Ok((Err(r), Commit::No)),
                    Err(Stop::Failed(e)) => Err(e),
                }
            },
        )?;
        outcome.map_err(|r| self.refuse_site(call, site_id, source, r))
    }

    fn site_caller(
        &self,
        tx: &Tx<'_>,
        leaf: Option<&[u8]>,
        site_id: &str,
        now: UnixMs,
    ) -> Result<Caller, Stop> {
        let leaf = leaf
            .filter(|l| !l.is_empty())
            .ok_or_else(|| refused(SiteReason::NoClientCertificate, None))?;
        let identity = match crate::pki::node_cert_identity(leaf) {
            Ok(id) if id.trust_domain == self.bundle().trust_domain => id,
            _ => return Err(refused(SiteReason::CertificateIdentity, None).into()),
        };
        let id = Some(identity.node_id.as_str());
        let cert = records::cert_by_der(tx, &identity.node_id, leaf)?
            .ok_or_else(|| refused(SiteReason::UnknownCertificate, id))?;
        let node = records::node_for_update(tx, &identity.node_id)?
            .ok_or_else(|| refused(SiteReason::UnknownCertificate, id))?;
        if node.retired_at.is_some() {
            return Err(refused(SiteReason::NodeRetired, id).into());
        }
        if cert.identity_generation != node.identity_generation
            || cert.revoked_at.is_some()
            || now >= cert.not_after
        {
            return Err(refused(SiteReason::CertificateStale, id).into());
        }
        let scope = records::node_scope(tx, &node.id)?;
        if node.role != bc_wire::agent::Role::Site || scope.site_id.as_deref() != Some(site_id) {
            return Err(refused(SiteReason::NotSiteNode, id).into());
        }
        Ok(Caller {
            node_id: node.id,
            spki_der: identity.spki_der,
        })
    }

    /// Counts the refusal in the refusal log (aggregated per minute, as
    /// join refusals are) and answers ACCESS_DENIED.
    fn refuse_site(
        &self,
        call: &'static str,
        site_id: &str,
        source: Option<IpAddr>,
        r: Refused,
    ) -> ApiError {
        let first = self.record_refusal(Counted {
            kind: EVENT_SITE_REFUSED,
            attestor: None,
            reason: r.reason.any(),
            token_id: None,
            node_id: r.node_id.clone(),
            source,
            extra: serde_json::json!({ "call": call, "site": printable(site_id) }).to_string(),
            // Site nodes serve the operator's sites.
            tenant_id: None,
            folded: false,
        });
        macro_rules! log_refusal {
            ($level:ident) => {
                tracing::$level!(
                    call,
                    site_id = %printable(site_id),
                    node_id = r.node_id.as_deref().unwrap_or(""),
                    reason = r.reason.as_str(),
                    source = source.map(|s| s.to_string()).unwrap_or_default(),
                    "site request refused"
                )
            };
        }
        if first {
            log_refusal!(warn);
        } else {
            log_refusal!(debug);
        }
        ApiError::SiteRefused
    }
}

/// A site id from the request, safe for logs and events: at most 64
/// characters, control characters replaced.
fn printable(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

impl SiteService<'_> {
    /// What admits a machine's commissioning at `site_id` now.
    fn commissioning(
        &self,
        tx: &Tx<'_>,
        site_id: &str,
        now: UnixMs,
    ) -> Result<CommissioningPolicy, DbError> {
        let (open, bound) = crate::model::boot::open_counts(tx, site_id, now)?;
        let unbound = match self.discovery_approval() {
            crate::config::DiscoveryApproval::TrustedLan => Unbound::TrustedLan,
            crate::config::DiscoveryApproval::UnknownMachines => Unbound::OperatorApproval,
        };
        Ok(CommissioningPolicy {
            unbound: unbound as i32,
            open_entries: u32::try_from(open).unwrap_or(u32::MAX),
            ek_bound_entries: u32::try_from(bound).unwrap_or(u32::MAX),
        })
    }
}

fn lease_response(
    name: &str,
    out: &LeaseOutcome,
    caller: &str,
    commissioning: CommissioningPolicy,
) -> Vec<u8> {
    let (lease, held) = match out {
        LeaseOutcome::Held(l) => (Some(l), true),
        LeaseOutcome::HeldByOther(l) => (Some(l), false),
        LeaseOutcome::Lost(l) => (l.as_ref(), false),
    };
    LeaseResponse {
        name: name.to_owned(),
        held: held && lease.and_then(|l| l.holder.as_deref()) == Some(caller),
        holder_node_id: lease.and_then(|l| l.holder.clone()).unwrap_or_default(),
        epoch: lease.map_or(0, |l| l.epoch),
        expires_at_unix_ms: lease.map_or(0, |l| l.expires_at),
        commissioning: Some(commissioning),
    }
    .encode_to_vec()
}
