//! Event time on the real Kafka, checked against references computed
//! without the engine:
//! * tumbling, sliding and session windows over uneven partitions, idle
//!   partitions and watermarks (`windows.rs`);
//! * NEXMark q5, q7 and q8 published with `skein gen` (`nexmark.rs`);
//! * late rows dropped or dead-lettered, an empty topic, a topic ending in
//!   transaction markers, bad event-time options (`late_data.rs`).

#[path = "../common/mod.rs"]
mod common;

mod late_data;
mod nexmark;
mod windows;
