//! `skein bench ...`: benchmarks as commands that print figures.
use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {}

pub async fn bench(cmd: BenchCommand) -> Result<()> {
    match cmd {}
}
