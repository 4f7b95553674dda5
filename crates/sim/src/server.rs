//! The hyper server: accept loop, per-connection tasks, the request handler, and the
//! [`SimHandle`] tests hold.

use std::borrow::Cow;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use keypool_core::AccountId;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::accounts::{AccountStats, Accounts, AlwaysHeaders, RequestGuard, SimAccount};
use crate::body::{Ending, ResetFlag, SimBody, StreamCursor};
use crate::error::SimError;
use crate::frames::StreamFrames;
use crate::recorder::{RecordedRequest, Recorder};
use crate::script::{Behaviour, Cut, Delay, ErrorReply, OkSpec, Script};
use crate::tools::{self, ToolCall};
use crate::{openai, wire};

/// How to start a simulator.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Where to listen; default `127.0.0.1:0` (a free port).
    pub listen: SocketAddr,
    /// The accounts, each identified by its credential.
    pub accounts: Vec<SimAccount>,
    /// When set, a request with a credential no account has is served by this script
    /// (addressed as account `"*"`) instead of `401`. A request with no credential at all
    /// is always `401`.
    pub any_credential: Option<Script>,
    /// How many requests to keep in the recorder (oldest dropped first); `0` records
    /// nothing. Default 10 000.
    pub record_limit: usize,
    /// Seed of the random draws of [`Delay::Uniform`](crate::Delay::Uniform).
    pub seed: u64,
    /// On shutdown, how long connections may take to finish before they are dropped.
    /// Default 1 s.
    pub shutdown_grace: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            accounts: Vec::new(),
            any_credential: None,
            record_limit: 10_000,
            seed: 0x5eed,
            shutdown_grace: Duration::from_secs(1),
        }
    }
}

impl SimConfig {
    /// The defaults: no accounts, `127.0.0.1:0`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an account identified by `credential`.
    pub fn account(
        mut self,
        id: impl Into<AccountId>,
        credential: impl Into<String>,
        script: Script,
    ) -> Self {
        self.accounts.push(SimAccount {
            id: id.into(),
            credential: credential.into(),
            script,
        });
        self
    }

    /// Serves unknown credentials with `script` (see [`SimConfig::any_credential`]).
    pub fn any_credential(mut self, script: Script) -> Self {
        self.any_credential = Some(script);
        self
    }

    /// Sets [`SimConfig::listen`].
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Sets [`SimConfig::record_limit`].
    pub fn record_limit(mut self, limit: usize) -> Self {
        self.record_limit = limit;
        self
    }

    /// Sets [`SimConfig::seed`].
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets [`SimConfig::shutdown_grace`].
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }
}

/// Starts simulators.
#[derive(Debug)]
pub struct Sim;

impl Sim {
    /// Binds `config.listen` and serves in the background on the current tokio runtime.
    pub async fn start(config: SimConfig) -> Result<SimHandle, SimError> {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| SimError::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| SimError::Bind {
            addr: config.listen,
            source,
        })?;
        let shared = Arc::new(Shared {
            accounts: Arc::new(Accounts::new(config.accounts, config.any_credential)?),
            recorder: Recorder::new(config.record_limit),
            ids: AtomicU64::new(0),
            seed: config.seed,
            issuer: crate::oauth::Issuer::default(),
        });
        let (shutdown, signal) = watch::channel(false);
        let task = tokio::spawn(serve(
            listener,
            shared.clone(),
            signal,
            config.shutdown_grace,
        ));
        Ok(SimHandle {
            addr,
            shared,
            shutdown,
            task: Some(task),
        })
    }
}

/// A running simulator. Dropping it shuts the server down in the background;
/// [`SimHandle::shutdown`] does so and waits.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl SimHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, the `base_url` to give an account.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Declares a new account at runtime.
    pub fn add_account(
        &self,
        id: impl Into<AccountId>,
        credential: impl Into<String>,
        script: Script,
    ) -> Result<(), SimError> {
        self.shared.accounts.add(SimAccount {
            id: id.into(),
            credential: credential.into(),
            script,
        })
    }

    /// Replaces an account's whole script (default, sequence and headers).
    pub fn set_script(&self, id: &str, script: Script) -> Result<(), SimError> {
        self.shared.accounts.set_script(id, script)
    }

    /// Replaces an account's default behaviour, keeping its sequence and headers.
    pub fn set_default(&self, id: &str, behaviour: impl Into<Behaviour>) -> Result<(), SimError> {
        self.shared.accounts.set_default(id, behaviour.into())
    }

    /// Appends behaviours to an account's sequence.
    pub fn push(
        &self,
        id: &str,
        behaviours: impl IntoIterator<Item = Behaviour>,
    ) -> Result<(), SimError> {
        self.shared.accounts.push(id, behaviours)
    }

    /// Every recorded request, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.recorder.snapshot()
    }

    /// The recorded requests that identified account `id`.
    pub fn requests_for(&self, id: &str) -> Vec<RecordedRequest> {
        let mut all = self.requests();
        all.retain(|r| r.account.as_ref().is_some_and(|a| a.as_str() == id));
        all
    }

    /// The recorded requests in which `needle` occurs (path, headers or body), e.g.
    /// `requests_containing(b"sk-lb-")` must be empty behind keypool.
    pub fn requests_containing(&self, needle: &[u8]) -> Vec<RecordedRequest> {
        let mut all = self.requests();
        all.retain(|r| r.contains(needle));
        all
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.shared.recorder.clear();
    }

    /// Logs account `id` in through OAuth: a new access token (valid for the token
    /// lifetime, 8 h unless [`SimHandle::set_token_lifetime`]) and refresh token.
    /// Requests with the access token are the account's.
    pub fn issue_tokens(&self, id: &str) -> Result<crate::oauth::IssuedTokens, SimError> {
        let account = self.shared.accounts.by_id(id)?;
        Ok(self.shared.issuer.issue(&account.id))
    }

    /// A person logs account `id` in at the authorize page: the code the page shows,
    /// bound to the PKCE `code_challenge` (S256) of the login.
    pub fn authorize(&self, id: &str, code_challenge: &str) -> Result<String, SimError> {
        let account = self.shared.accounts.by_id(id)?;
        Ok(self.shared.issuer.authorize(&account.id, code_challenge))
    }

    /// How long access tokens issued from now on live.
    pub fn set_token_lifetime(&self, lifetime: Duration) {
        self.shared.issuer.set_lifetime(lifetime);
    }

    /// Every refresh token of account `id` stops working (`invalid_grant`).
    pub fn revoke_refresh_tokens(&self, id: &str) -> Result<(), SimError> {
        let account = self.shared.accounts.by_id(id)?;
        self.shared.issuer.revoke(&account.id);
        Ok(())
    }

    /// The token endpoint answers every grant with `status` while set (`None`: again
    /// as usual).
    pub fn fail_token_endpoint(&self, status: Option<u16>) {
        self.shared.issuer.set_failing(status);
    }

    /// The token endpoint's counters for account `id`.
    pub fn oauth_stats(&self, id: &str) -> Result<crate::oauth::OAuthStats, SimError> {
        let account = self.shared.accounts.by_id(id)?;
        Ok(self.shared.issuer.stats(&account.id))
    }

    /// One account's counters (`"*"` for the any-credential fallback).
    pub fn stats(&self, id: &str) -> Result<AccountStats, SimError> {
        Ok(self.shared.accounts.by_id(id)?.counters.read())
    }

    /// Counters over every request, including unknown credentials and unknown paths.
    pub fn total_stats(&self) -> AccountStats {
        self.shared.accounts.total.read()
    }

    /// Waits until `condition` holds, re-checking after every request start and end.
    /// Wrap it in `tokio::time::timeout` in tests.
    pub async fn wait_until(&self, mut condition: impl FnMut(&SimHandle) -> bool) {
        let mut changes = self.shared.accounts.subscribe();
        loop {
            if condition(self) {
                return;
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Stops accepting, lets connections finish for the shutdown grace, drops the rest,
    /// and waits until the server task is gone.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// What every connection task shares.
#[derive(Debug)]
struct Shared {
    accounts: Arc<Accounts>,
    recorder: Recorder,
    ids: AtomicU64,
    seed: u64,
    issuer: crate::oauth::Issuer,
}

async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut signal: watch::Receiver<bool>,
    grace: Duration,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    connections.spawn(serve_connection(stream, shared.clone(), signal.clone()));
                }
                // Out of file descriptors and the like: back off a little, keep serving.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
            _ = signal.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let drained = async { while connections.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(grace, drained).await;
    connections.shutdown().await;
}

async fn serve_connection(
    stream: TcpStream,
    shared: Arc<Shared>,
    mut signal: watch::Receiver<bool>,
) {
    let reset: ResetFlag = Arc::new(AtomicBool::new(false));
    let io = TokioIo::new(ResettableStream {
        inner: stream,
        reset: reset.clone(),
    });
    let service = service_fn(move |req| handle(req, shared.clone(), reset.clone()));
    let conn = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = signal.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// A TCP stream that sends RST instead of FIN when dropped after a behaviour asked for
/// a reset.
struct ResettableStream {
    inner: TcpStream,
    reset: ResetFlag,
}

impl Drop for ResettableStream {
    fn drop(&mut self) {
        if self.reset.load(Ordering::Relaxed) {
            // SO_LINGER with a zero timeout makes close() send RST and never blocks (the
            // deprecation is about non-zero timeouts blocking the thread).
            #[allow(deprecated)]
            let _ = self.inner.set_linger(Some(Duration::ZERO));
        }
    }
}

impl AsyncRead for ResettableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResettableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Which endpoint a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Messages,
    CountTokens,
    /// OpenAI's `POST …/v1/chat/completions`.
    ChatCompletions,
    /// OpenAI's `GET …/v1/models`.
    Models,
}

impl Endpoint {
    /// Whether the endpoint speaks the OpenAI wire format (bearer auth, OpenAI errors).
    fn is_openai(self) -> bool {
        matches!(self, Endpoint::ChatCompletions | Endpoint::Models)
    }
}

/// Matches `POST …/v1/messages`, `POST …/v1/messages/count_tokens`,
/// `POST …/v1/chat/completions` and `GET …/v1/models` (any prefix, so a `base_url` with
/// a path works too).
fn endpoint(method: &Method, path: &str) -> Option<Endpoint> {
    if method == Method::GET {
        return path.ends_with("/v1/models").then_some(Endpoint::Models);
    }
    if method != Method::POST {
        return None;
    }
    if path.ends_with("/v1/messages") {
        Some(Endpoint::Messages)
    } else if path.ends_with("/v1/messages/count_tokens") {
        Some(Endpoint::CountTokens)
    } else if path.ends_with("/v1/chat/completions") {
        Some(Endpoint::ChatCompletions)
    } else {
        None
    }
}

/// The credential: `x-api-key`, else the token of `Authorization: Bearer`; on the
/// OpenAI endpoints only the bearer token (OpenAI ignores `x-api-key`).
fn credential(headers: &http::HeaderMap, endpoint: Option<Endpoint>) -> Option<&str> {
    if !endpoint.is_some_and(Endpoint::is_openai)
        && let Some(key) = headers.get("x-api-key").and_then(|v| v.to_str().ok())
    {
        return Some(key);
    }
    let auth = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = auth.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The request fields the simulator reads; everything else is skipped unparsed (tools
/// are looked at separately, only when the body names them: `tools`).
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: bool,
    /// Chat Completions' `stream_options`.
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// Everything one response needs besides its behaviour.
struct Reply {
    request_id: HeaderValue,
    headers: Option<AlwaysHeaders>,
    guard: RequestGuard,
}

type Answer = Result<Response<SimBody>, io::Error>;

async fn handle(req: Request<Incoming>, shared: Arc<Shared>, reset: ResetFlag) -> Answer {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
    let arrived = std::time::Instant::now();
    let endpoint = endpoint(&parts.method, parts.uri.path());
    let presented = credential(&parts.headers, endpoint);
    // An access token the token endpoint issued names its account (expired or not).
    let issued = presented.and_then(|c| shared.issuer.account_of(c));
    let account = match &issued {
        Some((id, _)) => shared.accounts.by_id(id.as_str()).ok(),
        None => shared.accounts.identify(presented),
    };
    let guard = shared.accounts.begin(account.clone());
    let n = shared.ids.fetch_add(1, Ordering::Relaxed);

    if shared.recorder.enabled() {
        shared.recorder.push(RecordedRequest {
            seq: n,
            method: parts.method.clone(),
            path_and_query: parts
                .uri
                .path_and_query()
                .map_or_else(|| parts.uri.path().to_owned(), |p| p.to_string()),
            headers: parts.headers.clone(),
            body: body.clone(),
            account: account.as_ref().map(|a| a.id.clone()),
            received_at: tokio::time::Instant::now(),
        });
    }

    let request_id = HeaderValue::try_from(format!("req_sim{n:020}"))
        .unwrap_or(HeaderValue::from_static("req_sim"));
    let mut reply = Reply {
        request_id,
        headers: None,
        guard,
    };
    if parts.method == Method::POST && parts.uri.path().ends_with("/v1/oauth/token") {
        return Ok(token_answer(reply, shared.issuer.grant(&body)));
    }
    let Some(endpoint) = endpoint else {
        return Ok(error(reply, &ErrorReply::new(StatusCode::NOT_FOUND)));
    };
    let Some(account) = account else {
        let unknown = ErrorReply::new(StatusCode::UNAUTHORIZED);
        return Ok(error_for(endpoint, reply, &unknown));
    };
    if issued.is_some_and(|(_, expired)| expired) {
        let expired =
            ErrorReply::new(StatusCode::UNAUTHORIZED).message(crate::oauth::EXPIRED_MESSAGE);
        return Ok(error_for(endpoint, reply, &expired));
    }
    if endpoint == Endpoint::Models {
        return Ok(json(reply, StatusCode::OK, openai::models_json(unix_now())));
    }
    let model = serde_json::from_slice::<Probe<'_>>(&body)
        .ok()
        .and_then(|p| p.model.map(Cow::into_owned));
    let (behaviour, headers) = account.next(model.as_deref());
    if !headers.is_empty() {
        reply.headers = Some(headers);
    }
    let at = (n, arrived);
    perform(behaviour, reply, endpoint, &body, at, shared.seed, reset).await
}

/// Serves one request of a known account with its scripted behaviour. `at` is the
/// request's number and the moment its body was read.
async fn perform(
    behaviour: Behaviour,
    reply: Reply,
    endpoint: Endpoint,
    body: &[u8],
    at: (u64, std::time::Instant),
    seed: u64,
    reset: ResetFlag,
) -> Answer {
    let (n, arrived) = at;
    let probe = serde_json::from_slice::<Probe<'_>>(body).ok();
    let streams = matches!(endpoint, Endpoint::Messages | Endpoint::ChatCompletions);
    let stream = streams && probe.as_ref().is_some_and(|p| p.stream);
    let include_usage = probe
        .as_ref()
        .and_then(|p| p.stream_options.as_ref())
        .is_some_and(|o| o.include_usage);
    let model = probe.and_then(|p| p.model);
    let needs_model = matches!(
        behaviour,
        Behaviour::Ok(_)
            | Behaviour::InBandError { .. }
            | Behaviour::CutAfter { .. }
            | Behaviour::StallBeforeFirstFrame(_)
    );
    if needs_model && model.is_none() {
        let bad = ErrorReply::new(StatusCode::BAD_REQUEST)
            .message("model: Field required (the body must be JSON with a \"model\")");
        return Ok(error_for(endpoint, reply, &bad));
    }
    let calls_tools = match &behaviour {
        Behaviour::Ok(spec)
        | Behaviour::InBandError { spec, .. }
        | Behaviour::CutAfter { spec, .. } => spec.tool_calls,
        _ => false,
    };
    let tool = match endpoint {
        Endpoint::Messages if calls_tools => tools::messages_tool_call(body, n),
        Endpoint::ChatCompletions if calls_tools => tools::chat_tool_call(body, n),
        _ => None,
    };
    let scripted = Scripted {
        reply,
        n,
        arrived,
        endpoint,
        stream,
        include_usage,
        tool,
        model: model.unwrap_or_default().into_owned(),
        rng: SmallRng::seed_from_u64(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        reset,
    };
    match behaviour {
        Behaviour::Error(e) => Ok(error_for(scripted.endpoint, scripted.reply, &e)),
        Behaviour::Reset => Err(scripted.reset_connection(
            io::ErrorKind::ConnectionReset,
            "keypool-sim: scripted reset",
        )),
        Behaviour::StallBeforeHeaders(wait) => {
            pause(wait).await;
            Err(scripted.reset_connection(
                io::ErrorKind::TimedOut,
                "keypool-sim: scripted stall before headers",
            ))
        }
        Behaviour::StallBeforeFirstFrame(wait) => Ok(scripted.stall_after_head(wait)),
        Behaviour::Ok(spec) => Ok(scripted.ok(&spec).await),
        Behaviour::InBandError { after_frames, spec } => {
            Ok(scripted.in_band_error(after_frames, &spec).await)
        }
        Behaviour::CutAfter { frames, cut, spec } => {
            Ok(scripted.cut_after(frames, cut, &spec).await)
        }
    }
}

/// One request of a known account, answered as its script says: one method per
/// behaviour that sends a response.
struct Scripted {
    reply: Reply,
    /// The request's number (message ids, the random draws' seed).
    n: u64,
    /// When its body was read.
    arrived: std::time::Instant,
    endpoint: Endpoint,
    /// A Messages or Chat Completions request with `"stream": true`.
    stream: bool,
    /// Chat Completions' `stream_options.include_usage`.
    include_usage: bool,
    /// The tool call the request gets instead of text ([`tools`]).
    tool: Option<ToolCall>,
    model: String,
    rng: SmallRng,
    reset: ResetFlag,
}

impl Scripted {
    /// No response at all: the connection is reset.
    fn reset_connection(mut self, kind: io::ErrorKind, why: &'static str) -> io::Error {
        self.reset.store(true, Ordering::Relaxed);
        self.reply.guard.finish();
        io::Error::new(kind, why)
    }

    /// The `200` head, then nothing until the stall ends and the connection is reset.
    fn stall_after_head(self, wait: Duration) -> Response<SimBody> {
        let content_type = if self.stream {
            wire::EVENT_STREAM
        } else {
            wire::JSON
        };
        let body = SimBody::stall(wait, self.reply.guard, self.reset);
        head(
            StatusCode::OK,
            content_type,
            &self.reply.request_id,
            self.reply.headers.as_deref(),
            body,
            self.stream,
        )
    }

    /// A successful answer: `count_tokens`, the model list, a JSON message or chat
    /// completion, or a stream.
    async fn ok(mut self, spec: &OkSpec) -> Response<SimBody> {
        if self.stream {
            pause(spec.ttft.sample(&mut self.rng)).await;
            let mut id = self.answer_id();
            if spec.think_time_in_id {
                id = format!("{id}_think{}", self.arrived.elapsed().as_nanos());
            }
            let frames = self.frames(&id, spec);
            return self.sse(
                frames,
                usize::MAX,
                false,
                Ending::Clean,
                spec.chunk_interval,
            );
        }
        pause(spec.latency.sample(&mut self.rng)).await;
        let body = match self.endpoint {
            Endpoint::CountTokens => wire::count_tokens_json(spec.usage.input_tokens),
            Endpoint::Models => openai::models_json(unix_now()),
            Endpoint::Messages => {
                wire::message_json(&self.answer_id(), &self.model, spec, self.tool.as_ref())
            }
            Endpoint::ChatCompletions => {
                let id = self.answer_id();
                openai::completion_json(&self.chat_answer(&id), spec)
            }
        };
        json(self.reply, StatusCode::OK, body)
    }

    /// The answer's id: `msg_sim…` or `chatcmpl-sim…`.
    fn answer_id(&self) -> String {
        match self.endpoint {
            Endpoint::ChatCompletions => format!("chatcmpl-sim{:020}", self.n),
            _ => message_id(self.n),
        }
    }

    fn chat_answer<'a>(&'a self, id: &'a str) -> openai::ChatAnswer<'a> {
        openai::ChatAnswer {
            id,
            model: &self.model,
            created: unix_now(),
            tool: self.tool.as_ref(),
        }
    }

    /// The frames of the complete stream in the endpoint's wire format.
    fn frames(&self, id: &str, spec: &OkSpec) -> StreamFrames {
        match self.endpoint {
            Endpoint::ChatCompletions => {
                StreamFrames::chat(&self.chat_answer(id), spec, self.include_usage)
            }
            _ => StreamFrames::new(id, &self.model, spec, self.tool.as_ref()),
        }
        .pacing_first(spec.pace_first_delta)
    }

    /// A stream with an in-band `overloaded_error` after `after_frames` frames (a
    /// `529` when not streaming).
    async fn in_band_error(mut self, after_frames: usize, spec: &OkSpec) -> Response<SimBody> {
        if !self.stream {
            let status = match self.endpoint {
                Endpoint::ChatCompletions => StatusCode::SERVICE_UNAVAILABLE,
                _ => overloaded(),
            };
            return error_for(self.endpoint, self.reply, &ErrorReply::new(status));
        }
        pause(spec.ttft.sample(&mut self.rng)).await;
        let frames = self.frames(&self.answer_id(), spec);
        self.sse(
            frames,
            after_frames.max(1),
            true,
            Ending::Clean,
            spec.chunk_interval,
        )
    }

    /// A stream cut after `frames` frames (never `message_stop`), ending as `cut`
    /// says; not streaming, the head and then a failed body.
    async fn cut_after(mut self, frames: usize, cut: Cut, spec: &OkSpec) -> Response<SimBody> {
        if !self.stream {
            // No frames to cut between: the head comes, then the body fails.
            let body = SimBody::stall(Duration::ZERO, self.reply.guard, self.reset);
            return head(
                StatusCode::OK,
                wire::JSON,
                &self.reply.request_id,
                self.reply.headers.as_deref(),
                body,
                false,
            );
        }
        pause(spec.ttft.sample(&mut self.rng)).await;
        let stream = self.frames(&self.answer_id(), spec);
        let send = frames.min(stream.len() - 1);
        let ending = match cut {
            Cut::EndOfBody => Ending::Clean,
            Cut::Close | Cut::Reset => Ending::Fail(cut),
        };
        self.sse(stream, send, false, ending, spec.chunk_interval)
    }

    /// An SSE answer of `frames`: the first `send`, then an error frame when
    /// `error_frame`, then `ending`.
    fn sse(
        self,
        frames: StreamFrames,
        send: usize,
        error_frame: bool,
        ending: Ending,
        interval: Delay,
    ) -> Response<SimBody> {
        let cursor = StreamCursor::new(frames, send, error_frame, ending, interval, self.rng);
        let body = SimBody::stream(cursor, self.reply.guard, self.reset);
        head(
            StatusCode::OK,
            wire::EVENT_STREAM,
            &self.reply.request_id,
            self.reply.headers.as_deref(),
            body,
            true,
        )
    }
}

/// Waits `d` on the tokio clock. A zero wait returns at once: even a zero `sleep` waits
/// for the next tick of tokio's millisecond timer wheel.
async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// `529`, Anthropic's "overloaded" status.
fn overloaded() -> StatusCode {
    StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
}

fn message_id(n: u64) -> String {
    format!("msg_sim{n:020}")
}

fn json(reply: Reply, status: StatusCode, bytes: Bytes) -> Response<SimBody> {
    let body = SimBody::full(bytes, reply.guard);
    head(
        status,
        wire::JSON,
        &reply.request_id,
        reply.headers.as_deref(),
        body,
        false,
    )
}

/// The token endpoint's answer: new tokens, or an OAuth error body.
fn token_answer(mut reply: Reply, grant: crate::oauth::Grant) -> Response<SimBody> {
    reply.guard.finish();
    match grant {
        crate::oauth::Grant::Issued(t) => {
            let body = serde_json::json!({
                "token_type": "Bearer",
                "access_token": t.access_token,
                "refresh_token": t.refresh_token,
                "expires_in": t.expires_in,
                "scope": "user:inference user:profile",
            });
            json(reply, StatusCode::OK, Bytes::from(body.to_string()))
        }
        crate::oauth::Grant::Refused {
            status,
            error,
            description,
        } => {
            let body = serde_json::json!({"error": error, "error_description": description});
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            json(reply, status, Bytes::from(body.to_string()))
        }
    }
}

/// An error answer in the endpoint's wire format.
fn error_for(endpoint: Endpoint, reply: Reply, e: &ErrorReply) -> Response<SimBody> {
    if !endpoint.is_openai() {
        return error(reply, e);
    }
    let message = match openai::default_message_for(e.status) {
        Some(text) if e.message == wire::default_message_for(e.status) => text,
        _ => &e.message,
    };
    let bytes = openai::error_body(e.status, &e.error_type, message);
    with_headers(json(reply, e.status, bytes), e)
}

/// Unix seconds, for the `created` of OpenAI answers.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn error(reply: Reply, e: &ErrorReply) -> Response<SimBody> {
    let request_id = reply.request_id.to_str().unwrap_or("req_sim");
    let bytes = wire::error_body(&e.error_type, &e.message, request_id);
    with_headers(json(reply, e.status, bytes), e)
}

/// Adds the error's extra headers (`retry-after`, rate-limit headers, …).
fn with_headers(mut response: Response<SimBody>, e: &ErrorReply) -> Response<SimBody> {
    for (name, value) in &e.headers {
        response.headers_mut().append(name.clone(), value.clone());
    }
    response
}

fn head(
    status: StatusCode,
    content_type: &'static str,
    request_id: &HeaderValue,
    always: Option<&[(http::HeaderName, HeaderValue)]>,
    body: SimBody,
    stream: bool,
) -> Response<SimBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert("request-id", request_id.clone());
    if stream {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    for (name, value) in always.unwrap_or_default() {
        headers.append(name.clone(), value.clone());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_match_with_any_prefix_and_only_post() {
        assert_eq!(
            endpoint(&Method::POST, "/v1/messages"),
            Some(Endpoint::Messages)
        );
        assert_eq!(
            endpoint(&Method::POST, "/api/anthropic/v1/messages"),
            Some(Endpoint::Messages)
        );
        assert_eq!(
            endpoint(&Method::POST, "/v1/messages/count_tokens"),
            Some(Endpoint::CountTokens)
        );
        assert_eq!(endpoint(&Method::GET, "/v1/messages"), None);
        assert_eq!(
            endpoint(&Method::POST, "/openai/v1/chat/completions"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(endpoint(&Method::GET, "/v1/models"), Some(Endpoint::Models));
        assert_eq!(endpoint(&Method::POST, "/v1/models"), None);
        assert_eq!(endpoint(&Method::GET, "/v1/chat/completions"), None);
        assert_eq!(endpoint(&Method::POST, "/v1/complete"), None);
    }

    #[test]
    fn credential_prefers_x_api_key_then_bearer() {
        let mut h = http::HeaderMap::new();
        let messages = Some(Endpoint::Messages);
        let chat = Some(Endpoint::ChatCompletions);
        assert_eq!(credential(&h, messages), None);
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer tok-1"));
        assert_eq!(credential(&h, messages), Some("tok-1"));
        h.insert("x-api-key", HeaderValue::from_static("key-1"));
        assert_eq!(credential(&h, messages), Some("key-1"));
        // OpenAI endpoints read only the bearer token.
        assert_eq!(credential(&h, chat), Some("tok-1"));
        h.remove(AUTHORIZATION);
        assert_eq!(credential(&h, chat), None);
        h.remove("x-api-key");
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(credential(&h, messages), None);
    }
}
