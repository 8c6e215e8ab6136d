//! `skein bench ...`: benchmarks as commands that print figures, a file
//! each (`codec.rs`, `nexmark.rs`, `state.rs`; `skein bench lambda` is
//! `lambda/bench.rs`), and what they share (`measure.rs`). Each run
//! measures its own baseline; times are medians of repeated runs.

pub mod codec;
mod formats;
pub mod measure;
pub mod nexmark;
pub mod rescale;
pub mod state;

use anyhow::Result;
use clap::Subcommand;

use codec::CodecArgs;
use nexmark::NexmarkBenchArgs;
use state::StateBenchArgs;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Payload codec throughput, bytes on the wire per NEXMark bid, source
    /// records decoded per second per format (JSON, Avro, Protobuf), and
    /// invocations/s of the in-process runtime.
    Codec(CodecArgs),
    /// NEXMark queries: events/s per core, generation included (as Flink's
    /// nexmark reports). Pin to one core: `taskset -c 0 skein bench nexmark`.
    Nexmark(NexmarkBenchArgs),
    /// Durable state: NEXMark q5, q7, q8 with checkpoints off and on (cost
    /// ratio, checkpoint bytes per epoch).
    State(StateBenchArgs),
    /// Rescaling: the epochs that change a group's size while an updating
    /// aggregate holds about a million keys, against the same epochs
    /// without a rescale.
    Rescale(rescale::RescaleBenchArgs),
    /// Lambda backend: query launch time and per-hop invocation overhead,
    /// or (--exchange) payloads vs S3 between two functions.
    Lambda(crate::lambda::bench::BenchLambdaArgs),
}

pub async fn bench(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Codec(args) => codec::codec(args).await,
        BenchCommand::Nexmark(args) => nexmark::nexmark(args).await,
        BenchCommand::Lambda(args) => crate::lambda::bench::bench(args).await,
        BenchCommand::State(args) => state::state(args).await,
        BenchCommand::Rescale(args) => rescale::rescale(args).await,
    }
}

