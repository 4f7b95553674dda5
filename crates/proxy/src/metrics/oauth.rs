//! The OAuth refresh metrics (SPEC 14): refreshes by account and outcome, and each
//! OAuth account's token expiry.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use keypool_core::AccountId;
use keypool_store::Store;

use super::{Map, Metrics, escape, increment, with_value};

/// Refreshes of one account by outcome: `refreshed`, `failed`, `expired`.
pub(super) type Refreshes = Map<(AccountId, &'static str), AtomicU64>;

impl Metrics {
    /// One refresh of `account`'s access token: `refreshed`, `failed` (backing off),
    /// `expired` (the refresh token is dead).
    pub fn oauth_refresh(&self, account: &AccountId, outcome: &'static str) {
        let key = (account.clone(), outcome);
        with_value(&self.oauth_refreshes, &key, || key.clone(), increment);
    }

    /// `keypool_oauth_refreshes_total{account,outcome}` and
    /// `keypool_oauth_token_expiry_timestamp_seconds{account}`.
    pub(super) fn render_oauth(&self, out: &mut String, store: &Store) {
        let mut rows: Vec<_> = self
            .oauth_refreshes
            .iter()
            .map(|e| (e.key().clone(), e.value().load(Ordering::Relaxed)))
            .collect();
        rows.sort();
        out.push_str("# HELP keypool_oauth_refreshes_total Refreshes of OAuth access tokens, by account and outcome (refreshed; failed: backing off; expired: the refresh token is dead, the account needs a new login).\n# TYPE keypool_oauth_refreshes_total counter\n");
        for ((account, outcome), n) in rows {
            let _ = writeln!(
                out,
                "keypool_oauth_refreshes_total{{account=\"{}\",outcome=\"{outcome}\"}} {n}",
                escape(account.as_str())
            );
        }
        out.push_str("# HELP keypool_oauth_token_expiry_timestamp_seconds When each OAuth account's access token in force expires (unix seconds); keypool renews it refresh_lead_secs before.\n# TYPE keypool_oauth_token_expiry_timestamp_seconds gauge\n");
        let config = store.config();
        for account in config.accounts().filter(|a| a.oauth().is_some()) {
            let Some(at) = store
                .oauth_tokens()
                .current(account.id())
                .and_then(|t| t.expires_at_ms)
            else {
                continue;
            };
            let _ = writeln!(
                out,
                "keypool_oauth_token_expiry_timestamp_seconds{{account=\"{}\"}} {}",
                escape(account.id().as_str()),
                at / 1000
            );
        }
    }
}
