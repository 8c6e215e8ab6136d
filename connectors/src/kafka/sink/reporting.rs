//! A librdkafka client context that hands the client's errors (a refused
//! connection, every broker down) to the sink's health while a write is
//! under way, so a write stuck waiting for a broker shows as failing, with
//! the reason, before its own timeout (see `skein_engine::sink_health`).
//! Both of librdkafka's channels are taken: the error callback, and log
//! lines at error level (a refused connection arrives only there, from the
//! broker threads, while an admin client waits). Errors between writes (an
//! idle connection closed) are only logged, at debug: they say nothing
//! about the sink's writes.

use std::sync::{Arc, Mutex};

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use skein_engine::sink_health::{SinkHealth, current_health};

/// See the module.
#[derive(Clone, Default)]
pub struct ReportingContext {
    health: Arc<Mutex<Option<SinkHealth>>>,
}

impl ReportingContext {
    /// A context reporting to the health of the write running now, if any:
    /// for a client made inside a write and dropped with it.
    pub fn for_this_write() -> Self {
        let c = ReportingContext::default();
        *c.health.lock().expect("kafka health") = current_health();
        c
    }

    /// Reports to the health of the write running now until the guard is
    /// dropped.
    pub fn during_write(&self) -> WriteGuard<'_> {
        *self.health.lock().expect("kafka health") = current_health();
        WriteGuard(self)
    }
}

/// See [`ReportingContext::during_write`].
pub struct WriteGuard<'a>(&'a ReportingContext);

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.0.health.lock().expect("kafka health").take();
    }
}

impl ReportingContext {
    fn report(&self, what: &str) {
        match self.health.lock().expect("kafka health").as_ref() {
            Some(health) => health.failed(&what, None),
            None => tracing::debug!("librdkafka between writes: {what}"),
        }
    }
}

impl ClientContext for ReportingContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => self.report(message),
            _ => tracing::debug!(target: "librdkafka", "{fac} {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.report(&format!("{error}: {reason}"));
    }
}
