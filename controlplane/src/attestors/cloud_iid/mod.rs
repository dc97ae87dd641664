//! `cloud-iid`: a cloud VM joins with the identity document its cloud signs,
//! without a token (see the spec's *cloud-iid* and *Single-use evidence*).
//!
//! In the join transaction, in this order (each failure a refusal with the
//! reason named; the transaction rolls back, so nothing is spent):
//! 1. the evidence parses (`cloud-malformed`) and names a provider this
//!    control plane has keys for (`cloud-unknown-provider`);
//! 2. that provider's verifier (GCP, [`azure`], an [`oidc`] provider
//!    `oidc:<name>`, whose keys may first be fetched from its issuer outside
//!    the transaction, `cloud-jwks` when that fails; AWS checks the
//!    signature alone, see [`aws`]): signature (`cloud-signature`), issuer
//!    (`cloud-issuer`; Azure: certificate chain `cloud-chain` and signer
//!    name `cloud-signer`), audience = `[cloud_iid] audience`
//!    (`cloud-audience`; Azure: the nonce), issued less than `max_age` ago
//!    and not expired (`cloud-stale`), not issued in the future
//!    (`cloud-future`);
//! 3. the (provider, account, instance) never admitted before
//!    (`instance-reused`): a document is readable by any process on the VM,
//!    so it must never mint a second node;
//! 4. the resolve table names where it joins (`unknown-instance`);
//! 5. (JoinService) the role is one `[cloud_iid] roles` (default `node`) or
//!    the resolve row (`--role`) admits (`cloud-role`).
//!
//! The use is recorded for good (`attestation_uses`, never expiring), and
//! the VM joins as a new node of the resolved pool. A known instance that
//! lost its certificate re-joins with x509pop.

pub mod aws;
pub mod azure;
mod ber;
mod chain;
pub mod cms;
pub mod gcp;
mod jwt;
pub mod oidc;
pub mod resolve;

use bc_wire::agent::Role;
use bc_wire::cloud_iid::Evidence;
use bc_wire::AttestorId;

use crate::model::attestor::{
    AttestInput, AttestationResult, Attestor, NodeKey, Prepared, Refusal, Verdict, Work,
};
use crate::model::uses;
use crate::store::{Tx, UnixMs};

pub use bc_wire::cloud_iid::{AWS, AZURE, GCP};

crate::reason::reasons! {
    /// The cloud-iid attestor's reasons (its providers' checks' too).
    pub enum CloudReason in "cloud-iid" {
        Malformed = "cloud-malformed",
        UnknownProvider = "cloud-unknown-provider",
        Signature = "cloud-signature",
        Issuer = "cloud-issuer",
        /// Azure: the signer certificate does not chain to a configured root, or a
        /// certificate on the path is outside its validity.
        Chain = "cloud-chain",
        /// Azure: the signer certificate does not name the configured signer.
        Signer = "cloud-signer",
        Audience = "cloud-audience",
        Stale = "cloud-stale",
        Future = "cloud-future",
        InstanceReused = "instance-reused",
        UnknownInstance = "unknown-instance",
        /// The VM asked for a role neither `[cloud_iid] roles` nor its resolve row
        /// admits.
        Role = "cloud-role",
        /// An OIDC provider's keys could not be fetched from its issuer (see
        /// the control plane's log): the token was not verified.
        Jwks = "cloud-jwks",
    }
}

/// The spec's `maxAgeMs` default for GCP identity tokens.
pub(crate) const DEFAULT_MAX_AGE_MS: i64 = 10 * 60_000;
/// How far ahead of the database's time a document may be issued.
const MAX_FUTURE_MS: i64 = 60_000;
/// The longest account, zone or instance id taken from a document.
const MAX_ID_LEN: usize = 128;

/// `[cloud_iid]`: the audience documents must name, their maximum age, and
/// one verifier configuration per provider (`None`: that provider is
/// refused as unknown).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudIidConfig {
    pub audience: Option<String>,
    pub max_age_ms: i64,
    /// The roles any admitted VM may join as (`[cloud_iid] roles`, default
    /// `node` only): a site node or a ramdisk needs more than a cloud's
    /// word about which VM it is, so the operator says so.
    pub roles: Vec<Role>,
    pub gcp: Option<gcp::GcpKeys>,
    pub aws: Option<aws::AwsKeys>,
    pub azure: Option<azure::AzureTrust>,
    /// `[cloud_iid.oidc.<name>]`, by name.
    pub oidc: Vec<oidc::OidcProvider>,
}

impl Default for CloudIidConfig {
    fn default() -> Self {
        CloudIidConfig {
            audience: None,
            max_age_ms: DEFAULT_MAX_AGE_MS,
            roles: vec![Role::Node],
            gcp: None,
            aws: None,
            azure: None,
            oidc: Vec::new(),
        }
    }
}

/// Who a verified document says the VM is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudIdentity {
    /// `gcp`, `aws`, `azure` or `oidc:<name>`.
    pub provider: String,
    /// GCP: the project id; AWS: the account id; Azure: the subscription id.
    pub account: String,
    pub zone: String,
    pub instance: String,
}

impl CloudIdentity {
    /// Refuses empty or overlong ids (`cloud-malformed`).
    fn new(
        provider: String,
        account: String,
        zone: String,
        instance: String,
    ) -> Result<Self, CloudReason> {
        let ok = |s: &str| !s.is_empty() && s.len() <= MAX_ID_LEN && !s.contains('/');
        if !ok(&account) || !ok(&instance) || zone.len() > MAX_ID_LEN {
            return Err(CloudReason::Malformed);
        }
        Ok(CloudIdentity {
            provider,
            account,
            zone,
            instance,
        })
    }

    /// The `attestation_uses` subject: one per instance, ever.
    fn subject(&self) -> String {
        format!("{}/{}/{}", self.provider, self.account, self.instance)
    }
}

/// The time window a document must fall in, from the database's clock.
pub struct Freshness {
    pub now: UnixMs,
    pub max_age_ms: i64,
}

impl Freshness {
    /// `not_before` (Unix milliseconds) not in the future.
    fn not_before(&self, not_before: i64) -> Result<(), CloudReason> {
        if not_before > self.now.saturating_add(MAX_FUTURE_MS) {
            return Err(CloudReason::Future);
        }
        Ok(())
    }

    /// `issued_at` and `expires_at` in Unix milliseconds.
    fn check(&self, issued_at: i64, expires_at: i64) -> Result<(), CloudReason> {
        if issued_at > self.now.saturating_add(MAX_FUTURE_MS) {
            return Err(CloudReason::Future);
        }
        if self.now >= issued_at.saturating_add(self.max_age_ms) || self.now >= expires_at {
            return Err(CloudReason::Stale);
        }
        Ok(())
    }
}

pub(crate) struct CloudIidAttestor {
    config: CloudIidConfig,
    /// The keys fetched from OIDC issuers.
    jwks: oidc::fetch::JwksCache,
}

/// What [`CloudIidAttestor::identify`] needs before it can decide.
enum Identified {
    Id(CloudIdentity),
    /// An OIDC provider's keys, fetched outside the transaction first.
    Fetch(oidc::fetch::JwksWork),
}

impl CloudIidAttestor {
    pub(crate) fn new(config: CloudIidConfig) -> Self {
        CloudIidAttestor {
            config,
            jwks: oidc::fetch::JwksCache::default(),
        }
    }

    fn oidc_provider(&self, name: &str) -> Option<&oidc::OidcProvider> {
        self.config.oidc.iter().find(|p| p.name == name)
    }

    /// An OIDC token, verified with the provider's file keys, the keys this
    /// join's [`Attestor::prepare`] fetched, or the cached ones.
    fn identify_oidc(
        &self,
        provider: &oidc::OidcProvider,
        document: &str,
        now: UnixMs,
        prepared: &Prepared,
    ) -> Result<Identified, CloudReason> {
        let token = oidc::Token::parse(document)?;
        let fresh = Freshness {
            now,
            max_age_ms: provider.max_age_ms,
        };
        let keys = match &provider.keys {
            oidc::KeySource::File(keys) => std::sync::Arc::new(keys.clone()),
            oidc::KeySource::Fetch(config) => match prepared.get::<std::sync::Arc<oidc::Jwks>>() {
                Some(keys) => keys.clone(),
                None => match self.jwks.lookup(
                    &provider.name,
                    config,
                    token.kid(),
                    std::time::Instant::now(),
                ) {
                    oidc::fetch::Cached::Keys(keys) => keys,
                    oidc::fetch::Cached::Fetch(need) => {
                        return Ok(Identified::Fetch(oidc::fetch::JwksWork {
                            provider: provider.name.clone(),
                            need,
                        }))
                    }
                },
            },
        };
        oidc::verify(provider, &keys, &token, &fresh).map(Identified::Id)
    }

    /// The provider's verifier, or the refusal reason.
    fn identify(
        &self,
        evidence: &Evidence,
        now: UnixMs,
        prepared: &Prepared,
    ) -> Result<Identified, CloudReason> {
        let fresh = Freshness {
            now,
            max_age_ms: self.config.max_age_ms,
        };
        if let Some(name) = evidence.provider.strip_prefix(oidc::PREFIX) {
            let provider = self
                .oidc_provider(name)
                .ok_or(CloudReason::UnknownProvider)?;
            return self.identify_oidc(provider, &evidence.document, now, prepared);
        }
        match evidence.provider.as_str() {
            GCP => {
                let (Some(keys), Some(audience)) = (&self.config.gcp, &self.config.audience) else {
                    return Err(CloudReason::UnknownProvider);
                };
                gcp::verify(keys, &evidence.document, audience, &fresh)
            }
            AWS => {
                let keys = self
                    .config
                    .aws
                    .as_ref()
                    .ok_or(CloudReason::UnknownProvider)?;
                aws::verify(keys, &evidence.document, evidence.signature.as_deref())
            }
            AZURE => {
                let (Some(trust), Some(audience)) = (&self.config.azure, &self.config.audience)
                else {
                    return Err(CloudReason::UnknownProvider);
                };
                azure::verify(trust, &evidence.document, audience, &fresh)
            }
            _ => Err(CloudReason::UnknownProvider),
        }
        .map(Identified::Id)
    }
}

impl Attestor for CloudIidAttestor {
    fn id(&self) -> AttestorId {
        AttestorId::CloudIid
    }

    fn roles(&self) -> crate::model::attestor::Roles {
        crate::model::attestor::Roles {
            admits: &[Role::Node, Role::Site, Role::Ramdisk],
            refusal: Some(CloudReason::Role.any()),
        }
    }

    /// Fetches an OIDC provider's keys from its issuer (outside the join
    /// transaction); a failure refuses the join `cloud-jwks`.
    fn prepare(
        &self,
        _db: &crate::store::Store,
        work: &Work,
        _source: Option<std::net::IpAddr>,
    ) -> Result<Prepared, Refusal> {
        let Some(work) = work.get::<oidc::fetch::JwksWork>() else {
            return Err(Refusal::fault(crate::model::attestor::Fault::Internal(
                "cloud-iid asked for work it does not know".to_owned(),
            )));
        };
        let Some(provider) = self.oidc_provider(&work.provider) else {
            return Err(Refusal::new(CloudReason::UnknownProvider));
        };
        let oidc::KeySource::Fetch(config) = &provider.keys else {
            return Err(Refusal::new(CloudReason::UnknownProvider));
        };
        match self
            .jwks
            .refresh(provider, config, work.need, std::time::Instant::now())
        {
            Ok(keys) => Ok(Prepared::new(keys)),
            Err(e) => {
                tracing::warn!(provider = %provider.provider(), issuer = %provider.issuer, error = %e, "cloud-iid: cannot fetch the OIDC issuer's keys");
                Err(Refusal::new(CloudReason::Jwks).with_detail(e.to_string(), None))
            }
        }
    }

    fn verify(&self, tx: &Tx<'_>, input: &AttestInput<'_>) -> Result<Verdict, Refusal> {
        let evidence = Evidence::from_json(input.evidence)
            .map_err(|_| Refusal::new(CloudReason::Malformed))?;
        let id = match self
            .identify(&evidence, input.now, input.prepared)
            .map_err(Refusal::new)?
        {
            Identified::Id(id) => id,
            Identified::Fetch(work) => return Ok(Verdict::Prepare(Work::new(work))),
        };
        let subject = id.subject();
        if uses::is_spent(tx, AttestorId::CloudIid, &subject)? {
            return Err(Refusal::new(CloudReason::InstanceReused));
        }
        let place = place(tx, &id, &self.config.roles)?;
        // Admitted exactly once, ever: the row never expires.
        if !uses::spend(tx, AttestorId::CloudIid, &subject, UnixMs::MAX, input.now)? {
            return Err(Refusal::new(CloudReason::InstanceReused));
        }
        tracing::info!(provider = %id.provider, account = %id.account, zone = %id.zone, instance = %id.instance, node = ?place.reclaim_node_id, site = ?place.scope.as_ref().and_then(|s| s.site_id.as_deref()), "cloud-iid: verified identity document");
        Ok(Verdict::Admit(Box::new(place)))
    }
}

/// Where a verified VM joins: a known instance as its node (a reclaim,
/// which JoinService refuses for a retired or deleted node), else by the
/// row that covers its account and zone: its pool, its roles and, for a row
/// that names a site, as a site node of that site and only so. No row: the
/// VM is refused `unknown-instance`, as is one whose zone names no site
/// for a `--site-from zone` row.
fn place(
    tx: &Tx<'_>,
    id: &CloudIdentity,
    config_roles: &[Role],
) -> Result<AttestationResult, Refusal> {
    if let Some(node) = resolve::instance_node(tx, &id.provider, &id.account, &id.instance)? {
        return Ok(AttestationResult {
            node_key: NodeKey::Unattested,
            reclaim_node_id: Some(node),
            ..AttestationResult::default()
        });
    }
    let Some(row) = resolve::lookup(tx, &id.provider, &id.account, &id.zone)? else {
        return Err(Refusal::new(CloudReason::UnknownInstance));
    };
    let site_id = match &row.site {
        None => None,
        Some(resolve::SiteRule::Site(site)) => Some(site.clone()),
        Some(resolve::SiteRule::FromZone) => {
            let found = match crate::model::sites::resolve(tx, &id.zone) {
                _ if id.zone.is_empty() => None,
                Ok(site) => Some(site),
                Err(crate::model::pools::PoolError::Db(e)) => return Err(e.into()),
                Err(_) => None,
            };
            let Some(site) = found else {
                return Err(Refusal::new(CloudReason::UnknownInstance)
                    .with_detail(format!("zone {:?} names no site", id.zone), None));
            };
            Some(site)
        }
    };
    let roles = match &site_id {
        // A site fixes the role, as a tpm resolve entry's does.
        Some(_) => vec![Role::Site],
        None => {
            let mut roles = config_roles.to_vec();
            roles.extend(row.roles.iter().filter(|r| !config_roles.contains(r)));
            roles
        }
    };
    Ok(AttestationResult {
        node_key: NodeKey::Unattested,
        pool_id: row.pool,
        roles: Some(roles),
        scope: site_id.map(|site_id| {
            Box::new(crate::model::records::NodeScope {
                site_id: Some(site_id),
                ..Default::default()
            })
        }),
        ..AttestationResult::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_window() {
        let f = Freshness {
            now: 1_000_000,
            max_age_ms: DEFAULT_MAX_AGE_MS,
        };
        assert_eq!(f.check(1_000_000, 2_000_000), Ok(()));
        assert_eq!(
            f.check(1_000_000 - DEFAULT_MAX_AGE_MS, 9_000_000),
            Err(CloudReason::Stale)
        );
        assert_eq!(f.check(999_000, 1_000_000), Err(CloudReason::Stale));
        assert_eq!(
            f.check(1_000_000 + 61_000, 9_000_000),
            Err(CloudReason::Future)
        );
        assert_eq!(f.check(1_000_000 + 60_000, 9_000_000), Ok(()));
    }

    #[test]
    fn identities_are_bounded() {
        let id = |a: &str, i: &str| CloudIdentity::new(GCP.into(), a.into(), "z".into(), i.into());
        assert_eq!(id("p", "1").unwrap().subject(), "gcp/p/1");
        assert!(id("", "1").is_err());
        assert!(id("p/q", "1").is_err());
        assert!(id("p", &"9".repeat(129)).is_err());
    }
}
