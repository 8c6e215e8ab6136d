//! A local directory as a checkpoint store: objects appended to segment
//! files, not a file each.
//!
//! A checkpoint writes a few small objects per epoch. As files, each is a
//! new inode, and a file system may make that dear: ext4 without a journal
//! skips every inode freed in the last minutes on each create (the cost is
//! in docs/benchmarks.md). Here a put is one `write` to an open file.
//!
//! ```text
//! <dir>/manifest.json           a plain file, as before (tools read it)
//! <dir>/log/<n:020>.seg         records, appended in order
//! record: length u32 | crc32 of the rest u32 | kind u8 (put, delete)
//!         | modified ms i64 | key length u16 | key | value      (little endian)
//! ```
//!
//! - **Order.** Segments are read in number order and records in file
//!   order; a later record of a key replaces an earlier one, a delete
//!   record removes it. Each writer (a process holding the store) appends
//!   to a segment of its own, numbered after every one it found, so a torn
//!   record a killed writer left can only end its segment: a scan stops
//!   there and goes on with the next segment.
//! - **Space.** When the segments hold more than twice the live bytes (and
//!   a few MB), the oldest is compacted: its live records are appended
//!   again and it is removed. Only the oldest, so a delete record is never
//!   dropped while an older put of its key survives. A crash in between
//!   leaves both copies, and the later one wins.
//! - **Readers** in other processes (`skein status`, `skein ui`) read the
//!   segments as they grow: each call first reads what was appended since
//!   the last, and reads everything again when a segment they knew is gone.
//! - Nothing is synced to disk: a killed process loses nothing the kernel
//!   took, as with a file per object.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Mutex;

use object_store::path::Path;

use super::io::Listed;
use crate::error::{EngineError, Result};

const LOG: &str = "log";
const MANIFEST: &str = "manifest.json";
const SUFFIX: &str = ".seg";
/// A writer starts a new segment past this size.
const SEGMENT_BYTES: u64 = 32 << 20;
/// Compaction waits until the dead bytes are at least this many.
const SLACK_BYTES: u64 = 4 << 20;
/// length, crc, kind, modified, key length.
const HEADER: usize = 4 + 4 + 1 + 8 + 2;
const PUT: u8 = 1;
const DELETE: u8 = 2;

fn io_err(what: &str, path: &FsPath, e: std::io::Error) -> EngineError {
    EngineError::Context(format!("checkpoint {what} {}: {e}", path.display()))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Where a key's value lies.
#[derive(Debug, Clone, Copy)]
struct Loc {
    segment: u64,
    /// Of the value, in the segment.
    offset: u64,
    len: u32,
    modified_ms: i64,
}

/// One segment as far as it was read.
#[derive(Debug)]
struct Seen {
    file: File,
    /// Where the next record starts, or where a torn one does.
    end: u64,
    /// Its records (puts and deletes), in bytes.
    bytes: u64,
}

/// The segment this instance appends to.
#[derive(Debug)]
struct Writer {
    segment: u64,
    file: File,
}

#[derive(Debug, Default)]
struct State {
    index: BTreeMap<String, Loc>,
    segments: BTreeMap<u64, Seen>,
    writer: Option<Writer>,
    /// Bytes of records the index points to.
    live: u64,
}

/// A local directory holding a store's objects in segment files.
#[derive(Debug)]
pub(crate) struct SegmentDir {
    dir: PathBuf,
    state: Mutex<State>,
}

fn record_bytes(key: &str, len: usize) -> u64 {
    (HEADER + key.len() + len) as u64
}

fn encode(kind: u8, modified_ms: i64, key: &str, value: &[u8]) -> Vec<u8> {
    let body_len = 1 + 8 + 2 + key.len() + value.len();
    let mut out = Vec::with_capacity(8 + body_len);
    out.extend_from_slice(&((4 + body_len) as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    out.extend_from_slice(&modified_ms.to_le_bytes());
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(value);
    let crc = crc32fast::hash(&out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}

impl SegmentDir {
    pub(crate) fn new(dir: PathBuf) -> Self {
        SegmentDir {
            dir,
            state: Mutex::new(State::default()),
        }
    }

    fn log_dir(&self) -> PathBuf {
        self.dir.join(LOG)
    }

    /// A file beside the log, for what another process leaves for the one
    /// that writes the log (it owns the segments and their index).
    pub(crate) fn side_file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn segment_path(&self, n: u64) -> PathBuf {
        self.log_dir().join(format!("{n:020}{SUFFIX}"))
    }

    /// The manifest is a plain file: tools read it without the store
    /// (`skein ui` finds stores by it, `skein run` their source instances).
    fn plain(&self, key: &Path) -> Option<PathBuf> {
        (key.as_ref() == MANIFEST).then(|| self.dir.join(MANIFEST))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Read what was appended since the last call (everything, when a
    /// segment read before is gone). A writer is the only one appending,
    /// so once it writes it has read all there is.
    fn catch_up(&self, st: &mut State) -> Result<()> {
        if st.writer.is_some() {
            return Ok(());
        }
        let log = self.log_dir();
        let mut found: Vec<u64> = match std::fs::read_dir(&log) {
            Ok(entries) => entries
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    name.strip_suffix(SUFFIX)?.parse().ok()
                })
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
            Err(e) => return Err(io_err("listing", &log, e)),
        };
        found.sort_unstable();
        if st.segments.keys().any(|n| found.binary_search(n).is_err()) {
            // Compacted away under us: read everything again.
            *st = State::default();
        }
        for n in found {
            if !st.segments.contains_key(&n) {
                let path = self.segment_path(n);
                let file = match File::open(&path) {
                    Ok(f) => f,
                    // Compacted between the listing and the open.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        *st = State::default();
                        return self.catch_up(st);
                    }
                    Err(e) => return Err(io_err("opening", &path, e)),
                };
                st.segments.insert(
                    n,
                    Seen {
                        file,
                        end: 0,
                        bytes: 0,
                    },
                );
            }
            self.scan(st, n)?;
        }
        Ok(())
    }

    /// Read segment `n` from where it was left, up to its end or a torn record.
    fn scan(&self, st: &mut State, n: u64) -> Result<()> {
        let seen = st.segments.get_mut(&n).expect("a known segment");
        let size = seen
            .file
            .metadata()
            .map_err(|e| io_err("reading", &self.segment_path(n), e))?
            .len();
        if size <= seen.end {
            return Ok(());
        }
        let mut buf = vec![0; (size - seen.end) as usize];
        seen.file
            .read_exact_at(&mut buf, seen.end)
            .map_err(|e| io_err("reading", &self.segment_path(n), e))?;
        let base = seen.end;
        let mut at = 0usize;
        let mut applied = vec![];
        while buf.len() - at >= HEADER {
            let len = u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
            let end = at + 4 + len;
            if len < HEADER - 4 || end > buf.len() {
                break;
            }
            let crc = u32::from_le_bytes(buf[at + 4..at + 8].try_into().expect("4 bytes"));
            if crc32fast::hash(&buf[at + 8..end]) != crc {
                break;
            }
            let kind = buf[at + 8];
            let modified_ms = i64::from_le_bytes(buf[at + 9..at + 17].try_into().expect("8"));
            let key_len = u16::from_le_bytes(buf[at + 17..at + 19].try_into().expect("2")) as usize;
            let key_end = at + HEADER + key_len;
            if key_end > end {
                break;
            }
            let Ok(key) = std::str::from_utf8(&buf[at + HEADER..key_end]) else {
                break;
            };
            let loc = Loc {
                segment: n,
                offset: base + key_end as u64,
                len: (end - key_end) as u32,
                modified_ms,
            };
            applied.push((kind, key.to_string(), loc, (end - at) as u64));
            at = end;
        }
        let seen = st.segments.get_mut(&n).expect("a known segment");
        seen.end = base + at as u64;
        for (kind, key, loc, bytes) in applied {
            st.segments.get_mut(&n).expect("a known segment").bytes += bytes;
            match kind {
                PUT => {
                    if let Some(old) = st.index.insert(key.clone(), loc) {
                        st.live -= record_bytes(&key, old.len as usize);
                    }
                    st.live += bytes;
                }
                _ => {
                    if let Some(old) = st.index.remove(&key) {
                        st.live -= record_bytes(&key, old.len as usize);
                    }
                }
            }
        }
        Ok(())
    }

    /// Append a record; returns where its value lies.
    fn append(
        &self,
        st: &mut State,
        kind: u8,
        modified_ms: i64,
        key: &str,
        value: &[u8],
    ) -> Result<Loc> {
        let rolled = st.writer.as_ref().is_none_or(|w| {
            st.segments
                .get(&w.segment)
                .is_some_and(|s| s.end >= SEGMENT_BYTES)
        });
        if rolled {
            let n = st.segments.keys().next_back().map_or(0, |n| n + 1);
            let log = self.log_dir();
            std::fs::create_dir_all(&log).map_err(|e| io_err("creating", &log, e))?;
            let path = self.segment_path(n);
            let file = OpenOptions::new()
                .create_new(true)
                .append(true)
                .read(true)
                .open(&path)
                .map_err(|e| io_err("creating", &path, e))?;
            let read = file.try_clone().map_err(|e| io_err("opening", &path, e))?;
            st.segments.insert(
                n,
                Seen {
                    file: read,
                    end: 0,
                    bytes: 0,
                },
            );
            st.writer = Some(Writer { segment: n, file });
        }
        let record = encode(kind, modified_ms, key, value);
        let w = st.writer.as_mut().expect("a writer");
        let segment = w.segment;
        w.file
            .write_all(&record)
            .map_err(|e| io_err("writing", &self.segment_path(segment), e))?;
        let seen = st.segments.get_mut(&segment).expect("the writer's segment");
        let offset = seen.end + (record.len() - value.len()) as u64;
        seen.end += record.len() as u64;
        seen.bytes += record.len() as u64;
        Ok(Loc {
            segment,
            offset,
            len: value.len() as u32,
            modified_ms,
        })
    }

    fn put_locked(&self, st: &mut State, key: &str, value: &[u8], modified_ms: i64) -> Result<()> {
        let loc = self.append(st, PUT, modified_ms, key, value)?;
        if let Some(old) = st.index.insert(key.to_string(), loc) {
            st.live -= record_bytes(key, old.len as usize);
        }
        st.live += record_bytes(key, value.len());
        Ok(())
    }

    fn read(&self, st: &State, loc: Loc) -> std::io::Result<Vec<u8>> {
        let seen = st
            .segments
            .get(&loc.segment)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
        let mut buf = vec![0; loc.len as usize];
        seen.file.read_exact_at(&mut buf, loc.offset)?;
        Ok(buf)
    }

    /// The object at `key`, if there is one.
    pub(crate) fn get(&self, key: &Path) -> Result<Option<Vec<u8>>> {
        if let Some(path) = self.plain(key) {
            return match std::fs::read(&path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io_err("reading", &path, e)),
            };
        }
        let mut st = self.lock();
        self.catch_up(&mut st)?;
        let Some(loc) = st.index.get(key.as_ref()).copied() else {
            return Ok(None);
        };
        match self.read(&st, loc) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) => Err(io_err("reading", &self.segment_path(loc.segment), e)),
        }
    }

    /// Write `bytes` at `key`: replacing what is there, or (`new`) only if
    /// nothing is. Returns whether it wrote.
    pub(crate) fn write(&self, key: &Path, bytes: &[u8], new: bool) -> Result<bool> {
        if let Some(path) = self.plain(key) {
            return write_file(&self.dir, &path, bytes, new);
        }
        let mut st = self.lock();
        self.catch_up(&mut st)?;
        if new && st.index.contains_key(key.as_ref()) {
            return Ok(false);
        }
        self.put_locked(&mut st, key.as_ref(), bytes, now_ms())?;
        Ok(true)
    }

    /// Every object under `prefix`.
    pub(crate) fn list(&self, prefix: &Path) -> Result<Vec<Listed>> {
        let mut st = self.lock();
        self.catch_up(&mut st)?;
        let p = prefix.as_ref();
        let start = if p.is_empty() {
            String::new()
        } else {
            format!("{p}/")
        };
        let mut out: Vec<Listed> = st
            .index
            .range(start.clone()..)
            .take_while(|(k, _)| k.starts_with(&start))
            .map(|(k, loc)| Listed {
                key: Path::from(k.as_str()),
                size: loc.len as u64,
            })
            .collect();
        drop(st);
        if p.is_empty() {
            out.extend(plain_files(&self.dir)?);
        }
        Ok(out)
    }

    /// Delete `keys`; missing ones are not an error.
    pub(crate) fn delete(&self, keys: Vec<Path>) -> Result<()> {
        let mut st = self.lock();
        self.catch_up(&mut st)?;
        for key in keys {
            if let Some(path) = self.plain(&key) {
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("deleting", &path, e)),
                }
                continue;
            }
            if let Some(old) = st.index.remove(key.as_ref()) {
                st.live -= record_bytes(key.as_ref(), old.len as usize);
                self.append(&mut st, DELETE, now_ms(), key.as_ref(), &[])?;
            }
        }
        self.compact(&mut st)
    }

    /// When the object at `key` was last written, Unix ms.
    pub(crate) fn modified_ms(&self, key: &Path) -> Option<i64> {
        if let Some(path) = self.plain(key) {
            let modified = std::fs::metadata(path).ok()?.modified().ok()?;
            let since = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
            return Some(since.as_millis() as i64);
        }
        let mut st = self.lock();
        self.catch_up(&mut st).ok()?;
        st.index.get(key.as_ref()).map(|l| l.modified_ms)
    }

    /// Compact the oldest segments while they hold mostly dead records.
    fn compact(&self, st: &mut State) -> Result<()> {
        loop {
            let total: u64 = st.segments.values().map(|s| s.bytes).sum();
            let Some(oldest) = st.segments.keys().next().copied() else {
                return Ok(());
            };
            let writing = st.writer.as_ref().map(|w| w.segment);
            if Some(oldest) == writing || total < 2 * st.live + SLACK_BYTES {
                return Ok(());
            }
            let moving: Vec<(String, Loc)> = st
                .index
                .iter()
                .filter(|(_, l)| l.segment == oldest)
                .map(|(k, l)| (k.clone(), *l))
                .collect();
            for (key, loc) in moving {
                let value = self
                    .read(st, loc)
                    .map_err(|e| io_err("reading", &self.segment_path(oldest), e))?;
                self.put_locked(st, &key, &value, loc.modified_ms)?;
            }
            let path = self.segment_path(oldest);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("removing", &path, e)),
            }
            st.segments.remove(&oldest);
        }
    }
}

/// The manifest, if `dir` has one.
fn plain_files(dir: &FsPath) -> Result<Vec<Listed>> {
    let path = dir.join(MANIFEST);
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_file() => Ok(vec![Listed {
            key: Path::from(MANIFEST),
            size: meta.len(),
        }]),
        Ok(_) => Ok(vec![]),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
        Err(e) => Err(io_err("reading", &path, e)),
    }
}

/// A plain file written whole: staged beside it and renamed into place,
/// or (`new`) linked only if nothing is there.
fn write_file(dir: &FsPath, target: &FsPath, bytes: &[u8], new: bool) -> Result<bool> {
    std::fs::create_dir_all(dir).map_err(|e| io_err("creating", dir, e))?;
    let staged = dir.join(format!(".staged-{}", std::process::id()));
    std::fs::write(&staged, bytes).map_err(|e| io_err("writing", &staged, e))?;
    let placed = if new {
        // A hard link fails if the target exists: create-if-absent.
        let linked = std::fs::hard_link(&staged, target);
        let _ = std::fs::remove_file(&staged);
        linked
    } else {
        std::fs::rename(&staged, target)
    };
    match placed {
        Ok(()) => Ok(true),
        Err(e) if new && e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => {
            let _ = std::fs::remove_file(&staged);
            Err(io_err("writing", target, e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("skein-seg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_reader_sees_what_a_writer_appends_and_a_restart_sees_it_all() {
        let dir = scratch("reader");
        let writer = SegmentDir::new(dir.clone());
        let reader = SegmentDir::new(dir.clone());
        let k = |s: &str| Path::from(s);
        writer
            .write(&k("members/1-0/1.bin"), b"one", false)
            .unwrap();
        assert_eq!(
            reader.get(&k("members/1-0/1.bin")).unwrap().unwrap(),
            b"one"
        );
        writer
            .write(&k("members/1-0/1.bin"), b"uno", false)
            .unwrap();
        assert!(!writer.write(&k("members/1-0/1.bin"), b"x", true).unwrap());
        writer
            .write(&k("members/1-0/2.bin"), b"two", false)
            .unwrap();
        writer.write(&k("manifest.json"), b"{}", false).unwrap();
        writer
            .delete(vec![k("members/1-0/2.bin"), k("none/x")])
            .unwrap();
        assert_eq!(
            reader.get(&k("members/1-0/1.bin")).unwrap().unwrap(),
            b"uno"
        );
        assert_eq!(reader.get(&k("members/1-0/2.bin")).unwrap(), None);
        let listed: Vec<String> = reader
            .list(&k("members"))
            .unwrap()
            .into_iter()
            .map(|l| format!("{}:{}", l.key, l.size))
            .collect();
        assert_eq!(listed, ["members/1-0/1.bin:3"]);
        assert!(reader.modified_ms(&k("members/1-0/1.bin")).is_some());
        // A second writer (a restart) appends to a segment of its own.
        drop(writer);
        let again = SegmentDir::new(dir.clone());
        again
            .write(&k("members/1-0/3.bin"), b"three", false)
            .unwrap();
        assert_eq!(again.get(&k("members/1-0/1.bin")).unwrap().unwrap(), b"uno");
        assert_eq!(std::fs::read_dir(dir.join(LOG)).unwrap().count(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_torn_record_ends_its_segment_and_loses_nothing_before_it() {
        let dir = scratch("torn");
        let k = |s: &str| Path::from(s);
        let writer = SegmentDir::new(dir.clone());
        writer.write(&k("a/1"), b"kept", false).unwrap();
        writer.write(&k("a/2"), &[7; 100], false).unwrap();
        drop(writer);
        // A kill in the middle of the second write.
        let seg = dir.join(LOG).join(format!("{:020}{SUFFIX}", 0));
        let len = std::fs::metadata(&seg).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(len - 30)
            .unwrap();
        let restarted = SegmentDir::new(dir.clone());
        assert_eq!(restarted.get(&k("a/1")).unwrap().unwrap(), b"kept");
        assert_eq!(restarted.get(&k("a/2")).unwrap(), None);
        restarted.write(&k("a/2"), b"again", false).unwrap();
        let reader = SegmentDir::new(dir.clone());
        assert_eq!(reader.get(&k("a/2")).unwrap().unwrap(), b"again");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dead_segments_are_compacted_and_what_lives_moves_forward() {
        let dir = scratch("compact");
        let k = |s: &str| Path::from(s);
        let big = vec![1u8; 1 << 20];
        // Three writers in turn (three segments); the first's long-lived
        // object must survive its segment.
        for round in 0..3u32 {
            let w = SegmentDir::new(dir.clone());
            if round == 0 {
                w.write(&k("base/state"), b"base", false).unwrap();
            }
            for i in 0..4 {
                let key = k(&format!("epochs/{round}-{i}"));
                w.write(&key, &big, false).unwrap();
                w.delete(vec![key]).unwrap();
            }
        }
        let segments = std::fs::read_dir(dir.join(LOG)).unwrap().count();
        assert!(
            segments < 3,
            "the oldest dead segments went: {segments} left"
        );
        let reader = SegmentDir::new(dir.clone());
        assert_eq!(reader.get(&k("base/state")).unwrap().unwrap(), b"base");
        assert_eq!(reader.list(&k("epochs")).unwrap().len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
