//! Retry timing after a failed renewal or re-join: `backoff_min`, doubling
//! on each failure up to `backoff_max` (30 s to 10 min by default), back to
//! the start after a success.
use std::time::Duration;

#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    /// Failures since the last success.
    attempt: u32,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            attempt: 0,
        }
    }

    /// Records a failure: its number (1 for the first) and the wait before
    /// the next try.
    pub(crate) fn fail(&mut self) -> (u32, Duration) {
        self.attempt = self.attempt.saturating_add(1);
        let doublings = self.attempt.saturating_sub(1).min(31);
        let wait = self
            .min
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max)
            .min(self.max);
        (self.attempt, wait)
    }

    pub(crate) fn succeed(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_min_to_max_and_restarts_after_a_success() {
        let mut b = Backoff::new(Duration::from_secs(30), Duration::from_secs(600));
        let waits: Vec<(u32, u64)> = (0..8)
            .map(|_| {
                let (n, w) = b.fail();
                (n, w.as_secs())
            })
            .collect();
        assert_eq!(
            waits,
            vec![
                (1, 30),
                (2, 60),
                (3, 120),
                (4, 240),
                (5, 480),
                (6, 600),
                (7, 600),
                (8, 600)
            ]
        );
        b.succeed();
        assert_eq!(b.fail(), (1, Duration::from_secs(30)));
    }

    #[test]
    fn never_overflows() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(4));
        for _ in 0..100 {
            b.fail();
        }
        assert_eq!(b.fail().1, Duration::from_secs(4));
        let mut huge = Backoff::new(Duration::MAX / 2, Duration::MAX);
        huge.fail();
        huge.fail();
        assert_eq!(huge.fail().1, Duration::MAX);
    }
}
