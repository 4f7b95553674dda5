//! Per-account series beyond the latency histograms: upstream requests and failures,
//! usage-window utilisation and resets, the absolute end of each cooldown. Every
//! `account` label is an account id of the configuration, so the series are bounded by
//! it (an account removed by a reload stops being rendered).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use keypool_core::{AccountId, UnixMs};
use keypool_store::Store;

use super::{Metrics, escape};

impl Metrics {
    /// `keypool_account_upstream_requests_total` and
    /// `keypool_account_upstream_failures_total`, for the accounts of the current
    /// configuration.
    pub(super) fn render_account_traffic(&self, out: &mut String, store: &Store) {
        let config = store.config();
        let mut ids: Vec<&AccountId> = config.accounts().map(|a| a.id()).collect();
        ids.sort();
        out.push_str("# HELP keypool_account_upstream_requests_total Upstream attempts started, by account (hedge and race backups included).\n# TYPE keypool_account_upstream_requests_total counter\n");
        for id in &ids {
            let n = self.account_attempts(id);
            let _ = writeln!(
                out,
                "keypool_account_upstream_requests_total{{account=\"{}\"}} {n}",
                escape(id.as_str())
            );
        }
        out.push_str("# HELP keypool_account_upstream_failures_total Failed upstream attempts and broken committed streams, by account and failure class (key_error, rate_limit, transient).\n# TYPE keypool_account_upstream_failures_total counter\n");
        let mut rows: Vec<_> = self
            .account_failures
            .iter()
            .filter(|e| config.account(e.key().0.as_str()).is_some())
            .map(|e| (e.key().clone(), e.value().load(Ordering::Relaxed)))
            .collect();
        rows.sort();
        for ((account, class), n) in rows {
            let _ = writeln!(
                out,
                "keypool_account_upstream_failures_total{{account=\"{}\",class=\"{class}\"}} {n}",
                escape(account.as_str())
            );
        }
    }
}

/// `keypool_account_window_utilization_ratio`, `keypool_account_window_reset_timestamp_seconds`
/// (for the windows an upstream reported) and `keypool_account_cooldown_until_timestamp_seconds`
/// (for the accounts cooling now).
pub(super) fn render_account_windows(out: &mut String, store: &Store, now: UnixMs) {
    let config = store.config();
    let health = store.health();
    let mut ids: Vec<&AccountId> = config.accounts().map(|a| a.id()).collect();
    ids.sort();
    let mut utilization = String::new();
    let mut resets = String::new();
    let mut cooling = String::new();
    for id in ids {
        let account = escape(id.as_str());
        if let Some(state) = health.windows.state(id) {
            for (window, usage) in [
                ("5h", &state.info.five_hour),
                ("weekly", &state.info.seven_day),
            ] {
                if let Some(u) = usage.utilization {
                    let _ = writeln!(
                        utilization,
                        "keypool_account_window_utilization_ratio{{account=\"{account}\",window=\"{window}\"}} {u}"
                    );
                }
                if let Some(reset) = usage.reset {
                    let _ = writeln!(
                        resets,
                        "keypool_account_window_reset_timestamp_seconds{{account=\"{account}\",window=\"{window}\"}} {}",
                        seconds(reset)
                    );
                }
            }
        }
        if let Some(until) = health.cooldowns.cooldown_until(id, now) {
            let _ = writeln!(
                cooling,
                "keypool_account_cooldown_until_timestamp_seconds{{account=\"{account}\"}} {}",
                seconds(until)
            );
        }
    }
    out.push_str("# HELP keypool_account_window_utilization_ratio Usage-window utilisation the upstream last reported (0-1, may exceed 1), by account and window (5h, weekly).\n# TYPE keypool_account_window_utilization_ratio gauge\n");
    out.push_str(&utilization);
    out.push_str("# HELP keypool_account_window_reset_timestamp_seconds When each usage window resets (unix seconds), by account and window (5h, weekly).\n# TYPE keypool_account_window_reset_timestamp_seconds gauge\n");
    out.push_str(&resets);
    out.push_str("# HELP keypool_account_cooldown_until_timestamp_seconds When each cooling account's cooldown ends (unix seconds); accounts not cooling have no series.\n# TYPE keypool_account_cooldown_until_timestamp_seconds gauge\n");
    out.push_str(&cooling);
}

/// Unix ms as seconds, with the milliseconds kept.
fn seconds(ms: UnixMs) -> f64 {
    ms as f64 / 1000.0
}
