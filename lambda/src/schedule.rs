//! The recurring EventBridge Scheduler schedule that invokes a standing
//! query's driver function: one per query, named after its query code.

use aws_sdk_scheduler::Client;
use aws_sdk_scheduler::types::{FlexibleTimeWindow, FlexibleTimeWindowMode, ScheduleState, Target};

use crate::error_chain;

/// How often the driver is invoked (EventBridge Scheduler's shortest rate).
pub const RATE: &str = "rate(1 minute)";

#[derive(Debug, thiserror::Error)]
#[error("schedule {name}: {what}: {reason}")]
pub struct ScheduleError {
    name: String,
    what: &'static str,
    reason: String,
}

/// The schedule of `query_code`'s driver.
pub fn schedule_name(query_code: &str) -> String {
    format!("{query_code}-driver")
}

fn err(name: &str, what: &'static str, e: &dyn std::error::Error) -> ScheduleError {
    ScheduleError {
        name: name.to_string(),
        what,
        reason: error_chain(e),
    }
}

pub struct Schedules {
    client: Client,
}

impl Schedules {
    pub fn new(sdk: &aws_config::SdkConfig) -> Self {
        Schedules {
            client: Client::new(sdk),
        }
    }

    /// Create the schedule, or update it to invoke `function_arn` with
    /// `input`, assuming `role_arn`; it is enabled either way.
    pub async fn put(
        &self,
        name: &str,
        function_arn: &str,
        role_arn: &str,
        input: &str,
    ) -> Result<(), ScheduleError> {
        let target = Target::builder()
            .arn(function_arn)
            .role_arn(role_arn)
            .input(input)
            .build()
            .map_err(|e| err(name, "building the target", &e))?;
        let window = FlexibleTimeWindow::builder()
            .mode(FlexibleTimeWindowMode::Off)
            .build()
            .map_err(|e| err(name, "building the time window", &e))?;
        if self.state(name).await?.is_some() {
            return self
                .update(name, target, window, ScheduleState::Enabled)
                .await;
        }
        self.client
            .create_schedule()
            .name(name)
            .schedule_expression(RATE)
            .flexible_time_window(window)
            .target(target)
            .state(ScheduleState::Enabled)
            .send()
            .await
            .map_err(|e| err(name, "creating", &e))?;
        Ok(())
    }

    async fn update(
        &self,
        name: &str,
        target: Target,
        window: FlexibleTimeWindow,
        state: ScheduleState,
    ) -> Result<(), ScheduleError> {
        self.client
            .update_schedule()
            .name(name)
            .schedule_expression(RATE)
            .flexible_time_window(window)
            .target(target)
            .state(state)
            .send()
            .await
            .map_err(|e| err(name, "updating", &e))?;
        Ok(())
    }

    /// Enable or disable the schedule (UpdateSchedule replaces the whole
    /// definition, so the rest is read back first); `false` when there is
    /// no such schedule.
    pub async fn set_enabled(&self, name: &str, enabled: bool) -> Result<bool, ScheduleError> {
        let got = match self.client.get_schedule().name(name).send().await {
            Ok(got) => got,
            Err(e) if is_not_found(&e) => return Ok(false),
            Err(e) => return Err(err(name, "reading", &e)),
        };
        let (Some(target), Some(window)) = (got.target, got.flexible_time_window) else {
            return Err(ScheduleError {
                name: name.to_string(),
                what: "reading",
                reason: "the schedule has no target or time window".into(),
            });
        };
        let state = if enabled {
            ScheduleState::Enabled
        } else {
            ScheduleState::Disabled
        };
        self.update(name, target, window, state).await?;
        Ok(true)
    }

    /// `ENABLED` or `DISABLED`; `None` when there is no such schedule.
    pub async fn state(&self, name: &str) -> Result<Option<String>, ScheduleError> {
        match self.client.get_schedule().name(name).send().await {
            Ok(got) => Ok(Some(
                got.state
                    .map(|s| s.as_str().to_string())
                    .unwrap_or_else(|| "ENABLED".into()),
            )),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(err(name, "reading", &e)),
        }
    }

    /// Delete the schedule; `false` when there was none.
    pub async fn delete(&self, name: &str) -> Result<bool, ScheduleError> {
        match self.client.delete_schedule().name(name).send().await {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(err(name, "deleting", &e)),
        }
    }
}

fn is_not_found<E: aws_sdk_scheduler::error::ProvideErrorMetadata, R>(
    e: &aws_sdk_scheduler::error::SdkError<E, R>,
) -> bool {
    e.as_service_error()
        .and_then(|s| s.code())
        .is_some_and(|c| c == "ResourceNotFoundException")
}
