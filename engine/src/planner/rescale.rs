//! Which stages may change size while the query runs, and the plan at a
//! given size. A group's inputs are hashed into a fixed number of key
//! groups (the partitions its senders' repartitions make, set when the
//! query is planned); the consistent-hash ring assigns key groups to
//! members, so a new size moves whole key groups and a member's state can
//! be split by the key group of each row.

use super::{Exchange, QueryPlan, Stage, StageKind, StageMode};
pub use crate::checkpoint::Layout;
use crate::error::{EngineError, Result};

impl Stage {
    /// The key groups its hash-partitioned inputs are cut into; `None` for
    /// a stage that reads no hash exchange.
    pub fn key_groups(&self) -> Option<u32> {
        self.inputs.iter().find_map(|(_, e)| match e {
            Exchange::Hash(n) => Some(*n as u32),
            _ => None,
        })
    }
}

impl QueryPlan {
    /// Every group's size, by stage id: what a commit records so that a
    /// member restoring from it knows the layout its state was written in.
    pub fn layout(&self) -> Layout {
        self.stages
            .iter()
            .filter(|s| s.kind == StageKind::Group)
            .map(|s| (s.id, s.members))
            .collect()
    }

    /// The same plan with the group sizes of `layout` (a commit's, or a
    /// request's), each change checked by [`Self::check_rescale`].
    pub fn with_layout(&self, layout: &Layout) -> Result<QueryPlan> {
        let mut plan = self.clone();
        for (&id, &members) in layout {
            // A group at its size now needs no check (a commit records
            // every group, rescalable or not); anything else does.
            let unchanged = plan
                .stage_of(id)
                .is_some_and(|s| s.kind == StageKind::Group && s.members == members);
            if !unchanged {
                plan.check_rescale(id, members)?;
                plan.stage_mut(id).members = members;
            }
        }
        Ok(plan)
    }

    /// Whether stage `id` may run with `members` members: a group whose
    /// state splits by key group, at most one member per key group. The
    /// error says why not, in a line.
    pub fn check_rescale(&self, id: u32, members: u32) -> Result<()> {
        let no = |why: String| Err(EngineError::plan(format!("stage {id} {why}")));
        let Some(s) = self.stage_of(id) else {
            let groups: Vec<String> = self.layout().keys().map(u32::to_string).collect();
            return no(format!(
                "is not a stage of this query (its groups: {})",
                if groups.is_empty() {
                    "none".to_string()
                } else {
                    groups.join(", ")
                }
            ));
        };
        if s.kind != StageKind::Group {
            return no(format!(
                "is a {} stage: only a function group (fed by a hash exchange) changes size",
                match s.kind {
                    StageKind::Source => "source",
                    _ => "single-function",
                }
            ));
        }
        let groups = s.key_groups().unwrap_or(s.members);
        if members == 0 || members > groups {
            return no(format!(
                "has {groups} key groups: its size is 1 to {groups}, not {members}"
            ));
        }
        let edges = self.input_edges(s);
        if let Some(e) = edges.iter().find(|e| e.key.is_none()) {
            return no(format!(
                "reads edge {} hashed on expressions, not columns: its rows' key groups \
                 cannot be worked out again",
                e.shuffle_id
            ));
        }
        if s.mode == StageMode::Updating {
            let schemas = crate::updating::leaf_schemas(&s.plan);
            let plan = crate::updating::UpdatingPlan::new(&s.plan, &edges, &schemas)?;
            if plan.state_key.is_none() {
                return no("keeps its result as one group, not by key: it cannot be split".into());
            }
        }
        Ok(())
    }

    fn stage_of(&self, id: u32) -> Option<&Stage> {
        self.stages.iter().find(|s| s.id == id)
    }

    fn stage_mut(&mut self, id: u32) -> &mut Stage {
        self.stages
            .iter_mut()
            .find(|s| s.id == id)
            .expect("stage id from this plan")
    }
}
