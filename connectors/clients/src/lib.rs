//! skein-clients: the client setup Skein's sources (skein-connectors) and
//! sinks (skein-sinks) share, so both sides of a table talk to a system
//! the same way:
//! * [`kafka`]: a table's librdkafka properties for a consumer or a
//!   producer ([`kafka::KafkaRole`]);
//! * [`redis`]: one connection that waits out outages (the Redis sink and
//!   lookup tables);
//! * [`kinesis`]: the Kinesis client;
//! * [`store`]: S3 from the `AWS_*` environment;
//! * [`error`]: [`error::ConnectorError`], the one error of sources and sinks.
//!
//! Each system module also names its `STORED AS` kind.

pub mod error;
pub mod kafka;
pub mod kinesis;
pub mod redis;
pub mod store;
