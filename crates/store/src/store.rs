//! [`Store`]: the live configuration (swapped whole on reload), the per-request
//! snapshot, and the runtime state with its persistence backend.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use keypool_cooldown::facts::{RateLimitInfo, ResetCorrection};
use keypool_cooldown::{
    Attempt, Classification, ClearedWindows, CooldownCorrection, CooldownRecord, DisabledAccount,
    DisabledRecord, FailureEffect, ImportCounts, OutOfWindow, PoolHealth, Terminal, WindowRecord,
};
use keypool_core::{AccountId, UnixMs};
use keypool_selector::{Candidate, Counter, RatingEngine, Sample, sort_snapshot};
use tokio::task::JoinHandle;

use crate::StoreError;
use crate::alerts::{AlertEvent, AlertKind, AlertQueue, AlertSubject};
use crate::config::Config;
use crate::local::CachedSnapshot;
use crate::resolve::Route;
use crate::sessions::SessionBook;
use crate::slots::SlotBook;
use crate::snapshot::Snapshot;
use crate::state::file::{self, StateFileLoad};
use crate::state::redis::{RedisMirror, StateEvent};
use crate::state::{RuntimeState, StateExport};
use crate::usage::UsageBook;

type RedisReceivers = (
    tokio::sync::mpsc::Receiver<StateEvent>,
    tokio::sync::broadcast::Receiver<fred::types::Message>,
);

/// How often the background task looks at Redis health and the state-file timer.
const TICK: Duration = Duration::from_millis(200);

/// The current wall-clock time in unix ms (the store is an I/O crate: it may read the
/// clock at its edges; everything below takes `now` as an argument). Within a poll
/// of a connection's task the clock is read once ([`crate::clock`]).
pub fn now_ms() -> UnixMs {
    crate::clock::now_ms()
}

/// Which persistence backend a store uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendKind {
    /// In memory only (`state_file = ""`).
    Memory,
    /// In memory, snapshotted to this file.
    StateFile(PathBuf),
    /// In memory, mirrored to Redis.
    Redis,
}

/// What the backend is doing, for `/readyz`, `/metrics` and `/admin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendStatus {
    /// The backend.
    pub kind: BackendKind,
    /// With Redis: whether Redis answers and state is reconciled. `None` without Redis.
    pub redis_ready: Option<bool>,
    /// With Redis: how many operations fell back to memory since boot.
    pub redis_fallbacks: u64,
    /// With a state file: why its last write failed (path and OS error); `None` when
    /// the last write succeeded (or none was made yet) and without a state file.
    pub state_file_error: Option<String>,
    /// With a state file: how many writes failed since boot.
    pub state_file_write_failures: u64,
}

/// The outcomes of config reloads since boot ([`Store::reload_outcomes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReloadOutcomes {
    /// Reloads whose file was valid and replaced the configuration.
    pub applied: u64,
    /// Reloads refused (invalid or unreadable file; the old configuration kept serving).
    pub rejected: u64,
    /// When the last applied reload happened, unix ms.
    pub last_applied_at: Option<UnixMs>,
}

#[derive(Debug, Default)]
struct ReloadCounts {
    applied: AtomicU64,
    rejected: AtomicU64,
    last_applied_at: AtomicU64,
}

/// What the store found at boot.
#[derive(Debug)]
pub enum BootState {
    /// Memory only: nothing to load.
    Fresh,
    /// The state file's outcome.
    StateFile(StateFileLoad),
    /// Redis: whether its state could be loaded at boot (if not, it is reconciled when
    /// Redis answers).
    Redis {
        /// `true` when Redis answered at boot and its state was imported.
        loaded: bool,
    },
}

enum Backend {
    Memory { file: Option<PathBuf> },
    Redis(Arc<RedisMirror>),
}

struct Inner {
    /// Names the store in the threads' views (`crate::local`).
    id: u64,
    config: ArcSwap<Config>,
    /// Counts the configs installed: a thread's copy of an older one is made anew.
    config_version: AtomicU64,
    state: RuntimeState,
    /// Counts what makes a snapshot stale (a reload, a disable, a re-enable).
    generation: AtomicU64,
    backend: Backend,
    boot: Mutex<Option<BootState>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    last_saved: AtomicU64,
    /// Held while the state is written: writes never overlap, so an older state never
    /// lands after a newer one (the background snapshot and the one at shutdown).
    persisting: tokio::sync::Mutex<()>,
    state_file: StateFileHealth,
    sessions: SessionBook,
    slots: SlotBook,
    limit_holds: crate::limits::LimitHolds,
    document: crate::document::DocumentState,
    last_purged: AtomicU64,
    last_pruned: AtomicU64,
    reloads: ReloadCounts,
    alerts: AlertQueue,
}

/// How the state file's writes went: the last failure (cleared by a success) and the
/// failures since boot.
#[derive(Default)]
struct StateFileHealth {
    error: Mutex<Option<String>>,
    failures: AtomicU64,
}

impl StateFileHealth {
    /// Records a write's outcome; logs when writes start failing (or fail for another
    /// reason) and when they succeed again, not at every failed snapshot.
    fn record(&self, outcome: &Result<(), StoreError>) {
        let mut error = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Ok(()) => {
                if error.take().is_some() {
                    tracing::info!("state file written again");
                }
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                let message = e.to_string();
                if error.as_deref() == Some(message.as_str()) {
                    tracing::debug!(error = %message, "state file snapshot failed again");
                } else {
                    tracing::error!(
                        error = %message,
                        "state file snapshot failed; runtime state is kept in memory only until a write succeeds"
                    );
                    *error = Some(message);
                }
            }
        }
    }

    fn error(&self) -> Option<String> {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// How often usage totals past their retention are dropped from memory.
const USAGE_PRUNE_MS: u64 = 3_600_000;

/// How often expired session bindings are dropped from memory.
const SESSION_PURGE_MS: u64 = 10_000;

impl Drop for Inner {
    fn drop(&mut self) {
        for task in self
            .tasks
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
        if let Backend::Redis(mirror) = &self.backend {
            mirror.close();
        }
    }
}

/// The store: configuration, resolution, snapshots and runtime state. Cheap to clone
/// (an `Arc`); background tasks stop when the last clone is dropped.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// A handle on a [`Store`] that does not keep it alive (for background tasks that
/// must end with it).
#[derive(Clone, Debug)]
pub struct WeakStore(Weak<Inner>);

impl WeakStore {
    /// The store, while some clone of it lives.
    pub fn upgrade(&self) -> Option<Store> {
        self.0.upgrade().map(|inner| Store { inner })
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend_status())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens a store for `config`: loads state from the backend (the state file, or
    /// Redis keeping each entry's absolute expiry) and starts the background tasks
    /// (state-file snapshots, Redis mirroring, pub/sub, reconciliation). Must run inside
    /// a tokio runtime. Redis being down is not an error: the store serves from memory
    /// and reconciles when Redis answers.
    pub async fn open(config: Config) -> Result<Store, StoreError> {
        let now = now_ms();
        let health = PoolHealth::new(config.cooldown().clone());
        let rating = RatingEngine::try_new(config.rating()).unwrap_or_default();
        let settings = config.server().clone();
        let usage = UsageBook::new(config.usage().recent_requests, settings.redis_url.is_some());
        let state = RuntimeState::new(health, rating, usage);
        state.oauth.seed(&config);
        let (backend, boot, writes) = match &settings.redis_url {
            Some(url) => {
                let timeout = Duration::from_millis(settings.redis_timeout_ms);
                let wait = timeout.max(Duration::from_secs(1));
                let connected = RedisMirror::connect(url.expose(), timeout, wait).await?;
                let mirror = connected.mirror;
                let mut loaded = false;
                if connected.connected {
                    loaded = reconcile(&mirror, &state, &account_ids(&config), now)
                        .await
                        .is_ok();
                }
                (
                    Backend::Redis(Arc::new(mirror)),
                    BootState::Redis { loaded },
                    Some((connected.writes, connected.messages)),
                )
            }
            None => match &settings.state_file {
                Some(path) => {
                    let outcome = file::load(path, now);
                    match &outcome {
                        StateFileLoad::Loaded(export) => {
                            log_import_corrections(
                                &state.import((**export).clone(), now),
                                "state file",
                            );
                        }
                        StateFileLoad::Corrupt { moved_to, reason } => tracing::error!(
                            state_file = %path.display(),
                            moved_to = %moved_to.display(),
                            %reason,
                            "state file is corrupt; moved aside, starting with empty state"
                        ),
                        StateFileLoad::Unreadable(reason) => {
                            tracing::error!(%reason, "state file unreadable; starting with empty state")
                        }
                        StateFileLoad::Missing => {}
                    }
                    (
                        Backend::Memory {
                            file: Some(path.clone()),
                        },
                        BootState::StateFile(outcome),
                        None,
                    )
                }
                None => (Backend::Memory { file: None }, BootState::Fresh, None),
            },
        };
        // A state file is first written at the first maintenance tick, so that one that
        // cannot be written shows at once (metrics, /readyz); the rest is due one
        // interval after boot.
        let first_save = match &backend {
            Backend::Memory { file: Some(_) } => 0,
            _ => now,
        };
        let slots = SlotBook::new(match &backend {
            Backend::Redis(mirror) => Some(mirror.clone()),
            Backend::Memory { .. } => None,
        });
        let inner = Arc::new(Inner {
            sessions: SessionBook::new(),
            slots,
            limit_holds: crate::limits::LimitHolds::default(),
            document: crate::document::DocumentState::default(),
            last_purged: AtomicU64::new(now),
            last_pruned: AtomicU64::new(0),
            reloads: ReloadCounts::default(),
            alerts: AlertQueue::default(),
            id: crate::local::store_id(),
            config: ArcSwap::from_pointee(config),
            config_version: AtomicU64::new(0),
            state,
            generation: AtomicU64::new(0),
            backend,
            boot: Mutex::new(Some(boot)),
            tasks: Mutex::new(Vec::new()),
            last_saved: AtomicU64::new(first_save),
            persisting: tokio::sync::Mutex::new(()),
            state_file: StateFileHealth::default(),
        });
        let store = Store { inner };
        store.spawn_tasks(writes);
        Ok(store)
    }

    fn spawn_tasks(&self, redis: Option<RedisReceivers>) {
        let mut tasks = Vec::new();
        let weak = Arc::downgrade(&self.inner);
        tasks.push(tokio::spawn(maintenance(weak.clone())));
        if let Backend::Redis(mirror) = &self.inner.backend
            && let Some((mut rx, mut messages)) = redis
        {
            let writer = mirror.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(event) = rx.recv().await {
                    if let Err(e) = writer.write(&event, now_ms()).await {
                        tracing::debug!(error = %e, "redis mirror write fell back to memory");
                    }
                }
            }));
            let w = weak.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    match messages.recv().await {
                        Ok(message) => {
                            let Some(inner) = w.upgrade() else { return };
                            let Backend::Redis(m) = &inner.backend else {
                                return;
                            };
                            if let Some(event) = m.parse(&message) {
                                Store { inner }.apply_remote(event, now_ms());
                            } else if let Some(change) = m.parse_config(&message) {
                                // off this loop: installing reads Redis
                                let store = Store { inner };
                                tokio::spawn(
                                    async move { store.follow_logged(change.reload).await },
                                );
                            }
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            if let Some(inner) = w.upgrade()
                                && let Backend::Redis(m) = &inner.backend
                            {
                                m.request_reconcile();
                            }
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    }
                }
            }));
            let mut reconnections = mirror.reconnections();
            let m = Arc::downgrade(mirror);
            tasks.push(tokio::spawn(async move {
                while reconnections.recv().await.is_ok() {
                    let Some(m) = m.upgrade() else { return };
                    m.request_reconcile();
                }
            }));
        }
        *self
            .inner
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = tasks;
    }

    /// What the store found at boot (taken once; later calls return `None`).
    pub fn take_boot_state(&self) -> Option<BootState> {
        self.inner
            .boot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// The configuration in force now. Hold it for the whole request: a reload swaps in
    /// a new one without touching requests in flight. Each thread gets its own copy of
    /// it (equal in every value; see `Config::local_copy`), so that the reference
    /// counts a request's work changes are not written by every worker.
    pub fn config(&self) -> Arc<Config> {
        let version = self.inner.config_version.load(Ordering::Acquire);
        crate::local::with_view(
            self.inner.id,
            version,
            || self.shared_config(),
            |view| view.config.clone(),
        )
        .unwrap_or_else(|| self.shared_config())
    }

    /// The one copy of the config in force that every thread's copy is made from.
    fn shared_config(&self) -> Arc<Config> {
        self.inner.config.load_full()
    }

    /// Reads, validates and installs the config file at `path`. On any problem the old
    /// config keeps serving and every problem is returned. Runtime state of accounts
    /// that still exist is kept. Changing `listen`, `workers`, `redis_url`, `state_file`
    /// or the rating weights takes a restart (a warning is logged).
    pub fn reload(&self, path: &Path) -> Result<(), StoreError> {
        let config = match Config::load(path) {
            Ok(config) => config,
            Err(e) => {
                self.reload_rejected(&e);
                return Err(e);
            }
        };
        let diff = crate::document::ConfigDiff::between(&self.config(), &config);
        self.install(config);
        if !diff.is_empty() {
            tracing::info!(
                path = %path.display(),
                changed = %serde_json::to_string(&diff).unwrap_or_default(),
                "config reloaded"
            );
        }
        self.count_reload(true);
        Ok(())
    }

    /// Reconciles with Redis now (the state of the configured accounts), instead of at
    /// the next maintenance tick.
    pub(crate) async fn reconcile_now(&self) -> Result<(), StoreError> {
        let Some(mirror) = self.redis() else {
            return Ok(());
        };
        let accounts = account_ids(&self.config());
        reconcile(mirror, &self.inner.state, &accounts, now_ms()).await
    }

    /// The tokens of OAuth accounts that renew themselves (SPEC 14).
    pub fn oauth_tokens(&self) -> &crate::oauth::TokenBook {
        &self.inner.state.oauth
    }

    /// Persists now (the state file; with Redis nothing yet): called after a refresh
    /// rotated tokens, so that a crash right after does not lose them.
    pub async fn persist_tokens(&self) {
        if matches!(self.inner.backend, Backend::Memory { file: Some(_) }) {
            let _ = self.persist(now_ms()).await;
        }
    }

    /// Counts a refused reload and alerts about it (`config_reload_rejected`).
    pub(crate) fn reload_rejected(&self, error: &StoreError) {
        self.count_reload(false);
        self.alert(AlertEvent::new(
            AlertKind::ConfigReloadRejected,
            AlertSubject::default(),
            format!("the old configuration keeps serving: {error}"),
            now_ms(),
        ));
    }

    /// A handle that does not keep the store alive.
    pub fn downgrade(&self) -> WeakStore {
        WeakStore(Arc::downgrade(&self.inner))
    }

    /// The alert queue (SPEC 15): its counters, and the receiving end for the sender.
    pub fn alerts(&self) -> &AlertQueue {
        &self.inner.alerts
    }

    /// Queues `event` for the webhooks that want it; never waits (see
    /// [`AlertQueue::emit`]).
    pub fn alert(&self, event: AlertEvent) -> bool {
        self.inner.alerts.emit(self.config().alerts(), event)
    }

    /// An account's subject: its id and org.
    pub fn account_subject(&self, account: &AccountId) -> AlertSubject {
        AlertSubject {
            account: Some(Arc::from(account.as_str())),
            org: self
                .config()
                .account(account.as_str())
                .map(|a| Arc::from(a.org())),
            ..AlertSubject::default()
        }
    }

    /// Counts a reload that was applied or refused (for the metrics).
    pub(crate) fn count_reload(&self, applied: bool) {
        let reloads = &self.inner.reloads;
        if applied {
            reloads.applied.fetch_add(1, Ordering::Relaxed);
            reloads.last_applied_at.store(now_ms(), Ordering::Relaxed);
        } else {
            reloads.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What the reloads of the config file ([`Store::reload`]: `SIGHUP`,
    /// `POST /admin/reload`) did since boot, for the metrics.
    pub fn reload_outcomes(&self) -> ReloadOutcomes {
        let r = &self.inner.reloads;
        ReloadOutcomes {
            applied: r.applied.load(Ordering::Relaxed),
            rejected: r.rejected.load(Ordering::Relaxed),
            last_applied_at: Some(r.last_applied_at.load(Ordering::Relaxed)).filter(|&t| t > 0),
        }
    }

    /// Installs an already validated config (see [`Store::reload`]).
    pub fn install(&self, config: Config) {
        let old = self.config();
        let (a, b) = (old.server(), config.server());
        if a.redis_url != b.redis_url
            || a.state_file != b.state_file
            || a.rating != b.rating
            || a.listen != b.listen
            || a.workers != b.workers
            || a.admin_listen != b.admin_listen
            || a.tls != b.tls
            || a.config_store != b.config_store
        {
            tracing::warn!(
                "listen, admin_listen, the TLS file paths, workers, redis_url, config_store, state_file and [server.rating] changes take effect at the next restart"
            );
        }
        self.inner
            .state
            .health
            .set_config(config.cooldown().clone());
        self.inner.state.oauth.seed(&config);
        self.inner.config.store(Arc::new(config));
        // after the store: a thread that reads the new version copies the new config
        self.inner.config_version.fetch_add(1, Ordering::AcqRel);
        self.invalidate_snapshots();
    }

    /// Makes every cached snapshot stale (after a reload, a disable or a re-enable).
    fn invalidate_snapshots(&self) {
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The candidate accounts of `route`'s pool in SPEC order (`priority`, `last_used`,
    /// `id`), with `active = false` for accounts inactive in the file or disabled at
    /// runtime. Reused for `snapshot_ttl` (so `last_used` order may lag that long;
    /// `snapshot_ttl_secs = 0` rebuilds it for every request).
    pub fn snapshot(&self, route: &Route, now: UnixMs) -> Snapshot {
        let generation = self.inner.generation.load(Ordering::Acquire);
        let version = self.inner.config_version.load(Ordering::Acquire);
        crate::local::with_view(
            self.inner.id,
            version,
            || self.shared_config(),
            |view| {
                let ttl = view.config.server().snapshot_ttl_ms;
                if ttl > 0
                    && let Some(c) = view.snapshots.get(route.pool_key_ref())
                    && c.generation == generation
                    && now.saturating_sub(c.taken_at) < ttl
                {
                    return c.snapshot.clone();
                }
                let snapshot = self.take_snapshot(&view.config, route);
                if ttl > 0 {
                    view.snapshots.insert(
                        route.pool_key(),
                        CachedSnapshot {
                            taken_at: now,
                            generation,
                            snapshot: snapshot.clone(),
                        },
                    );
                }
                snapshot
            },
        )
        .unwrap_or_else(|| self.take_snapshot(&self.shared_config(), route))
    }

    /// A new snapshot of `route`'s pool in `config`.
    fn take_snapshot(&self, config: &Arc<Config>, route: &Route) -> Snapshot {
        let ids = match route.group() {
            Some(g) => g.accounts(),
            None => route.org().accounts(),
        };
        let state = &self.inner.state;
        let mut candidates: Vec<Candidate> = ids
            .iter()
            .filter_map(|id| config.account(id.as_str()))
            .map(|a| Candidate {
                id: a.id().clone(),
                provider: a.provider(),
                auth: a.auth(),
                base_url: a.base_url().map(Arc::from),
                priority: a.priority(),
                weight: a.weight().get(),
                last_used: state.last_used(a.id()),
                active: a.active() && !state.health.disabled.is_disabled(a.id()),
                rotation_rank: 0, // numbered by sort_snapshot below
            })
            .collect();
        sort_snapshot(&mut candidates);
        Snapshot::new(candidates, &state.health, config)
    }

    /// Records that `account` served a request at `now` (the snapshot's `last_used`).
    pub fn mark_used(&self, account: &AccountId, now: UnixMs) {
        self.inner.state.mark_used(account, now);
    }

    /// The runtime state (the books and the usage ledger).
    pub(crate) fn runtime(&self) -> &RuntimeState {
        &self.inner.state
    }

    /// The config document's state: the change lock, and the Redis document's
    /// version when it lives there.
    pub(crate) fn document(&self) -> &crate::document::DocumentState {
        &self.inner.document
    }

    /// The Redis side of the caller limits.
    pub(crate) fn limit_holds(&self) -> &crate::limits::LimitHolds {
        &self.inner.limit_holds
    }

    /// The Redis mirror, when Redis is configured.
    pub(crate) fn redis(&self) -> Option<&Arc<RedisMirror>> {
        match &self.inner.backend {
            Backend::Redis(mirror) => Some(mirror),
            Backend::Memory { .. } => None,
        }
    }

    /// The health books (cooldowns, disabled, windows, breakers) for synchronous reads.
    /// Write through the `Store` methods so that changes are mirrored.
    pub fn health(&self) -> &PoolHealth {
        &self.inner.state.health
    }

    /// The rating engine, for scores and p90 TTFT.
    pub fn rating(&self) -> &RatingEngine {
        &self.inner.state.rating
    }

    /// The rotation counter's next value in this replica's memory, without advancing it
    /// (route explain; with Redis the shared value may be ahead).
    pub fn peek_counter(&self, pool: &str) -> u64 {
        self.inner.state.counters.peek(pool)
    }

    /// The next rotation counter of `pool`: Redis `INCR` (shared by replicas) when
    /// configured, ready and answering within `redis_timeout_ms`, else the local
    /// counter (at once while Redis is known to be unhealthy).
    pub async fn next_counter(&self, pool: &str) -> u64 {
        if let Backend::Redis(mirror) = &self.inner.backend
            && mirror.ready()
            && let Ok(v) = mirror.incr(pool).await
        {
            self.inner
                .state
                .counters
                .raise_to(pool, v.saturating_add(1));
            return v;
        }
        self.inner.state.counters.next_value(pool)
    }

    /// The account `key`'s session is bound to (session affinity), if the binding has
    /// not expired: from Redis when configured, ready and answering (so replicas agree),
    /// else from memory.
    pub async fn session_account(&self, key: &str, now: UnixMs) -> Option<AccountId> {
        if let Backend::Redis(mirror) = &self.inner.backend
            && mirror.ready()
            && let Ok(bound) = mirror.session(key).await
        {
            return bound;
        }
        self.inner.sessions.get(key, now)
    }

    /// Binds `key`'s session to `account` for `ttl_ms` from `now` (a new binding, a
    /// re-bind or a refresh alike): in memory, and in Redis when configured and ready.
    pub async fn bind_session(&self, key: &str, account: &AccountId, ttl_ms: u64, now: UnixMs) {
        self.inner.sessions.bind(key, account, ttl_ms, now);
        if let Backend::Redis(mirror) = &self.inner.backend
            && mirror.ready()
            && let Err(e) = mirror.bind_session(key, account, ttl_ms).await
        {
            tracing::debug!(error = %e, "session binding kept in memory only");
        }
    }

    /// The per-account concurrency slots (`max_concurrent`) and their queue.
    pub fn slots(&self) -> &SlotBook {
        &self.inner.slots
    }

    /// Applies a failed attempt to the books ([`PoolHealth::record_failure`]) and
    /// mirrors the resulting cooldown and disabling.
    pub fn record_failure(
        &self,
        attempt: &Attempt<'_>,
        classification: &Classification,
        now: UnixMs,
    ) -> FailureEffect {
        let health = &self.inner.state.health;
        let was_disabled = health.disabled.is_disabled(attempt.account);
        let effect = health.record_failure(attempt, classification, now);
        if effect.cooldown_until.is_some()
            && let Some(entry) = health.cooldowns.entry(attempt.account)
        {
            self.mirror(StateEvent::Cooldown {
                record: CooldownRecord {
                    account: attempt.account.clone(),
                    entry,
                },
            });
        }
        if effect.locked_until.is_some()
            && let Some(lockout) = health.lockouts.get(attempt.account, attempt.model)
        {
            self.invalidate_snapshots();
            self.mirror(StateEvent::Lockout {
                record: keypool_cooldown::LockoutRecord {
                    account: attempt.account.clone(),
                    model: attempt.model.to_owned(),
                    lockout,
                },
            });
        }
        if effect.disabled && !was_disabled {
            self.invalidate_snapshots();
            if let Some(disabled) = health.disabled.get(attempt.account) {
                let kind = terminal_alert(disabled.state);
                self.alert(AlertEvent::new(
                    kind,
                    self.account_subject(attempt.account),
                    disabled.reason.clone(),
                    now,
                ));
                self.mirror(StateEvent::Disabled {
                    record: DisabledRecord {
                        account: attempt.account.clone(),
                        disabled,
                    },
                });
            }
        }
        effect
    }

    /// Applies a successful attempt ([`PoolHealth::record_success`]) and records that
    /// the account served.
    pub fn record_success(&self, attempt: &Attempt<'_>, now: UnixMs) {
        self.inner.state.health.record_success(attempt, now);
        self.mark_used(attempt.account, now);
    }

    /// Records an upstream response's rate-limit headers; mirrors the window state when
    /// it keeps the account out (or just stopped doing so). A reset the parser had to
    /// bound (`info.corrections`) is logged at `warn`, one line per header.
    pub fn observe_windows(&self, account: &AccountId, info: &RateLimitInfo, now: UnixMs) {
        if info.has_no_window_state() {
            return;
        }
        for correction in &info.corrections {
            log_reset_correction(account, correction, "upstream response");
        }
        let threshold = self.window_threshold(account);
        let windows = &self.inner.state.health.windows;
        let change = windows.observe_change(account, info, threshold, now);
        if change.before.is_none()
            && let Some(out) = &change.after
        {
            self.alert(AlertEvent::new(
                AlertKind::AccountOutOfWindow,
                self.account_subject(account),
                format!(
                    "out of its {} limit until {}",
                    out.limit.as_str(),
                    crate::alerts::rfc3339(out.until)
                ),
                now,
            ));
        }
        if (change.after.is_some() || change.before.is_some())
            && change.before != change.after
            && let Some(state) = windows.state(account)
        {
            self.mirror(StateEvent::Window {
                record: WindowRecord {
                    account: account.clone(),
                    state,
                },
            });
        }
    }

    /// Whether `account` is out of a usage window at `now`, with its own
    /// `window_threshold` (or the default).
    pub fn out_of_window(&self, account: &AccountId, now: UnixMs) -> Option<OutOfWindow> {
        let threshold = self.window_threshold(account);
        self.inner
            .state
            .health
            .windows
            .out_of_window(account, threshold, now)
    }

    fn window_threshold(&self, account: &AccountId) -> Option<f64> {
        self.config()
            .account(account.as_str())
            .and_then(|a| a.window_threshold())
            .map(|t| t.get())
    }

    /// Records a rating sample (mirrored periodically, best-effort).
    pub fn record_rating(&self, account: &AccountId, sample: Sample, now: UnixMs) {
        self.inner.state.rating.record(account, sample, now);
    }

    /// Operator action: disables `account` (mirrored). Returns whether it is disabled.
    pub fn disable(&self, account: &AccountId, reason: &str, now: UnixMs) -> bool {
        self.disable_as(account, Terminal::Disabled, reason, now)
    }

    /// [`Store::disable`] into the terminal `state` (e.g. `expired` by the OAuth
    /// refresher). Returns whether it is disabled.
    pub fn disable_as(
        &self,
        account: &AccountId,
        state: Terminal,
        reason: &str,
        now: UnixMs,
    ) -> bool {
        let disabled = &self.inner.state.health.disabled;
        let was = disabled.is_disabled(account);
        let is = disabled.disable_as(account, state, reason, now);
        if is && !was {
            self.invalidate_snapshots();
            if let Some(d) = disabled.get(account) {
                self.mirror(StateEvent::Disabled {
                    record: DisabledRecord {
                        account: account.clone(),
                        disabled: d,
                    },
                });
            }
        }
        is
    }

    /// Operator action: re-enables `account` (mirrored). Returns what it was disabled for.
    pub fn reenable(&self, account: &AccountId) -> Option<DisabledAccount> {
        let was = self.inner.state.health.disabled.reenable(account);
        self.invalidate_snapshots();
        self.mirror(StateEvent::Reenabled {
            account: account.clone(),
        });
        was
    }

    /// Operator action: clears `account`'s cooldown (mirrored).
    pub fn clear_cooldown(&self, account: &AccountId) {
        self.inner.state.health.cooldowns.clear(account);
        self.mirror(StateEvent::CooldownCleared {
            account: account.clone(),
        });
    }

    /// Operator action: drops `account`'s window state and a cooldown a window set
    /// ([`PoolHealth::clear_windows`]), so that it is back in service at once
    /// (mirrored, and persisted with the next state-file snapshot).
    pub fn clear_windows(&self, account: &AccountId) -> ClearedWindows {
        let cleared = self.inner.state.health.clear_windows(account);
        self.mirror(StateEvent::WindowsCleared {
            account: account.clone(),
        });
        if cleared.cooldown.is_some() {
            self.mirror(StateEvent::CooldownCleared {
                account: account.clone(),
            });
        }
        cleared
    }

    /// The account's model lockouts running at `now` (SPEC 16), by model.
    pub fn lockouts(
        &self,
        account: &AccountId,
        now: UnixMs,
    ) -> Vec<(String, keypool_cooldown::Lockout)> {
        self.inner.state.health.lockouts.of_account(account, now)
    }

    /// Operator action: ends the account's lockouts of `model`, or all (`None`)
    /// (mirrored, persisted with the next snapshot). Returns how many were running.
    pub fn clear_lockouts(&self, account: &AccountId, model: Option<&str>, now: UnixMs) -> usize {
        let lockouts = &self.inner.state.health.lockouts;
        let models: Vec<String> = lockouts
            .of_account(account, 0)
            .into_iter()
            .map(|(m, _)| m)
            .filter(|m| model.is_none_or(|want| want == m))
            .collect();
        let cleared = lockouts.clear(account, model, now);
        self.invalidate_snapshots();
        self.mirror(StateEvent::LockoutsCleared {
            account: account.clone(),
            models,
        });
        cleared
    }

    fn mirror(&self, event: StateEvent) {
        if let Backend::Redis(mirror) = &self.inner.backend {
            mirror.send(event);
        }
    }

    /// Applies another replica's change to the local books.
    fn apply_remote(&self, event: StateEvent, now: UnixMs) {
        let health = &self.inner.state.health;
        match event {
            StateEvent::Cooldown { record } => {
                let imported = health.cooldowns.import([record], now);
                log_cooldown_corrections(&imported.corrected, "redis event");
            }
            StateEvent::CooldownCleared { account } => health.cooldowns.clear(&account),
            StateEvent::Window { record } => {
                let imported = health.windows.import([record], now);
                log_reset_corrections(&imported.corrected, "redis event");
            }
            StateEvent::WindowsCleared { account } => {
                health.clear_windows(&account);
            }
            StateEvent::Disabled { record } => {
                health.disabled.import([record]);
                self.invalidate_snapshots();
            }
            StateEvent::Reenabled { account } => {
                health.disabled.reenable(&account);
                self.invalidate_snapshots();
            }
            StateEvent::Lockout { record } => {
                health.lockouts.import([record], now);
            }
            StateEvent::LockoutsCleared { account, models } => {
                for model in &models {
                    health.lockouts.clear(&account, Some(model), now);
                }
                self.invalidate_snapshots();
            }
        }
    }

    /// Which backend, and whether Redis answers.
    pub fn backend_status(&self) -> BackendStatus {
        match &self.inner.backend {
            Backend::Memory { file: None } => BackendStatus {
                kind: BackendKind::Memory,
                redis_ready: None,
                redis_fallbacks: 0,
                state_file_error: None,
                state_file_write_failures: 0,
            },
            Backend::Memory { file: Some(path) } => BackendStatus {
                kind: BackendKind::StateFile(path.clone()),
                redis_ready: None,
                redis_fallbacks: 0,
                state_file_error: self.inner.state_file.error(),
                state_file_write_failures: self.inner.state_file.failures.load(Ordering::Relaxed),
            },
            Backend::Redis(m) => BackendStatus {
                kind: BackendKind::Redis,
                redis_ready: Some(m.ready()),
                redis_fallbacks: m.fallbacks(),
                state_file_error: None,
                state_file_write_failures: 0,
            },
        }
    }

    /// Readiness for `/readyz`: config loaded (always, once opened) and, with Redis
    /// configured, Redis answering. A state file that cannot be written does not make
    /// keypool unready (it serves from memory); [`BackendStatus::state_file_error`]
    /// says so.
    pub fn ready(&self) -> bool {
        match &self.inner.backend {
            Backend::Redis(m) => m.ready(),
            Backend::Memory { .. } => true,
        }
    }

    /// With Redis, every `host:port` keypool's Redis client was relayed to through the
    /// reply guard so far (the server; the sentinels and the primary; or the cluster's
    /// nodes); empty without Redis.
    pub fn redis_relay_targets(&self) -> Vec<String> {
        match &self.inner.backend {
            Backend::Redis(m) => m.relay_targets(),
            Backend::Memory { .. } => Vec::new(),
        }
    }

    /// Everything in memory, with absolute times.
    pub fn export_state(&self, now: UnixMs) -> StateExport {
        self.inner.state.export(now)
    }

    /// The periodic work due at `now` (the background task calls this every 200 ms):
    /// the alerts' pool watch (`pool_unavailable`); the state-file snapshot every
    /// `state_snapshot_interval`; with Redis, the reconciliation when it is due, else
    /// the usage flush (every tick) and the rating sync every interval; once an hour,
    /// usage totals past their retention go.
    pub async fn maintain(&self, now: UnixMs) {
        self.watch_pools(now);
        self.inner.slots.renew_due(now).await;
        self.maintain_document(now).await;
        if let Some(mirror) = self.redis().filter(|m| m.ready()) {
            self.inner.limit_holds.maintain(mirror, now).await;
        }
        if now.saturating_sub(self.inner.last_pruned.load(Ordering::Relaxed)) >= USAGE_PRUNE_MS {
            self.inner.last_pruned.store(now, Ordering::Relaxed);
            let retention = self.config().usage().retention_days;
            self.inner.state.usage.aggregates.prune(now, retention);
        }
        if now.saturating_sub(self.inner.last_purged.load(Ordering::Relaxed)) >= SESSION_PURGE_MS {
            self.inner.last_purged.store(now, Ordering::Relaxed);
            self.inner.sessions.purge(now);
        }
        let interval = self.config().server().state_snapshot_interval_ms;
        let due = now.saturating_sub(self.inner.last_saved.load(Ordering::Relaxed)) >= interval;
        match &self.inner.backend {
            Backend::Memory { file: None } => {}
            Backend::Memory { file: Some(_) } => {
                if due {
                    // a failure is recorded and logged by persist
                    let _ = self.persist(now).await;
                }
            }
            Backend::Redis(mirror) => {
                if mirror.needs_reconcile() {
                    let accounts = account_ids(&self.config());
                    match reconcile(mirror, &self.inner.state, &accounts, now).await {
                        Ok(()) => tracing::info!("redis answers; state reconciled"),
                        Err(e) => tracing::debug!(error = %e, "redis still unavailable"),
                    }
                } else {
                    if mirror.ready() {
                        self.flush_usage(mirror).await;
                    }
                    if due {
                        self.inner.last_saved.store(now, Ordering::Relaxed);
                        let rating = &self.inner.state.rating;
                        if mirror.push_rating(&rating.export(now)).await.is_ok()
                            && let Ok(remote) = mirror.pull_rating().await
                        {
                            rating.import(&remote);
                        }
                    }
                }
            }
        }
    }

    /// Persists now: writes the state file, or pushes the state to Redis. Call at
    /// shutdown (the background task also does it every `state_snapshot_interval`).
    /// The outcome of a state file write is recorded for [`Store::backend_status`].
    ///
    /// # Errors
    /// [`StoreError::WriteState`] when the state file cannot be written (the state
    /// since its last successful write would be lost at a restart);
    /// [`StoreError::Redis`] when Redis does not take the push (every change was
    /// mirrored as it happened: best-effort).
    pub async fn persist(&self, now: UnixMs) -> Result<(), StoreError> {
        let _one_at_a_time = self.inner.persisting.lock().await;
        self.inner.last_saved.store(now, Ordering::Relaxed);
        match &self.inner.backend {
            Backend::Memory { file: None } => Ok(()),
            Backend::Memory { file: Some(path) } => {
                let export = self.inner.state.export(now);
                let target = path.clone();
                let outcome = tokio::task::spawn_blocking(move || file::save(&target, &export))
                    .await
                    .unwrap_or_else(|e| {
                        Err(StoreError::WriteState {
                            path: path.clone(),
                            source: std::io::Error::other(e),
                        })
                    });
                self.inner.state_file.record(&outcome);
                outcome
            }
            Backend::Redis(m) => {
                if m.ready() {
                    self.flush_usage(m).await;
                }
                let state = &self.inner.state;
                m.push(&state.health.export(now), &state.rating.export(now), now)
                    .await
            }
        }
    }
}

impl Counter for Store {
    fn next(&self, group: &str) -> impl std::future::Future<Output = u64> + Send {
        let store = self.clone();
        let group = group.to_owned();
        async move { store.next_counter(&group).await }
    }
}

/// The ids of the configured accounts (whose state is pulled from Redis).
fn account_ids(config: &Config) -> Vec<AccountId> {
    config.accounts().map(|a| a.id().clone()).collect()
}

/// Pulls the state of `accounts` from Redis into memory (later expiry wins), then
/// pushes local state back.
async fn reconcile(
    mirror: &RedisMirror,
    state: &RuntimeState,
    accounts: &[AccountId],
    now: UnixMs,
) -> Result<(), StoreError> {
    mirror.begin_reconcile();
    mirror.ping().await?;
    mirror.ensure_subscribed().await?;
    let remote = mirror.pull(accounts).await?;
    state.rating.import(&remote.rating);
    log_import_corrections(&state.health.import(remote.health, now), "redis");
    let local = state.health.export(now);
    mirror.push(&local, &state.rating.export(now), now).await?;
    mirror.mark_reconciled();
    Ok(())
}

/// Logs a reset an adapter or an import bounded: the account, which reset and both
/// values (no secret: upstream header values are numbers here).
fn log_reset_correction(account: &AccountId, c: &ResetCorrection, source: &str) {
    tracing::warn!(
        account = %account,
        reset = c.kind.name(),
        received_ms = c.received,
        recorded_ms = c.recorded,
        read_as_ms = c.read_as_ms,
        source,
        "rate-limit reset beyond its bound: recorded the bounded value (docs/RELIABILITY.md, hostile rate-limit headers)"
    );
}

/// Logs what an import bounded (state persisted or mirrored by an older keypool).
fn log_import_corrections(counts: &ImportCounts, source: &str) {
    log_reset_corrections(&counts.corrected_resets, source);
    log_cooldown_corrections(&counts.corrected_cooldowns, source);
}

fn log_reset_corrections(corrected: &[(AccountId, ResetCorrection)], source: &str) {
    for (account, c) in corrected {
        log_reset_correction(account, c, source);
    }
}

fn log_cooldown_corrections(corrected: &[(AccountId, CooldownCorrection)], source: &str) {
    for (account, c) in corrected {
        tracing::warn!(
            account = %account,
            received_ms = c.received,
            recorded_ms = c.recorded,
            source,
            "persisted cooldown ends later than any trigger sets: loaded it bounded (docs/RELIABILITY.md, hostile rate-limit headers)"
        );
    }
}

/// The background loop: runs [`Store::maintain`] every [`TICK`] with the clock.
async fn maintenance(weak: Weak<Inner>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = weak.upgrade() else { return };
        Store { inner }.maintain(now_ms()).await;
    }
}

/// The alert of an account that entered the terminal `state` (SPEC 15, 16).
fn terminal_alert(state: Terminal) -> AlertKind {
    match state {
        Terminal::Disabled => AlertKind::AccountDisabled,
        Terminal::CreditsExhausted => AlertKind::AccountOutOfCredits,
        Terminal::Banned => AlertKind::AccountBanned,
        Terminal::Expired => AlertKind::AccountExpired,
    }
}
