//! Kinesis event-source mappings: Lambda polls a stream and pushes its
//! records, a batch per shard at a time, to a query's source function.
//!
//! A `STORED AS KINESIS` table declared with `'mode' 'push'` is read this way
//! on Lambda: `skein deploy` maps the stream to the source stage's function,
//! which runs its stage on each batch (`StageFunction::run_pushed`), and
//! `skein destroy` removes the mapping with the functions.

use aws_sdk_lambda::types::{
    DestinationConfig, EventSourcePosition, FunctionResponseType, OnFailure,
};

/// The table option that asks for push delivery, and its value.
pub const MODE_OPTION: &str = "mode";
pub const MODE_PUSH: &str = "push";

#[derive(Debug, thiserror::Error)]
pub enum EsmError {
    #[error("kinesis stream {stream}: {reason}")]
    Stream { stream: String, reason: String },
    #[error("event-source mapping of {function}: {reason}")]
    Mapping { function: String, reason: String },
}

/// The stream's ARN, as the mapping needs it.
pub async fn stream_arn(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
) -> Result<String, EsmError> {
    let summary = kinesis
        .describe_stream_summary()
        .stream_name(stream)
        .send()
        .await
        .map_err(|e| EsmError::Stream {
            stream: stream.to_string(),
            reason: crate::error_chain(&e),
        })?;
    summary
        .stream_description_summary()
        .map(|s| s.stream_arn().to_string())
        .ok_or_else(|| EsmError::Stream {
            stream: stream.to_string(),
            reason: "DescribeStreamSummary returned no description".into(),
        })
}

/// How a mapping delivers and gives up: the function reports the first
/// record it could not take (`ReportBatchItemFailures`), a failing batch
/// is halved until the record is alone, and after `max_retries` retries
/// or `max_record_age_s` the record's batch goes to the on-failure
/// destination and the shard moves on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingSettings {
    pub batch_size: i32,
    pub max_retries: i32,
    pub max_record_age_s: i32,
    /// An S3 bucket, SQS queue or SNS topic ARN.
    pub on_failure: Option<String>,
}

impl MappingSettings {
    /// The defaults, with the deployment store's bucket (`s3://bucket/...`)
    /// as the on-failure destination.
    pub fn for_store(store_url: &str) -> Self {
        let bucket = store_url
            .strip_prefix("s3://")
            .and_then(|rest| rest.split('/').next())
            .filter(|b| !b.is_empty());
        MappingSettings {
            batch_size: 500,
            max_retries: 3,
            max_record_age_s: 3600,
            on_failure: bucket.map(|b| format!("arn:aws:s3:::{b}")),
        }
    }
}

/// Maps `stream_arn` to `function` unless a mapping exists already; returns
/// the mapping's UUID. New mappings start at the stream's trim horizon.
pub async fn map_stream(
    lambda: &aws_sdk_lambda::Client,
    stream_arn: &str,
    function: &str,
    settings: &MappingSettings,
) -> Result<String, EsmError> {
    let err = |reason: String| EsmError::Mapping {
        function: function.to_string(),
        reason,
    };
    let existing = lambda
        .list_event_source_mappings()
        .function_name(function)
        .event_source_arn(stream_arn)
        .send()
        .await
        .map_err(|e| err(crate::error_chain(&e)))?;
    if let Some(uuid) = existing
        .event_source_mappings()
        .iter()
        .find_map(|m| m.uuid())
    {
        return Ok(uuid.to_string());
    }
    let mut create = lambda
        .create_event_source_mapping()
        .function_name(function)
        .event_source_arn(stream_arn)
        .starting_position(EventSourcePosition::TrimHorizon)
        .batch_size(settings.batch_size)
        .function_response_types(FunctionResponseType::ReportBatchItemFailures)
        .bisect_batch_on_function_error(true)
        .maximum_retry_attempts(settings.max_retries)
        .maximum_record_age_in_seconds(settings.max_record_age_s);
    if let Some(arn) = &settings.on_failure {
        create = create.destination_config(
            DestinationConfig::builder()
                .on_failure(OnFailure::builder().destination(arn).build())
                .build(),
        );
    }
    let created = create
        .send()
        .await
        .map_err(|e| err(crate::error_chain(&e)))?;
    created
        .uuid()
        .map(str::to_string)
        .ok_or_else(|| err("CreateEventSourceMapping returned no UUID".into()))
}

/// Deletes every event-source mapping of `function`; returns how many.
pub async fn unmap_function(
    lambda: &aws_sdk_lambda::Client,
    function: &str,
) -> Result<usize, EsmError> {
    let err = |reason: String| EsmError::Mapping {
        function: function.to_string(),
        reason,
    };
    let listed = lambda
        .list_event_source_mappings()
        .function_name(function)
        .send()
        .await
        .map_err(|e| err(crate::error_chain(&e)))?;
    let mut n = 0;
    for uuid in listed
        .event_source_mappings()
        .iter()
        .filter_map(|m| m.uuid())
    {
        lambda
            .delete_event_source_mapping()
            .uuid(uuid)
            .send()
            .await
            .map_err(|e| err(crate::error_chain(&e)))?;
        n += 1;
    }
    Ok(n)
}
