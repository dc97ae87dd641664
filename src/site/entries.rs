//! The site's open boot entries, as the control plane last listed them
//! (`ListBootEntries`): what the boot server answers iPXE from. A MAC with no
//! open entry, or an iPXE UUID other than its entry's, gets the exit script
//! from this copy, without a SecretRequest or a signature by the node key,
//! and nothing is written at the control plane:
//! - a MAC not answered unknown in the last [`NEGATIVE`] is answered from a
//!   listing made after the request arrived, so an entry added before a
//!   machine boots always boots it;
//!   listings are made one at a time, at most one per [`MISS_FRESH`], and
//!   every request waiting meanwhile is answered by the same one;
//! - a MAC answered unknown, or whose SecretRequest was refused, is
//!   answered unknown again from memory for [`NEGATIVE`] (a machine
//!   retrying, a client repeating itself);
//! - a known MAC is answered from a copy up to [`FRESH`] old: an entry
//!   that joined or closed since is refused at its SecretRequest, and then
//!   forgotten.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use bc_wire::site_v1::{BootEntries, BootEntryInfo};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::client::ClientError;

/// How old the copy may be for a MAC it knows.
pub(super) const FRESH: Duration = Duration::from_secs(1);
/// The least time between two listings: at most five a second, however
/// many MACs are asked for.
pub(super) const MISS_FRESH: Duration = Duration::from_millis(200);
/// How long a MAC answered unknown is answered so without a new listing.
pub(super) const NEGATIVE: Duration = Duration::from_secs(1);
/// MACs remembered as unknown at most (then forgotten all at once).
const MAX_NEGATIVE: usize = 4096;

/// What the boot server knows of one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub workflow_id: String,
    /// Lowercase 8-4-4-4-12, or None when the entry names none.
    pub product_uuid: Option<String>,
}

/// The copy, and when its listing started.
#[derive(Default)]
struct Copy {
    listed_at: Option<Instant>,
    /// By MAC: the newest open entry (the listing is newest first).
    by_mac: HashMap<String, Entry>,
    /// The last listing failed.
    failed: bool,
    /// MACs answered unknown, and when.
    unknown: HashMap<String, Instant>,
}

impl Copy {
    fn remember_unknown(&mut self, mac: &str) {
        if self.unknown.len() >= MAX_NEGATIVE {
            self.unknown.clear();
        }
        self.unknown.insert(mac.to_owned(), Instant::now());
    }
}

#[derive(Default)]
pub(crate) struct Entries {
    copy: Mutex<Copy>,
}

/// The answer for a MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    Found(Entry),
    Unknown,
    /// The control plane could not be asked (logged at each listing).
    Unreachable,
}

impl Entries {
    /// The entry of `mac` (see the module's rules); `list` is called when
    /// the copy cannot answer, by one request at a time.
    pub(crate) async fn lookup<F, Fut>(&self, mac: &str, list: F) -> Lookup
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<BootEntries, ClientError>>,
    {
        let arrived = Instant::now();
        let mut copy = self.copy.lock().await;
        let age = copy.listed_at.map(|at| at.elapsed());
        if !copy.failed && age.is_some_and(|a| a < FRESH) {
            if let Some(e) = copy.by_mac.get(mac) {
                return Lookup::Found(e.clone());
            }
        }
        if copy
            .unknown
            .get(mac)
            .is_some_and(|at| at.elapsed() < NEGATIVE)
        {
            return Lookup::Unknown;
        }
        // A listing made after this request arrived (maybe by a request
        // that held the lock meanwhile) answers it; else make one, no
        // sooner than MISS_FRESH after the last.
        if copy.listed_at.is_none_or(|at| at < arrived) {
            if let Some(at) = copy.listed_at {
                tokio::time::sleep_until(at + MISS_FRESH).await;
            }
            let started = Instant::now();
            let listed = list().await;
            copy.listed_at = Some(started);
            match listed {
                Ok(listed) => {
                    copy.by_mac = index(listed.entries);
                    copy.failed = false;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list the site's boot entries");
                    copy.by_mac.clear();
                    copy.failed = true;
                }
            }
        }
        if copy.failed {
            return Lookup::Unreachable;
        }
        match copy.by_mac.get(mac) {
            Some(e) => Lookup::Found(e.clone()),
            None => {
                copy.remember_unknown(mac);
                Lookup::Unknown
            }
        }
    }

    /// Drops `mac`'s entry from the copy and answers it unknown for
    /// [`NEGATIVE`]: the control plane refused its SecretRequest (it joined
    /// or closed since the listing, or has all the tokens it may have), so
    /// a client repeating the request costs a signature a second at most.
    pub(crate) async fn forget(&self, mac: &str) {
        let mut copy = self.copy.lock().await;
        copy.by_mac.remove(mac);
        copy.remember_unknown(mac);
    }
}

fn index(entries: Vec<BootEntryInfo>) -> HashMap<String, Entry> {
    let mut by_mac = HashMap::new();
    for e in entries {
        by_mac.entry(e.mac.to_ascii_lowercase()).or_insert(Entry {
            workflow_id: e.workflow_id,
            product_uuid: Some(e.product_uuid.to_ascii_lowercase()).filter(|u| !u.is_empty()),
        });
    }
    by_mac
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    const KNOWN: &str = "52:54:00:00:00:01";

    fn listing() -> BootEntries {
        let entry = |wf: &str| BootEntryInfo {
            workflow_id: wf.to_owned(),
            mac: KNOWN.to_owned(),
            product_uuid: String::new(),
            not_after_unix_ms: 0,
        };
        BootEntries {
            entries: vec![entry("wf_new"), entry("wf_old")],
        }
    }

    #[tokio::test(start_paused = true)]
    async fn boot_requests_are_answered_from_a_rate_limited_copy() {
        let entries = Arc::new(Entries::default());
        let counter = Arc::new(AtomicUsize::new(0));
        let list = {
            let counter = counter.clone();
            move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Ok(listing()) }
            }
        };
        let n = || counter.load(Ordering::SeqCst);
        let found = Lookup::Found(Entry {
            workflow_id: "wf_new".into(),
            product_uuid: None,
        });
        // The first request lists; the newest entry of a MAC wins.
        assert_eq!(entries.lookup(KNOWN, list.clone()).await, found);
        assert_eq!(n(), 1);
        // The same unknown MAC again and again: one more listing, made
        // after it first arrived (no sooner than MISS_FRESH after the last).
        // (The paused clock stands still: a request arriving at the very
        // instant a listing started is answered by it.)
        let tick = || tokio::time::advance(Duration::from_millis(1));
        tick().await;
        let start = Instant::now();
        for _ in 0..1000 {
            let answer = entries.lookup("52:54:00:00:00:99", list.clone()).await;
            assert_eq!(answer, Lookup::Unknown);
        }
        assert_eq!(n(), 2);
        assert!(start.elapsed() <= MISS_FRESH);
        // 100 new MACs at once: all answered by one more listing.
        tick().await;
        let mut asks = tokio::task::JoinSet::new();
        for i in 0..100 {
            let (entries, list) = (entries.clone(), list.clone());
            asks.spawn(async move {
                entries
                    .lookup(&format!("52:54:00:00:01:{i:02x}"), list)
                    .await
            });
        }
        while let Some(answer) = asks.join_next().await {
            assert_eq!(answer.unwrap(), Lookup::Unknown);
        }
        assert_eq!(n(), 3);
        // A known MAC is answered from a copy up to FRESH old.
        assert_eq!(entries.lookup(KNOWN, list.clone()).await, found);
        assert_eq!(n(), 3);
        tokio::time::advance(FRESH).await;
        assert_eq!(entries.lookup(KNOWN, list.clone()).await, found);
        assert_eq!(n(), 4);
        // Forgotten (refused at its SecretRequest): unknown for NEGATIVE,
        // then listed again.
        entries.forget(KNOWN).await;
        tick().await;
        assert_eq!(entries.lookup(KNOWN, list.clone()).await, Lookup::Unknown);
        assert_eq!(n(), 4);
        tokio::time::advance(NEGATIVE).await;
        assert_eq!(entries.lookup(KNOWN, list.clone()).await, found);
        assert_eq!(n(), 5);
        // A failed listing answers Unreachable; the next request lists
        // again, no sooner than MISS_FRESH after it.
        let fail = || async { Err(ClientError::AccessDenied) };
        tokio::time::advance(FRESH).await;
        assert_eq!(entries.lookup(KNOWN, fail).await, Lookup::Unreachable);
        tick().await;
        let before = Instant::now();
        assert_eq!(entries.lookup(KNOWN, list.clone()).await, found);
        assert!(before.elapsed() <= MISS_FRESH && before.elapsed() > Duration::ZERO);
        assert_eq!(n(), 6);
    }
}
