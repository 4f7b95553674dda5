//! [`App`]: the shared state of the server and the request path of SPEC 3 steps 1–4.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use http::header::{CONNECTION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use keypool_providers::{Endpoint, HeaderLines as _, inspect_request};
use keypool_selector::HedgeBudget;
use keypool_store::config::{Config, ServerSettings};
use keypool_store::keys::KeyMemo;
use keypool_store::resolve::PoolKey;
use keypool_store::{Store, now_ms};

use crate::attempt::Call;
use crate::body::{Collected, ProxyBody};
use crate::body_budget::{BodyBudget, Reservation};
use crate::connection::{self, ClientInfo, Side};
use crate::context::RequestContext;
use crate::h1::HeadLines;
use crate::headers::{X_REQUEST_ID, add_legacy_headers};
use crate::metrics::{InternalRoute, Metrics, UNRESOLVED};
use crate::reject::Reject;
use crate::route::{RouteMatch, match_path};
use crate::timing::{Late, Paced};
use crate::upstream::{Egress, Upstream, UpstreamClient, build_client_with};
use crate::{admin, failover};

/// The proxy application: the store, the upstream client, metrics and per-pool hedge
/// budgets. Cheap to clone (an `Arc`); build one per process with [`App::new`] (or
/// `App::from(store)`) and hand it to [`run`](crate::run).
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
    /// The attempts' upstream client and its connection pool: shared by clones,
    /// replaced by [`App::with_own_client`] (one per worker thread).
    upstream: Arc<Upstream>,
    /// The attempts' clients of accounts with their own `proxy_url`, by proxy URL
    /// (made on first use; one map per worker thread, like `upstream`).
    proxied_upstreams: Arc<DashMap<Arc<str>, Arc<Upstream>>>,
    /// The client of everything else keypool calls (OAuth token refreshes, alert
    /// webhooks), per worker thread like `upstream`.
    client: Arc<UpstreamClient>,
    /// Its clients of accounts with their own `proxy_url`, by proxy URL.
    proxied: Arc<DashMap<Arc<str>, Arc<UpstreamClient>>>,
    /// Where the shared pool's connections go (the proxy environment at start).
    egress: Arc<Egress>,
}

struct Inner {
    store: Store,
    metrics: Metrics,
    /// Per pool: the `hedge_budget` ratio (its bits) the budget was made for, and the
    /// budget. A reload that changes the ratio gets a new budget on the next request.
    budgets: DashMap<PoolKey, (u64, Option<Arc<HedgeBudget>>), foldhash::fast::RandomState>,
    seed: u64,
    /// Request body bytes held by the whole process (`max_body_bytes_in_flight`).
    body_budget: Arc<BodyBudget>,
    /// Buffered upstream answer bytes held by the whole process (the same bound, kept
    /// apart so that request bodies filling their budget never starve the answers that
    /// would end those requests).
    answer_budget: Arc<BodyBudget>,
    unresolved: Arc<str>,
    /// The file `POST /admin/reload` re-reads (none for an embedded config).
    config_path: std::sync::OnceLock<std::path::PathBuf>,
    /// Set when the server stopped accepting for shutdown (`/readyz` then says 503).
    draining: std::sync::atomic::AtomicBool,
    /// The worker threads' balance, once [`crate::run_workers`] runs more than one
    /// (their connections and loads on `/metrics`).
    workers: std::sync::OnceLock<Arc<crate::balance::AcceptBalance>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("store", &self.inner.store)
            .finish_non_exhaustive()
    }
}

impl From<Store> for App {
    fn from(store: Store) -> Self {
        App::new(store)
    }
}

impl App {
    /// An application serving `store`'s configuration, with a fresh upstream client
    /// (connection pool) and empty metrics; the first `App` of a store starts its
    /// alert sender (SPEC 15). Must be called inside a tokio runtime.
    pub fn new(store: Store) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
        let egress = Egress::from_env();
        let client = Arc::new(build_client_with(egress.clone()));
        crate::alerts::spawn_sender(&store, client.clone());
        Self {
            upstream: Upstream::new(egress.clone()),
            proxied_upstreams: Arc::new(DashMap::new()),
            client,
            proxied: Arc::new(DashMap::new()),
            egress: Arc::new(egress),
            inner: Arc::new(Inner {
                store,
                metrics: Metrics::new(),
                budgets: DashMap::default(),
                seed,
                body_budget: Arc::new(BodyBudget::new()),
                answer_budget: Arc::new(BodyBudget::new()),
                unresolved: Arc::from(UNRESOLVED),
                config_path: std::sync::OnceLock::new(),
                draining: std::sync::atomic::AtomicBool::new(false),
                workers: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Names the config file `POST /admin/reload` re-reads (as `SIGHUP` does). Without
    /// it (an embedded config, e.g. `keypool demo`) the reload route answers `409`. Only
    /// the first path set is kept.
    pub fn with_config_path(self, path: impl Into<std::path::PathBuf>) -> Self {
        let _ = self.inner.config_path.set(path.into());
        self
    }

    /// The config file set by [`App::with_config_path`].
    pub fn config_path(&self) -> Option<&std::path::Path> {
        self.inner
            .config_path
            .get()
            .map(std::path::PathBuf::as_path)
    }

    /// Marks the application as draining for shutdown: `/readyz` answers `503` from
    /// now on (the server calls it when it stops accepting).
    pub fn begin_drain(&self) {
        self.inner.draining.store(true, Ordering::Relaxed);
    }

    /// Whether [`App::begin_drain`] was called.
    pub fn draining(&self) -> bool {
        self.inner.draining.load(Ordering::Relaxed)
    }

    /// The store (configuration, runtime state).
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Shows the worker threads' balance on `/metrics` (the first one set stays).
    pub(crate) fn show_workers(&self, balance: &Arc<crate::balance::AcceptBalance>) {
        let _ = self.inner.workers.set(Arc::clone(balance));
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The same application (store, metrics, budgets, ids) with a fresh upstream
    /// connection pool: each [`run_workers`](crate::run_workers) thread gets one, so
    /// that its requests use connections driven by its own runtime.
    pub fn with_own_client(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            upstream: Upstream::new((*self.egress).clone()),
            proxied_upstreams: Arc::new(DashMap::new()),
            client: Arc::new(build_client_with((*self.egress).clone())),
            proxied: Arc::new(DashMap::new()),
            egress: self.egress.clone(),
        }
    }

    /// The upstream client of `account` (`None`: the shared pool).
    pub(crate) fn client_of(
        &self,
        account: Option<&keypool_store::config::Account>,
    ) -> Arc<UpstreamClient> {
        account.map_or_else(|| self.client.clone(), |a| self.client_for(a))
    }

    /// The attempts' upstream client of `account`: this worker's, or the one of its
    /// own `proxy_url`.
    pub(crate) fn upstream_for(&self, account: &keypool_store::config::Account) -> Arc<Upstream> {
        let Some(url) = account.proxy_url() else {
            return self.upstream.clone();
        };
        if let Some(upstream) = self.proxied_upstreams.get(url.expose()) {
            return upstream.clone();
        }
        self.proxied_upstreams
            .entry(Arc::from(url.expose()))
            .or_insert_with(|| Upstream::new(Egress::for_account(account, &self.egress)))
            .clone()
    }

    /// The client of `account` for everything but its attempts: the shared pool, or
    /// the pool of its own `proxy_url`.
    pub(crate) fn client_for(
        &self,
        account: &keypool_store::config::Account,
    ) -> Arc<UpstreamClient> {
        let Some(url) = account.proxy_url() else {
            return self.client.clone();
        };
        if let Some(client) = self.proxied.get(url.expose()) {
            return client.clone();
        }
        self.proxied
            .entry(Arc::from(url.expose()))
            .or_insert_with(|| {
                Arc::new(build_client_with(Egress::for_account(
                    account,
                    &self.egress,
                )))
            })
            .clone()
    }

    /// A seed for one request's random choices (ties between cooldown expiries).
    pub(crate) fn next_seed(&self) -> u64 {
        let n = next_number();
        splitmix(self.inner.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    /// The pool's hedge budget for `ratio` (`None` when the ratio is invalid, which the
    /// config validation prevents). The same budget while the ratio stays the same; a
    /// new one once a reload changed it.
    pub(crate) fn hedge_budget(&self, pool: &PoolKey, ratio: f64) -> Option<Arc<HedgeBudget>> {
        let bits = ratio.to_bits();
        if let Some(b) = self.inner.budgets.get(pool)
            && b.0 == bits
        {
            return b.1.clone();
        }
        let fresh = || (bits, HedgeBudget::try_new(ratio).ok().map(Arc::new));
        let mut entry = self.inner.budgets.entry(pool.clone()).or_insert_with(fresh);
        if entry.0 != bits {
            *entry = fresh();
        }
        entry.1.clone()
    }

    fn request_id(&self) -> Arc<str> {
        request_id_of(splitmix(self.inner.seed.wrapping_add(next_number())))
    }

    /// Answers one request: never fails, never panics on bad input; every response
    /// carries `x-request-id`.
    pub async fn handle<B>(&self, request: Request<B>) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let info = request.extensions().get::<ClientInfo>().copied();
        let (parts, body) = request.into_parts();
        let parts = RequestParts {
            method: parts.method,
            uri: parts.uri,
            headers: HeadLines::from_map(&parts.headers),
        };
        let (mut response, id) = self
            .handle_from(info, &mut KeyMemo::default(), parts, body)
            .await;
        if let Ok(value) = HeaderValue::from_str(&id) {
            response.headers_mut().insert(X_REQUEST_ID, value);
        }
        response
    }

    /// [`App::handle`] for a request whose connection facts the server hands over
    /// directly (keypool's own HTTP/1.1 server: no extensions map per request), with
    /// the connection's memo of the key it presented last: the answer and the request
    /// id, which the caller sends as `x-request-id` (keypool's server writes it straight
    /// into the head it writes, without a header map insert).
    pub(crate) async fn handle_from<B>(
        &self,
        info: Option<ClientInfo>,
        memo: &mut KeyMemo,
        parts: RequestParts,
        body: B,
    ) -> (Response<ProxyBody>, Arc<str>)
    where
        B: Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut ctx =
            RequestContext::new(self.metrics(), self.request_id(), &self.inner.unresolved);
        let response = self.dispatch(&mut ctx, info, memo, parts, body).await;
        ctx.answered(response.status().as_u16());
        (response, ctx.id.clone())
    }

    async fn dispatch<B>(
        &self,
        ctx: &mut RequestContext<'_>,
        info: Option<ClientInfo>,
        memo: &mut KeyMemo,
        parts: RequestParts,
        body: B,
    ) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // HEAD answers 200 for anything, before any lookup (SPEC 2).
        if parts.method == Method::HEAD {
            ctx.internal(InternalRoute::Head);
            return Response::new(ProxyBody::empty());
        }
        let route = match_path(parts.uri.path());
        let get = parts.method == Method::GET;
        if let Some(internal) = internal_route(&route) {
            ctx.internal(internal);
        }
        let side = info.map_or(Side::Public, |i| i.side);
        // one config for the whole request (each look-up clones the thread's copy)
        let config = self.store().config();
        let split = config.server().admin_listen.is_some();
        if !connection::serves(side, split, &route) {
            return Reject::unknown_path().respond(&ctx.id);
        }
        match route {
            RouteMatch::Health if get => text(StatusCode::OK, "ok\n"),
            RouteMatch::Ready if get => self.readyz(),
            RouteMatch::Metrics if get => self.metrics_page(),
            RouteMatch::Admin(rest) => admin::handle(self, &parts, body, rest, &ctx.id).await,
            RouteMatch::Api { org, url, endpoint } => {
                let legacy = route.is_legacy();
                let mut response = if endpoint == Endpoint::Models {
                    if get {
                        self.messages(ctx, &config, memo, &parts, body, org, url, endpoint)
                            .await
                    } else {
                        Reject::method_not_allowed().respond(&ctx.id)
                    }
                } else if parts.method == Method::POST {
                    ctx.open_log();
                    if let Some(log) = ctx.log_mut() {
                        log.client = info.map(|i| i.peer);
                        log.user_agent = parts
                            .headers
                            .first_text("user-agent")
                            .and_then(crate::log::loggable_user_agent);
                    }
                    self.messages(ctx, &config, memo, &parts, body, org, url, endpoint)
                        .await
                } else {
                    Reject::method_not_allowed().respond(&ctx.id)
                };
                if endpoint.is_openai() {
                    response = crate::openai::reshape_error(response);
                }
                if legacy {
                    let sunset = config.server().legacy_routes_until_unix_secs;
                    add_legacy_headers(response.headers_mut(), sunset);
                }
                response
            }
            _ => Reject::unknown_path().respond(&ctx.id),
        }
    }

    /// `GET /metrics`: the Prometheus text exposition.
    fn metrics_page(&self) -> Response<ProxyBody> {
        let mut exposition = self.metrics().render(self.store(), now_ms());
        self.metrics().render_body_budget(
            &mut exposition,
            self.body_budget().held(),
            self.answer_budget().held(),
        );
        if let Some(workers) = self.inner.workers.get() {
            workers.render(&mut exposition);
        }
        let mut response = text(StatusCode::OK, exposition);
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        response
    }

    /// `GET /readyz`: `200` whenever keypool serves, including from memory while Redis
    /// is away or the state file cannot be written (the body says what is degraded, and
    /// so do `keypool_redis_ready` and `keypool_state_file_writable`): a Redis blip must
    /// not take every replica out of a load balancer at once. `503` only while keypool
    /// cannot serve: it is draining for shutdown.
    fn readyz(&self) -> Response<ProxyBody> {
        if self.draining() {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: shutting down, draining requests in flight\n",
            );
        }
        let backend = self.store().backend_status();
        let mut degraded = Vec::new();
        if backend.redis_ready == Some(false) {
            degraded.push(
                "redis is configured but unreachable: state is not shared with other replicas until it answers"
                    .to_owned(),
            );
        }
        if let Some(error) = backend.state_file_error {
            degraded.push(format!(
                "the state file could not be written: {error}. Runtime state changed since the last successful write would be lost at a restart"
            ));
        }
        if degraded.is_empty() {
            return text(StatusCode::OK, "ready\n");
        }
        text(
            StatusCode::OK,
            format!(
                "ready, serving from memory; but {}\n",
                degraded.join("; and ")
            ),
        )
    }

    /// SPEC 3 for an API route: steps 1–4 here, 5–8 in [`failover::serve`]. A chat
    /// completion is translated to a Messages request right after its body is read,
    /// and follows the same path; `GET …/v1/models` ends after step 3.
    #[allow(clippy::too_many_arguments)]
    async fn messages<B>(
        &self,
        ctx: &mut RequestContext<'_>,
        config: &Config,
        memo: &mut KeyMemo,
        parts: &RequestParts,
        body: B,
        org: Option<&str>,
        url: &str,
        endpoint: Endpoint,
    ) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let settings = config.server();
        // 1. Receive: only the head so far. Route and key are answered from it alone,
        // so an unauthenticated client never makes keypool hold its body.
        // Legacy routes end at `legacy_routes_until` (answered without any lookup).
        if org.is_none() && now_ms() / 1000 > settings.legacy_routes_until_unix_secs {
            return early_reject(parts, &Reject::legacy_gone(url), &ctx.id);
        }
        // 2. Resolve org and URL config.
        let resolved = match org {
            Some(org) => config.resolve(org, url),
            None => config.resolve_legacy(url),
        };
        let route = match resolved {
            Ok(route) => route,
            Err(e) => return early_reject(parts, &Reject::from(e), &ctx.id),
        };
        ctx.resolved(&route, endpoint);
        // 3. Validate the LB key.
        let presented = keypool_store::keys::presented_key(
            parts.headers.first_text("x-api-key"),
            parts.headers.first_text("authorization"),
        );
        let key = match config.authenticate_key_with(&route, presented, memo) {
            Ok(key) => key,
            Err(e) => return early_reject(parts, &Reject::from(e), &ctx.id),
        };
        // Issue 24: `x-keypool-route` picks another of the key's URL configs.
        let route = match chosen_route(config, parts, route, presented, memo) {
            Ok(route) => route,
            Err(reject) => return early_reject(parts, &reject, &ctx.id),
        };
        ctx.resolved(&route, endpoint);
        ctx.authenticated(key.caller(), self);
        if endpoint == Endpoint::Models {
            return crate::openai::models(config, &route);
        }
        // 4. The key is stripped by the upstream head builder's allowlist; read the body
        // (step 1's limits) and parse it (a chat completion: translated first).
        let mut body = match self.read_body(settings, parts, body).await {
            Ok(body) => body,
            Err(reject) => return reject.respond(&ctx.id),
        };
        let chat = match crate::openai::translate_request(endpoint, &mut body.bytes) {
            Ok(chat) => chat,
            Err(e) => return crate::openai::refused(&e),
        };
        let info = match inspect_request(&body.bytes) {
            Ok(info) => info,
            Err(e) => return Reject::from(e).respond(&ctx.id),
        };
        if let Some(log) = ctx.log_mut() {
            log.stream = info.stream;
            log.model = Some(crate::log::logged_model(&info.model));
        }
        // SPEC 12: the caller's limits, before any account is chosen.
        let org = route.org();
        // The check's future is large (it holds the Redis round trip): built only for a
        // key with limits, and boxed, so that this future neither holds it nor copies
        // it twice (5.6 KB each time) on every request.
        let len = body.bytes.len();
        let admitted = crate::limits::admit_boxed(self, org, key, &info, len, endpoint).await;
        if let Some(refused) = crate::limits::into_log(self, ctx, org, key, admitted) {
            return refused;
        }
        // 5–8. Filter, choose, call and fail over, answer.
        let mut call = Call {
            app: self,
            config,
            uri: &parts.uri,
            headers: &parts.headers,
            body: body.bytes,
            _body_held: body.reservation,
            endpoint,
            chat,
            stream: info.stream,
            user_id: info.user_id.as_deref(),
            model: &info.model,
            key,
            first_chunks: Default::default(),
        };
        failover::serve(&mut call, &route, ctx).await
    }
}

/// A request's head as the app reads it: its header lines as they came ([`HeadLines`]),
/// from keypool's own HTTP/1.1 server or from an `http::Request` ([`App::handle`]).
#[derive(Debug)]
pub(crate) struct RequestParts {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeadLines,
}

/// The header by which one request picks another URL config of its org (issue 24).
pub(crate) const X_KEYPOOL_ROUTE: &str = "x-keypool-route";

/// The URL config a request is served by: the path's, or the one its `x-keypool-route`
/// header names in the same org, if the same key may use it. An unknown URL config and
/// one the key may not use are the same `401 authentication_error` (nothing says which
/// URL configs exist), after the key was valid for the path's.
fn chosen_route(
    config: &keypool_store::config::Config,
    parts: &RequestParts,
    route: keypool_store::resolve::Route,
    presented: Option<&str>,
    memo: &mut KeyMemo,
) -> Result<keypool_store::resolve::Route, Reject> {
    let Some(value) = parts.headers.first(X_KEYPOOL_ROUTE) else {
        return Ok(route);
    };
    let refused = || {
        Reject::new(
            StatusCode::UNAUTHORIZED,
            keypool_providers::ErrorType::Authentication,
            "x-keypool-route names a URL config this key may not use: send one of the key's URL configs (its `urls`), or leave the header out",
        )
    };
    let url = keypool_providers::header_text(value)
        .ok_or_else(refused)?
        .trim();
    if url == route.url().custom_url() {
        return Ok(route);
    }
    let other = config
        .resolve(route.org().slug(), url)
        .map_err(|_| refused())?;
    config
        .authenticate_key_with(&other, presented, memo)
        .map_err(|_| refused())?;
    Ok(other)
}

/// The `route` label of a request that is not a Messages route (`None` for one).
fn internal_route(route: &RouteMatch<'_>) -> Option<InternalRoute> {
    match route {
        RouteMatch::Api { .. } => None,
        RouteMatch::Health => Some(InternalRoute::Healthz),
        RouteMatch::Ready => Some(InternalRoute::Readyz),
        RouteMatch::Metrics => Some(InternalRoute::Metrics),
        RouteMatch::Admin(_) => Some(InternalRoute::Admin),
        _ => Some(InternalRoute::Other),
    }
}

/// A request body read whole, with its share of the process-wide [`BodyBudget`].
pub(crate) struct RequestBody {
    pub bytes: Bytes,
    pub reservation: Reservation,
}

impl App {
    /// Reads a request body within step 1's limits: at most `max_body_bytes` (`413` from
    /// the `content-length` alone when it announces more, else while reading, never
    /// buffering past the limit); nothing received for `header_read_timeout` in the
    /// middle of the body, or the whole body not in within `body_read_timeout`, is `408`;
    /// a body that does not fit in `max_body_bytes_in_flight` next to every other body
    /// held now is `503` with `Retry-After: 1`.
    pub(crate) async fn read_body<B>(
        &self,
        settings: &ServerSettings,
        parts: &RequestParts,
        body: B,
    ) -> Result<RequestBody, Reject>
    where
        B: Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let limit = settings.max_body_bytes;
        let in_flight = settings.max_body_bytes_in_flight;
        let announced = announced_length(parts);
        if announced.is_some_and(|n| n > limit) {
            return Err(Reject::too_large(limit));
        }
        let mut reservation = self
            .body_budget()
            .reserve(announced.unwrap_or(0), in_flight)
            .ok_or_else(|| self.bodies_over_budget())?;
        let idle = Duration::from_millis(settings.header_read_timeout_ms);
        let total = Duration::from_millis(settings.body_read_timeout_ms);
        // A body that came with its head (the usual small request) is read without a
        // clock read or a timer; the whole body's time counts from the first wait.
        let mut paced = Paced::new(idle, total);
        let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut limited = std::pin::pin!(Limited::new(body, limit_usize));
        let mut collected = Collected::default();
        let mut len = 0u64;
        loop {
            let frame = match paced.next(limited.as_mut().frame()).await {
                Err(Late::Total) => return Err(Reject::body_too_slow(total)),
                Err(Late::Idle) => return Err(Reject::body_timeout(idle)),
                Ok(None) => break,
                Ok(Some(Err(e))) if e.downcast_ref::<LengthLimitError>().is_some() => {
                    return Err(Reject::too_large(limit));
                }
                Ok(Some(Err(_))) => return Err(Reject::unreadable_body()),
                Ok(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                len += data.len() as u64;
                if !reservation.grow_to(len, in_flight) {
                    return Err(self.bodies_over_budget());
                }
                collected.push(data);
            }
        }
        Ok(RequestBody {
            bytes: collected.into_bytes(),
            reservation,
        })
    }

    /// The process-wide count of request body bytes held.
    pub(crate) fn body_budget(&self) -> &Arc<BodyBudget> {
        &self.inner.body_budget
    }

    /// The process-wide count of buffered upstream answer bytes held.
    pub(crate) fn answer_budget(&self) -> &Arc<BodyBudget> {
        &self.inner.answer_budget
    }

    fn bodies_over_budget(&self) -> Reject {
        self.metrics().body_budget_rejection();
        Reject::bodies_over_budget()
    }
}

/// The request's `content-length`, when it sends a valid one.
fn announced_length(parts: &RequestParts) -> Option<u64> {
    parts
        .headers
        .first_text("content-length")
        .and_then(|v| v.parse::<u64>().ok())
}

/// A rejection answered from the request head alone, before the body was read: when a
/// body is on its way, the answer says `connection: close` (the unread body makes the
/// connection unusable for another request, and a client that is still sending learns
/// at once that it should stop).
pub(crate) fn early_reject(
    parts: &RequestParts,
    reject: &Reject,
    request_id: &str,
) -> Response<ProxyBody> {
    let mut response = reject.respond(request_id);
    let body_coming = announced_length(parts).is_some_and(|n| n > 0)
        || parts.headers.first("transfer-encoding").is_some();
    if body_coming {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// `req_kp_{bits:016x}`, without the formatting machinery (nine tenths of the cost of
/// `format!` here).
fn request_id_of(mut bits: u64) -> Arc<str> {
    let mut id = *b"req_kp_0000000000000000";
    for slot in id[7..].iter_mut().rev() {
        *slot = b"0123456789abcdef"[(bits & 0xf) as usize];
        bits >>= 4;
    }
    // Only ASCII was written.
    Arc::from(std::str::from_utf8(&id).unwrap_or("req_kp_0000000000000000"))
}

/// The numbers [`next_number`] hands out, a block per thread at a time.
static NUMBERS: AtomicU64 = AtomicU64::new(0);
/// How many numbers a thread takes at once.
const NUMBER_BLOCK: u64 = 1 << 16;

thread_local! {
    /// The thread's next number and the end of its block.
    static BLOCK: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// A number no other call in the process gets (request ids and seeds are mixed from
/// it). A thread takes a block of them at a time, so that requests do not write a
/// counter the other workers write too (issue 22).
fn next_number() -> u64 {
    BLOCK
        .try_with(|block| {
            let (mut n, mut end) = block.get();
            if n == end {
                n = NUMBERS.fetch_add(NUMBER_BLOCK, Ordering::Relaxed);
                end = n + NUMBER_BLOCK;
            }
            block.set((n + 1, end));
            n
        })
        .unwrap_or_else(|_| NUMBERS.fetch_add(1, Ordering::Relaxed))
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keypool_store::config::Config;

    #[test]
    fn request_ids_read_as_formatted_hex() {
        for bits in [0u64, 1, 0xdead_beef, u64::MAX, splitmix(7)] {
            assert_eq!(&*request_id_of(bits), format!("req_kp_{bits:016x}"));
        }
    }

    #[test]
    fn numbers_are_unique_across_threads_and_blocks() {
        let per_thread = NUMBER_BLOCK as usize * 2 + 7;
        let numbers: Vec<u64> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..3)
                .map(|_| s.spawn(|| (0..per_thread).map(|_| next_number()).collect::<Vec<_>>()))
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        let distinct: std::collections::HashSet<u64> = numbers.iter().copied().collect();
        assert_eq!(distinct.len(), numbers.len());
        assert_eq!(numbers.len(), 3 * per_thread);
    }

    #[tokio::test]
    async fn a_changed_hedge_budget_ratio_gets_a_new_budget() {
        let toml = "[server]\nstate_file = \"\"\n[[orgs]]\nslug = \"acme\"\n";
        let config = Config::from_toml_str(toml, None, &|_| None).unwrap();
        let app = App::new(Store::open(config).await.unwrap());
        let pool = PoolKey::new("acme", Some("g"));
        let first = app.hedge_budget(&pool, 0.1).unwrap();
        assert!(Arc::ptr_eq(&first, &app.hedge_budget(&pool, 0.1).unwrap()));
        let changed = app.hedge_budget(&pool, 0.5).unwrap();
        assert!(!Arc::ptr_eq(&first, &changed));
        assert!(Arc::ptr_eq(
            &changed,
            &app.hedge_budget(&pool, 0.5).unwrap()
        ));
        assert!(app.hedge_budget(&pool, 2.0).is_none());
    }
}
