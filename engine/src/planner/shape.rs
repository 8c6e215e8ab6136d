//! What a driver needs of a plan to fire its epochs and watch its
//! functions: each stage's id, members and role. It is serialisable, so a
//! standing query's driver on Lambda reads it from the spec written at
//! deploy instead of planning the SQL again: the function binary is built
//! without DataFusion's SQL front end (docs/lambda.md, "Package size").

use serde::{Deserialize, Serialize};

use super::{QueryPlan, StageKind};
use crate::checkpoint::Layout;
use crate::context::{EdgeWindow, function_name};

/// A plan's stages as its driver sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanShape {
    /// The query's code, the prefix of its function names.
    pub query_code: String,
    /// Its stages, by id.
    pub stages: Vec<StageShape>,
    /// The smallest size of the tumbling or sliding windows it closes, ms:
    /// the driver fires an epoch when event time should pass the next
    /// multiple of it (`crate::epochs`). Absent in specs written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_step_ms: Option<i64>,
}

/// One stage as its driver sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageShape {
    /// The stage id, also in its functions' names.
    pub id: u32,
    /// How many functions run it.
    pub members: u32,
    /// It reads sources: the driver triggers it every epoch.
    pub reads_sources: bool,
    /// It takes payloads from upstream stages, so it can wait for input.
    pub takes_payloads: bool,
    /// A group that can change size: the most members it can have (its
    /// key groups). Absent for every other stage, and in specs written
    /// before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_members: Option<u32>,
}

impl PlanShape {
    fn functions_of<'a>(
        &'a self,
        keep: impl Fn(&StageShape) -> bool + 'a,
    ) -> impl Iterator<Item = (u32, String)> + 'a {
        self.stages
            .iter()
            .filter(move |s| keep(s))
            .flat_map(move |s| {
                (0..s.members).map(move |m| (s.id, function_name(&self.query_code, s.id, m)))
            })
    }

    /// Every function of the query.
    pub fn functions(&self) -> Vec<String> {
        self.functions_of(|_| true).map(|(_, n)| n).collect()
    }

    /// The functions the driver triggers, with their stage ids.
    pub fn source_functions(&self) -> Vec<(u32, String)> {
        self.functions_of(|s| s.reads_sources).collect()
    }

    /// The size of every group that can change size, by stage id.
    pub fn layout(&self) -> Layout {
        self.stages
            .iter()
            .filter(|s| s.max_members.is_some())
            .map(|s| (s.id, s.members))
            .collect()
    }

    /// The same shape with the group sizes of `layout`.
    pub fn with_layout(&self, layout: &Layout) -> PlanShape {
        let mut shape = self.clone();
        for s in &mut shape.stages {
            if let Some(&n) = layout.get(&s.id) {
                s.members = n;
            }
        }
        shape
    }

    /// The functions that take payloads (the ones a probe asks what they
    /// wait for).
    pub fn receivers(&self) -> Vec<String> {
        self.functions_of(|s| s.takes_payloads)
            .map(|(_, n)| n)
            .collect()
    }
}

impl QueryPlan {
    /// The plan's shape (see [`PlanShape`]).
    pub fn shape(&self) -> PlanShape {
        PlanShape {
            query_code: self.query_code.clone(),
            stages: self
                .stages
                .iter()
                .map(|s| StageShape {
                    id: s.id,
                    members: s.members,
                    reads_sources: s.kind == StageKind::Source,
                    takes_payloads: !s.inputs.is_empty(),
                    max_members: self
                        .check_rescale(s.id, 1)
                        .is_ok()
                        .then(|| s.key_groups().unwrap_or(s.members)),
                })
                .collect(),
            window_step_ms: self
                .stages
                .iter()
                .flat_map(|s| &s.windows)
                .filter_map(|w| match w {
                    Some(EdgeWindow::Fixed(c)) if c.size_ms > 0 => Some(c.size_ms),
                    _ => None,
                })
                .min(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_stages_roles() {
        let shape = PlanShape {
            query_code: "q".into(),
            window_step_ms: None,
            stages: vec![
                StageShape {
                    id: 0,
                    members: 2,
                    reads_sources: true,
                    takes_payloads: false,
                    max_members: None,
                },
                StageShape {
                    id: 1,
                    members: 1,
                    reads_sources: false,
                    takes_payloads: true,
                    max_members: Some(4),
                },
            ],
        };
        assert_eq!(shape.functions(), ["q-00-00", "q-00-01", "q-01-00"]);
        assert_eq!(
            shape.source_functions(),
            [(0, "q-00-00".to_string()), (0, "q-00-01".to_string())]
        );
        assert_eq!(shape.receivers(), ["q-01-00"]);
        assert_eq!(shape.layout(), Layout::from([(1, 1)]));
        assert_eq!(
            shape.with_layout(&Layout::from([(1, 3)])).receivers(),
            ["q-01-00", "q-01-01", "q-01-02"]
        );
        let json = serde_json::to_string(&shape).unwrap();
        assert_eq!(serde_json::from_str::<PlanShape>(&json).unwrap(), shape);
    }
}
