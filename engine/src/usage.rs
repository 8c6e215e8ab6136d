//! What invocations cost, as the functions that served them measured it.
//! On Lambda the driver sees only the triggers it fires and the probes it
//! sends; the rest of an epoch runs in other processes. So each answer
//! carries a [`Usage`]: the function's own (added by its bootstrap) plus
//! that of every synchronous invocation it made, whose answers come back
//! to it. A trigger's answer thus covers the chain below it, and the
//! driver sums the answers it receives ([`MeteredInvoker`]).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::invoke::{InvocationType, Invoker};

/// CPU time this process has used, seconds (user + system, all threads).
pub fn process_cpu_s() -> f64 {
    // Fields 14 and 15 of /proc/self/stat, in clock ticks (100 per second
    // on Linux); the command name (field 2) may hold spaces, so count from
    // its closing parenthesis.
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // After ")", field 3 is at index 0: utime (14) is index 11, stime index 12.
    (ticks(11) + ticks(12)) / 100.0
}

/// Counts of one or more invocations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Usage {
    /// Invocations served (each answer counts its own and its callees').
    pub invocations: u64,
    /// Each invocation's handler time rounded up to 1 ms, summed.
    pub billed_ms: u64,
    /// CPU time of the serving processes, ms.
    pub cpu_ms: u64,
    /// Request bytes sent to the functions.
    pub payload_bytes: u64,
    /// Objects the functions wrote to the checkpoint store.
    pub checkpoint_puts: u64,
    /// Bytes of those objects.
    pub checkpoint_bytes: u64,
    /// Each invocation's own work by its stage: its handler time less
    /// what it spent waiting on synchronous callees (whose work is theirs),
    /// rounded up to 1 ms, summed. What sizes a group under `--autoscale`:
    /// a stage whose callees are slow is not itself short of members.
    /// Pairs in JSON, not an object: records that embed it flattened
    /// would not read numbers back from an object's keys.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", with = "stage_pairs")]
    pub busy_ms_by_stage: BTreeMap<u32, u64>,
}

/// A map by stage as a list of `[stage, value]` pairs.
mod stage_pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &BTreeMap<u32, u64>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(m.iter())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u32, u64>, D::Error> {
        Ok(Vec::<(u32, u64)>::deserialize(d)?.into_iter().collect())
    }
}

impl Usage {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Usage) {
        self.invocations += other.invocations;
        self.billed_ms += other.billed_ms;
        self.cpu_ms += other.cpu_ms;
        self.payload_bytes += other.payload_bytes;
        self.checkpoint_puts += other.checkpoint_puts;
        self.checkpoint_bytes += other.checkpoint_bytes;
        for (stage, ms) in &other.busy_ms_by_stage {
            *self.busy_ms_by_stage.entry(*stage).or_default() += ms;
        }
    }

    /// What was counted since `earlier` (of the same running totals).
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            invocations: self.invocations.saturating_sub(earlier.invocations),
            billed_ms: self.billed_ms.saturating_sub(earlier.billed_ms),
            cpu_ms: self.cpu_ms.saturating_sub(earlier.cpu_ms),
            payload_bytes: self.payload_bytes.saturating_sub(earlier.payload_bytes),
            checkpoint_puts: self.checkpoint_puts.saturating_sub(earlier.checkpoint_puts),
            checkpoint_bytes: self
                .checkpoint_bytes
                .saturating_sub(earlier.checkpoint_bytes),
            busy_ms_by_stage: self
                .busy_ms_by_stage
                .iter()
                .map(|(stage, ms)| {
                    let before = earlier.busy_ms_by_stage.get(stage).copied();
                    (*stage, ms.saturating_sub(before.unwrap_or(0)))
                })
                .collect(),
        }
    }

    /// Nothing counted: an answer without usage to report.
    pub fn is_zero(&self) -> bool {
        *self == Usage::default()
    }

    /// The usage an answer reports, if it reports one.
    pub fn of_answer(answer: &[u8]) -> Option<Usage> {
        #[derive(Deserialize)]
        struct Answer {
            usage: Option<Usage>,
        }
        serde_json::from_slice::<Answer>(answer).ok()?.usage
    }

    /// What one invocation made with `payload_bytes` and answered with
    /// `answer` cost: its report, else (an async invocation answers
    /// nothing) one request of unknown duration.
    fn of_call(payload_bytes: usize, answer: &[u8]) -> Usage {
        let mut u = Usage::of_answer(answer).unwrap_or(Usage {
            invocations: 1,
            ..Default::default()
        });
        u.payload_bytes += payload_bytes as u64;
        u
    }
}

/// What one invocation's callees cost, and how long it waited on them.
#[derive(Default)]
struct Callees {
    usage: Usage,
    /// Synchronous calls outstanding now, and since when one has been.
    outstanding: u32,
    since: Option<Instant>,
    /// Time with at least one synchronous call outstanding.
    waited: Duration,
}

tokio::task_local! {
    static CALLEES: RefCell<Callees>;
}

/// Run `f`, collecting the usage of the invocations [`count_callee`] is
/// told about inside it (the same task, joined futures included), and the
/// time it spent in [`waiting_on_callee`].
pub async fn collecting<F: Future>(f: F) -> (F::Output, Usage, Duration) {
    CALLEES
        .scope(RefCell::new(Callees::default()), async {
            let out = f.await;
            let c = CALLEES.with(|c| c.take());
            (out, c.usage, c.waited)
        })
        .await
}

/// A function invoked another with `payload_bytes` and got `answer` back.
/// Outside [`collecting`] it is not counted.
pub fn count_callee(payload_bytes: usize, answer: &[u8]) {
    let _ = CALLEES.try_with(|c| {
        c.borrow_mut()
            .usage
            .add(&Usage::of_call(payload_bytes, answer))
    });
}

/// Await `call`, a synchronous invocation of another function: inside
/// [`collecting`], the time it is outstanding counts as waiting (calls that
/// overlap count once), not as the caller's own work.
pub async fn waiting_on_callee<F: Future>(call: F) -> F::Output {
    struct Outstanding;
    impl Drop for Outstanding {
        // Also when the call is cancelled: the count must come down.
        fn drop(&mut self) {
            let _ = CALLEES.try_with(|c| {
                let mut c = c.borrow_mut();
                c.outstanding = c.outstanding.saturating_sub(1);
                if c.outstanding == 0
                    && let Some(since) = c.since.take()
                {
                    c.waited += since.elapsed();
                }
            });
        }
    }
    let _ = CALLEES.try_with(|c| {
        let mut c = c.borrow_mut();
        if c.outstanding == 0 {
            c.since = Some(Instant::now());
        }
        c.outstanding += 1;
    });
    let _outstanding = Outstanding;
    call.await
}

/// An [`Invoker`] that sums the usage every answer reports (an answer
/// without one counts as one request).
pub struct MeteredInvoker<'a> {
    inner: &'a dyn Invoker,
    total: Mutex<Usage>,
}

impl<'a> MeteredInvoker<'a> {
    /// Counts what goes through `inner`, starting from zero.
    pub fn new(inner: &'a dyn Invoker) -> Self {
        MeteredInvoker {
            inner,
            total: Mutex::new(Usage::default()),
        }
    }

    /// What the answers so far reported.
    pub fn total(&self) -> Usage {
        self.total.lock().expect("usage").clone()
    }
}

#[async_trait]
impl Invoker for MeteredInvoker<'_> {
    async fn invoke(
        &self,
        function: &str,
        payload: Vec<u8>,
        kind: InvocationType,
    ) -> Result<Vec<u8>> {
        let sent = payload.len();
        let answer = self.inner.invoke(function, payload, kind).await;
        let usage = match &answer {
            Ok(a) => Usage::of_call(sent, a),
            // Billed all the same; its duration is not known here.
            Err(_) => Usage::of_call(sent, b""),
        };
        self.total.lock().expect("usage").add(&usage);
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn callees_are_summed_within_their_scope_only() {
        count_callee(10, br#"{"usage":{"invocations":1}}"#);
        let ((), u, _) = collecting(async {
            let a = async { count_callee(5, br#"{"status":"ran","usage":{"invocations":2,"billed_ms":7,"cpu_ms":3,"payload_bytes":1,"checkpoint_puts":4}}"#) };
            let b = async { count_callee(3, b"") };
            futures::join!(a, b);
        })
        .await;
        let by_stage = Usage {
            busy_ms_by_stage: [(2, 5), (10, 7)].into(),
            ..Default::default()
        };
        let json = serde_json::to_string(&by_stage).unwrap();
        assert!(json.contains("[[2,5],[10,7]]"), "{json}");
        assert_eq!(serde_json::from_str::<Usage>(&json).unwrap(), by_stage);
        assert_eq!(
            u,
            Usage {
                invocations: 3,
                billed_ms: 7,
                cpu_ms: 3,
                payload_bytes: 9,
                checkpoint_puts: 4,
                checkpoint_bytes: 0,
                busy_ms_by_stage: BTreeMap::new(),
            }
        );
    }

    #[tokio::test]
    async fn waiting_on_callees_counts_overlapping_calls_once() {
        let sleep = |ms| waiting_on_callee(tokio::time::sleep(Duration::from_millis(ms)));
        let started = Instant::now();
        let ((), _, waited) = collecting(async {
            // Two calls at once, then one cut off by a faster branch.
            futures::join!(sleep(30), sleep(30));
            tokio::select! {
                _ = sleep(10_000) => {}
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            // A count left up by the cancelled call would keep timing.
            std::thread::sleep(Duration::from_millis(20));
        })
        .await;
        let elapsed = started.elapsed();
        assert!(waited >= Duration::from_millis(35), "{waited:?}");
        assert!(
            waited + Duration::from_millis(20) <= elapsed,
            "waited {waited:?} of {elapsed:?}: counted twice, or after the cancel"
        );
        // Outside a scope it is only a call.
        sleep(1).await;
    }
}
