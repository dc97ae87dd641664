//! Failed command-channel upgrades and proofs per address: an address that
//! keeps failing is refused at once, before any TLS-leaf parsing or database
//! work, until its window passes. Bounded: at most [`TRACKED`] addresses.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures an address may have within [`WINDOW`] before it is refused.
pub(super) const LIMIT: u32 = 50;
/// How long an address's failures count.
pub(super) const WINDOW: Duration = Duration::from_secs(60);
/// The most addresses remembered (a few hundred kilobytes at most).
pub(super) const TRACKED: usize = 4096;

/// The reason a refused address is given (and the log says).
pub(super) const REASON: &str =
    "too many failed command-channel upgrades from this address; try again later\n";

struct Failed {
    since: Instant,
    count: u32,
    /// Whether the refusal was logged in this window (once, not per try).
    logged: bool,
}

#[derive(Default)]
pub(super) struct Failures {
    by_addr: Mutex<HashMap<IpAddr, Failed>>,
}

impl Failures {
    /// Whether `ip` is refused now; the first refusal of a window is
    /// logged with its reason.
    pub(super) fn refused(&self, ip: IpAddr, now: Instant) -> bool {
        let mut map = self.by_addr.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = map.get_mut(&ip) else {
            return false;
        };
        if now.duration_since(f.since) >= WINDOW {
            map.remove(&ip);
            return false;
        }
        if f.count < LIMIT {
            return false;
        }
        if !f.logged {
            f.logged = true;
            tracing::warn!(%ip, failures = f.count, window_s = WINDOW.as_secs(),
                "command channel: address refused: too many failed upgrades or proofs");
        }
        true
    }

    /// Counts a failed upgrade or proof from `ip`.
    pub(super) fn failed(&self, ip: IpAddr, now: Instant) {
        let mut map = self.by_addr.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get_mut(&ip) {
            if now.duration_since(f.since) >= WINDOW {
                *f = Failed {
                    since: now,
                    count: 1,
                    logged: false,
                };
            } else {
                f.count = f.count.saturating_add(1);
            }
            return;
        }
        if map.len() >= TRACKED {
            map.retain(|_, f| now.duration_since(f.since) < WINDOW);
        }
        if map.len() >= TRACKED {
            // Still full: forget the address with the fewest failures, so
            // the ones that keep failing stay refused.
            if let Some(least) = map.iter().min_by_key(|(_, f)| f.count).map(|(ip, _)| *ip) {
                map.remove(&least);
            }
        }
        map.insert(
            ip,
            Failed {
                since: now,
                count: 1,
                logged: false,
            },
        );
    }

    #[cfg(test)]
    pub(super) fn tracked(&self) -> usize {
        self.by_addr.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_that_keeps_failing_is_refused_until_its_window_passes() {
        let f = Failures::default();
        let t = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for _ in 0..LIMIT - 1 {
            f.failed(a, t);
        }
        assert!(!f.refused(a, t), "under the limit");
        f.failed(a, t);
        assert!(f.refused(a, t), "at the limit");
        assert!(!f.refused(b, t), "another address is not");
        assert!(!f.refused(a, t + WINDOW), "the window passed");
        assert_eq!(f.tracked(), 0);
    }

    #[test]
    fn memory_is_bounded_and_the_worst_stay_refused() {
        let f = Failures::default();
        let t = Instant::now();
        let bad: IpAddr = "198.51.100.7".parse().unwrap();
        for _ in 0..LIMIT {
            f.failed(bad, t);
        }
        for i in 0..(TRACKED as u32 + 100) {
            f.failed(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)), t);
        }
        assert!(f.tracked() <= TRACKED);
        assert!(f.refused(bad, t));
    }
}
