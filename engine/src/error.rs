//! The engine's error type. Every error that concerns a payload names its
//! uuid and the stage that saw it, so a failed invocation can be traced.
//!
//! A variant that wraps a failure of something else (a connector, another
//! function, a nested engine error) keeps it as [`std::error::Error::source`],
//! so a caller can inspect the typed cause. Its message also carries the
//! cause's text, so a plain `{}` (what a Lambda function reports, what a log
//! line holds) is the whole story on one line. Print a chain with
//! [`one_line`], which skips a cause whose text is already in the message;
//! anyhow's `{:#}` would print it twice.

use std::error::Error as StdError;
use std::fmt;

use datafusion::error::DataFusionError;

/// The cause an error wraps: a typed error of another crate, or a plain
/// message (`String` converts into it).
pub type Cause = Box<dyn StdError + Send + Sync>;

/// Everything that can go wrong while planning, invoking and running a query.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A payload failed a structural or decoding check at a stage.
    #[error("payload {uuid} at stage {stage}: {reason}")]
    BadPayload {
        /// The payload's uuid (`qid:seq_num/seq_len#fragment@shuffle`).
        uuid: String,
        /// The function that received it.
        stage: String,
        /// What was wrong.
        reason: String,
    },
    /// A request or payload envelope that does not parse.
    #[error("payload envelope is not valid JSON: {0}")]
    BadEnvelope(#[source] Cause),
    /// A cloud context (or state stored beside it) that cannot be used.
    #[error("cloud context: {0}")]
    Context(String),
    /// A query the planner cannot turn into stages.
    #[error("planning: {0}")]
    Plan(String),
    /// An invocation named a function nobody deployed.
    #[error("function {0} is not deployed")]
    UnknownFunction(String),
    /// A function is at its concurrency limit.
    #[error("function {name} is throttled (concurrency {limit})")]
    Throttled {
        /// The function's name.
        name: String,
        /// Its concurrency.
        limit: usize,
    },
    /// A function could not be invoked, or answered with an error.
    #[error("invocation of {name} failed: {cause}")]
    Invocation {
        /// The function's name.
        name: String,
        /// Why: the function's own error, or the platform's.
        #[source]
        cause: Cause,
    },
    /// A source could not be opened or read.
    #[error("source {source_name}: {}", with_context(.context, .cause))]
    Source {
        /// Which source: a table, or a connector's kind and location.
        source_name: String,
        /// What the engine was doing when it failed; may be empty.
        context: String,
        /// The connector's error, or a message.
        #[source]
        cause: Cause,
    },
    /// A sink could not be opened or written.
    #[error("sink {sink}: {}", with_context(.context, .cause))]
    Sink {
        /// Which sink: a table, or a connector's kind and location.
        sink: String,
        /// What the engine was doing when it failed; may be empty.
        context: String,
        /// The connector's error, or a message.
        #[source]
        cause: Cause,
    },
    /// A bounded run ended with input that never arrived.
    #[error("incomplete input: {0}")]
    Incomplete(String),
    /// DataFusion failed to plan or run a (sub-)plan.
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
    /// Arrow failed to build, encode or decode a batch.
    #[error(transparent)]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    /// The object store (S3, a local directory) failed.
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
    /// A local file failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The local file an aggregate moves cold groups to failed.
    #[error("groups on local disk ({path}): {reason}")]
    Spill {
        /// The file.
        path: String,
        /// What failed.
        reason: String,
    },
}

fn with_context(context: &str, cause: &Cause) -> String {
    if context.is_empty() {
        cause.to_string()
    } else {
        format!("{context}: {cause}")
    }
}

impl EngineError {
    /// A planning error with this message.
    pub fn plan(msg: impl Into<String>) -> Self {
        EngineError::Plan(msg.into())
    }

    /// The source `name` failed with `cause`.
    pub fn source_failed(name: impl Into<String>, cause: impl Into<Cause>) -> Self {
        EngineError::Source {
            source_name: name.into(),
            context: String::new(),
            cause: cause.into(),
        }
    }

    /// The sink `name` failed with `cause`.
    pub fn sink_failed(name: impl Into<String>, cause: impl Into<Cause>) -> Self {
        EngineError::Sink {
            sink: name.into(),
            context: String::new(),
            cause: cause.into(),
        }
    }

    /// Invoking the function `name` failed with `cause`.
    pub fn invocation_failed(name: impl Into<String>, cause: impl Into<Cause>) -> Self {
        EngineError::Invocation {
            name: name.into(),
            cause: cause.into(),
        }
    }

    /// Says what was being done when a source or sink failed (`writing
    /// KEY`); an error of another kind is returned as it is.
    pub fn doing(mut self, what: impl fmt::Display) -> Self {
        if let EngineError::Source { context, .. } | EngineError::Sink { context, .. } = &mut self {
            *context = join_context(what, context);
        }
        self
    }

    /// This error, as the failure of source `name` while doing `context`.
    /// An error that already names that source gains the context instead
    /// of a second "source NAME:".
    pub fn at_source(self, name: &str, context: impl fmt::Display) -> Self {
        match self {
            EngineError::Source {
                ref source_name, ..
            } if source_name == name => self.doing(context),
            other => EngineError::source_failed(name, other).doing(context),
        }
    }
}

fn join_context(outer: impl fmt::Display, inner: &str) -> String {
    if inner.is_empty() {
        outer.to_string()
    } else {
        format!("{outer}: {inner}")
    }
}

/// `error` and its causes on one line, `a: b: c`, leaving out a cause whose
/// text the line already holds (the engine's errors print their cause).
pub fn one_line(error: &(dyn StdError + 'static)) -> String {
    let mut line = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        next = cause.source();
    }
    line
}

/// The engine's result type.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("broker down")]
    struct Down;

    #[test]
    fn a_cause_is_kept_and_printed_once() {
        let e = EngineError::source_failed("bids", Down);
        assert_eq!(e.to_string(), "source bids: broker down");
        assert!(e.source().unwrap().is::<Down>());
        assert_eq!(one_line(&e), "source bids: broker down");
        let wrapped = EngineError::invocation_failed("q1", e);
        assert_eq!(
            one_line(&wrapped),
            "invocation of q1 failed: source bids: broker down"
        );
    }

    #[test]
    fn context_at_the_same_source_does_not_repeat_its_name() {
        let e = EngineError::source_failed("bids", Down).at_source("bids", "q-00-00");
        assert_eq!(e.to_string(), "source bids: q-00-00: broker down");
        let e = EngineError::plan("x").at_source("bids", "q-00-00");
        assert_eq!(e.to_string(), "source bids: q-00-00: planning: x");
        assert!(e.source().unwrap().is::<EngineError>());
    }
}
