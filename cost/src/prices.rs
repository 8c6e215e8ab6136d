//! The price table. Every figure is a public on-demand list price in
//! us-east-1 (N. Virginia), as of [`PRICES_DATE`]; a JSON file with any
//! subset of the fields overrides them (`skein cost --prices FILE`).

use serde::{Deserialize, Serialize};

use crate::CostError;

/// When the default prices were looked up.
pub const PRICES_DATE: &str = "2026-11-24";

/// Where they come from.
pub const PRICES_SOURCE: &str = "aws.amazon.com/{lambda,s3,kinesis/data-streams,managed-service-apache-flink,ec2}/pricing, us-east-1 on-demand list prices (S3 Express One Zone: the s3/pricing page's directory-bucket rows)";

/// Unit prices in US dollars. Field names carry their unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Prices {
    /// Label of this table: its date, or where an override came from.
    pub date: String,
    pub lambda_per_million_requests: f64,
    pub lambda_x86_per_gb_s: f64,
    pub lambda_arm_per_gb_s: f64,
    pub s3_put_per_thousand: f64,
    pub s3_get_per_thousand: f64,
    /// S3 Express One Zone (a directory bucket): requests, and every GB
    /// uploaded (DELETE is free, as on S3 Standard).
    pub s3_express_put_per_thousand: f64,
    pub s3_express_get_per_thousand: f64,
    pub s3_express_upload_per_gb: f64,
    /// Provisioned mode: one shard takes 1 MB/s or 1,000 records/s in.
    pub kinesis_shard_hour: f64,
    /// One PUT payload unit is a record's 25 KB chunk.
    pub kinesis_per_million_put_units: f64,
    /// One KPU is 1 vCPU and 4 GB; each application pays one more KPU
    /// for orchestration and 50 GB of running storage per KPU.
    pub flink_kpu_hour: f64,
    pub flink_storage_gb_month: f64,
    /// The always-on VM and its vCPUs.
    pub vm_instance: String,
    pub vm_hour: f64,
    pub vm_vcpus: u32,
}

impl Default for Prices {
    fn default() -> Self {
        Prices {
            date: PRICES_DATE.to_string(),
            lambda_per_million_requests: 0.20,
            lambda_x86_per_gb_s: 0.000_016_666_7,
            lambda_arm_per_gb_s: 0.000_013_333_4,
            s3_put_per_thousand: 0.005,
            s3_get_per_thousand: 0.0004,
            s3_express_put_per_thousand: 0.00113,
            s3_express_get_per_thousand: 0.00003,
            s3_express_upload_per_gb: 0.0032,
            kinesis_shard_hour: 0.015,
            kinesis_per_million_put_units: 0.014,
            flink_kpu_hour: 0.11,
            flink_storage_gb_month: 0.10,
            vm_instance: "c7g.large".to_string(),
            vm_hour: 0.0725,
            vm_vcpus: 2,
        }
    }
}

impl Prices {
    /// The default table overridden by the fields of a JSON file.
    pub fn load(path: &std::path::Path) -> Result<Prices, CostError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| CostError::Read {
            path: shown.clone(),
            source,
        })?;
        let mut prices: Prices =
            serde_json::from_str(&text).map_err(|source| CostError::Parse {
                path: shown.clone(),
                source,
            })?;
        if prices.date == PRICES_DATE {
            prices.date = format!("{PRICES_DATE}, overridden by {shown}");
        }
        prices.check()?;
        Ok(prices)
    }

    fn check(&self) -> Result<(), CostError> {
        let figures = [
            self.lambda_per_million_requests,
            self.lambda_x86_per_gb_s,
            self.lambda_arm_per_gb_s,
            self.s3_put_per_thousand,
            self.s3_get_per_thousand,
            self.s3_express_put_per_thousand,
            self.s3_express_get_per_thousand,
            self.s3_express_upload_per_gb,
            self.kinesis_shard_hour,
            self.kinesis_per_million_put_units,
            self.flink_kpu_hour,
            self.flink_storage_gb_month,
            self.vm_hour,
        ];
        if figures.iter().any(|p| !p.is_finite() || *p < 0.0) {
            return Err(CostError::Invalid(
                "prices must be finite and not negative".into(),
            ));
        }
        if self.vm_vcpus == 0 {
            return Err(CostError::Invalid("vm_vcpus must be at least 1".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_overrides_some_prices_and_keeps_the_rest() {
        let dir = std::env::temp_dir().join(format!("skein-cost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("prices.json");
        std::fs::write(&file, r#"{"vm_instance": "m7i.large", "vm_hour": 0.1008}"#).unwrap();
        let p = Prices::load(&file).unwrap();
        assert_eq!(p.vm_instance, "m7i.large");
        assert_eq!(p.vm_hour, 0.1008);
        assert_eq!(p.flink_kpu_hour, Prices::default().flink_kpu_hour);
        assert!(p.date.contains("overridden"));

        std::fs::write(&file, r#"{"vm_hourly": 1}"#).unwrap();
        let e = Prices::load(&file).unwrap_err().to_string();
        assert!(e.contains("vm_hourly"), "{e}");
        std::fs::write(&file, r#"{"vm_hour": -1}"#).unwrap();
        assert!(Prices::load(&file).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
