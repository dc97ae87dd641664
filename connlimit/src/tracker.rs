//! Connection caps shared by both servers (the control plane's HTTPS
//! listener, `bcd site`'s plain-HTTP boot server): a cap on connections, a
//! cap per source address, and eviction of the oldest idle connection when
//! full.
//!
//! A connection is *idle* while it has no request in progress (while its
//! request head arrives, and between keep-alive requests; the control plane
//! also counts its TLS handshake). When the server is full, the oldest idle
//! connection is closed to make room: a slow client loses its slot to a new
//! one, and a client that finishes its request quickly is never the oldest.
//! Only when every slot is busy is a new connection refused.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

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
    max_connections: usize,
    max_per_source: usize,
    inner: Mutex<Inner>,
}

impl Tracker {
    /// At most `max_connections` held, `max_per_source` of them from one
    /// source ([`source_key`]).
    pub fn new(max_connections: usize, max_per_source: usize) -> Arc<Tracker> {
        Arc::new(Tracker {
            max_connections,
            max_per_source: max_per_source.min(max_connections),
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a connection from `source` (idle), closing the oldest idle
    /// one when the server is full.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Slot, Refusal> {
        let source = source_key(source);
        let mut inner = self.lock();
        if inner.per_source.get(&source).copied().unwrap_or(0) >= self.max_per_source {
            return Err(Refusal::PerSource);
        }
        if inner.conns.len() >= self.max_connections {
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

/// When a connection's current phase must be done (its request head, its
/// answer): moved by the server as the connection goes from one to the next.
#[derive(Clone)]
pub struct Deadline(Arc<Mutex<Instant>>);

impl Deadline {
    pub fn after(timeout: Duration) -> Self {
        Deadline(Arc::new(Mutex::new(Instant::now() + timeout)))
    }

    pub(crate) fn get(&self) -> Instant {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn reset(&self, timeout: Duration) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now() + timeout;
    }

    /// Resolves once the deadline passes without being moved.
    pub async fn passed(&self) {
        loop {
            let at = self.get();
            tokio::time::sleep_until(at).await;
            if self.get() <= Instant::now() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_sources_count_by_their_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        assert_eq!(source_key(a), source_key(b));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_key(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());
        let t = Tracker::new(10, 1);
        let _a = t.admit(a).unwrap();
        assert_eq!(t.admit(b).err(), Some(Refusal::PerSource));
    }

    #[tokio::test]
    async fn full_server_evicts_the_oldest_idle_and_never_a_busy_one() {
        let t = Tracker::new(2, 2);
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
