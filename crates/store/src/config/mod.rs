//! The validated configuration: types that cannot hold invalid values.
//!
//! [`Config::from_toml_str`] (or [`Config::load`]) parses the TOML file of SPEC 9,
//! applies the environment overrides ([`env`]), resolves `$ENV_NAME` secrets and checks
//! every rule at once. On failure it returns [`ConfigErrors`]: every problem found, each
//! with its location (`accounts[3].weight`), none of them quoting a secret.
//!
//! The checked types expose their fields through accessors only; the only way to build
//! them is validation, so a `Weight` is always 1–100, a key hash is always 32 bytes, a
//! group always names accounts of its own org, and so on.

mod alerts;
pub mod edit;
mod env;
mod local;
mod raw;
pub mod sealed;
mod secret;
mod validate;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use keypool_core::{AccountId, AuthType, Provider, Strategy, UnixMs};

pub use alerts::{AlertFormat, AlertSettings, Webhook};
pub use env::ENV_OVERRIDES;
pub use keypool_core::StreamCommit;
pub use secret::Secret;

use crate::StoreError;
use crate::resolve::PoolKey;

/// The maps a request looks names up in (org, URL config, key, account, model alias):
/// hashed with `foldhash` (randomly seeded per map) rather than SipHash, since every
/// request hashes several names. Their keys come from the config; a request's names
/// are only looked up, never inserted.
pub(crate) type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The default `[server] max_body_bytes`: 32 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 32 * 1024 * 1024;

/// The default `[server] max_body_bytes_in_flight`: 256 MiB (eight of the largest
/// bodies at once).
pub const DEFAULT_MAX_BODY_BYTES_IN_FLIGHT: u64 = 256 * 1024 * 1024;

/// Every server setting, with SPEC defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    /// Address the proxy listens on (`listen`, `KEYPOOL_LISTEN`).
    pub listen: SocketAddr,
    /// Largest request body accepted; larger is `413` (`max_body_bytes`).
    pub max_body_bytes: u64,
    /// Longest time a client may take to send its whole request body, however steadily
    /// it sends (`body_read_timeout_secs`); past it → `408`.
    pub body_read_timeout_ms: u64,
    /// Most bytes of request bodies and buffered (non-streaming) upstream answers held
    /// in memory at once by the whole process (`max_body_bytes_in_flight`); a body that
    /// does not fit → `503 overloaded_error` with `Retry-After: 1`.
    pub max_body_bytes_in_flight: u64,
    /// Largest non-streaming upstream answer read (`max_response_body_bytes`); a larger
    /// one fails the attempt.
    pub max_response_body_bytes: u64,
    /// Time a client has to send its request headers (`header_read_timeout_secs`).
    pub header_read_timeout_ms: u64,
    /// Time each attempt has to produce response headers (`upstream_timeout_secs`,
    /// `UPSTREAM_TIMEOUT`).
    pub upstream_timeout_ms: u64,
    /// Time a stream has to produce its first valid frame (`first_frame_timeout_ms`).
    pub first_frame_timeout_ms: u64,
    /// Longest silence tolerated inside a committed stream (`stream_idle_timeout_secs`).
    pub stream_idle_timeout_ms: u64,
    /// Where a stream's point of no return is (`stream_commit`).
    pub stream_commit: StreamCommit,
    /// Most frames held before the commit point (`commit_hold_max_frames`).
    pub commit_hold_max_frames: u32,
    /// Most bytes held before the commit point (`commit_hold_max_bytes`).
    pub commit_hold_max_bytes: u64,
    /// Largest single SSE frame accepted from upstream (`max_frame_bytes`).
    pub max_frame_bytes: u64,
    /// Terminal upstream statuses whose message reaches the client (`passthrough_statuses`).
    pub passthrough_statuses: Vec<u16>,
    /// Master switch for disabling accounts on key errors (`auto_disable_on_error`,
    /// `AUTO_DISABLE_ON_ERROR`).
    pub auto_disable_on_error: bool,
    /// Legacy routes work until the end of this day (UTC), as unix seconds of
    /// `23:59:59` of that day: the `Sunset` header's value (`legacy_routes_until`).
    pub legacy_routes_until_unix_secs: u64,
    /// How long a pool's snapshot is reused (`snapshot_ttl_secs`).
    pub snapshot_ttl_ms: u64,
    /// Where the memory backend snapshots its state; `None` keeps state in memory only
    /// (`state_file`, relative paths are relative to the config file's folder). The
    /// default `keypool-state.json` applies to a config loaded from a file; a config
    /// parsed from text without a `base_dir` has no default state file.
    pub state_file: Option<PathBuf>,
    /// How often the state file is written (`state_snapshot_interval_secs`).
    pub state_snapshot_interval_ms: u64,
    /// Redis connection URL (`redis_url`, `REDIS_URL`); `None` = embedded state.
    pub redis_url: Option<Secret>,
    /// Bound on each Redis operation before falling back to memory (`redis_timeout_ms`).
    pub redis_timeout_ms: u64,
    /// What a request that needs a shared caller limit gets while Redis is unreachable
    /// (`limits_fail_mode`).
    pub limits_fail_mode: LimitsFailMode,
    /// Where the config document lives (`config_store`, SPEC 13): the config file, or
    /// Redis (every replica serves the one document there; restart only).
    pub config_store: ConfigStore,
    /// Lower bound of the hedge delay (`hedge_min_delay_ms`).
    pub hedge_min_delay_ms: u64,
    /// The slow-stream watchdog (SPEC 16): a stream whose content bytes per second stay
    /// below this over `stream_watchdog_window_ms` after `stream_watchdog_warmup_ms`
    /// is ended (committed) or failed over (before its commit point). 0 = off.
    pub stream_min_bytes_per_sec: u64,
    /// The watchdog's warm-up (`stream_watchdog_warmup_ms`, 10 s).
    pub stream_watchdog_warmup_ms: u64,
    /// The watchdog's window (`stream_watchdog_window_ms`, 30 s).
    pub stream_watchdog_window_ms: u64,
    /// Extra attempts allowed as a fraction of a group's requests per minute (`hedge_budget`).
    pub hedge_budget: f64,
    /// Usage-window threshold of accounts without their own (`default_window_threshold`).
    pub default_window_threshold: Threshold,
    /// Whether the per-`base_url` circuit breaker is on (`circuit_breaker`).
    pub circuit_breaker: bool,
    /// How long `SIGTERM` lets streams in flight finish (`shutdown_grace_secs`).
    pub shutdown_grace_ms: u64,
    /// How long a session stays bound to the account that served it, refreshed on
    /// every use; `0` turns session affinity off (`session_affinity_ttl_secs`).
    pub session_affinity_ttl_ms: u64,
    /// Longest wait for a concurrency slot when every available account is at its
    /// `max_concurrent`; `0` answers `429` at once (`queue_max_wait_ms`).
    pub queue_max_wait_ms: u64,
    /// Most requests waiting for a slot at once in this process; `0` = unbounded
    /// (`queue_max_depth`).
    pub queue_max_depth: u32,
    /// Serving threads, each a single-threaded runtime with its own upstream
    /// connections; `0` = one per CPU (`workers`, restart only).
    pub workers: u32,
    /// The admin listener (`admin_listen`): when set, `/admin/…` and `/metrics` are
    /// served only there, and no longer on `listen`.
    pub admin_listen: Option<SocketAddr>,
    /// TLS on `listen` (`tls_cert_file` + `tls_key_file`, PEM): both or neither.
    pub tls: Option<TlsFiles>,
    /// Rating score weights (`[server.rating]`).
    pub rating: RatingSettings,
}

/// `[server.rating]`: `score = ttft_weight × ttft + total_weight × total + error_weight × error_rate`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatingSettings {
    /// Weight of the TTFT average (ms).
    pub ttft_weight: f64,
    /// Weight of the total-latency average (ms).
    pub total_weight: f64,
    /// Weight of the error rate (0–1).
    pub error_weight: f64,
    /// Samples older than this no longer count.
    pub max_sample_age_ms: u64,
}

impl RatingSettings {
    /// The selector's rating config with these weights (EWMA alpha at its default).
    pub fn to_rating_config(&self) -> keypool_selector::RatingConfig {
        keypool_selector::RatingConfig {
            weights: keypool_selector::RatingWeights {
                ttft: self.ttft_weight,
                total: self.total_weight,
                error: self.error_weight,
            },
            max_sample_age_ms: self.max_sample_age_ms,
            ..keypool_selector::RatingConfig::default()
        }
    }
}

impl Default for RatingSettings {
    fn default() -> Self {
        Self {
            ttft_weight: 1.0,
            total_weight: 0.1,
            error_weight: 10_000.0,
            max_sample_age_ms: 600_000,
        }
    }
}

/// `limits_fail_mode` (SPEC 12): a request whose key has a shared limit (rate,
/// `max_concurrent`, a budget) while Redis is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LimitsFailMode {
    /// Admitted and counted in this process (its totals reach Redis when it is back).
    #[default]
    Open,
    /// Answered `503`.
    Closed,
}

impl std::str::FromStr for LimitsFailMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "open" => Ok(Self::Open),
            "closed" => Ok(Self::Closed),
            other => Err(format!(
                "limits_fail_mode {other:?} is not a mode: write \"open\" (admit and count locally while Redis is away, the default) or \"closed\" (answer 503)"
            )),
        }
    }
}

/// `config_store` (SPEC 13): where the one config document lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConfigStore {
    /// The config file: admin changes rewrite it (comments and order kept).
    #[default]
    File,
    /// Redis (`redis_url`): every replica serves the document there, with its own
    /// `[server]` table from its local file; a change reaches every replica within 1 s.
    Redis,
}

impl ConfigStore {
    /// The config name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Redis => "redis",
        }
    }
}

impl std::str::FromStr for ConfigStore {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "file" => Ok(Self::File),
            "redis" => Ok(Self::Redis),
            other => Err(format!(
                "config_store {other:?} is not a store: write \"file\" (the config file is the document, the default) or \"redis\" (the document lives in Redis, shared by every replica; needs redis_url)"
            )),
        }
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            body_read_timeout_ms: 60_000,
            max_body_bytes_in_flight: DEFAULT_MAX_BODY_BYTES_IN_FLIGHT,
            max_response_body_bytes: 16 * 1024 * 1024,
            header_read_timeout_ms: 30_000,
            upstream_timeout_ms: 180_000,
            first_frame_timeout_ms: 15_000,
            stream_idle_timeout_ms: 300_000,
            stream_commit: StreamCommit::FirstContent,
            commit_hold_max_frames: 64,
            commit_hold_max_bytes: 256 * 1024,
            max_frame_bytes: 16 * 1024 * 1024,
            passthrough_statuses: vec![429, 402],
            auto_disable_on_error: true,
            // 2026-12-31T23:59:59Z
            legacy_routes_until_unix_secs: 1_798_761_599,
            snapshot_ttl_ms: 15_000,
            state_file: Some(PathBuf::from("keypool-state.json")),
            state_snapshot_interval_ms: 5_000,
            redis_url: None,
            redis_timeout_ms: 250,
            limits_fail_mode: LimitsFailMode::Open,
            config_store: ConfigStore::File,
            hedge_min_delay_ms: 200,
            stream_min_bytes_per_sec: 0,
            stream_watchdog_warmup_ms: 10_000,
            stream_watchdog_window_ms: 30_000,
            hedge_budget: 0.10,
            default_window_threshold: Threshold(0.95),
            circuit_breaker: false,
            shutdown_grace_ms: 30_000,
            session_affinity_ttl_ms: 3_600_000,
            queue_max_wait_ms: 30_000,
            queue_max_depth: 0,
            workers: 0,
            admin_listen: None,
            tls: None,
            rating: RatingSettings::default(),
        }
    }
}

/// The certificate chain and private key files of `listen`'s TLS (PEM), read at start
/// and again at every `SIGHUP`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first (`tls_cert_file`).
    pub cert: PathBuf,
    /// The private key: PKCS#8, PKCS#1 or SEC1 (`tls_key_file`).
    pub key: PathBuf,
}

/// `[admin]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdminSettings {
    /// Bearer token of the admin API (`token`, `KEYPOOL_ADMIN_TOKEN`); `None` disables it.
    pub token: Option<Secret>,
}

/// An account's weight, always within 1–100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Weight(u8);

impl Weight {
    /// Smallest weight.
    pub const MIN: u8 = 1;
    /// Largest weight.
    pub const MAX: u8 = 100;

    /// A weight, or `None` outside 1–100.
    pub fn try_new(value: i64) -> Option<Self> {
        u8::try_from(value)
            .ok()
            .filter(|w| (Self::MIN..=Self::MAX).contains(w))
            .map(Self)
    }

    /// The weight.
    pub fn get(self) -> u8 {
        self.0
    }
}

/// A usage-window threshold, always a finite number within 0–1.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Threshold(f64);

impl Threshold {
    /// A threshold, or `None` outside 0–1 (or NaN).
    pub fn try_new(value: f64) -> Option<Self> {
        (0.0..=1.0).contains(&value).then_some(Self(value))
    }

    /// The threshold.
    pub fn get(self) -> f64 {
        self.0
    }
}

/// The SHA-256 of an LB key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash(pub(crate) [u8; 32]);

impl KeyHash {
    /// Parses 64 hex characters (either case).
    pub fn from_hex(hex: &str) -> Option<Self> {
        let bytes = hex.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            out[i] = u8::try_from(hi * 16 + lo).ok()?;
        }
        Some(Self(out))
    }

    /// The hash as 64 lowercase hex characters.
    pub fn to_hex(&self) -> String {
        use std::fmt::Write;
        self.0.iter().fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyHash({})", self.to_hex())
    }
}

/// One organisation (tenant).
#[derive(Debug, Clone)]
pub struct Org {
    pub(crate) slug: Arc<str>,
    pub(crate) suspended: bool,
    /// `[orgs.limits] usd_per_month`: the team budget all the org's keys share.
    pub(crate) team_usd_per_month: Option<keypool_ledger::NanoUsd>,
    /// The distinct `model` overrides of its accounts: a request may be sent as any.
    pub(crate) override_models: Vec<Arc<str>>,
    pub(crate) accounts: Vec<AccountId>,
    pub(crate) groups: Map<Arc<str>, Arc<Group>>,
    pub(crate) urls: Map<Arc<str>, Arc<UrlConfig>>,
}

impl Org {
    /// The org's slug, the first path segment of its routes.
    pub fn slug(&self) -> &str {
        &self.slug
    }
    /// The same, shared: for labels and logs that keep it without a copy.
    pub fn slug_shared(&self) -> &Arc<str> {
        &self.slug
    }
    /// Whether the org is suspended (its valid keys get `403 ORG_SUSPENDED`).
    pub fn suspended(&self) -> bool {
        self.suspended
    }
    /// The team budget (`[orgs.limits] usd_per_month`), nano-USD.
    pub fn team_usd_per_month(&self) -> Option<keypool_ledger::NanoUsd> {
        self.team_usd_per_month
    }
    /// The distinct `model` overrides of its accounts (a request may be sent upstream
    /// as any of them, so a budget's worst case prices them too).
    pub fn override_models(&self) -> &[Arc<str>] {
        &self.override_models
    }
    /// The org's whole pool: every account of the org, in file order.
    pub fn accounts(&self) -> &[AccountId] {
        &self.accounts
    }
    /// A group of this org by id.
    pub fn group(&self, id: &str) -> Option<&Arc<Group>> {
        self.groups.get(id)
    }
    /// A URL config of this org by `custom_url`.
    pub fn groups(&self) -> impl Iterator<Item = &Arc<Group>> {
        self.groups.values()
    }
    /// A URL config by `custom_url`.
    pub fn url(&self, custom_url: &str) -> Option<&Arc<UrlConfig>> {
        self.urls.get(custom_url)
    }
    /// Every URL config of this org.
    pub fn urls(&self) -> impl Iterator<Item = &Arc<UrlConfig>> {
        self.urls.values()
    }
}

/// One upstream account.
///
/// `repr(C)`, the fields a request reads first: the walk reads the provider and the
/// concurrency cap right after it counts a reference to the account (`Arc::clone`),
/// then the attempt the auth type, the id, the secret and the URLs. The small fields
/// (the scheduling ones among them) pack into the first 16 bytes; the org and the
/// OAuth seed, which a request reads only for an `oauth` account, come last. With the
/// reference count, the reads of a request then lie in the allocation's first 128
/// bytes (two cache lines when the allocator places it on a line, three otherwise)
/// instead of the three or four the compiler's own order spread them over; in a pool
/// of 1,000 accounts served in turn each of those lines is a cache miss.
#[derive(Debug, Clone, PartialEq)]
#[repr(C)]
pub struct Account {
    pub(crate) provider: Provider,
    pub(crate) auth: AuthType,
    pub(crate) active: bool,
    pub(crate) weight: Weight,
    pub(crate) max_concurrent: Option<u32>,
    pub(crate) priority: i32,
    pub(crate) id: AccountId,
    pub(crate) secret: Secret,
    pub(crate) base_url: Option<Arc<str>>,
    pub(crate) model: Option<Arc<str>>,
    pub(crate) proxy_url: Option<Secret>,
    pub(crate) window_threshold: Option<Threshold>,
    pub(crate) org: Arc<str>,
    pub(crate) oauth: Option<OAuthSeed>,
}

/// What the config says of an `oauth` account's token lifecycle (SPEC 14): only the
/// seed, the tokens in force live in the runtime state once a refresh rotated them.
#[derive(Clone, PartialEq, Eq)]
pub struct OAuthSeed {
    /// The refresh token (`refresh_token`, a secret).
    pub refresh_token: Secret,
    /// When the configured access token (`secret`) expires (`expires_at`, unix
    /// seconds, as unix ms); `None`: unknown, refreshed at once.
    pub expires_at_ms: Option<u64>,
}

impl std::fmt::Debug for OAuthSeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthSeed")
            .field("refresh_token", &self.refresh_token)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish()
    }
}

impl Account {
    /// The account's id (unique in the whole file).
    pub fn id(&self) -> &AccountId {
        &self.id
    }
    /// The slug of the org that owns it.
    pub fn org(&self) -> &str {
        &self.org
    }
    /// Its provider.
    pub fn provider(&self) -> Provider {
        self.provider
    }
    /// Its auth type (always one the provider supports).
    pub fn auth(&self) -> AuthType {
        self.auth
    }
    /// Its credential.
    pub fn secret(&self) -> &Secret {
        &self.secret
    }
    /// An `oauth` account's refresh token and expiry (`refresh_token`, `expires_at`):
    /// keypool refreshes its access token (SPEC 14).
    pub fn oauth(&self) -> Option<&OAuthSeed> {
        // Validation keeps a seed only on an `oauth` account. The auth type is on the
        // allocation's first line and the seed on its last: every attempt asks, and
        // only an `oauth` account's reads the seed's line.
        if self.auth != AuthType::OAuth {
            return None;
        }
        self.oauth.as_ref()
    }
    /// Its `base_url` (`http://` or `https://`), if not the provider's default.
    pub fn base_url(&self) -> Option<&str> {
        self.base_url.as_deref()
    }
    /// Its priority: lower goes first.
    pub fn priority(&self) -> i32 {
        self.priority
    }
    /// Its weight for the `weighted` strategy.
    pub fn weight(&self) -> Weight {
        self.weight
    }
    /// The model that replaces the request's `model`, if any.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }
    /// Its `model` override as the shared string (cloning it is a count increment).
    pub fn model_shared(&self) -> Option<&Arc<str>> {
        self.model.as_ref()
    }
    /// Its own usage-window threshold, if set.
    pub fn window_threshold(&self) -> Option<Threshold> {
        self.window_threshold
    }
    /// Most requests in flight at once, if limited (at least 1).
    pub fn max_concurrent(&self) -> Option<u32> {
        self.max_concurrent
    }
    /// Whether the config file has it active (runtime disabling is separate state).
    pub fn active(&self) -> bool {
        self.active
    }
    /// The outbound proxy of its upstream calls (`http://` for HTTP CONNECT,
    /// `socks5://` or `socks5h://`), if it has its own; `None`: the process's
    /// `HTTPS_PROXY`/`NO_PROXY` apply. A secret: it may hold the proxy's password.
    pub fn proxy_url(&self) -> Option<&Secret> {
        self.proxy_url.as_ref()
    }
}

/// A named set of accounts of one org plus a strategy.
#[derive(Debug, Clone)]
pub struct Group {
    pub(crate) id: Arc<str>,
    pub(crate) org: Arc<str>,
    pub(crate) strategy: Strategy,
    pub(crate) accounts: Vec<AccountId>,
}

impl Group {
    /// The group's id (unique within its org).
    pub fn id(&self) -> &str {
        &self.id
    }
    /// The slug of its org.
    pub fn org(&self) -> &str {
        &self.org
    }
    /// Its strategy.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }
    /// Its accounts (all of its org, no duplicates, at least one).
    pub fn accounts(&self) -> &[AccountId] {
        &self.accounts
    }
}

/// A URL config of an org.
#[derive(Debug, Clone)]
pub struct UrlConfig {
    pub(crate) custom_url: Arc<str>,
    pub(crate) org: Arc<str>,
    pub(crate) group: Option<Arc<str>>,
    /// The pool it points at, built once at validation (the request path only clones it).
    pub(crate) pool: PoolKey,
}

impl UrlConfig {
    /// Its `custom_url` (unique within its org).
    pub fn custom_url(&self) -> &str {
        &self.custom_url
    }
    /// The same, shared: for labels and logs that keep it without a copy.
    pub fn custom_url_shared(&self) -> &Arc<str> {
        &self.custom_url
    }
    /// The slug of its org.
    pub fn org(&self) -> &str {
        &self.org
    }
    /// The group it points at; `None` = the org's whole pool with the default strategy.
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }
}

/// The kind of an LB key, which decides how the caller is recorded (SPEC 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// A person's key: recorded as `user_api_key_id`.
    User,
    /// A service's key: recorded as `client_api_key_id`.
    Client,
}

impl KeyKind {
    /// `user` or `client`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Client => "client",
        }
    }
}

/// Which URL configs of its org a key may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyScope {
    /// `["*"]`: every URL config of its org.
    AllUrls,
    /// The listed `custom_url`s (each exists in its org).
    Urls(Vec<Arc<str>>),
}

/// An LB key as configured (only its hash is known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbKey {
    pub(crate) id: Arc<str>,
    pub(crate) org: Arc<str>,
    pub(crate) kind: KeyKind,
    pub(crate) hash: KeyHash,
    pub(crate) scope: KeyScope,
    pub(crate) revoked: bool,
    /// Its limits with the org's defaults applied; `None` when it has none at all.
    pub(crate) limits: Option<Arc<keypool_ledger::Limits>>,
}

/// A key's or an org's limits as written (`[keys.limits]`, `[orgs.limits]`),
/// validated; `None` where the table does not set a value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LimitSettings {
    pub models: Option<Vec<keypool_ledger::ModelGlob>>,
    pub deny_models: Option<Vec<keypool_ledger::ModelGlob>>,
    pub rate: Option<keypool_ledger::Rate>,
    pub max_concurrent: Option<u32>,
    pub tokens_per_day: Option<u64>,
    pub tokens_per_month: Option<u64>,
    pub usd_per_day: Option<keypool_ledger::NanoUsd>,
    pub usd_per_month: Option<keypool_ledger::NanoUsd>,
}

impl LbKey {
    /// Its limits (SPEC 12), the org's defaults applied; `None` when it has none.
    pub fn limits(&self) -> Option<&Arc<keypool_ledger::Limits>> {
        self.limits.as_ref()
    }
    /// The key's id, shared (for labels).
    pub fn id_shared(&self) -> &Arc<str> {
        &self.id
    }
    /// The org and key id its limits are counted under.
    pub fn who(&self) -> keypool_ledger::Who {
        keypool_ledger::Who {
            org: self.org.clone(),
            caller: self.id.clone(),
        }
    }
    /// The caller it authenticates as.
    pub fn caller(&self) -> crate::resolve::Caller {
        match self.kind {
            KeyKind::User => crate::resolve::Caller::User(self.id.clone()),
            KeyKind::Client => crate::resolve::Caller::Client(self.id.clone()),
        }
    }
    /// The key's id, recorded as the caller.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// The slug of its org.
    pub fn org(&self) -> &str {
        &self.org
    }
    /// `user` or `client`.
    pub fn kind(&self) -> KeyKind {
        self.kind
    }
    /// SHA-256 of the key.
    pub fn hash(&self) -> &KeyHash {
        &self.hash
    }
    /// The URL configs it may use.
    pub fn scope(&self) -> &KeyScope {
        &self.scope
    }
    /// Whether it was revoked.
    pub fn revoked(&self) -> bool {
        self.revoked
    }
    /// Whether the key may use `custom_url` of `org` (revocation aside).
    pub fn can_see(&self, org: &str, custom_url: &str) -> bool {
        *self.org == *org
            && match &self.scope {
                KeyScope::AllUrls => true,
                KeyScope::Urls(urls) => urls.iter().any(|u| **u == *custom_url),
            }
    }
}

/// What the legacy route `/{url}/…` finds for one `custom_url` (SPEC 3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LegacyEntry {
    /// Exactly one org has it.
    One(Arc<str>),
    /// More than one config (of several orgs, or an org's and an orphan) has it.
    Ambiguous,
    /// Only a URL config that belongs to no org has it.
    Orphan,
}

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) server: ServerSettings,
    pub(crate) cooldown: keypool_cooldown::CooldownConfig,
    pub(crate) admin: AdminSettings,
    pub(crate) orgs: Map<Arc<str>, Arc<Org>>,
    pub(crate) accounts: Map<AccountId, Arc<Account>>,
    pub(crate) keys_by_hash: Map<KeyHash, Arc<LbKey>>,
    pub(crate) legacy: Map<Arc<str>, LegacyEntry>,
    pub(crate) prices: keypool_ledger::PriceTable,
    /// What loads but looks wrong (secrets that cannot work), for `check-config` and
    /// the log at load.
    pub(crate) warnings: Vec<ConfigIssue>,
    pub(crate) usage: UsageSettings,
    pub(crate) oauth: OAuthSettings,
    pub(crate) alerts: AlertSettings,
    /// `[[restate]]`, in order, markers in lower case.
    pub(crate) restate: Vec<keypool_cooldown::RestateRule>,
    /// `[[models]]`: aliases and fallback chains.
    pub(crate) model_routes: ModelRoutes,
}

/// `[[models]]` (issue 24): what a request's `model` is tried as.
#[derive(Debug, Clone, Default)]
pub struct ModelRoutes {
    pub(crate) aliases: Map<Arc<str>, Arc<keypool_selector::ModelChain>>,
    pub(crate) fallbacks: Vec<(keypool_ledger::ModelGlob, Vec<Arc<str>>)>,
}

impl ModelRoutes {
    /// The chain a request for `model` is tried with: the alias's, or for a plain model
    /// with a `fallback`, the model itself then its fallback; `None` when no rule names
    /// it (the model is sent as asked).
    pub fn chain_for(&self, model: &str) -> Option<Arc<keypool_selector::ModelChain>> {
        if let Some(chain) = self.aliases.get(model) {
            return Some(Arc::clone(chain));
        }
        let (_, fallback) = self.fallbacks.iter().find(|(g, _)| g.matches(model))?;
        let mut models = Vec::with_capacity(fallback.len() + 1);
        models.push(Arc::from(model));
        models.extend(fallback.iter().cloned());
        Some(Arc::new(keypool_selector::ModelChain::new(
            None, models, None,
        )))
    }

    /// The models a request for `model` by the caller of stable id `caller` is tried
    /// with, first choice first, and the alias it named; `None` when no rule names it.
    pub fn order_for<'s>(
        &'s self,
        model: &'s str,
        caller: &str,
    ) -> Option<(Option<&'s str>, Vec<&'s str>)> {
        if let Some(chain) = self.aliases.get(model) {
            return Some((chain.alias.as_deref(), chain.order(caller)));
        }
        let (_, fallback) = self.fallbacks.iter().find(|(g, _)| g.matches(model))?;
        let mut order = Vec::with_capacity(fallback.len() + 1);
        order.push(model);
        order.extend(fallback.iter().map(|m| &**m));
        Some((None, order))
    }

    /// The pattern of the `model` rule whose fallback a request for `model` takes (its
    /// label in metrics: the requested model itself is the caller's text, so it never
    /// labels a series).
    pub fn fallback_pattern(&self, model: &str) -> Option<&str> {
        self.fallbacks
            .iter()
            .find(|(g, _)| g.matches(model))
            .map(|(g, _)| g.as_str())
    }

    /// Whether no rule is configured (the request path skips routing).
    pub fn is_empty(&self) -> bool {
        self.aliases.is_empty() && self.fallbacks.is_empty()
    }

    /// Whether `model` is an alias.
    pub fn is_alias(&self, model: &str) -> bool {
        self.aliases.contains_key(model)
    }
}

/// `[oauth]` (SPEC 14): where and how `oauth` accounts with a `refresh_token` renew
/// their access token. The defaults are what Claude Code uses (see docs/CONFIG.md for
/// where each comes from): providers move them, so they are settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthSettings {
    /// The token endpoint (`token_url`).
    pub token_url: String,
    /// The OAuth client id sent with every grant (`client_id`).
    pub client_id: String,
    /// How long before expiry an access token is renewed (`refresh_lead_secs`), ms.
    pub refresh_lead_ms: u64,
    /// Bound on one call of the token endpoint (`refresh_timeout_ms`).
    pub refresh_timeout_ms: u64,
    /// Where a person logs an account in (`authorize_url`).
    pub authorize_url: String,
    /// The redirect URI of the login (`redirect_uri`): the provider's page that shows
    /// the code to paste.
    pub redirect_uri: String,
    /// The scopes asked for (`scopes`, space-separated).
    pub scopes: String,
}

/// Claude Code's subscription login page.
pub const DEFAULT_AUTHORIZE_URL: &str = "https://claude.ai/oauth/authorize";
/// The page that shows the code to paste.
pub const DEFAULT_REDIRECT_URI: &str = "https://console.anthropic.com/oauth/code/callback";
/// The scopes Claude Code asks for.
pub const DEFAULT_SCOPES: &str = "org:create_api_key user:profile user:inference";

/// Claude Code's token endpoint (2026-12: `console.anthropic.com`).
pub const DEFAULT_TOKEN_URL: &str = "https://console.anthropic.com/v1/oauth/token";
/// Claude Code's public OAuth client id.
pub const DEFAULT_CLIENT_ID: &str = "9d1c250a-e61b-44d9-88ed-5944d1962f5e";

impl Default for OAuthSettings {
    fn default() -> Self {
        Self {
            token_url: DEFAULT_TOKEN_URL.to_owned(),
            client_id: DEFAULT_CLIENT_ID.to_owned(),
            refresh_lead_ms: 300_000,
            refresh_timeout_ms: 10_000,
            authorize_url: DEFAULT_AUTHORIZE_URL.to_owned(),
            redirect_uri: DEFAULT_REDIRECT_URI.to_owned(),
            scopes: DEFAULT_SCOPES.to_owned(),
        }
    }
}

/// `[usage]`: how much of the usage ledger is kept (SPEC 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageSettings {
    /// Usage records kept for `GET /admin/requests` (`recent_requests`); `0` keeps
    /// none.
    pub recent_requests: usize,
    /// Days the per-day and per-month totals are kept (`retention_days`).
    pub retention_days: u32,
    /// Whether keypool's default Claude prices follow the operator's `[[prices]]`
    /// (`default_prices`).
    pub default_prices: bool,
}

impl Default for UsageSettings {
    fn default() -> Self {
        Self {
            recent_requests: 10_000,
            retention_days: 400,
            default_prices: true,
        }
    }
}

impl Config {
    /// Parses and validates a config file's text. `env` looks up environment variables
    /// (for `$ENV_NAME` secrets and the SPEC 9 overrides); pass `|k| std::env::var(k).ok()`
    /// to use the process environment. `base_dir` (the config file's folder) anchors a
    /// relative `state_file`; without it there is no default state file.
    pub fn from_toml_str(
        text: &str,
        base_dir: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigErrors> {
        validate::parse_and_validate(text, base_dir, env)
    }

    /// Reads, parses and validates a config file using the process environment.
    pub fn load(path: &Path) -> Result<Self, StoreError> {
        let text = std::fs::read_to_string(path).map_err(|source| StoreError::ReadConfig {
            path: path.to_path_buf(),
            source,
        })?;
        let env = |name: &str| std::env::var(name).ok();
        Self::from_toml_str(&text, path.parent(), &env).map_err(|errors| {
            StoreError::InvalidConfig {
                path: path.to_path_buf(),
                errors,
            }
        })
    }

    /// The server settings.
    pub fn server(&self) -> &ServerSettings {
        &self.server
    }
    /// The cooldown, backoff, window and breaker settings for `keypool-cooldown`'s
    /// books: the `[cooldown]` table with `auto_disable_on_error`,
    /// `default_window_threshold` and `circuit_breaker` taken from `[server]`.
    pub fn cooldown(&self) -> &keypool_cooldown::CooldownConfig {
        &self.cooldown
    }
    /// The rating engine's settings (`[server.rating]`; EWMA alpha at its default).
    pub fn rating(&self) -> keypool_selector::RatingConfig {
        self.server.rating.to_rating_config()
    }
    /// The admin settings.
    pub fn admin(&self) -> &AdminSettings {
        &self.admin
    }
    /// What loads but looks wrong: secrets that cannot work (`check-config` prints
    /// them, `serve` logs them).
    pub fn warnings(&self) -> &[ConfigIssue] {
        &self.warnings
    }
    /// The model prices (`[[prices]]`, then keypool's defaults unless
    /// `[usage] default_prices = false`).
    pub fn prices(&self) -> &keypool_ledger::PriceTable {
        &self.prices
    }
    /// `[usage]`.
    pub fn usage(&self) -> &UsageSettings {
        &self.usage
    }
    /// `[oauth]`.
    pub fn oauth(&self) -> &OAuthSettings {
        &self.oauth
    }
    /// `[alerts]` and its webhooks.
    pub fn alerts(&self) -> &AlertSettings {
        &self.alerts
    }

    /// `[[restate]]` (SPEC 16), in order: the first rule that applies rewrites an
    /// upstream's status before classification.
    pub fn restate_rules(&self) -> &[keypool_cooldown::RestateRule] {
        &self.restate
    }

    /// `[[models]]`: aliases and fallback chains (issue 24).
    pub fn model_routes(&self) -> &ModelRoutes {
        &self.model_routes
    }
    /// The LB key with id `id` (key ids are unique in the file).
    pub fn lb_key_by_id(&self, id: &str) -> Option<&Arc<LbKey>> {
        self.keys_by_hash.values().find(|k| &*k.id == id)
    }
    /// An org by slug.
    pub fn org(&self, slug: &str) -> Option<&Arc<Org>> {
        self.orgs.get(slug)
    }
    /// Every org.
    pub fn orgs(&self) -> impl Iterator<Item = &Arc<Org>> {
        self.orgs.values()
    }
    /// An account by id.
    pub fn account(&self, id: &str) -> Option<&Arc<Account>> {
        self.accounts.get(id)
    }
    /// Every account.
    pub fn accounts(&self) -> impl Iterator<Item = &Arc<Account>> {
        self.accounts.values()
    }
    /// The key whose SHA-256 is `hash`.
    pub fn key_by_hash(&self, hash: &KeyHash) -> Option<&Arc<LbKey>> {
        self.keys_by_hash.get(hash)
    }
    /// Every configured key.
    pub fn keys(&self) -> impl Iterator<Item = &Arc<LbKey>> {
        self.keys_by_hash.values()
    }
}

/// One configuration problem and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Where: `accounts[3].weight`, `server.listen`, `env UPSTREAM_TIMEOUT`, or `file`.
    pub location: String,
    /// What is wrong and what to do. Never contains a secret.
    pub message: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

/// Every problem of a rejected configuration, grouped by section (server first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigIssue>);

impl ConfigErrors {
    /// The problems.
    pub fn issues(&self) -> &[ConfigIssue] {
        &self.0
    }

    /// Whether some problem is at exactly `location`.
    pub fn has(&self, location: &str) -> bool {
        self.0.iter().any(|i| i.location == location)
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} configuration problem(s)", self.0.len())?;
        for issue in &self.0 {
            write!(f, "\n  {issue}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Unix milliseconds; helper for callers that keep time in `UnixMs`.
pub(crate) fn secs_to_ms(secs: u64) -> UnixMs {
    secs.saturating_mul(1000)
}

/// `server.listen` and `server.admin_listen` of the file at `path` (with
/// `KEYPOOL_LISTEN` and `KEYPOOL_ADMIN_LISTEN` applied), without validating anything
/// else: what `keypool probe` needs to find a running keypool, which may run where the
/// secrets the rest of the file names are not set.
///
/// # Errors
/// [`StoreError::ReadConfig`] when the file cannot be read; a message when it is not
/// TOML or an address is not `host:port`.
pub fn listen_addresses(path: &Path) -> Result<(SocketAddr, Option<SocketAddr>), StoreError> {
    let text = std::fs::read_to_string(path).map_err(|source| StoreError::ReadConfig {
        path: path.to_path_buf(),
        source,
    })?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| StoreError::Config(format!("{}: not TOML: {e}", path.display())))?;
    let server = table.get("server").and_then(toml::Value::as_table);
    let value = |env: &str, key: &str| {
        std::env::var(env)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .or_else(|| server?.get(key)?.as_str().map(str::to_owned))
    };
    let parse = |v: String, key: &str| {
        v.parse::<SocketAddr>()
            .map_err(|_| StoreError::Config(format!("server.{key}: {v:?} is not host:port")))
    };
    let listen = match value("KEYPOOL_LISTEN", "listen") {
        Some(v) => parse(v, "listen")?,
        None => ServerSettings::default().listen,
    };
    let admin = value("KEYPOOL_ADMIN_LISTEN", "admin_listen")
        .map(|v| parse(v, "admin_listen"))
        .transpose()?;
    Ok((listen, admin))
}

#[cfg(test)]
mod layout_tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// What [`Account`]'s `repr(C)` is for: with the `Arc`'s two counts before it, the
    /// fields the walk and the attempt read first (provider, cap, id, secret) lie in the
    /// allocation's first 64 bytes, and every field a request reads in its first 128.
    /// (Bytes of the allocation: which cache lines they are depends on where the
    /// allocator places it.)
    #[test]
    fn an_accounts_hot_fields_come_first() {
        const ARC_COUNTS: usize = 2 * size_of::<usize>();
        assert!(ARC_COUNTS + offset_of!(Account, secret) + size_of::<Secret>() <= 64);
        let read = [
            offset_of!(Account, base_url) + size_of::<Option<Arc<str>>>(),
            offset_of!(Account, model) + size_of::<Option<Arc<str>>>(),
            offset_of!(Account, proxy_url) + size_of::<Option<Secret>>(),
            offset_of!(Account, window_threshold) + size_of::<Option<Threshold>>(),
        ];
        assert!(read.iter().all(|&end| ARC_COUNTS + end <= 128), "{read:?}");
        assert!(offset_of!(Account, org) >= offset_of!(Account, window_threshold));
        assert!(offset_of!(Account, oauth) > offset_of!(Account, org));
    }
}
