//! The catalog's option checks, with factories that show what they are given.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::*;
use crate::lookup::{
    DEFAULT_CACHE_SIZE, LookupRow, MissingPolicy, OPT_CACHE_SIZE, OPT_CACHE_TTL_MS, OPT_KEY_PREFIX,
    OPT_MISSING,
};

/// A source factory that fails with the options it was given, so tests
/// see the factory's view.
struct Fixed(TableOptions);

impl SourceFactory for Fixed {
    fn options(&self) -> TableOptions {
        self.0.clone()
    }
    fn create(&self, config: &SourceConfig, _schema: SchemaRef) -> Result<Arc<dyn Source>> {
        Err(EngineError::plan(format!("{:?}", config.options)))
    }
}

/// The same, for sinks.
struct FixedSink(TableOptions);

impl SinkFactory for FixedSink {
    fn options(&self) -> TableOptions {
        self.0.clone()
    }
    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        Err(EngineError::plan(format!("{:?}", config.options)))
    }
}

fn config(kind: &str, options: &[(&str, &str)]) -> SourceConfig {
    SourceConfig {
        kind: kind.into(),
        location: "t".into(),
        options: options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn sink(kind: &str, options: &[(&str, &str)]) -> SinkConfig {
    super::table::sink_config(&config(kind, options))
}

fn catalog() -> Catalog {
    let mut c = Catalog::default();
    c.register_source("PLAIN", Arc::new(Fixed(TableOptions::only(&["rate"]))));
    c.register_source(
        "DOTTED",
        Arc::new(Fixed(
            TableOptions::only(&["format"]).passing_dotted("client property"),
        )),
    );
    c.register_sink(
        "dotted",
        Arc::new(FixedSink(
            TableOptions::only(&["offsets.topic", "key", "format"])
                .passing_dotted("client property"),
        )),
    );
    c.register_sink(
        "WRITTEN",
        Arc::new(FixedSink(TableOptions::only(&["layout", "emit"]))),
    );
    c.add_backend_options("dotted", &["mode"]);
    c
}

fn empty() -> SchemaRef {
    Arc::new(Schema::empty())
}

#[test]
fn unknown_options_are_named_with_the_allowed_ones() {
    let c = catalog();
    let err = c
        .check_options(&config("PLAIN", &[("paralelism", "2")]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown option 'paralelism' for a PLAIN table"),
        "{err}"
    );
    assert!(
        err.contains("rate, event_time, lateness_ms, idle.timeout, late, epoch.interval"),
        "{err}"
    );
    assert!(
        !err.contains("emit,"),
        "a table that cannot be written: {err}"
    );
    assert!(
        c.check_options(&config("PLAIN", &[("rate", "1"), ("late", "drop")]))
            .is_ok()
    );
    // A dot passes only where the kind hands such options on.
    assert!(c.check_options(&config("PLAIN", &[("a.b", "1")])).is_err());
    assert!(c.check_options(&config("DOTTED", &[("a.b", "1")])).is_ok());
    let err = c
        .check_options(&config("DOTTED", &[("fromat", "json")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("format, key, mode, offsets.topic"), "{err}");
    assert!(
        err.contains("late, epoch.interval, state.ttl, emit.interval, emit"),
        "{err}"
    );
    assert!(
        err.contains("any client property (a name with a dot)"),
        "{err}"
    );
    let err = c
        .check_options(&config("WRITTEN", &[("event_time", "ts")]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown option 'event_time' for a WRITTEN table; it takes layout, emit, state.ttl, emit.interval"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
}

#[test]
fn each_factory_sees_only_its_own_options() {
    let c = catalog();
    let options = [
        ("format", "json"),
        ("offsets.topic", "o"),
        ("x.y", "1"),
        ("mode", "push"),
        ("epoch.interval", "1s"),
        ("emit", "updates"),
        ("key", "k"),
    ];
    let seen = c
        .create_source(&config("DOTTED", &options), empty())
        .unwrap_err()
        .to_string();
    assert!(seen.contains("format") && seen.contains("x.y"), "{seen}");
    for foreign in ["offsets.topic", "mode", "epoch.interval", "emit", "key"] {
        assert!(!seen.contains(foreign), "{foreign}: {seen}");
    }
    let seen = c
        .create_sink(&sink("DOTTED", &options))
        .err()
        .unwrap()
        .to_string();
    for own in ["format", "offsets.topic", "x.y", "key"] {
        assert!(seen.contains(own), "{own}: {seen}");
    }
    for foreign in ["mode", "epoch.interval", "emit"] {
        assert!(!seen.contains(foreign), "{foreign}: {seen}");
    }
    // A factory that reads an engine-wide option lists it as its own.
    let seen = c
        .create_sink(&sink("WRITTEN", &[("layout", "l"), ("emit", "updates")]))
        .err()
        .unwrap()
        .to_string();
    assert!(seen.contains("emit"), "{seen}");
}

#[test]
fn engine_wide_options_are_checked_and_kept_from_sources() {
    let c = catalog();
    for kind in ["PLAIN", "DOTTED"] {
        let conf = config(kind, &[("epoch.interval", "250ms"), ("state.ttl", "1h")]);
        assert!(c.check_options(&conf).is_ok(), "{kind}");
        let seen = c.create_source(&conf, empty()).unwrap_err().to_string();
        assert!(
            !seen.contains("epoch.interval") && !seen.contains("state.ttl"),
            "{kind}: {seen}"
        );
        assert_eq!(
            crate::interval::table_interval(&conf).unwrap(),
            Some(std::time::Duration::from_millis(250))
        );
    }
    for (key, bad) in [
        ("epoch.interval", "soon"),
        ("epoch.interval", "0s"),
        ("epoch.interval", "-1s"),
        ("state.ttl", "forever"),
        ("emit.interval", "0"),
    ] {
        let err = c
            .check_options(&config("PLAIN", &[(key, bad)]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("'{key}'")), "{bad}: {err}");
    }
    let err = c
        .check_options(&config("WRITTEN", &[("emit", "often")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("'emit' = \"often\": give 'updates'"), "{err}");
}

#[test]
fn a_kind_is_read_written_or_both() {
    let mut c = catalog();
    c.register_sink("PLAIN", Arc::new(FixedSink(TableOptions::only(&[]))));
    assert!(c.can_read("plain") && c.can_write("plain"));
    assert!(!c.can_read("WRITTEN") && c.can_write("WRITTEN"));
    let err = c
        .create_source(&config("WRITTEN", &[]), empty())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("can be written (INSERT INTO), not read"),
        "{err}"
    );
    let mut c = Catalog::default();
    c.register_source("PLAIN", Arc::new(Fixed(TableOptions::only(&[]))));
    let err = c
        .create_sink(&sink("PLAIN", &[]))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("can be read, not written"), "{err}");
}

#[derive(Debug)]
struct Nothing;

#[async_trait]
impl Lookup for Nothing {
    async fn get(&self, keys: &[String]) -> Result<Vec<Option<LookupRow>>> {
        Ok(vec![None; keys.len()])
    }
}

struct NothingFactory;

impl LookupFactory for NothingFactory {
    fn options(&self) -> &'static [&'static str] {
        &["retry.timeout.ms"]
    }
    fn create(&self, _: &SourceConfig, _: &LookupOptions) -> Result<Arc<dyn Lookup>> {
        Ok(Arc::new(Nothing))
    }
}

fn lookup(kind: &str, options: &[(&str, &str)]) -> Result<LookupOptions> {
    let mut c = Catalog::default();
    c.register_lookup("KV", Arc::new(NothingFactory));
    let schema = Arc::new(Schema::new(vec![
        Field::new("ad_id", DataType::Utf8, false),
        Field::new("campaign_id", DataType::Utf8, true),
        Field::new("n", DataType::Int64, true),
        Field::new("f", DataType::Float64, true),
    ]));
    c.create_lookup(&config(kind, options), &(schema as SchemaRef))
        .map(|(o, _)| o)
}

#[test]
fn lookup_options_are_checked_when_the_table_is_declared() {
    let o = lookup("kv", &[(OPT_KEY, "ad_id")]).unwrap();
    assert_eq!(o.values, ["campaign_id", "n", "f"]);
    assert_eq!(o.cache_size, DEFAULT_CACHE_SIZE);
    assert_eq!(o.key_prefix, "");
    assert_eq!(o.missing, MissingPolicy::Join);
    let o = lookup(
        "KV",
        &[
            (OPT_KEY, "ad_id"),
            (OPT_CACHE_SIZE, "10"),
            (OPT_CACHE_TTL_MS, "0"),
            (OPT_MISSING, "dead-letter"),
            (OPT_KEY_PREFIX, "campaign:"),
            ("retry.timeout.ms", "5"),
        ],
    )
    .unwrap();
    assert_eq!(o.key_prefix, "campaign:");
    assert_eq!((o.cache_size, o.cache_ttl_ms), (10, 0));
    assert_eq!(o.missing, MissingPolicy::DeadLetter);
    let err = |opts: &[(&str, &str)]| lookup("KV", opts).unwrap_err().to_string();
    let e = err(&[(OPT_KEY, "ad")]);
    assert!(
        e.contains("no such column") && e.contains("ad_id, campaign_id"),
        "{e}"
    );
    let o = lookup("KV", &[(OPT_KEY, "n")]).unwrap();
    assert_eq!(o.values, ["ad_id", "campaign_id", "f"], "an integer key");
    let e = err(&[(OPT_KEY, "f")]);
    assert!(
        e.contains("lookup.key = \"f\": the key column is Float64, which cannot be a lookup key"),
        "{e}"
    );
    let e = err(&[(OPT_KEY, "ad_id"), (OPT_CACHE_SIZE, "many")]);
    assert!(e.contains("lookup.cache.size = \"many\""), "{e}");
    let e = err(&[(OPT_KEY, "ad_id"), (OPT_CACHE_TTL_MS, "-1")]);
    assert!(e.contains("lookup.cache.ttl.ms"), "{e}");
    let e = err(&[(OPT_KEY, "ad_id"), (OPT_MISSING, "drop")]);
    assert!(e.contains("'join' or 'dead-letter'"), "{e}");
    let e = err(&[(OPT_KEY, "ad_id"), ("lookup.prefix", "1")]);
    assert!(
        e.contains(
            "unknown option 'lookup.prefix' for a KV lookup table; it takes \
             lookup.cache.size, lookup.cache.ttl.ms, lookup.key, lookup.key.prefix, \
             lookup.missing, retry.timeout.ms"
        ),
        "{e}"
    );
    let e = lookup("KAFKA", &[(OPT_KEY, "ad_id")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("KAFKA tables cannot be lookup tables"), "{e}");
    for e in [e, err(&[(OPT_KEY, "ad")])] {
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

/// A live source that resumes from its sink, and a sink that keeps offsets.
struct Resuming;

impl SourceFactory for Resuming {
    fn options(&self) -> TableOptions {
        TableOptions::only(&["startup", "offsets"])
    }
    fn capabilities(&self) -> crate::source::SourceCapabilities {
        crate::source::SourceCapabilities {
            replay: crate::source::ReplayMode::Offsets,
            live: true,
        }
    }
    fn resumes_from_sink(&self, config: &SourceConfig) -> bool {
        config.option("startup") == Some("checkpoint")
    }
    fn starting_at(
        &self,
        config: &SourceConfig,
        offsets: &std::collections::BTreeMap<i32, i64>,
    ) -> SourceConfig {
        let mut c = config.clone();
        c.options.insert("startup".into(), "offsets".into());
        c.options.insert("offsets".into(), format!("{offsets:?}"));
        c
    }
    fn create(&self, _config: &SourceConfig, _schema: SchemaRef) -> Result<Arc<dyn Source>> {
        Err(EngineError::plan("not opened in this test"))
    }
}

struct Keeping;

#[async_trait]
impl SinkFactory for Keeping {
    fn options(&self) -> TableOptions {
        TableOptions::only(&["checkpoint"])
    }
    fn capabilities(&self) -> crate::sink::SinkCapabilities {
        crate::sink::SinkCapabilities {
            exactly_once: true,
            keeps_offsets: true,
            discards_rows: false,
        }
    }
    fn takes_updates(&self, config: &SinkConfig) -> std::result::Result<(), String> {
        match config.options.get("checkpoint") {
            Some(_) => Ok(()),
            None => Err("no checkpoint, no upserts".into()),
        }
    }
    async fn committed_offsets(
        &self,
        config: &SinkConfig,
        source: &str,
    ) -> Result<Option<std::collections::BTreeMap<i32, i64>>> {
        Ok(config
            .options
            .get("checkpoint")
            .map(|_| [(0, source.len() as i64)].into()))
    }
    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        Err(EngineError::plan(format!("{:?}", config.options)))
    }
}

#[tokio::test]
async fn capabilities_are_asked_by_kind_not_by_name() {
    let mut c = catalog();
    c.register_source("LIVE", Arc::new(Resuming));
    c.register_sink("KEEPS", Arc::new(Keeping));
    let live = config("live", &[("startup", "checkpoint"), ("late", "drop")]);
    assert!(c.is_live(&live) && !c.is_live(&config("PLAIN", &[])));
    assert_eq!(c.replay_mode(&live), crate::source::ReplayMode::Offsets);
    assert_eq!(
        c.replay_mode(&config("PLAIN", &[])),
        crate::source::ReplayMode::Unsupported
    );
    assert!(c.sink_exactly_once(&sink("KEEPS", &[])));
    assert!(!c.sink_exactly_once(&sink("WRITTEN", &[])));
    assert_eq!(
        c.sink_takes_updates(&sink("WRITTEN", &[])),
        Err("it only appends rows".to_string())
    );
    assert_eq!(
        c.sink_takes_updates(&sink("KEEPS", &[("checkpoint", "c")])),
        Ok(())
    );
    assert!(c.sink_takes_updates(&sink("KEEPS", &[])).is_err());
    assert_eq!(c.kinds_keeping_offsets(), ["KEEPS"]);

    assert!(c.resumes_from_sink(&live));
    let (resumed, offsets) = c
        .resume_from_sink("t", &live, &sink("KEEPS", &[("checkpoint", "c")]))
        .await
        .unwrap();
    // `t` is the location: one character.
    assert_eq!(offsets, [(0, 1)].into());
    assert_eq!(resumed.option("startup"), Some("offsets"));
    assert_eq!(resumed.option("late"), Some("drop"), "engine options stay");
    let err = c
        .resume_from_sink("t", &live, &sink("KEEPS", &[]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("needs a sink that keeps the offsets it wrote (KEEPS"),
        "{err}"
    );
}
