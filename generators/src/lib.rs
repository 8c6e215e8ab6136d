//! Event generators for the two benchmarks streaming engines are judged by.
//!
//! * [`nexmark`]: the NEXMark online-auction stream (people, auctions, bids), compatible
//!   with the nexmark/nexmark (Flink) and Apache Beam generators.
//! * [`ysb`]: the Yahoo Streaming Benchmark ad-event stream, its campaign/ad mapping
//!   and the ground truth of view counts per campaign and 10 s window.
//!
//! Both produce Arrow record batches directly (the fast path for in-process tables) and
//! JSON records (for publishing to Kafka or Kinesis). Both are deterministic for a seed
//! and splittable: instance `i` of `N` produces events `i, i + N, ...`, and the union of
//! the instances is exactly the single-instance stream.
//!
//! The generators are plain synchronous code that knows nothing of the engine (only the
//! `table` module plugs them in as engine sources); a benchmark
//! loop is `generator.next_batches(chunk)` (NEXMark) or `generator.next_batch(chunk, None)`
//! (YSB) until it returns `None`.

mod error;
pub mod nexmark;
mod rng;
mod slice;
pub mod table;
mod text;
pub mod ysb;

pub use error::{GeneratorError, Result};
pub use slice::Slice;
