//! Route explain (issue 24): what the next request of a caller for a model would do,
//! computed from the live state without calling any upstream — the `[[models]]`
//! resolution, every account of the pool with the filter that kept or dropped it, the
//! strategy's order and the hedge/race gate's decision. `GET /admin/explain` and
//! `keypool route explain` both answer with [`explain`].
//!
//! The plan is the selector's own (`keypool_selector::plan`) over the same snapshot and
//! availability the request path uses; the rotation counter is read, not advanced
//! (round robin and weighted rotate from the counter's next value).

use keypool_core::UnixMs;
use keypool_selector::{AccountStatus, Availability, FanOut, PlanInput, needs_counter, plan};
use keypool_store::Store;
use keypool_store::config::Config;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde_json::{Value, json};

use crate::availability::HealthAvailability;

/// What to explain: the route and the caller's key and model.
#[derive(Debug, Clone)]
pub struct ExplainQuery {
    /// The org's slug.
    pub org: String,
    /// The URL config's `custom_url`.
    pub url: String,
    /// The LB key's id (the caller).
    pub key: String,
    /// The request's `model` (an alias, a model with a fallback, or a plain model).
    pub model: String,
}

/// The explanation as JSON, or what is wrong with the query (an unknown org, URL
/// config or key, or a key that may not use the URL config).
pub fn explain(
    store: &Store,
    config: &Config,
    q: &ExplainQuery,
    now: UnixMs,
) -> Result<Value, String> {
    let route = config
        .resolve(&q.org, &q.url)
        .map_err(|_| format!("no URL config {:?} in org {:?}", q.url, q.org))?;
    let key = config
        .lb_key_by_id(&q.key)
        .ok_or_else(|| format!("no LB key with id {:?}", q.key))?;
    if key.revoked() || !key.can_see(route.org().slug(), route.url().custom_url()) {
        return Err(format!(
            "key {:?} may not use {}/{} (revoked, or not in its urls): its requests are 401",
            q.key, q.org, q.url
        ));
    }
    let routes = config.model_routes();
    let (alias, order) = routes
        .order_for(&q.model, key.id())
        .unwrap_or((None, vec![q.model.as_str()]));
    let snapshot = store.snapshot(&route, now);
    let mut models = Vec::new();
    let mut chosen = None;
    for (position, model) in order.iter().enumerate() {
        let availability = HealthAvailability::new(store.health(), config)
            .with_signals(snapshot.signals())
            .for_model(model);
        let accounts: Vec<Value> = snapshot
            .iter()
            .enumerate()
            .map(|(i, c)| account_row(store, config, &availability, i, c, model, now))
            .collect();
        let counter = if needs_counter(route.strategy()) {
            store.peek_counter(route.pool_key().as_str())
        } else {
            0
        };
        let input = PlanInput::new(
            &snapshot,
            &availability,
            route.strategy(),
            store.rating(),
            now,
        )
        .with_counter(counter)
        .with_hedge_min_delay_ms(config.server().hedge_min_delay_ms);
        let planned = plan(&input, &mut SmallRng::seed_from_u64(now));
        let (order_json, fan_out, usable) = match &planned {
            Ok(p) => (
                Value::Array(
                    p.candidates(&snapshot)
                        .map(|c| json!(c.id.as_str()))
                        .collect(),
                ),
                fan_out_json(&p.fan_out, &snapshot),
                !p.last_resort,
            ),
            Err(e) => (Value::Null, json!({"refused": e.to_string()}), false),
        };
        if usable && chosen.is_none() {
            chosen = Some(position);
        }
        models.push(json!({
            "model": model,
            "position": position,
            "accounts": accounts,
            "plan": order_json,
            "last_resort": planned.as_ref().is_ok_and(|p| p.last_resort),
            "fan_out": fan_out,
        }));
    }
    Ok(json!({
        "org": q.org,
        "url": q.url,
        "key": q.key,
        "model": q.model,
        "alias": alias,
        "strategy": route.strategy().as_str(),
        "chain": order,
        "chosen": chosen.map(|p| order[p]),
        "fallback": chosen.is_some_and(|p| p > 0),
        "models": models,
    }))
}

/// One account of the snapshot: kept, or the filter that dropped it.
fn account_row(
    store: &Store,
    config: &Config,
    availability: &HealthAvailability<'_>,
    index: usize,
    c: &keypool_selector::Candidate,
    model: &str,
    now: UnixMs,
) -> Value {
    let health = store.health();
    let id = &c.id;
    let (filter, until) = if !c.active {
        let state = health
            .disabled
            .get(id)
            .map_or("inactive", |d| d.state.as_str());
        (state, None)
    } else if let Some(until) = health.lockouts.locked_until(id, model, now) {
        ("model_locked", Some(until))
    } else {
        match availability.status_of(index, c, now) {
            AccountStatus::OutOfWindow(b) => ("out_of_window", Some(b.until)),
            AccountStatus::CoolingUntil(until) => ("cooling", Some(until)),
            AccountStatus::Available => ("kept", None),
        }
    };
    let window = availability
        .window_block(id, now)
        .map(|b| keypool_selector::window_name(b.window, b.family));
    let cap = config.account(id.as_str()).and_then(|a| a.max_concurrent());
    let in_use = store.slots().in_use(id);
    json!({
        "id": id.as_str(),
        "filter": filter,
        "until": until,
        "window": window.filter(|_| filter == "out_of_window"),
        "max_concurrent": cap,
        "in_use": in_use,
        "at_cap": cap.is_some_and(|cap| in_use >= cap),
    })
}

fn fan_out_json(f: &FanOut, snapshot: &[keypool_selector::Candidate]) -> Value {
    match *f {
        FanOut::Single(reason) => json!({"kind": "single", "gate": reason.as_str()}),
        FanOut::Hedge { partner, delay_ms } => {
            json!({"kind": "hedge", "partner": snapshot[partner].id.as_str(), "delay_ms": delay_ms})
        }
        FanOut::Race { partner } => {
            json!({"kind": "race", "partner": snapshot[partner].id.as_str()})
        }
    }
}
