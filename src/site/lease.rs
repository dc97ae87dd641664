//! The site's boot lease `site:<id>:boot`: acquired, renewed at about a
//! third of its TTL, released at shutdown; a standby asks again as the
//! holder's lease runs out, and a node without the lease asks at most a
//! TTL apart ([`Schedule`]). The HTTP side signs only while
//! [`LeaseView::held`] says so, and a lost lease clears it at once.

use std::time::Duration;

use bc_wire::site_v1::LeaseResponse;
use time::OffsetDateTime;
use tokio::sync::watch;

use crate::backoff::Backoff;
use crate::client::ClientError;
use crate::clock;
use crate::sitedata::state::{Held, StateFile};

/// What the boot server reads: the lease, if held and not past its expiry.
#[derive(Clone)]
pub(crate) struct LeaseView(watch::Receiver<Option<Held>>);

impl LeaseView {
    pub(crate) fn held(&self, now: OffsetDateTime) -> Option<Held> {
        (*self.0.borrow()).filter(|h| now < h.expires_at)
    }

    /// Waits, at most `limit`, until the lease is no longer held at `epoch`
    /// (lost, or taken again at another).
    pub(crate) async fn moved_from(&self, epoch: u64, limit: Duration) {
        let mut rx = self.0.clone();
        let moved = rx.wait_for(|h| h.map(|h| h.epoch) != Some(epoch));
        // A timeout or a closed channel: the caller looks at the lease again.
        let _ = tokio::time::timeout(limit, moved).await;
    }
}

/// The shortest and longest wait before a renewal.
const MIN_RENEW: Duration = Duration::from_millis(200);
const MAX_RENEW: Duration = Duration::from_secs(600);
/// The lease TTL assumed until an answer shows it: the control plane's
/// default (`[discovery] lease_ttl`).
const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// What one answer means: the lease now, and how long until the next call.
pub(super) fn after_answer(resp: &LeaseResponse, now: OffsetDateTime) -> Option<(Held, Duration)> {
    if !resp.held {
        return None;
    }
    let expires_at = ms_to_time(resp.expires_at_unix_ms);
    let left = time_left(expires_at, now);
    Some((
        Held {
            epoch: resp.epoch,
            expires_at,
        },
        renew_wait(left),
    ))
}

/// A third of what a held lease has left, within [`MIN_RENEW`, `MAX_RENEW`].
fn renew_wait(left: Duration) -> Duration {
    (left / 3).clamp(MIN_RENEW, MAX_RENEW)
}

/// What is left until `expires_at` (zero once past).
fn time_left(expires_at: OffsetDateTime, now: OffsetDateTime) -> Duration {
    Duration::try_from(expires_at - now).unwrap_or(Duration::ZERO)
}

/// How long to wait after a failed call: the backoff, but while a lease is
/// still held, within what it has left (a third of it, at least
/// [`MIN_RENEW`]), so that one failed renewal does not lose the lease and
/// fail the assertions in flight (`lease-epoch`) when a retry would have
/// kept it.
pub(super) fn retry_wait(backoff: Duration, held: Option<Held>, now: OffsetDateTime) -> Duration {
    let Some(h) = held.filter(|h| now < h.expires_at) else {
        return backoff;
    };
    let left = Duration::try_from((h.expires_at - now) / 3).unwrap_or(MIN_RENEW);
    backoff.min(left.max(MIN_RENEW))
}

/// When the lease loop calls next. A node that does not hold the lease asks
/// again at most a lease TTL later (jittered, so that site nodes that lost
/// it together do not ask together), whatever its backoff has grown to: a
/// site must not stop serving for `backoff_max` after an outage longer
/// than the lease. The backoff restarts when the lease is lost (the fast
/// retries that tried to keep it say nothing of how long the control plane
/// has been away) and whenever the control plane answers.
pub(super) struct Schedule {
    backoff: Backoff,
    /// `[node] backoff_max`: no wait is longer.
    max: Duration,
    /// The TTL as answers showed it: what the last grant left, or the
    /// longest another holder had left; `None` before any answer.
    ttl: Option<Duration>,
    /// Whether the last answer granted the lease to this node.
    holding: bool,
}

impl Schedule {
    pub(super) fn new(min: Duration, max: Duration) -> Schedule {
        Schedule {
            backoff: Backoff::new(min, max),
            max: max.max(min),
            ttl: None,
            holding: false,
        }
    }

    /// The lease TTL as this node knows it.
    pub(super) fn ttl(&self) -> Duration {
        self.ttl.unwrap_or(DEFAULT_TTL)
    }

    /// The lease was granted (acquired or renewed) with `left` to run:
    /// renewed at a third of it.
    pub(super) fn granted(&mut self, left: Duration) -> Duration {
        self.backoff.succeed();
        self.holding = true;
        self.ttl = Some(left.max(MIN_RENEW));
        renew_wait(left)
    }

    /// Another node holds the lease for `left` more: asked again as it
    /// runs out (up to a tenth of the TTL after, by `jitter` in [0, 1)),
    /// at most a TTL and `backoff_max` later.
    pub(super) fn standing_by(&mut self, left: Duration, jitter: f64) -> Duration {
        self.backoff.succeed();
        self.holding = false;
        let ttl = self.ttl.map_or(left, |t| t.max(left)).max(MIN_RENEW);
        self.ttl = Some(ttl);
        (left + (ttl / 10).mul_f64(jitter))
            .min(ttl)
            .min(self.max)
            .clamp(MIN_RENEW, MAX_RENEW)
    }

    /// A call failed, with `held` what this node still holds at `now`: its
    /// attempt number and the wait. Within what a held lease has left
    /// ([`retry_wait`]); otherwise the backoff (restarted if the lease was
    /// just lost) but at most a TTL, shortened by up to a quarter by
    /// `jitter` in [0, 1).
    pub(super) fn failed(
        &mut self,
        held: Option<Held>,
        now: OffsetDateTime,
        jitter: f64,
    ) -> (u32, Duration) {
        let held = held.filter(|h| now < h.expires_at);
        if self.holding && held.is_none() {
            self.holding = false;
            self.backoff.succeed();
        }
        let (attempt, backoff) = self.backoff.fail();
        let wait = match held {
            Some(_) => retry_wait(backoff, held, now),
            None => {
                let wait = backoff.min(self.ttl());
                wait.saturating_sub(wait.mul_f64(jitter.clamp(0.0, 1.0) / 4.0))
                    .max(MIN_RENEW)
            }
        };
        (attempt, wait)
    }
}

/// A fraction in [0, 1) for spreading retries (0 if the system has no
/// randomness to give: the waits are then the plain ones).
fn jitter() -> f64 {
    getrandom::u32().map_or(0.0, |r| f64::from(r) / (f64::from(u32::MAX) + 1.0))
}

fn ms_to_time(ms: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// Holds the lease of `site_id` until `shutdown` changes, then releases it.
pub(super) struct Holder {
    identity: std::sync::Arc<super::identity::NodeIdentity>,
    site_id: String,
    tx: watch::Sender<Option<Held>>,
    schedule: Schedule,
    state: StateFile,
}

impl Holder {
    pub(super) fn new(
        identity: std::sync::Arc<super::identity::NodeIdentity>,
        site_id: String,
        schedule: Schedule,
        state: StateFile,
    ) -> (Holder, LeaseView) {
        let (tx, rx) = watch::channel(None);
        (
            Holder {
                identity,
                site_id,
                tx,
                schedule,
                state,
            },
            LeaseView(rx),
        )
    }

    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
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
        let now = clock::now();
        match answer {
            Ok(resp) => match after_answer(&resp, now) {
                Some((held, _)) => {
                    self.publish(Some(held));
                    if current.map(|h| h.epoch) != Some(held.epoch) {
                        tracing::info!(site_id = %self.site_id, epoch = held.epoch, expires_at = %crate::pki::rfc3339(held.expires_at), "boot lease acquired");
                    }
                    self.schedule.granted(time_left(held.expires_at, now))
                }
                None => {
                    self.publish(None);
                    let left = time_left(ms_to_time(resp.expires_at_unix_ms), now);
                    let wait = self.schedule.standing_by(left, jitter());
                    tracing::info!(site_id = %self.site_id, holder = %resp.holder_node_id, epoch = resp.epoch, retry_in_ms = wait.as_millis() as u64, "boot lease held by another site node; standing by");
                    wait
                }
            },
            Err(e) => {
                if matches!(e, ClientError::AccessDenied) || current.is_none() {
                    // Refused: the lease moved on (or this node may not
                    // hold it). Stop signing now, not at its expiry.
                    self.publish(None);
                }
                let held = *self.tx.borrow();
                let (attempt, wait) = self.schedule.failed(held, now, jitter());
                tracing::warn!(site_id = %self.site_id, error = %e, held = held.is_some_and(|h| now < h.expires_at), attempt, retry_in_ms = wait.as_millis() as u64, lease_ttl_ms = self.schedule.ttl().as_millis() as u64, "boot lease call failed");
                wait
            }
        }
    }

    /// Keeps what the control plane says admits a machine's commissioning
    /// (authenticated: the answer came over this node's mTLS connection),
    /// for `bcd doctor`; logs it when it changes.
    fn learn_commissioning(&mut self, resp: &LeaseResponse) {
        let learned =
            crate::sitedata::commissioning::Commissioning::from_wire(resp.commissioning.as_ref());
        let policy = |c: &Option<crate::sitedata::commissioning::Commissioning>| {
            c.as_ref().and_then(|c| c.policy())
        };
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

    /// The control plane's lease table as one site node sees it, on tokio's
    /// paused clock: down during `outage`, else granting `ttl` to this
    /// node, unless `other` (another node's lease, renewed until the
    /// instant given) holds it.
    struct Plane {
        base: OffsetDateTime,
        start: tokio::time::Instant,
        ttl: Duration,
        outage: std::ops::Range<Duration>,
        /// Another holder renews until then, and dies.
        other_until: Option<Duration>,
    }

    /// What the node saw: when, the kind of outcome, the attempt, the wait.
    #[derive(Debug)]
    struct Call {
        at: Duration,
        outcome: &'static str,
        attempt: u32,
        wait: Duration,
    }

    impl Plane {
        fn now(&self) -> OffsetDateTime {
            self.base + (tokio::time::Instant::now() - self.start)
        }

        /// The other holder's expiry at `t`, if it still holds.
        fn other_expiry(&self, t: Duration) -> Option<Duration> {
            let until = self.other_until?;
            let last_renewal = t.min(until);
            let expiry = last_renewal + self.ttl;
            (t < expiry).then_some(expiry)
        }

        /// The lease loop's decisions until `end`, with `jitter` for every
        /// draw, as `Holder::step` takes them.
        async fn run(&self, schedule: &mut Schedule, end: Duration, jitter: f64) -> Vec<Call> {
            let mut held: Option<Held> = None;
            let mut calls = vec![];
            loop {
                let at = tokio::time::Instant::now() - self.start;
                if at >= end {
                    return calls;
                }
                let now = self.now();
                let (outcome, attempt, wait) = if self.outage.contains(&at) {
                    if held.is_some_and(|h| now >= h.expires_at) {
                        held = None;
                    }
                    let (attempt, wait) = schedule.failed(held, now, jitter);
                    ("failed", attempt, wait)
                } else if let Some(expiry) = self.other_expiry(at) {
                    held = None;
                    ("standby", 0, schedule.standing_by(expiry - at, jitter))
                } else {
                    let expires_at = now + self.ttl;
                    held = Some(Held {
                        epoch: 1,
                        expires_at,
                    });
                    ("granted", 0, schedule.granted(self.ttl))
                };
                calls.push(Call {
                    at,
                    outcome,
                    attempt,
                    wait,
                });
                tokio::time::sleep(wait).await;
            }
        }
    }

    fn plane(ttl: u64, outage: std::ops::Range<u64>, other_until: Option<u64>) -> Plane {
        Plane {
            base: OffsetDateTime::from_unix_timestamp(1_000_000).unwrap(),
            start: tokio::time::Instant::now(),
            ttl: Duration::from_secs(ttl),
            outage: Duration::from_secs(outage.start)..Duration::from_secs(outage.end),
            other_until: other_until.map(Duration::from_secs),
        }
    }

    fn first_grant_after(calls: &[Call], t: u64) -> Duration {
        calls
            .iter()
            .find(|c| c.outcome == "granted" && c.at >= Duration::from_secs(t))
            .unwrap_or_else(|| panic!("no grant after {t} s: {calls:#?}"))
            .at
    }

    /// The outage: the control plane away 40 s, longer than the
    /// 30 s lease, with the default backoff (30 s doubling to 600 s). The
    /// fast retries that tried to keep the lease (a dozen) do not carry
    /// into the wait after it is lost: the node asks at most a TTL apart,
    /// and holds the lease again within a TTL of the control plane's
    /// return, whatever the jitter (0: the longest waits).
    #[tokio::test(start_paused = true)]
    async fn a_lease_lost_in_an_outage_is_taken_again_within_a_ttl_of_the_return() {
        for jitter in [0.0, 0.5, 0.999] {
            let cp = plane(30, 60..100, None);
            let mut schedule = Schedule::new(Duration::from_secs(30), Duration::from_secs(600));
            let calls = cp
                .run(&mut schedule, Duration::from_secs(300), jitter)
                .await;
            let failed: Vec<&Call> = calls.iter().filter(|c| c.outcome == "failed").collect();
            // Retried within what the lease had left: several tries.
            let while_held: Vec<&&Call> = failed
                .iter()
                .filter(|c| c.wait < Duration::from_secs(10))
                .collect();
            assert!(while_held.len() >= 5, "{calls:#?}");
            // Once lost, the backoff starts again at its first attempt,
            // and no wait is longer than the TTL.
            let lost = failed
                .iter()
                .find(|c| c.wait >= Duration::from_secs(10))
                .unwrap_or_else(|| panic!("{calls:#?}"));
            assert_eq!(lost.attempt, 1, "{calls:#?}");
            assert!(
                failed.iter().all(|c| c.wait <= Duration::from_secs(30)),
                "{calls:#?}"
            );
            let back = first_grant_after(&calls, 100);
            assert!(back <= Duration::from_secs(130), "{back:?}: {calls:#?}");
            // And it keeps it: renewed at a third of the TTL again.
            assert!(calls
                .iter()
                .filter(|c| c.at > back)
                .all(|c| c.outcome == "granted" && c.wait == Duration::from_secs(10)));
        }
    }

    /// The same on a control plane with a 7-day lease: the wait after the
    /// loss is the backoff's (restarted), not a week.
    #[tokio::test(start_paused = true)]
    async fn a_long_lease_lost_waits_the_restarted_backoff() {
        let week = 7 * 86_400;
        let cp = plane(week, 60..(week + 2000), None);
        let mut schedule = Schedule::new(Duration::from_secs(30), Duration::from_secs(600));
        let calls = cp
            .run(&mut schedule, Duration::from_secs(week + 4000), 0.0)
            .await;
        let expiry = Duration::from_secs(week);
        let after: Vec<(u32, u64)> = calls
            .iter()
            .filter(|c| c.outcome == "failed" && c.at >= expiry)
            .map(|c| (c.attempt, c.wait.as_secs()))
            .take(6)
            .collect();
        assert_eq!(
            after,
            vec![(1, 30), (2, 60), (3, 120), (4, 240), (5, 480), (6, 600)],
            "{calls:#?}"
        );
        let back = first_grant_after(&calls, week + 2000);
        assert!(back <= Duration::from_secs(week + 2000 + 600), "{back:?}");
    }

    /// A standby whose backoff would have grown (30 s doubling) asks again
    /// as the holder's lease runs out: it takes over within a tenth of a
    /// TTL of the holder's last expiry, not minutes later.
    #[tokio::test(start_paused = true)]
    async fn a_standby_asks_again_as_the_holders_lease_runs_out() {
        let cp = plane(30, 0..0, Some(200));
        let mut schedule = Schedule::new(Duration::from_secs(30), Duration::from_secs(600));
        let calls = cp.run(&mut schedule, Duration::from_secs(400), 0.999).await;
        assert!(
            calls
                .iter()
                .filter(|c| c.outcome == "standby")
                .all(|c| c.wait <= Duration::from_secs(30)),
            "{calls:#?}"
        );
        let taken = first_grant_after(&calls, 0);
        assert!(
            taken >= Duration::from_secs(230) && taken <= Duration::from_secs(233),
            "{taken:?}: {calls:#?}"
        );
    }

    /// An answer restarts the backoff: a failure after a standby answer is
    /// attempt 1 again; before any answer the TTL assumed is the control
    /// plane's default.
    #[test]
    fn an_answer_restarts_the_backoff() {
        let now = OffsetDateTime::from_unix_timestamp(1_000).unwrap();
        let mut s = Schedule::new(Duration::from_secs(1), Duration::from_secs(600));
        assert_eq!(s.ttl(), DEFAULT_TTL);
        let waits: Vec<(u32, u64)> = (0..7)
            .map(|_| s.failed(None, now, 0.0))
            .map(|(a, w)| (a, w.as_secs()))
            .collect();
        assert_eq!(
            waits,
            vec![(1, 1), (2, 2), (3, 4), (4, 8), (5, 16), (6, 30), (7, 30)]
        );
        // Jittered: shortened by at most a quarter.
        let (_, w) = s.failed(None, now, 0.999);
        assert!(
            w > Duration::from_millis(22_500) && w < DEFAULT_TTL,
            "{w:?}"
        );
        assert_eq!(
            s.standing_by(Duration::from_secs(5), 0.0),
            Duration::from_secs(5)
        );
        assert_eq!(s.failed(None, now, 0.0), (1, Duration::from_secs(1)));
        // A lease with 8 s left: the TTL is now known to be at least that.
        s.granted(Duration::from_secs(8));
        assert_eq!(s.ttl(), Duration::from_secs(8));
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
