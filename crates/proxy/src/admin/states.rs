//! The account states of SPEC 16 in the admin API: one state name per account (the
//! terminal states beside `disabled`; an API-key request limit as `cooling`, SPEC 5),
//! the per-family weekly windows, and the model lockouts with their list and clear
//! routes (`GET /admin/lockouts`, `POST /admin/accounts/{id}/clear-lockouts[?model=]`).

use http::{Response, StatusCode};
use keypool_cooldown::facts::WindowUsage;
use keypool_cooldown::{CooldownEntry, OutOfWindow, UsageLimit};
use keypool_core::{AccountId, ModelFamily, UnixMs};
use keypool_store::Store;
use keypool_store::config::{Account, Config};
use serde_json::{Value, json};

use super::{json_response, out_of_window_json};
use crate::body::ProxyBody;

/// What keeps one account out of rotation now, as the status page and the API name it.
pub(super) struct AccountState {
    /// `inactive`, a terminal state (`disabled`, `credits_exhausted`, `banned`,
    /// `expired`), `out_of_window`, `cooling` or `active`.
    pub name: &'static str,
    /// A usage window of the whole account (never an API-key request limit).
    pub out_of_window: Option<OutOfWindow>,
    /// The cooldown, or the request limit shown as one (`requests_exhausted`).
    pub cooldown: Option<Value>,
}

/// The state of `account` at `now`.
pub(super) fn account_state(store: &Store, account: &Account, now: UnixMs) -> AccountState {
    let health = store.health();
    let id = account.id();
    let out = store.out_of_window(id, now);
    let (window, requests) = match out {
        Some(o) if o.limit == UsageLimit::Requests => (None, Some(o)),
        other => (other, None),
    };
    let entry = health.cooldowns.entry(id).filter(|e| e.until > now);
    let cooldown = match (entry, requests) {
        (Some(e), r) if r.is_none_or(|r| e.until >= r.until) => Some(cooldown_json(&e, now)),
        (_, Some(r)) => Some(json!({
            "until": r.until,
            "remaining_ms": r.until.saturating_sub(now),
            "trigger": "requests_exhausted",
            "class": "rate_limit",
        })),
        (_, None) => None,
    };
    let name = if !account.active() {
        "inactive"
    } else if let Some(d) = health.disabled.get(id) {
        d.state.as_str()
    } else if window.is_some() {
        "out_of_window"
    } else if cooldown.is_some() {
        "cooling"
    } else {
        "active"
    };
    AccountState {
        name,
        out_of_window: window,
        cooldown,
    }
}

fn cooldown_json(e: &CooldownEntry, now: UnixMs) -> Value {
    json!({
        "until": e.until,
        "remaining_ms": e.until.saturating_sub(now),
        "trigger": e.trigger.as_str(),
        "set_at": e.set_at,
        "backoff_level": e.backoff_level,
        "consecutive_failures": e.consecutive_failures,
        "forbidden_streak": e.forbidden_streak,
    })
}

/// The per-family weekly windows the upstream reported, each with the block it sets.
pub(super) fn families_json(store: &Store, account: &AccountId, now: UnixMs) -> Value {
    let Some(state) = store.health().windows.state(account) else {
        return json!([]);
    };
    let threshold = store
        .config()
        .account(account.as_str())
        .and_then(|a| a.window_threshold())
        .map_or_else(|| store.health().windows.default_threshold(), |t| t.get());
    let rows: Vec<Value> = ModelFamily::ALL
        .iter()
        .filter_map(|f| {
            let usage: &WindowUsage = state.info.families.get(*f);
            let block = state.family_block(*f, threshold, now);
            (!usage.is_empty() || block.is_some()).then(|| {
                json!({
                    "family": f.as_str(),
                    "utilization": usage.utilization,
                    "reset": usage.reset,
                    "status": usage.status.map(|s| s.as_str()),
                    "out_of_window": block.as_ref().map(out_of_window_json),
                })
            })
        })
        .collect();
    Value::Array(rows)
}

/// The account's running model lockouts.
pub(super) fn lockouts_json(store: &Store, account: &AccountId, now: UnixMs) -> Value {
    let rows: Vec<Value> = store
        .lockouts(account, now)
        .into_iter()
        .map(|(model, l)| {
            json!({
                "model": model,
                "until": l.until,
                "remaining_ms": l.until.saturating_sub(now),
                "failures": l.failures,
            })
        })
        .collect();
    Value::Array(rows)
}

/// `GET /admin/lockouts`: every running model lockout, by account.
pub(super) fn all_lockouts(store: &Store, config: &Config, now: UnixMs) -> Response<ProxyBody> {
    let mut rows = Vec::new();
    let mut ids: Vec<&AccountId> = config.accounts().map(|a| a.id()).collect();
    ids.sort();
    for id in ids {
        for (model, l) in store.lockouts(id, now) {
            rows.push(json!({
                "account": id.as_str(),
                "model": model,
                "until": l.until,
                "remaining_ms": l.until.saturating_sub(now),
                "failures": l.failures,
            }));
        }
    }
    json_response(StatusCode::OK, &json!({ "lockouts": rows }))
}

/// `POST /admin/accounts/{id}/clear-lockouts[?model=M]`: ends the account's lockouts
/// of `M`, or all of them.
pub(super) fn clear_lockouts(
    store: &Store,
    account: &Account,
    query: Option<&str>,
    now: UnixMs,
) -> Response<ProxyBody> {
    let params = super::usage::params(query);
    let model = params
        .get("model")
        .map(String::as_str)
        .filter(|m| !m.is_empty());
    let cleared = store.clear_lockouts(account.id(), model, now);
    tracing::info!(account = %account.id(), model = model.unwrap_or("*"), cleared, "admin: model lockouts cleared");
    json_response(
        StatusCode::OK,
        &json!({"account": account.id().as_str(), "model": model, "cleared": cleared}),
    )
}
