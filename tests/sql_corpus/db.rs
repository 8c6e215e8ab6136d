//! One corpus file run against Skein: its tables are Kafka topics of
//! Debezium change events, and each query runs as `skein run
//! --until-drained` writing a Kafka topic, whose events replayed into a
//! table are the query's answer.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use skein::report::Report;
use skein_engine::epochs::Stopped;
use sqllogictest::{DBOutput, DefaultColumnType};

use super::changes::{Done, Tables};
use super::output;
use crate::common;
use crate::common::kafka::{PartitionWriter, create_topic};
use crate::common::kills::{committed_epoch, sigkill};

/// About how many epochs a split query's largest table takes.
const EPOCHS_PER_QUERY: usize = 6;

/// How a file's queries read their input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// All of it in one pull.
    OneEpoch,
    /// About six epochs per query: a table's changes arrive, change and go
    /// away over several epochs.
    Split,
    /// As `Split`, checkpointed, and killed with SIGKILL once it committed
    /// an epoch; run again to the end.
    Killed,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::OneEpoch => "one-epoch",
            Variant::Split => "split",
            Variant::Killed => "sigkill",
        }
    }

    /// Records per pull of a table whose topic holds `events`: all of them,
    /// or about a sixth, so that any table's changes arrive over six epochs
    /// or so whatever its size (one record per pull would cost an epoch per
    /// record, and the corpus's time with it).
    fn pull(self, events: usize) -> usize {
        match self {
            Variant::OneEpoch => events.max(1),
            Variant::Split | Variant::Killed => events.div_ceil(EPOCHS_PER_QUERY).max(1),
        }
    }

    /// Exactly once where a run is killed; a run that is not needs no
    /// transactions (each costs the producer's half-second initialisation).
    fn delivery(self) -> &'static str {
        match self {
            Variant::Killed => "exactly-once",
            Variant::OneEpoch | Variant::Split => "at-least-once",
        }
    }

    /// Members per stage: several in one epoch, one across epochs (an
    /// updating stage then keeps its input under no key: a path of its
    /// own), two through kills.
    fn group_size(self) -> usize {
        match self {
            Variant::OneEpoch => 3,
            Variant::Split => 1,
            Variant::Killed => 2,
        }
    }
}

/// What a file's run did, besides its answers.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub queries: usize,
    /// SIGKILLs that landed on a run that had committed an epoch.
    pub kills: usize,
}

#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

pub struct SkeinDb {
    variant: Variant,
    /// Unique per file and variant: the prefix of its topics.
    prefix: String,
    brokers: String,
    dir: PathBuf,
    tables: Tables,
    /// Per table: its topic, writer and how many events it holds.
    topics: std::collections::BTreeMap<String, (String, PartitionWriter, usize)>,
    views: Vec<(String, String)>,
    runtime: tokio::runtime::Runtime,
    pub tally: std::sync::Arc<std::sync::Mutex<Tally>>,
}

impl SkeinDb {
    pub fn new(
        file: &str,
        variant: Variant,
        tally: std::sync::Arc<std::sync::Mutex<Tally>>,
    ) -> Self {
        let prefix = common::unique_name(&format!("slt-{file}-{}", variant.name()));
        let dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        SkeinDb {
            variant,
            prefix,
            brokers: common::kafka_brokers(),
            dir,
            tables: Tables::new(),
            topics: Default::default(),
            views: vec![],
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime"),
            tally,
        }
    }

    fn statement(&mut self, sql: &str) -> Result<(), String> {
        let done = self.runtime.block_on(self.tables.apply(sql))?;
        match done {
            Done::Created(name) => {
                let topic = format!("{}-{name}", self.prefix);
                create_topic(&self.brokers, &topic, 1);
                let writer = PartitionWriter::new(&self.brokers, &topic);
                self.topics.insert(name, (topic, writer, 0));
            }
            Done::Changed(name, events) => {
                let (_, writer, count) = self.topics.get_mut(&name).expect("a declared table");
                *count += events.len();
                for e in events {
                    writer.send(0, &e.to_string());
                }
                writer.flush();
            }
            Done::View(name, query) => self.views.push((name, query)),
        }
        Ok(())
    }

    /// The query with the file's views before it as CTEs.
    fn with_views(&self, query: &str) -> String {
        if self.views.is_empty() {
            return query.to_string();
        }
        let ctes = self
            .views
            .iter()
            .map(|(name, q)| format!("{name} AS ({q})"))
            .collect::<Vec<_>>()
            .join(", ");
        let trimmed = query.trim_start();
        match trimmed.get(..5) {
            Some(w) if w.eq_ignore_ascii_case("with ") => format!("WITH {ctes}, {}", &trimmed[5..]),
            _ => format!("WITH {ctes} {trimmed}"),
        }
    }

    fn table_ddl(&self) -> String {
        let mut ddl = String::new();
        for (name, (topic, _, events)) in &self.topics {
            ddl.push_str(&format!(
                "CREATE EXTERNAL TABLE {name} ({}) STORED AS KAFKA LOCATION '{topic}' OPTIONS \
                 ('bootstrap.servers' '{}', 'format' 'debezium-json', 'startup' 'earliest', \
                 'max.records.per.pull' '{}');\n",
                self.tables.tables[name].columns,
                self.brokers,
                self.variant.pull(*events)
            ));
        }
        ddl
    }

    fn query(&mut self, sql: &str) -> Result<Vec<Vec<String>>, String> {
        let n = {
            let mut t = self.tally.lock().unwrap();
            t.queries += 1;
            t.queries
        };
        let query = self.with_views(sql.trim().trim_end_matches(';'));
        // The result's columns, for the output table.
        let plain = self.dir.join(format!("q{n}-plain.sql"));
        std::fs::write(&plain, format!("{}{query};\n", self.table_ddl())).unwrap();
        let (ok, stdout, stderr) = common::skein(&["explain", plain.to_str().unwrap(), "--json"]);
        if !ok {
            return Err(refusal(&stderr));
        }
        let plan: Value = serde_json::from_str(stdout.trim())
            .map_err(|e| format!("skein explain --json: {e}: {stdout}"))?;
        let columns = output::Columns::of(&plan)?;
        let out = format!("{}-out{n}", self.prefix);
        create_topic(&self.brokers, &out, 1);
        let file = self.dir.join(format!("q{n}.sql"));
        std::fs::write(
            &file,
            format!(
                "{}CREATE EXTERNAL TABLE skein_corpus_out ({}) STORED AS KAFKA LOCATION '{out}' \
                 OPTIONS ('bootstrap.servers' '{}', 'format' 'debezium-json', 'delivery' '{}');\n\
                 INSERT INTO skein_corpus_out {query};\n",
                self.table_ddl(),
                columns.ddl(),
                self.brokers,
                self.variant.delivery(),
            ),
        )
        .unwrap();
        self.run(&file, n)?;
        output::table(&self.brokers, &out, &columns)
    }

    /// `skein run` of `file` to the end of its topics, as the variant wants.
    fn run(&self, file: &std::path::Path, n: usize) -> Result<(), String> {
        let group = self.variant.group_size().to_string();
        let checkpoints = self.dir.join(format!("q{n}-checkpoints"));
        let mut args: Vec<String> = vec![
            "run".into(),
            file.to_str().unwrap().into(),
            "--until-drained".into(),
            "--interval".into(),
            "10ms".into(),
            "--group-size".into(),
            group,
            "--json".into(),
        ];
        match self.variant {
            Variant::OneEpoch | Variant::Split => args.push("--no-checkpoint".into()),
            Variant::Killed => {
                args.push("--checkpoint-dir".into());
                args.push(checkpoints.to_str().unwrap().into());
            }
        }
        if self.variant == Variant::Killed {
            let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("spawning skein: {e}"))?;
            let started = Instant::now();
            loop {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                if committed_epoch(&checkpoints).is_some() {
                    let (landed, _) = sigkill(&mut child);
                    if landed {
                        self.tally.lock().unwrap().kills += 1;
                    }
                    break;
                }
                if started.elapsed() > Duration::from_secs(120) {
                    let _ = sigkill(&mut child);
                    return Err("the first run committed nothing in 120 s".into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stdout, stderr) = common::skein(&refs);
        if !ok {
            return Err(refusal(&stderr));
        }
        let report: Report = serde_json::from_str(stdout.trim())
            .map_err(|e| format!("skein run --json: {e}: {stdout}"))?;
        if report.stopped != Stopped::Bound {
            return Err(format!(
                "the run did not reach the end of its input: {report:?}"
            ));
        }
        Ok(())
    }
}

/// The line of a failed run's standard error that says why.
fn refusal(stderr: &str) -> String {
    stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("Error"))
        .unwrap_or(stderr.trim())
        .to_string()
}

impl sqllogictest::DB for SkeinDb {
    type Error = Refused;
    type ColumnType = DefaultColumnType;

    fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, Refused> {
        let head = sql.trim_start().to_ascii_lowercase();
        let is_query = ["select", "with", "values", "("]
            .iter()
            .any(|k| head.starts_with(k));
        if is_query {
            let rows = self.query(sql).map_err(Refused)?;
            let width = rows.first().map_or(1, Vec::len);
            Ok(DBOutput::Rows {
                types: vec![DefaultColumnType::Any; width],
                rows,
            })
        } else {
            self.statement(sql).map_err(Refused)?;
            Ok(DBOutput::StatementComplete(0))
        }
    }

    fn engine_name(&self) -> &str {
        "skein"
    }
}
