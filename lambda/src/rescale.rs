//! Group sizes on Lambda. Every member of a group is deployed as a function
//! at the group's planned size, whatever its size now: a member past the
//! size now is never invoked and costs nothing. The size now lives in the
//! checkpoint store (each commit records it, a rescale records the size
//! from the epoch after its commit), and every function reads it when its
//! instance starts (`CheckpointStore::next_layout`). So a rescale is: the
//! new sizes recorded, then every instance replaced; the fresh instances
//! route by the new sizes and take their key groups' state from the commit.
//! A driver that dies between the two resumes in the new sizes, and
//! replaces every instance before its first epoch (its lease was not given
//! back), so no epoch runs with members that disagree.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use skein_engine::Result;
use skein_engine::autoscale::{AutoscaleSpec, Autoscaling, GroupNow};
use skein_engine::checkpoint::{CheckpointStore, Layout, RescaleRequest};
use skein_engine::epochs::EpochOutcome;
use skein_engine::error::EngineError;
use skein_engine::planner::PlanShape;
use skein_engine::usage::Usage;

use crate::epoch_runtime::Redeploy;

/// The sizes of a deployed query's groups, as its driver keeps them.
pub struct GroupSizes {
    checkpoints: Arc<CheckpointStore>,
    /// The shape as deployed: every function that exists.
    deployed: PlanShape,
    /// Every group that can change size, by stage id: its size now.
    now: Mutex<Layout>,
    /// `--autoscale`: the rule and what it saw at the last commit.
    autoscale: Option<Mutex<Autoscaling>>,
}

impl GroupSizes {
    /// The sizes the epochs after the last commit run in. Fails when the
    /// store's sizes need more functions than are deployed (the query was
    /// deployed again with a smaller `--group-size`).
    pub async fn open(checkpoints: Arc<CheckpointStore>, deployed: PlanShape) -> Result<Self> {
        let mut now = deployed.layout();
        if let Some(stored) = checkpoints.next_layout().await? {
            for (stage, size) in now.iter_mut() {
                let Some(&n) = stored.get(stage) else {
                    continue;
                };
                if n > *size {
                    return Err(EngineError::Context(format!(
                        "stage {stage} of {} runs with {n} members (its checkpoint store says \
                         so) but only {size} are deployed: deploy it with --group-size {n} or more",
                        deployed.query_code
                    )));
                }
                *size = n;
            }
        }
        Ok(GroupSizes {
            checkpoints,
            deployed,
            now: Mutex::new(now),
            autoscale: None,
        })
    }

    /// Size the groups by `spec` too (`--autoscale`).
    pub fn autoscaled(mut self, spec: Option<AutoscaleSpec>) -> Self {
        self.autoscale = spec.map(|s| Mutex::new(Autoscaling::new(s)));
        self
    }

    /// `--autoscale`, at a commit with no request waiting: each group's
    /// own work so far (`usage`, what the functions' answers reported)
    /// is weighed, and a group whose size is wrong gets a request, carried
    /// out at once as a hand-made one is.
    pub async fn autoscale(
        &self,
        epoch: u64,
        usage: &Usage,
        last_ran: &EpochOutcome,
        replace: &dyn Redeploy,
    ) -> Result<()> {
        let Some(rule) = &self.autoscale else {
            return Ok(());
        };
        let asked = {
            let layout = self.layout();
            let groups = self.deployed.stages.iter().filter_map(|s| {
                Some(GroupNow {
                    stage: s.id,
                    members: *layout.get(&s.id)?,
                    key_groups: s.max_members?.min(s.members),
                    busy_ms: usage.busy_ms_by_stage.get(&s.id).copied().unwrap_or(0),
                })
            });
            rule.lock()
                .expect("autoscaling")
                .at_commit(epoch, last_ran, groups)
        };
        if let Some((stage, members)) = asked {
            self.checkpoints
                .ask_rescale(RescaleRequest { stage, members })
                .await?;
            self.rescale_if_asked(epoch, replace).await?;
        }
        Ok(())
    }

    /// Every group's size now.
    pub fn layout(&self) -> Layout {
        self.now.lock().expect("group sizes").clone()
    }

    /// The deployed shape at the sizes now: the functions that run.
    pub fn shape(&self) -> PlanShape {
        self.deployed.with_layout(&self.layout())
    }

    /// Why `ask` cannot be carried out, if it cannot.
    fn refusal(&self, ask: RescaleRequest) -> Option<String> {
        let Some(stage) = self.deployed.stages.iter().find(|s| s.id == ask.stage) else {
            return Some(format!("stage {} is not a stage of this query", ask.stage));
        };
        let Some(most) = stage.max_members else {
            return Some(format!(
                "stage {} is not a function group that can change size",
                ask.stage
            ));
        };
        let most = most.min(stage.members);
        (ask.members == 0 || ask.members > most).then(|| {
            format!(
                "stage {} has {most} member functions deployed: its size is 1 to {most}, not {}",
                ask.stage, ask.members
            )
        })
    }

    /// Carry out a rescale `skein rescale` left in the store, right after
    /// the commit of `epoch`: the sizes from the next epoch on are
    /// recorded, then `replace` replaces every instance. Returns whether a
    /// request was waiting (carried out now or before, or refused).
    pub async fn rescale_if_asked(&self, epoch: u64, replace: &dyn Redeploy) -> Result<bool> {
        let cs = &self.checkpoints;
        let Some(ask) = cs.rescale_request().await? else {
            return Ok(false);
        };
        let before = self.layout().get(&ask.stage).copied();
        // Carried out, and the commit just made ran at the new size: done.
        if before == Some(ask.members) {
            cs.rescale_done().await?;
            return Ok(true);
        }
        if let Some(why) = self.refusal(ask) {
            tracing::warn!(epoch, reason = %why, "rescale refused");
            cs.rescale_done().await?;
            return Ok(true);
        }
        let started = Instant::now();
        let mut next = self.layout();
        next.insert(ask.stage, ask.members);
        cs.put_layout_from(epoch + 1, &next).await?;
        replace.redeploy().await?;
        *self.now.lock().expect("group sizes") = next;
        skein_engine::metrics::rescale(ask.stage, ask.members);
        tracing::info!(
            epoch,
            stage = ask.stage,
            from = before.unwrap_or_default(),
            to = ask.members,
            ms = started.elapsed().as_millis() as u64,
            "group rescaled after the commit; every instance replaced"
        );
        Ok(true)
    }
}
