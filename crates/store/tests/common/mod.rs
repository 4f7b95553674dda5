//! Shared helpers of the store's integration tests.
#![allow(dead_code)]

use keypool_cooldown::{Attempt, Classification, FailureClass, Trigger};
use keypool_core::{AccountId, UnixMs};
use keypool_store::config::Config;

/// One org `acme`, accounts `a0..a{n}` (priority = index / 2), a whole-org URL `team`,
/// a group `g` of every account with `strategy`, and URL `grp` on it. `server` is
/// appended to a `[server]` table.
pub fn config_text(n: usize, server: &str) -> String {
    let mut s = format!("[server]\n{server}\n[[orgs]]\nslug = \"acme\"\n");
    for i in 0..n {
        s += &format!(
            "[[accounts]]\nid = \"a{i}\"\norg = \"acme\"\nprovider = \"anthropic\"\nauth = \"api_key\"\nsecret = \"s{i}\"\npriority = {}\n",
            i / 2
        );
    }
    let ids: Vec<String> = (0..n).map(|i| format!("\"a{i}\"")).collect();
    s += &format!(
        "[[groups]]\nid = \"g\"\norg = \"acme\"\naccounts = [{}]\n",
        ids.join(", ")
    );
    s += "[[urls]]\ncustom_url = \"team\"\norg = \"acme\"\n";
    s += "[[urls]]\ncustom_url = \"grp\"\norg = \"acme\"\ngroup = \"g\"\n";
    s
}

/// A memory-only store (no state file) over [`config_text`]`(n, …)` with
/// `snapshot_ttl_secs`.
pub async fn memory_store(n: usize, snapshot_ttl_secs: u64) -> keypool_store::Store {
    let server = format!("state_file = \"\"\nsnapshot_ttl_secs = {snapshot_ttl_secs}");
    keypool_store::Store::open(config(&config_text(n, &server)))
        .await
        .unwrap_or_else(|e| panic!("the store does not open: {e}"))
}

pub fn config(text: &str) -> Config {
    Config::from_toml_str(text, None, &|_| None).unwrap_or_else(|e| panic!("{e}"))
}

pub fn window_exhausted(reset: UnixMs) -> Classification {
    Classification {
        class: FailureClass::RateLimit,
        trigger: Trigger::WindowExhausted { reset },
    }
}

pub fn plain_429() -> Classification {
    Classification {
        class: FailureClass::RateLimit,
        trigger: Trigger::PlainRateLimit,
    }
}

pub fn attempt<'a>(account: &'a AccountId, started_at: UnixMs) -> Attempt<'a> {
    Attempt {
        account,
        base_url: "",
        started_at,
        snapshot_len: 4,
        model: "claude-sonnet-4-5",
    }
}

pub const HOUR_MS: u64 = 3_600_000;

/// Headers of a response that put the 5-hour window at `utilization`, resetting at `reset`.
pub fn five_hour_at(utilization: f64, reset: UnixMs) -> keypool_cooldown::facts::RateLimitInfo {
    keypool_cooldown::facts::RateLimitInfo {
        five_hour: keypool_cooldown::facts::WindowUsage {
            utilization: Some(utilization),
            reset: Some(reset),
            status: None,
        },
        ..Default::default()
    }
}

/// The longest a reset may lie ahead (docs/RELIABILITY.md, "Hostile rate-limit
/// headers"): the weekly window's 7 days and 5 minutes of slack. The overall
/// `-reset` and a cooldown loaded from persisted state have the same bound.
pub const WEEKLY_BOUND_MS: u64 = 7 * 24 * HOUR_MS + 5 * 60_000;

/// The window record an older keypool kept for `account` after a 429 with
/// `-status: rejected` and `-reset: 99999999999999999999` (parsed, saturated, as
/// `u64::MAX` ms), as it wrote it to the state file and to Redis.
pub fn far_future_window_json(account: &str, now: UnixMs) -> String {
    format!(
        r#"{{"account":"{account}","info":{{"retry_after_ms":null,"unified_status":"rejected","unified_reset":18446744073709551615,"representative_claim":"five_hour","five_hour":{{"utilization":null,"reset":null,"status":null}},"seven_day":{{"utilization":null,"reset":null,"status":null}},"requests_remaining":null,"requests_reset":null}},"updated_at":{now}}}"#
    )
}

/// The cooldown record the same 429 left (trigger `window_exhausted` until `u64::MAX`).
pub fn far_future_cooldown_json(account: &str, now: UnixMs) -> String {
    format!(
        r#"{{"account":"{account}","until":18446744073709551615,"set_at":{now},"trigger":{{"kind":"window_exhausted","reset":18446744073709551615}},"backoff_level":0,"consecutive_failures":1}}"#
    )
}

/// Headers of a 429 with `-status: rejected` until `reset` for the 5-hour window.
pub fn rejected_until(reset: UnixMs) -> keypool_cooldown::facts::RateLimitInfo {
    keypool_cooldown::facts::RateLimitInfo {
        unified_status: Some(keypool_cooldown::facts::UnifiedStatus::Rejected),
        unified_reset: Some(reset),
        representative_claim: Some("five_hour".into()),
        ..Default::default()
    }
}
