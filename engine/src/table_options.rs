//! The options a table declaration takes: the ones each factory declares
//! ([`TableOptions`]), and the engine-wide ones, named here once. The
//! engine-wide options mean the same on every kind; the catalog checks
//! their values and keeps them from the factories (a factory that reads one
//! itself lists it among its own).

/// The options a table kind's factory takes, declared once next to where
/// they are parsed. The engine-wide options need not be listed.
#[derive(Debug, Clone, Default)]
pub struct TableOptions {
    /// The options the factory takes.
    pub names: Vec<&'static str>,
    /// Where options with a dot that no one else declares go as they are,
    /// if anywhere (Kafka: "librdkafka property"); without it they are
    /// unknown.
    pub dotted_passthrough: Option<&'static str>,
}

impl TableOptions {
    /// Exactly these options.
    pub fn only(names: &[&'static str]) -> Self {
        TableOptions {
            names: names.to_vec(),
            dotted_passthrough: None,
        }
    }

    /// These options too.
    pub fn and(mut self, names: &[&'static str]) -> Self {
        for n in names {
            if !self.names.contains(n) {
                self.names.push(n);
            }
        }
        self
    }

    /// Options with a dot that no one else declares are `what` (say,
    /// "librdkafka property"), handed to the factory as they are.
    pub fn passing_dotted(mut self, what: &'static str) -> Self {
        self.dotted_passthrough = Some(what);
        self
    }

    /// Whether `name` is one of the factory's own options.
    pub fn has(&self, name: &str) -> bool {
        self.names.contains(&name)
    }
}

/// A source table option: the column that holds each row's event time.
pub const OPT_EVENT_TIME: &str = "event_time";
/// A source table option: how late a row may be, in ms, before its window closes.
pub const OPT_LATENESS_MS: &str = "lateness_ms";
/// A source table option: how long a partition may be quiet before it is idle.
pub const OPT_IDLE_TIMEOUT: &str = "idle.timeout";
/// A source table option: what happens to rows later than the lateness.
pub const OPT_LATE: &str = "late";
/// The event-time options, which every source kind takes (see
/// `crate::watermark`).
pub const EVENT_TIME_OPTIONS: &[&str] =
    &[OPT_EVENT_TIME, OPT_LATENESS_MS, OPT_IDLE_TIMEOUT, OPT_LATE];

/// A source table option: how often a query over the table fires an epoch
/// on the wall clock (e.g. `'epoch.interval' '500ms'`, see `crate::interval`).
pub const EPOCH_INTERVAL_OPTION: &str = "epoch.interval";

/// A sink table option: `updates` makes every stage emit per epoch (see
/// `crate::planner::plan_query`).
pub const EMIT_OPTION: &str = "emit";
/// The `emit` value that asks for updates every epoch.
pub const EMIT_UPDATES: &str = "updates";
/// The values `emit` takes.
pub const EMIT_VALUES: &[&str] = &[EMIT_UPDATES];

/// A table option: how long an updating stage keeps the rows of a key of
/// this table that nothing touched (`'state.ttl' '1h'`; default forever).
pub const STATE_TTL_OPTION: &str = "state.ttl";
/// A sink table option: how often an updating query emits its changes
/// (`'emit.interval' '10s'`; default every epoch).
pub const EMIT_INTERVAL_OPTION: &str = "emit.interval";

/// The engine-wide options of a table whose kind can be read.
pub const SOURCE_TABLE_OPTIONS: &[&str] = &[
    OPT_EVENT_TIME,
    OPT_LATENESS_MS,
    OPT_IDLE_TIMEOUT,
    OPT_LATE,
    EPOCH_INTERVAL_OPTION,
    STATE_TTL_OPTION,
    EMIT_INTERVAL_OPTION,
];

/// The engine-wide options of a table whose kind can be written.
pub const SINK_TABLE_OPTIONS: &[&str] = &[EMIT_OPTION, STATE_TTL_OPTION, EMIT_INTERVAL_OPTION];
