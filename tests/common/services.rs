//! Services a test starts for itself, to stop and start them again (an
//! outage), so the shared ones are never touched.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A single-node Kafka of this test, started and stopped through
/// `scripts/services.sh ... kafka-outage`, which keeps its data across a stop.
pub struct PrivateBroker {
    state: PathBuf,
    port: u16,
    controller_port: u16,
}

impl PrivateBroker {
    /// A failed test's broker log (since its last start) kept beside its
    /// state, which goes, with its warnings and transaction lines printed:
    /// what tells a client's fault from the broker's.
    fn keep_log(&self) {
        let log = self.state.join("kafka-outage").join("log");
        let Ok(text) = std::fs::read_to_string(&log) else {
            return;
        };
        let kept = self.state.with_extension("broker.log");
        let _ = std::fs::write(&kept, &text);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("ransaction"))
            .collect();
        eprintln!(
            "the private broker's log since its last start: {} (last 60 of its {} warnings \
             and transaction lines below)",
            kept.display(),
            lines.len()
        );
        for l in &lines[lines.len().saturating_sub(60)..] {
            eprintln!("  {l}");
        }
    }

    /// Starts it, keeping its state under `state`.
    pub fn start(state: PathBuf) -> PrivateBroker {
        let broker = PrivateBroker {
            state,
            port: super::free_port(),
            controller_port: super::free_port(),
        };
        broker.services("start");
        broker
    }

    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `scripts/services.sh <action> kafka-outage` for this broker.
    pub fn services(&self, action: &str) {
        let script = super::repo_path("scripts/services.sh");
        let out = Command::new(&script)
            .args([action, "kafka-outage"])
            .env("SKEIN_STATE", &self.state)
            .env("KAFKA_OUTAGE_PORT", self.port.to_string())
            .env(
                "KAFKA_OUTAGE_CONTROLLER_PORT",
                self.controller_port.to_string(),
            )
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "`SKEIN_STATE={} KAFKA_OUTAGE_PORT={} KAFKA_OUTAGE_CONTROLLER_PORT={} \
             scripts/services.sh {action} kafka-outage` failed (it needs Java and the \
             Kafka jars: run scripts/setup.sh):\n{}{}",
            self.state.display(),
            self.port,
            self.controller_port,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.keep_log();
        }
        // Also when the test fails: no broker is left behind.
        let _ = Command::new(super::repo_path("scripts/services.sh"))
            .args(["stop", "kafka-outage"])
            .env("SKEIN_STATE", &self.state)
            .env("KAFKA_OUTAGE_PORT", self.port.to_string())
            .env(
                "KAFKA_OUTAGE_CONTROLLER_PORT",
                self.controller_port.to_string(),
            )
            .output();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

/// A `redis-server` of a test, on its own port, with an append-only file so
/// its data outlives a stop.
pub struct PrivateRedis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateRedis {
    /// Starts it on `port`, its files in `dir`.
    pub fn start(port: u16, dir: &Path) -> PrivateRedis {
        let mut r = PrivateRedis {
            port,
            dir: dir.to_path_buf(),
            child: None,
        };
        r.up();
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server again (its data from the append-only file).
    pub fn up(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install redis-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = redis::Client::open(self.url())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok();
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "private redis-server not up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM: Redis writes its append-only file and exits.
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.down();
    }
}
