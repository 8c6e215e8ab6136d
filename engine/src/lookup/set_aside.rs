//! A function's side output for rows a lookup join set aside: the join
//! (running under the function's task context) pushes its rows without a
//! match here, and the function sends them to their stream table's
//! dead-letter destination before the epoch's output leaves. Each run of a
//! plan gets its own, so epochs run side by side do not mix their rows.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use sha2::{Digest, Sha256};

use super::LOOKUP_MISSES_SET_ASIDE;
use super::exec::LookupHandle;
use crate::dead_letter::{DeadLetter, rows_as_json};
use crate::error::Result;
use crate::payload::SourceOffset;

/// Rows without a match of one lookup join.
struct Missed {
    handle: Arc<LookupHandle>,
    /// The stream side's key column, as the letters name it.
    key_name: String,
    rows: Vec<RecordBatch>,
}

/// The rows the lookup joins of one run of a plan set aside.
#[derive(Default)]
pub struct SetAside {
    /// Per join (its handle's address), in the order joins first missed.
    missed: Mutex<Vec<Missed>>,
}

impl std::fmt::Debug for SetAside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SetAside")
    }
}

impl SetAside {
    /// Set aside `rows` of the join behind `handle`.
    pub fn push(&self, handle: Arc<LookupHandle>, key_name: String, rows: RecordBatch) {
        let mut missed = self.missed.lock().expect("set-aside rows");
        match missed.iter_mut().find(|m| Arc::ptr_eq(&m.handle, &handle)) {
            Some(m) => m.rows.push(rows),
            None => missed.push(Missed {
                handle,
                key_name,
                rows: vec![rows],
            }),
        }
    }

    /// Send what was set aside (by the run of `epoch` in `function`) to each
    /// join's dead-letter destination. Each letter's key is the same when
    /// the epoch is run again.
    pub async fn send(&self, function: &str, epoch: u64, offsets: &[SourceOffset]) -> Result<()> {
        let missed = std::mem::take(&mut *self.missed.lock().expect("set-aside rows"));
        for m in missed {
            let Some(dlq) = &m.handle.dead_letters else {
                continue;
            };
            let letters = letters(&m, function, epoch, offsets)?;
            if letters.is_empty() {
                continue;
            }
            dlq.send(&letters).await?;
            LOOKUP_MISSES_SET_ASIDE.fetch_add(letters.len() as u64, Ordering::Relaxed);
            let table = &m.handle.spec.table;
            tracing::debug!(function, epoch, rows = letters.len(), %table, "rows without a match sent to dead letters");
        }
        Ok(())
    }
}

/// The dead letters of one join's rows without a match.
fn letters(
    m: &Missed,
    function: &str,
    epoch: u64,
    offsets: &[SourceOffset],
) -> Result<Vec<DeadLetter>> {
    let spec = &m.handle.spec;
    let Some((stream, _)) = &spec.letters_to else {
        return Ok(vec![]);
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut letters = vec![];
    for batch in &m.rows {
        let keys = cast(batch.column(spec.stream_key), &DataType::Utf8)?;
        let keys = keys.as_string::<i32>();
        for (i, row) in rows_as_json(batch)?.into_iter().enumerate() {
            let reason = if keys.is_valid(i) {
                format!(
                    "no row in lookup table {} for {} {:?}",
                    spec.table,
                    m.key_name,
                    keys.value(i)
                )
            } else {
                format!(
                    "{} is NULL: no row in lookup table {}",
                    m.key_name, spec.table
                )
            };
            // Equal rows of one epoch are told apart by their occurrence,
            // so the keys do not depend on the order the rows came in.
            let n = seen.entry(row.clone()).or_default();
            *n += 1;
            let digest = hex::encode(&Sha256::digest(row.as_bytes())[..8]);
            letters.push(DeadLetter {
                table: stream.clone(),
                reason,
                window: None,
                key: format!(
                    "{stream}/no-match/{}/{function}/{epoch}/{digest}-{n}",
                    spec.table
                ),
                row,
                offsets: offsets.to_vec(),
            });
        }
    }
    Ok(letters)
}
