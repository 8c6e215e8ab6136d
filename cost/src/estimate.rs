//! From what a run measured to dollars: per million events, and per month
//! of a standing query at a given rate.

use serde::{Deserialize, Serialize};

use crate::Prices;

/// Hours in a month, as AWS prices a month.
pub const HOURS_PER_MONTH: f64 = 730.0;

/// Memory at which a Lambda function has one full vCPU (AWS: 1,769 MB).
const ONE_VCPU_MB: f64 = 1769.0;

/// A PUT payload unit of Kinesis.
const KINESIS_UNIT_BYTES: u64 = 25 * 1024;

/// Provisioned shard limits: records/s and bytes/s in.
const SHARD_RECORDS_S: f64 = 1000.0;
const SHARD_BYTES_S: f64 = 1024.0 * 1024.0;

/// Running storage each Managed Flink KPU comes with, GB.
const FLINK_STORAGE_GB_PER_KPU: f64 = 50.0;

/// What one run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Measured {
    /// Source records, each once.
    pub events: u64,
    pub invocations: u64,
    /// Each invocation's time rounded up to 1 ms, summed, on one core.
    pub billed_ms: u64,
    /// Objects written to the checkpoint store (S3 PUT).
    pub checkpoint_puts: u64,
    /// Bytes of those objects (S3 Express One Zone charges per GB uploaded).
    #[serde(default)]
    pub checkpoint_bytes: u64,
    /// Objects read from it (S3 GET).
    pub checkpoint_gets: u64,
    /// Process CPU time spent on the run, seconds.
    pub cpu_s: f64,
}

/// What the model assumes beyond the measurements.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// Events per second of the standing query; none: per-million figures only.
    pub rate: Option<f64>,
    /// Memory configured for each function.
    pub memory_mb: u32,
    /// Bytes of one record when the events arrive through a Kinesis stream.
    pub kinesis_record_bytes: Option<u64>,
    /// Events per second one Flink KPU (1 vCPU) sustains; none: as many as
    /// one core of Skein did in this run.
    pub flink_events_per_kpu_s: Option<f64>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            rate: None,
            memory_mb: ONE_VCPU_MB as u32,
            kinesis_record_bytes: None,
            flink_events_per_kpu_s: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    X86_64,
    Arm64,
}

/// Where the checkpoints are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectStore {
    /// S3 Standard (a general purpose bucket).
    S3,
    /// S3 Express One Zone (a directory bucket).
    S3Express,
}

/// The query on Lambda, one architecture, its checkpoints on one store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LambdaCost {
    pub arch: Arch,
    pub memory_mb: u32,
    pub object_store: ObjectStore,
    pub requests_per_million_events: f64,
    pub gb_s_per_million_events: f64,
    pub s3_requests_per_million_events: f64,
    /// The checkpoint store's part of `usd_per_million_events`.
    pub object_store_usd_per_million_events: f64,
    pub usd_per_million_events: f64,
    pub usd_per_month: Option<f64>,
}

/// The query on always-on capacity (VMs or Flink KPUs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerCost {
    /// The instance type or "KPU".
    pub unit: String,
    /// Units running at the rate (Flink: with its orchestration KPU).
    pub units: Option<u32>,
    /// Infinite when the run measured no CPU time (`null` in JSON).
    #[serde(deserialize_with = "infinite_if_null")]
    pub events_per_vcpu_s: f64,
    /// Infinite when the run read no events in CPU time it measured
    /// (`null` in JSON).
    #[serde(deserialize_with = "infinite_if_null")]
    pub usd_per_million_events: f64,
    pub usd_per_month: Option<f64>,
}

/// JSON has no infinity: serde_json writes it as `null`, read back here as
/// the infinity it was, so a report reads back whatever its run measured.
fn infinite_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// The cost section of a report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostReport {
    pub prices: String,
    pub rate: Option<f64>,
    pub measured: Measured,
    /// The input stream, when it is Kinesis (included in every total).
    pub kinesis_usd_per_million_events: f64,
    pub kinesis_shards: Option<u32>,
    /// x86_64 and arm64, checkpoints on S3 Standard.
    pub lambda: Vec<LambdaCost>,
    /// The same on S3 Express One Zone.
    pub lambda_s3_express: Vec<LambdaCost>,
    pub vm: ServerCost,
    pub flink: ServerCost,
    /// How the measurements were taken, where that is not in-process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_on: Option<String>,
}

/// Price what `m` measured. Counts scale with events: the measured run
/// must have cut its input into epochs of the size the standing query
/// would (rate × interval), which `skein cost` arranges.
pub fn estimate(m: &Measured, prices: &Prices, opts: &ModelOptions) -> CostReport {
    let events = m.events.max(1) as f64;
    let per_million = 1e6 / events;
    let month_events = opts.rate.map(|r| r * HOURS_PER_MONTH * 3600.0);
    let monthly = |per_million_events: f64| month_events.map(|e| per_million_events * e / 1e6);

    let (kinesis_pm, kinesis_shards) = kinesis(prices, opts);

    // Below one vCPU a function is slower in proportion (CPU-bound work).
    let memory = opts.memory_mb.max(128) as f64;
    let slowdown = (ONE_VCPU_MB / memory).max(1.0);
    let gb_s_pm = m.billed_ms as f64 / 1000.0 * slowdown * memory / 1024.0 * per_million;
    let requests_pm = m.invocations as f64 * per_million;
    let store_usd_pm = |store: ObjectStore| {
        let (put, get, per_gb) = match store {
            ObjectStore::S3 => (prices.s3_put_per_thousand, prices.s3_get_per_thousand, 0.0),
            ObjectStore::S3Express => (
                prices.s3_express_put_per_thousand,
                prices.s3_express_get_per_thousand,
                prices.s3_express_upload_per_gb,
            ),
        };
        ((m.checkpoint_puts as f64 * put + m.checkpoint_gets as f64 * get) / 1000.0
            + m.checkpoint_bytes as f64 / 1e9 * per_gb)
            * per_million
    };
    let lambda_on = |store: ObjectStore| -> Vec<LambdaCost> {
        let store_pm = store_usd_pm(store);
        [
            (Arch::X86_64, prices.lambda_x86_per_gb_s),
            (Arch::Arm64, prices.lambda_arm_per_gb_s),
        ]
        .into_iter()
        .map(|(arch, gb_s_price)| {
            let usd = requests_pm * prices.lambda_per_million_requests / 1e6
                + gb_s_pm * gb_s_price
                + store_pm
                + kinesis_pm;
            LambdaCost {
                arch,
                memory_mb: opts.memory_mb,
                object_store: store,
                requests_per_million_events: requests_pm,
                gb_s_per_million_events: gb_s_pm,
                s3_requests_per_million_events: (m.checkpoint_puts + m.checkpoint_gets) as f64
                    * per_million,
                object_store_usd_per_million_events: store_pm,
                usd_per_million_events: usd,
                usd_per_month: monthly(usd),
            }
        })
        .collect()
    };
    let lambda = lambda_on(ObjectStore::S3);
    let lambda_s3_express = lambda_on(ObjectStore::S3Express);

    let per_vcpu_s = if m.cpu_s > 0.0 {
        m.events as f64 / m.cpu_s
    } else {
        f64::INFINITY
    };
    let kinesis_month = monthly(kinesis_pm);
    let with_kinesis = |usd: f64| usd + kinesis_month.unwrap_or(0.0);

    // VMs: as many as the CPU the rate needs, at least one, fully used.
    let vm_hour_per_vcpu = prices.vm_hour / prices.vm_vcpus as f64;
    let vm_units = opts
        .rate
        .map(|r| ((r / per_vcpu_s / prices.vm_vcpus as f64).ceil() as u32).max(1));
    let vm_month = vm_units.map(|n| with_kinesis(n as f64 * prices.vm_hour * HOURS_PER_MONTH));
    let vm = ServerCost {
        unit: prices.vm_instance.clone(),
        units: vm_units,
        events_per_vcpu_s: per_vcpu_s,
        usd_per_million_events: per_month_or_full_use(
            vm_month,
            month_events,
            vm_hour_per_vcpu,
            per_vcpu_s,
        ) + if vm_month.is_some() { 0.0 } else { kinesis_pm },
        usd_per_month: vm_month,
    };

    // Flink: KPUs for the rate plus one for orchestration, each with its storage.
    let kpu_s = opts.flink_events_per_kpu_s.unwrap_or(per_vcpu_s);
    let kpu_hour = prices.flink_kpu_hour
        + FLINK_STORAGE_GB_PER_KPU * prices.flink_storage_gb_month / HOURS_PER_MONTH;
    let flink_units = opts.rate.map(|r| ((r / kpu_s).ceil() as u32).max(1) + 1);
    let flink_month = flink_units.map(|n| with_kinesis(n as f64 * kpu_hour * HOURS_PER_MONTH));
    let flink = ServerCost {
        unit: "KPU".to_string(),
        units: flink_units,
        events_per_vcpu_s: kpu_s,
        usd_per_million_events: per_month_or_full_use(flink_month, month_events, kpu_hour, kpu_s)
            + if flink_month.is_some() {
                0.0
            } else {
                kinesis_pm
            },
        usd_per_month: flink_month,
    };

    CostReport {
        prices: prices.date.clone(),
        rate: opts.rate,
        measured: m.clone(),
        kinesis_usd_per_million_events: kinesis_pm,
        kinesis_shards,
        lambda,
        lambda_s3_express,
        vm,
        flink,
        measured_on: None,
    }
}

/// $ per million events: from the month's bill when there is a rate,
/// else from one vCPU-hour's price at full use.
fn per_month_or_full_use(
    month_usd: Option<f64>,
    month_events: Option<f64>,
    usd_per_vcpu_hour: f64,
    events_per_vcpu_s: f64,
) -> f64 {
    match (month_usd, month_events) {
        (Some(usd), Some(events)) => usd / events * 1e6,
        _ => usd_per_vcpu_hour / 3600.0 / events_per_vcpu_s * 1e6,
    }
}

/// The Kinesis input: $ per million events (PUT units and shard-hours)
/// and the shards the rate needs.
fn kinesis(prices: &Prices, opts: &ModelOptions) -> (f64, Option<u32>) {
    let Some(bytes) = opts.kinesis_record_bytes else {
        return (0.0, None);
    };
    let units = bytes.div_ceil(KINESIS_UNIT_BYTES).max(1) as f64;
    let puts_pm = units * prices.kinesis_per_million_put_units;
    // Shard-seconds one event takes up, at full use.
    let shard_s = (1.0 / SHARD_RECORDS_S).max(bytes as f64 / SHARD_BYTES_S);
    match opts.rate {
        Some(r) => {
            let shards = ((r * shard_s).ceil() as u32).max(1);
            let shard_pm = shards as f64 * prices.kinesis_shard_hour / 3600.0 / r * 1e6;
            (puts_pm + shard_pm, Some(shards))
        }
        None => (
            puts_pm + shard_s * prices.kinesis_shard_hour / 3600.0 * 1e6,
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    /// 1 M events in 1,000 invocations billed 100 s at 2 GB, 100 PUTs of
    /// 1 GB in all, 10 s of CPU; 1,000 events/s for a month, by hand:
    /// GB-s 200 × 0.0000166667 = 0.00333334; requests 1,000 × 0.2 / 1e6 =
    /// 0.0002; PUTs 100 × 0.005 / 1,000 = 0.0005: x86 $0.00403334 per
    /// million events; 2,628 M events a month: $10.59961752. One c7g.large
    /// (0.01 vCPU needed): 0.0725 × 730 = $52.925. Flink at 100,000 events/s
    /// per KPU: 1 + 1 KPUs, 2 × (0.11 × 730 + 50 × 0.10) = $170.6.
    #[test]
    fn a_hand_computed_case() {
        let m = Measured {
            events: 1_000_000,
            invocations: 1000,
            billed_ms: 100_000,
            checkpoint_puts: 100,
            checkpoint_bytes: 1_000_000_000,
            checkpoint_gets: 0,
            cpu_s: 10.0,
        };
        let opts = ModelOptions {
            rate: Some(1000.0),
            memory_mb: 2048,
            ..Default::default()
        };
        let r = estimate(&m, &Prices::default(), &opts);
        let x86 = &r.lambda[0];
        assert_eq!(x86.arch, Arch::X86_64);
        assert!(close(x86.gb_s_per_million_events, 200.0));
        assert!(close(x86.usd_per_million_events, 0.00403334), "{x86:?}");
        assert!(close(x86.usd_per_month.unwrap(), 10.59961752), "{x86:?}");
        let arm = &r.lambda[1];
        assert!(close(
            arm.usd_per_million_events,
            200.0 * 0.0000133334 + 0.0007
        ));
        assert!(close(x86.object_store_usd_per_million_events, 0.0005));
        // On S3 Express One Zone: 100 PUTs × 0.00113 / 1,000, and 1 GB
        // uploaded × 0.0032.
        let express = &r.lambda_s3_express[0];
        assert_eq!(express.object_store, ObjectStore::S3Express);
        assert!(close(
            express.object_store_usd_per_million_events,
            0.000113 + 0.0032
        ));
        assert!(close(
            express.usd_per_million_events,
            0.00333334 + 0.0002 + 0.000113 + 0.0032
        ));
        assert_eq!(r.vm.units, Some(1));
        assert!(close(r.vm.usd_per_month.unwrap(), 52.925));
        assert_eq!(r.flink.units, Some(2));
        assert!(
            close(r.flink.usd_per_month.unwrap(), 170.6),
            "{:?}",
            r.flink
        );
        assert!(close(r.flink.events_per_vcpu_s, 100_000.0));
    }

    #[test]
    fn small_functions_are_slower_so_gb_s_holds_below_one_vcpu() {
        let m = Measured {
            events: 1000,
            invocations: 10,
            billed_ms: 1000,
            cpu_s: 1.0,
            ..Default::default()
        };
        let at = |memory_mb| {
            let opts = ModelOptions {
                memory_mb,
                ..Default::default()
            };
            estimate(&m, &Prices::default(), &opts).lambda[0].gb_s_per_million_events
        };
        assert!(close(at(512), at(1769)));
        assert!(at(4096) > at(1769));
    }

    #[test]
    fn kinesis_input_counts_put_units_and_shards() {
        let opts = ModelOptions {
            rate: Some(2500.0),
            kinesis_record_bytes: Some(30 * 1024),
            ..Default::default()
        };
        let m = Measured {
            events: 1000,
            cpu_s: 0.001,
            ..Default::default()
        };
        let r = estimate(&m, &Prices::default(), &opts);
        // 2,500 records/s of 30 KB: 75 MB/s, 74 shards by bytes; 2 units each.
        assert_eq!(r.kinesis_shards, Some(74));
        let shards_pm = 74.0 * 0.015 / 3600.0 / 2500.0 * 1e6;
        assert!(close(
            r.kinesis_usd_per_million_events,
            2.0 * 0.014 + shards_pm
        ));
    }

    /// A run that read nothing: no CPU time makes events per vCPU-second
    /// infinite, CPU time with no events makes the dollars per million
    /// infinite; JSON writes both as `null` and they read back as infinity.
    #[test]
    fn a_report_of_no_events_reads_back_from_json() {
        for cpu_s in [0.0, 0.5] {
            let m = Measured {
                cpu_s,
                ..Default::default()
            };
            let r = estimate(&m, &Prices::default(), &ModelOptions::default());
            let json = serde_json::to_string(&r).unwrap();
            assert!(json.contains("null"), "{json}");
            let back: CostReport = serde_json::from_str(&json).unwrap();
            for (was, is) in [(&r.vm, &back.vm), (&r.flink, &back.flink)] {
                assert_eq!(was.events_per_vcpu_s, is.events_per_vcpu_s, "{json}");
                assert_eq!(
                    was.usd_per_million_events, is.usd_per_million_events,
                    "{json}"
                );
            }
        }
    }
}
