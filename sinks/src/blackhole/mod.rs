//! The blackhole sink: `INSERT INTO` a `STORED AS BLACKHOLE` table drops
//! every row and only counts what it was given, so a benchmark measures the
//! query rather than where its results go.
//!
//! DataFusion's parser requires a LOCATION; a blackhole ignores it. The
//! table takes no options of its own: any but the engine-wide ones is an
//! error naming it, so a misspelt `STORED AS` kind's options do not pass
//! quietly.
//!
//! Counts are kept by the factory (so by the catalog that registered it),
//! per query code and (epoch, member), so a replayed write replaces its
//! count instead of adding to it; the run reads them as the factory's
//! summary (`SinkFactory::take_summary`). Only the latest [`REPLAY_HORIZON`] epochs are kept
//! apart; older ones are added into one sum, so a standing query that runs
//! for months holds a fixed amount. Each write also logs its count at debug
//! level, which is what a function on another machine (Lambda) leaves behind.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use skein_engine::Result;
use skein_engine::catalog::TableOptions;
use skein_engine::sink::{Discarded, Sink, SinkCapabilities, SinkConfig, SinkFactory, SinkWrite};

/// The sink kind, as registered (and the table kind that declares one).
pub const KIND: &str = "BLACKHOLE";

/// Epochs whose counts are kept per write, so that a replay of one of them
/// replaces its count. A replay reruns the epochs after the last commit,
/// so this is far more than any checkpoint interval in use.
pub const REPLAY_HORIZON: u64 = 1024;

/// What one query's blackholes dropped.
#[derive(Default)]
struct QueryTally {
    /// (epoch, member) -> what that write dropped, for recent epochs.
    recent: BTreeMap<(u64, u32), Discarded>,
    /// Everything dropped in epochs older than those.
    older: Discarded,
}

impl QueryTally {
    fn record(&mut self, epoch: u64, member: u32, discarded: Discarded) {
        self.recent.insert((epoch, member), discarded);
        let newest = self.recent.last_key_value().map_or(0, |(k, _)| k.0);
        let keep_from = newest.saturating_sub(REPLAY_HORIZON - 1);
        while let Some(oldest) = self.recent.first_entry() {
            if oldest.key().0 >= keep_from {
                break;
            }
            self.older = self.older.plus(oldest.remove());
        }
    }

    fn total(&self) -> Discarded {
        self.recent.values().fold(self.older, |sum, &d| sum.plus(d))
    }
}

/// Query code -> what its blackholes dropped.
type Tally = HashMap<String, QueryTally>;

/// Makes blackholes; what they drop is counted here, per query.
#[derive(Default)]
pub struct BlackholeSinkFactory {
    tally: Arc<Mutex<Tally>>,
}

impl SinkFactory for BlackholeSinkFactory {
    /// None of its own: the catalog refuses any but the engine-wide ones
    /// when the table is declared.
    fn options(&self) -> TableOptions {
        TableOptions::only(&[])
    }

    fn create(&self, _config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        Ok(Arc::new(BlackholeSink {
            tally: self.tally.clone(),
        }))
    }

    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities {
            discards_rows: true,
            ..Default::default()
        }
    }

    /// What every blackhole of `query` dropped so far; forgets it, so a
    /// later run of the same query starts from zero.
    fn take_summary(&self, query: &str) -> Option<Discarded> {
        let tally = self.tally.lock().expect("blackhole tally").remove(query);
        Some(tally.unwrap_or_default().total())
    }

    /// It counts whatever comes, changes included.
    fn takes_updates(&self, _config: &SinkConfig) -> std::result::Result<(), String> {
        Ok(())
    }
}

struct BlackholeSink {
    tally: Arc<Mutex<Tally>>,
}

#[async_trait]
impl Sink for BlackholeSink {
    async fn write(&self, write: SinkWrite<'_>) -> Result<()> {
        let (retract, insert) = write.rows.by_kind();
        let nonempty = retract.iter().chain(insert).filter(|b| b.num_rows() > 0);
        let discarded = Discarded {
            rows: nonempty.clone().map(|b| b.num_rows() as u64).sum(),
            batches: nonempty.count() as u64,
        };
        tracing::debug!(
            query = write.query,
            epoch = write.epoch,
            member = write.member,
            rows = discarded.rows,
            batches = discarded.batches,
            "blackhole discarded"
        );
        self.tally
            .lock()
            .expect("blackhole tally")
            .entry(write.query.to_string())
            .or_default()
            .record(write.epoch, write.member, discarded);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use skein_engine::sink::SinkRows;

    fn config(options: &[(&str, &str)]) -> SinkConfig {
        SinkConfig {
            kind: KIND.into(),
            location: "void".into(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn batch(rows: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(0..rows))],
        )
        .unwrap()
    }

    fn take(factory: &BlackholeSinkFactory, query: &str) -> Discarded {
        factory.take_summary(query).unwrap_or_default()
    }

    async fn write(sink: &Arc<dyn Sink>, query: &str, epoch: u64, member: u32, rows: &[i64]) {
        let batches: Vec<RecordBatch> = rows.iter().map(|&n| batch(n)).collect();
        sink.write(SinkWrite {
            query,
            run: "",
            epoch,
            member,
            schema: batch(0).schema(),
            rows: SinkRows::Append(batches),
            offsets: vec![],
            last: false,
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn counts_rows_and_batches_per_query_and_a_replay_replaces() {
        let factory = BlackholeSinkFactory::default();
        let sink = factory.create(&config(&[])).unwrap();
        write(&sink, "q-count", 0, 0, &[3, 0, 4]).await;
        write(&sink, "q-count", 0, 1, &[5]).await;
        // The same (epoch, member) again: a replay, not more rows.
        write(&sink, "q-count", 0, 1, &[5]).await;
        write(&sink, "q-other", 0, 0, &[100]).await;
        assert_eq!(
            take(&factory, "q-count"),
            Discarded {
                rows: 12,
                batches: 3
            }
        );
        assert_eq!(
            take(&factory, "q-count"),
            Discarded::default(),
            "take forgets"
        );
        assert_eq!(
            take(&factory, "q-other"),
            Discarded {
                rows: 100,
                batches: 1
            }
        );
    }

    #[tokio::test]
    async fn a_long_run_keeps_a_bounded_tally_and_counts_every_row() {
        let factory = BlackholeSinkFactory::default();
        let sink = factory.create(&config(&[])).unwrap();
        let epochs = 3 * REPLAY_HORIZON;
        for epoch in 0..epochs {
            write(&sink, "q-long", epoch, 0, &[2]).await;
            write(&sink, "q-long", epoch, 1, &[1]).await;
        }
        // A replay of a recent epoch replaces its count.
        write(&sink, "q-long", epochs - 1, 1, &[1]).await;
        let kept = factory.tally.lock().unwrap()["q-long"].recent.len() as u64;
        assert_eq!(kept, 2 * REPLAY_HORIZON, "two members' latest epochs");
        assert_eq!(
            take(&factory, "q-long"),
            Discarded {
                rows: 3 * epochs,
                batches: 2 * epochs
            }
        );
    }

    #[test]
    fn any_option_of_its_own_is_an_error_naming_it() {
        let mut catalog = skein_engine::catalog::Catalog::default();
        catalog.register_sink(KIND, Arc::new(BlackholeSinkFactory::default()));
        let table = |options: &[(&str, &str)]| {
            catalog.check_options(&skein_engine::source::SourceConfig {
                kind: KIND.into(),
                location: "void".into(),
                options: options
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            })
        };
        let err = table(&[("rows", "1")]).expect_err("an option is refused");
        assert!(
            err.to_string()
                .contains("unknown option 'rows' for a BLACKHOLE table"),
            "{err}"
        );
        table(&[("emit", "updates")]).expect("an engine-wide option");
    }
}
