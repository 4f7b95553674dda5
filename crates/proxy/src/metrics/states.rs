//! The account-state metrics of SPEC 16: `keypool_accounts{state}` (every configured
//! account in exactly one state), the model lockouts running, and the restatements.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use keypool_cooldown::Terminal;
use keypool_core::UnixMs;
use keypool_store::Store;

use super::{Map, Metrics, increment, with_value};

/// Restated answers by rule index.
pub(super) type Restatements = Map<usize, AtomicU64>;

/// Requests served by a fallback model, by (alias or rule model, first choice, served).
pub(super) type Fallbacks = Map<
    (
        std::sync::Arc<str>,
        std::sync::Arc<str>,
        std::sync::Arc<str>,
    ),
    AtomicU64,
>;

/// The states of `keypool_accounts`, in the order they are written.
const STATES: [&str; 8] = [
    "available",
    "cooling",
    "out_of_window",
    "inactive",
    "disabled",
    "credits_exhausted",
    "banned",
    "expired",
];

impl Metrics {
    /// A request a `[[models]]` rule planned past its first choice (issue 24): `alias`
    /// (or the plain model's rule), the first choice `from`, the model `to`.
    pub fn model_fallback(&self, alias: &str, from: &str, to: &str) {
        let key = (
            std::sync::Arc::from(alias),
            std::sync::Arc::from(from),
            std::sync::Arc::from(to),
        );
        with_value(&self.fallbacks, &key, || key.clone(), increment);
    }

    /// An upstream answer rewritten by `[[restate]]` rule `rule` before classification.
    pub fn restated(&self, rule: usize) {
        with_value(&self.restatements, &rule, || rule, increment);
    }

    /// `keypool_accounts{state}`, `keypool_model_lockouts` and
    /// `keypool_restatements_total{rule}`.
    pub(super) fn render_states(&self, out: &mut String, store: &Store, now: UnixMs) {
        let config = store.config();
        let health = store.health();
        let mut counts = [0u64; STATES.len()];
        let mut lockouts = 0;
        for account in config.accounts() {
            let id = account.id();
            lockouts += health.lockouts.of_account(id, now).len();
            let state = match health.disabled.get(id) {
                _ if !account.active() => "inactive",
                Some(d) => d.state.as_str(),
                None if store
                    .out_of_window(id, now)
                    .is_some_and(|o| o.limit.window().is_some()) =>
                {
                    "out_of_window"
                }
                None if store.out_of_window(id, now).is_some()
                    || health.cooldowns.cooldown_until(id, now).is_some() =>
                {
                    "cooling"
                }
                None => "available",
            };
            if let Some(i) = STATES.iter().position(|s| *s == state) {
                counts[i] += 1;
            }
        }
        out.push_str("# HELP keypool_accounts Configured accounts by state (SPEC 16): available, cooling (a cooldown or an API-key request limit), out_of_window, inactive (active = false in the file), and the terminal states disabled, credits_exhausted, banned, expired that need an operator.\n# TYPE keypool_accounts gauge\n");
        for (state, n) in STATES.iter().zip(counts) {
            let _ = writeln!(out, "keypool_accounts{{state=\"{state}\"}} {n}");
        }
        debug_assert!(Terminal::ALL.iter().all(|t| STATES.contains(&t.as_str())));
        let _ = writeln!(
            out,
            "# HELP keypool_model_lockouts (account, model) pairs locked now after a 404 not_found_error (SPEC 16).\n# TYPE keypool_model_lockouts gauge\nkeypool_model_lockouts {lockouts}"
        );
        let mut rows: Vec<(usize, u64)> = self
            .restatements
            .iter()
            .map(|e| (*e.key(), e.value().load(Ordering::Relaxed)))
            .collect();
        rows.sort();
        out.push_str("# HELP keypool_restatements_total Upstream answers whose status a [[restate]] rule rewrote before classification, by rule index.\n# TYPE keypool_restatements_total counter\n");
        for (rule, n) in rows {
            let _ = writeln!(out, "keypool_restatements_total{{rule=\"{rule}\"}} {n}");
        }
        let mut rows: Vec<_> = self
            .fallbacks
            .iter()
            .map(|e| (e.key().clone(), e.value().load(Ordering::Relaxed)))
            .collect();
        rows.sort();
        out.push_str("# HELP keypool_model_fallbacks_total Requests a [[models]] rule planned past its first choice (no account of it was available), by alias (or the rule's model), first choice and model served.\n# TYPE keypool_model_fallbacks_total counter\n");
        for ((alias, from, to), n) in rows {
            let _ = writeln!(
                out,
                "keypool_model_fallbacks_total{{alias=\"{}\",from=\"{}\",to=\"{}\"}} {n}",
                super::escape(&alias),
                super::escape(&from),
                super::escape(&to)
            );
        }
    }
}
