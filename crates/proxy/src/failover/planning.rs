//! Planning one request (SPEC 3.5, 3.6 and 4): the pool's snapshot, the rotation
//! counter, the kept survivors, the session's bound account, the hedge budget, and the
//! selector's plan, returned as a [`PlannedRequest`] the walker runs.

use std::sync::Arc;

use keypool_core::{AccountId, Strategy, UnixMs};
use keypool_providers::Endpoint;
use keypool_selector::{
    FanOut, HedgeBudget, Plan, PlanInput, SelectError, needs_counter, plan, survivors_to_keep,
};
use keypool_store::resolve::Route;
use keypool_store::{KeptSurvivors, Snapshot, Store, now_ms, survivor_scope};
use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::attempt::Call;
use crate::availability::HealthAvailability;
use crate::metrics::AffinityOutcome;
use crate::{App, affinity};

/// A request ready to be walked: its snapshot and plan, and what the walk needs
/// besides.
pub(super) struct PlannedRequest {
    pub snapshot: Snapshot,
    pub plan: Plan,
    /// The fan-out's extra attempt, spent from the pool's hedge budget at plan time;
    /// `None` when the plan does not fan out.
    pub extra: Option<ExtraAttempt>,
    /// The request's session binding, when session affinity applies.
    pub session: Option<Session>,
}

/// A session's binding key and the account it was bound to when the request arrived.
pub(super) struct Session {
    pub key: String,
    pub bound: Option<AccountId>,
}

/// The extra attempt a hedge or race spent from its pool's budget when it was planned.
/// Dropped without [`ExtraAttempt::fire`] (the backup never ran: the primary won or
/// failed first, the partner was at its cap, …), it gives the attempt back, so that no
/// path of the walk can forget the refund.
pub(super) struct ExtraAttempt {
    budget: Arc<HedgeBudget>,
    fired: bool,
}

impl ExtraAttempt {
    /// The backup ran: the extra attempt stays spent.
    pub fn fire(mut self) {
        self.fired = true;
    }
}

impl Drop for ExtraAttempt {
    fn drop(&mut self) {
        if !self.fired {
            self.budget.refund(now_ms());
        }
    }
}

/// Plans `call` on `route`'s pool; `Err` is the selector's refusal (every account out
/// of its window, an empty pool), to be answered at once.
pub(super) async fn plan_request(
    call: &Call<'_>,
    route: &Route,
) -> Result<PlannedRequest, SelectError> {
    let app = call.app;
    let store = app.store();
    let settings = call.config.server();
    let now = now_ms();
    let snapshot = store.snapshot(route, now);
    let strategy = route.strategy();
    let pool = route.pool_key();
    let counter = if needs_counter(strategy) {
        store.next_counter(pool.as_str()).await
    } else {
        0
    };
    let budget = app.hedge_budget(&pool, settings.hedge_budget);
    let availability = HealthAvailability::new(store.health(), call.config)
        .with_signals(snapshot.signals())
        .for_model(call.model);
    // A snapshot rebuilt for every request (snapshot_ttl 0) would never be asked again.
    // Survivors are kept per model family; while any model is locked somewhere they
    // depend on the model itself, so the filters run for each request.
    let kept = (settings.snapshot_ttl_ms > 0 && store.health().lockouts.is_empty())
        .then(|| kept_survivors(&snapshot, &availability, store, strategy, now))
        .flatten();
    let mut input = PlanInput::new(&snapshot, &availability, strategy, store.rating(), now)
        .with_counter(counter)
        .with_count_tokens(call.endpoint == Endpoint::CountTokens)
        .with_hedge_min_delay_ms(settings.hedge_min_delay_ms);
    if let Some(kept) = &kept {
        input = input.with_survivors(&kept.survivors);
    }
    if let Some(budget) = &budget {
        input = input.with_hedge_budget(budget);
    }
    // Session affinity: the bound account (if still in the pool) is tried first when
    // the filters keep it.
    let session = match session_key(call, route) {
        Some(key) => {
            let bound = store.session_account(&key, now).await;
            Some(Session { key, bound })
        }
        None => None,
    };
    let bound_index = session
        .as_ref()
        .and_then(|s| s.bound.as_ref())
        .and_then(|id| snapshot.iter().position(|c| &c.id == id));
    if let Some(index) = bound_index {
        input = input.with_prefer(index);
    }
    let mut rng = SmallRng::seed_from_u64(app.next_seed());
    let plan = plan(&input, &mut rng)?;
    if let Some(reason) = plan.fan_out.gate_reason() {
        app.metrics().gate(reason);
    }
    if let Some(session) = &session {
        count_affinity(app, session, bound_index, &plan);
    }
    let extra = match (plan.fan_out, budget) {
        (FanOut::Race { .. } | FanOut::Hedge { .. }, Some(budget)) => Some(ExtraAttempt {
            budget,
            fired: false,
        }),
        _ => None,
    };
    Ok(PlannedRequest {
        snapshot,
        plan,
        extra,
        session,
    })
}

/// The session binding key of a request, when session affinity is on and the request
/// carries a session.
fn session_key(call: &Call<'_>, route: &Route) -> Option<String> {
    if call.config.server().session_affinity_ttl_ms == 0 {
        return None;
    }
    let id = affinity::session_id_with(call.headers, call.user_id)?;
    Some(affinity::binding_key(
        route.org().slug(),
        route.url().custom_url(),
        &id,
    ))
}

/// Counts a session's hit or miss (a re-bind is counted once the request is served
/// elsewhere than its binding).
fn count_affinity(app: &App, session: &Session, bound_index: Option<usize>, plan: &Plan) {
    match bound_index {
        None if session.bound.is_none() => app.metrics().affinity(AffinityOutcome::Miss),
        Some(index) if plan.primary() == index => app.metrics().affinity(AffinityOutcome::Hit),
        // Bound elsewhere (unavailable or removed): counted as a re-bind once served.
        _ => {}
    }
}

/// The filters' survivors for this request: those kept on the snapshot while no signal
/// has changed and no block they saw has ended, else freshly filtered by the selector
/// ([`survivors_to_keep`]) and kept for the next requests. Planning a pool of 1,000
/// accounts then does not walk the pool per request. `None` (plan with the filters)
/// when the filters end in the last resort or an error, which are never kept.
fn kept_survivors(
    snapshot: &Snapshot,
    availability: &HealthAvailability<'_>,
    store: &Store,
    strategy: Strategy,
    now: UnixMs,
) -> Option<Arc<KeptSurvivors>> {
    // Read before filtering: a change while the filters run makes what they find stale
    // at once.
    let epoch = store.health().signal_epoch();
    let scope = survivor_scope(availability.family());
    if let Some(kept) = snapshot.kept_survivors(scope, epoch, now) {
        return Some(kept);
    }
    let found = survivors_to_keep(snapshot, availability, strategy, now)?;
    let kept = Arc::new(KeptSurvivors {
        epoch,
        valid_until: found.valid_until,
        survivors: found.indices,
    });
    snapshot.keep_survivors(scope, Arc::clone(&kept));
    Some(kept)
}
