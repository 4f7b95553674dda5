//! Each caller's use against its limits (SPEC 12), for `GET /admin/usage?by=caller`,
//! `GET /admin/usage/summary` and the status page: every key with limits, and every
//! org with a team budget, with what is used now (settled and reserved; every
//! replica's with Redis) and a line a person reads: `alice: $12.40 of $20.00 today,
//! resets 00:00 UTC`.

use std::sync::Arc;

use keypool_core::UnixMs;
use keypool_ledger::{LimitKind, Limits, Period, SpendKey, Who};
use keypool_store::Store;
use keypool_store::config::Config;
use keypool_store::limits::budget_period;
use serde_json::{Value, json};

use crate::limits::amount;
use crate::reject::format_utc;

/// `00:00 UTC` for a reset today or tomorrow, else `2027-01-01 00:00 UTC`.
fn reset_text(resets_at: UnixMs, now: UnixMs) -> String {
    let full = format_utc(resets_at);
    let (date, time) = full.split_once('T').unwrap_or((&full, ""));
    let hm = time.get(..5).unwrap_or("00:00");
    if resets_at.saturating_sub(now) <= 86_400_000 {
        format!("{hm} UTC")
    } else {
        format!("{date} {hm} UTC")
    }
}

/// One budget's entry.
async fn budget(
    store: &Store,
    name: &str,
    kind: LimitKind,
    limit: u64,
    key: SpendKey,
    now: UnixMs,
) -> Value {
    let used = store.limit_usage(&key).await;
    let used = if kind.is_usd() {
        used.nano_usd
    } else {
        used.tokens
    };
    let period = key.period;
    let when = match period {
        Period::Day(_) => "today",
        Period::Month(_) => "this month",
    };
    let resets_at = period.end();
    json!({
        "limit": kind.as_str(),
        "unit": if kind.is_usd() { "nano_usd" } else { "tokens" },
        "value": limit,
        "used": used,
        "period": period.to_string(),
        "resets_at": resets_at,
        "text": format!(
            "{name}: {} of {} {when}, resets {}",
            amount(kind, used),
            amount(kind, limit),
            reset_text(resets_at, now)
        ),
    })
}

fn globs(g: &[keypool_ledger::ModelGlob]) -> Vec<&str> {
    g.iter().map(keypool_ledger::ModelGlob::as_str).collect()
}

/// The entries of one key's limits.
async fn key_limits(store: &Store, who: &Who, limits: &Limits, now: UnixMs) -> Vec<Value> {
    let mut out = Vec::new();
    let name = &*who.caller;
    if !limits.models.is_empty() || !limits.deny_models.is_empty() {
        out.push(json!({
            "limit": "models",
            "models": globs(&limits.models),
            "deny_models": globs(&limits.deny_models),
        }));
    }
    if let Some(rate) = limits.rate {
        out.push(json!({
            "limit": "requests_per_minute",
            "value": rate.per_minute,
            "burst": rate.burst,
            "text": format!("{name}: {} requests a minute, {} at once", rate.per_minute, rate.burst),
        }));
    }
    if let Some(cap) = limits.max_concurrent {
        let n = store.limit_in_flight(who);
        out.push(json!({
            "limit": "max_concurrent",
            "value": cap,
            "in_flight": n,
            "text": format!("{name}: {n} of {cap} requests in flight (this replica)"),
        }));
    }
    let budgets: [(LimitKind, Option<u64>); 4] = [
        (LimitKind::TokensPerDay, limits.tokens_per_day),
        (LimitKind::TokensPerMonth, limits.tokens_per_month),
        (LimitKind::UsdPerDay, limits.usd_per_day),
        (LimitKind::UsdPerMonth, limits.usd_per_month),
    ];
    for (kind, limit) in budgets {
        let (Some(limit), Some(period)) = (limit, budget_period(kind, now)) else {
            continue;
        };
        let key = SpendKey {
            org: who.org.clone(),
            caller: Some(who.caller.clone()),
            period,
        };
        out.push(budget(store, name, kind, limit, key, now).await);
    }
    out
}

/// Every key with limits and every org with a team budget, sorted by org and key.
pub(super) async fn limits_json(store: &Store, config: &Config, now: UnixMs) -> Value {
    let mut keys: Vec<_> = config.keys().filter(|k| !k.revoked()).collect();
    keys.sort_by(|a, b| (a.org(), a.id()).cmp(&(b.org(), b.id())));
    let mut out = Vec::new();
    for key in keys {
        let Some(limits) = key.limits() else {
            continue;
        };
        let who = key.who();
        out.push(json!({
            "org": key.org(),
            "caller": key.id(),
            "limits": key_limits(store, &who, limits, now).await,
        }));
    }
    let mut orgs: Vec<_> = config.orgs().collect();
    orgs.sort_by(|a, b| a.slug().cmp(b.slug()));
    for org in orgs {
        let Some(team) = org.team_usd_per_month() else {
            continue;
        };
        let Some(period) = budget_period(LimitKind::TeamUsdPerMonth, now) else {
            continue;
        };
        let key = SpendKey {
            org: Arc::from(org.slug()),
            caller: None,
            period,
        };
        let name = format!("{} (team)", org.slug());
        let entry = budget(store, &name, LimitKind::TeamUsdPerMonth, team, key, now).await;
        out.push(json!({"org": org.slug(), "team": true, "limits": [entry]}));
    }
    json!(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_today_reads_as_a_time_and_a_later_one_with_its_date() {
        // 2026-12-01T12:00:00Z
        let now = 1_796_126_400_000;
        assert_eq!(reset_text(1_796_169_600_000, now), "00:00 UTC");
        assert_eq!(reset_text(1_798_761_600_000, now), "2027-01-01 00:00 UTC");
        assert_eq!(amount(LimitKind::UsdPerDay, 12_400_000_000), "$12.40");
    }
}
