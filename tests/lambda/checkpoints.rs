//! Checkpoints on Lambda (ministack, the real `skein-function` as every
//! function's bootstrap): a windowed count and sum per key from a Kafka
//! topic into a Kafka sink at group size 2, with its durable state on S3.
//!
//! * The `bootstrap` process of each group member is SIGKILLed mid-run
//!   (found in the process list, as `pgrep -f bootstrap` shows it, by the
//!   function name in its environment); ministack starts a new one on the
//!   next invocation, which loads the last commit, or the driver replaces
//!   every instance and runs the failed epoch again. The sink then holds
//!   exactly the reference result computed here.
//! * With a commit every third epoch, a member killed between commits is
//!   replaced by an instance that loads an older state and waits for input
//!   the others already sent: the driver's probe sees it before the next
//!   commit, every instance is replaced, and the run ends exact.
//! * `skein run --backend lambda` itself is SIGKILLed mid-run; a second run
//!   resumes after the last commit and ends exact.
//!
//! `SKEIN_LAMBDA_CP_RECORDS` sets the number of records (default 20,000).

use crate::common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::windowed::{self, Reference, assert_exact};
use rand::Rng;
use serde_json::Value;
use skein::report::Report;

const PARTITIONS: usize = 2;
/// Event time the records span: ten 10 s windows.
const SPAN_MS: i64 = 100_000;
/// Records per partition and epoch: 20 epochs at the default size.
const PULL: usize = 500;

/// One test's query, its input and where it runs.
struct Setup {
    sql: PathBuf,
    out: String,
    reference: Reference,
    bucket: String,
    query_code: String,
    /// The functions of the stateful group stage.
    group: Vec<String>,
    group_size: usize,
}

impl Setup {
    fn new() -> Self {
        Self::with_group_size(2)
    }

    fn with_group_size(group_size: usize) -> Self {
        common::require_aws();
        let n = std::env::var("SKEIN_LAMBDA_CP_RECORDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let (records, reference) = windowed::records(n, PARTITIONS, SPAN_MS);
        let source = windowed::kafka_table(&records, PARTITIONS, PULL);
        let (out, sink) = windowed::kafka_sink();
        let sql = std::env::temp_dir().join(format!("{}.sql", common::unique_name("lambda-cp")));
        std::fs::write(&sql, windowed::query(&source, &sink)).expect("writing the query");
        let size = group_size.to_string();
        let explained = skein(&["explain", path(&sql), "--group-size", &size, "--json"]);
        let plan: Value = serde_json::from_str(&explained).expect("explain --json");
        let group: Vec<String> = plan["stages"]
            .as_array()
            .expect("stages")
            .iter()
            .filter(|s| s["kind"] == "group")
            .flat_map(|s| s["functions"].as_array().cloned().unwrap_or_default())
            .filter_map(|f| f.as_str().map(String::from))
            .collect();
        assert!(
            group.len() >= group_size,
            "no group of {group_size} in the plan: {plan}"
        );
        Setup {
            sql,
            out,
            reference,
            bucket: common::unique_name("skein-lambda-cp"),
            query_code: plan["query_code"].as_str().expect("query_code").into(),
            group,
            group_size,
        }
    }

    /// `skein run --backend lambda` of the query until the topic is drained.
    fn spawn(&self) -> Child {
        self.spawn_with(&[])
    }

    fn spawn_with(&self, extra: &[&str]) -> Child {
        let (id, secret) = common::aws_credentials();
        Command::new(env!("CARGO_BIN_EXE_skein"))
            .args(["run", path(&self.sql), "--backend", "lambda"])
            .args(["--group-size", &self.group_size.to_string()])
            .args(["--until-drained", "--interval", "10ms"])
            .arg("--json")
            .args(extra)
            .env("AWS_ENDPOINT_URL", common::aws_endpoint())
            .env("AWS_REGION", common::aws_region())
            .env("AWS_ACCESS_KEY_ID", id)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .env("SKEIN_STORE", format!("s3://{}", self.bucket))
            .env("SKEIN_FUNCTION_BINARY", common::function_binary())
            .env("RUST_LOG", "skein_engine::epochs=info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting skein")
    }

    /// An object of the query's checkpoint store on S3, as JSON.
    fn checkpoint_object(&self, runtime: &tokio::runtime::Runtime, key: &str) -> Option<Value> {
        let key = format!("skein/checkpoints/{}/{key}", self.query_code);
        runtime.block_on(async {
            let s3 = common::s3_client().await;
            let object = s3
                .get_object()
                .bucket(&self.bucket)
                .key(&key)
                .send()
                .await
                .ok()?;
            let bytes = object.body.collect().await.ok()?.into_bytes();
            serde_json::from_slice::<Value>(&bytes).ok()
        })
    }

    /// The group sizes rescales recorded, by the first epoch run in them.
    fn layouts(&self, runtime: &tokio::runtime::Runtime) -> Vec<(String, Value)> {
        let prefix = format!("skein/checkpoints/{}/layouts/", self.query_code);
        let keys: Vec<String> = runtime.block_on(async {
            let s3 = common::s3_client().await;
            // Before the run has made its bucket: nothing yet.
            let Ok(listed) = s3
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&prefix)
                .send()
                .await
            else {
                return vec![];
            };
            listed
                .contents()
                .iter()
                .filter_map(|o| o.key().map(String::from))
                .collect()
        });
        let mut out: Vec<(String, Value)> = keys
            .iter()
            .filter_map(|k| {
                let rel = k.strip_prefix(&format!("skein/checkpoints/{}/", self.query_code))?;
                Some((rel.to_string(), self.checkpoint_object(runtime, rel)?))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The last committed epoch.
    fn committed(&self, runtime: &tokio::runtime::Runtime) -> Option<u64> {
        self.checkpoint_object(runtime, "commit.json")?["epoch"].as_u64()
    }

    /// Waits until the driver has decided `epoch` (it does before firing it).
    fn wait_for_plan(&self, runtime: &tokio::runtime::Runtime, child: &mut Child, epoch: u64) {
        let key = format!("epochs/{epoch:020}.json");
        while_running(child, &format!("deciding epoch {epoch}"), || {
            self.checkpoint_object(runtime, &key).map(|_| ())
        })
    }

    /// Waits until a commit after `epoch`.
    fn wait_for_commit_after(
        &self,
        runtime: &tokio::runtime::Runtime,
        child: &mut Child,
        epoch: Option<u64>,
    ) -> u64 {
        while_running(child, &format!("a commit after {epoch:?}"), || {
            self.committed(runtime).filter(|c| Some(*c) > epoch)
        })
    }

    /// The run's report; fails the test unless it succeeded.
    fn finish(&self, child: Child) -> Report {
        let output = common::wait_with_timeout(child, Duration::from_secs(600));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "skein run failed:\n{stdout}\n{stderr}"
        );
        let line = stdout.lines().rev().find(|l| l.starts_with('{'));
        let report: Report = serde_json::from_str(line.expect("a JSON line")).expect("JSON");
        eprintln!("report: {report:?}\n{stderr}");
        report
    }

    fn assert_exact(&self, report: &Report) {
        assert_exact(
            &windowed::kafka_rows(&self.out),
            &self.reference,
            &format!("lambda to kafka read_committed {report:?}"),
        );
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.sql);
        // Leave no functions behind on ministack.
        let _ = common::skein_on_aws(None, &["destroy", &self.query_code]);
    }
}

/// Polls `ready` until it gives a value; fails the test if `child` ends
/// first or nothing comes within 300 s.
fn while_running<T>(child: &mut Child, what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = ready() {
            return value;
        }
        if let Some(status) = child.try_wait().expect("waiting for skein") {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
            }
            panic!("skein ended ({status}) before {what}:\n{stderr}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no {what} in 300 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// Runs `skein` (no AWS needed); returns stdout or fails the test.
fn skein(args: &[&str]) -> String {
    let (ok, stdout, stderr) = common::skein(args);
    assert!(ok, "skein {args:?} failed:\n{stdout}\n{stderr}");
    stdout
}

/// SIGKILLs the bootstrap of `function` (waiting up to 30 s for one to
/// exist: after a redeployment the next invocation starts it).
fn kill_bootstrap(function: &str) -> i32 {
    let started = Instant::now();
    loop {
        if let Some(pid) = common::kills::bootstraps(|f| f == function).first() {
            let killed = Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .expect("kill");
            assert!(killed.success(), "kill -9 {pid}");
            return *pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no bootstrap process of {function} in 30 s (ministack runs one per warm instance)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn group_members_whose_bootstrap_is_killed_mid_run_restore_from_the_last_commit() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let setup = Setup::new();
    let mut child = setup.spawn();
    let mut rng = rand::rng();
    let mut epoch = None;
    let mut killed = vec![];
    // Each member of the group in turn, a few commits apart, at a random
    // moment within an epoch: idle between invocations or in one.
    for function in &setup.group {
        for _ in 0..3 {
            epoch = Some(setup.wait_for_commit_after(&runtime, &mut child, epoch));
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..400)));
        killed.push((function.clone(), kill_bootstrap(function), epoch));
    }
    let report = setup.finish(child);
    eprintln!("killed (function, pid, after commit): {killed:?}");
    setup.assert_exact(&report);
    assert!(
        report.resumed_after.is_none(),
        "a first run resumes nothing: {report:?}"
    );
}

#[test]
fn a_second_run_resumes_after_the_last_commit_of_a_killed_one() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let setup = Setup::new();
    let mut child = setup.spawn();
    let mut epoch = None;
    for _ in 0..4 {
        epoch = Some(setup.wait_for_commit_after(&runtime, &mut child, epoch));
    }
    std::thread::sleep(Duration::from_millis(rand::rng().random_range(0..400)));
    // The run had committed 4 epochs: the kill is mid-run if it lands.
    let (landed, status) = common::kills::sigkill(&mut child);
    assert!(
        landed,
        "the first run was still running when killed: {status}"
    );
    let report = setup.finish(setup.spawn());
    let resumed = report.resumed_after;
    assert!(
        resumed.is_some_and(|r| r >= epoch.unwrap_or(0)),
        "the second run resumed after the commit the first reached ({epoch:?}): {report:?}"
    );
    setup.assert_exact(&report);
}

#[test]
fn a_member_killed_between_commits_is_caught_up_by_replacing_every_instance() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let setup = Setup::new();
    // Commits every third epoch: a member killed after the epoch after a
    // commit has state its replacement cannot load (it loads the commit),
    // so its replacement waits for input the others already sent, or fails.
    let mut child = setup.spawn_with(&["--checkpoint-interval", "3"]);
    let commit = setup.wait_for_commit_after(&runtime, &mut child, Some(2));
    setup.wait_for_plan(&runtime, &mut child, commit + 2);
    let function = &setup.group[0];
    let pid = kill_bootstrap(function);
    let report = setup.finish(child);
    eprintln!(
        "killed {function} (pid {pid}) when epoch {} was decided",
        commit + 2
    );
    setup.assert_exact(&report);
    assert!(
        report.lambda.as_ref().map(|l| l.recoveries) >= Some(1),
        "the driver replaced every instance: {report:?}"
    );
}

/// `--autoscale` on Lambda: a group deployed at 4 members is kept within
/// 1..2 by the first run (it shrinks after its second commit, and the
/// run is then SIGKILLed), and within 3..4 by a second run, which resumes
/// at 2 members and grows. Each rescale records the sizes, replaces every
/// instance, and the new members take their key groups' state from the
/// commit; the sink ends with exactly the reference.
#[test]
fn autoscale_on_lambda_shrinks_a_group_and_a_resumed_run_grows_it_keeping_every_window_exact() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let setup = Setup::with_group_size(4);
    let mut child = setup.spawn_with(&["--autoscale", "1..2"]);
    let shrunk = while_running(&mut child, "a rescale record", || {
        setup.layouts(&runtime).into_iter().next()
    });
    let at = setup.wait_for_commit_after(&runtime, &mut child, None);
    let at = setup.wait_for_commit_after(&runtime, &mut child, Some(at));
    let (landed, status) = common::kills::sigkill(&mut child);
    assert!(
        landed,
        "the first run was still running when killed: {status}"
    );
    let sizes = |v: &Value| -> Vec<u64> {
        v.as_object()
            .map(|o| o.values().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
    assert_eq!(
        sizes(&shrunk.1),
        [2],
        "shrunk to the top of 1..2: {shrunk:?}"
    );

    let report = setup.finish(setup.spawn_with(&["--autoscale", "3..4"]));
    assert!(
        report.resumed_after.is_some_and(|r| r >= at),
        "the second run resumed after commit {at}: {report:?}"
    );
    let layouts = setup.layouts(&runtime);
    eprintln!("layouts: {layouts:?}");
    assert!(
        layouts.iter().any(|(_, l)| sizes(l) == [3]),
        "the second run grew the group to the bottom of 3..4: {layouts:?}"
    );
    setup.assert_exact(&report);
}
