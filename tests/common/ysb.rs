//! Running `skein ysb ...` in the tests.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// `skein ysb <cmd> --json` for `topic`, `dir` and `seed` against `brokers`
/// and the shared Redis.
pub fn command(cmd: &str, brokers: &str, topic: &str, dir: &Path, seed: u64) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_skein"));
    c.args([
        "ysb",
        cmd,
        "--topic",
        topic,
        "--seed",
        &seed.to_string(),
        "--json",
    ])
    .arg("--dir")
    .arg(dir)
    .args(["--brokers", brokers, "--redis", &super::redis_url()])
    .env("RUST_BACKTRACE", "0");
    c
}

/// Runs `command` to its end: (success, its last stdout line as JSON, the log).
pub fn output(command: &mut Command) -> (bool, Value, String) {
    let out = command.output().expect("running skein");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or(Value::Null);
    (
        out.status.success(),
        json,
        format!("stdout: {stdout}\nstderr: {stderr}"),
    )
}
