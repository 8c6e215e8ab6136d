//! Smoke tests, one binary: each real service the suite needs (Kafka, Redis,
//! and ministack's S3, Kinesis and Lambda) answers its own client. They fail
//! loudly, naming the command that starts the service, when one is missing.

#[path = "../common/mod.rs"]
mod common;

mod kafka;
mod kinesis;
mod lambda;
mod redis_client;
mod s3;
