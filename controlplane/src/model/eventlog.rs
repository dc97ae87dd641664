//! The refusal log: refusals are counted in memory and written by one
//! writer thread, so a flood of refused requests costs a few rows a minute
//! instead of a write transaction each (which made good joins wait on the
//! write lock and lost events to the busy timeout).
//!
//! Identical refusals (same type, attestor, reason, token, node, source and
//! details) within one minute of database time become:
//! - the first one, an event of its own with `count` 1, written as soon as
//!   it happens (what a reader looking at the latest refusal sees);
//! - every repeat, one aggregated event per minute whose `count` grows.
//!
//! Every event carries `data.count`, `data.windowStart`, `data.windowEnd` and
//! `data.source` (when known): the counts of a minute add up exactly to the
//! refusals made. Nothing is dropped: the number of distinct keys a minute is
//! capped ([`MAX_KEYS_PER_MINUTE`]); past it, refusals are folded into one
//! key per (type, reason) with `data.folded` true, still counted. A refused
//! request waits (at most [`WAIT_FOR_WRITE`]) until its refusal is committed,
//! so an answered refusal is on record; the writer batches every pending
//! refusal into one transaction. The writer also prunes events older than the
//! retention, in bounded batches. Dropping the log flushes it.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::model::records::{self, NewEvent};
use crate::reason::AnyReason;
use crate::store::{self, DbError, Store, Tx, UnixMs};

/// Aggregation window (database time).
pub(crate) const WINDOW_MS: i64 = 60_000;
/// Distinct refusal keys kept apart per minute; beyond, they fold.
pub(crate) const MAX_KEYS_PER_MINUTE: usize = 4096;
/// How long a refused request waits for its event to be committed before it
/// is answered anyway (the event is still written later).
const WAIT_FOR_WRITE: Duration = Duration::from_secs(2);
/// How often the writer prunes expired events.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// Rows deleted per pruning transaction.
pub(crate) const PRUNE_BATCH: usize = 5_000;
/// Backoff of a failed batch: doubles from the first to the last.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// At shutdown, a batch that still cannot be written after this long is
/// logged as lost (with its counts) rather than holding the exit forever.
const SHUTDOWN_GIVE_UP: Duration = Duration::from_secs(30);

/// One refusal to record.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Refused {
    pub kind: &'static str,
    pub attestor: Option<String>,
    pub reason: AnyReason,
    pub token_id: Option<String>,
    pub node_id: Option<String>,
    pub source: Option<IpAddr>,
    /// More `data` fields, as a JSON object's text ("" for none).
    pub extra: String,
    /// The tenant it is attributed to (a pool-policy refusal's pool
    /// owner); `None`: the operator's.
    pub tenant_id: Option<String>,
    /// Folded past [`MAX_KEYS_PER_MINUTE`]: the details were dropped.
    pub(crate) folded: bool,
}

impl Refused {
    fn folded(&self) -> Refused {
        Refused {
            kind: self.kind,
            attestor: None,
            reason: self.reason,
            token_id: None,
            node_id: None,
            source: None,
            extra: String::new(),
            tenant_id: None,
            folded: true,
        }
    }
}

/// What the writer has written for a key in the current window.
#[derive(Clone, Copy, Debug, Default)]
struct Written {
    first: bool,
    /// The aggregated event's row and count.
    repeats: Option<(i64, u64)>,
}

#[derive(Default)]
struct State {
    /// Refusals not written yet, in arrival order, with their counts.
    pending: Vec<(Refused, u64)>,
    index: HashMap<Refused, usize>,
    /// Keys seen this (system-clock) minute, for the cap.
    seen: HashSet<Refused>,
    seen_minute: i64,
    enqueued: u64,
    committed: u64,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the writer.
    work: Condvar,
    /// Wakes requests waiting for a commit.
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The refusal log of one database, and its writer thread.
pub(crate) struct EventLog {
    shared: Arc<Shared>,
    max_keys: usize,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Only when the thread could not be started: `record` writes inline.
    inline: Option<Mutex<Writer>>,
}

impl EventLog {
    /// Starts the writer; events older than `retention_ms` are pruned at
    /// start and then every hour.
    pub(crate) fn start(db: Arc<Store>, retention_ms: i64) -> EventLog {
        Self::start_with(db, retention_ms, MAX_KEYS_PER_MINUTE)
    }

    fn start_with(db: Arc<Store>, retention_ms: i64, max_keys: usize) -> EventLog {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let s = shared.clone();
        let d = db.clone();
        let spawned = std::thread::Builder::new()
            .name("event-writer".to_owned())
            .spawn(move || Writer::new(d, s, retention_ms).run());
        let (writer, inline) = match spawned {
            Ok(h) => (Some(h), None),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the event writer; writing inline");
                let w = Writer::new(db, shared.clone(), retention_ms);
                (None, Some(Mutex::new(w)))
            }
        };
        EventLog {
            shared,
            max_keys,
            writer: Mutex::new(writer),
            inline,
        }
    }

    /// Counts a refusal and waits (bounded) until it is committed. Returns
    /// whether it is the first of its kind this minute (callers log only
    /// those at warn, so a flood does not flood the log either).
    pub(crate) fn record(&self, r: Refused) -> bool {
        let first;
        let seq = {
            let mut st = self.shared.lock();
            if st.stop && self.inline.is_none() {
                // Only after shutdown_events, when the server has stopped.
                tracing::error!(kind = r.kind, reason = %r.reason,
                    "a refusal after the event log stopped is not recorded");
                return true;
            }
            let minute = crate::store::system_now_ms().div_euclid(WINDOW_MS);
            if minute != st.seen_minute {
                st.seen_minute = minute;
                st.seen.clear();
            }
            let key = if st.seen.contains(&r) || st.seen.len() < self.max_keys {
                r
            } else {
                r.folded()
            };
            first = st.seen.insert(key.clone());
            match st.index.get(&key) {
                Some(&i) => st.pending[i].1 += 1,
                None => {
                    let i = st.pending.len();
                    st.index.insert(key.clone(), i);
                    st.pending.push((key, 1));
                }
            }
            st.enqueued += 1;
            st.enqueued
        };
        self.shared.work.notify_one();
        if let Some(w) = &self.inline {
            w.lock().unwrap_or_else(|p| p.into_inner()).drain();
        }
        self.wait_for(seq, WAIT_FOR_WRITE);
        first
    }

    /// Waits until everything recorded so far is committed (or `timeout`).
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let seq = self.shared.lock().enqueued;
        self.wait_for(seq, timeout)
    }

    fn wait_for(&self, seq: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        while st.committed < seq {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = match self.shared.done.wait_timeout(st, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }

    /// Stops the writer after it wrote everything pending.
    pub(crate) fn shutdown(&self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        let handle = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            if h.join().is_err() {
                tracing::error!("the event writer panicked");
            }
        }
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Writer {
    db: Arc<Store>,
    shared: Arc<Shared>,
    retention_ms: i64,
    /// The database window the `written` map is about.
    window: i64,
    written: HashMap<Refused, Written>,
}

impl Writer {
    fn new(db: Arc<Store>, shared: Arc<Shared>, retention_ms: i64) -> Self {
        Writer {
            db,
            shared,
            retention_ms,
            window: i64::MIN,
            written: HashMap::new(),
        }
    }

    fn run(mut self) {
        let mut next_prune = Instant::now();
        loop {
            if Instant::now() >= next_prune {
                self.prune();
                next_prune = Instant::now() + PRUNE_EVERY;
            }
            {
                let mut st = self.shared.lock();
                while st.pending.is_empty() && !st.stop && Instant::now() < next_prune {
                    let left = next_prune.saturating_duration_since(Instant::now());
                    st = match self.shared.work.wait_timeout(st, left) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    };
                }
            }
            let stopping = self.drain();
            if stopping && self.shared.lock().pending.is_empty() {
                return;
            }
        }
    }

    /// Writes what is pending in one batch and wakes the requests waiting
    /// for it; returns whether the log is stopping.
    fn drain(&mut self) -> bool {
        let (batch, seq, stopping) = {
            let mut st = self.shared.lock();
            st.index.clear();
            (std::mem::take(&mut st.pending), st.enqueued, st.stop)
        };
        if !batch.is_empty() {
            self.write_with_retries(&batch, stopping);
        }
        {
            let mut st = self.shared.lock();
            st.committed = st.committed.max(seq);
        }
        self.shared.done.notify_all();
        stopping
    }

    /// Writes a batch, retrying with backoff: events are never dropped
    /// silently (only at shutdown, after [`SHUTDOWN_GIVE_UP`], with a log of
    /// what could not be written).
    fn write_with_retries(&mut self, batch: &[(Refused, u64)], stopping: bool) {
        let started = Instant::now();
        let mut delay = RETRY_FIRST;
        loop {
            match self.write(batch) {
                Ok(()) => return,
                Err(e) => {
                    let stop = stopping || self.shared.lock().stop;
                    if stop && started.elapsed() > SHUTDOWN_GIVE_UP {
                        let total: u64 = batch.iter().map(|(_, n)| n).sum();
                        tracing::error!(error = %e, refusals = total, keys = batch.len(),
                            "shutting down: these refusal events could not be written");
                        return;
                    }
                    tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64,
                        "cannot write refusal events; retrying");
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// One transaction for the whole batch.
    fn write(&mut self, batch: &[(Refused, u64)]) -> Result<(), DbError> {
        let (window, changes) = self.db.write(|tx| -> Result<_, DbError> {
            let now = tx.now()?;
            let window = now - now.rem_euclid(WINDOW_MS);
            let mut changes: Vec<(Refused, Written)> = Vec::new();
            for (r, n) in batch {
                // Keys are unique within a batch (record merges them).
                let mut w = if window == self.window {
                    self.written.get(r).copied().unwrap_or_default()
                } else {
                    Written::default()
                };
                let mut n = *n;
                if !w.first {
                    insert(tx, r, now, window, 1)?;
                    w.first = true;
                    n -= 1;
                }
                if n > 0 {
                    w.repeats = Some(match w.repeats {
                        Some((id, count)) => {
                            records::set_event_count(tx, id, count + n)?;
                            (id, count + n)
                        }
                        None => (insert(tx, r, now, window, n)?, n),
                    });
                }
                changes.push((r.clone(), w));
            }
            Ok((window, changes))
        })?;
        if window != self.window {
            self.window = window;
            self.written.clear();
        }
        self.written.extend(changes);
        Ok(())
    }

    fn prune(&self) {
        match prune(&self.db, self.retention_ms) {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "pruned expired events"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot prune expired events; next try in an hour")
            }
        }
    }
}

fn insert(tx: &Tx<'_>, r: &Refused, now: UnixMs, window: i64, count: u64) -> Result<i64, DbError> {
    let mut data = match serde_json::from_str::<serde_json::Value>(&r.extra) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        _ => serde_json::json!({}),
    };
    data["reason"] = serde_json::json!(r.reason.as_str());
    if let Some(a) = &r.attestor {
        data["attestor"] = serde_json::json!(a);
    }
    if let Some(s) = r.source {
        data["source"] = serde_json::json!(s.to_string());
    }
    if r.folded {
        data["folded"] = serde_json::json!(true);
    }
    data["count"] = serde_json::json!(count);
    data["windowStart"] = serde_json::json!(store::rfc3339(window));
    data["windowEnd"] = serde_json::json!(store::rfc3339(window + WINDOW_MS));
    records::insert_event(
        tx,
        &NewEvent {
            kind: r.kind,
            at: now,
            attestor: r.attestor.as_deref(),
            reason: Some(r.reason.as_str()),
            token_id: r.token_id.as_deref(),
            node_id: r.node_id.as_deref(),
            data,
            // Never the node's owner: a refusal's node id is what the
            // request claimed.
            tenant: match &r.tenant_id {
                Some(t) => records::Attribution::Tenant(t),
                None => records::Attribution::Operator,
            },
        },
    )
}

/// Deletes the events older than `retention_ms` (database time), in
/// transactions of at most [`PRUNE_BATCH`] rows so writers are never held up
/// for long; returns how many were deleted.
pub fn prune(db: &Store, retention_ms: i64) -> Result<usize, DbError> {
    let mut total = 0;
    loop {
        let n = db.write(|tx| {
            let now = tx.now()?;
            records::delete_events_before(tx, now.saturating_sub(retention_ms), PRUNE_BATCH)
        })?;
        total += n;
        if n < PRUNE_BATCH {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::records::EVENT_JOIN_REFUSED;

    crate::reason::reasons! {
        /// Two of the join-token attestor's, as the log sees any.
        enum Sample in "join-token" {
            TokenSecret = "token-secret",
            TokenUnknown = "token-unknown",
        }
    }

    fn refused(reason: Sample, source: &str) -> Refused {
        Refused {
            kind: EVENT_JOIN_REFUSED,
            attestor: Some("join-token".to_owned()),
            reason: reason.any(),
            token_id: None,
            node_id: None,
            source: Some(source.parse().unwrap()),
            extra: String::new(),
            tenant_id: None,
            folded: false,
        }
    }

    fn counts(db: &Store) -> Vec<(String, u64, bool)> {
        records::list_events(db)
            .unwrap()
            .into_iter()
            .map(|e| {
                (
                    e.reason.unwrap(),
                    e.data["count"].as_u64().unwrap(),
                    e.data["folded"] == true,
                )
            })
            .collect()
    }

    #[test]
    fn repeats_become_one_event_a_minute_and_counts_add_up() {
        let t = crate::test_support::temp_db();
        let db = Arc::new(t.reopen());
        let log = EventLog::start(db.clone(), crate::config::DEFAULT_EVENTS_RETENTION_MS);
        log.record(refused(Sample::TokenSecret, "127.0.0.2"));
        log.record(refused(Sample::TokenUnknown, "127.0.0.2"));
        // Once written, the first is a 1-count event of its own.
        let first = records::list_events(&db).unwrap();
        assert_eq!(first.len(), 2);
        assert_eq!(first[0].data["count"], 1);
        assert_eq!(first[0].data["source"], "127.0.0.2");
        assert_eq!(first[0].data["attestor"], "join-token");
        assert!(first[0].data["windowStart"].is_string());
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..50 {
                        log.record(refused(Sample::TokenSecret, "127.0.0.2"));
                    }
                });
            }
        });
        // Another source is another key.
        log.record(refused(Sample::TokenSecret, "127.0.0.3"));
        drop(log);
        let rows = counts(&db);
        let total: u64 = rows.iter().map(|r| r.1).sum();
        assert_eq!(total, 403);
        // A window boundary may split the repeats in two.
        assert!(rows.len() <= 6, "{rows:?}");
        assert_eq!(rows[0], ("token-secret".to_owned(), 1, false));
    }

    #[test]
    fn distinct_keys_past_the_cap_fold_but_still_count() {
        let t = crate::test_support::temp_db();
        let db = Arc::new(t.reopen());
        let log = EventLog::start_with(db.clone(), crate::config::DEFAULT_EVENTS_RETENTION_MS, 4);
        std::thread::scope(|s| {
            for i in 0..4 {
                let log = &log;
                s.spawn(move || {
                    for j in 0..25 {
                        log.record(refused(Sample::TokenUnknown, &format!("10.0.{i}.{j}")));
                    }
                });
            }
        });
        log.flush(Duration::from_secs(10));
        let rows = counts(&db);
        assert_eq!(rows.iter().map(|r| r.1).sum::<u64>(), 100);
        // At most 4 keys (and a minute boundary's 4 more) keep their source.
        assert!(rows.iter().filter(|r| !r.2).count() <= 8, "{rows:?}");
        assert!(rows.iter().any(|r| r.2));
        assert!(rows.len() <= 12, "{rows:?}");
    }

    #[test]
    fn the_writer_prunes_when_it_starts() {
        let t = crate::test_support::temp_db();
        let now = t.db.read(|tx| tx.now()).unwrap();
        t.db.write(|tx| {
            records::insert_event(
                tx,
                &NewEvent {
                    kind: EVENT_JOIN_REFUSED,
                    at: now - 2 * 86_400_000,
                    ..Default::default()
                },
            )
        })
        .unwrap();
        let db = Arc::new(t.reopen());
        let log = EventLog::start(db.clone(), 86_400_000);
        // Written after the writer's first prune.
        log.record(refused(Sample::TokenSecret, "127.0.0.2"));
        assert_eq!(counts(&db), [("token-secret".to_owned(), 1, false)]);
    }

    #[test]
    fn prune_deletes_only_expired_events_in_batches() {
        let t = crate::test_support::temp_db();
        let now = t.db.read(|tx| tx.now()).unwrap();
        let day = 86_400_000;
        t.db.write(|tx| -> Result<(), DbError> {
            for i in 0..(PRUNE_BATCH as i64 * 2 + 10) {
                let at = if i % 100 == 0 {
                    now - day
                } else {
                    now - 91 * day
                };
                records::insert_event(
                    tx,
                    &NewEvent {
                        kind: EVENT_JOIN_REFUSED,
                        at,
                        ..Default::default()
                    },
                )?;
            }
            Ok(())
        })
        .unwrap();
        let kept = (PRUNE_BATCH * 2 + 10).div_ceil(100);
        let n = prune(&t.db, crate::config::DEFAULT_EVENTS_RETENTION_MS).unwrap();
        assert_eq!(n, PRUNE_BATCH * 2 + 10 - kept);
        assert_eq!(records::list_events(&t.db).unwrap().len(), kept);
        assert_eq!(prune(&t.db, 90 * day).unwrap(), 0);
    }
}
