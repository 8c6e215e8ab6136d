//! What went wrong since a query started, kept across instances for `skein
//! status`: records sent to dead letters, late rows set aside, failed sink
//! writes. Each member keeps its own counts (its whole life, every
//! instance). A member that writes an object per epoch it checkpoints (a
//! source member's log entry, a stateful member's state) carries them in
//! that object, at no extra request; any other member writes them alone as
//! `tally/<stage>-<member>.json` once they change, so an epoch that counts
//! nothing costs no request. A replayed epoch counts again: these are
//! counts of events seen, not of results.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::{CheckpointStore, Kind, StateKind};
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

    /// Each count the larger of the two.
    fn max(&mut self, other: &Tally) {
        self.dead_letters = self.dead_letters.max(other.dead_letters);
        self.late_rows = self.late_rows.max(other.late_rows);
        self.sink_errors = self.sink_errors.max(other.sink_errors);
    }
}

impl CheckpointStore {
    fn tally_key(&self, stage: u32, member: u32) -> object_store::path::Path {
        let name = format!("{}.json", Self::member_dir(stage, member));
        self.key(&["tally", &name])
    }

    /// The sum of every member's counts: per member the newest of its
    /// objects that carries them, or its counts written alone (the larger
    /// of each where a member has both: both are totals).
    pub async fn tally(&self) -> Result<Tally> {
        let mut by_member: BTreeMap<String, Tally> = BTreeMap::new();
        for o in self.backend.list(&self.key(&["tally"])).await? {
            let member = o.key.filename().unwrap_or_default().to_string();
            let member = member.trim_end_matches(".json").to_string();
            if let Some(t) = self.get_json::<Tally>(&o.key).await? {
                by_member.entry(member).or_default().max(&t);
            }
        }
        // The newest object of each member directory.
        let mut newest: BTreeMap<String, (u64, object_store::path::Path)> = BTreeMap::new();
        for (key, epoch, _) in self.list_epochs(&["members"]).await? {
            let name = key.filename().unwrap_or_default();
            let (Some(_), Some(member)) = (StateKind::of_name(name), member_of(&key)) else {
                continue;
            };
            if newest.get(&member).is_none_or(|(e, _)| epoch > *e) {
                newest.insert(member, (epoch, key));
            }
        }
        for (member, (_, key)) in newest {
            let Some(bytes) = self.backend.get(&key).await? else {
                continue;
            };
            if let Some(t) = super::member::decode(&key, bytes)?.tally {
                by_member.entry(member).or_default().max(&t);
            }
        }
        let mut sum = Tally::default();
        for t in by_member.values() {
            sum.add(t);
        }
        Ok(sum)
    }
}

/// The `<stage>-<member>` directory of a member object's key.
fn member_of(key: &object_store::path::Path) -> Option<String> {
    let parts: Vec<_> = key.parts().collect();
    let dir = parts.len().checked_sub(2).and_then(|i| parts.get(i))?;
    Some(dir.as_ref().to_string())
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

    /// What earlier instances of the member counted, as a cold instance
    /// read it from the object it started from; ignored once set.
    pub fn counted_before(&self, before: Option<Tally>) {
        let mut c = self.counts.lock().expect("tally");
        if c.before.is_none() {
            c.before = Some(before.unwrap_or_default());
        }
    }

    /// The member's totals to carry in the object it is about to write
    /// (every object carries them, so the newest holds them all); none
    /// while nothing was ever counted.
    pub fn carry(&self) -> Option<Tally> {
        let mut c = self.counts.lock().expect("tally");
        let mut total = c.before.unwrap_or_default();
        total.add(&c.here);
        c.written = c.here;
        (total != Tally::default()).then_some(total)
    }

    /// Write the member's counts alone if they changed since the last
    /// write (a member that writes no objects of its own).
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
            None => store.get_json::<Tally>(&key).await?.unwrap_or_default(),
        };
        let mut total = before;
        total.add(&here);
        store.put_json(Kind::Other, &key, &total).await?;
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

        // A member that writes objects carries its totals in them: its
        // newest one counts, on top of what a cold instance read.
        let source = MemberTally::default();
        source.counted_before(Some(Tally {
            dead_letters: 5,
            ..Default::default()
        }));
        source.count(|t| t.dead_letters += 1);
        let puts = cs.puts();
        for epoch in [7, 8] {
            let object = crate::checkpoint::MemberObject {
                tally: source.carry(),
                ..Default::default()
            };
            cs.put_member(1, 1, epoch, object).await.unwrap();
            source.count(|t| t.dead_letters += 1);
        }
        assert_eq!(
            cs.puts(),
            puts + 2,
            "the counts cost no request of their own"
        );
        assert_eq!(source.carry().map(|t| t.dead_letters), Some(8));
        assert_eq!(cs.tally().await.unwrap().dead_letters, 2 + 7);
    }
}
