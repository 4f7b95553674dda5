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
use http::{StatusCode, Uri};
use http_body_util::BodyExt;
use keypool_cooldown::TransportFailure;
use keypool_cooldown::facts::RateLimitInfo;
use keypool_core::UnixMs;
use keypool_providers::openai::{ChatStream, ChatStreamOptions, message_to_chat_completion};
use keypool_providers::{
    AnswerProblem, CommitGate, Endpoint, FrameRole, StreamUsage, StreamWire, UpstreamAccount,
    Usage, Verdict, build_upstream_head, check_answer_body, check_answer_head, override_model,
    rate_limits_of, upstream_request_id,
};
use keypool_sse::Decoder;
use keypool_store::config::{Account, Config};
use keypool_store::now_ms;
use tokio::time::Instant;

use crate::App;
use crate::body::{Collected, HeldStream, StreamOutput};
use crate::body_budget::Reservation;
use crate::h1::{self, HeadLines};
use crate::timing::Paced;
use crate::upstream::{Answer, SendError, UpstreamBody};
use crate::watchdog::RateWatch;

/// Most bytes of an upstream error body read (to classify it and for the pass-through
/// message); the rest is not read.
pub const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// What every attempt of one request shares.
pub(crate) struct Call<'a> {
    pub app: &'a App,
    pub config: &'a Config,
    pub uri: &'a Uri,
    pub headers: &'a HeadLines,
    pub body: Bytes,
    /// The body's share of the process-wide body budget, held for the whole request.
    pub _body_held: crate::body_budget::Reservation,
    /// The client's endpoint (`ChatCompletions` for the OpenAI front).
    pub endpoint: Endpoint,
    /// A chat completion's original body (what `openai` accounts get), when `body`
    /// is its Messages translation.
    pub chat: Option<crate::openai::ChatCall>,
    pub stream: bool,
    /// The body's `metadata.user_id`, for session affinity.
    pub user_id: Option<&'a str>,
    /// The body's `model` (SPEC 16: its family's window and its lockouts filter the
    /// accounts).
    pub model: &'a str,
    /// The caller's LB key: queued requests are served round-robin across keys.
    pub key: &'a keypool_store::config::LbKey,
    /// Set when the attempt in the walk's slot `i` had its first valid frame (or, not
    /// streaming, its 2xx response head): the hedge looks at it. Here rather than in a
    /// shared allocation per attempt: the walk resets a slot's flag when it starts an
    /// attempt in it.
    pub first_chunks: [AtomicBool; 2],
}

/// An attempt that reached its commit point.
pub(crate) struct Ready {
    pub account: Arc<Account>,
    /// Time to first token, ms: first valid frame, or response headers when not
    /// streaming.
    pub ttft_ms: u64,
    /// The upstream's own request id, for the log line only.
    pub upstream_request_id: Option<String>,
    pub kind: ReadyKind,
}

pub(crate) enum ReadyKind {
    /// A complete non-streaming 2xx answer.
    Full {
        status: StatusCode,
        headers: HeadLines,
        body: Bytes,
        /// The body's bytes in the process-wide body budget, until it is written.
        held: Reservation,
        usage: Option<Usage>,
        total_ms: u64,
    },
    /// A stream at its commit point.
    Stream {
        stream: HeldStream,
        /// When the attempt started (the stream's total time counts from it).
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
        /// When the head arrived (unix ms): the moment the upstream's `Retry-After` and
        /// resets are relative to, however long its body then took.
        received_at: UnixMs,
    },
    /// No usable answer.
    Transport(TransportFailure),
    /// keypool's own resources ran out (file descriptors, memory, the body budget): not
    /// the account's fault, so nothing is credited to it, and the request stops.
    Local(LocalFailure),
}

/// Which of keypool's own resources an attempt found exhausted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalFailure {
    /// The process or the system is out of file descriptors, sockets, ports or memory
    /// (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`, `EADDRNOTAVAIL`).
    Resources,
    /// A buffered answer did not fit in `max_body_bytes_in_flight`.
    BodyBudget,
}

impl LocalFailure {
    /// The metric label and log field.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Resources => "resources",
            Self::BodyBudget => "body_budget",
        }
    }
}

/// Whether an upstream client error was caused by keypool's own resources rather than
/// by the account or its upstream: an OS error of running out of descriptors, buffers,
/// memory or local ports anywhere in its source chain.
pub(crate) fn is_local_resource_error(error: &(dyn std::error::Error + 'static)) -> bool {
    // Linux errno values (the Rust standard library has no stable ErrorKind for them).
    const ENOMEM: i32 = 12;
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    const EADDRNOTAVAIL: i32 = 99;
    const ENOBUFS: i32 = 105;
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && (matches!(
                io.raw_os_error(),
                Some(ENOMEM | ENFILE | EMFILE | EADDRNOTAVAIL | ENOBUFS)
            ) || io.kind() == std::io::ErrorKind::OutOfMemory)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Runs one attempt with `account`. `first_chunk` is set when the first valid frame
/// (or, not streaming, the 2xx response head) arrived: the hedge looks at it.
pub(crate) async fn attempt(
    call: &Call<'_>,
    account: Arc<Account>,
    first_chunk: &AtomicBool,
) -> Result<Ready, Failure> {
    let started = crate::timing::now();
    let settings = call.config.server();
    let leg = Leg::of(call, &account)?;
    let body = match account.model() {
        Some(model) => override_model(leg.body, model).unwrap_or_else(|_| leg.body.clone()),
        None => leg.body.clone(),
    };
    let token = crate::oauth::access_token(call.app, &account);
    let head = build_upstream_head(
        call.uri,
        call.headers,
        leg.endpoint,
        &upstream_account(&account, token.as_deref()),
    )
    .map_err(|e| {
        tracing::error!(account = %account.id(), error = %e, "account cannot be called");
        Failure::Transport(TransportFailure::Connect)
    })?;
    let upstream_timeout = Duration::from_millis(settings.upstream_timeout_ms);
    let upstream = call.app.upstream_for(&account);
    let response = match upstream
        .send(&head, &body, started + upstream_timeout)
        .await
    {
        Err(SendError::Timeout) => return Err(Failure::Transport(TransportFailure::Timeout)),
        Err(e) if is_local_resource_error(&e) => {
            return Err(Failure::Local(LocalFailure::Resources));
        }
        Err(e) if e.is_connect() => {
            return Err(Failure::Transport(TransportFailure::Connect));
        }
        Err(_) => return Err(Failure::Transport(TransportFailure::Reset)),
        Ok(response) => response,
    };
    let Answer {
        head: answer,
        mut body,
    } = response;
    let received_at = now_ms();
    let rate_limit = rate_limits_of(account.provider(), &answer.headers, received_at);
    if !rate_limit.is_empty() {
        call.app
            .store()
            .observe_windows(account.id(), &rate_limit, received_at);
    }
    if !answer.status.is_success() {
        let wait = Duration::from_millis(settings.first_frame_timeout_ms);
        let limits = ReadLimits {
            max: MAX_ERROR_BODY_BYTES,
            paced: Paced::new(wait, wait),
            truncate: true,
        };
        let body = read_body(&mut body, limits, None).await.unwrap_or_default();
        let (status, rate_limit) = restated(call, &account, answer.status, rate_limit, &body);
        return Err(Failure::Status {
            status,
            rate_limit: Box::new(rate_limit),
            body,
            received_at,
        });
    }
    let upstream_request_id =
        upstream_request_id(account.provider(), &answer.headers).map(str::to_owned);
    if !call.stream {
        return full_answer(call, &leg, &account, started, answer, body, first_chunk)
            .await
            .map(|(ttft_ms, kind)| Ready {
                account,
                ttft_ms,
                upstream_request_id,
                kind,
            });
    }
    hold_stream(call, &leg, body, started, first_chunk)
        .await
        .map(|(ttft_ms, kind)| Ready {
            account,
            ttft_ms,
            upstream_request_id,
            kind,
        })
}

/// What one attempt sends and how its answer reaches the client, by the account's
/// provider: a chat completion goes translated to an account that speaks Messages
/// (and its answer is translated back), natively to an `openai` account.
struct Leg<'b> {
    /// The upstream endpoint.
    endpoint: Endpoint,
    /// The body to send (before the account's model override).
    body: &'b Bytes,
    /// A chat completion answered by the Messages API: `include_usage`.
    translate: Option<bool>,
}

impl<'b> Leg<'b> {
    fn of(call: &'b Call<'_>, account: &Account) -> Result<Self, Failure> {
        // The walk never starts an attempt the provider cannot serve: this is a guard.
        let endpoint = call
            .endpoint
            .upstream_for(account.provider())
            .ok_or(Failure::Transport(TransportFailure::Connect))?;
        Ok(match (&call.chat, endpoint) {
            (Some(chat), Endpoint::ChatCompletions) => Self {
                endpoint,
                body: &chat.original,
                translate: None,
            },
            (Some(chat), _) => Self {
                endpoint,
                body: &call.body,
                translate: Some(chat.include_usage),
            },
            (None, _) => Self {
                endpoint,
                body: &call.body,
                translate: None,
            },
        })
    }

    /// What a committed stream of this attempt writes to the client.
    fn output(&self, call: &Call<'_>) -> StreamOutput {
        match self.translate {
            Some(include_usage) => {
                StreamOutput::Chat(Box::new(ChatStream::new(ChatStreamOptions {
                    created: now_ms() / 1000,
                    include_usage,
                })))
            }
            None => StreamOutput::Raw {
                client: call.endpoint,
            },
        }
    }
}

/// SPEC 16's status restatement: the first `[[restate]]` rule that applies to this
/// error answer gives the status classification sees (and a terminal pass-through
/// answers with), and its `retry_after_ms` replaces the answer's own wait.
fn restated(
    call: &Call<'_>,
    account: &Account,
    status: StatusCode,
    mut rate_limit: RateLimitInfo,
    body: &[u8],
) -> (StatusCode, RateLimitInfo) {
    let rules = call.config.restate_rules();
    let base_url = account.base_url().unwrap_or("");
    let Some(r) = keypool_cooldown::restate(
        rules,
        account.id().as_str(),
        base_url,
        status.as_u16(),
        body,
    ) else {
        return (status, rate_limit);
    };
    call.app.metrics().restated(r.rule);
    tracing::debug!(account = %account.id(), from = status.as_u16(), to = r.status, rule = r.rule, "upstream status restated");
    if let Some(ms) = r.retry_after_ms {
        rate_limit.retry_after_ms = Some(ms);
    }
    (StatusCode::from_u16(r.status).unwrap_or(status), rate_limit)
}

/// A non-streaming 2xx answer (SPEC 3.8): passed on only when it is a `200` JSON answer
/// of the endpoint in identity encoding, within `max_response_body_bytes` and complete
/// within `upstream_timeout` of its head; anything else fails the attempt. The buffered
/// body holds its bytes in the process-wide body budget until it has been written.
async fn full_answer(
    call: &Call<'_>,
    leg: &Leg<'_>,
    account: &Account,
    started: Instant,
    answer: h1::Head,
    mut body: UpstreamBody,
    first_chunk: &AtomicBool,
) -> Result<(u64, ReadyKind), Failure> {
    let settings = call.config.server();
    let invalid = |problem: AnswerProblem| {
        tracing::debug!(account = %account.id(), problem = problem.as_str(), "upstream 2xx is not a valid answer");
        Failure::Transport(TransportFailure::InvalidAnswer)
    };
    check_answer_head(answer.status, &answer.headers).map_err(invalid)?;
    let ttft_ms = crate::timing::since(started).as_millis() as u64;
    first_chunk.store(true, Ordering::Release);
    let mut held = call
        .app
        .answer_budget()
        .reserve(0, settings.max_body_bytes_in_flight)
        .ok_or(Failure::Local(LocalFailure::BodyBudget))?;
    let limits = ReadLimits {
        max: usize::try_from(settings.max_response_body_bytes).unwrap_or(usize::MAX),
        paced: Paced::new(
            Duration::from_millis(settings.stream_idle_timeout_ms),
            Duration::from_millis(settings.upstream_timeout_ms),
        ),
        truncate: false,
    };
    let budget = (&mut held, settings.max_body_bytes_in_flight);
    let bytes = read_body(&mut body, limits, Some(budget)).await?;
    let usage = check_answer_body(leg.endpoint, &bytes).map_err(invalid)?;
    let bytes = match leg.translate {
        Some(_) => message_to_chat_completion(&bytes, now_ms() / 1000)
            .map_err(|_| invalid(AnswerProblem::NotAnAnswer))?,
        None => bytes,
    };
    Ok((
        ttft_ms,
        ReadyKind::Full {
            status: answer.status,
            headers: answer.headers,
            body: bytes,
            held,
            usage,
            total_ms: crate::timing::since(started).as_millis() as u64,
        },
    ))
}

/// What the provider adapter needs of `account` (its secret included: keep it local):
/// its configured secret, or the access token in force when it renews itself.
pub(crate) fn upstream_account<'a>(
    account: &'a Account,
    token: Option<&'a keypool_store::oauth::Tokens>,
) -> UpstreamAccount<'a> {
    UpstreamAccount {
        provider: account.provider(),
        auth: account.auth(),
        secret: token.map_or(account.secret().expose(), |t| t.access.expose()),
        base_url: account.base_url(),
    }
}

/// The streaming hold (SPEC 3.8): reads frames into memory until the commit gate says
/// commit (the stream goes to the client) or fail (its frames are dropped).
async fn hold_stream(
    call: &Call<'_>,
    leg: &Leg<'_>,
    mut body: UpstreamBody,
    started: Instant,
    first_chunk: &AtomicBool,
) -> Result<(u64, ReadyKind), Failure> {
    let settings = call.config.server();
    let mut hold = Hold::new(settings, StreamWire::of(leg.endpoint));
    let deadline = crate::timing::now() + Duration::from_millis(settings.first_frame_timeout_ms);
    let invalid = || Failure::Transport(TransportFailure::InvalidStreamStart);
    loop {
        if hold.take_frames(started, first_chunk)? {
            break;
        }
        // The watchdog looks between frames, at its own times, before the deadline.
        let wake = hold.watch.as_ref().map_or(deadline, |w| {
            deadline.min(started + Duration::from_millis(w.next_check(elapsed_ms(started))))
        });
        match tokio::time::timeout_at(wake, body.frame()).await {
            Err(_) if wake < deadline => {
                if hold
                    .watch
                    .as_mut()
                    .is_some_and(|w| w.too_slow(elapsed_ms(started)))
                {
                    return Err(Failure::Transport(TransportFailure::SlowStream));
                }
            }
            Err(_) if hold.gate.timeout() == Verdict::Commit => break,
            Err(_) => return Err(invalid()),
            Ok(None) => {
                // Every complete frame was already read: the stream ended before its
                // commit point.
                let _ = hold.gate.end_of_stream();
                return Err(invalid());
            }
            Ok(Some(Err(_))) => return Err(Failure::Transport(TransportFailure::Reset)),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    hold.decoder.push(&data);
                }
            }
        }
    }
    // Committed: at a content frame, or at the timeout after a valid first frame.
    let ttft = hold.ttft_ms.unwrap_or_else(|| elapsed_ms(started));
    let Hold {
        wire,
        decoder,
        held,
        usage,
        saw_stop,
        watch,
        ..
    } = hold;
    let stream = HeldStream {
        held,
        decoder,
        body,
        usage,
        saw_stop,
        watch: watch.map(|w| (w, started)),
        wire,
        output: leg.output(call),
    };
    Ok((ttft, ReadyKind::Stream { stream, started }))
}

fn elapsed_ms(started: Instant) -> u64 {
    crate::timing::since(started).as_millis() as u64
}

/// What a stream's hold has read so far.
struct Hold {
    wire: StreamWire,
    gate: CommitGate,
    decoder: Decoder,
    held: Vec<Bytes>,
    usage: StreamUsage,
    saw_stop: bool,
    ttft_ms: Option<u64>,
    watch: Option<RateWatch>,
}

impl Hold {
    fn new(settings: &keypool_store::config::ServerSettings, wire: StreamWire) -> Self {
        let gate = CommitGate::with_limits(
            settings.stream_commit,
            settings.commit_hold_max_frames as usize,
            usize::try_from(settings.commit_hold_max_bytes).unwrap_or(usize::MAX),
        )
        .with_wire(wire);
        Self {
            wire,
            gate,
            decoder: Decoder::with_max_frame_bytes(
                usize::try_from(settings.max_frame_bytes).unwrap_or(usize::MAX),
            ),
            held: Vec::new(),
            usage: StreamUsage::for_wire(wire),
            saw_stop: false,
            ttft_ms: None,
            watch: RateWatch::from_settings(settings),
        }
    }

    /// Takes every complete frame out of the decoder through the commit gate: `true`
    /// once it says commit, an error once it says fail.
    fn take_frames(&mut self, started: Instant, first_chunk: &AtomicBool) -> Result<bool, Failure> {
        let invalid = || Failure::Transport(TransportFailure::InvalidStreamStart);
        loop {
            let frame = match self.decoder.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(false),
                Err(_) => return Err(invalid()),
            };
            let verdict = self.gate.observe(&frame);
            if self.ttft_ms.is_none() && self.gate.started() {
                self.ttft_ms = Some(elapsed_ms(started));
                first_chunk.store(true, Ordering::Release);
            }
            if let Verdict::Fail(_) = verdict {
                return Err(invalid());
            }
            self.usage.observe(&frame);
            let role = self.wire.role(&frame);
            self.saw_stop |= role == FrameRole::End;
            if let Some(w) = self.watch.as_mut() {
                observe_content(w, started, role, &frame);
            }
            self.held.push(frame.into_raw());
            if verdict == Verdict::Commit {
                return Ok(true);
            }
        }
    }
}

/// Counts a content frame's bytes (its [`FrameRole`] is `role`) for the slow-stream
/// watchdog (SPEC 16).
pub(crate) fn observe_content(
    watch: &mut RateWatch,
    started: Instant,
    role: FrameRole,
    frame: &keypool_sse::Frame,
) {
    if role == FrameRole::Content {
        watch.observe(
            crate::timing::since(started).as_millis() as u64,
            frame.raw().len(),
        );
    }
}

/// How much of an upstream body to read, and for how long.
struct ReadLimits {
    /// Most bytes.
    max: usize,
    /// Longest wait for each chunk, and for the whole body (from its first wait: a
    /// body that came with its head is read without a clock read or a timer).
    paced: Paced,
    /// A longer body is cut at `max` (an error body) instead of failing (an answer).
    truncate: bool,
}

/// Reads an upstream body within `limits`; every byte kept is first added to `budget`'s
/// reservation, when given (a body that does not fit is keypool's own failure). A stall
/// past `idle` or the deadline is a timeout, a body over `max` (without `truncate`) an
/// invalid answer.
async fn read_body(
    body: &mut UpstreamBody,
    mut limits: ReadLimits,
    mut budget: Option<(&mut Reservation, u64)>,
) -> Result<Bytes, Failure> {
    let mut collected = Collected::default();
    let mut len = 0usize;
    loop {
        let frame = match limits.paced.next(body.frame()).await {
            Err(_) => return Err(Failure::Transport(TransportFailure::Timeout)),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(Failure::Transport(TransportFailure::Reset)),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        if len + data.len() > limits.max {
            if !limits.truncate {
                return Err(Failure::Transport(TransportFailure::InvalidAnswer));
            }
            data.truncate(limits.max - len);
        }
        len += data.len();
        if let Some((reservation, limit)) = budget.as_mut()
            && !reservation.grow_to(len as u64, *limit)
        {
            return Err(Failure::Local(LocalFailure::BodyBudget));
        }
        collected.push(data);
        if len >= limits.max {
            break;
        }
    }
    Ok(collected.into_bytes())
}
