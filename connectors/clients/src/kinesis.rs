//! The Kinesis client both directions use: the standard AWS configuration
//! chain (honouring `AWS_ENDPOINT_URL`).

/// The `STORED AS` name of a Kinesis table.
pub const KIND: &str = "KINESIS";

/// A Kinesis client from the environment.
pub async fn client() -> aws_sdk_kinesis::Client {
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    aws_sdk_kinesis::Client::new(&config)
}
