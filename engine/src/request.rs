//! What an invocation asks a Skein function for, parsed once.
//!
//! Every kind of request the one function binary serves is told apart here,
//! by its top-level keys, and parsed into its type in the same pass: the
//! in-process runtime, the stage handler and the Lambda bootstrap all take
//! a [`Request`]. Two kinds are typed by the crates that serve them (the
//! exchange benchmark in `skein-lambda`, a Kinesis event-source batch in
//! `skein-connectors`); they are handed over as the JSON already parsed.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{EngineError, Result};
use crate::payload::Payload;

/// The top-level key of a probe.
pub const PROBE_KEY: &str = "probe";
/// The top-level key of an exchange-benchmark step.
pub const EXCHANGE_KEY: &str = "exchange";
/// The top-level key of a standing query's driver tick.
pub const DRIVE_KEY: &str = "drive";

/// What a function is asked to do; parsed once from the invocation's JSON.
#[derive(Debug, Clone)]
pub enum Request {
    /// Run a source stage for one epoch: `{"trigger": {...}}`.
    Trigger(Trigger),
    /// Data from an upstream stage: the bare payload envelope.
    Data(Box<Payload>),
    /// Report what the function sees: `{"probe": true | {...}}`.
    Probe(Probe),
    /// A step of `skein bench lambda --exchange`: `{"exchange": {...}}`.
    Exchange(Value),
    /// Lambda's record of an async invocation that failed all its retries
    /// (`requestContext`, `requestPayload`, ...).
    DeadLetter(Map<String, Value>),
    /// A platform event with `Records` (a Kinesis event-source batch).
    Records(Value),
    /// A tick of a standing query's driver, from its schedule:
    /// `{"drive": {"query": "<query-code>"}}`.
    Drive(Drive),
}

/// Ask a standing driver function to run one tick of its query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drive {
    /// The query code of the standing query to drive.
    pub query: String,
}

/// Ask a source stage to pull and run one epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trigger {
    /// The query code, checked against the function's.
    pub qid: String,
    /// The epoch.
    pub epoch: u64,
    /// The run's last epoch: flush.
    pub last: bool,
    /// The epoch will be committed: stateful members keep their state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint: bool,
    /// No source member can have logged the epoch before (the driver never
    /// fired it): a source member need not look for its entry first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh: bool,
    /// The last epoch the driver committed: a source member keeps the log
    /// entries of the epochs after it (a restart reads those again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed: Option<u64>,
}

/// A probe: the function reports its name and environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    /// Also write the report there (`s3://bucket/key` or `file:///path`);
    /// only a bench function does, and only under its own prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_to: Option<String>,
}

fn bad(reason: String) -> EngineError {
    EngineError::BadEnvelope(reason.into())
}

impl Request {
    /// A request from an invocation's JSON.
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| EngineError::BadEnvelope(e.into()))?;
        Self::from_value(value)
    }

    /// Tell the kind by the top-level keys and parse it; the JSON is moved,
    /// never re-encoded.
    pub fn from_value(value: Value) -> Result<Self> {
        let Value::Object(mut fields) = value else {
            return Err(bad(format!(
                "expected a JSON object, got {}",
                json_kind(&value)
            )));
        };
        if fields.contains_key("Records") {
            return Ok(Request::Records(Value::Object(fields)));
        }
        if let Some(probe) = fields.remove(PROBE_KEY) {
            return Probe::from_value(probe).map(Request::Probe);
        }
        if let Some(exchange) = fields.remove(EXCHANGE_KEY) {
            return Ok(Request::Exchange(exchange));
        }
        if let Some(drive) = fields.remove(DRIVE_KEY) {
            return serde_json::from_value(drive)
                .map(Request::Drive)
                .map_err(|e| bad(format!("drive: {e}")));
        }
        if fields.contains_key("requestContext") && fields.contains_key("requestPayload") {
            return Ok(Request::DeadLetter(fields));
        }
        if let Some(trigger) = fields.remove("trigger") {
            return serde_json::from_value(trigger)
                .map(Request::Trigger)
                .map_err(|e| bad(format!("trigger: {e}")));
        }
        if fields.contains_key("uuid") {
            return serde_json::from_value(Value::Object(fields))
                .map(|p| Request::Data(Box::new(p)))
                .map_err(|e| bad(format!("payload: {e}")));
        }
        let keys: Vec<&String> = fields.keys().take(8).collect();
        Err(bad(format!(
            "unrecognised payload with keys {keys:?}; expected {{\"trigger\": {{...}}}}, \
             a data payload {{\"uuid\": ...}} or {{\"probe\": {{...}}}}"
        )))
    }

    /// The request as JSON.
    pub fn to_json(&self) -> Vec<u8> {
        let value = match self {
            // Data payloads travel as the bare envelope.
            Request::Data(p) => return p.to_json(),
            Request::Trigger(t) => serde_json::json!({ "trigger": t }),
            Request::Probe(p) => serde_json::json!({ PROBE_KEY: p }),
            Request::Exchange(v) => serde_json::json!({ EXCHANGE_KEY: v }),
            Request::DeadLetter(m) => Value::Object(m.clone()),
            Request::Records(v) => v.clone(),
            Request::Drive(d) => serde_json::json!({ DRIVE_KEY: d }),
        };
        serde_json::to_vec(&value).expect("json")
    }

    /// What kind of request this is, for errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Trigger(_) => "trigger",
            Request::Data(_) => "data payload",
            Request::Probe(_) => "probe",
            Request::Exchange(_) => "exchange request",
            Request::DeadLetter(_) => "dead letter",
            Request::Records(_) => "event batch",
            Request::Drive(_) => "driver tick",
        }
    }
}

impl Probe {
    /// `true` or an object.
    fn from_value(value: Value) -> Result<Self> {
        match value {
            Value::Bool(true) => Ok(Probe::default()),
            Value::Object(_) => {
                serde_json::from_value(value).map_err(|e| bad(format!("bad probe: {e}")))
            }
            other => Err(bad(format!(
                "bad probe: expected an object or true, got {}",
                json_kind(&other)
            ))),
        }
    }
}

/// What kind of JSON value `value` is, for errors.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Request> {
        Request::from_value(v)
    }

    #[test]
    fn tells_every_kind_apart() {
        assert!(matches!(
            parse(json!({"probe": true})),
            Ok(Request::Probe(_))
        ));
        let Ok(Request::Probe(p)) = parse(json!({"probe": {"record_to": "s3://b/k"}})) else {
            panic!("probe with record_to not parsed");
        };
        assert_eq!(p.record_to.as_deref(), Some("s3://b/k"));
        let t = parse(json!({"trigger": {"qid": "q", "epoch": 0, "last": true}})).unwrap();
        assert!(matches!(t, Request::Trigger(Trigger { epoch: 0, .. })));
        assert_eq!(
            Request::from_json(&t.to_json()).unwrap().to_json(),
            t.to_json()
        );
        let data = json!({"uuid": {"qid": "q", "seq_num": 0, "seq_len": 1},
                          "epoch": 1, "shuffle_id": 2, "encoding": "zstd"});
        assert!(matches!(parse(data), Ok(Request::Data(_))));
        assert!(matches!(
            parse(json!({"exchange": {"fetch": {"key": "k"}}})),
            Ok(Request::Exchange(_))
        ));
        assert!(matches!(
            parse(json!({"requestContext": {}, "requestPayload": {}})),
            Ok(Request::DeadLetter(_))
        ));
        assert!(matches!(
            parse(json!({"Records": []})),
            Ok(Request::Records(_))
        ));
        let drive = parse(json!({"drive": {"query": "q1"}})).unwrap();
        assert!(matches!(&drive, Request::Drive(Drive { query }) if query == "q1"));
        assert_eq!(
            Request::from_json(&drive.to_json()).unwrap().kind(),
            "driver tick"
        );
    }

    #[test]
    fn rejects_bad_requests_with_a_reason() {
        for (v, needle) in [
            (json!([1, 2]), "expected a JSON object"),
            (json!({"nonsense": 1}), "nonsense"),
            (json!("text"), "expected a JSON object"),
            (json!({"probe": 7}), "bad probe"),
            (json!({"probe": {"record_too": "x"}}), "unknown field"),
            (json!({"trigger": {"qid": 1}}), "trigger"),
            (json!({"uuid": {}, "data": ""}), "payload"),
            (json!({"drive": {"query": "q", "extra": 1}}), "drive"),
        ] {
            let err = parse(v).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
        assert!(Request::from_json(b"{\"uuid\": 1").is_err());
    }
}
