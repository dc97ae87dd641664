//! How many fetches may start, and for whom: the maker's service is asked
//! only on behalf of a machine, and no one source of requests may spend
//! what the others (and the machines an operator knows) need.
//!
//! Each minute (a fixed window) at most [`MAX_PER_MINUTE`] fetches start.
//! Of those, at most [`MAX_PROVEN_PER_MINUTE`] are for EKs that only
//! proved themselves (round 2: anyone with a software TPM can make such an
//! EK), and at most [`MAX_PROVEN_PER_SOURCE`] of these from one source; so
//! the rest of the minute is kept for EKs the operator knows (a resolve
//! entry, a bound node, a boot entry, an approved request), of which one
//! source starts at most [`MAX_PER_SOURCE`] (a fleet behind one NAT joins
//! at that pace, its machines retrying). At once, at most
//! [`MAX_IN_FLIGHT`] fetches, of them [`MAX_PROVEN_IN_FLIGHT`] for proven
//! EKs. A source is an IPv4 address or an IPv6 /64 (one host's share of
//! addresses); requests not over TCP share one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::FetchError;

/// Fetches at once; more are refused at once (`ek-service`).
pub(crate) const MAX_IN_FLIGHT: usize = 4;
/// Of those, fetches for EKs that are only proven.
pub(crate) const MAX_PROVEN_IN_FLIGHT: usize = 2;
/// Fetches started in one minute; more are refused at once.
pub(crate) const MAX_PER_MINUTE: u32 = 120;
/// Of those, fetches for EKs that are only proven: the rest is kept for
/// EKs an operator knows.
pub(crate) const MAX_PROVEN_PER_MINUTE: u32 = 60;
/// Fetches for proven EKs from one source in a minute.
pub(crate) const MAX_PROVEN_PER_SOURCE: u32 = 10;
/// Fetches of any kind from one source in a minute.
pub(crate) const MAX_PER_SOURCE: u32 = 60;

/// Why a fetch is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// An EK the operator knows (resolve entry, bound node, boot entry,
    /// approved request).
    Known,
    /// An EK the machine proved it holds (it answered the credential
    /// challenge), which no operator knows yet.
    Proven,
}

/// Where a request came from, as the budget counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Source(Option<IpAddr>);

impl Source {
    /// An IPv4 address as it is (an IPv4-mapped IPv6 one too); an IPv6
    /// address by its /64.
    pub(crate) fn of(addr: Option<IpAddr>) -> Self {
        Source(addr.map(|a| match a {
            IpAddr::V4(_) => a,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let mut o = v6.octets();
                    o[8..].fill(0);
                    IpAddr::V6(o.into())
                }
            },
        }))
    }
}

/// This minute's fetches, and the ones under way.
#[derive(Debug)]
pub(crate) struct Budget {
    minute_start: Instant,
    total: u32,
    proven: u32,
    /// Per source: (all, proven) this minute. At most [`MAX_PER_MINUTE`]
    /// entries: one is made only when a fetch starts.
    sources: HashMap<Source, (u32, u32)>,
    in_flight: usize,
    proven_in_flight: usize,
}

impl Budget {
    pub(crate) fn new(now: Instant) -> Self {
        Budget {
            minute_start: now,
            total: 0,
            proven: 0,
            sources: HashMap::new(),
            in_flight: 0,
            proven_in_flight: 0,
        }
    }

    /// Takes a place for one fetch at `now`, or says why not. A place
    /// taken is given back with [`Budget::leave`].
    pub(crate) fn enter(
        &mut self,
        now: Instant,
        source: Source,
        claim: Claim,
    ) -> Result<(), FetchError> {
        if now.duration_since(self.minute_start) >= Duration::from_secs(60) {
            self.minute_start = now;
            self.total = 0;
            self.proven = 0;
            self.sources.clear();
        }
        let proven = claim == Claim::Proven;
        let (from_source, proven_from_source) =
            self.sources.get(&source).copied().unwrap_or((0, 0));
        if self.total >= MAX_PER_MINUTE {
            return Err(FetchError::RateLimited(self.total));
        }
        if from_source >= MAX_PER_SOURCE {
            return Err(FetchError::SourceLimited(from_source));
        }
        if proven && self.proven >= MAX_PROVEN_PER_MINUTE {
            return Err(FetchError::ProvenLimited(self.proven));
        }
        if proven && proven_from_source >= MAX_PROVEN_PER_SOURCE {
            return Err(FetchError::SourceLimited(proven_from_source));
        }
        if self.in_flight >= MAX_IN_FLIGHT {
            return Err(FetchError::Busy(self.in_flight));
        }
        if proven && self.proven_in_flight >= MAX_PROVEN_IN_FLIGHT {
            return Err(FetchError::Busy(self.proven_in_flight));
        }
        self.total += 1;
        self.in_flight += 1;
        let counts = self.sources.entry(source).or_insert((0, 0));
        counts.0 += 1;
        if proven {
            self.proven += 1;
            self.proven_in_flight += 1;
            counts.1 += 1;
        }
        Ok(())
    }

    /// Gives back the place a fetch for `claim` took.
    pub(crate) fn leave(&mut self, claim: Claim) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if claim == Claim::Proven {
            self.proven_in_flight = self.proven_in_flight.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(s: &str) -> Source {
        Source::of(Some(s.parse().unwrap()))
    }

    /// A flood of proven EKs from one source takes its own share only: the
    /// known machines and other sources are still fetched for, and a new
    /// minute starts over. The clock is moved, not waited on.
    #[test]
    fn one_source_spends_only_its_share() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        let flood = src("192.0.2.7");
        for _ in 0..MAX_PROVEN_PER_SOURCE {
            b.enter(t0, flood, Claim::Proven).unwrap();
            b.leave(Claim::Proven);
        }
        assert_eq!(
            b.enter(t0, flood, Claim::Proven),
            Err(FetchError::SourceLimited(MAX_PROVEN_PER_SOURCE))
        );
        // The same source's known machine, and another source's proven EK.
        b.enter(t0, flood, Claim::Known).unwrap();
        b.leave(Claim::Known);
        b.enter(t0, src("198.51.100.1"), Claim::Proven).unwrap();
        b.leave(Claim::Proven);
        // Another /64 is another source; the same /64 is the same.
        let v6 = src("2001:db8:1:2::1");
        assert_eq!(v6, src("2001:db8:1:2:ffff::9"));
        assert_ne!(v6, src("2001:db8:1:3::1"));
        assert_eq!(src("::ffff:192.0.2.7"), flood);
        // A minute later: the flood's share again.
        let t1 = t0 + Duration::from_secs(60);
        b.enter(t1, flood, Claim::Proven).unwrap();
        b.leave(Claim::Proven);
    }

    /// Proven EKs from many sources spend at most their share of a minute;
    /// the known ones keep the rest, and past it everything waits.
    #[test]
    fn proven_eks_leave_the_known_their_share() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        let mut n = 0u32;
        while b.proven < MAX_PROVEN_PER_MINUTE {
            let s = src(&format!("10.0.{}.{}", n / 200, n % 200));
            b.enter(t0, s, Claim::Proven).unwrap();
            b.leave(Claim::Proven);
            n += 1;
        }
        assert_eq!(
            b.enter(t0, src("10.9.9.9"), Claim::Proven),
            Err(FetchError::ProvenLimited(MAX_PROVEN_PER_MINUTE))
        );
        for i in 0..(MAX_PER_MINUTE - MAX_PROVEN_PER_MINUTE) {
            let s = src(&format!("10.1.{}.{}", i / 200, i % 200));
            b.enter(t0, s, Claim::Known).unwrap();
            b.leave(Claim::Known);
        }
        assert_eq!(
            b.enter(t0, src("10.9.9.9"), Claim::Known),
            Err(FetchError::RateLimited(MAX_PER_MINUTE))
        );
        // One source's known fetches are bounded too.
        let mut b = Budget::new(t0);
        for _ in 0..MAX_PER_SOURCE {
            b.enter(t0, src("10.2.0.1"), Claim::Known).unwrap();
            b.leave(Claim::Known);
        }
        assert!(matches!(
            b.enter(t0, src("10.2.0.1"), Claim::Known),
            Err(FetchError::SourceLimited(_))
        ));
        b.enter(t0, src("10.2.0.2"), Claim::Known).unwrap();
    }

    /// Fetches at once: proven EKs hold at most their part of the places.
    #[test]
    fn fetches_at_once_are_bounded() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        for i in 0..MAX_PROVEN_IN_FLIGHT {
            b.enter(t0, src(&format!("10.3.0.{i}")), Claim::Proven)
                .unwrap();
        }
        assert!(matches!(
            b.enter(t0, src("10.3.1.1"), Claim::Proven),
            Err(FetchError::Busy(_))
        ));
        for i in MAX_PROVEN_IN_FLIGHT..MAX_IN_FLIGHT {
            b.enter(t0, src(&format!("10.3.0.{i}")), Claim::Known)
                .unwrap();
        }
        assert!(matches!(
            b.enter(t0, src("10.3.1.2"), Claim::Known),
            Err(FetchError::Busy(_))
        ));
        b.leave(Claim::Known);
        b.enter(t0, src("10.3.1.2"), Claim::Known).unwrap();
    }
}
