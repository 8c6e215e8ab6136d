//! One Redis connection that waits out outages: the Redis sink and Redis
//! lookup tables both go through it, so both retry the same way.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use skein_engine::sink_health;
use tracing::warn;

use crate::error::{ConnectorError, Result};

/// How long an operation waits for Redis to answer again before it fails.
pub const REDIS_WAIT: Duration = Duration::from_secs(120);

/// The option that sets that wait, in ms.
pub const RETRY_OPTION: &str = sink_health::RETRY_OPTION;

/// Replies can take longer than the client's default 500 ms on a loaded
/// machine (a MULTI/EXEC of thousands of commands); a timeout there would
/// fail a write that Redis is about to apply.
pub fn connection_config() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(30)))
}

/// `redis://` is optional in a table's LOCATION.
pub fn url_of(location: &str) -> String {
    if location.starts_with("redis://") {
        location.to_string()
    } else {
        format!("redis://{location}")
    }
}

/// The `retry.timeout.ms` option, or the default wait.
pub fn retry_timeout(value: Option<&str>) -> Result<Duration> {
    match value {
        Some(v) => {
            v.trim().parse().map(Duration::from_millis).map_err(|_| {
                ConnectorError::Config(format!("{RETRY_OPTION} = {v:?}: give whole ms"))
            })
        }
        None => Ok(REDIS_WAIT),
    }
}

/// Redis is away (or busy loading) rather than refusing the command.
pub fn is_outage(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(e.retry_method(), redis::RetryMethod::WaitAndRetry)
}

/// The wait after `attempt` failures: the engine's [`sink_health::retry_step`].
pub fn retry_backoff(attempt: u32) -> Duration {
    sink_health::retry_step(attempt)
}

pub struct RedisConnection {
    pub url: String,
    client: redis::Client,
    connection: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    retry_timeout: Duration,
    /// The table set `retry.timeout.ms`: that wait holds even past the
    /// run's bound.
    own_wait: bool,
}

impl RedisConnection {
    pub fn open(url: &str, retry_timeout: Duration) -> Result<Self> {
        Ok(RedisConnection {
            url: url.to_string(),
            client: redis::Client::open(url)?,
            connection: tokio::sync::Mutex::new(None),
            retry_timeout,
            own_wait: false,
        })
    }

    /// `true`: the retry timeout was the table's own choice, so a bounded
    /// run waits it out past its bound (and says so).
    pub fn with_own_wait(mut self, own_wait: bool) -> Self {
        self.own_wait = own_wait;
        self
    }

    async fn connection(&self) -> Result<MultiplexedConnection> {
        let mut slot = self.connection.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&connection_config())
            .await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Runs `op` on the connection, again on a new one while Redis is away,
    /// for up to the retry timeout, or up to the run's bound when the run
    /// has one and the table did not set the timeout (see
    /// [`skein_engine::sink_health`]); `what` names the operation in the
    /// log. Each failed attempt goes to the sink's health; the log has one
    /// line per doubling of them. `op` must be safe to repeat.
    pub async fn retrying<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T>
    where
        F: FnMut(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let health = sink_health::current_health();
        let mut give_up: Option<(Instant, bool)> = None;
        let mut attempt = 0u32;
        loop {
            let result = match self.connection().await {
                Ok(con) => op(con).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(v) => {
                    if give_up.is_some() && health.is_none() {
                        warn!(url = %self.url, attempt, "{what}: Redis is back");
                    }
                    return Ok(v);
                }
                Err(ConnectorError::Redis(e)) if is_outage(&e) => {
                    // The connection is unusable; the next attempt opens another.
                    self.connection.lock().await.take();
                    let (at, by_bound) = *give_up.get_or_insert_with(|| {
                        // Failures of earlier tries of this write count too.
                        let first = health
                            .as_ref()
                            .and_then(|h| h.failing_since())
                            .unwrap_or_else(Instant::now);
                        sink_health::give_up_at(
                            first,
                            self.retry_timeout,
                            self.own_wait,
                            sink_health::current_deadline(),
                        )
                    });
                    let now = Instant::now();
                    if now >= at {
                        let waited = if by_bound {
                            "by the run's bound".to_string()
                        } else {
                            format!("for {:?}", self.retry_timeout)
                        };
                        let hint = if by_bound {
                            format!(" (set '{RETRY_OPTION}' to wait longer)")
                        } else {
                            String::new()
                        };
                        return Err(ConnectorError::Other(format!(
                            "Redis at {} did not answer {waited} ({attempt} retries); last error: {e}{hint}",
                            self.url
                        )));
                    }
                    attempt += 1;
                    let wait = retry_backoff(attempt).min(at - now);
                    match &health {
                        Some(h) => h.failed(&format!("{what}: {e}"), Some(wait)),
                        None if attempt.is_power_of_two() => {
                            warn!(url = %self.url, attempt, "{what}: {e}; retrying in {wait:?}")
                        }
                        None => {}
                    }
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_a_bounded_wait() {
        let waits: Vec<u64> = (1..12)
            .map(|a| retry_backoff(a).as_millis() as u64)
            .collect();
        assert_eq!(&waits[..6], &[100, 200, 400, 800, 1600, 3200]);
        assert!(waits.iter().all(|w| *w <= 5_000));
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        // A refused connection is an outage; a wrong type is not.
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(is_outage(&refused));
        let wrong = redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "no"));
        assert!(!is_outage(&wrong));
    }

    #[test]
    fn retry_timeout_option() {
        assert_eq!(retry_timeout(None).unwrap(), REDIS_WAIT);
        assert_eq!(
            retry_timeout(Some("500")).unwrap(),
            Duration::from_millis(500)
        );
        assert!(retry_timeout(Some("soon")).is_err());
    }
}
