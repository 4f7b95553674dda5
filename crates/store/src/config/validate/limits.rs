//! `[keys.limits]` and `[orgs.limits]` (SPEC 12): each value checked where it is
//! written, then a key's limits merged over its org's defaults (the key's own value
//! wins). The org's `usd_per_month` is not a default: it is the team budget all the
//! org's keys share.

use keypool_ledger::{Limits, ModelGlob, NANO_PER_USD, NanoUsd, Rate};

use super::Issues;
use crate::config::LimitSettings;
use crate::config::raw::RawLimits;

/// The most requests per minute, or burst, a limit may name.
const MAX_RATE: i64 = 1_000_000;
/// The most requests of one key in flight a limit may name.
const MAX_CONCURRENT: i64 = 100_000;
/// The most tokens a budget may name (10^15).
const MAX_TOKENS: i64 = 1_000_000_000_000_000;
/// The most USD a budget may name (a billion).
const MAX_USD: f64 = 1_000_000_000.0;

/// Checks the limits written at `loc` (`keys[3].limits`).
pub(super) fn validate(raw: &RawLimits, loc: &str, issues: &mut Issues) -> LimitSettings {
    let at = |field: &str| format!("{loc}.{field}");
    let count = |field: &str, value: Option<i64>, max: i64, issues: &mut Issues| {
        let v = value?;
        if (1..=max).contains(&v) {
            u64::try_from(v).ok()
        } else {
            issues.push(
                at(field),
                format!("{field} must be a whole number from 1 to {max} (got {v})"),
            );
            None
        }
    };
    let usd = |field: &str, value: Option<f64>, issues: &mut Issues| -> Option<NanoUsd> {
        let v = value?;
        if v.is_finite() && v > 0.0 && v <= MAX_USD {
            Some((v * NANO_PER_USD as f64).round() as NanoUsd)
        } else {
            issues.push(
                at(field),
                format!(
                    "{field} must be a number of USD above 0 and at most 1,000,000,000 (got {v})"
                ),
            );
            None
        }
    };
    let per_minute = count(
        "requests_per_minute",
        raw.requests_per_minute,
        MAX_RATE,
        issues,
    );
    let burst = count("burst", raw.burst, MAX_RATE, issues);
    if raw.burst.is_some() && raw.requests_per_minute.is_none() {
        issues.push(
            at("burst"),
            "burst needs requests_per_minute in the same table: the burst is of that rate",
        );
    }
    let rate = per_minute.map(|per_minute| Rate {
        per_minute: u32::try_from(per_minute).unwrap_or(u32::MAX),
        // A quiet key may send a minute's worth at once, then the rate holds.
        burst: u32::try_from(burst.unwrap_or(per_minute)).unwrap_or(u32::MAX),
    });
    LimitSettings {
        models: globs("models", raw.models.as_deref(), loc, issues),
        deny_models: globs("deny_models", raw.deny_models.as_deref(), loc, issues),
        rate,
        max_concurrent: count("max_concurrent", raw.max_concurrent, MAX_CONCURRENT, issues)
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        tokens_per_day: count("tokens_per_day", raw.tokens_per_day, MAX_TOKENS, issues),
        tokens_per_month: count("tokens_per_month", raw.tokens_per_month, MAX_TOKENS, issues),
        usd_per_day: usd("usd_per_day", raw.usd_per_day, issues),
        usd_per_month: usd("usd_per_month", raw.usd_per_month, issues),
    }
}

fn globs(
    field: &str,
    patterns: Option<&[String]>,
    loc: &str,
    issues: &mut Issues,
) -> Option<Vec<ModelGlob>> {
    let patterns = patterns?;
    if patterns.is_empty() {
        let hint = if field == "models" {
            "models is empty, so no model would be allowed: list the model patterns the key may use, or leave models out for any"
        } else {
            "deny_models is empty: list the model patterns the key may not use, or leave it out"
        };
        issues.push(format!("{loc}.{field}"), hint);
        return None;
    }
    let mut out = Vec::with_capacity(patterns.len());
    for (i, p) in patterns.iter().enumerate() {
        match ModelGlob::try_new(p) {
            Ok(g) => out.push(g),
            Err(e) => issues.push(format!("{loc}.{field}[{i}]"), e.to_string()),
        }
    }
    Some(out)
}

/// A key's limits: each of its own values, else its org's (the org's `usd_per_month` is
/// the team budget, not a default).
pub(super) fn merge(key: Option<&LimitSettings>, org: Option<&LimitSettings>) -> Limits {
    let pick = |f: fn(&LimitSettings) -> bool| match key {
        Some(k) if f(k) => key,
        _ => org,
    };
    let models = pick(|s| s.models.is_some()).and_then(|s| s.models.clone());
    let deny_models = pick(|s| s.deny_models.is_some()).and_then(|s| s.deny_models.clone());
    Limits {
        models: models.unwrap_or_default(),
        deny_models: deny_models.unwrap_or_default(),
        rate: pick(|s| s.rate.is_some()).and_then(|s| s.rate),
        max_concurrent: pick(|s| s.max_concurrent.is_some()).and_then(|s| s.max_concurrent),
        tokens_per_day: pick(|s| s.tokens_per_day.is_some()).and_then(|s| s.tokens_per_day),
        tokens_per_month: pick(|s| s.tokens_per_month.is_some()).and_then(|s| s.tokens_per_month),
        usd_per_day: pick(|s| s.usd_per_day.is_some()).and_then(|s| s.usd_per_day),
        usd_per_month: key.and_then(|k| k.usd_per_month),
    }
}
