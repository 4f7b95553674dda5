//! Crediting every outcome to the account that produced it (SPEC 4, 6), and writing
//! the winner: a complete answer, or the head of a committed stream whose end is
//! credited by its [`StreamCompletion`].

use std::sync::Arc;
use std::time::Duration;

use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};
use keypool_cooldown::{Attempt, AttemptFailure, Classification, TransportFailure, classify};
use keypool_core::{AccountId, AuthType, UnixMs};
use keypool_providers::Usage;
use keypool_selector::{Candidate, Sample};
use keypool_store::now_ms;
use keypool_store::slots::SlotGuard;

use super::walk::Running;
use crate::App;
use crate::attempt::{Call, Failure, Ready, ReadyKind};
use crate::body::{ProxyBody, StreamBody, StreamEnd, StreamFinish};
use crate::context::RequestContext;
use crate::headers::copy_safe_response_headers;
use crate::log::RequestLog;
use crate::metrics::InFlight;

/// Credits a failed attempt to its account: classification (with what the error body
/// says, SPEC 16), cooldown, terminal state or model lockout, breaker, rating sample,
/// metrics. `None` for keypool's own failure, which is never the account's.
pub(super) fn record_failure(
    call: &Call<'_>,
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
            body,
            received_at,
        } => (
            AttemptFailure::Status {
                status: *status,
                rate_limit,
                marks: call.config.cooldown().marks(body),
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
        model: sent_model(call, &candidate.id),
    };
    Some(credit_failure(call.app, &attempt, &attempt_failure, at))
}

/// The model an attempt with `account` asked for: the account's `model` override, else
/// the request's.
fn sent_model<'a>(call: &Call<'a>, account: &AccountId) -> &'a str {
    call.config
        .account(account.as_str())
        .and_then(|a| a.model())
        .unwrap_or(call.model)
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
    app.metrics().account_failure(attempt.account, &c);
    c
}

/// Credits a success (a complete answer, or a stream that completed) to its account:
/// the cooldown book and breaker, the rating sample, the total-time metric (through the
/// attempt's `in_flight` guard).
fn credit_success(
    app: &App,
    attempt: &Attempt<'_>,
    in_flight: &InFlight,
    ttft_ms: u64,
    total_ms: u64,
    now: UnixMs,
) {
    let store = app.store();
    store.record_success(attempt, now);
    store.record_rating(attempt.account, Sample::Success { ttft_ms, total_ms }, now);
    in_flight.total(total_ms);
}

/// Writes the winner `ready` of the attempt `running` on `candidate`: a complete
/// answer (credited now), or the head of a committed stream (credited when it ends).
pub(super) fn commit(
    call: &Call<'_>,
    candidate: &Candidate,
    snapshot_len: usize,
    running: Running<'_>,
    ready: Ready,
    ctx: &mut RequestContext<'_>,
) -> Response<ProxyBody> {
    let app = call.app;
    let account = ready.account.id().clone();
    running.in_flight.ttft(ready.ttft_ms);
    let status = match &ready.kind {
        ReadyKind::Full { status, .. } => status.as_u16(),
        ReadyKind::Stream { .. } => StatusCode::OK.as_u16(),
    };
    // one clock read for the attempt's end, its credit and the account's last use
    let now = now_ms();
    ctx.attempt_until(
        &account,
        Some(status),
        "ok",
        None,
        (running.started_at, now),
    );
    if let Some(log) = ctx.log_mut() {
        log.served_by = Some(account.clone());
        log.served_by_oauth = ready.account.auth() == AuthType::OAuth;
        if let Some(model) = ready.account.model_shared() {
            log.model_sent = Some(model.clone());
        } else if log.model.as_deref() == Some(call.model) {
            log.model_sent = log.model.clone();
        } else {
            // a `[[models]]` rule chose another model than the one asked
            log.model_sent = Some(Arc::from(call.model));
        }
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
                started_at: running.started_at,
                snapshot_len,
                model: ready.account.model().unwrap_or(call.model),
            };
            let in_flight = &running.in_flight;
            credit_success(app, &attempt, in_flight, ready.ttft_ms, total_ms, now);
            if let Some(log) = ctx.log_mut() {
                log.usage = usage;
            }
            let mut response = Response::new(ProxyBody::full_held(body, held));
            *response.status_mut() = status;
            *response.headers_mut() = crate::headers::header_map();
            copy_safe_response_headers(&headers, response.headers_mut());
            response
        }
        ReadyKind::Stream { stream, started } => {
            app.store().mark_used(&account, now);
            ctx.answered(StatusCode::OK.as_u16());
            let finish = StreamCompletion {
                app: app.clone(),
                // the override's shared string, else the log line's (no allocation)
                model: ready
                    .account
                    .model_shared()
                    .cloned()
                    .or_else(|| ctx.log_mut().and_then(|l| l.model.clone()))
                    .unwrap_or_else(|| Arc::from(call.model)),
                account,
                base_url,
                started_at: running.started_at,
                started,
                snapshot_len,
                ttft_ms: ready.ttft_ms,
                log: ctx.take_log(),
                in_flight: running.in_flight,
                _capacity: running.capacity,
            };
            let idle = Duration::from_millis(call.config.server().stream_idle_timeout_ms);
            let body = StreamBody::new(stream, idle, Box::new(finish));
            let mut response = Response::new(ProxyBody::stream(body));
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response
        }
    }
}

/// Credits the end of a committed stream to the account that served it, and writes the
/// request's log line.
struct StreamCompletion {
    app: App,
    account: AccountId,
    /// The model the stream was asked for (a success halves its lockout count).
    model: Arc<str>,
    base_url: Arc<str>,
    started_at: UnixMs,
    started: tokio::time::Instant,
    snapshot_len: usize,
    ttft_ms: u64,
    log: Option<RequestLog>,
    /// The account's in-flight count lasts until the stream ends (and records its
    /// total latency).
    in_flight: InFlight,
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
            model: &this.model,
        };
        let outcome = match end {
            StreamEnd::Completed => {
                let (app, in_flight) = (&this.app, &this.in_flight);
                credit_success(app, &attempt, in_flight, this.ttft_ms, total_ms, now);
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
