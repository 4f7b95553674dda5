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
    }
}

pub const HOUR_MS: u64 = 3_600_000;

/// Headers of a response that put the 5-hour window at `utilization`, resetting at `reset`.
pub fn five_hour_at(utilization: f64, reset: UnixMs) -> keypool_cooldown::headers::RateLimitInfo {
    keypool_cooldown::headers::RateLimitInfo {
        five_hour: keypool_cooldown::headers::WindowUsage {
            utilization: Some(utilization),
            reset: Some(reset),
            status: None,
        },
        ..Default::default()
    }
}
