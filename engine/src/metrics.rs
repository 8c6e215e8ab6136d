//! What a running query measures, through the `metrics` facade: nothing is
//! recorded until a binary installs a recorder (`skein run --metrics ADDR`
//! serves them as Prometheus text). Names and labels are listed in
//! docs/metrics.md.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::{counter, gauge, histogram};

use crate::source::PartitionProgress;

/// Records a source instance read from each partition in one pull, and how
/// far behind the partition's end it still is.
pub fn source_pull(
    table: &str,
    progress: &[PartitionProgress],
    rows: impl Fn(&PartitionProgress) -> u64,
) {
    for p in progress {
        let labels = [
            ("table", table.to_string()),
            ("partition", p.partition.clone()),
        ];
        counter!("skein_source_records_total", &labels).increment(rows(p));
        if let Some(lag) = p.lag {
            gauge!("skein_source_lag_records", &labels).set(lag as f64);
        }
    }
}

/// How far a stage's watermark is behind the wall clock.
pub fn watermark(stage: &str, watermark_ms: Option<i64>) {
    let Some(w) = watermark_ms.filter(|w| *w > i64::MIN) else {
        return;
    };
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    gauge!("skein_watermark_delay_seconds", "stage" => stage.to_string())
        .set(now_ms.saturating_sub(w) as f64 / 1000.0);
}

/// One invocation sent to a stage, with its payload size.
pub fn invocation(to_stage: u32, bytes: usize) {
    let stage = to_stage.to_string();
    counter!("skein_invocations_total", "stage" => stage.clone()).increment(1);
    counter!("skein_payload_bytes_total", "stage" => stage).increment(bytes as u64);
}

/// Bytes of open-window state one member holds.
pub fn state_bytes(function: &str, bytes: usize) {
    gauge!("skein_state_bytes", "function" => function.to_string()).set(bytes as f64);
}

/// Rows an updating stage's member keeps (its inputs, by key).
pub fn state_rows(stage: &str, member: u32, rows: usize) {
    gauge!("skein_state_rows", "stage" => stage.to_string(), "member" => member.to_string())
        .set(rows as f64);
}

/// Of those, the groups an aggregate moved to local disk (`--state-memory`).
pub fn state_spilled_rows(stage: &str, member: u32, rows: usize) {
    gauge!("skein_state_spilled_rows", "stage" => stage.to_string(), "member" => member.to_string())
        .set(rows as f64);
}

/// Distinct values an aggregate moved to local disk from groups in memory
/// (`--state-memory`).
pub fn state_spilled_values(stage: &str, member: u32, values: usize) {
    gauge!("skein_state_spilled_values", "stage" => stage.to_string(), "member" => member.to_string())
        .set(values as f64);
}

/// Bytes of the last state a member wrote to the checkpoint store.
pub fn checkpoint_bytes(function: &str, bytes: usize) {
    gauge!("skein_checkpoint_bytes", "function" => function.to_string()).set(bytes as f64);
}

/// One object written to the checkpoint store (member state, offsets log
/// entry, epoch plan or commit): how long the write took and its bytes.
pub fn checkpoint_write(bytes: usize, took: Duration) {
    histogram!("skein_checkpoint_write_seconds").record(took.as_secs_f64());
    counter!("skein_checkpoint_writes_total").increment(1);
    counter!("skein_checkpoint_written_bytes_total").increment(bytes as u64);
}

/// One epoch's commit: from the completeness check to the commit marker
/// and the clean-up after it.
pub fn commit(took: Duration) {
    histogram!("skein_commit_duration_seconds").record(took.as_secs_f64());
}

/// Rows set aside as late, per table.
pub fn late_rows(table: &str, rows: u64) {
    counter!("skein_late_rows_total", "table" => table.to_string()).increment(rows);
}

/// A write to the sink: its rows, or its failure.
pub fn sink_write(sink: &str, rows: usize, ok: bool) {
    if ok {
        counter!("skein_sink_rows_total", "sink" => sink.to_string()).increment(rows as u64);
        counter!("skein_sink_writes_total", "sink" => sink.to_string()).increment(1);
    } else {
        counter!("skein_sink_errors_total", "sink" => sink.to_string()).increment(1);
    }
}

/// Where a sink stands: failed attempts in a row (0 while it writes) and
/// when a write last succeeded.
pub fn sink_health(sink: &str, consecutive_failures: u64, last_success_ms: Option<i64>) {
    gauge!("skein_sink_consecutive_failures", "sink" => sink.to_string())
        .set(consecutive_failures as f64);
    if let Some(ms) = last_success_ms {
        gauge!("skein_sink_last_success_timestamp_seconds", "sink" => sink.to_string())
            .set(ms as f64 / 1000.0);
    }
}

/// Keys of a lookup table answered from its cache.
pub fn lookup_cache_hits(table: &str, keys: usize) {
    counter!("skein_lookup_cache_hits_total", "table" => table.to_string()).increment(keys as u64);
}

/// One batched request to a lookup table (for Redis an `MGET`, or a
/// pipeline of `HMGET`s): the keys it asked for (the cache's misses), those
/// the table had no row for, and how long it took.
pub fn lookup_request(table: &str, keys: usize, not_found: usize, took: Duration) {
    let table = table.to_string();
    counter!("skein_lookup_requests_total", "table" => table.clone()).increment(1);
    histogram!("skein_lookup_request_seconds", "table" => table.clone()).record(took.as_secs_f64());
    counter!("skein_lookup_cache_misses_total", "table" => table.clone()).increment(keys as u64);
    counter!("skein_lookup_not_found_total", "table" => table).increment(not_found as u64);
}

/// Records a source could not decode, per table.
pub fn dead_letters(table: &str, records: u64) {
    counter!("skein_dead_letters_total", "table" => table.to_string()).increment(records);
}

/// One epoch of the driver, from trigger to quiet.
pub fn epoch(took: Duration, events: u64) {
    histogram!("skein_epoch_duration_seconds").record(took.as_secs_f64());
    counter!("skein_epochs_total").increment(1);
    counter!("skein_events_total").increment(events);
}

/// A function group's size, set when it changes.
pub fn rescale(stage: u32, members: u32) {
    metrics::gauge!("skein_group_members", "stage" => stage.to_string()).set(f64::from(members));
    metrics::counter!("skein_rescales_total", "stage" => stage.to_string()).increment(1);
}
