//! Values of distinct-count sets on local disk, as runs: each time values
//! move out, a set's values go as one entry (its id and the move's number
//! as the key; the values in order, each with the bits of the aggregates
//! that counted it), so a move costs a write per set, not per value. A
//! filter in memory (about 10 bits a value) says whether a value may be on
//! disk; only then are the set's runs read. Values seldom come back (a
//! value that went cold stays cold in most streams), so a lookup may read
//! every run of its set.

use super::spilled_groups::{KeyFilter, SpilledGroups};
use crate::error::{EngineError, Result};

/// Bytes a value takes in a run: the value, then its mask.
const ITEM: usize = 9;

fn run_key(id: u64, run: u64) -> [u8; 16] {
    let mut key = [0; 16];
    key[..8].copy_from_slice(&id.to_be_bytes());
    key[8..].copy_from_slice(&run.to_be_bytes());
    key
}

/// The filter's key of value `v` of set `id`.
fn value_key(id: u64, v: i64) -> [u8; 16] {
    let mut key = [0; 16];
    key[..8].copy_from_slice(&id.to_le_bytes());
    key[8..].copy_from_slice(&v.to_le_bytes());
    key
}

fn encode(run: &[(i64, u8)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(run.len() * ITEM);
    for (v, m) in run {
        out.extend_from_slice(&v.to_le_bytes());
        out.push(*m);
    }
    out
}

/// Whether the encoded run `bytes` holds `v` (a binary search in place).
fn holds(bytes: &[u8], v: i64) -> bool {
    let value = |i: usize| {
        bytes
            .get(i * ITEM..i * ITEM + 8)
            .and_then(|b| b.try_into().ok())
            .map(i64::from_le_bytes)
    };
    let (mut lo, mut hi) = (0, bytes.len() / ITEM);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match value(mid) {
            Some(x) if x < v => lo = mid + 1,
            Some(x) if x > v => hi = mid,
            Some(_) => return true,
            None => return false,
        }
    }
    false
}

fn decode(bytes: &[u8]) -> Result<Vec<(i64, u8)>> {
    if !bytes.len().is_multiple_of(ITEM) {
        return Err(EngineError::Context(
            "a run of distinct values on disk is cut short".into(),
        ));
    }
    Ok(bytes
        .chunks_exact(ITEM)
        .map(|c| {
            let v = i64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
            (v, c[8])
        })
        .collect())
}

/// The values of one family's sets on disk.
pub(super) struct ValuesOnDisk {
    store: SpilledGroups,
    filter: KeyFilter,
    values: usize,
    /// The number of the next move.
    run: u64,
}

impl ValuesOnDisk {
    pub(super) fn create() -> Result<Self> {
        Ok(ValuesOnDisk {
            // Runs are read by set, never asked one by one: the values'
            // own filter is the one that answers.
            store: SpilledGroups::create_unfiltered()?,
            filter: KeyFilter::default(),
            values: 0,
            run: 0,
        })
    }

    /// Values on disk.
    pub(super) fn len(&self) -> usize {
        self.values
    }

    /// Whether value `v` of set `id` may be on disk (false: it is not).
    pub(super) fn may_hold(&self, id: u64, v: i64) -> bool {
        self.values > 0 && self.filter.may_hold(&value_key(id, v))
    }

    /// Keep `runs` (a set's id and values with their masks, each set
    /// once, none of its values on disk already): a run per set, its
    /// values sorted in place. If it fails, none is kept.
    pub(super) fn put(&mut self, runs: &mut [(u64, Vec<(i64, u8)>)]) -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        runs.sort_unstable_by_key(|(id, _)| *id);
        let run = self.run;
        let mut entries: Vec<([u8; 16], Option<Vec<u8>>)> = Vec::with_capacity(runs.len());
        for (id, values) in runs.iter_mut() {
            values.sort_unstable();
            entries.push((run_key(*id, run), Some(encode(values))));
        }
        self.store.upsert(&entries)?;
        self.run += 1;
        for (id, values) in runs.iter() {
            for (v, _) in values {
                self.filter.insert(&value_key(*id, *v));
            }
            self.values += values.len();
        }
        Ok(())
    }

    /// Take out of the disk those of `wanted` (set id, value) that are
    /// there: each with its mask.
    pub(super) fn take(&mut self, wanted: &[(u64, i64)]) -> Result<Vec<(u64, i64, u8)>> {
        let mut wanted: Vec<(u64, i64)> = wanted
            .iter()
            .copied()
            .filter(|(id, v)| self.may_hold(*id, *v))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut found = vec![];
        let mut entries: Vec<(Vec<u8>, Option<Vec<u8>>)> = vec![];
        for set in wanted.chunk_by(|a, b| a.0 == b.0) {
            let id = set[0].0;
            for (key, bytes) in self.store.read_prefix(&id.to_be_bytes())? {
                // Searched as it is on disk; decoded only if a value is in it.
                let hits: Vec<i64> = set
                    .iter()
                    .map(|(_, v)| *v)
                    .filter(|v| holds(&bytes, *v))
                    .collect();
                if hits.is_empty() {
                    continue;
                }
                let mut run = decode(&bytes)?;
                run.retain(|(v, m)| match hits.binary_search(v) {
                    Ok(_) => {
                        found.push((id, *v, *m));
                        false
                    }
                    Err(_) => true,
                });
                entries.push((key.to_vec(), (!run.is_empty()).then(|| encode(&run))));
            }
        }
        if found.is_empty() {
            return Ok(found);
        }
        self.store.upsert(&entries)?;
        self.values -= found.len();
        Ok(found)
    }

    /// The values of set `id` on disk, with their masks.
    pub(super) fn read_set(&self, id: u64) -> Result<Vec<(i64, u8)>> {
        let mut out = vec![];
        for (_, bytes) in self.store.read_prefix(&id.to_be_bytes())? {
            out.extend(decode(&bytes)?);
        }
        Ok(out)
    }

    /// Drop the `count` values of set `id`.
    pub(super) fn drop_set(&mut self, id: u64, count: usize) -> Result<()> {
        self.store.remove_prefix(&id.to_be_bytes())?;
        self.values -= count.min(self.values);
        Ok(())
    }

    pub(super) fn clear(&mut self) -> Result<()> {
        self.store.clear()?;
        self.filter = KeyFilter::default();
        self.values = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_go_to_disk_in_runs_and_come_back_once() {
        let mut disk = ValuesOnDisk::create().unwrap();
        // Two sets, extreme values, then a second run into the first set.
        let mut values: Vec<(u64, i64, u8)> =
            (0..1_000).map(|v| (1, v * 7, (v % 3 + 1) as u8)).collect();
        values.extend((-70..-60).map(|v| (1, v, 4)));
        values.extend([(2, 5, 1), (2, i64::MAX, 2), (2, i64::MIN, 1)]);
        let mut runs: Vec<(u64, Vec<(i64, u8)>)> = vec![];
        for (id, v, m) in values.iter().rev() {
            match runs.iter_mut().find(|(r, _)| r == id) {
                Some((_, run)) => run.push((*v, *m)),
                None => runs.push((*id, vec![(*v, *m)])),
            }
        }
        disk.put(&mut runs).unwrap();
        disk.put(&mut [(1, vec![(50_001, 2), (5, 1)])]).unwrap();
        assert_eq!(disk.len(), 1_015);
        let mut set1 = disk.read_set(1).unwrap();
        set1.sort_unstable();
        let mut expected: Vec<(i64, u8)> = values
            .iter()
            .filter(|(id, _, _)| *id == 1)
            .map(|(_, v, m)| (*v, *m))
            .chain([(5, 1), (50_001, 2)])
            .collect();
        expected.sort_unstable();
        assert_eq!(set1, expected);
        assert!(disk.may_hold(2, i64::MAX));
        let mut found = disk
            .take(&[(1, 7), (1, 7), (1, 8), (2, i64::MIN), (1, -65), (1, 5)])
            .unwrap();
        found.sort_unstable();
        assert_eq!(
            found,
            vec![(1, -65, 4), (1, 5, 1), (1, 7, 2), (2, i64::MIN, 1)]
        );
        assert!(disk.take(&[(1, 7)]).unwrap().is_empty(), "taken once");
        assert_eq!(disk.len(), 1_011);
        // New values are mostly answered by the filter alone.
        let passed = (0..10_000).filter(|v| disk.may_hold(3, *v)).count();
        assert!(passed < 500, "{passed} of 10,000 absent values passed");
        disk.drop_set(2, 2).unwrap();
        assert!(disk.read_set(2).unwrap().is_empty());
        assert_eq!(disk.read_set(1).unwrap().len(), 1_009);
    }
}
