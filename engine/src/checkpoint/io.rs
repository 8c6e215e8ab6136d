//! Where a checkpoint store's objects live: any object store (S3, S3
//! Express One Zone, memory), or a local directory written in place.
//!
//! A local directory is written with plain file calls on the calling task
//! rather than through `object_store`'s local store, which hands every
//! request to a blocking thread: a checkpoint writes a few small files per
//! epoch, and the hop cost more than the write. Each file is written under
//! a staging name and renamed into place, so a reader (or a restart after a
//! kill) sees a whole object or none. Nothing is synced to disk: a killed
//! process loses nothing the kernel took, as with `object_store`'s store.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::{EngineError, Result};

/// Where the objects are.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// An object store.
    Objects(Arc<dyn ObjectStore>),
    /// A local directory: a key is a path under it.
    Dir(Arc<LocalDir>),
}

/// A local directory used as an object store.
#[derive(Debug)]
pub(crate) struct LocalDir {
    dir: PathBuf,
}

/// Names staging files uniquely within this process.
static STAGED: AtomicU64 = AtomicU64::new(0);

/// An object a listing found.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub key: Path,
    pub size: u64,
}

/// Staging files live here, under the directory, so a rename never
/// crosses file systems and listings of the store's prefixes never see them.
const STAGING: &str = ".staging";

fn io_err(what: &str, path: &std::path::Path, e: std::io::Error) -> EngineError {
    EngineError::Context(format!("checkpoint {what} {}: {e}", path.display()))
}

impl Backend {
    pub fn dir(dir: PathBuf) -> Self {
        Backend::Dir(Arc::new(LocalDir { dir }))
    }

    /// The object at `key`, if there is one.
    pub async fn get(&self, key: &Path) -> Result<Option<Vec<u8>>> {
        match self {
            Backend::Objects(store) => match store.get(key).await {
                Ok(r) => Ok(Some(r.bytes().await?.to_vec())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            },
            Backend::Dir(d) => {
                let path = d.path(key);
                match std::fs::read(&path) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(io_err("reading", &path, e)),
                }
            }
        }
    }

    /// Write `bytes` at `key`, replacing what is there.
    pub async fn put(&self, key: &Path, bytes: Vec<u8>) -> Result<()> {
        match self {
            Backend::Objects(store) => {
                store.put(key, PutPayload::from(bytes)).await?;
                Ok(())
            }
            Backend::Dir(d) => d.write(key, &bytes, false).map(|_| ()),
        }
    }

    /// Write `bytes` at `key` unless something is there: `false` if it was.
    pub async fn put_new(&self, key: &Path, bytes: Vec<u8>) -> Result<bool> {
        match self {
            Backend::Objects(store) => {
                let opts = PutOptions::from(PutMode::Create);
                match store.put_opts(key, PutPayload::from(bytes), opts).await {
                    Ok(_) => Ok(true),
                    Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Backend::Dir(d) => d.write(key, &bytes, true),
        }
    }

    /// Every object under `prefix` (in no particular order: S3 Express
    /// One Zone lists unsorted).
    pub async fn list(&self, prefix: &Path) -> Result<Vec<Listed>> {
        match self {
            Backend::Objects(store) => Ok(store
                .list(Some(prefix))
                .map_ok(|o| Listed {
                    key: o.location,
                    size: o.size,
                })
                .try_collect()
                .await?),
            Backend::Dir(d) => d.list(prefix),
        }
    }

    /// Delete `keys`; missing ones are not an error. An object store is
    /// asked in batches (S3: one DeleteObjects request per 1,000 keys).
    pub async fn delete(&self, keys: Vec<Path>) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        match self {
            Backend::Objects(store) => {
                let stream = futures::stream::iter(keys.into_iter().map(Ok)).boxed();
                let mut deleted = store.delete_stream(stream);
                while let Some(done) = deleted.next().await {
                    match done {
                        Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(())
            }
            Backend::Dir(d) => {
                for key in keys {
                    let path = d.path(&key);
                    match std::fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io_err("deleting", &path, e)),
                    }
                }
                Ok(())
            }
        }
    }

    /// When the object at `key` was last written, Unix ms.
    pub async fn modified_ms(&self, key: &Path) -> Option<i64> {
        match self {
            Backend::Objects(store) => {
                let meta = store.head(key).await.ok()?;
                Some(meta.last_modified.timestamp_millis())
            }
            Backend::Dir(d) => {
                let modified = std::fs::metadata(d.path(key)).ok()?.modified().ok()?;
                let since = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
                Some(since.as_millis() as i64)
            }
        }
    }
}

impl LocalDir {
    fn path(&self, key: &Path) -> PathBuf {
        let mut p = self.dir.clone();
        for part in key.parts() {
            p.push(part.as_ref());
        }
        p
    }

    /// Stage `bytes`, then move them to `key`: renamed over what is there,
    /// or (`new`) linked only if nothing is.
    fn write(&self, key: &Path, bytes: &[u8], new: bool) -> Result<bool> {
        let target = self.path(key);
        let staging = self.dir.join(STAGING);
        let staged = staging.join(format!(
            "{}-{}",
            std::process::id(),
            STAGED.fetch_add(1, Ordering::Relaxed)
        ));
        if let Err(e) = std::fs::write(&staged, bytes) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(io_err("writing", &staged, e));
            }
            std::fs::create_dir_all(&staging).map_err(|e| io_err("creating", &staging, e))?;
            std::fs::write(&staged, bytes).map_err(|e| io_err("writing", &staged, e))?;
        }
        let place = |staged: &std::path::Path| {
            if new {
                // A hard link fails if the target exists: create-if-absent.
                std::fs::hard_link(staged, &target)
            } else {
                std::fs::rename(staged, &target)
            }
        };
        let mut placed = place(&staged);
        if matches!(&placed, Err(e) if e.kind() == std::io::ErrorKind::NotFound)
            && let Some(parent) = target.parent()
        {
            std::fs::create_dir_all(parent).map_err(|e| io_err("creating", parent, e))?;
            placed = place(&staged);
        }
        let created = match placed {
            Ok(()) => true,
            Err(e) if new && e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => {
                let _ = std::fs::remove_file(&staged);
                return Err(io_err("writing", &target, e));
            }
        };
        if new {
            let _ = std::fs::remove_file(&staged);
        }
        Ok(created)
    }

    fn list(&self, prefix: &Path) -> Result<Vec<Listed>> {
        let mut out = vec![];
        let mut dirs = vec![(self.path(prefix), prefix.clone())];
        while let Some((dir, key)) = dirs.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("listing", &dir, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_err("listing", &dir, e))?;
                let Some(name) = entry.file_name().to_str().map(String::from) else {
                    continue;
                };
                let meta = entry.metadata().map_err(|e| io_err("listing", &dir, e))?;
                let child = key.clone().join(name.as_str());
                if meta.is_dir() {
                    dirs.push((entry.path(), child));
                } else {
                    out.push(Listed {
                        key: child,
                        size: meta.len(),
                    });
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_directory_behaves_as_an_object_store() {
        let dir = std::env::temp_dir().join(format!("skein-cp-io-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let b = Backend::dir(dir.clone());
        let key = Path::from("a/b/c.bin");
        assert_eq!(b.get(&key).await.unwrap(), None);
        b.put(&key, vec![1, 2]).await.unwrap();
        b.put(&key, vec![3]).await.unwrap();
        assert_eq!(b.get(&key).await.unwrap(), Some(vec![3]));
        assert!(!b.put_new(&key, vec![4]).await.unwrap(), "taken");
        assert!(b.put_new(&Path::from("a/d.bin"), vec![5]).await.unwrap());
        let mut listed: Vec<String> = b
            .list(&Path::from("a"))
            .await
            .unwrap()
            .into_iter()
            .map(|l| format!("{}:{}", l.key, l.size))
            .collect();
        listed.sort();
        assert_eq!(listed, ["a/b/c.bin:1", "a/d.bin:1"]);
        assert!(b.modified_ms(&key).await.is_some());
        b.delete(vec![key.clone(), Path::from("a/none")])
            .await
            .unwrap();
        assert_eq!(b.get(&key).await.unwrap(), None);
        assert!(
            std::fs::read_dir(dir.join(STAGING))
                .unwrap()
                .next()
                .is_none(),
            "no staging file is left behind"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
