//! One attempt: one upstream call with one account, up to its commit point.
//!
//! The attempt future runs until the answer may be written to the client (a complete
//! 2xx body; a stream's commit point, SPEC 3.8) or until it failed. It records nothing
//! about the outcome except the response's rate-limit headers (facts about the account,
//! read from every response): crediting success or failure is the caller's job, so that
//! an attempt aborted by a hedge/race partner (the future dropped) is credited nothing.
//! Dropping the future drops the upstream request and closes its connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use keypool_cooldown::TransportFailure;
use keypool_cooldown::headers::RateLimitInfo;
use keypool_providers::{
    CommitGate, Endpoint, StreamUsage, UpstreamAccount, Usage, Verdict, build_upstream_head,
    override_model, rate_limits, usage_from_json_body,
};
use keypool_sse::Decoder;
use keypool_store::config::{Account, Config};
use keypool_store::now_ms;
use tokio::time::Instant;

use crate::App;
use crate::body::Collected;

/// Most bytes of an upstream error body read (to classify it and for the pass-through
/// message); the rest is not read.
pub const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Most bytes of a non-streaming 2xx body; a larger answer fails the attempt.
pub const MAX_FULL_BODY_BYTES: usize = 64 * 1024 * 1024;

/// What every attempt of one request shares.
pub(crate) struct Call<'a> {
    pub app: &'a App,
    pub config: &'a Config,
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    /// The body's share of the process-wide body budget, held for the whole request.
    pub _body_held: crate::body_budget::Reservation,
    pub endpoint: Endpoint,
    pub stream: bool,
    /// The body's `metadata.user_id`, for session affinity.
    pub user_id: Option<&'a str>,
}

/// An attempt that reached its commit point.
pub(crate) struct Ready {
    pub account: Arc<Account>,
    /// Time to first token, ms: first valid frame, or response headers when not
    /// streaming.
    pub ttft_ms: u64,
    /// The upstream's `request-id`, for the log line only.
    pub upstream_request_id: Option<String>,
    pub kind: ReadyKind,
}

pub(crate) enum ReadyKind {
    /// A complete non-streaming 2xx answer.
    Full {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        usage: Option<Usage>,
        total_ms: u64,
    },
    /// A stream at its commit point.
    Stream {
        held: Vec<Bytes>,
        decoder: Decoder,
        body: Incoming,
        usage: StreamUsage,
        saw_stop: bool,
        started: Instant,
    },
}

/// Why an attempt failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A non-2xx answer; `body` is at most [`MAX_ERROR_BODY_BYTES`] of it.
    Status {
        status: StatusCode,
        rate_limit: Box<RateLimitInfo>,
        body: Bytes,
    },
    /// No usable answer.
    Transport(TransportFailure),
}

/// Runs one attempt with `account`. `first_chunk` is set when the first valid frame
/// (or, not streaming, the 2xx response head) arrived: the hedge looks at it.
pub(crate) async fn attempt(
    call: &Call<'_>,
    account: Arc<Account>,
    first_chunk: Arc<AtomicBool>,
) -> Result<Ready, Failure> {
    let started = Instant::now();
    let settings = call.config.server();
    let body = match account.model() {
        Some(model) => override_model(&call.body, model).unwrap_or_else(|_| call.body.clone()),
        None => call.body.clone(),
    };
    let upstream_account = UpstreamAccount {
        provider: account.provider(),
        auth: account.auth(),
        secret: account.secret().expose(),
        base_url: account.base_url(),
    };
    let head = build_upstream_head(call.uri, call.headers, call.endpoint, &upstream_account)
        .map_err(|e| {
            tracing::error!(account = %account.id(), error = %e, "account cannot be called");
            Failure::Transport(TransportFailure::Connect)
        })?;
    let request = head.into_request(Full::new(body));
    let upstream_timeout = Duration::from_millis(settings.upstream_timeout_ms);
    let response = match tokio::time::timeout(upstream_timeout, call.app.client().request(request))
        .await
    {
        Err(_) => return Err(Failure::Transport(TransportFailure::Timeout)),
        Ok(Err(e)) if e.is_connect() => return Err(Failure::Transport(TransportFailure::Connect)),
        Ok(Err(_)) => return Err(Failure::Transport(TransportFailure::Reset)),
        Ok(Ok(response)) => response,
    };
    let (parts, mut body) = response.into_parts();
    let now = now_ms();
    let rate_limit = rate_limits(&parts.headers, now);
    if !rate_limit.is_empty() {
        call.app
            .store()
            .observe_windows(account.id(), &rate_limit, now);
    }
    let idle = Duration::from_millis(settings.stream_idle_timeout_ms);
    if !parts.status.is_success() {
        let wait = Duration::from_millis(settings.first_frame_timeout_ms);
        let body = read_body(&mut body, MAX_ERROR_BODY_BYTES, wait, true)
            .await
            .unwrap_or_default();
        return Err(Failure::Status {
            status: parts.status,
            rate_limit: Box::new(rate_limit),
            body,
        });
    }
    let upstream_request_id = parts
        .headers
        .get("request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if !call.stream {
        let ttft_ms = started.elapsed().as_millis() as u64;
        first_chunk.store(true, Ordering::Release);
        let bytes = read_body(&mut body, MAX_FULL_BODY_BYTES, idle, false)
            .await
            .map_err(Failure::Transport)?;
        let usage = usage_from_json_body(&bytes);
        return Ok(Ready {
            account,
            ttft_ms,
            upstream_request_id,
            kind: ReadyKind::Full {
                status: parts.status,
                headers: parts.headers,
                body: bytes,
                usage,
                total_ms: started.elapsed().as_millis() as u64,
            },
        });
    }
    hold_stream(call.config, body, started, &first_chunk)
        .await
        .map(|(ttft_ms, kind)| Ready {
            account,
            ttft_ms,
            upstream_request_id,
            kind,
        })
}

/// The streaming hold (SPEC 3.8): reads frames into memory until the commit gate says
/// commit (the stream goes to the client) or fail (its frames are dropped).
async fn hold_stream(
    config: &Config,
    mut body: Incoming,
    started: Instant,
    first_chunk: &AtomicBool,
) -> Result<(u64, ReadyKind), Failure> {
    let settings = config.server();
    let mut gate = CommitGate::with_limits(
        settings.stream_commit,
        settings.commit_hold_max_frames as usize,
        usize::try_from(settings.commit_hold_max_bytes).unwrap_or(usize::MAX),
    );
    let mut decoder = Decoder::with_max_frame_bytes(
        usize::try_from(settings.max_frame_bytes).unwrap_or(usize::MAX),
    );
    let mut held = Vec::new();
    let mut usage = StreamUsage::default();
    let mut saw_stop = false;
    let mut ttft_ms = None;
    let deadline = Instant::now() + Duration::from_millis(settings.first_frame_timeout_ms);
    let invalid = || Failure::Transport(TransportFailure::InvalidStreamStart);
    'hold: loop {
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => return Err(invalid()),
            };
            let verdict = gate.observe(&frame);
            if ttft_ms.is_none() && gate.started() {
                ttft_ms = Some(started.elapsed().as_millis() as u64);
                first_chunk.store(true, Ordering::Release);
            }
            match verdict {
                Verdict::Fail(_) => return Err(invalid()),
                Verdict::Hold | Verdict::Commit => {
                    usage.observe(&frame);
                    saw_stop |= frame.is_event("message_stop");
                    held.push(frame.into_raw());
                }
            }
            if verdict == Verdict::Commit {
                break 'hold;
            }
        }
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                if gate.timeout() == Verdict::Commit {
                    break 'hold;
                }
                return Err(invalid());
            }
            Ok(None) => {
                // Every complete frame was already read: the stream ended before its
                // commit point.
                let _ = gate.end_of_stream();
                return Err(invalid());
            }
            Ok(Some(Err(_))) => return Err(Failure::Transport(TransportFailure::Reset)),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    decoder.push(&data);
                }
            }
        }
    }
    // Committed: at a content frame, or at the timeout after a valid first frame.
    let ttft = ttft_ms.unwrap_or_else(|| started.elapsed().as_millis() as u64);
    Ok((
        ttft,
        ReadyKind::Stream {
            held,
            decoder,
            body,
            usage,
            saw_stop,
            started,
        },
    ))
}

/// Reads a body up to `limit` bytes, waiting at most `idle` for each chunk. With
/// `truncate` a longer body is cut at `limit`; without, it is a failure.
async fn read_body(
    body: &mut Incoming,
    limit: usize,
    idle: Duration,
    truncate: bool,
) -> Result<Bytes, TransportFailure> {
    let mut collected = Collected::default();
    let mut len = 0usize;
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(TransportFailure::Timeout),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(TransportFailure::Reset),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        if len + data.len() > limit {
            if !truncate {
                return Err(TransportFailure::Reset);
            }
            data.truncate(limit - len);
        }
        len += data.len();
        collected.push(data);
        if len >= limit {
            break;
        }
    }
    Ok(collected.into_bytes())
}
