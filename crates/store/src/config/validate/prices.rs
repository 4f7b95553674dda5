//! `[[prices]]` and `[usage]` (SPEC 11): the operator's model prices and what the usage
//! ledger keeps.

use std::collections::HashMap;

use keypool_ledger::{ModelGlob, PerMillion, PriceRule, PriceTable, Prices};

use super::Issues;
use crate::config::UsageSettings;
use crate::config::raw::{RawPrice, RawUsage};

/// The most usage records `[usage] recent_requests` keeps.
const MAX_RECENT_REQUESTS: i64 = 1_000_000;

/// The longest `[usage] retention_days` (ten years).
const MAX_RETENTION_DAYS: i64 = 3_650;

/// Validates `[[prices]]` into a price table, keypool's defaults after the operator's
/// rules unless `usage.default_prices` is off.
pub(super) fn validate_prices(
    prices: &[(usize, RawPrice)],
    usage: &UsageSettings,
    issues: &mut Issues,
) -> PriceTable {
    let mut rules = Vec::new();
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (i, p) in prices {
        let loc = |field: &str| format!("prices[{i}].{field}");
        let glob = ModelGlob::try_new(&p.model)
            .map_err(|e| issues.push(loc("model"), e.to_string()))
            .ok();
        if let Some(j) = first.get(p.model.as_str()) {
            issues.push(
                loc("model"),
                format!(
                    "model pattern {:?} is priced twice (first at prices[{j}]); keep one",
                    p.model
                ),
            );
            continue;
        }
        first.insert(&p.model, *i);
        let mut price = |field: &str, usd: Option<f64>| {
            PerMillion::try_from_usd(usd.unwrap_or(0.0))
                .map_err(|e| issues.push(loc(field), e.to_string()))
                .ok()
        };
        let prices = (
            price("input", Some(p.input)),
            price("output", Some(p.output)),
            price("cache_write", p.cache_write),
            price("cache_read", p.cache_read),
        );
        if let (Some(glob), (Some(input), Some(output), Some(cache_write), Some(cache_read))) =
            (glob, prices)
        {
            rules.push(PriceRule {
                glob,
                prices: Prices {
                    input,
                    output,
                    cache_write,
                    cache_read,
                },
            });
        }
    }
    if usage.default_prices {
        PriceTable::with_defaults(rules)
    } else {
        PriceTable::only(rules)
    }
}

/// Validates `[usage]`.
pub(super) fn validate_usage(u: &RawUsage, issues: &mut Issues) -> UsageSettings {
    let d = UsageSettings::default();
    let recent_requests = match u.recent_requests {
        None => d.recent_requests,
        Some(n @ 0..=MAX_RECENT_REQUESTS) => usize::try_from(n).unwrap_or(d.recent_requests),
        Some(n) => {
            issues.push(
                "usage.recent_requests",
                format!(
                    "recent_requests must be between 0 and {MAX_RECENT_REQUESTS} (got {n}); 0 keeps no records for GET /admin/requests"
                ),
            );
            d.recent_requests
        }
    };
    let retention_days = match u.retention_days {
        None => d.retention_days,
        Some(n @ 1..=MAX_RETENTION_DAYS) => u32::try_from(n).unwrap_or(d.retention_days),
        Some(n) => {
            issues.push(
                "usage.retention_days",
                format!("retention_days must be between 1 and {MAX_RETENTION_DAYS} (got {n})"),
            );
            d.retention_days
        }
    };
    UsageSettings {
        recent_requests,
        retention_days,
        default_prices: u.default_prices.unwrap_or(d.default_prices),
    }
}
