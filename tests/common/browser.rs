//! A real browser for the page's tests: Debian's headless Chromium driven
//! through chromedriver's W3C WebDriver protocol (JSON over HTTP, spoken
//! here over a plain TCP stream), plus the same HTTP for the page's JSON
//! API. scripts/setup.sh installs both (packages chromium, chromium-driver).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One HTTP/1.1 request to 127.0.0.1:`port`: (status, body).
pub fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connecting to 127.0.0.1:{port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read the head, then as much body as it announces: chromedriver keeps
    // the connection open whatever the request says.
    let mut raw = vec![];
    let mut buf = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert!(
            n > 0,
            "{method} {path}: the connection closed before an answer"
        );
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let length: Option<usize> = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok());
    let chunked = head.contains("transfer-encoding: chunked");
    loop {
        let body = &raw[head_end..];
        let complete = match length {
            Some(n) => body.len() >= n,
            None if chunked => body.ends_with(b"0\r\n\r\n"),
            None => false,
        };
        if complete {
            break;
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let rest = String::from_utf8_lossy(&raw[head_end..]).to_string();
    let body = if chunked { dechunk(&rest) } else { rest };
    (status, body)
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    out
}

/// GET a JSON document of the page's API; fails the test on an error status.
pub fn get_json(port: u16, path: &str) -> Value {
    let (status, body) = http(port, "GET", path, None);
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// A headless Chromium session.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    profile: PathBuf,
}

impl Browser {
    /// Start chromedriver and a fresh headless Chromium.
    pub fn start() -> Browser {
        for binary in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(binary).is_file(),
                "{binary} is missing: run scripts/setup.sh (it installs Debian's chromium and \
                 chromium-driver)"
            );
        }
        let port = super::free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let started = Instant::now();
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                let (status, body) = http(port, "GET", "/status", None);
                if status == 200 && body.contains("\"ready\":true") {
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not get ready in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = std::env::temp_dir().join(super::unique_name("skein-chromium"));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1400,1300",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }}});
        let (status, body) = http(port, "POST", "/session", Some(&caps));
        let answer: Value = serde_json::from_str(&body).unwrap_or_default();
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session ({status}): {body}"))
            .to_string();
        Browser {
            driver,
            port,
            session,
            profile,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let (status, text) = http(self.port, method, &path, body.as_ref());
        let answer: Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(status, 200, "WebDriver {method} {path}: {text}");
        answer["value"].clone()
    }

    /// Load `url` (a real page load).
    pub fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    /// The value of a script's `return`.
    pub fn eval(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Evaluate `script` until it returns something other than null or
    /// false, for up to `secs`; returns that.
    pub fn wait_for(&self, secs: u64, what: &str, script: &str) -> Value {
        let started = Instant::now();
        loop {
            let v = self.eval(script);
            if !(v.is_null() || v == Value::Bool(false)) {
                return v;
            }
            assert!(
                started.elapsed() < Duration::from_secs(secs),
                "the page did not show {what} within {secs} s; it shows:\n{}",
                self.eval("return document.body.innerText")
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Accept the open confirm() dialog.
    pub fn accept_dialog(&self) {
        self.call("POST", "/alert/accept", Some(json!({})));
    }

    /// Save a PNG of the window to `path`.
    pub fn screenshot(&self, path: &Path) {
        let data = self.call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().expect("a base64 screenshot"))
            .expect("base64");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let path = format!("/session/{}", self.session);
        let _ = std::panic::catch_unwind(|| http(self.port, "DELETE", &path, None));
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Where the tests save screenshots: `SKEIN_SCREENSHOTS`, else
/// `ui-screenshots` in the target directory's parent of the test binary.
pub fn screenshot_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SKEIN_SCREENSHOTS") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test binary");
    // target/debug/deps/<test> -> target/ui-screenshots
    exe.ancestors()
        .nth(3)
        .map_or_else(std::env::temp_dir, Path::to_path_buf)
        .join("ui-screenshots")
}
