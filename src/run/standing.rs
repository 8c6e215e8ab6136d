//! Standing queries in-process: `skein run` with no bound over a live
//! source runs until SIGINT or SIGTERM. The engine's epoch loop does the
//! stopping ([`StopAfter::Signalled`]); this module only wires the OS
//! signals to it.

use std::time::Duration;

use anyhow::{Context, Result};
use skein_engine::epochs::{StopAfter, StopSignal, stop_signal};
use tokio::signal::unix::{SignalKind, signal};

/// Exit status after a second signal: the run did not finish its epoch.
const INTERRUPTED: i32 = 130;

/// A standing run: an epoch every `interval` until the first SIGINT or
/// SIGTERM, which finishes the epoch in flight and commits it. A second
/// signal exits at once (the last commit makes that safe).
pub fn until_signalled(interval: Duration) -> Result<(StopAfter, StopSignal)> {
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    let (handle, signal) = stop_signal();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        eprintln!(
            "{name}: finishing and committing the epoch in flight \
             (a second signal exits at once)"
        );
        handle.stop();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!("second signal: exiting now; the next run resumes after the last commit");
        std::process::exit(INTERRUPTED);
    });
    let stop = StopAfter::Signalled {
        interval,
        signal: signal.clone(),
    };
    Ok((stop, signal))
}
