//! The boot server's answers, one per request, independent of sockets:
//! `/boot.ipxe` (a signed boot script or the exit script), the ramdisk's
//! two files, nothing else.

use std::net::IpAddr;
use std::sync::Arc;

use bc_wire::site;
use bc_wire::site_v1::SecretRequestBody;

use super::entries::{Entries, Lookup};
use super::identity::NodeIdentity;
use super::image::{Image, Part, Served};
use super::lease::LeaseView;
use super::render::{self, BootQuery, Vouch};
use crate::client::ClientError;
use crate::clock;
use crate::site_settings::SiteSettings;

/// The failpoint that holds a GetSecret answer until the lease has moved.
const SECRET_OUTLASTS_LEASE: &str = "site-secret-outlasts-lease";

/// What a request gets.
#[derive(Debug)]
pub enum Response {
    Script(String),
    File(Served),
    NotFound,
}

/// Everything a request needs, shared by all connections.
pub(crate) struct Site {
    pub settings: SiteSettings,
    /// Re-read when `bcd node` renews it.
    pub identity: Arc<NodeIdentity>,
    pub lease: LeaseView,
    pub image: Image,
    /// The site's open boot entries (see [`super::entries`]).
    pub entries: Entries,
}

impl Site {
    pub(crate) async fn respond(
        self: &Arc<Self>,
        path: &str,
        query: &str,
        peer: IpAddr,
    ) -> Response {
        match path {
            "/boot.ipxe" => Response::Script(self.boot_ipxe(query, peer).await),
            "/ramdisk/vmlinuz" => self.file(Part::Kernel),
            "/ramdisk/initrd" => self.file(Part::Initrd),
            _ => Response::NotFound,
        }
    }

    /// A ramdisk file as it is now (see [`Image::open`]); a link or
    /// anything but a regular file is not found, and said in the log.
    fn file(&self, part: Part) -> Response {
        match self.image.open(part) {
            Ok(served) => Response::File(served),
            Err(e) => {
                tracing::warn!(error = %e, "ramdisk file not served");
                Response::NotFound
            }
        }
    }

    /// The script for the machine asking. Signs at most one assertion, and
    /// only while the lease is held, for a MAC with an open boot entry whose
    /// product UUID (when it names one) is the one iPXE sent, if any. The
    /// asserted IP is the connection's peer: a query says what a client
    /// wants, not what it is.
    async fn boot_ipxe(self: &Arc<Self>, query: &str, peer: IpAddr) -> String {
        let q = match render::parse_query(query) {
            Ok(q) => q,
            Err(e) => return self.exit("", &e.to_string()),
        };
        match self.vouch(&q, peer).await {
            Ok(script) => script,
            Err(reason) => self.exit(&q.mac, &reason),
        }
    }

    fn exit(&self, mac: &str, reason: &str) -> String {
        tracing::info!(mac = %mac, reason = %reason, "boot script rendered: exit");
        render::exit_script(reason)
    }

    async fn vouch(self: &Arc<Self>, q: &BootQuery, peer: IpAddr) -> Result<String, String> {
        let site_id = &self.settings.id;
        let held = self
            .lease
            .held(clock::now())
            .ok_or("this site node does not hold the boot lease")?;
        // One generation of the identity for the whole script.
        let me = self.identity.current().await;
        let client = me.client.clone();
        let entry = match self
            .entries
            .lookup(&q.mac, || client.list_boot_entries(site_id))
            .await
        {
            Lookup::Found(e) => e,
            Lookup::Unknown => {
                return Err(format!("no open boot entry for {} at this site", q.mac))
            }
            Lookup::Unreachable => return Err("the site cannot reach its control plane".to_owned()),
        };
        if let (Some(want), Some(said)) = (&entry.product_uuid, &q.uuid) {
            if want != said {
                // Said on the console and in the exit line (info: a client
                // repeating it must not flood the log).
                return Err(format!(
                    "the product UUID {said} is not the one of {}'s boot entry",
                    q.mac
                ));
            }
        }
        let body = SecretRequestBody {
            node_id: me.node_id.clone(),
            site_id: site_id.clone(),
            workflow_id: entry.workflow_id.clone(),
            issued_at_unix_ms: now_ms(),
            mac: q.mac.clone(),
        };
        let key = me.key.clone();
        let req = blocking(move || site::sign_secret_request(&body, |m| key.sign(m))).await?;
        let secret = match me.client.get_secret(&req).await {
            Ok(s) => s,
            Err(ClientError::AccessDenied) => {
                // The entry may have joined or closed since the listing (so
                // it is listed again), or this node or its request was
                // refused (stale, too many tokens): the reason stays on the
                // server, so say only that it refused.
                self.entries.forget(&q.mac).await;
                return Err(format!(
                    "the control plane refused this site node's secret request for {}",
                    q.mac
                ));
            }
            Err(e) => {
                tracing::warn!(mac = %q.mac, error = %e, "cannot fetch the boot entry's token");
                return Err("the site cannot reach its control plane".to_owned());
            }
        };
        // Test builds: the answer comes only once the lease has moved on, a
        // GetSecret slower than the lease that timing alone rarely gives.
        if crate::failpoint::active(SECRET_OUTLASTS_LEASE) {
            tracing::info!(mac = %q.mac, epoch = held.epoch, "failpoint: the secret answer waits for the lease to move");
            self.lease
                .moved_from(held.epoch, std::time::Duration::from_secs(60))
                .await;
        }
        // The lease may have moved during the call: sign only under one
        // still held at the same epoch.
        if self.lease.held(clock::now()).map(|h| h.epoch) != Some(held.epoch) {
            return Err("this site node lost the boot lease".to_owned());
        }
        // The entry's UUID when it has one (an iPXE UUID that differs was
        // refused above), else iPXE's.
        let product_uuid = Some(secret.product_uuid.to_ascii_lowercase())
            .filter(|u| !u.is_empty())
            .or_else(|| q.uuid.clone());
        let assertion = render::assertion(&Vouch {
            site_id,
            node_id: &me.node_id,
            epoch: held.epoch,
            mac: &q.mac,
            product_uuid: product_uuid.as_deref(),
            ip: peer,
            workflow_id: &secret.workflow_id,
            entry_not_after_ms: secret.not_after_unix_ms,
            now_ms: now_ms(),
        });
        let key = me.key.clone();
        let kid = key.kid();
        let signed =
            blocking(move || site::sign_assertion(&assertion, kid, |m| key.sign(m))).await?;
        tracing::info!(mac = %q.mac, workflow = %secret.workflow_id, epoch = held.epoch, "discovery assertion signed");
        let script = render::boot_script(
            &self.settings.public_url,
            &secret.token,
            &site::to_cmdline(&signed),
            clock::now().unix_timestamp(),
        );
        tracing::info!(mac = %q.mac, workflow = %secret.workflow_id, "boot script rendered: boot");
        Ok(script)
    }
}

/// A node key signs off the async thread: a TPM or the helper blocks.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::keys::KeyError> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the node key cannot sign");
            Err("the site's node key cannot sign".to_owned())
        }
        Err(_) => Err("the site's node key cannot sign".to_owned()),
    }
}

fn now_ms() -> i64 {
    i64::try_from(clock::unix_ms(clock::now())).unwrap_or(i64::MAX)
}
