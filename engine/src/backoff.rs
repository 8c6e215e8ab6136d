//! Truncated linear backoff for throttled invocations, as in the Flock paper:
//! wait `min(50·f + random(0..100) ms, max)`, where `f` counts the failures
//! since the last success (a success resets it).

use rand::Rng;
use std::time::Duration;

/// Truncated linear backoff with jitter (see the module), for retrying
/// throttled invocations.
#[derive(Debug, Clone)]
pub struct Backoff {
    failures: u32,
    max: Duration,
}

impl Backoff {
    /// A backoff whose delays grow up to `max`.
    pub fn new(max: Duration) -> Self {
        Backoff { failures: 0, max }
    }

    /// The wait before the next attempt; counts one more failure.
    pub fn next_delay(&mut self) -> Duration {
        self.failures += 1;
        let jitter = rand::rng().random_range(0..100u64);
        self.delay_for(self.failures, jitter)
    }

    /// The delay after `failures` failures with a given jitter in ms.
    pub fn delay_for(&self, failures: u32, jitter_ms: u64) -> Duration {
        let linear = Duration::from_millis(50 * u64::from(failures) + jitter_ms);
        linear.min(self.max)
    }

    /// Start again from the shortest delay, after a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// How many delays were taken since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_secs(2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_linearly_and_is_truncated() {
        let b = Backoff::new(Duration::from_millis(300));
        assert_eq!(b.delay_for(1, 0), Duration::from_millis(50));
        assert_eq!(b.delay_for(3, 20), Duration::from_millis(170));
        assert_eq!(b.delay_for(100, 99), Duration::from_millis(300));
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::new(Duration::from_secs(10));
        b.next_delay();
        b.next_delay();
        assert_eq!(b.failures(), 2);
        b.reset();
        let d = b.next_delay();
        assert!(d >= Duration::from_millis(50) && d < Duration::from_millis(150));
    }
}
