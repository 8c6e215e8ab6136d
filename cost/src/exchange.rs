//! What one exchange of `skein bench lambda --exchange` costs: moving a
//! payload between two functions is priced per exchange, not per event, so
//! the transports can be compared on price as well as on time.

use serde::Serialize;

use crate::Prices;

/// The billable parts of one exchange between two functions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExchangeUsage {
    /// Lambda requests: the call that starts the sender, plus one per
    /// payload fragment (or the one that passes an S3 key).
    pub requests: u64,
    /// Function time billed, ms (each function's time, summed).
    pub billed_ms: f64,
    /// The functions' memory, MB.
    pub memory_mb: u32,
    pub s3_puts: u64,
    pub s3_gets: u64,
}

/// US dollars per million exchanges, per architecture.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ExchangeCost {
    pub usd_per_million_x86_64: f64,
    pub usd_per_million_arm64: f64,
}

/// Prices `usage` with `prices`.
pub fn exchange_cost(usage: &ExchangeUsage, prices: &Prices) -> ExchangeCost {
    let gb_s = usage.billed_ms.ceil() / 1000.0 * f64::from(usage.memory_mb) / 1024.0;
    let fixed = usage.requests as f64 * prices.lambda_per_million_requests / 1e6
        + usage.s3_puts as f64 * prices.s3_put_per_thousand / 1e3
        + usage.s3_gets as f64 * prices.s3_get_per_thousand / 1e3;
    let per_million = |per_gb_s: f64| ((fixed + gb_s * per_gb_s) * 1e6 * 1e4).round() / 1e4;
    ExchangeCost {
        usd_per_million_x86_64: per_million(prices.lambda_x86_per_gb_s),
        usd_per_million_arm64: per_million(prices.lambda_arm_per_gb_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_pays_its_requests_its_time_and_its_objects() {
        let prices = Prices::default();
        let payload = ExchangeUsage {
            requests: 2,
            billed_ms: 100.0,
            memory_mb: 1024,
            s3_puts: 0,
            s3_gets: 0,
        };
        // 2 requests at $0.20/M and 0.1 GB-s at $0.0000166667 per GB-s.
        let c = exchange_cost(&payload, &prices);
        assert!(
            (c.usd_per_million_x86_64 - (0.40 + 1.66667)).abs() < 1e-3,
            "{c:?}"
        );
        assert!(c.usd_per_million_arm64 < c.usd_per_million_x86_64);
        // The same through S3 also pays a PUT and a GET per exchange.
        let s3 = exchange_cost(
            &ExchangeUsage {
                s3_puts: 1,
                s3_gets: 1,
                ..payload
            },
            &prices,
        );
        let objects = (prices.s3_put_per_thousand + prices.s3_get_per_thousand) * 1e3;
        let more = s3.usd_per_million_x86_64 - c.usd_per_million_x86_64;
        assert!((more - objects).abs() < 1e-3, "{more} vs {objects}");
    }
}
