//! Staying joined: the loop `bcd node` runs (and `bcd ramdisk`, after its
//! join).
//!
//! Loads the identity (a TPM key that no longer matches stops here with the
//! spec's hint), then loops:
//!
//! - certificate valid, not yet at its renewal point ([`NodeCert::renew_at`], 50-60 %
//!   of its lifetime): sleep until then;
//! - at its renewal point (or `--renew-now`): [`renew_once`]; a failure is
//!   logged as `renewal failed` with `attempt` and `expiresIn`, journaled,
//!   and retried after `[node] backoff_min` doubling up to `backoff_max`;
//! - expired, at most [`GRACE`] ago (the machine was off or cut off): re-join
//!   as itself with x509pop ([`crate::rejoin::rejoin_x509pop`]), with the same
//!   backoff;
//! - expired longer ago: stop (exit 1) and say what the operator must do.
//!
//! Every decision is one log event; every renewal and re-join, successful or
//! not, is one journal entry. All times come from [`crate::clock`].
mod renew;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use time::OffsetDateTime;

use crate::clock;
use crate::config::Config;
use crate::identity::rotation::{self, NextKey};
use crate::identity::Identity;
use crate::journal::{self, Kind};
use crate::keys::TpmAccess;
use crate::out::human;
use crate::pki::{rfc3339, NodeCert};

use crate::backoff::Backoff;
pub(crate) use renew::{renew_once, RenewError};

use crate::pki::GRACE;

/// The longest single sleep: the loop looks at the clock again at least this
/// often (a suspended machine, a clock that jumped).
const MAX_NAP: Duration = Duration::from_secs(600);

/// Stays joined with the configuration at `config_path`: `once` exits after
/// the first decision, `renew_now` renews whatever the certificate's age.
/// `bcd node` runs it, and `bcd ramdisk` after its join.
pub(crate) fn run(config_path: &Path, once: bool, renew_now: bool) -> anyhow::Result<ExitCode> {
    let config = Config::load(config_path)?;
    crate::identity::owner::trust_node_user(&config)?;
    // Under [helper], node keys only through bcd helper: no TPM opened here.
    let tpm = std::sync::Arc::new(TpmAccess::for_node(&config));
    let dir = &config.data_dir;
    let identity = match Identity::load(dir, &tpm) {
        Ok(Some(id)) => id,
        Ok(None) => {
            return Err(anyhow!(
                "not joined (no identity in {}); join first: bcd join",
                dir.display()
            ))
        }
        Err(e) => {
            return Err(anyhow::Error::new(e)
                .context(format!("the identity in {} does not load", dir.display())))
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // The command channel runs beside the loop (not for one pass).
    let channel = match once {
        true => None,
        false => crate::channel::start(&config, config_path, tpm.clone(), &identity),
    };
    let node = Node {
        backoff: Backoff::new(config.node.backoff_min, config.node.backoff_max),
        config: &config,
        tpm: &tpm,
        identity,
        announced: None,
        retry_at: None,
        next_key: None,
        channel,
    };
    runtime.block_on(node.run(once, renew_now))
}

/// What the loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing before `until` (the renewal time).
    Wait {
        until: OffsetDateTime,
    },
    Renew,
    /// Expired within the grace: re-join with x509pop.
    Rejoin,
    /// Expired longer ago than the grace: only the operator can help.
    PastGrace,
}

pub(crate) fn decide(cert: &NodeCert, now: OffsetDateTime, force_renewal: bool) -> Step {
    if now >= cert.not_after {
        if now - cert.not_after > GRACE {
            Step::PastGrace
        } else {
            Step::Rejoin
        }
    } else if force_renewal || now >= cert.renew_at() {
        Step::Renew
    } else {
        Step::Wait {
            until: cert.renew_at(),
        }
    }
}

/// The operator's instructions once the grace is over.
pub(crate) fn past_grace_message(cert: &NodeCert, now: OffsetDateTime) -> String {
    format!(
        "the certificate expired at {} ({} ago), past the {}-day grace in which a node re-joins as itself with x509pop; join again, as root: bcd join --reset --yes, then bcd join with a join token (--token-file F or BCD_JOIN_TOKEN) or with --attestor tpm",
        rfc3339(cert.not_after),
        human(now - cert.not_after),
        GRACE.whole_days()
    )
}

/// `23h59m` left, or `expired`.
fn expires_in(cert: &NodeCert, now: OffsetDateTime) -> String {
    if cert.not_after > now {
        human(cert.not_after - now)
    } else {
        "expired".to_owned()
    }
}

struct Node<'a> {
    config: &'a Config,
    tpm: &'a TpmAccess,
    identity: Identity,
    backoff: Backoff,
    /// The renewal time last logged, so that a wait is logged once.
    announced: Option<OffsetDateTime>,
    /// No attempt before this (the backoff after a failure, as logged), on
    /// the monotonic clock: a wait is a duration, whatever the wall clock does.
    retry_at: Option<tokio::time::Instant>,
    /// The staged next key of a failed attempt: a retry for the same
    /// identity sends it again rather than making and syncing another.
    next_key: Option<NextKey>,
    /// The command channel, told of each new identity.
    channel: Option<crate::channel::Handle>,
}

impl Node<'_> {
    async fn run(mut self, once: bool, mut force: bool) -> anyhow::Result<ExitCode> {
        let mut stop = Stop::new()?;
        {
            let cert = &self.identity.cert;
            tracing::info!(
                node_id = %self.identity.node_id,
                not_after = %rfc3339(cert.not_after),
                renew_at = %rfc3339(cert.renew_at()),
                key_in = self.identity.key.kind().as_str(),
                node_key = %self.identity.key.kid(),
                "bcd node started"
            );
        }
        loop {
            let now = clock::now();
            let retry_left = self
                .retry_at
                .map(|at| at.saturating_duration_since(tokio::time::Instant::now()))
                .filter(|left| !left.is_zero());
            let nap = match decide(&self.identity.cert, now, force) {
                Step::Wait { until } => {
                    if once {
                        tracing::info!(
                            not_after = %rfc3339(self.identity.cert.not_after),
                            renew_at = %rfc3339(until),
                            "the certificate is valid and not due for renewal"
                        );
                        return Ok(ExitCode::SUCCESS);
                    }
                    if self.announced != Some(until) {
                        tracing::info!(
                            renew_at = %rfc3339(until),
                            expiresIn = %expires_in(&self.identity.cert, now),
                            "next renewal due (50-60 % into the certificate's lifetime)"
                        );
                        self.announced = Some(until);
                    }
                    std_duration(until - now)
                }
                // A failed attempt's wait, as logged, is kept whatever wakes
                // the loop meanwhile.
                Step::Renew | Step::Rejoin if retry_left.is_some() => {
                    retry_left.unwrap_or_default()
                }
                step @ (Step::Renew | Step::Rejoin) => {
                    let result = if step == Step::Renew {
                        self.renew().await
                    } else {
                        self.rejoin(now).await
                    };
                    // A forced renewal is retried like a due one until it
                    // works; a re-join's fresh certificate is what
                    // --renew-now wanted too.
                    match result {
                        Ok(()) if once => return Ok(ExitCode::SUCCESS),
                        Ok(()) => force = false,
                        Err(()) if once => {
                            // No retry follows: the staged next key goes.
                            self.drop_next_key();
                            return Ok(ExitCode::FAILURE);
                        }
                        Err(()) => {}
                    }
                    continue;
                }
                Step::PastGrace => {
                    let message = past_grace_message(&self.identity.cert, now);
                    tracing::error!(node_id = %self.identity.node_id, "{message}");
                    journal::record(
                        &self.config.data_dir,
                        Kind::RejoinFailed,
                        &self.identity.node_id,
                        message.clone(),
                        None,
                    );
                    return Err(anyhow!(message));
                }
            };
            let nap = nap.min(MAX_NAP).max(Duration::from_millis(50));
            if stop.nap(nap).await {
                tracing::info!("stopping on a signal");
                return Ok(ExitCode::SUCCESS);
            }
        }
    }

    /// After a failed attempt: the backoff's next wait, but no later than
    /// expiry while the certificate is valid (a renewal that keeps failing
    /// gives way to the re-join at expiry). Sets [`Node::retry_at`]; returns
    /// the attempt's number and the wait, which the caller logs.
    fn fail(&mut self) -> (u32, Duration) {
        let now = clock::now();
        let (attempt, backoff) = self.backoff.fail();
        let wait = retry_wait(backoff, &self.identity.cert, now);
        self.retry_at = Some(tokio::time::Instant::now() + wait);
        (attempt, wait)
    }

    /// The channel reconnects with the identity now in place.
    fn tell_channel(&self) {
        if let Some(channel) = &self.channel {
            channel.renewed(&self.identity);
        }
    }

    /// Forgets the staged next key and removes it from the data directory.
    fn drop_next_key(&mut self) {
        if self.next_key.take().is_some() {
            rotation::abandon(&self.config.data_dir);
        }
    }

    /// One renewal; a failure is logged, journaled and scheduled for retry.
    async fn renew(&mut self) -> Result<(), ()> {
        let dir = &self.config.data_dir;
        match renew_once(self.config, self.tpm, &self.identity, &mut self.next_key).await {
            Ok(next) => {
                journal::record(
                    dir,
                    Kind::Renewal,
                    &next.node_id,
                    format!(
                        "renewed (node key {}, kid {})",
                        next.key.kind().as_str(),
                        next.key.kid()
                    ),
                    Some(next.cert.not_after),
                );
                self.adopt(next);
                Ok(())
            }
            Err(e) => {
                let (attempt, wait) = self.fail();
                let detail = e.to_string();
                tracing::warn!(
                    attempt,
                    expiresIn = %expires_in(&self.identity.cert, clock::now()),
                    retryIn = ?wait,
                    error = %detail,
                    "renewal failed"
                );
                journal::record(
                    &self.config.data_dir,
                    Kind::RenewalFailed,
                    &self.identity.node_id,
                    detail,
                    None,
                );
                if matches!(e, RenewError::Unsaved(_)) {
                    self.reload();
                }
                Err(())
            }
        }
    }

    /// A new identity is in place: the backoff and the next-renewal notice start over.
    fn adopt(&mut self, next: Identity) {
        self.identity = next;
        self.tell_channel();
        self.backoff.succeed();
        self.retry_at = None;
        self.announced = None;
        self.next_key = None;
    }

    /// One x509pop re-join; a failure is logged, journaled and scheduled for retry.
    async fn rejoin(&mut self, now: OffsetDateTime) -> Result<(), ()> {
        let cert = &self.identity.cert;
        tracing::warn!(
            node_id = %self.identity.node_id,
            not_after = %rfc3339(cert.not_after),
            "certificate expired {} ({} ago); re-joining with x509pop as {}",
            rfc3339(cert.not_after),
            human(now - cert.not_after),
            self.identity.node_id
        );
        let rejoined = crate::rejoin::rejoin_x509pop(
            self.config,
            self.tpm,
            &self.identity,
            &mut self.next_key,
        )
        .await;
        match rejoined {
            Ok(next) => {
                self.adopt(next);
                Ok(())
            }
            Err(e) => {
                let (attempt, wait) = self.fail();
                tracing::warn!(
                    attempt,
                    graceLeft = %human(self.identity.cert.not_after + GRACE - clock::now()),
                    retryIn = ?wait,
                    error = %format!("{e:#}"),
                    "re-join failed"
                );
                // A re-join whose answer was accepted but not fully saved
                // left a rotation on disk; loading completes it.
                self.reload();
                Err(())
            }
        }
    }

    /// Takes the identity on disk when it differs (an interrupted rotation,
    /// completed by the loader); keeps the one in memory when it does not load.
    fn reload(&mut self) {
        match Identity::load(&self.config.data_dir, self.tpm) {
            Ok(Some(id)) if id.chain != self.identity.chain => {
                tracing::info!(
                    not_after = %rfc3339(id.cert.not_after),
                    node_key = %id.key.kid(),
                    "using the identity on disk"
                );
                self.identity = id;
                self.tell_channel();
                self.next_key = None;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "the identity on disk does not load; keeping the one in memory")
            }
        }
    }
}

/// The wait after a failure: `backoff`, cut at expiry while `cert` is still
/// valid so that the re-join follows it; once expired, the whole backoff.
pub(crate) fn retry_wait(backoff: Duration, cert: &NodeCert, now: OffsetDateTime) -> Duration {
    if now < cert.not_after {
        backoff.min(std_duration(cert.not_after - now) + Duration::from_millis(100))
    } else {
        backoff
    }
}

/// A non-negative `time::Duration` as a std one (negative is zero).
fn std_duration(d: time::Duration) -> Duration {
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

/// SIGTERM or SIGINT ends a sleep and the loop; a renewal in progress
/// finishes first.
struct Stop {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Stop {
    fn new() -> anyhow::Result<Stop> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Stop {
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
        })
    }

    /// Sleeps for `d`; true when a signal asks to stop.
    async fn nap(&mut self, d: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => false,
            _ = self.term.recv() => true,
            _ = self.int.recv() => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{FileKey, NodeKey};
    use std::sync::Arc;

    fn cert(hours: i64) -> NodeCert {
        let key = FileKey::generate().unwrap();
        let chain =
            crate::pki::tests::issue(key.spki_der(), &["spiffe://bc.test/node/node_abc"], hours);
        crate::pki::check_chain(&chain).unwrap()
    }

    #[test]
    fn renewal_points_spread_over_50_to_60_percent_and_stay_put() {
        let mut fractions: Vec<f64> = (0..64)
            .map(|_| {
                let c = cert(24);
                let at = c.renew_at();
                assert_eq!(c.renew_at(), at, "derived from the certificate alone");
                (at - c.not_before) / (c.not_after - c.not_before)
            })
            .collect();
        fractions.sort_by(f64::total_cmp);
        assert!(fractions[0] >= 0.5 && fractions[63] <= 0.6, "{fractions:?}");
        // 64 certificates spread over the window, not bunched in one spot.
        assert!(fractions[63] - fractions[0] > 0.05, "{fractions:?}");
        let distinct: std::collections::BTreeSet<_> =
            fractions.iter().map(|f| (f * 1e6) as u64).collect();
        assert!(distinct.len() > 60, "{fractions:?}");
    }

    #[test]
    fn renews_at_its_point_rejoins_within_grace_stops_after() {
        let c = cert(24);
        let half = c.renew_at();
        let before = half - time::Duration::minutes(1);
        assert_eq!(decide(&c, before, false), Step::Wait { until: half });
        assert_eq!(decide(&c, before, true), Step::Renew);
        assert_eq!(decide(&c, half, false), Step::Renew);
        assert_eq!(decide(&c, c.not_after, false), Step::Rejoin);
        assert_eq!(decide(&c, c.not_after, true), Step::Rejoin);
        assert_eq!(decide(&c, c.not_after + GRACE, false), Step::Rejoin);
        let late = c.not_after + GRACE + time::Duration::seconds(1);
        assert_eq!(decide(&c, late, false), Step::PastGrace);
        let m = past_grace_message(&c, late);
        assert!(
            m.contains("bcd join --reset --yes, then bcd join") && m.contains("7-day grace"),
            "{m}"
        );
    }

    #[test]
    fn expires_in_reads_at_a_glance() {
        let c = cert(24);
        assert_eq!(
            expires_in(&c, c.not_after - time::Duration::minutes(90)),
            "1h30m"
        );
        assert_eq!(expires_in(&c, c.not_after), "expired");
        assert_eq!(std_duration(time::Duration::seconds(-5)), Duration::ZERO);
    }

    /// The issue's figure: a node 30 h past its certificate, retrying with
    /// the default backoff, makes at most 3 attempts in 90 s.
    #[test]
    fn an_expired_node_retries_on_the_backoff_it_logs() {
        let c = cert(24);
        let start = c.not_after + time::Duration::hours(30);
        let mut backoff = Backoff::new(Duration::from_secs(30), Duration::from_secs(600));
        let mut now = start;
        let mut attempts = vec![];
        while now - start <= time::Duration::seconds(90) {
            assert_eq!(decide(&c, now, false), Step::Rejoin);
            attempts.push((now - start).whole_seconds());
            now += retry_wait(backoff.fail().1, &c, now);
        }
        assert_eq!(attempts, vec![0, 30, 90]);
    }

    #[test]
    fn a_failing_renewal_wakes_at_expiry_for_the_rejoin() {
        let c = cert(24);
        let now = c.not_after - time::Duration::seconds(10);
        let wait = retry_wait(Duration::from_secs(600), &c, now);
        assert!(
            wait > Duration::from_secs(10) && wait < Duration::from_secs(11),
            "{wait:?}"
        );
        assert_eq!(
            retry_wait(Duration::from_secs(30), &c, now),
            Duration::from_secs(10) + Duration::from_millis(100)
        );
    }

    /// Log lines with the (paused) tokio time they were written at.
    #[derive(Clone, Default)]
    struct Stamped(Arc<std::sync::Mutex<Vec<(tokio::time::Instant, String)>>>);

    impl std::io::Write for Stamped {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let line = String::from_utf8_lossy(buf).into_owned();
            self.0
                .lock()
                .unwrap()
                .push((tokio::time::Instant::now(), line));
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// `retryIn=2s` in a log line.
    fn retry_in(line: &str) -> Duration {
        let v = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("retryIn="))
            .unwrap_or_else(|| panic!("no retryIn in {line}"));
        Duration::from_secs(v.strip_suffix('s').unwrap().parse().unwrap())
    }

    /// The loop itself, on tokio's paused clock: a renewal that keeps
    /// failing (its next key cannot be staged: the data directory is under
    /// a file, so nothing reaches the network) is tried again exactly when
    /// the `retryIn` its failure logged says, doubling from `backoff_min`
    /// (1 s: attempts at 0, 1, 3 and 7 s). The e2e tests
    /// (`node::a_refused_rejoin_waits_what_it_logs_and_reuses_its_next_key`,
    /// `node::renewal_backs_off_…`) see what is logged against a real
    /// control plane; this is where the waits are measured.
    #[tokio::test(start_paused = true)]
    async fn a_failed_attempt_waits_exactly_the_retry_it_logs() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let data_dir = file.join("data");
        let text = crate::config::tests::sample("https://127.0.0.1:1", data_dir.to_str().unwrap());
        let mut config = Config::parse(std::path::Path::new("c.toml"), &text).unwrap();
        config.node.backoff_min = Duration::from_secs(1);
        config.node.backoff_max = Duration::from_secs(600);
        let key = FileKey::generate().unwrap();
        let chain =
            crate::pki::tests::issue(key.spki_der(), &["spiffe://bc.test/node/node_abc"], 24);
        let cert = crate::pki::check_chain(&chain).unwrap();
        let identity = Identity {
            node_id: "node_abc".to_owned(),
            role: bc_wire::agent::Role::Node,
            trust_domain: "bc.test".to_owned(),
            attestor: "join-token".to_owned(),
            joined_at: cert.not_before,
            chain,
            cert,
            key: Arc::new(key),
        };
        let tpm = TpmAccess::none();
        let node = Node {
            backoff: Backoff::new(config.node.backoff_min, config.node.backoff_max),
            config: &config,
            tpm: &tpm,
            identity,
            announced: None,
            retry_at: None,
            next_key: None,
            channel: None,
        };
        let lines = Stamped::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);

        let start = tokio::time::Instant::now();
        let ran = tokio::time::timeout(Duration::from_millis(7500), node.run(false, true)).await;
        assert!(ran.is_err(), "the loop keeps retrying");
        let lines = lines.0.lock().unwrap().clone();
        let failures: Vec<(Duration, Duration)> = lines
            .iter()
            .filter(|(_, l)| l.contains("renewal failed"))
            .map(|(at, l)| (*at - start, retry_in(l)))
            .collect();
        let all: Vec<&String> = lines.iter().map(|(_, l)| l).collect();
        let secs = |v: &[u64]| {
            v.iter()
                .map(|s| Duration::from_secs(*s))
                .collect::<Vec<_>>()
        };
        let at: Vec<Duration> = failures.iter().map(|f| f.0).collect();
        let logged: Vec<Duration> = failures.iter().map(|f| f.1).collect();
        assert_eq!(at, secs(&[0, 1, 3, 7]), "{all:#?}");
        assert_eq!(logged, secs(&[1, 2, 4, 8]), "{all:#?}");
        for pair in failures.windows(2) {
            assert_eq!(pair[1].0 - pair[0].0, pair[0].1, "waited what it logged");
        }
    }
}
