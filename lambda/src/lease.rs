//! One standing driver at a time: a lease object in the query's checkpoint
//! store, taken and renewed with conditional puts (create-if-absent, or
//! replace-if-unchanged by its ETag). A driver that crashes stops renewing,
//! and its lease expires after its time to live; the next tick takes it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

/// The lease's object under a query's checkpoint root.
pub const LEASE_FILE: &str = "lease.json";

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("lease {key}: {source}")]
    Store {
        key: String,
        source: object_store::Error,
    },
    #[error("lease {key}: not a lease: {reason}")]
    Corrupt { key: String, reason: String },
}

/// What the lease object holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// Who holds (or last held) it: a driver's invocation id.
    pub holder: String,
    /// Unix milliseconds after which it is free unless renewed.
    pub expires_ms: u64,
    /// Given back by its holder at the end of a tick, everything committed.
    pub released: bool,
}

impl LeaseRecord {
    pub fn free_at(&self, now_ms: u64) -> bool {
        self.released || now_ms >= self.expires_ms
    }
}

/// Where a lease reads the time, in Unix milliseconds: the system clock,
/// or one a test moves by hand so that expiry does not wait on real time.
#[derive(Clone)]
pub struct LeaseClock(Arc<dyn Fn() -> u64 + Send + Sync>);

impl LeaseClock {
    /// The system clock ([`now_ms`]).
    pub fn system() -> Self {
        LeaseClock(Arc::new(now_ms))
    }

    /// A clock that answers `now`.
    pub fn new(now: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        LeaseClock(Arc::new(now))
    }

    fn now_ms(&self) -> u64 {
        (self.0)()
    }
}

impl std::fmt::Debug for LeaseClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseClock")
    }
}

/// A lease this driver holds.
#[derive(Debug)]
pub struct Lease {
    store: Arc<dyn ObjectStore>,
    key: Path,
    holder: String,
    ttl: Duration,
    clock: LeaseClock,
    version: UpdateVersion,
    /// The previous holder did not release it (it crashed or overran):
    /// the function instances may hold an epoch half run.
    pub taken_over: bool,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn store_err(key: &Path) -> impl Fn(object_store::Error) -> LeaseError + '_ {
    move |source| LeaseError::Store {
        key: key.to_string(),
        source,
    }
}

/// The lease as it stands, with its version, if there is one.
pub async fn read(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
) -> Result<Option<(LeaseRecord, UpdateVersion)>, LeaseError> {
    let got = match store.get(key).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(store_err(key)(e)),
    };
    let version = UpdateVersion {
        e_tag: got.meta.e_tag.clone(),
        version: got.meta.version.clone(),
    };
    let bytes = got.bytes().await.map_err(store_err(key))?;
    let record = serde_json::from_slice(&bytes).map_err(|e| LeaseError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })?;
    Ok(Some((record, version)))
}

/// Writes `record` if the object is still at `version` (absent: `None`);
/// the new version, or `None` when another writer got there first.
async fn put_if(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
    record: &LeaseRecord,
    version: Option<UpdateVersion>,
) -> Result<Option<UpdateVersion>, LeaseError> {
    let body = serde_json::to_vec(record).expect("a lease serializes");
    let mode = match version {
        Some(v) => PutMode::Update(v),
        None => PutMode::Create,
    };
    let opts = PutOptions {
        mode,
        ..Default::default()
    };
    match store.put_opts(key, PutPayload::from(body), opts).await {
        Ok(done) => Ok(Some(UpdateVersion {
            e_tag: done.e_tag,
            version: done.version,
        })),
        Err(object_store::Error::AlreadyExists { .. })
        | Err(object_store::Error::Precondition { .. })
        | Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(store_err(key)(e)),
    }
}

impl Lease {
    /// Take the lease at `key` for `ttl` unless someone else holds it; the
    /// holder it found when it could not.
    pub async fn acquire(
        store: Arc<dyn ObjectStore>,
        key: Path,
        holder: &str,
        ttl: Duration,
    ) -> Result<Result<Lease, LeaseRecord>, LeaseError> {
        Self::acquire_by(store, key, holder, ttl, LeaseClock::system()).await
    }

    /// [`Lease::acquire`] reading the time from `clock`, which the lease
    /// goes on using for its renewals.
    pub async fn acquire_by(
        store: Arc<dyn ObjectStore>,
        key: Path,
        holder: &str,
        ttl: Duration,
        clock: LeaseClock,
    ) -> Result<Result<Lease, LeaseRecord>, LeaseError> {
        let current = read(&store, &key).await?;
        let now = clock.now_ms();
        let (taken_over, previous) = match current {
            None => (false, None),
            Some((record, version)) => {
                if !record.free_at(now) {
                    return Ok(Err(record));
                }
                (!record.released, Some(version))
            }
        };
        let record = LeaseRecord {
            holder: holder.to_string(),
            expires_ms: now + ttl.as_millis() as u64,
            released: false,
        };
        match put_if(&store, &key, &record, previous).await? {
            Some(version) => Ok(Ok(Lease {
                store,
                key,
                holder: holder.to_string(),
                ttl,
                clock,
                version,
                taken_over,
            })),
            // Another driver took it between the read and the put.
            None => Ok(Err(read(&store, &key)
                .await?
                .map(|(r, _)| r)
                .unwrap_or(record))),
        }
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Push the expiry one time to live ahead; `false` when the lease was
    /// lost (it expired and another driver took it).
    pub async fn renew(&mut self) -> Result<bool, LeaseError> {
        self.write(false).await
    }

    /// Give the lease back: the next tick takes it without waiting.
    pub async fn release(mut self) -> Result<bool, LeaseError> {
        self.write(true).await
    }

    async fn write(&mut self, released: bool) -> Result<bool, LeaseError> {
        let record = LeaseRecord {
            holder: self.holder.clone(),
            expires_ms: self.clock.now_ms() + self.ttl.as_millis() as u64,
            released,
        };
        match put_if(&self.store, &self.key, &record, Some(self.version.clone())).await? {
            Some(version) => {
                self.version = version;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// A lease renewed in the background every third of its time to live.
pub struct KeptLease {
    done: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Option<Lease>>,
}

impl Lease {
    /// Keep renewing the lease until [`KeptLease::finish`]; `on_lost` runs
    /// once if a renewal fails (it expired and someone else took it).
    pub fn keep(mut self, on_lost: impl FnOnce() + Send + 'static) -> KeptLease {
        let (done, mut done_rx) = tokio::sync::watch::channel(false);
        let every = self.ttl / 3;
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    _ = done_rx.changed() => return Some(self),
                }
                if !matches!(self.renew().await, Ok(true)) {
                    on_lost();
                    return None;
                }
            }
        });
        KeptLease { done, task }
    }
}

impl KeptLease {
    /// Stop renewing: the lease, unless it was lost.
    pub async fn finish(self) -> Option<Lease> {
        let _ = self.done.send(true);
        self.task.await.ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn one_holder_at_a_time_until_released_or_expired() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let key = Path::from("q/lease.json");
        // Time moves only when the test says: a loaded machine cannot
        // expire a lease between two steps.
        let now = Arc::new(std::sync::atomic::AtomicU64::new(1_700_000_000_000));
        let clock = {
            let now = now.clone();
            LeaseClock::new(move || now.load(std::sync::atomic::Ordering::SeqCst))
        };
        let advance = |by: Duration| {
            now.fetch_add(by.as_millis() as u64, std::sync::atomic::Ordering::SeqCst);
        };
        let acquire = |holder: &'static str| {
            Lease::acquire_by(store.clone(), key.clone(), holder, TTL, clock.clone())
        };
        const TTL: Duration = Duration::from_secs(30);
        let mut a = acquire("a").await.unwrap().expect("a free lease is taken");
        assert!(!a.taken_over);
        advance(TTL - Duration::from_millis(1));
        let held = acquire("b").await.unwrap().expect_err("a holds it");
        assert_eq!(held.holder, "a");
        assert!(a.renew().await.unwrap());
        // The renewal pushed the expiry a whole TTL ahead of now.
        advance(TTL - Duration::from_millis(1));
        assert_eq!(
            acquire("b").await.unwrap().expect_err("renewed").holder,
            "a"
        );
        assert!(a.release().await.unwrap());
        let b = acquire("b").await.unwrap().expect("a released it");
        assert!(!b.taken_over, "a gave it back cleanly");
        // b crashes: it never renews nor releases. One millisecond short of
        // its expiry it still holds the lease; at the expiry it does not.
        advance(TTL - Duration::from_millis(1));
        assert_eq!(
            acquire("c").await.unwrap().expect_err("b holds it").holder,
            "b"
        );
        advance(Duration::from_millis(1));
        let mut c = acquire("c").await.unwrap().expect("b's lease expired");
        assert!(c.taken_over);
        // b's renewal after c took over fails: b must stop.
        let mut b = b;
        assert!(!b.renew().await.unwrap());
        assert!(c.renew().await.unwrap());
    }
}
