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
//! busy in a handler is a new connection refused. The tracker itself is
//! [`bc_connlimit`], which `bcd site` holds too.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::ServerConfig;

/// Descriptors kept out of the connection cap: SQLite (each pooled
/// connection holds the database and its WAL), the listener, the runtime,
/// logs, the CLI's files.
pub(crate) const RESERVED_FDS: u64 = 256;
/// The derived cap never goes below this (a tiny limit still serves).
const MIN_DERIVED: u64 = 16;
/// Nor above this: beyond it, memory (a TLS session each) runs out first.
const MAX_DERIVED: u64 = 16_384;

/// The limits `serve` enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub(crate) max_per_source: usize,
    /// From accept (or the previous response) to the end of the response.
    pub(crate) request_timeout: Duration,
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
    pub(crate) fn for_process(config: &ServerConfig) -> Limits {
        Limits::new(config, nofile_limit())
    }
}

/// The soft descriptor limit in force (`u64::MAX` when unlimited).
pub(crate) fn nofile_limit() -> u64 {
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

pub(crate) use bc_connlimit::{source_key, Deadline, Refusal, Slot, Tracker};

/// Requests one source may have in the handlers at once; its others wait
/// in line, so one client's flood queues behind itself, not before others.
pub(crate) const HANDLER_SLOTS_PER_SOURCE: usize = 4;

/// Bounds the requests in the JoinService's handlers (decoding, crypto,
/// SQLite): at most [`HANDLER_SLOTS_PER_SOURCE`] per source address and a
/// few per core overall, each line first come, first served. Without it,
/// hundreds of refused requests run at once, fight for the SQLite write lock
/// (whose busy handler sleeps up to 100 ms a try) and a good join waits
/// seconds behind them.
pub(crate) struct RequestGate {
    total: Arc<Semaphore>,
    sources: Mutex<HashMap<IpAddr, Arc<Semaphore>>>,
}

/// A request's place in the handlers; dropping it lets the next one in.
pub(crate) struct Pass {
    _source: Option<OwnedSemaphorePermit>,
    _total: OwnedSemaphorePermit,
}

/// The line was closed (never happens: the gate never closes it).
#[derive(Debug)]
pub(crate) struct GateClosed;

impl RequestGate {
    /// Twice the cores in the handlers overall (at least 4).
    pub(crate) fn new() -> RequestGate {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        RequestGate::with_total((cores * 2).max(4))
    }

    pub(crate) fn with_total(total: usize) -> RequestGate {
        RequestGate {
            total: Arc::new(Semaphore::new(total)),
            sources: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for a place: first in `source`'s line, then in the common one.
    pub(crate) async fn enter(&self, source: Option<IpAddr>) -> Result<Pass, GateClosed> {
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
}
