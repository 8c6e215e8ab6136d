//! The epoch loop's view of a runtime: what it fires, what it hears back.

use async_trait::async_trait;

use crate::error::Result;
use crate::usage::Usage;

/// What the source instances said about one epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochOutcome {
    /// Records pulled, each source record once.
    pub events: u64,
    /// Every source partition reached the end it had when the run started.
    pub drained: bool,
    /// Every source is exhausted for good (bounded sources).
    pub finished: bool,
    /// Records the sources are behind their partitions' ends, where they
    /// can tell.
    pub lag: Option<u64>,
    /// The lowest watermark the sources sent, Unix ms.
    pub watermark_ms: Option<i64>,
    /// The largest event time the sources have read, Unix ms.
    pub newest_event_ms: Option<i64>,
}
/// Decides when a `StopAfter::Drained` run has drained, in place of its
/// sources' flag: e.g. by comparing the committed offsets with ends that
/// move while the run goes on.
#[async_trait]
pub trait DrainCheck: Send {
    /// Whether the run has drained after `epoch`, given its outcome.
    async fn drained(&mut self, epoch: u64, outcome: EpochOutcome) -> Result<bool>;
}

/// What the driver decided for one epoch it fires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochFire {
    /// The epoch.
    pub epoch: u64,
    /// The run's last epoch: every window is flushed.
    pub last: bool,
    /// The epoch will be committed: every stateful member keeps its state
    /// as of its end.
    pub checkpoint: bool,
    /// No earlier run can have fired it, so no source member has logged
    /// it: a source member need not look for its entry first.
    pub fresh: bool,
    /// The last epoch committed when it fires.
    pub committed: Option<u64>,
}

/// Where the functions run, as the epoch loop sees it.
#[async_trait]
pub trait EpochRuntime: Send + Sync {
    /// Fire every source member for an epoch and return once the epoch has
    /// run as far as it will (in-process: the runtime is idle; Lambda: the
    /// synchronous triggers returned).
    async fn run_epoch(&self, fire: EpochFire) -> Result<EpochOutcome>;

    /// Fail unless every function has finished `epoch`: no invocation
    /// failed and nobody waits for input.
    async fn check_complete(&self, epoch: u64) -> Result<()>;

    /// After `epoch` was committed (`last_ran`: what the sources said of
    /// the last epoch run): the runtime may change a group's size here,
    /// before the next epoch fires.
    async fn committed(&self, _epoch: u64, _last_ran: &EpochOutcome) -> Result<()> {
        Ok(())
    }

    /// The size of every function group now, by stage id: a commit
    /// records it. Empty: every group has the size it was deployed with.
    fn layout(&self) -> crate::checkpoint::Layout {
        crate::checkpoint::Layout::new()
    }

    /// The smallest size of the fixed windows the query closes, ms: an
    /// epoch fires when event time should reach the next multiple of it
    /// (`window_clock`). None: epochs fire at the interval only.
    fn window_step_ms(&self) -> Option<i64> {
        None
    }

    /// Whether a `StopAfter::Drained` run has drained after `epoch`
    /// (committed): by default what its sources said.
    async fn drained(&self, _epoch: u64, outcome: EpochOutcome) -> Result<bool> {
        Ok(outcome.drained)
    }

    /// What the functions used so far (running totals), as far as this
    /// runtime can see: recorded per epoch with the commits.
    async fn usage(&self) -> Usage {
        Usage::default()
    }

    /// After a failed epoch: replace every function instance, so that all
    /// start again from the last commit. `false`: this runtime cannot, and
    /// the run fails (a restart resumes after the last commit).
    async fn replace_instances(&self) -> Result<bool> {
        Ok(false)
    }
}
