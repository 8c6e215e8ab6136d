//! Shard lineage: which shards of a stream an instance owns and when a
//! shard may be read.
//!
//! A reshard closes shards (a split closes one, a merge two) and opens
//! children that name them as `ParentShardId` / `AdjacentParentShardId`. A
//! closed shard is readable until its retention ends; its last GetRecords
//! answer has no next iterator. A child is read only once every parent is
//! finished, so a key's records stay in order across the reshard.

use std::collections::BTreeMap;

use aws_sdk_kinesis::Client;

use skein_engine::source::partition_number as shard_number;

use crate::error::{ConnectorError, Result};

/// The offset a logged shard carries once it has been read to its end: a
/// replay or a resume does not read it again. (Kinesis positions live in
/// `SourceOffset.position`; `offset` is otherwise 0.)
pub const SHARD_END: i64 = -1;

/// The shard id of a shard number (`3` -> `shardId-000000000003`), the
/// inverse of `skein_engine::source::shard_number`.
pub fn shard_id(n: i32) -> String {
    format!("shardId-{n:012}")
}

/// A shard as ListShards describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedShard {
    pub id: String,
    /// `ParentShardId`, then `AdjacentParentShardId` (merges).
    pub parents: Vec<String>,
    /// It has an ending sequence number: no record will be added.
    pub closed: bool,
}

/// Every shard of `stream` ListShards knows (closed ones within retention
/// included), in shard-id order.
pub async fn list_shards(client: &Client, stream: &str) -> Result<Vec<ListedShard>> {
    let mut out = vec![];
    let mut next: Option<String> = None;
    loop {
        let mut req = client.list_shards();
        req = match &next {
            Some(token) => req.next_token(token),
            None => req.stream_name(stream),
        };
        let page = req
            .send()
            .await
            .map_err(|e| ConnectorError::kinesis("ListShards", e))?;
        for s in page.shards() {
            out.push(ListedShard {
                id: s.shard_id().to_string(),
                parents: s
                    .parent_shard_id()
                    .into_iter()
                    .chain(s.adjacent_parent_shard_id())
                    .map(str::to_string)
                    .collect(),
                closed: s
                    .sequence_number_range()
                    .is_some_and(|r| r.ending_sequence_number().is_some()),
            });
        }
        next = page.next_token().map(str::to_string);
        if next.is_none() {
            break;
        }
    }
    out.sort_by_key(|s| shard_number(&s.id));
    Ok(out)
}

/// The instance that reads shard `id`: its number modulo the instances.
/// It depends on the id alone, so it never changes as shards appear, close
/// or expire, and every shard (children included) has exactly one reader.
pub fn owner(id: &str, instances: usize) -> usize {
    shard_number(id).max(0) as usize % instances.max(1)
}

/// Whether a shard with `parents` may be read now. `finished(p)` says
/// whether this instance has read parent `p` to its end (`None`: not one
/// of its shards). A parent another instance owns can only be seen closed
/// in the listing; one gone from the listing (expired) holds nothing back.
pub fn ready(
    parents: &[String],
    listed: &BTreeMap<String, ListedShard>,
    finished: impl Fn(&str) -> Option<bool>,
) -> bool {
    parents.iter().all(|p| match finished(p) {
        Some(done) => done,
        None => listed.get(p).is_none_or(|s| s.closed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(n: u32, parents: &[u32], closed: bool) -> (String, ListedShard) {
        let id = shard_id(n as i32);
        let parents = parents.iter().map(|p| shard_id(*p as i32)).collect();
        (
            id.clone(),
            ListedShard {
                id,
                parents,
                closed,
            },
        )
    }

    #[test]
    fn owners_depend_on_the_shard_id_only() {
        assert_eq!(owner("shardId-000000000000", 2), 0);
        assert_eq!(owner("shardId-000000000003", 2), 1);
        assert_eq!(owner("shardId-000000000003", 1), 0);
        assert_eq!(
            owner("odd", 3),
            0,
            "an id without a number still has one owner"
        );
        let owners: Vec<usize> = (0..6).map(|n| owner(&shard_id(n as i32), 3)).collect();
        assert_eq!(owners, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn a_child_waits_for_every_parent() {
        // 0 split into 1 and 2; 1 and 2 merged into 3.
        let listed: BTreeMap<_, _> = [
            shard(0, &[], true),
            shard(1, &[0], true),
            shard(2, &[0], true),
            shard(3, &[1, 2], false),
        ]
        .into_iter()
        .collect();
        let parents_of = |n: &str| listed[n].parents.clone();
        let id = |n: u32| shard_id(n as i32);
        // One instance owns all: a child waits until its parents are read.
        let mine = |done: &'static [u32]| {
            move |p: &str| Some(done.iter().any(|d| shard_id(*d as i32) == p))
        };
        assert!(ready(&parents_of(&id(0)), &listed, mine(&[])));
        assert!(!ready(&parents_of(&id(1)), &listed, mine(&[])));
        assert!(ready(&parents_of(&id(1)), &listed, mine(&[0])));
        assert!(!ready(&parents_of(&id(3)), &listed, mine(&[0, 1])));
        assert!(ready(&parents_of(&id(3)), &listed, mine(&[0, 1, 2])));
        // A parent another instance reads: closed in the listing is enough.
        assert!(ready(&parents_of(&id(3)), &listed, |_| None));
        let mut open = listed.clone();
        open.get_mut(&id(2)).unwrap().closed = false;
        assert!(!ready(&parents_of(&id(3)), &open, |_| None));
        // Expired parents hold nothing back.
        assert!(ready(&parents_of(&id(3)), &BTreeMap::new(), |_| None));
    }
}
