//! What a bench function may do on request, and what a stage function may not.
//!
//! Benchmark steps (`{"exchange": ...}`) and probe reports written to a
//! target (`{"probe": {"record_to": ...}}`) make a function invoke other
//! functions and read or write the object store with its role. A function
//! serves them only when its configuration names it a bench function
//! ([`BENCH_ENV`], set by `skein bench lambda --exchange` on the two
//! functions it deploys, never by `skein deploy`), and then only within the
//! scope written there: the peers it may invoke and the keys of its own
//! run. Anyone allowed to invoke a query's functions therefore cannot make
//! them act beyond their query.

use serde::{Deserialize, Serialize};

use crate::exchange::{ExchangeRequest, MAX_BYTES, PREFIX};

/// Environment variable holding a bench function's [`BenchScope`] as JSON.
pub const BENCH_ENV: &str = "SKEIN_BENCH";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchScope {
    /// The bench run: exchange keys live under `skein/bench/exchange/<run>/`.
    pub run: String,
    /// Functions this one may invoke (the exchange sender's receiver).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<String>,
    /// Where a probe may record its report: a URL prefix ending in `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_prefix: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    #[error("{0} is set but is not a bench scope: {1}")]
    BadScope(&'static str, String),
    #[error("{what} is served only by a bench function ({BENCH_ENV} unset)")]
    NotBench { what: &'static str },
    #[error("{0}")]
    Outside(String),
}

impl BenchScope {
    /// This function's scope: `None` for every function but a bench one.
    pub fn from_env() -> Result<Option<Self>, ScopeError> {
        match std::env::var(BENCH_ENV) {
            Ok(v) if !v.is_empty() => Self::parse(&v).map(Some),
            _ => Ok(None),
        }
    }

    pub fn parse(json: &str) -> Result<Self, ScopeError> {
        let scope: BenchScope = serde_json::from_str(json)
            .map_err(|e| ScopeError::BadScope(BENCH_ENV, e.to_string()))?;
        if !safe_key(&scope.run) {
            return Err(ScopeError::BadScope(
                BENCH_ENV,
                format!("run {:?}", scope.run),
            ));
        }
        Ok(scope)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("scope serialises")
    }

    /// Where this run's exchange objects live.
    fn prefix(&self) -> String {
        format!("{PREFIX}/{}/", self.run)
    }

    fn inside(&self, key: &str) -> bool {
        key.strip_prefix(&self.prefix()).is_some_and(safe_key)
    }

    /// May this function serve `request`?
    pub fn check_exchange(&self, request: &ExchangeRequest) -> Result<(), ScopeError> {
        let outside = |what: String| Err(ScopeError::Outside(what));
        match request {
            ExchangeRequest::Send { bytes, to, tag, .. } => {
                if *bytes > MAX_BYTES {
                    return outside(format!(
                        "{bytes} bytes is above the {MAX_BYTES} an exchange moves"
                    ));
                }
                if !self.peers.contains(to) {
                    return outside(format!("{to:?} is not a peer of this bench function"));
                }
                if !self.inside(&format!("{PREFIX}/{tag}/x")) {
                    return outside(format!("tag {tag:?} is not of run {:?}", self.run));
                }
            }
            ExchangeRequest::Receive { ack: Some(ack), .. }
                if !self.inside(&format!("{ack}/x")) =>
            {
                return outside(format!("ack prefix {ack:?} is outside {}", self.prefix()));
            }
            ExchangeRequest::Fetch { key } if !self.inside(key) => {
                return outside(format!("key {key:?} is outside {}", self.prefix()));
            }
            _ => {}
        }
        Ok(())
    }

    /// May a probe write its report to `target`?
    pub fn check_record_to(&self, target: &str) -> Result<(), ScopeError> {
        let Some(prefix) = &self.record_prefix else {
            return Err(ScopeError::Outside(
                "this bench function records no probe reports".into(),
            ));
        };
        match target.strip_prefix(prefix.as_str()) {
            Some(rest) if prefix.ends_with('/') && safe_key(rest) => Ok(()),
            _ => Err(ScopeError::Outside(format!(
                "record_to {target:?} is outside {prefix:?}"
            ))),
        }
    }
}

/// Non-empty `/`-separated parts, none of them `.` or `..`.
fn safe_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::Method;

    fn scope() -> BenchScope {
        BenchScope::parse(r#"{"run": "r1", "peers": ["recv"], "record_prefix": "s3://b/probes/"}"#)
            .unwrap()
    }

    fn send(to: &str, tag: &str, bytes: usize) -> ExchangeRequest {
        ExchangeRequest::Send {
            bytes,
            method: Method::Sync,
            to: to.into(),
            tag: tag.into(),
        }
    }

    #[test]
    fn serves_only_its_peers_and_its_run() {
        let s = scope();
        assert!(s.check_exchange(&send("recv", "r1/7", 1500)).is_ok());
        for (req, needle) in [
            (send("q0123456789-01-00", "r1/7", 1500), "not a peer"),
            (send("recv", "r2/7", 1500), "not of run"),
            (send("recv", "r1/../r2", 1500), "not of run"),
            (send("recv", "r1/7", usize::MAX), "above"),
            (
                ExchangeRequest::Fetch {
                    key: "skein/contexts/abc".into(),
                },
                "outside",
            ),
            (
                ExchangeRequest::Fetch {
                    key: "skein/bench/exchange/r1/../../contexts/abc".into(),
                },
                "outside",
            ),
        ] {
            let err = s.check_exchange(&req).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
        assert!(
            s.check_exchange(&ExchangeRequest::Fetch {
                key: "skein/bench/exchange/r1/7/data.arrow".into()
            })
            .is_ok()
        );
    }

    #[test]
    fn records_only_under_its_prefix() {
        let s = scope();
        assert!(s.check_record_to("s3://b/probes/fn/event.json").is_ok());
        for target in [
            "s3://b/other/event.json",
            "s3://b/probes/../x",
            "s3://b/probes/",
            "file:///etc/passwd",
        ] {
            assert!(s.check_record_to(target).is_err(), "{target}");
        }
        let mut none = scope();
        none.record_prefix = None;
        assert!(none.check_record_to("s3://b/probes/x").is_err());
    }

    #[test]
    fn a_bad_scope_is_an_error() {
        assert!(BenchScope::parse("{}").is_err());
        assert!(BenchScope::parse(r#"{"run": "../x"}"#).is_err());
        assert!(BenchScope::parse(r#"{"run": "r", "peers": [], "extra": 1}"#).is_err());
    }
}
