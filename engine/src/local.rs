//! The in-process runtime, Skein's embedded default: every function is a
//! named slot in this process, an invocation is a tokio task, and reserved
//! concurrency is a semaphore. Invocations carry the same encoded bytes as
//! on Lambda, so what is measured here is what Lambda would carry.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{RwLock, Semaphore};

use crate::catalog::Catalog;
use crate::checkpoint::CheckpointStore;
use crate::context::{CONTEXT_ENV, CloudContext};
use crate::error::{EngineError, Result};
use crate::function::{FunctionEnv, LateCounts, StageFunction};
use crate::invoke::{FunctionService, FunctionSpec, InvocationType, Invoker};
use crate::request::Request;

/// Counters of one runtime.
#[derive(Debug, Default)]
pub struct RuntimeStats {
    /// Invocations made.
    pub invocations: AtomicU64,
    /// Bytes of payloads sent.
    pub payload_bytes: AtomicU64,
    /// Function instances built (cold starts).
    pub cold_starts: AtomicU64,
    /// Asynchronous invocations that failed after their retries.
    pub failed_async: AtomicU64,
    /// Each invocation's handler time rounded up to the millisecond, summed:
    /// what Lambda would bill as duration (waits on synchronous callees included).
    pub billed_ms: AtomicU64,
    /// Data payloads the `duplicate` fault delivered a second time.
    pub duplicates_injected: AtomicU64,
    /// Deliveries a function answered `duplicate`: it had taken the
    /// payload already and dropped this copy.
    pub duplicates_dropped: AtomicU64,
}

struct LocalFunction {
    spec: FunctionSpec,
    /// The warm instance, if any; recycling it empties the slot.
    instance: Arc<tokio::sync::Mutex<Option<Arc<StageFunction>>>>,
    permits: Arc<Semaphore>,
}

/// Async invocations that failed every attempt: the dead-letter list.
#[derive(Debug, Clone)]
pub struct FailedInvocation {
    /// The function invoked.
    pub function: String,
    /// Its error.
    pub error: String,
}

/// Delivery faults to inject, for testing what the arena promises: Lambda
/// delivers async invocations at least once and in no particular order.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Deliver every data payload twice.
    pub duplicate: bool,
    /// Delay each async delivery by a random 0..max ms, shuffling arrival order.
    pub max_delay_ms: u64,
    /// Silently lose the n-th data payload (counting from 0).
    pub drop_payload: Option<u64>,
    /// After each committed epoch, drop each warm instance with this
    /// probability, as Lambda recycles instances: the next invocation
    /// starts cold and must take its state from the checkpoint.
    pub recycle_probability: f64,
}

/// Runs a query's functions in-process, invoking them as Lambda would, for
/// local runs and tests.
pub struct LocalRuntime {
    me: Weak<LocalRuntime>,
    faults: std::sync::Mutex<Faults>,
    data_payloads: AtomicU64,
    functions: RwLock<HashMap<String, Arc<LocalFunction>>>,
    catalog: Catalog,
    store: Arc<dyn object_store::ObjectStore>,
    stats: RuntimeStats,
    /// Own work (handler time less waits on synchronous callees) per
    /// function name, for `--autoscale` to see each group's work.
    busy_by_function: std::sync::Mutex<HashMap<String, u64>>,
    late: Arc<LateCounts>,
    in_flight: AtomicU64,
    idle: tokio::sync::Notify,
    dead_letters: std::sync::Mutex<Vec<FailedInvocation>>,
    /// Where functions keep durable state, when the query checkpoints.
    checkpoints: std::sync::Mutex<Option<Arc<CheckpointStore>>>,
    /// Whether a busy function queues callers (true) or throttles them like
    /// Lambda does (false); callers retry throttles with backoff.
    queue_when_busy: bool,
    /// What the run's bound means for its sink writes.
    bound: crate::sink_health::RunBound,
}

impl LocalRuntime {
    /// A runtime over `store`, with the table kinds of `catalog`.
    pub fn new(catalog: Catalog, store: Arc<dyn object_store::ObjectStore>) -> Arc<Self> {
        Self::build(catalog, store, true)
    }

    /// The table kinds its functions are built with.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn build(
        catalog: Catalog,
        store: Arc<dyn object_store::ObjectStore>,
        queue_when_busy: bool,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| LocalRuntime {
            me: me.clone(),
            faults: Default::default(),
            data_payloads: AtomicU64::new(0),
            functions: RwLock::new(HashMap::new()),
            catalog,
            store,
            stats: RuntimeStats::default(),
            busy_by_function: Default::default(),
            late: Arc::default(),
            in_flight: AtomicU64::new(0),
            idle: tokio::sync::Notify::new(),
            dead_letters: std::sync::Mutex::new(vec![]),
            checkpoints: Default::default(),
            queue_when_busy,
            bound: Default::default(),
        })
    }

    /// The own work of the function `name` so far, in ms: its handler
    /// time less what it waited on synchronous callees.
    pub fn busy_ms_of(&self, name: &str) -> u64 {
        self.busy_by_function
            .lock()
            .expect("busy by function")
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    /// Functions started from now on keep their state in `store`.
    pub fn set_checkpoints(&self, store: Option<Arc<CheckpointStore>>) {
        *self.checkpoints.lock().expect("checkpoints") = store;
    }

    /// What the run going on bounds its sink writes by (see
    /// [`crate::sink_health`]).
    pub fn set_bound(&self, bound: crate::sink_health::BoundNow) {
        self.bound.set(bound);
    }

    /// The checkpoint store, when the run keeps checkpoints.
    pub fn checkpoints(&self) -> Option<Arc<CheckpointStore>> {
        self.checkpoints.lock().expect("checkpoints").clone()
    }

    /// Drop warm instances as [`Faults::recycle_probability`] says; returns
    /// how many were dropped. The driver calls it between epochs.
    pub async fn recycle_some(&self) -> usize {
        let p = self.faults.lock().expect("faults").recycle_probability;
        if p <= 0.0 {
            return 0;
        }
        let functions: Vec<Arc<LocalFunction>> =
            self.functions.read().await.values().cloned().collect();
        let mut dropped = 0;
        for f in functions {
            if rand::random::<f64>() < p && f.instance.lock().await.take().is_some() {
                dropped += 1;
            }
        }
        dropped
    }

    /// Inject delivery faults from now on.
    pub fn set_faults(&self, faults: Faults) {
        *self.faults.lock().expect("faults") = faults;
    }

    /// What the runtime counted.
    pub fn stats(&self) -> &RuntimeStats {
        &self.stats
    }

    /// Late rows the functions of this runtime set aside, per table.
    pub fn late_rows(&self) -> BTreeMap<String, u64> {
        self.late.by_table()
    }

    /// The object store contexts and checkpoints go to.
    pub fn store(&self) -> Arc<dyn object_store::ObjectStore> {
        self.store.clone()
    }

    /// Asynchronous invocations that failed for good.
    pub fn dead_letters(&self) -> Vec<FailedInvocation> {
        self.dead_letters.lock().expect("dead letters").clone()
    }

    fn env(&self) -> FunctionEnv {
        let me = self
            .me
            .upgrade()
            .expect("runtime is alive while it runs functions");
        FunctionEnv {
            catalog: self.catalog.clone(),
            store: Some(self.store.clone()),
            invoker: me,
            max_backoff: Duration::from_millis(500),
            late: self.late.clone(),
            checkpoints: self.checkpoints(),
            bound: self.bound.clone(),
        }
    }

    async fn function(&self, name: &str) -> Result<Arc<LocalFunction>> {
        self.functions
            .read()
            .await
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::UnknownFunction(name.to_string()))
    }

    /// The instance of a function, built on first use (a cold start).
    async fn instance(&self, f: &LocalFunction) -> Result<Arc<StageFunction>> {
        let mut slot = f.instance.lock().await;
        if let Some(i) = slot.as_ref() {
            return Ok(i.clone());
        }
        self.stats.cold_starts.fetch_add(1, Ordering::Relaxed);
        let value = f.spec.environment.get(CONTEXT_ENV).ok_or_else(|| {
            EngineError::Context(format!(
                "{} has no {CONTEXT_ENV} in its environment",
                f.spec.name
            ))
        })?;
        let ctx = CloudContext::from_env(value, Some(&self.store)).await?;
        let instance = Arc::new(StageFunction::new(ctx, self.env())?);
        *slot = Some(instance.clone());
        Ok(instance)
    }

    async fn run(&self, f: &Arc<LocalFunction>, payload: &[u8]) -> Result<Vec<u8>> {
        let _permit = if self.queue_when_busy {
            f.permits
                .clone()
                .acquire_owned()
                .await
                .expect("semaphore open")
        } else {
            f.permits
                .clone()
                .try_acquire_owned()
                .map_err(|_| EngineError::Throttled {
                    name: f.spec.name.clone(),
                    limit: f.spec.concurrency,
                })?
        };
        let instance = self.instance(f).await?;
        let started = std::time::Instant::now();
        // Parsed once, as the Lambda bootstrap does.
        let request = Request::from_json(payload)?;
        let response = instance.serve(request).await;
        let billed = started.elapsed().as_micros().div_ceil(1000) as u64;
        self.stats.billed_ms.fetch_add(billed, Ordering::Relaxed);
        let response = response?;
        // Its own work, without its synchronous callees' (see `Usage`).
        let stage = instance.context().stage;
        if let Some(&busy) = response.usage.busy_ms_by_stage.get(&stage) {
            let mut by_function = self.busy_by_function.lock().expect("busy by function");
            // The name is copied once per function, not per invocation.
            match by_function.get_mut(&f.spec.name) {
                Some(ms) => *ms += busy,
                None => {
                    by_function.insert(f.spec.name.clone(), busy);
                }
            }
        }
        if response.status == "duplicate" {
            self.stats
                .duplicates_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(serde_json::to_vec(&response).expect("response serialises"))
    }

    fn record_failure(&self, function: &str, e: EngineError) {
        self.stats.failed_async.fetch_add(1, Ordering::Relaxed);
        self.dead_letters
            .lock()
            .expect("dead letters")
            .push(FailedInvocation {
                function: function.to_string(),
                error: e.to_string(),
            });
    }

    fn finish_one(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// What every instance still waits for.
    pub async fn pending(&self) -> Vec<String> {
        let functions: Vec<Arc<LocalFunction>> =
            self.functions.read().await.values().cloned().collect();
        let mut out = vec![];
        for f in functions {
            let instance = f.instance.lock().await.clone();
            if let Some(i) = instance {
                out.extend(i.pending().await);
            }
        }
        out.sort();
        out
    }

    /// Bytes every instance holds across epochs, summed (the
    /// `skein_state_bytes` gauges of docs/metrics.md). Without waiting:
    /// an instance busy at that moment is left out.
    pub fn state_bytes(&self) -> u64 {
        let Ok(functions) = self.functions.try_read() else {
            return 0;
        };
        functions
            .values()
            .filter_map(|f| f.instance.try_lock().ok()?.clone())
            .filter_map(|i| i.state_bytes())
            .map(|b| b as u64)
            .sum()
    }

    /// Wait until no asynchronous invocation is queued or running.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

#[async_trait]
impl Invoker for LocalRuntime {
    async fn invoke(
        &self,
        function: &str,
        payload: Vec<u8>,
        kind: InvocationType,
    ) -> Result<Vec<u8>> {
        let f = self.function(function).await?;
        self.stats.invocations.fetch_add(1, Ordering::Relaxed);
        self.stats
            .payload_bytes
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        let faults = self.faults.lock().expect("faults").clone();
        let is_data = payload.starts_with(b"{\"uuid\"");
        if is_data {
            let n = self.data_payloads.fetch_add(1, Ordering::SeqCst);
            if faults.drop_payload == Some(n) {
                tracing::warn!(function, n, "fault injection: payload lost");
                return Ok(vec![]);
            }
        }
        let deliveries = if is_data && faults.duplicate { 2 } else { 1 };
        if deliveries == 2 {
            self.stats
                .duplicates_injected
                .fetch_add(1, Ordering::Relaxed);
        }
        if deliveries == 2 && kind == InvocationType::Sync {
            let first = self.run(&f, &payload).await?;
            self.run(&f, &payload).await?;
            return Ok(first);
        }
        match kind {
            InvocationType::Sync => self.run(&f, &payload).await,
            InvocationType::Async if deliveries == 2 || faults.max_delay_ms > 0 => {
                for _ in 0..deliveries {
                    let me = self.me.upgrade().expect("runtime alive");
                    let (f, payload) = (f.clone(), payload.clone());
                    let delay = rand::random_range(0..=faults.max_delay_ms);
                    self.in_flight.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        if let Err(e) = me.run(&f, &payload).await {
                            me.record_failure(&f.spec.name, e);
                        }
                        me.finish_one();
                    });
                }
                Ok(vec![])
            }
            InvocationType::Async => {
                let me = self.me.upgrade().expect("runtime alive");
                self.in_flight.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    // Like Lambda's async queue: two retries, then the dead-letter list.
                    let mut last_err = None;
                    for attempt in 0..3u64 {
                        let result = if me.queue_when_busy {
                            me.run(&f, &payload).await
                        } else {
                            crate::invoke::invoke_with_retry(
                                &Throttling(&me, &f),
                                &f.spec.name,
                                payload.clone(),
                                InvocationType::Sync,
                                Duration::from_millis(500),
                                100,
                            )
                            .await
                        };
                        match result {
                            Ok(_) => {
                                last_err = None;
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(function = %f.spec.name, attempt, error = %e, "async invocation failed");
                                last_err = Some(e);
                                tokio::time::sleep(Duration::from_millis(20 * (attempt + 1))).await;
                            }
                        }
                    }
                    if let Some(e) = last_err {
                        me.record_failure(&f.spec.name, e);
                    }
                    me.finish_one();
                });
                Ok(vec![])
            }
        }
    }
}

/// Adapter so queued async retries go through the same throttle path.
struct Throttling<'a>(&'a Arc<LocalRuntime>, &'a Arc<LocalFunction>);

#[async_trait]
impl Invoker for Throttling<'_> {
    async fn invoke(
        &self,
        _function: &str,
        payload: Vec<u8>,
        _kind: InvocationType,
    ) -> Result<Vec<u8>> {
        self.0.run(self.1, &payload).await
    }
}

#[async_trait]
impl FunctionService for LocalRuntime {
    async fn create(&self, spec: FunctionSpec) -> Result<()> {
        let mut functions = self.functions.write().await;
        // Same environment: keep the warm instance, as Lambda keeps its code.
        if let Some(existing) = functions.get(&spec.name)
            && existing.spec == spec
        {
            return Ok(());
        }
        let permits = Arc::new(Semaphore::new(spec.concurrency.max(1)));
        functions.insert(
            spec.name.clone(),
            Arc::new(LocalFunction {
                spec,
                instance: Default::default(),
                permits,
            }),
        );
        Ok(())
    }

    async fn set_concurrency(&self, name: &str, concurrency: usize) -> Result<()> {
        let mut functions = self.functions.write().await;
        let f = functions
            .get(name)
            .ok_or_else(|| EngineError::UnknownFunction(name.into()))?;
        let mut spec = f.spec.clone();
        spec.concurrency = concurrency;
        let permits = Arc::new(Semaphore::new(concurrency.max(1)));
        let instance = f.instance.clone();
        functions.insert(
            name.into(),
            Arc::new(LocalFunction {
                spec,
                instance,
                permits,
            }),
        );
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .functions
            .read()
            .await
            .keys()
            .filter(|n| n.starts_with(prefix))
            .cloned()
            .collect();
        names.sort();
        Ok(names)
    }

    async fn delete(&self, name: &str) -> Result<()> {
        self.functions.write().await.remove(name);
        Ok(())
    }
}

/// Environment of a function: just its context.
pub fn environment(context_value: String) -> BTreeMap<String, String> {
    BTreeMap::from([(CONTEXT_ENV.to_string(), context_value)])
}
