//! Steps 5–8 of SPEC 3 and the hedge/race of SPEC 4: plan, walk the plan one attempt
//! per account, credit every outcome to the account that produced it, answer.
//!
//! At most two attempts run at once, and only as primary and hedge/race partner (the
//! planner guarantees a different `base_url`). Every other attempt starts only when
//! nothing is in flight, in plan order. The first attempt to reach its commit point
//! wins; the other is dropped in flight (its upstream connection closes) and credited
//! with nothing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};
use keypool_cooldown::{Attempt, AttemptFailure, Classification, TransportFailure, classify};
use keypool_core::Strategy;
use keypool_core::{AccountId, UnixMs};
use keypool_providers::{Endpoint, Usage, passthrough_body};
use keypool_selector::{
    Candidate, FanOut, PlanInput, Sample, filter_snapshot, needs_counter, plan,
};
use keypool_store::config::Account;
use keypool_store::resolve::Route;
use keypool_store::slots::SlotGuard;
use keypool_store::{KeptSurvivors, Snapshot, Store, StoreError, now_ms};
use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::attempt::{Call, Failure, Ready, ReadyKind, attempt, upstream_account};
use crate::availability::HealthAvailability;
use crate::body::{ProxyBody, StreamBody, StreamEnd, StreamFinish};
use crate::ceiling::AttemptCeiling;
use crate::headers::copy_safe_response_headers;
use crate::log::RequestLog;
use crate::metrics::{AffinityOutcome, FanOutRole, InFlight};
use crate::rescue::{Reject, X_SHOULD_RETRY, json_error, rescue};
use crate::{App, affinity};

type AttemptFuture<'a> = Pin<Box<dyn Future<Output = Result<Ready, Failure>> + Send + 'a>>;

struct Slot<'a> {
    future: AttemptFuture<'a>,
    /// Index into the snapshot.
    index: usize,
    started_at: UnixMs,
    role: FanOutRole,
    first_chunk: Arc<AtomicBool>,
    /// Counts the attempt in the account's in-flight gauge while the slot lives.
    in_flight: InFlight,
    /// The account's concurrency slot (`max_concurrent`), given back when dropped.
    capacity: Option<SlotGuard>,
}

/// Whether an account can take one more attempt now.
enum Capacity {
    /// Yes: with the slot to hold, or `None` for an account without `max_concurrent`.
    Free(Option<SlotGuard>),
    /// It is at its cap (the value).
    Full(u32),
}

async fn capacity(store: &Store, account: &Account) -> Capacity {
    match account.max_concurrent() {
        None => Capacity::Free(None),
        Some(cap) => match store.slots().try_acquire(account.id(), cap).await {
            Some(guard) => Capacity::Free(Some(guard)),
            None => Capacity::Full(cap),
        },
    }
}

// Short-lived, on the stack of one request: boxing the result would cost an allocation
// per attempt for nothing.
#[allow(clippy::large_enum_variant)]
enum Event {
    Done(usize, Result<Ready, Failure>),
    HedgeDelay,
}

/// Plans and runs the attempts of one request; returns the response and the number of
/// attempts made.
pub(crate) async fn serve<'c>(
    call: &'c Call<'c>,
    route: &Route,
    log: &mut Option<RequestLog>,
    request_id: &str,
) -> Response<ProxyBody> {
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
    let availability =
        HealthAvailability::new(store.health(), call.config).with_signals(snapshot.signals());
    // A snapshot rebuilt for every request (snapshot_ttl 0) would never be asked again.
    let kept = (settings.snapshot_ttl_ms > 0)
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
    let affinity_ttl = settings.session_affinity_ttl_ms;
    let session = (affinity_ttl > 0)
        .then(|| affinity::session_id_with(call.headers, call.user_id))
        .flatten()
        .map(|id| affinity::binding_key(route.org().slug(), route.url().custom_url(), &id));
    let bound = match &session {
        Some(key) => store.session_account(key, now).await,
        None => None,
    };
    let bound_index = bound
        .as_ref()
        .and_then(|id| snapshot.iter().position(|c| &c.id == id));
    if let Some(index) = bound_index {
        input = input.with_prefer(index);
    }
    let mut rng = SmallRng::seed_from_u64(app.next_seed());
    let plan = match plan(&input, &mut rng) {
        Ok(plan) => plan,
        Err(e) => {
            app.metrics().attempts(0);
            return rescue(&Reject::from(e), request_id);
        }
    };
    if let Some(reason) = plan.fan_out.gate_reason() {
        app.metrics().gate(reason);
    }
    if session.is_some() {
        match bound_index {
            None if bound.is_none() => app.metrics().affinity(AffinityOutcome::Miss),
            Some(index) if plan.primary() == index => app.metrics().affinity(AffinityOutcome::Hit),
            // Bound elsewhere (unavailable or removed): counted as a re-bind once served.
            _ => {}
        }
    }

    let order = &plan.attempts;
    let mut slots: [Option<Slot<'c>>; 2] = [None, None];
    let mut next = 0usize;
    let mut ceiling = AttemptCeiling::new(order.len());
    // The last failure and the snapshot index of its account.
    let mut last_failure: Option<(Failure, usize)> = None;
    let mut hedge: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let mut backup_pending = false;
    let mut backup_started = false;
    // Accounts of the plan skipped because they were at their cap, kept for the queue.
    let mut deferred: Vec<(usize, Arc<Account>, u32)> = Vec::new();
    let mut queue_rejection: Option<StoreError> = None;
    let mut local_failure = false;
    let max_wait = Duration::from_millis(settings.queue_max_wait_ms);

    let start = |slot: &mut Option<Slot<'c>>,
                 index: usize,
                 role,
                 account: Arc<Account>,
                 capacity: Option<SlotGuard>| {
        let first_chunk = Arc::new(AtomicBool::new(false));
        let in_flight = app.metrics().start_in_flight(account.id());
        *slot = Some(Slot {
            future: Box::pin(attempt(call, account, first_chunk.clone())),
            index,
            started_at: now_ms(),
            role,
            first_chunk,
            in_flight,
            capacity,
        });
    };
    let account_of = |c: &Candidate| call.config.account(c.id.as_str()).cloned();

    match plan.fan_out {
        FanOut::Race { .. } | FanOut::Hedge { .. } => {
            // A primary at its cap leaves the fan-out to the walk below (which defers
            // it); a race partner at its cap leaves the primary alone.
            if let (Some(a), Some(b)) = (
                account_of(&snapshot[order[0]]),
                order.get(1).and_then(|&i| account_of(&snapshot[i])),
            ) && let Capacity::Free(primary_slot) = capacity(store, &a).await
            {
                start(
                    &mut slots[0],
                    order[0],
                    FanOutRole::Primary,
                    a,
                    primary_slot,
                );
                next = 1;
                ceiling.start();
                match plan.fan_out {
                    FanOut::Race { .. } => {
                        if let Capacity::Free(partner_slot) = capacity(store, &b).await {
                            start(&mut slots[1], order[1], FanOutRole::Backup, b, partner_slot);
                            app.metrics().backup_fired(true);
                            backup_started = true;
                            next = 2;
                            ceiling.start();
                        } else if let Some(budget) = &budget {
                            budget.refund(now_ms());
                        }
                    }
                    FanOut::Hedge { delay_ms, .. } => {
                        hedge = Some(Box::pin(tokio::time::sleep(Duration::from_millis(
                            delay_ms,
                        ))));
                        backup_pending = true;
                    }
                    FanOut::Single(_) => {}
                }
            } else if let Some(budget) = &budget {
                // No fan-out after all (the primary is at its cap): give the extra back.
                budget.refund(now_ms());
            }
        }
        FanOut::Single(_) => {}
    }

    loop {
        if slots.iter().all(Option::is_none) {
            if backup_pending {
                // The primary failed before the hedge delay: the partner is simply the
                // next attempt of the plan; the budget's extra attempt is given back.
                backup_pending = false;
                hedge = None;
                if let Some(budget) = &budget {
                    budget.refund(now_ms());
                }
            }
            let mut launched = false;
            while ceiling.may_start() && next < order.len() {
                let index = order[next];
                next += 1;
                let candidate = &snapshot[index];
                let Some(account) = account_of(candidate) else {
                    continue;
                };
                let base_url = candidate.base_url.as_deref().unwrap_or("");
                if !store.health().breakers.allow(base_url, now_ms()) {
                    push_attempt(log, &candidate.id, "breaker_open");
                    continue;
                }
                match capacity(store, &account).await {
                    Capacity::Free(slot) => {
                        start(&mut slots[0], index, FanOutRole::Primary, account, slot);
                        ceiling.start();
                        launched = true;
                        break;
                    }
                    Capacity::Full(cap) => deferred.push((index, account, cap)),
                }
            }
            if !launched && ceiling.may_start() && !deferred.is_empty() {
                // Every other account of the plan is used up: wait in the FIFO queue for
                // the first slot of the accounts at their cap.
                let wants: Vec<_> = deferred
                    .iter()
                    .map(|(_, account, cap)| (account.id().clone(), *cap))
                    .collect();
                match store
                    .slots()
                    .wait(&wants, max_wait, settings.queue_max_depth)
                    .await
                {
                    Ok(slot) => {
                        if let Some(pos) = deferred.iter().position(|d| d.1.id() == slot.account())
                        {
                            let (index, account, _) = deferred.remove(pos);
                            start(
                                &mut slots[0],
                                index,
                                FanOutRole::Primary,
                                account,
                                Some(slot),
                            );
                            ceiling.start();
                            launched = true;
                        }
                    }
                    Err(e) => {
                        app.metrics()
                            .queue_rejection(matches!(e, StoreError::QueueFull { .. }));
                        queue_rejection = Some(e);
                    }
                }
            }
            if !launched {
                break;
            }
        }
        let event = std::future::poll_fn(|cx| {
            for (i, slot) in slots.iter_mut().enumerate() {
                if let Some(slot) = slot
                    && let Poll::Ready(result) = slot.future.as_mut().poll(cx)
                {
                    return Poll::Ready(Event::Done(i, result));
                }
            }
            if let Some(sleep) = hedge.as_mut()
                && sleep.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(Event::HedgeDelay);
            }
            Poll::Pending
        })
        .await;
        match event {
            Event::HedgeDelay => {
                hedge = None;
                backup_pending = false;
                let primary_has_chunk = slots[0]
                    .as_ref()
                    .is_some_and(|s| s.first_chunk.load(Ordering::Acquire));
                let partner = order.get(1).and_then(|&i| account_of(&snapshot[i]));
                let partner_slot = match &partner {
                    Some(account) if slots[0].is_some() && !primary_has_chunk && next == 1 => {
                        match capacity(store, account).await {
                            Capacity::Free(slot) => Some(slot),
                            Capacity::Full(_) => None,
                        }
                    }
                    _ => None,
                };
                match (partner, partner_slot) {
                    (Some(account), Some(slot)) => {
                        start(&mut slots[1], order[1], FanOutRole::Backup, account, slot);
                        app.metrics().backup_fired(false);
                        backup_started = true;
                        next = 2;
                        ceiling.start();
                    }
                    _ => {
                        if let Some(budget) = &budget {
                            budget.refund(now_ms());
                        }
                    }
                }
            }
            Event::Done(i, result) => {
                let Some(slot) = slots[i].take() else {
                    continue;
                };
                match result {
                    Ok(ready) => {
                        // A win counts only when primary and backup really ran together.
                        if backup_started {
                            app.metrics().fan_out_win(slot.role);
                        }
                        if backup_pending && let Some(budget) = &budget {
                            budget.refund(now_ms());
                        }
                        // The other attempt, if any, is aborted in flight: dropped
                        // with `slots`, credited with nothing.
                        for other in slots.iter_mut().filter_map(Option::take) {
                            push_attempt(log, &snapshot[other.index].id, "aborted");
                        }
                        app.metrics().attempts(ceiling.started() as u64);
                        let candidate = &snapshot[slot.index];
                        if let Some(key) = &session {
                            // Bind, re-bind or refresh: the session follows the account
                            // that actually served.
                            let served = &candidate.id;
                            store
                                .bind_session(key, served, affinity_ttl, now_ms())
                                .await;
                            if bound.as_ref().is_some_and(|b| b != served) {
                                app.metrics().affinity(AffinityOutcome::Rebind);
                            }
                        }
                        return commit(
                            call,
                            candidate,
                            slot.started_at,
                            snapshot.len(),
                            ready,
                            log,
                            (slot.in_flight, slot.capacity),
                        );
                    }
                    Err(failure) => {
                        let candidate = &snapshot[slot.index];
                        let Some(c) = record_failure(
                            app,
                            candidate,
                            slot.started_at,
                            snapshot.len(),
                            &failure,
                        ) else {
                            // keypool's own resources ran out: nothing is the account's
                            // fault and the next account would fail the same way.
                            if let Failure::Local(local) = failure {
                                tracing::error!(
                                    account = %candidate.id,
                                    resource = local.as_str(),
                                    "keypool's own resources ran out during an attempt; not counted against the account"
                                );
                                app.metrics().local_failure(local.as_str());
                                local_failure = true;
                            }
                            push_attempt(log, &candidate.id, "local_failure");
                            for other in slots.iter_mut().filter_map(Option::take) {
                                push_attempt(log, &snapshot[other.index].id, "aborted");
                            }
                            break;
                        };
                        push_attempt(log, &candidate.id, c.trigger.as_str());
                        let in_flight = slots.iter().filter(|s| s.is_some()).count();
                        ceiling.failed(c.is_request_error(), in_flight);
                        last_failure = Some((failure, slot.index));
                        if ceiling.terminal() {
                            for other in slots.iter_mut().filter_map(Option::take) {
                                push_attempt(log, &snapshot[other.index].id, "aborted");
                            }
                        }
                    }
                }
            }
        }
    }
    app.metrics().attempts(ceiling.started() as u64);
    if local_failure {
        return rescue(&Reject::overloaded(1), request_id);
    }
    if let Some(e) = queue_rejection {
        return queue_rejected(&e, request_id);
    }
    exhausted(call, &snapshot, last_failure, request_id)
}

/// `429 rate_limit_error` when no concurrency slot came free in time or the queue was
/// full: `Retry-After: 1` (slots come back as requests finish) and
/// `x-should-retry: true`.
fn queue_rejected(e: &StoreError, request_id: &str) -> Response<ProxyBody> {
    let mut response = rescue(&Reject::at_capacity(e.to_string()), request_id);
    response
        .headers_mut()
        .insert(X_SHOULD_RETRY, HeaderValue::from_static("true"));
    response
}

fn push_attempt(log: &mut Option<RequestLog>, account: &AccountId, outcome: &'static str) {
    if let Some(log) = log {
        log.attempts.push((account.clone(), outcome));
    }
}

/// Credits a failed attempt to its account: classification, cooldown or disabling,
/// breaker, rating sample, metrics. `None` for keypool's own failure, which is never
/// the account's.
fn record_failure(
    app: &App,
    candidate: &Candidate,
    started_at: UnixMs,
    snapshot_len: usize,
    failure: &Failure,
) -> Option<Classification> {
    // A status failure happened when its head arrived: its `Retry-After` (seconds or a
    // date) and resets count from then, however long the error body took.
    let (attempt_failure, at) = match failure {
        Failure::Status {
            status,
            rate_limit,
            received_at,
            ..
        } => (
            AttemptFailure::Status {
                status: *status,
                rate_limit,
            },
            *received_at,
        ),
        Failure::Transport(t) => (AttemptFailure::Transport(*t), now_ms()),
        Failure::Local(_) => return None,
    };
    let attempt = Attempt {
        account: &candidate.id,
        base_url: candidate.base_url.as_deref().unwrap_or(""),
        started_at,
        snapshot_len,
    };
    Some(credit_failure(app, &attempt, &attempt_failure, at))
}

/// Credits a failure (of an attempt, or of a committed stream) to its account:
/// classification, cooldown or disabling, breaker, rating sample, failover metric.
fn credit_failure(
    app: &App,
    attempt: &Attempt<'_>,
    failure: &AttemptFailure<'_>,
    now: UnixMs,
) -> Classification {
    let c = classify(failure, now);
    let store = app.store();
    store.record_failure(attempt, &c, now);
    let sample = if c.is_request_error() {
        Sample::RequestError
    } else {
        Sample::Failure
    };
    store.record_rating(attempt.account, sample, now);
    app.metrics().failover(&c);
    c
}

/// Credits a success (a complete answer, or a stream that completed) to its account:
/// the cooldown book and breaker, the rating sample, the total-time metric.
fn credit_success(app: &App, attempt: &Attempt<'_>, ttft_ms: u64, total_ms: u64, now: UnixMs) {
    let store = app.store();
    store.record_success(attempt, now);
    store.record_rating(attempt.account, Sample::Success { ttft_ms, total_ms }, now);
    app.metrics().total(attempt.account, total_ms);
}

/// Seconds until the earliest cooldown of the pool ends, at least 1.
/// The filters' survivors for this request: those kept on the snapshot while no signal
/// has changed and no block they saw has ended, else freshly filtered and kept for the
/// next requests. Planning a pool of 1,000 accounts then does not walk the pool per
/// request. `None` (plan with the filters) when the filters end in the last resort or
/// an error, which are never kept.
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
    if let Some(kept) = snapshot.kept_survivors(epoch, now) {
        return Some(kept);
    }
    // No last resort is kept, so the random tie-break is never used for a kept result.
    let found = filter_snapshot(snapshot, availability, now, &mut SmallRng::seed_from_u64(0))
        .ok()
        .filter(|found| !found.last_resort)?;
    let valid_until = snapshot
        .iter()
        .zip(snapshot.signals())
        .filter(|(candidate, _)| candidate.active)
        .map(|(_, s)| (s.cooldown.until(), s.window.until()))
        .filter(|&(cooling, window)| cooling > now || window > now)
        .map(|(cooling, window)| cooling.max(window))
        .min()
        .unwrap_or(UnixMs::MAX);
    let mut survivors = found.indices;
    if strategy == Strategy::RoundRobin {
        survivors.sort_unstable_by_key(|&i| snapshot[i].rotation_rank);
    }
    let kept = Arc::new(KeptSurvivors {
        epoch,
        valid_until,
        survivors,
    });
    snapshot.keep_survivors(Arc::clone(&kept));
    Some(kept)
}

fn earliest_cooldown_secs(app: &App, snapshot: &[Candidate]) -> u64 {
    let now = now_ms();
    snapshot
        .iter()
        .filter_map(|c| app.store().health().cooldowns.cooldown_until(&c.id, now))
        .min()
        .map_or(1, |until| until.saturating_sub(now).div_ceil(1000).max(1))
}

/// Every attempt failed (or none could be made): the generic `503`, or the
/// pass-through of a terminal `429`/`402` (or another `passthrough_statuses` code).
fn exhausted(
    call: &Call<'_>,
    snapshot: &[Candidate],
    last: Option<(Failure, usize)>,
    request_id: &str,
) -> Response<ProxyBody> {
    let wait = earliest_cooldown_secs(call.app, snapshot);
    if let Some((
        Failure::Status {
            status,
            rate_limit,
            body,
            ..
        },
        index,
    )) = &last
        && let Some(account) = call.config.account(snapshot[*index].id.as_str())
        && call
            .config
            .server()
            .passthrough_statuses
            .contains(&status.as_u16())
    {
        // Capped as a retry-after cooldown is (SPEC 6: at most 1 h by default).
        let cap = call
            .config
            .cooldown()
            .settings()
            .retry_after_max_ms
            .div_ceil(1000);
        let retry_after = (*status == StatusCode::TOO_MANY_REQUESTS).then(|| {
            rate_limit
                .retry_after_ms
                .map_or(wait, |ms| ms.div_ceil(1000))
                .clamp(1, cap.max(1))
        });
        return json_error(
            *status,
            passthrough_body(*status, body, Some(request_id), &upstream_account(account)),
            retry_after,
        );
    }
    rescue(&Reject::overloaded(wait), request_id)
}

/// Writes the winner: a complete answer, or the head of a committed stream.
fn commit(
    call: &Call<'_>,
    candidate: &Candidate,
    started_at: UnixMs,
    snapshot_len: usize,
    ready: Ready,
    log: &mut Option<RequestLog>,
    held: (InFlight, Option<SlotGuard>),
) -> Response<ProxyBody> {
    let (in_flight, capacity) = held;
    let app = call.app;
    let account = ready.account.id().clone();
    app.metrics().ttft(&account, ready.ttft_ms);
    push_attempt(log, &account, "ok");
    if let Some(log) = log.as_mut() {
        log.served_by = Some(account.clone());
        log.ttft_ms = Some(ready.ttft_ms);
        log.upstream_request_id = ready.upstream_request_id;
    }
    let base_url: Arc<str> = candidate.base_url.clone().unwrap_or_else(|| Arc::from(""));
    match ready.kind {
        ReadyKind::Full {
            status,
            headers,
            body,
            held,
            usage,
            total_ms,
        } => {
            let attempt = Attempt {
                account: &account,
                base_url: &base_url,
                started_at,
                snapshot_len,
            };
            credit_success(app, &attempt, ready.ttft_ms, total_ms, now_ms());
            if let Some(log) = log.as_mut() {
                log.usage = usage;
            }
            let mut response = Response::new(ProxyBody::full_held(body, held));
            *response.status_mut() = status;
            copy_safe_response_headers(&headers, response.headers_mut());
            response
        }
        ReadyKind::Stream {
            held,
            decoder,
            body,
            usage,
            saw_stop,
            started,
        } => {
            app.store().mark_used(&account, now_ms());
            if let Some(log) = log.as_mut() {
                log.status = StatusCode::OK.as_u16();
            }
            let finish = StreamCompletion {
                app: app.clone(),
                account,
                base_url,
                started_at,
                started,
                snapshot_len,
                ttft_ms: ready.ttft_ms,
                log: log.take(),
                _in_flight: in_flight,
                _capacity: capacity,
            };
            let idle = Duration::from_millis(call.config.server().stream_idle_timeout_ms);
            let stream =
                StreamBody::new(held, decoder, body, idle, usage, saw_stop, Box::new(finish));
            let mut response = Response::new(ProxyBody::stream(stream));
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response
        }
    }
}

/// Credits the end of a committed stream to the account that served it.
struct StreamCompletion {
    app: App,
    account: AccountId,
    base_url: Arc<str>,
    started_at: UnixMs,
    started: tokio::time::Instant,
    snapshot_len: usize,
    ttft_ms: u64,
    log: Option<RequestLog>,
    /// The account's in-flight count lasts until the stream ends.
    _in_flight: InFlight,
    /// So does its concurrency slot.
    _capacity: Option<SlotGuard>,
}

impl StreamFinish for StreamCompletion {
    fn finish(self: Box<Self>, end: StreamEnd, usage: Option<Usage>) {
        let this = *self;
        let now = now_ms();
        let total_ms = this.started.elapsed().as_millis() as u64;
        let attempt = Attempt {
            account: &this.account,
            base_url: &this.base_url,
            started_at: this.started_at,
            snapshot_len: this.snapshot_len,
        };
        let outcome = match end {
            StreamEnd::Completed => {
                credit_success(&this.app, &attempt, this.ttft_ms, total_ms, now);
                "completed"
            }
            StreamEnd::Failed(failure) => {
                credit_failure(
                    &this.app,
                    &attempt,
                    &AttemptFailure::Transport(failure),
                    now,
                );
                this.app.metrics().stream_failure();
                match failure {
                    TransportFailure::Timeout => "idle_timeout",
                    _ => "upstream_failed",
                }
            }
            StreamEnd::ClientGone => "client_gone",
        };
        if let Some(mut log) = this.log {
            log.usage = usage;
            log.stream_end = Some(outcome);
        }
    }
}
