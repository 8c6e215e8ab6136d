//! Killing a `skein` process with SIGKILL at moments tied to its progress
//! (the commits in its checkpoint directory) and running it again, until a
//! run finishes.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::Value;

/// The last committed epoch in a checkpoint directory, if any.
pub fn committed_epoch(checkpoints: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(checkpoints.join("commit.json")).ok()?;
    serde_json::from_str::<Value>(&text).ok()?["epoch"].as_u64()
}

/// Runs `command()` to the end, killing it with SIGKILL `kills` times and
/// starting it again; returns the stdout of the run that finished. Kills
/// land early and late in a run, in every phase (start, middle, the final
/// flush): every third comes 100 ms to 1 s after the start (before or
/// around the first commit), the others up to 800 ms after the run has
/// committed an epoch, so the machine's speed does not decide where kills
/// land. Panics if a run fails, or if none finishes in 10 minutes.
pub fn run_through_kills(
    command: impl Fn() -> Command,
    checkpoints: &Path,
    kills: usize,
) -> String {
    let mut rng = rand::rng();
    let mut killed = 0;
    let started = Instant::now();
    let stdout = loop {
        let mut child = command().spawn().expect("starting skein");
        let at_spawn = committed_epoch(checkpoints);
        let early = killed % 3 == 0;
        let delay = Duration::from_millis(rng.random_range(if early { 100..1000 } else { 0..800 }));
        let mut deadline = (killed < kills && early).then(|| Instant::now() + delay);
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for skein") {
                break Some(status);
            }
            if killed < kills && deadline.is_none() && committed_epoch(checkpoints) > at_spawn {
                deadline = Some(Instant::now() + delay);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                child.kill().expect("SIGKILL");
                child.wait().expect("reaping skein");
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let output = child.wait_with_output().expect("skein output");
        match status {
            None => {
                killed += 1;
                eprintln!(
                    "killed {killed} of {kills} at commit {:?}",
                    committed_epoch(checkpoints)
                );
            }
            Some(s) if s.success() => break String::from_utf8_lossy(&output.stdout).to_string(),
            Some(s) => panic!(
                "skein exited with {s} after {killed} kills:\n{}",
                String::from_utf8_lossy(&output.stderr)
            ),
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no run finished in 10 minutes"
        );
    };
    assert_eq!(killed, kills, "every planned kill happened");
    stdout
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
