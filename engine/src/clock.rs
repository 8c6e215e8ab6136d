//! Where the engine's time-to-live checks read the time: the system's
//! monotonic clock in production, one a test moves by hand (so a test of
//! an expiry advances the clock instead of sleeping past it).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A source of monotonic time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The time now.
    fn now(&self) -> Instant;
}

/// The system's monotonic clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until [`ManualClock::advance`] moves it.
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    moved: Mutex<Duration>,
}

impl ManualClock {
    /// A clock standing at an arbitrary instant.
    pub fn new() -> Self {
        ManualClock {
            start: Instant::now(),
            moved: Mutex::new(Duration::ZERO),
        }
    }

    /// Moves the clock `by` ahead.
    pub fn advance(&self, by: Duration) {
        *self.moved.lock().expect("manual clock") += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + *self.moved.lock().expect("manual clock")
    }
}

/// The system clock, shared.
pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let c = ManualClock::new();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_millis(250));
        assert_eq!(c.now() - t0, Duration::from_millis(250));
    }
}
