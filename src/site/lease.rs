//! The site's boot lease `site:<id>:boot`: acquired, renewed at about a
//! third of its TTL, released at shutdown; a standby retries with backoff
//! until the holder stops renewing. The HTTP side signs only while
//! [`LeaseView::held`] says so, and a lost lease clears it at once.

use std::time::Duration;

use bc_wire::site_v1::LeaseResponse;
use time::OffsetDateTime;
use tokio::sync::watch;

use crate::client::ClientError;
use crate::clock;
use crate::node::Backoff;

/// The lease as this node last had it confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub epoch: u64,
    /// The control plane's word, in its time.
    pub expires_at: OffsetDateTime,
}

/// What the boot server reads: the lease, if held and not past its expiry.
#[derive(Clone)]
pub struct LeaseView(watch::Receiver<Option<Held>>);

impl LeaseView {
    pub fn held(&self, now: OffsetDateTime) -> Option<Held> {
        (*self.0.borrow()).filter(|h| now < h.expires_at)
    }
}

/// The shortest and longest wait before a renewal.
const MIN_RENEW: Duration = Duration::from_millis(200);
const MAX_RENEW: Duration = Duration::from_secs(600);

/// What one answer means: the lease now, and how long until the next call.
pub fn after_answer(resp: &LeaseResponse, now: OffsetDateTime) -> Option<(Held, Duration)> {
    if !resp.held {
        return None;
    }
    let expires_at = ms_to_time(resp.expires_at_unix_ms);
    let left = (expires_at - now).max(time::Duration::ZERO);
    let wait = Duration::try_from(left / 3)
        .unwrap_or(MIN_RENEW)
        .clamp(MIN_RENEW, MAX_RENEW);
    Some((
        Held {
            epoch: resp.epoch,
            expires_at,
        },
        wait,
    ))
}

/// How long to wait after a failed call: the backoff, but while a lease is
/// still held, within what it has left (a third of it, at least
/// [`MIN_RENEW`]), so that one failed renewal does not lose the lease and
/// fail the assertions in flight (`lease-epoch`) when a retry would have
/// kept it.
pub fn retry_wait(backoff: Duration, held: Option<Held>, now: OffsetDateTime) -> Duration {
    let Some(h) = held.filter(|h| now < h.expires_at) else {
        return backoff;
    };
    let left = Duration::try_from((h.expires_at - now) / 3).unwrap_or(MIN_RENEW);
    backoff.min(left.max(MIN_RENEW))
}

fn ms_to_time(ms: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// Holds the lease of `site_id` until `shutdown` changes, then releases it.
pub struct Holder {
    identity: std::sync::Arc<super::identity::NodeIdentity>,
    site_id: String,
    tx: watch::Sender<Option<Held>>,
    backoff: Backoff,
    state: super::state::StateFile,
}

impl Holder {
    pub fn new(
        identity: std::sync::Arc<super::identity::NodeIdentity>,
        site_id: String,
        backoff: Backoff,
        state: super::state::StateFile,
    ) -> (Holder, LeaseView) {
        let (tx, rx) = watch::channel(None);
        (
            Holder {
                identity,
                site_id,
                tx,
                backoff,
                state,
            },
            LeaseView(rx),
        )
    }

    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        loop {
            let wait = self.step().await;
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => break,
            }
        }
        self.release().await;
    }

    /// One call: acquire, or renew what is held; how long until the next.
    async fn step(&mut self) -> Duration {
        let now = clock::now();
        let current = (*self.tx.borrow()).filter(|h| now < h.expires_at);
        let client = self.identity.current().await.client.clone();
        let answer = match current {
            Some(h) => client.renew_lease(&self.site_id, h.epoch).await,
            None => client.acquire_lease(&self.site_id).await,
        };
        if let Ok(resp) = &answer {
            self.learn_commissioning(resp);
        }
        match answer {
            Ok(resp) => match after_answer(&resp, clock::now()) {
                Some((held, wait)) => {
                    self.publish(Some(held));
                    if current.map(|h| h.epoch) != Some(held.epoch) {
                        tracing::info!(site_id = %self.site_id, epoch = held.epoch, expires_at = %crate::pki::rfc3339(held.expires_at), "boot lease acquired");
                    }
                    self.backoff.succeed();
                    wait
                }
                None => {
                    self.publish(None);
                    let (attempt, wait) = self.backoff.fail();
                    tracing::info!(site_id = %self.site_id, holder = %resp.holder_node_id, epoch = resp.epoch, attempt, retry_in_ms = wait.as_millis() as u64, "boot lease held by another site node; standing by");
                    wait
                }
            },
            Err(e) => {
                if matches!(e, ClientError::AccessDenied) || current.is_none() {
                    // Refused: the lease moved on (or this node may not
                    // hold it). Stop signing now, not at its expiry.
                    self.publish(None);
                }
                let (attempt, backoff) = self.backoff.fail();
                let wait = retry_wait(backoff, *self.tx.borrow(), clock::now());
                tracing::warn!(site_id = %self.site_id, error = %e, held = self.tx.borrow().is_some(), attempt, retry_in_ms = wait.as_millis() as u64, "boot lease call failed");
                wait
            }
        }
    }

    /// Keeps what the control plane says admits a machine's commissioning
    /// (authenticated: the answer came over this node's mTLS connection),
    /// for `bcd doctor`; logs it when it changes.
    fn learn_commissioning(&mut self, resp: &LeaseResponse) {
        let learned = super::commissioning::Commissioning::from_wire(resp.commissioning.as_ref());
        let policy =
            |c: &Option<super::commissioning::Commissioning>| c.as_ref().and_then(|c| c.policy());
        if policy(&learned) != policy(&self.state.base.commissioning) {
            if let Some(c) = &learned {
                tracing::info!(site_id = %self.site_id, "commissioning: {}", c.line());
            }
        }
        self.state.base.commissioning = learned;
    }

    /// Tells the boot server first (it stops signing at once), then
    /// `bcd status` through the state file.
    fn publish(&self, lease: Option<Held>) {
        self.tx.send_replace(lease);
        self.state.save(lease);
    }

    async fn release(&self) {
        let Some(h) = *self.tx.borrow() else { return };
        self.publish(None);
        match self
            .identity
            .current()
            .await
            .client
            .release_lease(&self.site_id, h.epoch)
            .await
        {
            Ok(_) => {
                tracing::info!(site_id = %self.site_id, epoch = h.epoch, "boot lease released")
            }
            Err(e) => {
                tracing::warn!(site_id = %self.site_id, error = %e, "cannot release the boot lease; it expires by itself")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_renewal_is_retried_within_what_the_lease_has_left() {
        let now = OffsetDateTime::from_unix_timestamp(1_000).unwrap();
        let held = Held {
            epoch: 2,
            expires_at: now + time::Duration::seconds(9),
        };
        // The node's backoff starts at 30 s, longer than the 9 s left.
        let backoff = Duration::from_secs(30);
        assert_eq!(retry_wait(backoff, Some(held), now), Duration::from_secs(3));
        // Close to the end: still tried before it, never a busy loop.
        let late = held.expires_at - time::Duration::milliseconds(100);
        assert_eq!(retry_wait(backoff, Some(held), late), MIN_RENEW);
        // A short backoff stays; without a lease (or past it) the backoff.
        let short = Duration::from_secs(1);
        assert_eq!(retry_wait(short, Some(held), now), short);
        assert_eq!(retry_wait(backoff, None, now), backoff);
        assert_eq!(retry_wait(backoff, Some(held), held.expires_at), backoff);
    }

    #[test]
    fn a_held_lease_is_renewed_at_a_third_of_what_is_left() {
        let now = OffsetDateTime::from_unix_timestamp(1_000).unwrap();
        let resp = LeaseResponse {
            held: true,
            epoch: 4,
            expires_at_unix_ms: 1_030_000,
            ..Default::default()
        };
        let (held, wait) = after_answer(&resp, now).unwrap();
        assert_eq!(held.epoch, 4);
        assert_eq!(wait, Duration::from_secs(10));
        let standby = LeaseResponse {
            held: false,
            ..resp
        };
        assert_eq!(after_answer(&standby, now), None);
    }
}
