//! What clients may hold of the server: a cap on connections, a cap per
//! source address, and the whole-request deadline. Without them, ~1,000
//! connections that never finish their request exhaust a 1,024-descriptor
//! limit and every new handshake waits behind them.
//!
//! A connection is *idle* while it has no request in the handler (during
//! its TLS handshake, while its request head arrives, and between keep-alive
//! requests). When the server is full, the oldest idle connection is closed
//! to make room: a slow client loses its slot to a new one, and a client that
//! finishes its request quickly is never the oldest. Only when every slot is
//! busy in a handler is a new connection refused.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::config::ServerConfig;

/// Descriptors kept out of the connection cap: SQLite (each pooled
/// connection holds the database and its WAL), the listener, the runtime,
/// logs, the CLI's files.
pub const RESERVED_FDS: u64 = 256;
/// The derived cap never goes below this (a tiny limit still serves).
const MIN_DERIVED: u64 = 16;
/// Nor above this: beyond it, memory (a TLS session each) runs out first.
const MAX_DERIVED: u64 = 16_384;

/// The limits `serve` enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_per_source: usize,
    /// From accept (or the previous response) to the end of the response.
    pub request_timeout: Duration,
}

impl Limits {
    /// The configured limits; what is not configured is derived from the
    /// descriptor limit `nofile`: all of it but [`RESERVED_FDS`], a quarter of
    /// that per source.
    pub fn new(config: &ServerConfig, nofile: u64) -> Limits {
        let derived = nofile
            .saturating_sub(RESERVED_FDS)
            .clamp(MIN_DERIVED, MAX_DERIVED);
        let max_connections = config
            .max_connections
            .unwrap_or(usize::try_from(derived).unwrap_or(usize::MAX));
        let max_per_source = config
            .max_connections_per_source
            .unwrap_or((max_connections / 4).max(1))
            .min(max_connections);
        Limits {
            max_connections,
            max_per_source,
            request_timeout: Duration::from_millis(
                u64::try_from(config.request_timeout_ms).unwrap_or(30_000),
            ),
        }
    }

    /// The default limits for this process's current descriptor limit.
    pub fn for_process(config: &ServerConfig) -> Limits {
        Limits::new(config, nofile_limit())
    }
}

/// The soft descriptor limit in force (`u64::MAX` when unlimited).
pub fn nofile_limit() -> u64 {
    let r = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    r.current.unwrap_or(u64::MAX)
}

/// Raises the soft descriptor limit to the hard one; returns the soft limit
/// now in force.
pub fn raise_nofile_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let r = getrlimit(Resource::Nofile);
    if r.current != r.maximum {
        let raised = Rlimit {
            current: r.maximum,
            maximum: r.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "cannot raise the file descriptor limit");
        }
    }
    nofile_limit()
}

/// The address a per-source limit counts: IPv4 (also when mapped into
/// IPv6) as is, IPv6 by its /64, which one host usually owns whole.
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its source holds `max_per_source` connections already.
    PerSource,
    /// Every slot is busy in a handler.
    Full,
}

struct Conn {
    source: IpAddr,
    evict: Arc<Notify>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// Every admitted connection.
    conns: HashMap<u64, Conn>,
    per_source: HashMap<IpAddr, usize>,
    /// The idle ones, oldest (lowest id or longest idle) first.
    idle: BTreeMap<u64, u64>,
    idle_of: HashMap<u64, u64>,
    idle_seq: u64,
}

impl Inner {
    fn release(&mut self, id: u64) -> Option<Conn> {
        let conn = self.conns.remove(&id)?;
        if let Some(seq) = self.idle_of.remove(&id) {
            self.idle.remove(&seq);
        }
        if let Some(n) = self.per_source.get_mut(&conn.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&conn.source);
            }
        }
        Some(conn)
    }

    fn set_idle(&mut self, id: u64) {
        if !self.conns.contains_key(&id) || self.idle_of.contains_key(&id) {
            return;
        }
        self.idle_seq += 1;
        self.idle.insert(self.idle_seq, id);
        self.idle_of.insert(id, self.idle_seq);
    }
}

/// The connections the server holds.
pub struct Tracker {
    limits: Limits,
    inner: Mutex<Inner>,
}

impl Tracker {
    pub fn new(limits: Limits) -> Arc<Tracker> {
        Arc::new(Tracker {
            limits,
            inner: Mutex::new(Inner::default()),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a connection from `source` (idle), closing the oldest idle
    /// one when the server is full.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Slot, Refusal> {
        let source = source_key(source);
        let mut inner = self.lock();
        if inner.per_source.get(&source).copied().unwrap_or(0) >= self.limits.max_per_source {
            return Err(Refusal::PerSource);
        }
        if inner.conns.len() >= self.limits.max_connections {
            let oldest = inner.idle.first_key_value().map(|(_, id)| *id);
            let Some(victim) = oldest.and_then(|id| inner.release(id)) else {
                return Err(Refusal::Full);
            };
            // Its task drops the socket at its next poll; its slot is free now.
            victim.evict.notify_one();
        }
        inner.next_id += 1;
        let id = inner.next_id;
        let evict = Arc::new(Notify::new());
        inner.conns.insert(
            id,
            Conn {
                source,
                evict: evict.clone(),
            },
        );
        *inner.per_source.entry(source).or_insert(0) += 1;
        inner.set_idle(id);
        Ok(Slot {
            tracker: self.clone(),
            id,
            evict,
        })
    }

    /// How many connections are held (for tests and logs).
    pub fn held(&self) -> usize {
        self.lock().conns.len()
    }
}

/// An admitted connection; dropping it frees the slot.
pub struct Slot {
    tracker: Arc<Tracker>,
    id: u64,
    evict: Arc<Notify>,
}

impl Slot {
    /// A request is in the handler: not evictable until [`Slot::idle`].
    pub fn busy(&self) {
        let mut inner = self.tracker.lock();
        if let Some(seq) = inner.idle_of.remove(&self.id) {
            inner.idle.remove(&seq);
        }
    }

    /// The handler answered: evictable again, as the newest idle.
    pub fn idle(&self) {
        self.tracker.lock().set_idle(self.id);
    }

    /// Resolves when the server closes this connection to make room.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.tracker.lock().release(self.id);
    }
}

/// Requests one source may have in the handlers at once; its others wait
/// in line, so one client's flood queues behind itself, not before others.
pub const HANDLER_SLOTS_PER_SOURCE: usize = 4;

/// Bounds the requests in the JoinService's handlers (decoding, crypto,
/// SQLite): at most [`HANDLER_SLOTS_PER_SOURCE`] per source address and a
/// few per core overall, each line first come, first served. Without it,
/// hundreds of refused requests run at once, fight for the SQLite write lock
/// (whose busy handler sleeps up to 100 ms a try) and a good join waits
/// seconds behind them.
pub struct RequestGate {
    total: Arc<Semaphore>,
    sources: Mutex<HashMap<IpAddr, Arc<Semaphore>>>,
}

/// A request's place in the handlers; dropping it lets the next one in.
pub struct Pass {
    _source: Option<OwnedSemaphorePermit>,
    _total: OwnedSemaphorePermit,
}

/// The line was closed (never happens: the gate never closes it).
#[derive(Debug)]
pub struct GateClosed;

impl RequestGate {
    /// Twice the cores in the handlers overall (at least 4).
    pub fn new() -> RequestGate {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        RequestGate::with_total((cores * 2).max(4))
    }

    pub fn with_total(total: usize) -> RequestGate {
        RequestGate {
            total: Arc::new(Semaphore::new(total)),
            sources: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for a place: first in `source`'s line, then in the common one.
    pub async fn enter(&self, source: Option<IpAddr>) -> Result<Pass, GateClosed> {
        let line = source.map(|ip| self.line_of(source_key(ip)));
        let source = match line {
            Some(l) => Some(l.acquire_owned().await.map_err(|_| GateClosed)?),
            None => None,
        };
        let total = self
            .total
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| GateClosed)?;
        Ok(Pass {
            _source: source,
            _total: total,
        })
    }

    fn line_of(&self, ip: IpAddr) -> Arc<Semaphore> {
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        // Forget the lines nobody waits in (bounded by the connections).
        if sources.len() >= 1024 {
            sources.retain(|_, l| Arc::strong_count(l) > 1);
        }
        sources
            .entry(ip)
            .or_insert_with(|| Arc::new(Semaphore::new(HANDLER_SLOTS_PER_SOURCE)))
            .clone()
    }
}

impl Default for RequestGate {
    fn default() -> Self {
        RequestGate::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per: usize) -> Limits {
        Limits {
            max_connections: max,
            max_per_source: per,
            request_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn derived_limits_leave_headroom() {
        let l = Limits::new(&ServerConfig::default(), 1024);
        assert_eq!(l.max_connections, 768);
        assert_eq!(l.max_per_source, 192);
        assert_eq!(l.request_timeout, Duration::from_secs(30));
        assert_eq!(
            Limits::new(&ServerConfig::default(), 100).max_connections,
            16
        );
        let cfg = ServerConfig {
            max_connections: Some(10),
            max_connections_per_source: Some(50),
            request_timeout_ms: 2000,
        };
        let l = Limits::new(&cfg, u64::MAX);
        assert_eq!((l.max_connections, l.max_per_source), (10, 10));
    }

    #[test]
    fn ipv6_sources_count_by_their_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        assert_eq!(source_key(a), source_key(b));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_key(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());
        let t = Tracker::new(limits(10, 1));
        let _a = t.admit(a).unwrap();
        assert_eq!(t.admit(b).err(), Some(Refusal::PerSource));
    }

    #[tokio::test]
    async fn one_source_waits_behind_itself() {
        let gate = RequestGate::with_total(8);
        let flood: IpAddr = "127.0.0.2".parse().unwrap();
        let mut passes = Vec::new();
        for _ in 0..HANDLER_SLOTS_PER_SOURCE {
            passes.push(gate.enter(Some(flood)).await.unwrap());
        }
        let more = tokio::time::timeout(Duration::from_millis(50), gate.enter(Some(flood))).await;
        assert!(more.is_err(), "a fifth request from one source waits");
        // Another source gets in at once.
        let other = "127.0.0.1".parse().unwrap();
        tokio::time::timeout(Duration::from_secs(1), gate.enter(Some(other)))
            .await
            .unwrap()
            .unwrap();
        passes.pop();
        tokio::time::timeout(Duration::from_secs(1), gate.enter(Some(flood)))
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn full_server_evicts_the_oldest_idle_and_never_a_busy_one() {
        let t = Tracker::new(limits(2, 2));
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let first = t.admit(a).unwrap();
        let second = t.admit(a).unwrap();
        assert_eq!(t.admit(a).err(), Some(Refusal::PerSource));
        second.busy();
        // Full: the idle `first` makes room.
        let third = t.admit(b).unwrap();
        tokio::time::timeout(Duration::from_secs(1), first.evicted())
            .await
            .unwrap();
        assert_eq!(t.held(), 2);
        third.busy();
        assert_eq!(t.admit(b).err(), Some(Refusal::Full));
        drop(first);
        assert_eq!(t.held(), 2, "an evicted slot is freed once");
        second.idle();
        let _fourth = t.admit(b).unwrap();
        drop(third);
        assert_eq!(t.held(), 1);
    }
}
