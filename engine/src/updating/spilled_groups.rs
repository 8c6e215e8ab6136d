//! Groups an updating aggregate moved out of memory: those no epoch touched
//! for a while, kept by key in a file on local disk (an embedded B-tree,
//! `redb`), and taken back into memory when a row of theirs comes. A key
//! filter in memory answers "not on disk" for a new group without reading
//! the file, so a stream of new keys costs no disk reads. The values of
//! distinct counts that move out of memory use the same store, a run per
//! set and move (`distinct_on_disk.rs`).
//!
//! The file is a cache of the member's state, not part of its checkpoint: a
//! whole checkpoint reads the groups in it, and a restarted member starts
//! a new file. So its commits need not survive a crash of the machine.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::keyed::Key;
use crate::error::{EngineError, Result};

const GROUPS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("groups");

/// Bytes of the file's pages the store keeps in memory.
const CACHE_BYTES: usize = 2 << 20;

/// Commits that need not reach the disk between ones that do (only a
/// commit that does lets the file reuse the pages freed before it).
const LAZY_COMMITS: u32 = 64;

/// Keys the first filter is sized for; each further one holds twice the
/// last, up to `LAST_FILTER_KEYS`.
const FIRST_FILTER_KEYS: usize = 64 * 1024;

/// Keys a filter holds at most: past it, filters stop doubling, so their
/// bits follow the keys (~10 a key) instead of running up to twice ahead of
/// them (a filter is touched all over as soon as it is made).
const LAST_FILTER_KEYS: usize = 1024 * 1024;

/// Files made by this process, to name the next.
static FILES: AtomicU64 = AtomicU64::new(0);

/// An aggregate's groups on local disk, by key: each an opaque value.
pub(super) struct SpilledGroups {
    db: Database,
    path: PathBuf,
    /// Which keys may be on disk; none for a store whose keys are looked
    /// up by prefix only (distinct values' runs).
    filter: Option<KeyFilter>,
    len: usize,
    lazy_commits: u32,
}

impl std::fmt::Debug for SpilledGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SpilledGroups({} at {})", self.len, self.path.display())
    }
}

impl SpilledGroups {
    /// An empty store in a new file under the system's temporary directory
    /// (`/tmp` on Lambda). Files left by processes that are gone are
    /// removed first.
    pub(super) fn create() -> Result<Self> {
        Self::open(Some(KeyFilter::default()))
    }

    /// The same without a key filter, for keys never asked one by one.
    pub(super) fn create_unfiltered() -> Result<Self> {
        Self::open(None)
    }

    fn open(filter: Option<KeyFilter>) -> Result<Self> {
        let root = std::env::temp_dir().join("skein-groups");
        remove_orphans(&root);
        let dir = root.join(std::process::id().to_string());
        let path = dir.join(format!("{}.redb", FILES.fetch_add(1, Ordering::Relaxed)));
        let fail = |e: &dyn std::fmt::Display| spill_error(&path, e);
        std::fs::create_dir_all(&dir).map_err(|e| fail(&e))?;
        // A file left by a store of this process that could not remove it.
        let _ = std::fs::remove_file(&path);
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(&path)
            .map_err(|e| fail(&e))?;
        Ok(SpilledGroups {
            db,
            path,
            filter,
            len: 0,
            lazy_commits: 0,
        })
    }

    /// Groups on disk.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether no group is on disk.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `key` may be on disk (false: it is not).
    pub(super) fn may_hold(&self, key: &[u8]) -> bool {
        self.len > 0 && self.filter.as_ref().is_none_or(|f| f.may_hold(key))
    }

    /// Keep `entries` (none of which is on disk already), best in key
    /// order. If it fails, none is kept.
    pub(super) fn put<K: AsRef<[u8]>, V: AsRef<[u8]>>(&mut self, entries: &[(K, V)]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let n = entries.len();
        self.write(|table| {
            for (key, value) in entries {
                table.insert(key.as_ref(), value.as_ref())?;
            }
            Ok(())
        })?;
        if let Some(filter) = &mut self.filter {
            for (key, _) in entries {
                filter.insert(key.as_ref());
            }
        }
        self.len += n;
        Ok(())
    }

    /// Take the groups of `keys` that are on disk out of it. They are read
    /// first: most keys the filter lets through are not there, and a read
    /// costs no commit.
    pub(super) fn take(&mut self, keys: &[&[u8]]) -> Result<Vec<(Key, Vec<u8>)>> {
        let mut keys: Vec<&[u8]> = keys.iter().copied().filter(|k| self.may_hold(k)).collect();
        if keys.is_empty() {
            return Ok(vec![]);
        }
        keys.sort_unstable();
        let fail = |e: &dyn std::fmt::Display| spill_error(&self.path, e);
        let mut found = vec![];
        {
            let txn = self.db.begin_read().map_err(|e| fail(&e))?;
            let table = txn.open_table(GROUPS).map_err(|e| fail(&e))?;
            for key in keys {
                if let Some(value) = table.get(key).map_err(|e| fail(&e))? {
                    found.push((Key::from(key), value.value().to_vec()));
                }
            }
        }
        if found.is_empty() {
            return Ok(found);
        }
        self.write(|table| {
            for (key, _) in &found {
                table.remove(key.as_ref())?;
            }
            Ok(())
        })?;
        self.len -= found.len();
        Ok(found)
    }

    /// Write each entry's new value, or drop it (`None`), in one commit.
    pub(super) fn upsert<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        entries: &[(K, Option<V>)],
    ) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let (mut added, mut gone) = (vec![], 0usize);
        self.write(|table| {
            for (key, value) in entries {
                match value {
                    Some(v) => {
                        if table.insert(key.as_ref(), v.as_ref())?.is_none() {
                            added.push(key.as_ref());
                        }
                    }
                    None => gone += usize::from(table.remove(key.as_ref())?.is_some()),
                }
            }
            Ok(())
        })?;
        if let Some(filter) = &mut self.filter {
            for key in &added {
                filter.insert(key);
            }
        }
        self.len = self.len + added.len() - gone;
        Ok(())
    }

    /// Drop the groups of `keys` from the disk.
    pub(super) fn remove(&mut self, keys: &[Key]) -> Result<()> {
        let mut gone = 0;
        self.write(|table| {
            for key in keys {
                gone += usize::from(table.remove(key.as_ref())?.is_some());
            }
            Ok(())
        })?;
        self.len -= gone;
        Ok(())
    }

    /// The entries whose keys start with `prefix`, in key order.
    pub(super) fn read_prefix(&self, prefix: &[u8]) -> Result<Vec<(Key, Vec<u8>)>> {
        if self.len == 0 {
            return Ok(vec![]);
        }
        let fail = |e: &dyn std::fmt::Display| spill_error(&self.path, e);
        let txn = self.db.begin_read().map_err(|e| fail(&e))?;
        let table = txn.open_table(GROUPS).map_err(|e| fail(&e))?;
        let mut out = vec![];
        for entry in table.range(prefix..).map_err(|e| fail(&e))? {
            let (key, value) = entry.map_err(|e| fail(&e))?;
            if !key.value().starts_with(prefix) {
                break;
            }
            out.push((Key::from(key.value()), value.value().to_vec()));
        }
        Ok(out)
    }

    /// Drop the entries whose keys start with `prefix`.
    /// (One write over the prefix's range: its values are not read.)
    pub(super) fn remove_prefix(&mut self, prefix: &[u8]) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let mut gone = 0;
        let end = after_prefix(prefix);
        self.write(|table| {
            let drop_all = |_: &[u8], _: &[u8]| {
                gone += 1;
                false
            };
            match &end {
                Some(end) => table.retain_in::<&[u8], _>(prefix..end.as_slice(), drop_all),
                None => table.retain_in::<&[u8], _>(prefix.., drop_all),
            }
        })?;
        self.len -= gone;
        Ok(())
    }

    /// Every group on disk, in key order, `n` at a time.
    pub(super) fn for_each_chunk(
        &self,
        n: usize,
        mut f: impl FnMut(Vec<(Key, Vec<u8>)>) -> Result<()>,
    ) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let fail = |e: &dyn std::fmt::Display| spill_error(&self.path, e);
        let txn = self.db.begin_read().map_err(|e| fail(&e))?;
        let table = txn.open_table(GROUPS).map_err(|e| fail(&e))?;
        let mut chunk = Vec::with_capacity(n.min(self.len));
        for entry in table.iter().map_err(|e| fail(&e))? {
            let (key, value) = entry.map_err(|e| fail(&e))?;
            chunk.push((Key::from(key.value()), value.value().to_vec()));
            if chunk.len() == n {
                f(std::mem::take(&mut chunk))?;
            }
        }
        if !chunk.is_empty() {
            f(chunk)?;
        }
        Ok(())
    }

    /// Take every group out of the disk, read once.
    pub(super) fn take_all(&mut self) -> Result<Vec<(Key, Vec<u8>)>> {
        let mut all = Vec::with_capacity(self.len);
        self.for_each_chunk(16 * 1024, |chunk| {
            all.extend(chunk);
            Ok(())
        })?;
        self.clear()?;
        Ok(all)
    }

    /// Drop every group on disk.
    pub(super) fn clear(&mut self) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        self.write(|table| {
            table.retain(|_, _| false)?;
            Ok(())
        })?;
        self.len = 0;
        if let Some(filter) = &mut self.filter {
            *filter = KeyFilter::default();
        }
        Ok(())
    }

    /// One write transaction over the table; most commits stay in memory
    /// (see [`LAZY_COMMITS`]).
    fn write(
        &mut self,
        f: impl FnOnce(&mut redb::Table<&[u8], &[u8]>) -> std::result::Result<(), redb::StorageError>,
    ) -> Result<()> {
        let path = self.path.clone();
        let fail = |e: &dyn std::fmt::Display| spill_error(&path, e);
        let mut txn = self.db.begin_write().map_err(|e| fail(&e))?;
        let durable = self.lazy_commits >= LAZY_COMMITS;
        let durability = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        txn.set_durability(durability).map_err(|e| fail(&e))?;
        {
            let mut table = txn.open_table(GROUPS).map_err(|e| fail(&e))?;
            f(&mut table).map_err(|e| fail(&e))?;
        }
        txn.commit().map_err(|e| fail(&e))?;
        self.lazy_commits = if durable { 0 } else { self.lazy_commits + 1 };
        Ok(())
    }
}

impl Drop for SpilledGroups {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(dir) = self.path.parent() {
            // Only when empty: other stores of this process may be in it.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The least key past every key that starts with `prefix` (none when the
/// prefix is all 0xff bytes).
fn after_prefix(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn spill_error(path: &Path, e: &dyn std::fmt::Display) -> EngineError {
    EngineError::Spill {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// Remove the files of processes that are gone (a member killed before it
/// could remove its own; on Lambda they would fill `/tmp`).
fn remove_orphans(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Which keys may be on disk: Bloom filters, a new one each time the last
/// is full (twice as large, up to a million keys), ~1% false positives a
/// filter at ~10 bits a key. A key taken back stays in them (a false
/// positive costs one lookup).
#[derive(Default)]
pub(super) struct KeyFilter {
    filters: Vec<Bloom>,
}

struct Bloom {
    bits: Vec<u64>,
    keys: usize,
    capacity: usize,
}

/// Probes per key.
const PROBES: u64 = 7;

/// Keys the filter after one of `last` keys is sized for.
fn next_capacity(last: Option<usize>) -> usize {
    last.map_or(FIRST_FILTER_KEYS, |c| (c * 2).min(LAST_FILTER_KEYS))
}

impl KeyFilter {
    pub(super) fn insert(&mut self, key: &[u8]) {
        let full = self.filters.last().is_none_or(|b| b.keys >= b.capacity);
        if full {
            let capacity = next_capacity(self.filters.last().map(|b| b.capacity));
            self.filters.push(Bloom {
                bits: vec![0; (capacity * 10).div_ceil(64)],
                keys: 0,
                capacity,
            });
        }
        let hash = hash_of(key);
        if let Some(b) = self.filters.last_mut() {
            b.insert(hash);
        }
    }

    pub(super) fn may_hold(&self, key: &[u8]) -> bool {
        let hash = hash_of(key);
        self.filters.iter().any(|b| b.may_hold(hash))
    }
}

impl Bloom {
    fn positions(&self, hash: u64) -> impl Iterator<Item = usize> + use<> {
        let m = (self.bits.len() * 64) as u64;
        let (h1, h2) = (hash & 0xffff_ffff, (hash >> 32) | 1);
        (0..PROBES).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) % m) as usize)
    }

    fn insert(&mut self, hash: u64) {
        for p in self.positions(hash) {
            self.bits[p / 64] |= 1 << (p % 64);
        }
        self.keys += 1;
    }

    fn may_hold(&self, hash: u64) -> bool {
        self.positions(hash)
            .all(|p| self.bits[p / 64] & (1 << (p % 64)) != 0)
    }
}

fn hash_of(key: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    // Seeded once per process: the filters never leave it.
    static HASHER: std::sync::OnceLock<hashbrown::DefaultHashBuilder> = std::sync::OnceLock::new();
    HASHER.get_or_init(Default::default).hash_one(key)
}

/// Distinct keys among `keys`, in first-come order.
pub(super) fn distinct<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> Vec<&'a [u8]> {
    let mut seen = hashbrown::HashSet::new();
    keys.into_iter().filter(|k| seen.insert(*k)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_double_up_to_a_million_keys_then_stay() {
        let mut sizes = vec![];
        let mut last = None;
        for _ in 0..8 {
            let c = next_capacity(last);
            sizes.push(c);
            last = Some(c);
        }
        let k = 1024;
        assert_eq!(
            sizes,
            [
                64 * k,
                128 * k,
                256 * k,
                512 * k,
                k * k,
                k * k,
                k * k,
                k * k
            ]
        );
    }

    #[test]
    fn groups_go_to_disk_and_come_back_once() {
        let mut store = SpilledGroups::create().unwrap();
        let path = store.path.clone();
        let groups: Vec<(Key, Vec<u8>)> = (0..50_000u32)
            .map(|i| (Key::from(&i.to_be_bytes()[..]), i.to_le_bytes().to_vec()))
            .collect();
        store.put(&groups).unwrap();
        assert_eq!(store.len(), 50_000);
        let k7 = 7u32.to_be_bytes();
        let absent = 70_000u32.to_be_bytes();
        let found = store.take(&[&k7[..], &absent[..]]).unwrap();
        assert_eq!(
            found,
            vec![(Key::from(&k7[..]), 7u32.to_le_bytes().to_vec())]
        );
        assert!(store.take(&[&k7[..]]).unwrap().is_empty(), "taken once");
        assert_eq!(store.len(), 49_999);
        // New keys are mostly answered by the filter alone.
        let misses = (100_000..110_000u32)
            .filter(|i| store.may_hold(&i.to_be_bytes()))
            .count();
        assert!(
            misses < 500,
            "{misses} of 10,000 absent keys passed the filter"
        );
        let mut seen = 0;
        store
            .for_each_chunk(4096, |chunk| {
                seen += chunk.len();
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, 49_999);
        drop(store);
        assert!(!path.exists(), "the file goes with the store");
    }
}
