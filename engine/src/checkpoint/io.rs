//! Where a checkpoint store's objects live: any object store (S3, S3
//! Express One Zone, memory), or a local directory, whose objects are
//! records in segment files (`segments.rs`).

use std::path::PathBuf;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::segments::SegmentDir;
use crate::error::Result;

/// Where the objects are.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// An object store.
    Objects(Arc<dyn ObjectStore>),
    /// A local directory.
    Dir(Arc<SegmentDir>),
}

/// An object a listing found.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub key: Path,
    pub size: u64,
}

impl Backend {
    pub fn dir(dir: PathBuf) -> Self {
        Backend::Dir(Arc::new(SegmentDir::new(dir)))
    }

    /// The layout a store on this backend is written in.
    pub fn layout(&self) -> u32 {
        match self {
            Backend::Objects(_) => super::LAYOUT,
            Backend::Dir(_) => super::DIR_LAYOUT,
        }
    }

    /// The object at `key`, if there is one.
    pub async fn get(&self, key: &Path) -> Result<Option<Vec<u8>>> {
        match self {
            Backend::Objects(store) => match store.get(key).await {
                Ok(r) => Ok(Some(r.bytes().await?.to_vec())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            },
            Backend::Dir(d) => d.get(key),
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
            Backend::Dir(d) => d.delete(keys),
        }
    }

    /// When the object at `key` was last written, Unix ms.
    pub async fn modified_ms(&self, key: &Path) -> Option<i64> {
        match self {
            Backend::Objects(store) => {
                let meta = store.head(key).await.ok()?;
                Some(meta.last_modified.timestamp_millis())
            }
            Backend::Dir(d) => d.modified_ms(key),
        }
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
        let _ = std::fs::remove_dir_all(&dir);
    }
}
