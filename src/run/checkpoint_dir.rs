//! Where `skein run` keeps a query's durable state: a local directory,
//! opened as an object store, held by one process at a time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use skein_engine::catalog::Catalog;
use skein_engine::checkpoint::{CheckpointStore, Description, Manifest};
use skein_engine::context::CheckpointSpec;
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{PlanOptions, QueryPlan};

/// Where checkpoints go unless `--checkpoint-dir` says: one directory per
/// query under the working directory.
pub const DEFAULT_ROOT: &str = ".skein/checkpoints";

/// The environment variable that moves [`DEFAULT_ROOT`] (`skein ui
/// --checkpoint-root` reads it too, and sets it for the queries it starts).
pub use skein_engine::running::ROOT_ENV;

/// Where local queries keep their checkpoint directories, and where those
/// without one say they run: `$SKEIN_CHECKPOINT_ROOT`, else [`DEFAULT_ROOT`].
pub fn root() -> PathBuf {
    std::env::var_os(ROOT_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_ROOT), PathBuf::from)
}

pub use skein_engine::query::{CheckpointLocation as Location, CheckpointRequest as Request};

/// A checkpoint directory this process holds; the lock goes with it.
pub struct Held {
    pub store: Arc<CheckpointStore>,
    pub dir: PathBuf,
    lock: PathBuf,
}

impl Held {
    /// Make `runtime` checkpoint here and plan with `options` in the
    /// store's run lineage, committing every `interval` epochs.
    pub fn attach(&self, runtime: &LocalRuntime, options: &mut PlanOptions, interval: u64) {
        options.run = self.store.manifest().run.clone();
        options.checkpoint = Some(CheckpointSpec { interval });
        runtime.set_checkpoints(Some(self.store.clone()));
        tracing::info!(dir = %self.dir.display(), "checkpointing");
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.lock);
    }
}

/// Say on stderr, before the query runs, when a query that does not
/// checkpoint is not exactly once across restarts.
pub fn note_if_at_least_once(catalog: &Catalog, plan: &QueryPlan, request: &Request) {
    if let Some(reason) = skein_engine::query::at_least_once_reason(catalog, plan, request) {
        eprintln!("note: at least once across restarts, not exactly once: {reason}");
    }
}

/// The instances each source table of `plan` reads with.
fn source_instances(plan: &QueryPlan) -> BTreeMap<String, usize> {
    plan.stages
        .iter()
        .flat_map(|s| &s.sources)
        .map(|leaf| (leaf.table.clone(), leaf.parallelism))
        .collect()
}

/// Make `catalog` plan `sql` with the source instances its checkpoint was
/// written with, if it has one where `request` would look: its offsets
/// log is kept per instance, so a topic that gained partitions, or a
/// machine with more cores, must not change them under a resumed query.
pub fn pin_sources(catalog: &mut Catalog, sql: &str, request: &Request) -> Result<()> {
    if request.off {
        return Ok(());
    }
    let dir = match &request.dir {
        Some(dir) => dir.clone(),
        None => root().join(skein_engine::planner::query_code(sql)),
    };
    let path = dir.join("manifest.json");
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let manifest: Manifest = serde_json::from_slice(&bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    // A store of this layout records them when it is opened.
    if let Some(pins) = manifest.described.and_then(|d| d.sources) {
        catalog.pin_sources(pins);
    }
    Ok(())
}

/// Open the query's checkpoint directory if it checkpoints (see
/// [`location`]). `None`: it does not checkpoint.
pub async fn open(
    catalog: &Catalog,
    plan: &QueryPlan,
    request: &Request,
    name: Option<String>,
    name_given: bool,
) -> Result<Option<Held>> {
    let dir = match skein_engine::query::checkpoint_location(catalog, plan, request)? {
        Some(Location::Given(dir)) => dir,
        Some(Location::Default) => root().join(&plan.query_code),
        None => return Ok(None),
    };
    if let (Some(name), Some(root)) = (&name, dir.parent()) {
        refuse_a_taken_name(root, name, &plan.query_code)?;
        refuse_a_running_name(root, name, &plan.query_code, name_given)?;
    }
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating the checkpoint directory {}", dir.display()))?;
    let lock = take_lock(&dir)?;
    let opened = async {
        let mut store = CheckpointStore::open_dir(dir.clone(), &plan.query_code).await?;
        // `skein ui` plans the query from its store.
        store
            .describe(Description {
                sql: plan.sql.clone(),
                group_size: plan.group_size,
                sources: Some(source_instances(plan)),
                name,
            })
            .await?;
        Ok::<_, skein_engine::EngineError>(store)
    };
    let store = opened.await.map_err(|e| {
        let _ = std::fs::remove_file(&lock);
        anyhow::Error::msg(e.to_string())
    })?;
    Ok(Some(Held {
        store: Arc::new(store),
        dir,
        lock,
    }))
}

/// A throw-away checkpoint store in `dir` (benchmarks and `skein cost`):
/// `runtime` checkpoints there every `interval` epochs, in the store's lineage.
pub async fn scratch(
    dir: &Path,
    plan: &QueryPlan,
    runtime: &LocalRuntime,
    options: &mut PlanOptions,
    interval: u64,
) -> Result<Arc<CheckpointStore>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the scratch directory {}", dir.display()))?;
    let cs = CheckpointStore::open_dir(dir.to_path_buf(), &plan.query_code)
        .await
        .context("opening the scratch checkpoint store")?;
    options.run = cs.manifest().run.clone();
    options.checkpoint = Some(CheckpointSpec { interval });
    let cs = Arc::new(cs);
    runtime.set_checkpoints(Some(cs.clone()));
    Ok(cs)
}

/// Remove a checkpoint directory (a query starting afresh); refused while
/// a live process holds it. Returns whether there was one.
pub fn remove(dir: &Path) -> Result<bool> {
    if !dir.exists() {
        return Ok(false);
    }
    let lock = take_lock(dir)?;
    std::fs::remove_dir_all(dir)
        .with_context(|| format!("removing the checkpoint directory {}", dir.display()))?;
    drop(lock);
    Ok(true)
}

/// Say, under [`root`], that `plan` runs in this process without a
/// checkpoint store, so `skein ui` lists it. A `name` given (`--name`, a
/// `-- name:` line) that another running query holds is refused; one taken
/// from the file's stem is only warned about, as two files of one stem in
/// different directories are common. The registration ends when the value
/// is dropped.
pub fn register_running(
    plan: &QueryPlan,
    name: Option<String>,
    name_given: bool,
) -> Result<skein_engine::running::Registration> {
    let root = root();
    if let Some(name) = &name {
        refuse_a_running_name(&root, name, &plan.query_code, name_given)?;
        if name_given {
            refuse_a_taken_name(&root, name, &plan.query_code)?;
        }
    }
    let query = skein_engine::running::RunningQuery {
        query_code: plan.query_code.clone(),
        name,
        sql: plan.sql.clone(),
        group_size: plan.group_size,
        pid: std::process::id(),
        started_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
    };
    skein_engine::running::register(&root, &query)
        .with_context(|| format!("saying under {} that the query runs", root.display()))
}

/// A query without a checkpoint store under `root` that runs under `name`
/// with another code: refused when the name was given, noted when it is a
/// file's stem (two files of one stem in different directories are common).
fn refuse_a_running_name(root: &Path, name: &str, code: &str, name_given: bool) -> Result<()> {
    let taken = skein_engine::running::list(root)
        .into_iter()
        .find(|q| q.name.as_deref() == Some(name) && q.query_code != code);
    if let Some(other) = taken {
        let what = format!(
            "a running query is already named {name:?} (query {}, process {}, without a \
             checkpoint store)",
            other.query_code, other.pid
        );
        if name_given {
            bail!("{what}: give this one another --name");
        }
        eprintln!("note: {what}; --name gives this one a name of its own");
    }
    Ok(())
}

/// One process per checkpoint directory: a second would interleave its
/// epochs with the first's. A lock left by a killed process is taken over.
/// A name is one running query's: another query (another code) whose
/// directory under `root` is held by a live process and records `name`
/// refuses it.
fn refuse_a_taken_name(root: &Path, name: &str, code: &str) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Ok(());
    };
    for dir in entries.flatten().map(|e| e.path()) {
        let Some(holder) = live_holder(&dir) else {
            continue;
        };
        let Ok(bytes) = std::fs::read(dir.join("manifest.json")) else {
            continue;
        };
        let Ok(manifest) = serde_json::from_slice::<Manifest>(&bytes) else {
            continue;
        };
        let taken = manifest.described.and_then(|d| d.name);
        if taken.as_deref() == Some(name) && manifest.query_code != code {
            bail!(
                "a running query is already named {name:?} (query {}, process {holder}, {}): \
                 give this one another --name",
                manifest.query_code,
                dir.display()
            );
        }
    }
    Ok(())
}

/// The live process holding `dir`'s lock, if any.
fn live_holder(dir: &Path) -> Option<u32> {
    let holder = std::fs::read_to_string(dir.join("lock")).ok()?;
    let pid = holder.trim().parse::<u32>().ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

fn take_lock(dir: &Path) -> Result<PathBuf> {
    let lock = dir.join("lock");
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
        {
            Ok(mut f) => {
                use std::io::Write;
                write!(f, "{}", std::process::id())?;
                return Ok(lock);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = std::fs::read_to_string(&lock).unwrap_or_default();
                let alive = holder
                    .trim()
                    .parse::<u32>()
                    .is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
                if alive {
                    bail!(
                        "the checkpoint directory {} is in use by process {} (another run of \
                         this query); stop it first or give another --checkpoint-dir",
                        dir.display(),
                        holder.trim()
                    );
                }
                let _ = std::fs::remove_file(&lock);
            }
            Err(e) => {
                return Err(e).with_context(|| format!("locking {}", lock.display()));
            }
        }
    }
    bail!("could not lock {}", lock.display())
}
