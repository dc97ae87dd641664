//! `bettercompute.site.v1.SiteService` over mTLS: the boot lease and the
//! SecretRequest a site node (`bcd site`) makes. Every refusal is
//! [`ClientError::AccessDenied`]; the reason stays on the control plane.

use bc_wire::endpoints;
use bc_wire::site_v1::{
    AcquireLeaseRequest, BootEntries, LeaseResponse, ListBootEntriesRequest, ReleaseLeaseRequest,
    RenewLeaseRequest, SecretRequest, SecretResponse,
};
use prost::Message;
use reqwest::Url;

use super::{Client, ClientError};

impl Client {
    /// Takes or keeps the site's boot lease; the answer says who holds it.
    pub async fn acquire_lease(&self, site_id: &str) -> Result<LeaseResponse, ClientError> {
        let req = AcquireLeaseRequest {
            site_id: site_id.to_owned(),
        };
        self.site_call(endpoints::ACQUIRE_LEASE, &req, "LeaseResponse")
            .await
    }

    /// Extends the hold at `epoch`; refused once the lease moved on.
    pub async fn renew_lease(
        &self,
        site_id: &str,
        epoch: u64,
    ) -> Result<LeaseResponse, ClientError> {
        let req = RenewLeaseRequest {
            site_id: site_id.to_owned(),
            epoch,
        };
        self.site_call(endpoints::RENEW_LEASE, &req, "LeaseResponse")
            .await
    }

    /// Gives the lease up, so a standby takes it at once.
    pub(crate) async fn release_lease(
        &self,
        site_id: &str,
        epoch: u64,
    ) -> Result<LeaseResponse, ClientError> {
        let req = ReleaseLeaseRequest {
            site_id: site_id.to_owned(),
            epoch,
        };
        self.site_call(endpoints::RELEASE_LEASE, &req, "LeaseResponse")
            .await
    }

    /// Fetches a secret of a workflow of this site (a boot entry's
    /// discovery token); `req` is signed by the node key (see
    /// [`bc_wire::site::sign_secret_request`]).
    pub async fn get_secret(&self, req: &SecretRequest) -> Result<SecretResponse, ClientError> {
        self.site_call(endpoints::GET_SECRET, req, "SecretResponse")
            .await
    }

    /// The site's open boot entries (for its lease holder): which MACs it
    /// boots, with which product UUID, under which workflow.
    pub async fn list_boot_entries(&self, site_id: &str) -> Result<BootEntries, ClientError> {
        let req = ListBootEntriesRequest {
            site_id: site_id.to_owned(),
        };
        self.site_call(endpoints::LIST_BOOT_ENTRIES, &req, "BootEntries")
            .await
    }

    async fn site_call<Resp: Message + Default>(
        &self,
        path: &str,
        req: &impl Message,
        expected: &'static str,
    ) -> Result<Resp, ClientError> {
        if !self.mtls {
            return Err(ClientError::NoClientCertificate);
        }
        let url = Url::parse(&format!("{}{path}", self.api))
            .map_err(|e| ClientError::Setup(e.to_string()))?;
        let answer = self.post(&url, req.encode_to_vec()).await?;
        Resp::decode(answer.body.as_slice()).map_err(|e| ClientError::BadAnswer {
            expected,
            cause: format!("{e}{}", answer.content_type_hint()),
        })
    }
}
