//! The arena: where a group member collects the payloads of one epoch from
//! all upstream instances before it runs. Payloads are keyed by
//! (qid, epoch); within a key each input edge (shuffle id) has a bitmap over
//! (seq_num, fragment) so that a payload delivered twice is recognised and
//! dropped, and the set is complete only when every upstream instance has
//! delivered every fragment it announced.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::error::{EngineError, Result};
use crate::payload::{Arrived, Payload, SourceOffset};
use crate::watermark::{Watermark, WatermarkMin};

/// What the arena says about one payload.
#[derive(Debug)]
pub enum Collected {
    /// Already seen (or its epoch already ran): processed, nothing to do.
    Duplicate,
    /// Kept; more payloads are needed before the stage can run.
    NotReady,
    /// This payload completed its epoch: everything collected for it.
    Complete(EpochInput),
}

/// All input of one epoch at one member.
#[derive(Debug, Default)]
pub struct EpochInput {
    /// The epoch this input belongs to.
    pub epoch: u64,
    /// What arrived per input edge, payload by payload.
    pub edges: BTreeMap<u32, Vec<Arrived>>,
    /// The lowest watermark among the senders that are not idle: every one
    /// of them has passed it (see [`WatermarkMin`]).
    pub watermark: Watermark,
    /// The driver marked this epoch the run's last: flush every window.
    pub last: bool,
    /// The driver will commit this epoch: keep the state as of its end.
    pub checkpoint: bool,
    /// Source offsets the senders read up to, passed on to the sink.
    pub offsets: Vec<SourceOffset>,
}

#[derive(Debug, Default)]
struct EdgeSlot {
    seq_len: u32,
    /// Per seq_num: the announced fragment count and which fragments
    /// arrived. A set, not a bitmap: memory follows what arrived, never a
    /// count a payload claims.
    received: HashMap<u32, (u32, BTreeSet<u32>)>,
    arrived: Vec<Arrived>,
}

impl EdgeSlot {
    fn complete(&self) -> bool {
        self.received.len() as u32 == self.seq_len
            && self
                .received
                .values()
                .all(|(count, got)| got.len() == *count as usize)
    }

    fn missing(&self) -> Vec<String> {
        let mut out = vec![];
        for s in 0..self.seq_len {
            if out.len() >= 16 {
                break;
            }
            match self.received.get(&s) {
                None => out.push(format!("seq {s}")),
                Some((count, got)) => out.extend(
                    (0..*count)
                        .filter(|i| !got.contains(i))
                        // A long list says nothing more than its start.
                        .take(16)
                        .map(|i| format!("seq {s} fragment {i}")),
                ),
            }
        }
        out
    }
}

#[derive(Debug, Default)]
struct Slot {
    edges: HashMap<u32, EdgeSlot>,
    watermark: WatermarkMin,
    last: bool,
    checkpoint: bool,
    offsets: Vec<SourceOffset>,
}

/// Collects the payloads of each epoch from every sender on every input
/// edge, until the epoch is complete.
#[derive(Debug)]
pub struct Arena {
    stage: String,
    expected_edges: Vec<u32>,
    slots: HashMap<(String, u64), Slot>,
    /// Epochs completed here but not yet run: a payload for one of them
    /// is a retry. Once an epoch has run, the member's own epoch counter
    /// recognises its retries, so the arena forgets it: a standing query
    /// runs for months, and this set must not grow with every epoch.
    finished: HashSet<(String, u64)>,
}

impl Arena {
    /// An arena for a stage that reads the given input edges.
    pub fn new(stage: impl Into<String>, expected_edges: Vec<u32>) -> Self {
        Arena {
            stage: stage.into(),
            expected_edges,
            slots: HashMap::new(),
            finished: HashSet::new(),
        }
    }

    /// Collect one payload; its batches are decoded by the caller so that a
    /// corrupt payload is rejected before it touches the arena. Epochs
    /// below `run_before` have run at this member: their payloads are
    /// retries, and the arena keeps nothing about them.
    pub fn collect(
        &mut self,
        payload: &Payload,
        arrived: Arrived,
        run_before: u64,
    ) -> Result<Collected> {
        payload.validate(&self.stage)?;
        self.finished.retain(|(_, epoch)| *epoch >= run_before);
        if payload.epoch < run_before {
            return Ok(Collected::Duplicate);
        }
        if !self.expected_edges.contains(&payload.shuffle_id) {
            return Err(EngineError::BadPayload {
                uuid: payload.uuid_string(),
                stage: self.stage.clone(),
                reason: format!(
                    "shuffle id {} is not an input of this stage (inputs {:?})",
                    payload.shuffle_id, self.expected_edges
                ),
            });
        }
        let key = (payload.uuid.qid.clone(), payload.epoch);
        if self.finished.contains(&key) {
            return Ok(Collected::Duplicate);
        }
        let slot = self.slots.entry(key.clone()).or_default();
        let edge = slot.edges.entry(payload.shuffle_id).or_default();
        if edge.seq_len == 0 {
            edge.seq_len = payload.uuid.seq_len;
        } else if edge.seq_len != payload.uuid.seq_len {
            return Err(EngineError::BadPayload {
                uuid: payload.uuid_string(),
                stage: self.stage.clone(),
                reason: format!(
                    "seq_len {} disagrees with earlier {}",
                    payload.uuid.seq_len, edge.seq_len
                ),
            });
        }
        let (count, got) = edge
            .received
            .entry(payload.uuid.seq_num)
            .or_insert_with(|| (payload.fragment.count, BTreeSet::new()));
        if *count != payload.fragment.count {
            return Err(EngineError::BadPayload {
                uuid: payload.uuid_string(),
                stage: self.stage.clone(),
                reason: format!(
                    "fragment count {} disagrees with earlier {}",
                    payload.fragment.count, count
                ),
            });
        }
        if !got.insert(payload.fragment.index) {
            return Ok(Collected::Duplicate);
        }
        edge.arrived.push(arrived);
        // Fragments of one send repeat its watermark; adding it again does
        // not change a minimum.
        slot.watermark.add(Watermark {
            value: payload.watermark,
            idle: payload.idle,
        });
        slot.last |= payload.last;
        slot.checkpoint |= payload.checkpoint;
        slot.offsets.extend(payload.offsets.iter().cloned());

        let complete = self
            .expected_edges
            .iter()
            .all(|e| slot.edges.get(e).is_some_and(EdgeSlot::complete));
        if !complete {
            return Ok(Collected::NotReady);
        }
        let slot = self.slots.remove(&key).expect("slot exists");
        self.finished.insert(key.clone());
        let edges = slot
            .edges
            .into_iter()
            .map(|(id, e)| (id, e.arrived))
            .collect();
        Ok(Collected::Complete(EpochInput {
            epoch: key.1,
            edges,
            watermark: slot.watermark.result(),
            last: slot.last,
            checkpoint: slot.checkpoint,
            offsets: slot.offsets,
        }))
    }

    /// Human-readable list of what incomplete epochs still wait for.
    pub fn pending(&self) -> Vec<String> {
        let mut out = vec![];
        for ((qid, epoch), slot) in &self.slots {
            for e in &self.expected_edges {
                let missing = match slot.edges.get(e) {
                    None => vec!["every payload".to_string()],
                    Some(edge) => edge.missing(),
                };
                if !missing.is_empty() {
                    out.push(format!(
                        "{}: qid {qid} epoch {epoch} edge {e} misses {}",
                        self.stage,
                        missing.join(", ")
                    ));
                }
            }
        }
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{Encoding, Fragment, PayloadId};

    fn payload(edge: u32, seq_num: u32, seq_len: u32, frag: (u32, u32), epoch: u64) -> Payload {
        Payload {
            uuid: PayloadId {
                qid: "q".into(),
                seq_num,
                seq_len,
            },
            fragment: Fragment {
                index: frag.0,
                count: frag.1,
            },
            epoch,
            shuffle_id: edge,
            encoding: Encoding::None,
            watermark: Some(100 + seq_num as i64),
            idle: false,
            last: false,
            checkpoint: false,
            offsets: vec![],
            data: String::new(),
        }
    }

    #[test]
    fn completes_only_when_every_fragment_of_every_edge_arrived() {
        let mut a = Arena::new("s1", vec![1, 2]);
        assert!(matches!(
            a.collect(&payload(1, 0, 2, (0, 1), 0), Arrived::default(), 0)
                .unwrap(),
            Collected::NotReady
        ));
        assert!(matches!(
            a.collect(&payload(1, 1, 2, (0, 2), 0), Arrived::default(), 0)
                .unwrap(),
            Collected::NotReady
        ));
        assert!(matches!(
            a.collect(&payload(2, 0, 1, (0, 1), 0), Arrived::default(), 0)
                .unwrap(),
            Collected::NotReady
        ));
        assert_eq!(a.pending().len(), 1, "{:?}", a.pending());
        assert!(a.pending()[0].contains("seq 1 fragment 1"));
        match a
            .collect(&payload(1, 1, 2, (1, 2), 0), Arrived::default(), 0)
            .unwrap()
        {
            Collected::Complete(input) => assert_eq!(input.watermark.value, Some(100)),
            other => panic!("{other:?}"),
        }
        assert!(a.pending().is_empty());
    }

    #[test]
    fn duplicates_are_dropped_before_and_after_completion() {
        let mut a = Arena::new("s1", vec![1]);
        assert!(matches!(
            a.collect(&payload(1, 0, 2, (0, 1), 7), Arrived::default(), 0)
                .unwrap(),
            Collected::NotReady
        ));
        assert!(matches!(
            a.collect(&payload(1, 0, 2, (0, 1), 7), Arrived::default(), 0)
                .unwrap(),
            Collected::Duplicate
        ));
        assert!(matches!(
            a.collect(&payload(1, 1, 2, (0, 1), 7), Arrived::default(), 0)
                .unwrap(),
            Collected::Complete(_)
        ));
        assert!(matches!(
            a.collect(&payload(1, 1, 2, (0, 1), 7), Arrived::default(), 0)
                .unwrap(),
            Collected::Duplicate
        ));
    }

    #[test]
    fn run_epochs_are_forgotten_and_their_retries_still_dropped() {
        let mut a = Arena::new("s1", vec![1]);
        for epoch in 0..10_000 {
            // The member runs each epoch as soon as it completes.
            assert!(matches!(
                a.collect(&payload(1, 0, 1, (0, 1), epoch), Arrived::default(), epoch)
                    .unwrap(),
                Collected::Complete(_)
            ));
        }
        assert_eq!(a.finished.len(), 1, "only the epoch not yet run");
        // Epoch 9,999 completed but has not run: the arena recognises it.
        let retry = payload(1, 0, 1, (0, 1), 9_999);
        assert!(matches!(
            a.collect(&retry, Arrived::default(), 9_999).unwrap(),
            Collected::Duplicate
        ));
        // Run now: the member's counter recognises it, the arena forgets it.
        assert!(matches!(
            a.collect(&retry, Arrived::default(), 10_000).unwrap(),
            Collected::Duplicate
        ));
        assert!(a.finished.is_empty() && a.slots.is_empty());
    }

    #[test]
    fn bad_sequence_numbers_are_errors() {
        let mut a = Arena::new("s1", vec![1]);
        let err = a
            .collect(&payload(1, 3, 2, (0, 1), 0), Arrived::default(), 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("seq_num 3") && err.contains("s1"), "{err}");
        let err = a
            .collect(&payload(9, 0, 2, (0, 1), 0), Arrived::default(), 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("shuffle id 9"), "{err}");
    }
}
