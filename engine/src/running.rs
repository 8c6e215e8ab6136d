//! Local queries that run without a checkpoint store (a BLACKHOLE sink,
//! rows printed, `--no-checkpoint`) say so in a file, so `skein ui` and
//! name checks find them as they find checkpoint directories: one JSON file
//! per process in `<checkpoint root>/.running/`, removed when the run ends.
//! A file left by a killed process names a process that is gone; readers
//! skip it and the next registration in the directory clears it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The environment variable that names the checkpoint root (`skein run`
/// keeps its directories there; `skein ui` sets it for the queries it
/// starts).
pub const ROOT_ENV: &str = "SKEIN_CHECKPOINT_ROOT";

/// The directory under a checkpoint root (hidden: it holds no manifest, so
/// it is never taken for a query's directory).
pub const RUNNING_DIR: &str = ".running";

/// One running query without a checkpoint store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningQuery {
    /// The query's code (the identity its state would have).
    pub query_code: String,
    /// Its name, where it has one.
    pub name: Option<String>,
    /// The query text, to plan it again.
    pub sql: String,
    /// Members of each function group.
    pub group_size: usize,
    /// The process that runs it.
    pub pid: u32,
    /// When it started, ms since the epoch.
    pub started_ms: i64,
}

/// The registration of this process; the file goes when it is dropped.
pub struct Registration {
    path: PathBuf,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Say under `root` that `query` runs in this process.
pub fn register(root: &Path, query: &RunningQuery) -> std::io::Result<Registration> {
    let dir = root.join(RUNNING_DIR);
    std::fs::create_dir_all(&dir)?;
    clear_stale(&dir);
    let path = dir.join(format!("{}.json", query.pid));
    let tmp = dir.join(format!(".{}.json.tmp", query.pid));
    std::fs::write(
        &tmp,
        serde_json::to_vec(query).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, &path)?;
    Ok(Registration { path })
}

/// Files of processes that are gone.
fn clear_stale(dir: &Path) {
    for (path, q) in read_dir(dir) {
        if !alive(q.pid) {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn read_dir(dir: &Path) -> Vec<(PathBuf, RunningQuery)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut out: Vec<(PathBuf, RunningQuery)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| {
            let q = serde_json::from_slice(&std::fs::read(&p).ok()?).ok()?;
            Some((p, q))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The queries under `root` that run without a checkpoint store, in live
/// processes.
pub fn list(root: &Path) -> Vec<RunningQuery> {
    read_dir(&root.join(RUNNING_DIR))
        .into_iter()
        .map(|(_, q)| q)
        .filter(|q| alive(q.pid))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_lists_while_held_and_a_dead_process_does_not() {
        let root = std::env::temp_dir().join(format!("skein-running-{}", std::process::id()));
        let mine = RunningQuery {
            query_code: "q1".into(),
            name: Some("clicks".into()),
            sql: "SELECT 1".into(),
            group_size: 1,
            pid: std::process::id(),
            started_ms: 1,
        };
        let held = register(&root, &mine).unwrap();
        // A file left by a process that is gone (no pid is this large).
        let gone = RunningQuery {
            pid: u32::MAX - 1,
            ..mine.clone()
        };
        let dir = root.join(RUNNING_DIR);
        std::fs::write(
            dir.join(format!("{}.json", gone.pid)),
            serde_json::to_vec(&gone).unwrap(),
        )
        .unwrap();
        assert_eq!(list(&root), vec![mine.clone()]);
        drop(held);
        assert!(list(&root).is_empty());
        // The next registration clears the dead one's file.
        let again = register(&root, &mine).unwrap();
        assert_eq!(read_dir(&dir).len(), 1);
        drop(again);
        let _ = std::fs::remove_dir_all(&root);
    }
}
