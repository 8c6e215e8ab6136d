//! When the next window should end. A query that closes tumbling or
//! sliding windows on a live stream need not wait out the rest of the
//! interval once event time passes a window's end: the loop fires an epoch
//! then, so a window's rows go out a few ms after its end instead of up to
//! an interval later, at the price of about one extra epoch per window end.
//!
//! Event time is assumed to keep pace with the wall clock. Two readings of
//! it propose a time and the earlier wins:
//! - the newest event time read: when it reaches the end, the records of
//!   the window have arrived on a stream read in time order (what a stage
//!   that emits updates every epoch needs, e.g. YSB's);
//! - the watermark: when it reaches the end, the window closes. It moves
//!   with the slowest partition, so a sparse partition makes its estimate
//!   late; the newest reading then fires first, and this one again after.

use std::time::Duration;

use super::runtime::EpochOutcome;

/// After event time has reached a window end it may take a moment for
/// every partition's records past it to be fetched: fire this much later.
const SETTLE: Duration = Duration::from_millis(5);

/// The event time the last epoch saw: the newest read, and the watermark.
#[derive(Debug, Default)]
pub(super) struct EventClocks {
    newest_ms: Option<i64>,
    watermark_ms: Option<i64>,
}

impl EventClocks {
    /// How long after the epoch that ended with `outcome` fired the next
    /// multiple of `step_ms` should be reached, by either reading; none
    /// unless a reading moved since the epoch before.
    pub(super) fn next_end(&mut self, step_ms: i64, outcome: &EpochOutcome) -> Option<Duration> {
        let newest = until_window_end(step_ms, outcome.newest_event_ms, self.newest_ms);
        let watermark = until_window_end(step_ms, outcome.watermark_ms, self.watermark_ms);
        self.newest_ms = outcome.newest_event_ms.or(self.newest_ms);
        self.watermark_ms = outcome.watermark_ms.or(self.watermark_ms);
        newest.into_iter().chain(watermark).min()
    }
}

/// How long until event time at `now_ms` reaches the next multiple of
/// `step_ms`, plus [`SETTLE`]. None unless it moved since `previous_ms`: an
/// idle or stalled stream would otherwise fire epoch after epoch for a
/// window that is not ending.
fn until_window_end(
    step_ms: i64,
    now_ms: Option<i64>,
    previous_ms: Option<i64>,
) -> Option<Duration> {
    let now = now_ms?;
    if step_ms <= 0 || previous_ms.is_none_or(|p| now <= p) {
        return None;
    }
    let end = now - now.rem_euclid(step_ms) + step_ms;
    Some(Duration::from_millis((end - now) as u64) + SETTLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(d: Option<Duration>) -> Option<i64> {
        d.map(|d| d.as_millis() as i64)
    }

    #[test]
    fn the_next_end_is_the_next_multiple_of_the_step() {
        // 10 s windows; event time at 12.5 s: the window [10 s, 20 s) ends
        // in 7.5 s.
        assert_eq!(
            ms(until_window_end(10_000, Some(12_500), Some(12_400))),
            Some(7_505)
        );
        // On an end, the next one is a whole step away.
        assert_eq!(
            ms(until_window_end(10_000, Some(20_000), Some(19_990))),
            Some(10_005)
        );
        // Before 1970 too.
        assert_eq!(
            ms(until_window_end(1_000, Some(-1_500), Some(-1_600))),
            Some(505)
        );
    }

    #[test]
    fn event_time_that_did_not_move_sets_no_time() {
        assert_eq!(until_window_end(10_000, Some(12_500), Some(12_500)), None);
        assert_eq!(until_window_end(10_000, Some(12_500), None), None);
        assert_eq!(until_window_end(10_000, None, Some(1)), None);
        assert_eq!(until_window_end(0, Some(12_500), Some(1)), None);
    }

    #[test]
    fn the_earlier_reading_wins_and_both_are_remembered() {
        let mut clocks = EventClocks::default();
        let outcome = |newest, watermark| EpochOutcome {
            newest_event_ms: Some(newest),
            watermark_ms: Some(watermark),
            ..Default::default()
        };
        // The first epoch only sets the readings.
        assert_eq!(clocks.next_end(10_000, &outcome(9_000, 8_000)), None);
        // The newest read is 0.2 s from its end; the watermark, held back
        // by a sparse partition, 1.5 s from the same end.
        assert_eq!(
            ms(clocks.next_end(10_000, &outcome(9_800, 8_500))),
            Some(205)
        );
        // The newest read passed the end; the watermark did not move.
        assert_eq!(
            ms(clocks.next_end(10_000, &outcome(10_050, 8_500))),
            Some(9_955)
        );
        // Now the watermark catches up to 50 ms before the end.
        assert_eq!(
            ms(clocks.next_end(10_000, &outcome(10_050, 9_950))),
            Some(55)
        );
    }
}
