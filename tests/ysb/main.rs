//! YSB on the real Kafka and Redis, through the `skein` binary:
//! * `ysb setup / generate / run / check`: exact counts, dead letters,
//!   SIGKILLs, a run while a producer writes (`end_to_end.rs`);
//! * YSB as YSB runs it: `skein gen ysb`, `ysb check` on a live topic,
//!   `ysb bench --rate` (`live.rs`);
//! * the Kafka broker stopped mid-run (`kafka_outage.rs`);
//! * Redis stopped mid-run (`redis_outage.rs`).

#[path = "../common/mod.rs"]
mod common;

mod end_to_end;
mod kafka_outage;
mod live;
mod redis_outage;
