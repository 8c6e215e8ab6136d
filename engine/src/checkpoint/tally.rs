//! What went wrong since a query started, kept across instances for `skein
//! status`: records sent to dead letters, late rows set aside, failed sink
//! writes. Each member keeps its own counts and writes them as
//! `tally/<stage>-<member>.json` once they change, so an epoch that counts
//! nothing costs no request. A replayed epoch counts again: these are
//! counts of events seen, not of results.

use std::sync::Mutex;

use futures::TryStreamExt;
use serde::{Deserialize, Serialize};

use super::{CheckpointStore, get_json};
use crate::error::Result;

/// Counts of one member, or summed over a query's members.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Undecodable records the sources set aside.
    pub dead_letters: u64,
    /// Rows that arrived after their window was emitted.
    pub late_rows: u64,
    /// Sink writes that failed.
    pub sink_errors: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.dead_letters += other.dead_letters;
        self.late_rows += other.late_rows;
        self.sink_errors += other.sink_errors;
    }
}

impl CheckpointStore {
    fn tally_key(&self, stage: u32, member: u32) -> object_store::path::Path {
        let name = format!("{}.json", Self::member_dir(stage, member));
        self.key(&["tally", &name])
    }

    /// The sum of every member's counts.
    pub async fn tally(&self) -> Result<Tally> {
        let objects: Vec<_> = self
            .store
            .list(Some(&self.key(&["tally"])))
            .try_collect()
            .await?;
        let mut sum = Tally::default();
        for o in objects {
            if let Some(t) = get_json::<Tally>(&self.store, &o.location).await? {
                sum.add(&t);
            }
        }
        Ok(sum)
    }
}

/// One instance's counts of its member, added to what earlier instances of
/// the member wrote.
#[derive(Debug, Default)]
pub struct MemberTally {
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    /// Counted by this instance.
    here: Tally,
    /// What the store held when this instance first wrote; `None` until then.
    before: Option<Tally>,
    /// `here` when last written.
    written: Tally,
}

impl MemberTally {
    /// Add to the counts with `f`.
    pub fn count(&self, f: impl FnOnce(&mut Tally)) {
        f(&mut self.counts.lock().expect("tally").here);
    }

    /// Write the member's counts if they changed since the last write.
    pub async fn save(&self, store: &CheckpointStore, stage: u32, member: u32) -> Result<()> {
        let (here, before) = {
            let c = self.counts.lock().expect("tally");
            if c.here == c.written {
                return Ok(());
            }
            (c.here, c.before)
        };
        let key = store.tally_key(stage, member);
        let before = match before {
            Some(b) => b,
            None => get_json::<Tally>(&store.store, &key)
                .await?
                .unwrap_or_default(),
        };
        let mut total = before;
        total.add(&here);
        store.put_json(&key, &total).await?;
        let mut c = self.counts.lock().expect("tally");
        c.before = Some(before);
        c.written = here;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;
    use object_store::path::Path;

    use super::*;

    #[tokio::test]
    async fn counts_add_up_across_instances_and_unchanged_counts_are_not_written() {
        let store = Arc::new(InMemory::new());
        let cs = CheckpointStore::open(store.clone(), Path::from("q"), "code")
            .await
            .unwrap();
        let first = MemberTally::default();
        first.count(|t| t.dead_letters += 2);
        first.save(&cs, 1, 0).await.unwrap();
        first.count(|t| t.late_rows += 3);
        first.save(&cs, 1, 0).await.unwrap();
        let written = cs.bytes_written();
        first.save(&cs, 1, 0).await.unwrap();
        assert_eq!(cs.bytes_written(), written, "nothing new, nothing written");

        // A recycled instance of the same member goes on from the store.
        let second = MemberTally::default();
        second.count(|t| t.sink_errors += 1);
        second.save(&cs, 1, 0).await.unwrap();
        let other = MemberTally::default();
        other.count(|t| t.late_rows += 10);
        other.save(&cs, 2, 1).await.unwrap();
        assert_eq!(
            cs.tally().await.unwrap(),
            Tally {
                dead_letters: 2,
                late_rows: 13,
                sink_errors: 1
            }
        );
    }
}
