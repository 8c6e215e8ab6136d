//! A member's one object per epoch: what it keeps for that epoch in a
//! single write. A source member's offsets-log entry, a stateful member's
//! state (whole or changes; the bytes are `snapshot`'s), and the member's
//! counts and figures (`skein status`, `skein ui`) ride together: a
//! figure a member records is added to the header's record, without
//! another request.
//!
//! ```text
//! b"SKEPOCH1" | header length (u32, little endian) | header (JSON) | state bytes
//! ```
//!
//! The name says what state it holds (`<e>.bin`: none, `<e>.state.bin`:
//! whole, `<e>.changes.bin`: changes), so a clean-up finds where each
//! member's chain of changes starts from a listing alone.

use object_store::path::Path;
use serde::{Deserialize, Serialize};

use super::{CheckpointStore, Kind, MemberRecord, OffsetsEntry, corrupt, epoch_name};
use crate::error::{EngineError, Result};

const MAGIC: &[u8; 8] = b"SKEPOCH1";

/// What state a member object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateKind {
    /// The whole state as of the end of the epoch.
    Whole,
    /// The changes since an earlier state (their base).
    Changes,
}

impl StateKind {
    fn suffix(kind: Option<StateKind>) -> &'static str {
        match kind {
            None => "bin",
            Some(StateKind::Whole) => "state.bin",
            Some(StateKind::Changes) => "changes.bin",
        }
    }

    /// The kind an object's name says, if it is a member object.
    pub(super) fn of_name(name: &str) -> Option<Option<StateKind>> {
        let (_, suffix) = name.split_once('.')?;
        match suffix {
            "bin" => Some(None),
            "state.bin" => Some(Some(StateKind::Whole)),
            "changes.bin" => Some(Some(StateKind::Changes)),
            _ => None,
        }
    }
}

/// What a member keeps for one epoch.
#[derive(Debug, Default)]
pub struct MemberObject {
    /// A source member's offsets-log entry.
    pub offsets: Option<OffsetsEntry>,
    /// The member's counts so far (its whole life, every instance) and
    /// its latest figures.
    pub tally: Option<MemberRecord>,
    /// A stateful member's state: its kind and its encoded bytes.
    pub state: Option<(StateKind, Vec<u8>)>,
}

/// A member object read back.
#[derive(Debug, Default)]
pub struct MemberRead {
    /// The offsets-log entry it holds, if any.
    pub offsets: Option<OffsetsEntry>,
    /// The counts and figures it holds, if any.
    pub tally: Option<MemberRecord>,
    /// The state bytes it holds (empty when none).
    pub state: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    epoch: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    offsets: Option<OffsetsEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tally: Option<MemberRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state: Option<StateKind>,
}

fn encode(epoch: u64, object: MemberObject) -> Result<Vec<u8>> {
    let (kind, state) = match object.state {
        Some((kind, bytes)) => (Some(kind), bytes),
        None => (None, vec![]),
    };
    let header = Header {
        epoch,
        offsets: object.offsets,
        tally: object.tally,
        state: kind,
    };
    let json = serde_json::to_vec(&header).map_err(|e| EngineError::Context(e.to_string()))?;
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + json.len() + state.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&state);
    Ok(out)
}

pub(super) fn decode(key: &Path, mut bytes: Vec<u8>) -> Result<MemberRead> {
    let bad = |reason: &str| corrupt(key, reason);
    if bytes.len() < MAGIC.len() + 4 || &bytes[..MAGIC.len()] != MAGIC {
        return Err(bad("not a Skein member object (bad magic)"));
    }
    let len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    let end = 12usize
        .checked_add(len)
        .filter(|end| *end <= bytes.len())
        .ok_or_else(|| bad("truncated header"))?;
    let header: Header = serde_json::from_slice(&bytes[12..end]).map_err(|e| corrupt(key, e))?;
    bytes.drain(..end);
    Ok(MemberRead {
        offsets: header.offsets,
        tally: header.tally,
        state: bytes,
    })
}

impl CheckpointStore {
    fn member_key(&self, stage: u32, member: u32, epoch: u64, kind: Option<StateKind>) -> Path {
        let name = format!("{}.{}", epoch_name(epoch), StateKind::suffix(kind));
        self.key(&["members", &Self::member_dir(stage, member), &name])
    }

    /// Write a member's object for `epoch`. Only one instance of a member
    /// writes at a time, and a cold stateful one first drops the states an
    /// earlier instance wrote past the commit ([`Self::drop_states_after`]),
    /// so a whole state and changes of one epoch never both stand.
    pub async fn put_member(
        &self,
        stage: u32,
        member: u32,
        epoch: u64,
        object: MemberObject,
    ) -> Result<()> {
        let state = object.state.as_ref().map(|s| s.0);
        let key = self.member_key(stage, member, epoch, state);
        let kind = if state.is_some() {
            Kind::State
        } else {
            Kind::Entry
        };
        self.put(kind, &key, encode(epoch, object)?).await
    }

    /// Like [`Self::put_member`] for an object without state, but only if
    /// none is there: `false` when one is (another writer took the epoch).
    pub async fn put_member_new(
        &self,
        stage: u32,
        member: u32,
        epoch: u64,
        object: MemberObject,
    ) -> Result<bool> {
        debug_assert!(object.state.is_none(), "a conditional write holds no state");
        let key = self.member_key(stage, member, epoch, None);
        self.put_new(Kind::Entry, &key, encode(epoch, object)?)
            .await
    }

    /// A member's object for `epoch` without state (a source member's), if written.
    pub async fn member(&self, stage: u32, member: u32, epoch: u64) -> Result<Option<MemberRead>> {
        let key = self.member_key(stage, member, epoch, None);
        match self.backend.get(&key).await? {
            Some(bytes) => decode(&key, bytes).map(Some),
            None => Ok(None),
        }
    }

    /// The offsets log entry of a source member for an epoch, if written.
    pub async fn offsets(
        &self,
        stage: u32,
        member: u32,
        epoch: u64,
    ) -> Result<Option<OffsetsEntry>> {
        Ok(self
            .member(stage, member, epoch)
            .await?
            .and_then(|m| m.offsets))
    }

    /// A stateful member's object for `epoch`: whole state or changes (the
    /// state's own header says which).
    pub async fn member_state(
        &self,
        stage: u32,
        member: u32,
        epoch: u64,
    ) -> Result<Option<MemberRead>> {
        for kind in [StateKind::Whole, StateKind::Changes] {
            if let Some(read) = self.member_state_of(stage, member, epoch, kind).await? {
                return Ok(Some(read));
            }
        }
        Ok(None)
    }

    /// [`Self::member_state`] when the kind of the state is known: one
    /// request.
    pub async fn member_state_of(
        &self,
        stage: u32,
        member: u32,
        epoch: u64,
        kind: StateKind,
    ) -> Result<Option<MemberRead>> {
        let key = self.member_key(stage, member, epoch, Some(kind));
        match self.backend.get(&key).await? {
            Some(bytes) => decode(&key, bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Delete a member's states of epochs after `commit` (all of them when
    /// nothing is committed): an earlier instance wrote them for epochs
    /// that a restart runs again. Returns how many.
    pub async fn drop_states_after(
        &self,
        stage: u32,
        member: u32,
        commit: Option<u64>,
    ) -> Result<u64> {
        let dir = Self::member_dir(stage, member);
        let stale: Vec<Path> = self
            .list_epochs(&["members", &dir])
            .await?
            .into_iter()
            .filter(|(key, epoch, _)| {
                let state = key
                    .filename()
                    .and_then(StateKind::of_name)
                    .is_some_and(|k| k.is_some());
                state && commit.is_none_or(|c| *epoch > c)
            })
            .map(|(key, _, _)| key)
            .collect();
        let n = stale.len() as u64;
        self.backend.delete(stale).await?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;

    use super::*;

    fn entry(w: i64) -> OffsetsEntry {
        OffsetsEntry {
            tables: vec![],
            watermark: Some(w),
            idle: false,
            drained: false,
            finished: false,
            epochs: None,
            poison: vec![],
        }
    }

    #[tokio::test]
    async fn offsets_counts_and_state_travel_in_one_object() {
        let cs = CheckpointStore::open(Arc::new(InMemory::new()), Path::from("q"), "abc")
            .await
            .unwrap();
        let tally = crate::checkpoint::MemberRecord {
            counts: crate::checkpoint::Tally {
                late_rows: 3,
                ..Default::default()
            },
            figures: Some(crate::checkpoint::MemberFigures {
                invocations: 2,
                ..Default::default()
            }),
        };
        let object = MemberObject {
            offsets: Some(entry(7)),
            tally: Some(tally.clone()),
            state: None,
        };
        cs.put_member(0, 1, 4, object).await.unwrap();
        assert_eq!(cs.puts(), 1);
        let read = cs.member(0, 1, 4).await.unwrap().unwrap();
        assert_eq!(read.offsets, Some(entry(7)));
        assert_eq!(read.tally, Some(tally));
        assert!(cs.offsets(0, 1, 5).await.unwrap().is_none());
        assert!(
            !cs.put_member_new(0, 1, 4, MemberObject::default())
                .await
                .unwrap(),
            "the epoch is taken"
        );

        for (epoch, kind) in [(1, StateKind::Whole), (2, StateKind::Changes)] {
            let object = MemberObject {
                state: Some((kind, vec![epoch as u8; 3])),
                ..Default::default()
            };
            cs.put_member(2, 0, epoch, object).await.unwrap();
        }
        let read = cs.member_state(2, 0, 2).await.unwrap().unwrap();
        assert_eq!(read.state, vec![2; 3]);
        assert!(cs.member_state(2, 0, 3).await.unwrap().is_none());
        assert_eq!(cs.drop_states_after(2, 0, Some(1)).await.unwrap(), 1);
        assert!(cs.member_state(2, 0, 2).await.unwrap().is_none());
        assert_eq!(
            cs.drop_states_after(0, 1, None).await.unwrap(),
            0,
            "no state"
        );
        assert!(decode(&Path::from("x"), b"SKEPOCH1\xff\xff\xff\xff".to_vec()).is_err());
    }
}
