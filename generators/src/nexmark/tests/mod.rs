//! Checks against the definitions of the reference generators (nexmark/nexmark and
//! Apache Beam): proportions, id spaces, value domains, timing; plus determinism,
//! splitting, and the agreement of the Arrow and JSON outputs with the events.

mod outputs;
mod stream;

use super::*;

pub(super) fn config(max_events: u64) -> NexmarkConfig {
    NexmarkConfig {
        seed: 42,
        max_events: Some(max_events),
        ..NexmarkConfig::default()
    }
}

/// (event number, event) for every event of `generator`.
pub(super) fn numbered(mut generator: NexmarkGenerator) -> Vec<(u64, Event)> {
    let mut out = Vec::new();
    while let Some(n) = generator.next_event_number() {
        let event = generator.next_event().unwrap().to_owned_event();
        out.push((n, event));
    }
    out
}

pub(super) fn events(max_events: u64) -> Vec<Event> {
    NexmarkGenerator::new(config(max_events))
        .unwrap()
        .into_events()
        .collect()
}
