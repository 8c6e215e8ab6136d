//! One Redis connection that waits out outages: the Redis sink and Redis
//! lookup tables both go through it, so both retry the same way.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tracing::warn;

use crate::error::{ConnectorError, Result};

/// The `STORED AS` name of a Redis table.
pub const KIND: &str = "REDIS";

/// How long an operation waits for Redis to answer again before it fails.
pub const REDIS_WAIT: Duration = Duration::from_secs(120);

/// The option that sets that wait, in ms.
pub const RETRY_OPTION: &str = "retry.timeout.ms";

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

/// Doubling from 100 ms up to 5 s, so a short outage costs little and a long
/// one few attempts.
pub fn retry_backoff(attempt: u32) -> Duration {
    Duration::from_millis((100u64 << attempt.min(6).saturating_sub(1)).min(5_000))
}

pub struct RedisConnection {
    pub url: String,
    client: redis::Client,
    connection: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    retry_timeout: Duration,
}

impl RedisConnection {
    pub fn open(url: &str, retry_timeout: Duration) -> Result<Self> {
        Ok(RedisConnection {
            url: url.to_string(),
            client: redis::Client::open(url)?,
            connection: tokio::sync::Mutex::new(None),
            retry_timeout,
        })
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
    /// for up to the retry timeout; `what` names the operation in the log.
    /// `op` must be safe to repeat.
    pub async fn retrying<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T>
    where
        F: FnMut(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut since: Option<Instant> = None;
        let mut attempt = 0u32;
        loop {
            let result = match self.connection().await {
                Ok(con) => op(con).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(v) => {
                    if since.is_some() {
                        warn!(url = %self.url, attempt, "{what}: Redis is back");
                    }
                    return Ok(v);
                }
                Err(ConnectorError::Redis(e)) if is_outage(&e) => {
                    // The connection is unusable; the next attempt opens another.
                    self.connection.lock().await.take();
                    let first = *since.get_or_insert_with(Instant::now);
                    if first.elapsed() >= self.retry_timeout {
                        return Err(ConnectorError::Other(format!(
                            "Redis at {} did not answer for {:?} ({attempt} retries); last error: {e}",
                            self.url, self.retry_timeout
                        )));
                    }
                    attempt += 1;
                    let wait = retry_backoff(attempt);
                    warn!(url = %self.url, attempt, "{what}: {e}; retrying in {wait:?}");
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
