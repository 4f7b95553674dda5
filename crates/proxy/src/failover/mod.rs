//! Steps 5–8 of SPEC 3 and the hedge/race of SPEC 4: plan, walk the plan one attempt
//! per account, credit every outcome to the account that produced it, answer.
//!
//! At most two attempts run at once, and only as primary and hedge/race partner (the
//! planner guarantees a different `base_url`). Every other attempt starts only when
//! nothing is in flight, in plan order. The first attempt to reach its commit point
//! wins; the other is dropped in flight (its upstream connection closes) and credited
//! with nothing.
//!
//! # Layout
//! - `planning`: [`planning::plan_request`] → a `PlannedRequest` (snapshot, plan,
//!   session binding, the fan-out's extra attempt as a guard that refunds itself).
//! - `walk`: the `Walker`, one method per event (start the fan-out, start the next
//!   attempt or wait for a slot, the hedge timer, an attempt done).
//! - `credit`: crediting outcomes, writing the winner, the stream's completion.
//! - here: [`serve`], and the answers when every attempt failed.

mod credit;
mod planning;
mod routing;
mod walk;

use http::{HeaderValue, Response, StatusCode};
use keypool_providers::passthrough_body;
use keypool_selector::Candidate;
use keypool_store::resolve::Route;
use keypool_store::{StoreError, now_ms};

use crate::App;
use crate::attempt::{Call, Failure, upstream_account};
use crate::body::ProxyBody;
use crate::context::RequestContext;
use crate::reject::{Reject, X_SHOULD_RETRY, json_error};
use walk::{Event, Stopped, Walker};

/// Plans and runs the attempts of one request; returns its answer.
pub(crate) async fn serve(
    call: &mut Call<'_>,
    route: &Route,
    ctx: &mut RequestContext<'_>,
) -> Response<ProxyBody> {
    let (planned, fallback) = routing::plan_routed(call, route, ctx).await;
    let mut response = match planned {
        // the plan lives in this future; the walk's holds a reference to it
        Ok(mut planned) => walk_plan(call, &mut planned, ctx).await,
        Err(e) => {
            call.app.metrics().attempts(0);
            Reject::from(e).respond(&ctx.id)
        }
    };
    if fallback {
        response.headers_mut().insert(
            routing::X_KEYPOOL_FALLBACK,
            HeaderValue::from_static("true"),
        );
    }
    response
}

/// Walks `planned` to the request's answer.
async fn walk_plan(
    call: &Call<'_>,
    planned: &mut planning::PlannedRequest,
    ctx: &mut RequestContext<'_>,
) -> Response<ProxyBody> {
    let (last_failure, stopped) = {
        // The first attempt's future lives here, not in a box; the block ends its
        // borrow of `planned` before the answer below reads the snapshot.
        let inline = std::pin::pin!(None);
        let mut walker = Walker::new(call, planned, inline, crate::oauth::attempt_with_refresh);
        walker.start_fan_out().await;
        loop {
            if walker.idle() && !walker.launch_next(ctx).await {
                break;
            }
            match walker.next_event().await {
                Event::HedgeDelay => walker.on_hedge_delay().await,
                Event::Done(which, result) => {
                    if result.is_ok()
                        && let Some((session, served)) = walker.on_win(which, ctx)
                    {
                        // Bind, re-bind or refresh: the session follows the account that served.
                        walk::bind_session(call, session, served).await;
                    }
                    if let Some(response) = walker.on_done(which, result, ctx) {
                        return response;
                    }
                    if walker.must_stop() {
                        break;
                    }
                }
            }
        }
        call.app
            .metrics()
            .attempts(walker.attempts_started() as u64);
        (walker.last_failure.take(), walker.stopped.take())
    };
    match stopped {
        Some(Stopped::Local) => Reject::overloaded(1).respond(&ctx.id),
        Some(Stopped::Queue(e)) => queue_rejected(&e, &ctx.id),
        None => exhausted(call, &planned.snapshot, last_failure, &ctx.id),
    }
}

/// `429 rate_limit_error` when no concurrency slot came free in time or the queue was
/// full: `Retry-After: 1` (slots come back as requests finish) and
/// `x-should-retry: true`.
fn queue_rejected(e: &StoreError, request_id: &str) -> Response<ProxyBody> {
    let mut response = Reject::at_capacity(e.to_string()).respond(request_id);
    response
        .headers_mut()
        .insert(X_SHOULD_RETRY, HeaderValue::from_static("true"));
    response
}

/// Seconds until the earliest cooldown of the pool ends, at least 1.
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
        let token = crate::oauth::access_token(call.app, account);
        let upstream = upstream_account(account, token.as_deref());
        return json_error(
            *status,
            passthrough_body(*status, body, Some(request_id), &upstream),
            retry_after,
        );
    }
    Reject::overloaded(wait).respond(request_id)
}
