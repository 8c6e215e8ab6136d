//! Killing a `skein` process with SIGKILL at moments tied to its progress
//! (the commits in its checkpoint directory) and running it again, until a
//! run finishes.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::Value;

/// The last committed epoch in a checkpoint directory, if any.
pub fn committed_epoch(checkpoints: &Path) -> Option<u64> {
    let bytes = skein_engine::checkpoint::local_object(checkpoints, "commit.json").ok()??;
    serde_json::from_slice::<Value>(&bytes).ok()?["epoch"].as_u64()
}

/// What one SIGKILL did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kill {
    /// The process was still running when the signal came: it died of it,
    /// not of its own exit a moment before.
    pub landed: bool,
    /// The killed process had committed at least one epoch of its own:
    /// the kill cut a run that was under way, not one still starting.
    pub mid_run: bool,
    /// The last commit in the checkpoint directory when it died.
    pub at_commit: Option<u64>,
}

/// SIGKILLs `child` and reaps it: whether it was still running (it died of
/// the signal, not of its own exit a moment before), and how it ended.
pub fn sigkill(child: &mut Child) -> (bool, std::process::ExitStatus) {
    use std::os::unix::process::ExitStatusExt;
    // SIGKILL is delivered to a running process or a zombie alike; only
    // how it ended tells whether it was still running.
    let _ = child.kill();
    let status = child.wait().expect("reaping the killed process");
    (status.signal() == Some(9), status)
}

/// SIGKILLs `child` and reaps it; `at_spawn` is the commit its checkpoint
/// directory held when it started. Returns what the kill did and how the
/// process ended.
pub fn kill(
    child: &mut Child,
    checkpoints: &Path,
    at_spawn: Option<u64>,
) -> (Kill, std::process::ExitStatus) {
    let (landed, status) = sigkill(child);
    let at_commit = committed_epoch(checkpoints);
    let kill = Kill {
        landed,
        mid_run: at_commit.is_some() && at_commit > at_spawn,
        at_commit,
    };
    (kill, status)
}

/// What [`run_through_kills`] saw.
#[derive(Debug)]
pub struct KillRun {
    /// The stdout of the run that finished.
    pub stdout: String,
    /// Every kill that landed, in order.
    pub kills: Vec<Kill>,
    /// The commit the checkpoint directory held when the finishing run
    /// started: where it had to resume after.
    pub final_start: Option<u64>,
}

impl KillRun {
    /// Kills that cut a run after it had committed an epoch.
    pub fn mid_run(&self) -> usize {
        self.kills.iter().filter(|k| k.mid_run).count()
    }

    /// The finishing run's JSON report (its last stdout line) resumed after
    /// the last commit before it started; returns the report.
    pub fn assert_resumed<R: Resumed>(&self) -> R {
        let report: R = serde_json::from_str(self.stdout.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("a report line in {:?}: {e}", self.stdout));
        assert_eq!(
            report.resumed_after(),
            self.final_start,
            "the last run resumed after the last commit before it: {report:?}"
        );
        report
    }
}

/// The JSON report of a run that can resume from a checkpoint: which
/// commit it resumed after.
pub trait Resumed: serde::de::DeserializeOwned + std::fmt::Debug {
    fn resumed_after(&self) -> Option<u64>;
}

/// `skein run --json`.
impl Resumed for skein::report::Report {
    fn resumed_after(&self) -> Option<u64> {
        self.resumed_after
    }
}

/// `skein ysb run --json`: an object of its own (src/ysb/run.rs), no struct.
impl Resumed for Value {
    fn resumed_after(&self) -> Option<u64> {
        self["resumed_after"].as_u64()
    }
}

/// Runs `command()` to the end, killing it with SIGKILL `kills` times and
/// starting it again. Kills land early and late in a run, in every phase
/// (start, middle, the final flush): every third comes 100 ms to 1 s after
/// the start (before or around the first commit), the others once the run
/// has made one or two commits of its own, so the machine's speed does not
/// decide where kills land. A kill that finds the process already
/// exited does not count: that run is judged by its exit. Panics if a run
/// fails, or if none finishes in 10 minutes.
pub fn run_through_kills(
    command: impl Fn() -> Command,
    checkpoints: &Path,
    kills: usize,
) -> KillRun {
    let mut rng = rand::rng();
    let mut landed = vec![];
    let started = Instant::now();
    let (stdout, final_start) = loop {
        let mut child = command().spawn().expect("starting skein");
        let at_spawn = committed_epoch(checkpoints);
        let early = landed.len() % 3 == 0;
        let delay = Duration::from_millis(rng.random_range(100..1000));
        let mut deadline = (landed.len() < kills && early).then(|| Instant::now() + delay);
        // A late kill comes once the run has made one or two commits of its
        // own: tied to progress, so a short run is cut too.
        let commits_before_kill = rng.random_range(1..=2usize);
        let (mut seen, mut commits) = (at_spawn, 0usize);
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for skein") {
                break status;
            }
            let now_at = committed_epoch(checkpoints);
            if now_at != seen {
                seen = now_at;
                commits += 1;
            }
            if landed.len() < kills
                && !early
                && deadline.is_none()
                && commits >= commits_before_kill
            {
                deadline = Some(Instant::now());
            }
            // An early kill comes at its delay or at the run's first commit,
            // whichever is first: on a fast machine (or a fast sink) the
            // delay alone could let it run through most of its input, and
            // leave too little for the kills after it.
            if landed.len() < kills && early && commits >= 1 {
                deadline = Some(Instant::now());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let (k, status) = kill(&mut child, checkpoints, at_spawn);
                if k.landed {
                    landed.push(k);
                    eprintln!("kill {} of {kills} landed: {k:?}", landed.len());
                }
                break status;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let output = child.wait_with_output().expect("skein output");
        if status.success() {
            break (
                String::from_utf8_lossy(&output.stdout).to_string(),
                at_spawn,
            );
        }
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                status.signal(),
                Some(9),
                "skein exited with {status} after {} kills:\n{}",
                landed.len(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no run finished in 10 minutes"
        );
    };
    assert_eq!(landed.len(), kills, "every planned kill landed");
    KillRun {
        stdout,
        kills: landed,
        final_start,
    }
}

/// SIGKILLs every `bootstrap` process of query `code`'s functions (its
/// driver's too): their pids.
pub fn kill_query_bootstraps(code: &str) -> Vec<i32> {
    let wanted = format!("{code}-");
    let pids = bootstraps(|f| f.starts_with(&wanted));
    for pid in &pids {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    pids
}

/// The `bootstrap` processes ministack runs for the functions `wanted`
/// picks: their command is the unpacked `bootstrap`, their environment
/// names the function (`AWS_LAMBDA_FUNCTION_NAME`).
pub fn bootstraps(wanted: impl Fn(&str) -> bool) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
            argv0.ends_with(b"/bootstrap")
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .unwrap_or_default()
                    .split(|b| *b == 0)
                    .filter_map(|var| var.strip_prefix(b"AWS_LAMBDA_FUNCTION_NAME="))
                    .any(|name| std::str::from_utf8(name).is_ok_and(&wanted))
        })
        .collect()
}

/// Waits (up to 5 minutes, polling) until the query has committed `epoch`;
/// fails if `child` exits first.
pub fn wait_for_commit(child: &mut Child, checkpoints: &Path, epoch: u64) {
    let started = Instant::now();
    while committed_epoch(checkpoints).is_none_or(|c| c < epoch) {
        if let Some(status) = child.try_wait().expect("waiting for skein") {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            panic!(
                "skein exited ({status}) before committing epoch {epoch}; its stderr:\n{stderr}"
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "epoch {epoch} not committed within 5 minutes (at {:?})",
            committed_epoch(checkpoints)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process held with SIGSTOP until dropped (SIGCONT), also when the test
/// fails while it is held.
pub struct Paused(u32);

impl Paused {
    pub fn stop(child: &Child) -> Paused {
        signal(child.id(), "STOP");
        Paused(child.id())
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        // Not asserted: the process may have died meanwhile, and a panic
        // here during a failing test's unwinding would abort.
        let _ = Command::new("kill")
            .args(["-s", "CONT", &self.0.to_string()])
            .status();
    }
}

fn signal(pid: u32, name: &str) {
    let sent = Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(sent.success(), "kill -s {name} {pid} failed");
}
