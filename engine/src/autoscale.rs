//! `--autoscale MIN..MAX`: the driver sizes each stateful group from how
//! busy its members were, observed at every commit, and asks for a rescale
//! (the same request `skein rescale` leaves) when the size is wrong.
//!
//! The rule is the one `skein cost` sizes groups with: a group needs
//! `ceil(busy / (interval * BUSY_SHARE))` members, where `busy` is the
//! handler time its members took per epoch, summed, less the time they
//! waited on the next stage's answers (that work is the next group's). Hysteresis keeps it
//! from flapping: it grows only after [`GROW_AFTER`] observations in a row
//! say so, and shrinks only after [`SHRINK_AFTER`] in a row find it could
//! be smaller even at [`SHRINK_SHARE`] of the interval per member. The
//! caller observes a group only over epochs run at one size, so the epochs
//! that moved state in a rescale are never weighed.
//!
//! Lag is the second input: a query falling behind (its sources' lag grew
//! since the last commit and is more than one epoch's read) never shrinks,
//! and after [`LAG_GROW_AFTER`] such commits in a row a group whose
//! members are each busy at least [`SHRINK_SHARE`] of the interval grows
//! by at least one member, though its busy time alone would not say so: a
//! rate the members only just keep up with in busy time can still leave
//! the sources further behind at every epoch.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use crate::epochs::EpochOutcome;

/// How busy a member may be in an epoch, as a share of the interval: the
/// rest is headroom for bursts and for the epoch's own latency.
pub const BUSY_SHARE: f64 = 0.5;
/// A group shrinks only to a size whose members would be busy at most
/// this share of the interval: between it and [`BUSY_SHARE`] it stays.
pub const SHRINK_SHARE: f64 = 0.3;
/// Observations in a row that must find a group short of members.
pub const GROW_AFTER: u32 = 2;
/// Observations in a row that must find a group with members to spare.
pub const SHRINK_AFTER: u32 = 5;
/// Observations in a row that must find the query falling behind for a
/// busy group to grow on lag alone.
pub const LAG_GROW_AFTER: u32 = 3;

/// The bounds a query's groups are sized within.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AutoscaleRange {
    /// Fewest members.
    pub min: u32,
    /// Most members (and at most the group's key groups).
    pub max: u32,
}

impl FromStr for AutoscaleRange {
    type Err = String;

    /// `MIN..MAX`, e.g. `1..8`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (min, max) = s
            .split_once("..")
            .ok_or_else(|| format!("{s:?} is not MIN..MAX (e.g. 1..8)"))?;
        let parse = |what: &str, v: &str| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| format!("{what} {v:?} of {s:?} is not a whole number"))
        };
        let (min, max) = (parse("MIN", min)?, parse("MAX", max)?);
        if min == 0 {
            return Err(format!("{s:?}: a group has at least 1 member"));
        }
        if min > max {
            return Err(format!("{s:?}: MIN is more than MAX"));
        }
        Ok(AutoscaleRange { min, max })
    }
}

/// What the driver needs to size groups: the bounds and the epoch interval
/// the busy time is measured against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoscaleSpec {
    /// The sizes allowed.
    pub range: AutoscaleRange,
    /// The run's epoch interval.
    pub interval: Duration,
}

/// One group as observed at a commit.
#[derive(Debug, Clone, Copy)]
pub struct Observation {
    /// Members now.
    pub members: u32,
    /// The most members it can have: its key groups.
    pub key_groups: u32,
    /// Its members' handler time per epoch since the last observation, summed.
    pub busy_ms_per_epoch: f64,
    /// The query's sources are falling behind: their lag grew since the
    /// last observation and is more than one epoch's read.
    pub falling_behind: bool,
}

#[derive(Debug, Default, Clone, Copy)]
struct Streaks {
    short: u32,
    spare: u32,
    behind: u32,
}

/// The sizing rule with its memory of earlier observations, per stage.
#[derive(Debug)]
pub struct Autoscaler {
    spec: AutoscaleSpec,
    streaks: BTreeMap<u32, Streaks>,
}

impl Autoscaler {
    /// The rule for `spec`, with nothing observed yet.
    pub fn new(spec: AutoscaleSpec) -> Self {
        Autoscaler {
            spec,
            streaks: BTreeMap::new(),
        }
    }

    /// What it was made with.
    pub fn spec(&self) -> AutoscaleSpec {
        self.spec
    }

    /// Members a group busy `busy_ms` per epoch needs so that none is busy
    /// more than `share` of the interval.
    fn needed(&self, busy_ms: f64, share: f64) -> u32 {
        let budget = self.spec.interval.as_secs_f64() * 1000.0 * share;
        if budget <= 0.0 {
            return u32::MAX;
        }
        (busy_ms / budget).ceil().clamp(1.0, f64::from(u32::MAX)) as u32
    }

    /// The size `stage` should have, if not the one it has.
    pub fn observe(&mut self, stage: u32, o: Observation) -> Option<u32> {
        let max = self.spec.range.max.min(o.key_groups).max(1);
        let min = self.spec.range.min.min(max);
        // Outside the bounds (the size it was planned or committed at): at once.
        if o.members < min || o.members > max {
            self.streaks.remove(&stage);
            return Some(o.members.clamp(min, max));
        }
        let grow_to = self.needed(o.busy_ms_per_epoch, BUSY_SHARE).min(max);
        let shrink_to = self.needed(o.busy_ms_per_epoch, SHRINK_SHARE).max(min);
        // Busy enough that more members could make the epochs faster.
        let busy_share = o.busy_ms_per_epoch
            / f64::from(o.members.max(1))
            / (self.spec.interval.as_secs_f64() * 1000.0);
        let lag_to = grow_to.max(o.members + 1).min(max);
        let s = self.streaks.entry(stage).or_default();
        s.short = if grow_to > o.members { s.short + 1 } else { 0 };
        s.spare = if shrink_to < o.members && !o.falling_behind {
            s.spare + 1
        } else {
            0
        };
        s.behind = if o.falling_behind && busy_share >= SHRINK_SHARE && lag_to > o.members {
            s.behind + 1
        } else {
            0
        };
        let target = if s.short >= GROW_AFTER {
            grow_to
        } else if s.behind >= LAG_GROW_AFTER {
            lag_to
        } else if s.spare >= SHRINK_AFTER {
            shrink_to
        } else {
            return None;
        };
        self.streaks.remove(&stage);
        Some(target)
    }
}

/// A group as a driver sees it at a commit.
#[derive(Debug, Clone, Copy)]
pub struct GroupNow {
    /// The group's stage id.
    pub stage: u32,
    /// Members now.
    pub members: u32,
    /// The most members it can have.
    pub key_groups: u32,
    /// Its members' own work so far (handler time less waits on
    /// synchronous callees), summed: a running total.
    pub busy_ms: u64,
}

/// The rule and what it saw of each group at the last commit: a driver's
/// `--autoscale`, whatever runs its functions.
pub struct Autoscaling {
    rule: Autoscaler,
    /// stage -> (epoch, members, their busy ms so far) when last observed.
    seen: BTreeMap<u32, (u64, u32, u64)>,
    /// The sources' lag at the last commit, where they report one.
    lag: Option<u64>,
}

impl Autoscaling {
    /// Nothing seen yet.
    pub fn new(spec: AutoscaleSpec) -> Self {
        Autoscaling {
            rule: Autoscaler::new(spec),
            seen: BTreeMap::new(),
            lag: None,
        }
    }

    /// At the commit of `epoch`, each group's work since the last commit
    /// is weighed, with the sources' lag after the last epoch run
    /// (`last_ran`): the first group whose size is wrong, and its size.
    /// One group at a time: the next commit weighs the rest.
    pub fn at_commit(
        &mut self,
        epoch: u64,
        last_ran: &EpochOutcome,
        groups: impl IntoIterator<Item = GroupNow>,
    ) -> Option<(u32, u32)> {
        let falling_behind = match (self.lag, last_ran.lag) {
            (Some(then), Some(now)) => now > then && now > last_ran.events,
            _ => false,
        };
        self.lag = last_ran.lag;
        for g in groups {
            let last = self.seen.insert(g.stage, (epoch, g.members, g.busy_ms));
            // Across a rescale (this rule's or one by hand) the members
            // summed are another set: only a new baseline.
            let Some((then, _, busy_then)) = last.filter(|(_, members, _)| *members == g.members)
            else {
                continue;
            };
            let epochs = epoch.saturating_sub(then).max(1);
            let busy = g.busy_ms.saturating_sub(busy_then) as f64 / epochs as f64;
            tracing::debug!(
                epoch,
                stage = g.stage,
                members = g.members,
                busy_ms_per_epoch = busy,
                lag = last_ran.lag,
                falling_behind,
                "--autoscale observed the group"
            );
            let observed = Observation {
                members: g.members,
                key_groups: g.key_groups,
                busy_ms_per_epoch: busy,
                falling_behind,
            };
            if let Some(members) = self.rule.observe(g.stage, observed) {
                tracing::info!(
                    epoch,
                    stage = g.stage,
                    from = g.members,
                    to = members,
                    busy_ms_per_epoch = busy,
                    lag = last_ran.lag,
                    interval_ms = self.rule.spec().interval.as_millis() as u64,
                    "--autoscale resizes the group"
                );
                return Some((g.stage, members));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scaler(min: u32, max: u32) -> Autoscaler {
        Autoscaler::new(AutoscaleSpec {
            range: AutoscaleRange { min, max },
            interval: Duration::from_millis(1000),
        })
    }

    fn at(members: u32, busy: f64) -> Observation {
        Observation {
            members,
            key_groups: 8,
            busy_ms_per_epoch: busy,
            falling_behind: false,
        }
    }

    fn behind(members: u32, busy: f64) -> Observation {
        Observation {
            falling_behind: true,
            ..at(members, busy)
        }
    }

    #[test]
    fn parses_ranges_and_refuses_bad_ones() {
        assert_eq!(
            "1..8".parse::<AutoscaleRange>(),
            Ok(AutoscaleRange { min: 1, max: 8 })
        );
        for bad in ["8", "0..4", "5..2", "a..3", "1..-2"] {
            assert!(bad.parse::<AutoscaleRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn grows_after_two_busy_observations_to_what_the_work_needs() {
        let mut a = scaler(1, 8);
        // 1 member, 1.7 s of work per 1 s epoch: 0.5 s a member -> 4.
        assert_eq!(a.observe(2, at(1, 1700.0)), None);
        assert_eq!(a.observe(2, at(1, 1700.0)), Some(4));
        // A rescale starts the count again.
        assert_eq!(a.observe(2, at(4, 9000.0)), None);
        // Capped at MAX.
        assert_eq!(a.observe(2, at(4, 9000.0)), Some(8));
    }

    #[test]
    fn shrinks_only_after_five_idle_observations_and_not_inside_the_band() {
        let mut a = scaler(1, 8);
        // 4 members at 1.0 s of work: needs 2 at 50 %, 4 at 30 %: stays.
        for _ in 0..20 {
            assert_eq!(a.observe(2, at(4, 1000.0)), None);
        }
        // Idle: 1 member does it at 30 %.
        for _ in 0..4 {
            assert_eq!(a.observe(2, at(4, 20.0)), None);
        }
        assert_eq!(a.observe(2, at(4, 20.0)), Some(1));
        // One busy observation breaks a streak.
        let mut b = scaler(2, 8);
        for _ in 0..4 {
            assert_eq!(b.observe(2, at(6, 20.0)), None);
        }
        assert_eq!(b.observe(2, at(6, 5000.0)), None);
        for _ in 0..4 {
            assert_eq!(b.observe(2, at(6, 20.0)), None);
        }
        // And MIN holds.
        assert_eq!(b.observe(2, at(6, 20.0)), Some(2));
    }

    #[test]
    fn a_size_outside_the_bounds_moves_in_at_once_and_max_is_the_key_groups() {
        let mut a = scaler(2, 16);
        assert_eq!(a.observe(1, at(1, 0.0)), Some(2));
        let mut b = scaler(1, 16);
        let o = Observation {
            members: 4,
            key_groups: 4,
            busy_ms_per_epoch: 1e9,
            falling_behind: true,
        };
        assert_eq!(b.observe(1, o), None);
        assert_eq!(b.observe(1, o), None, "already at its key groups");
        let mut c = scaler(1, 3);
        assert_eq!(c.observe(1, at(8, 0.0)), Some(3));
    }

    #[test]
    fn a_query_falling_behind_never_shrinks_and_its_busy_groups_grow_by_one() {
        let mut a = scaler(1, 8);
        // 4 members each 40 % busy: inside the band on busy time alone.
        for _ in 0..2 {
            assert_eq!(a.observe(2, behind(4, 1600.0)), None);
        }
        assert_eq!(a.observe(2, behind(4, 1600.0)), Some(5));
        // Catching up again resets the streak.
        for _ in 0..2 {
            assert_eq!(a.observe(2, behind(5, 2000.0)), None);
        }
        assert_eq!(a.observe(2, at(5, 2000.0)), None);
        assert_eq!(a.observe(2, behind(5, 2000.0)), None);
        // Idle members do not grow on lag (a slow source or sink is not
        // theirs to fix), nor do they shrink while the query falls behind.
        let mut b = scaler(1, 8);
        for _ in 0..20 {
            assert_eq!(b.observe(2, behind(4, 20.0)), None);
        }
        assert_eq!(b.observe(2, at(4, 20.0)), None);
        // At MAX it stays.
        let mut c = scaler(1, 4);
        for _ in 0..10 {
            assert_eq!(c.observe(2, behind(4, 1600.0)), None);
        }
    }

    #[test]
    fn falling_behind_is_a_lag_that_grew_past_one_epochs_read() {
        let mut a = Autoscaling::new(AutoscaleSpec {
            range: AutoscaleRange { min: 1, max: 8 },
            interval: Duration::from_millis(1000),
        });
        let ran = |lag: u64, events: u64| EpochOutcome {
            lag: Some(lag),
            events,
            ..Default::default()
        };
        let mut total = 0;
        let mut group = |busy_ms: u64| {
            total += busy_ms;
            [GroupNow {
                stage: 2,
                members: 4,
                key_groups: 8,
                busy_ms: total,
            }]
        };
        assert_eq!(a.at_commit(1, &ran(0, 100), group(1600)), None);
        // Growing, but within one epoch's read: keeping up.
        for (e, lag) in [(2, 50), (3, 80), (4, 90), (5, 95)] {
            assert_eq!(a.at_commit(e, &ran(lag, 100), group(1600)), None);
        }
        // Further behind at each commit.
        assert_eq!(a.at_commit(6, &ran(500, 100), group(1600)), None);
        assert_eq!(a.at_commit(7, &ran(900, 100), group(1600)), None);
        assert_eq!(a.at_commit(8, &ran(1300, 100), group(1600)), Some((2, 5)));
    }
}
