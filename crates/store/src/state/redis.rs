//! The Redis mirror (`fred`): best-effort copies of the in-memory books, shared counters,
//! and pub/sub events so that replicas see each other's changes within a second.
//!
//! Layout in Redis (prefix `keypool:`):
//!
//! | key | type | content |
//! | --- | --- | --- |
//! | `keypool:cooldown:{account}` | string, `PXAT` expiry | JSON `CooldownRecord` |
//! | `keypool:window:{account}` | string, `PXAT` latest future reset | JSON `WindowRecord` |
//! | `keypool:disabled` | hash account → JSON `DisabledRecord` (with its terminal state) | no expiry |
//! | `keypool:lockouts` | hash `account\tmodel` → JSON `LockoutRecord` | no expiry; ended ones are ignored when read |
//! | `keypool:rating` | hash account → JSON `AccountRatingState` | flushed periodically |
//! | `keypool:counter:{org/group}` | integer | `INCR` rotation counter |
//! | `keypool:session:{org/url/session}` | string, `PX` TTL | the bound account id (session affinity) |
//! | `keypool:leases:{account}` | sorted set lease → expiry (unix ms) | concurrency slots held by every replica |
//! | `keypool:{usage}:d:{day}:{dimension}`, `…:m:{month}:{dimension}` | hash `[org, key, field]` → count | usage totals of all replicas (`HINCRBY` by one script per batch); expires `retention_days` after its period |
//! | `keypool:{usage}:batch:{replica}:{seq}` | string, 7 d | a usage batch already added (so a retry is not added twice) |
//! | `keypool:{requests}:recent` | list of JSON `UsageRecord` | the newest records of all replicas, kept to `recent_requests` |
//! | `keypool:request:{id}` | string, 7 d | one JSON `UsageRecord`, for lookup by request id |
//! | `keypool:{lim:<org>}:…` | see [`super::redis_limits`] | the caller limits of every replica |
//! | channel `keypool:events` | pub/sub | JSON [`Envelope`] after every mirrored write |
//! | `keypool:{config}:…`, channel `keypool:config` | see [`super::redis_document`] | the config document (`config_store = "redis"`) |
//! | `keypool:oauth:{account}`, `keypool:oauth-lock:{account}` | see [`super::redis_oauth`] | OAuth tokens rotated by any replica, and the refresh lock |
//!
//! Every operation is bounded by `redis_timeout_ms`; a failure or timeout marks the
//! mirror not ready, counts a fallback and asks for a reconciliation, and the caller
//! goes on with memory.
//!
//! Two flags keep a Redis that is known to be unhealthy off the request path:
//! - `ready` ([`RedisMirror::ready`]): Redis answered and state is reconciled. Only a
//!   completed reconciliation sets it, any failure clears it; the request path (the
//!   rotation counter, session bindings, concurrency leases) uses Redis only while it
//!   is set, so once one operation failed no request waits on Redis again until the
//!   background probe (the store's maintenance task, every 200 ms) reconciled.
//! - `needs_reconcile`: a reconciliation is due (after a failure, a reconnection or lost
//!   pub/sub events). While it is set the writer task skips mirrored writes; a
//!   reconciliation clears it when it starts, so that writes made while it runs are
//!   mirrored (a failure sets it again).
//!
//! `fred` never talks to Redis directly: every address it connects to (the server,
//! the sentinels and the primary they name, the nodes of a cluster) is resolved by a
//! [`GuardedResolver`] to a reply guard on loopback, which relays to that address and
//! refuses replies that would crash `fred`'s decoder (see [`super::resp_guard`] and
//! [`super::relays`]). Single servers, Sentinel and Cluster are supported
//! ([`redis_target`]); every command keypool sends names one key, so each goes to
//! the node of its key's slot, and the state is read back by key, never by `SCAN`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::clients::{Client, SubscriberClient};
use fred::prelude::{
    ClientLike, Config as FredConfig, EventInterface, Expiration, HashesInterface, KeysInterface,
    ListInterface, PubsubInterface, ReconnectPolicy, SortedSetsInterface,
};
use fred::types::{Builder, ConnectHandle};
use keypool_cooldown::{CooldownRecord, DisabledRecord, HealthExport, LockoutRecord, WindowRecord};
use keypool_core::{AccountId, UnixMs};
use keypool_ledger::{AggregateKey, Dimension, Period, Totals, UsageRecord};
use keypool_selector::{AccountRatingState, RatingState};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::relays::GuardedResolver;
use crate::StoreError;

pub(crate) const PREFIX: &str = "keypool:";
/// The pub/sub channel of state events.
pub const EVENTS_CHANNEL: &str = "keypool:events";
const DISABLED_KEY: &str = "keypool:disabled";
const LOCKOUTS_KEY: &str = "keypool:lockouts";
const RATING_KEY: &str = "keypool:rating";
/// Most keys of one `MGET` (a reconciliation reads two keys per account).
const MGET_KEYS: usize = 512;
/// Mirrored writes waiting for the writer task; beyond this they are dropped (counted
/// as fallbacks) and the next reconciliation catches up.
const WRITE_QUEUE: usize = 4096;

/// One change of shared state, as mirrored and published.
// A window state (with its per-family readings) is the large variant; events are sent
// only when an account's state changes, so their size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StateEvent {
    /// An account's cooldown entry changed (absolute expiry).
    Cooldown {
        /// The entry.
        record: CooldownRecord,
    },
    /// An operator cleared an account's cooldown.
    CooldownCleared {
        /// The account.
        account: AccountId,
    },
    /// An account's usage-window headers changed.
    Window {
        /// The state.
        record: WindowRecord,
    },
    /// An operator cleared an account's window state (and a cooldown a window set,
    /// which the publishing replica also sends as [`StateEvent::CooldownCleared`]).
    WindowsCleared {
        /// The account.
        account: AccountId,
    },
    /// An account was disabled.
    Disabled {
        /// Reason and time.
        record: DisabledRecord,
    },
    /// An operator re-enabled an account.
    Reenabled {
        /// The account.
        account: AccountId,
    },
    /// A model was locked on an account (SPEC 16), or its lockout extended.
    Lockout {
        /// The lockout.
        record: LockoutRecord,
    },
    /// An operator cleared lockouts of an account.
    LockoutsCleared {
        /// The account.
        account: AccountId,
        /// The models cleared.
        models: Vec<String>,
    },
}

/// A published event and the replica that published it (replicas ignore their own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The publishing replica's random id.
    pub origin: String,
    /// The change.
    pub event: StateEvent,
}

/// The shared state read back from Redis.
#[derive(Debug, Default)]
pub(crate) struct RemoteState {
    pub health: HealthExport,
    pub rating: RatingState,
}

/// A new mirror and the receiving ends its background tasks consume.
pub(crate) struct Connected {
    pub mirror: RedisMirror,
    /// Whether the first connection was made within the connect wait.
    pub connected: bool,
    /// Mirrored writes queued by the request path.
    pub writes: mpsc::Receiver<StateEvent>,
    /// Messages published on the events channel.
    pub messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
}

/// Connection, readiness and fallback accounting of the Redis mirror.
pub(crate) struct RedisMirror {
    pub(super) client: Client,
    subscriber: SubscriberClient,
    timeout: Duration,
    origin: String,
    ready: AtomicBool,
    needs_reconcile: AtomicBool,
    fallbacks: AtomicU64,
    writes: mpsc::Sender<StateEvent>,
    resubscriber: tokio::task::AbortHandle,
    connections: Mutex<(ConnectHandle, ConnectHandle)>,
    /// The relays every connection of both clients goes through; they stop with the
    /// mirror.
    relays: GuardedResolver,
    /// Whether `redis_url` names a Cluster (multi-key reads are split by slot).
    clustered: bool,
}

impl std::fmt::Debug for RedisMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisMirror")
            .field("origin", &self.origin)
            .field("ready", &self.ready.load(Ordering::Relaxed))
            .field("fallbacks", &self.fallbacks.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn redis_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Redis(e.to_string())
}

/// The `redis_url` forms keypool supports, as said in its errors.
pub(crate) const SUPPORTED_REDIS_URL: &str = "redis://[[user]:password@]host[:port][/db] (one server), \
redis-sentinel://[[user]:password@]host[:port][/db]?sentinelServiceName=NAME[&node=host:port…] \
or redis-cluster://[[user]:password@]host:port[?node=host:port…]";

/// `fred`'s configuration for a `redis_url` (credentials, database, the server, the
/// sentinels or the cluster's seed nodes), or why keypool cannot use it. The reason
/// never quotes the URL (it may hold a password).
///
/// Every topology goes through keypool's reply guard: `fred` resolves every address
/// it connects to through [`GuardedResolver`], which relays it. Refused: `fred`'s TLS
/// (`rediss://`) and Unix sockets, which are not compiled in, and `?` parameters on a
/// single-server URL (`fred` would ignore them).
pub(crate) fn redis_target(url: &str) -> Result<FredConfig, String> {
    let scheme = url
        .split_once("://")
        .map_or("", |(scheme, _)| scheme)
        .to_ascii_lowercase();
    let problem = |what: &str| {
        format!("{what}; use {SUPPORTED_REDIS_URL} (value not shown: it may hold a password)")
    };
    if scheme.starts_with("rediss") || scheme.starts_with("valkeys") {
        return Err(problem(
            "TLS (rediss://) is not supported: keypool's Redis client is built without TLS; \
             reach Redis over a private network or through a local TLS tunnel (stunnel, spiped)",
        ));
    }
    if scheme.ends_with("+unix") || scheme == "unix" {
        return Err(problem(
            "Unix sockets are not supported: reach Redis over TCP",
        ));
    }
    let query = url
        .rsplit_once('@')
        .map_or(url, |(_, host)| host)
        .contains('?');
    match scheme.as_str() {
        "redis" if query => {
            return Err(problem(
                "a redis:// URL names one server and takes no ? parameters (for Sentinel or \
                 Cluster write redis-sentinel:// or redis-cluster://)",
            ));
        }
        "redis" | "redis-cluster" => {}
        "redis-sentinel" if !url.contains("sentinelServiceName=") => {
            return Err(problem(
                "a redis-sentinel:// URL needs ?sentinelServiceName= (the name the sentinels monitor)",
            ));
        }
        "redis-sentinel" => {}
        _ => {
            return Err(problem(
                "redis_url must be a redis://, redis-sentinel:// or redis-cluster:// URL",
            ));
        }
    }
    FredConfig::from_url(url).map_err(|_| {
        problem("redis_url is not a valid Redis URL (host, port, /db or node= parameters)")
    })
}

impl RedisMirror {
    /// Builds the clients, with the [`GuardedResolver`] through which every
    /// connection they make goes to a reply guard, and starts connecting in the
    /// background (with unlimited reconnection). Waits at most
    /// `connect_wait` for the first connection; the mirror is usable if that does not
    /// happen. It is not ready until a reconciliation succeeded. The URL is never logged.
    pub(crate) async fn connect(
        url: &str,
        timeout: Duration,
        connect_wait: Duration,
    ) -> Result<Connected, StoreError> {
        let config = redis_target(url).map_err(StoreError::Redis)?;
        let clustered = config.server.is_clustered();
        let connect_timeout = timeout.max(Duration::from_millis(500));
        let relays = GuardedResolver::new(connect_timeout);
        let mut builder = Builder::from_config(config);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = connect_timeout;
                c.internal_command_timeout = connect_timeout;
                c.max_command_attempts = 1;
            })
            .with_performance_config(|p| {
                p.default_command_timeout = timeout;
                // a burst of events beyond this makes the subscriber reconcile instead
                p.broadcast_channel_capacity = 1024;
            })
            .set_policy(ReconnectPolicy::new_constant(0, 100));
        let client = builder.build().map_err(redis_err)?;
        let subscriber = builder.build_subscriber_client().map_err(redis_err)?;
        // before the first connection: no address reaches fred but a relay's
        client.set_resolver(Arc::new(relays.clone())).await;
        subscriber.set_resolver(Arc::new(relays.clone())).await;
        // before anything can be published to us, so that no event is missed
        let messages = subscriber.message_rx();
        // the connection tasks end when the clients quit (see `close`), or when a first
        // connection fails (then `ping` starts them again)
        let connections = Mutex::new((client.connect(), subscriber.connect()));
        let resubscriber = subscriber.manage_subscriptions().abort_handle();
        let connected = tokio::time::timeout(connect_wait, client.wait_for_connect())
            .await
            .is_ok_and(|r| r.is_ok());
        let (writes, rx) = mpsc::channel(WRITE_QUEUE);
        let mirror = Self {
            client,
            subscriber,
            timeout,
            origin: {
                use rand::{Rng, SeedableRng};
                format!("{:016x}", rand::rngs::StdRng::from_os_rng().random::<u64>())
            },
            ready: AtomicBool::new(false),
            needs_reconcile: AtomicBool::new(true),
            fallbacks: AtomicU64::new(u64::from(!connected)),
            writes,
            resubscriber,
            connections,
            relays,
            clustered,
        };
        Ok(Connected {
            mirror,
            connected,
            writes: rx,
            messages,
        })
    }

    /// Whether Redis answered the last operation and state is reconciled: only then may
    /// the request path use Redis (and `/readyz` says ready).
    pub(crate) fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// How many operations fell back to memory so far.
    pub(crate) fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }

    /// Whether a reconciliation is due.
    pub(crate) fn needs_reconcile(&self) -> bool {
        self.needs_reconcile.load(Ordering::Relaxed)
    }

    fn fell_back(&self) {
        self.ready.store(false, Ordering::Relaxed);
        self.needs_reconcile.store(true, Ordering::Relaxed);
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs one Redis operation within the timeout; on failure counts a fallback.
    ///
    /// The operation runs boxed: fred's command futures are ~10 KB, and held inline they
    /// made every store call that may reach Redis (and every request-path future that
    /// awaits one, with or without Redis configured) that large, a size the server then
    /// copies whenever it moves a request's future (issue 22). A Redis round trip
    /// dwarfs the allocation.
    pub(super) fn bounded<'a, T: 'a>(
        &'a self,
        op: impl Future<Output = fred::prelude::FredResult<T>> + Send + 'a,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>> {
        Box::pin(async move {
            match tokio::time::timeout(self.timeout, op).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => {
                    self.fell_back();
                    Err(redis_err(e))
                }
                Err(_) => {
                    self.fell_back();
                    Err(StoreError::Redis(format!(
                        "no answer within {} ms",
                        self.timeout.as_millis()
                    )))
                }
            }
        })
    }

    /// Runs a Lua script (`EVAL`) on `keys` and `args`; `slot_key` is one of the keys
    /// (they share a hash tag), naming the node on a Cluster.
    pub(super) async fn eval<T: fred::types::FromValue>(
        &self,
        script: &str,
        slot_key: &str,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<T, StoreError> {
        let cmd = fred::types::CustomCommand::new_static("EVAL", slot_key, false);
        let mut all = Vec::with_capacity(2 + keys.len() + args.len());
        all.push(script.to_owned());
        all.push(keys.len().to_string());
        all.extend(keys);
        all.extend(args);
        self.bounded(self.client.custom(cmd, all)).await
    }

    /// `INCR keypool:counter:{pool}` minus one (so the first value is 0, like the
    /// in-memory counter).
    pub(crate) async fn incr(&self, pool: &str) -> Result<u64, StoreError> {
        let key = format!("{PREFIX}counter:{pool}");
        let v: i64 = self.bounded(self.client.incr(key)).await?;
        Ok(u64::try_from(v.saturating_sub(1)).unwrap_or(0))
    }

    /// Queues a mirrored write (never waits). A full queue counts as a fallback.
    pub(crate) fn send(&self, event: StateEvent) {
        if self.writes.try_send(event).is_err() {
            self.fell_back();
        }
    }

    /// Writes one event to its key and publishes it. `now` skips expired entries.
    pub(crate) async fn write(&self, event: &StateEvent, now: UnixMs) -> Result<(), StoreError> {
        if self.needs_reconcile() {
            // Redis is known to be away: do not wait for it once per queued write; the
            // reconciliation pushes the whole local state when it answers again.
            return Ok(());
        }
        match event {
            StateEvent::Cooldown { record } => {
                if record.entry.until <= now {
                    return Ok(());
                }
                self.set_pxat(&cooldown_key(&record.account), record, record.entry.until)
                    .await?;
            }
            StateEvent::CooldownCleared { account } => {
                let _: i64 = self.bounded(self.client.del(cooldown_key(account))).await?;
            }
            StateEvent::WindowsCleared { account } => {
                let _: i64 = self.bounded(self.client.del(window_key(account))).await?;
            }
            StateEvent::Window { record } => match record.state.latest_future_reset(now) {
                Some(reset) => {
                    self.set_pxat(&window_key(&record.account), record, reset)
                        .await?
                }
                None => {
                    let _: i64 = self
                        .bounded(self.client.del(window_key(&record.account)))
                        .await?;
                }
            },
            StateEvent::Disabled { record } => {
                let json = to_json(record)?;
                let _: i64 = self
                    .bounded(
                        self.client
                            .hset(DISABLED_KEY, (record.account.as_str(), json)),
                    )
                    .await?;
            }
            StateEvent::Reenabled { account } => {
                let _: i64 = self
                    .bounded(self.client.hdel(DISABLED_KEY, account.as_str()))
                    .await?;
            }
            StateEvent::Lockout { record } => {
                let field = lockout_field(&record.account, &record.model);
                let _: i64 = self
                    .bounded(self.client.hset(LOCKOUTS_KEY, (field, to_json(record)?)))
                    .await?;
            }
            StateEvent::LockoutsCleared { account, models } => {
                let fields: Vec<String> =
                    models.iter().map(|m| lockout_field(account, m)).collect();
                if !fields.is_empty() {
                    let _: i64 = self.bounded(self.client.hdel(LOCKOUTS_KEY, fields)).await?;
                }
            }
        }
        let envelope = to_json(&Envelope {
            origin: self.origin.clone(),
            event: event.clone(),
        })?;
        let _: i64 = self
            .bounded(self.client.publish(EVENTS_CHANNEL, envelope))
            .await?;
        Ok(())
    }

    async fn set_pxat<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        at: UnixMs,
    ) -> Result<(), StoreError> {
        let json = to_json(value)?;
        let at = i64::try_from(at).unwrap_or(i64::MAX);
        let _: Option<String> = self
            .bounded(
                self.client
                    .set(key, json, Some(Expiration::PXAT(at)), None, false),
            )
            .await?;
        Ok(())
    }

    /// Subscribes to the events channel and the config document's channel (again,
    /// when a reconnection lost them).
    pub(crate) async fn ensure_subscribed(&self) -> Result<(), StoreError> {
        let tracked = self.subscriber.tracked_channels();
        for channel in [EVENTS_CHANNEL, super::redis_document::CONFIG_CHANNEL] {
            if !tracked.iter().any(|c| &**c == channel) {
                self.bounded(self.subscriber.subscribe(channel)).await?;
            }
        }
        Ok(())
    }

    /// Parses a published message; `None` for foreign or own messages.
    pub(crate) fn parse(&self, message: &fred::types::Message) -> Option<StateEvent> {
        if &*message.channel != EVENTS_CHANNEL {
            return None;
        }
        let text = message.value.as_str()?;
        let envelope: Envelope = serde_json::from_str(&text).ok()?;
        (envelope.origin != self.origin).then_some(envelope.event)
    }

    /// Reads the mirrored cooldowns and windows of `accounts` (the configured ones:
    /// the state of other accounts is ignored anyway), the disabled flags and ratings.
    /// One `GET` per key, never `SCAN`: in a Cluster each key goes to the node of its
    /// slot, where a `SCAN` would see one node only.
    pub(crate) async fn pull(&self, accounts: &[AccountId]) -> Result<RemoteState, StoreError> {
        let mut state = RemoteState::default();
        let cooldowns: Vec<String> = accounts.iter().map(cooldown_key).collect();
        state.health.cooldowns = self.mget_json(cooldowns).await?;
        let windows: Vec<String> = accounts.iter().map(window_key).collect();
        state.health.windows = self.mget_json(windows).await?;
        let disabled: HashMap<String, String> =
            self.bounded(self.client.hgetall(DISABLED_KEY)).await?;
        state.health.disabled = disabled
            .values()
            .filter_map(|v| serde_json::from_str(v).ok())
            .collect();
        let lockouts: HashMap<String, String> =
            self.bounded(self.client.hgetall(LOCKOUTS_KEY)).await?;
        state.health.lockouts = lockouts
            .values()
            .filter_map(|v| serde_json::from_str(v).ok())
            .collect();
        let rating: HashMap<String, String> = self.bounded(self.client.hgetall(RATING_KEY)).await?;
        state.rating.accounts = rating
            .values()
            .filter_map(|v| serde_json::from_str::<AccountRatingState>(v).ok())
            .collect();
        Ok(state)
    }

    /// Writes local state to Redis: unexpired cooldowns and windows with their absolute
    /// expiry, disabled flags, ratings. Used at reconciliation.
    pub(crate) async fn push(
        &self,
        health: &HealthExport,
        rating: &RatingState,
        now: UnixMs,
    ) -> Result<(), StoreError> {
        for record in &health.cooldowns {
            if record.entry.until > now {
                self.set_pxat(&cooldown_key(&record.account), record, record.entry.until)
                    .await?;
            }
        }
        for record in &health.windows {
            if let Some(reset) = record.state.latest_future_reset(now) {
                self.set_pxat(&window_key(&record.account), record, reset)
                    .await?;
            }
        }
        for record in &health.disabled {
            let _: i64 = self
                .bounded(
                    self.client
                        .hset(DISABLED_KEY, (record.account.as_str(), to_json(record)?)),
                )
                .await?;
        }
        for record in health.lockouts.iter().filter(|r| r.lockout.until > now) {
            let field = lockout_field(&record.account, &record.model);
            let _: i64 = self
                .bounded(self.client.hset(LOCKOUTS_KEY, (field, to_json(record)?)))
                .await?;
        }
        self.push_rating(rating).await
    }

    /// Writes the rating state (best-effort, periodic).
    pub(crate) async fn push_rating(&self, rating: &RatingState) -> Result<(), StoreError> {
        if rating.accounts.is_empty() {
            return Ok(());
        }
        let mut fields = Vec::with_capacity(rating.accounts.len());
        for a in &rating.accounts {
            fields.push((a.id.as_str().to_owned(), to_json(a)?));
        }
        let _: i64 = self.bounded(self.client.hset(RATING_KEY, fields)).await?;
        Ok(())
    }

    /// Reads the rating hash.
    pub(crate) async fn pull_rating(&self) -> Result<RatingState, StoreError> {
        let rating: HashMap<String, String> = self.bounded(self.client.hgetall(RATING_KEY)).await?;
        Ok(RatingState {
            accounts: rating
                .values()
                .filter_map(|v| serde_json::from_str(v).ok())
                .collect(),
        })
    }

    /// Called when a reconciliation starts: the writer task mirrors writes from now on
    /// (a failure sets the flag anew). The request path still waits for
    /// [`RedisMirror::mark_reconciled`].
    pub(crate) fn begin_reconcile(&self) {
        self.needs_reconcile.store(false, Ordering::Relaxed);
    }

    /// Marks the mirror reconciled and ready: the request path uses Redis again.
    pub(crate) fn mark_reconciled(&self) {
        self.needs_reconcile.store(false, Ordering::Relaxed);
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Asks for a reconciliation (after a reconnection: the server may have lost data).
    pub(crate) fn request_reconcile(&self) {
        self.needs_reconcile.store(true, Ordering::Relaxed);
    }

    /// A receiver of reconnection events of the command client.
    pub(crate) fn reconnections(
        &self,
    ) -> tokio::sync::broadcast::Receiver<fred::types::config::Server> {
        self.client.reconnect_rx()
    }

    /// `PING`, bounded. Restarts a connection task that gave up (fred does not retry
    /// a first connection that failed).
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        {
            let mut tasks = self
                .connections
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if tasks.0.is_finished() {
                tasks.0 = self.client.connect();
            }
            if tasks.1.is_finished() {
                tasks.1 = self.subscriber.connect();
            }
        }
        let _: String = self.bounded(self.client.ping(None)).await?;
        Ok(())
    }

    /// The JSON values of `keys` that exist and parse, read with `MGET`: one command
    /// per [`MGET_KEYS`] keys on one server; in a Cluster one per group of keys of the
    /// same hash slot (an `MGET` across slots is refused there). A read of keypool's
    /// background work, so that it is told apart from the request path's `GET` of a
    /// session binding.
    async fn mget_json<T: serde::de::DeserializeOwned>(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<T>, StoreError> {
        let groups: Vec<Vec<String>> = if self.clustered {
            let mut by_slot: std::collections::BTreeMap<u16, Vec<String>> = Default::default();
            for key in keys {
                by_slot
                    .entry(fred::util::redis_keyslot(key.as_bytes()))
                    .or_default()
                    .push(key);
            }
            by_slot.into_values().collect()
        } else {
            keys.chunks(MGET_KEYS).map(<[String]>::to_vec).collect()
        };
        let mut out = Vec::new();
        for group in groups.into_iter().filter(|g| !g.is_empty()) {
            let values: Vec<Option<String>> = self.bounded(self.client.mget(group)).await?;
            out.extend(
                values
                    .into_iter()
                    .flatten()
                    .filter_map(|v| serde_json::from_str(&v).ok()),
            );
        }
        Ok(out)
    }

    /// Every Redis `host:port` relayed to so far (the server, or the sentinels and the
    /// primary, or the cluster's nodes).
    pub(crate) fn relay_targets(&self) -> Vec<String> {
        self.relays.targets()
    }

    /// Closes both connections.
    pub(crate) fn close(&self) {
        self.resubscriber.abort();
        let (c, s) = (self.client.clone(), self.subscriber.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = c.quit().await;
                let _ = s.quit().await;
            });
        }
    }
}

/// Takes a lease when fewer than the cap are unexpired. KEYS[1] = the account's lease
/// set; ARGV = now, cap, the lease's expiry, the lease id. Returns 1 (taken) or 0.
const ACQUIRE_LEASE: &str = "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1]) \
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then \
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4]) return 1 end return 0";

impl RedisMirror {
    /// This replica's random id (lease ids start with it).
    pub(crate) fn origin(&self) -> &str {
        &self.origin
    }

    /// The account bound to a session, if any.
    pub(crate) async fn session(&self, key: &str) -> Result<Option<AccountId>, StoreError> {
        let v: Option<String> = self.bounded(self.client.get(session_key(key))).await?;
        Ok(v.map(AccountId::from))
    }

    /// Binds a session to `account` for `ttl_ms` (refreshing the TTL).
    pub(crate) async fn bind_session(
        &self,
        key: &str,
        account: &AccountId,
        ttl_ms: u64,
    ) -> Result<(), StoreError> {
        let ttl = i64::try_from(ttl_ms).unwrap_or(i64::MAX);
        let _: Option<String> = self
            .bounded(self.client.set(
                session_key(key),
                account.as_str(),
                Some(Expiration::PX(ttl)),
                None,
                false,
            ))
            .await?;
        Ok(())
    }

    /// Takes a lease of one of `account`'s `cap` slots, expiring at `expires_at`
    /// (expired leases of crashed replicas are dropped first). `Ok(false)`: at its cap.
    pub(crate) async fn acquire_lease(
        &self,
        account: &AccountId,
        cap: u32,
        lease: &str,
        now: UnixMs,
        expires_at: UnixMs,
    ) -> Result<bool, StoreError> {
        let key = lease_key(account);
        let cmd = fred::types::CustomCommand::new_static("EVAL", key.as_str(), false);
        let args = vec![
            ACQUIRE_LEASE.to_owned(),
            "1".to_owned(),
            key.clone(),
            now.to_string(),
            cap.to_string(),
            expires_at.to_string(),
            lease.to_owned(),
        ];
        let taken: i64 = self.bounded(self.client.custom(cmd, args)).await?;
        Ok(taken == 1)
    }

    /// Gives a lease back.
    pub(crate) async fn release_lease(
        &self,
        account: &AccountId,
        lease: &str,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .bounded(self.client.zrem(lease_key(account), lease.to_owned()))
            .await?;
        Ok(())
    }

    /// Pushes a held lease's expiry to `expires_at` (only if it is still there).
    pub(crate) async fn renew_lease(
        &self,
        account: &AccountId,
        lease: &str,
        expires_at: UnixMs,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .bounded(self.client.zadd(
                lease_key(account),
                Some(fred::types::SetOptions::XX),
                None,
                false,
                false,
                (expires_at as f64, lease.to_owned()),
            ))
            .await?;
        Ok(())
    }
}

fn session_key(key: &str) -> String {
    format!("{PREFIX}session:{key}")
}

fn lease_key(account: &AccountId) -> String {
    format!("{PREFIX}leases:{account}")
}

fn cooldown_key(account: &AccountId) -> String {
    format!("{PREFIX}cooldown:{account}")
}

fn window_key(account: &AccountId) -> String {
    format!("{PREFIX}window:{account}")
}

/// The field of one (account, model) lockout in `keypool:lockouts` (a tab cannot be
/// in an account id or a model id).
fn lockout_field(account: &AccountId, model: &str) -> String {
    format!("{account}\t{model}")
}

fn to_json<T: Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Redis(format!("cannot encode state: {e}")))
}

/// Adds one batch of usage deltas exactly once. KEYS[1] = the batch's dedupe key,
/// KEYS[2..] = the hashes; ARGV[1] = how long the dedupe key lives (s), then per hash
/// its expiry (unix s) and its number of increments, then the (field, delta) pairs of
/// every hash in order. Returns 1 when applied, 0 when this batch was applied already
/// (a retry after a lost answer).
const ADD_USAGE: &str = "if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end \
local a = 2 \
for k = 2, #KEYS do \
  local expiry = ARGV[a] local n = tonumber(ARGV[a + 1]) a = a + 2 \
  for i = 1, n do redis.call('HINCRBY', KEYS[k], ARGV[a], ARGV[a + 1]) a = a + 2 end \
  redis.call('EXPIREAT', KEYS[k], expiry) \
end \
return 1";

/// How long a usage batch's dedupe key lives: longer than any retry of that batch.
const USAGE_BATCH_DEDUPE_SECS: u64 = 7 * 86_400;

/// How long a request's record can be looked up by id in Redis.
pub(crate) const REQUEST_RECORD_TTL_SECS: u64 = 7 * 86_400;

/// The usage hash of a period and dimension. Every usage key carries the hash tag
/// `{usage}`, so that one script can add a whole batch on a Redis Cluster.
fn usage_key(period: Period, dimension: Dimension) -> String {
    let p = match period {
        Period::Day(d) => format!("d:{d}"),
        Period::Month(m) => format!("m:{m}"),
    };
    format!("{PREFIX}{{usage}}:{p}:{}", dimension.as_str())
}

/// A usage hash field: the aggregate's org and key and one totals field, as a JSON
/// array (any characters in a model name or key id stay unambiguous).
fn usage_field(org: &str, key: &str, field: &str) -> String {
    serde_json::json!([org, key, field]).to_string()
}

const RECENT_REQUESTS_KEY: &str = "keypool:{requests}:recent";

fn request_key(id: &str) -> String {
    format!("{PREFIX}request:{id}")
}

impl RedisMirror {
    /// Adds a batch of usage deltas once (`seq` names it: a retry of the same batch is
    /// not added again). Each hash expires `retention_days` after its period ends.
    pub(crate) async fn add_usage(
        &self,
        seq: u64,
        deltas: &HashMap<AggregateKey, Totals>,
        retention_days: u32,
    ) -> Result<(), StoreError> {
        if deltas.is_empty() {
            return Ok(());
        }
        let mut by_hash: BTreeMap<(Period, Dimension), Vec<(&AggregateKey, &Totals)>> =
            BTreeMap::new();
        for (key, totals) in deltas {
            by_hash
                .entry((key.period, key.dimension))
                .or_default()
                .push((key, totals));
        }
        let dedupe = format!("{PREFIX}{{usage}}:batch:{}:{seq}", self.origin);
        let mut keys = vec![dedupe.clone()];
        let mut args = vec![USAGE_BATCH_DEDUPE_SECS.to_string()];
        for ((period, dimension), rows) in &by_hash {
            keys.push(usage_key(*period, *dimension));
            let expiry = period.end() / 1000 + u64::from(retention_days) * 86_400;
            let increments: Vec<(String, u64)> = rows
                .iter()
                .flat_map(|(key, totals)| {
                    Totals::FIELDS
                        .iter()
                        .zip(totals.fields())
                        .filter(|(_, v)| *v > 0)
                        .map(|(f, v)| (usage_field(&key.org, &key.key, f), v))
                })
                .collect();
            args.push(expiry.to_string());
            args.push(increments.len().to_string());
            for (field, delta) in increments {
                args.push(field);
                args.push(delta.to_string());
            }
        }
        let cmd = fred::types::CustomCommand::new_static("EVAL", dedupe.as_str(), false);
        let mut all = vec![ADD_USAGE.to_owned(), keys.len().to_string()];
        all.extend(keys);
        all.extend(args);
        let _: i64 = self.bounded(self.client.custom(cmd, all)).await?;
        Ok(())
    }

    /// Every aggregate of `period` and `dimension` all replicas added.
    pub(crate) async fn usage_rows(
        &self,
        period: Period,
        dimension: Dimension,
    ) -> Result<HashMap<(Arc<str>, Arc<str>), Totals>, StoreError> {
        let hash: HashMap<String, u64> = self
            .bounded(self.client.hgetall(usage_key(period, dimension)))
            .await?;
        let mut rows: HashMap<(Arc<str>, Arc<str>), Totals> = HashMap::new();
        for (field, value) in hash {
            let Ok((org, key, name)) = serde_json::from_str::<(String, String, String)>(&field)
            else {
                continue;
            };
            let one = Totals::from_fields([(name.as_str(), value)]);
            rows.entry((Arc::from(org), Arc::from(key)))
                .or_default()
                .add(&one);
        }
        Ok(rows)
    }

    /// Writes usage records: each by id (for `GET /admin/requests/{id}` on any
    /// replica) and at the head of the shared list of recent ones (kept to `keep`).
    pub(crate) async fn push_records(
        &self,
        records: &[Arc<UsageRecord>],
        keep: usize,
    ) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut jsons = Vec::with_capacity(records.len());
        for record in records {
            let json = to_json(record.as_ref())?;
            let ttl = i64::try_from(REQUEST_RECORD_TTL_SECS).unwrap_or(i64::MAX);
            let _: Option<String> = self
                .bounded(self.client.set(
                    request_key(&record.request_id),
                    json.as_str(),
                    Some(Expiration::EX(ttl)),
                    None,
                    false,
                ))
                .await?;
            jsons.push(json);
        }
        let _: i64 = self
            .bounded(self.client.lpush(RECENT_REQUESTS_KEY, jsons))
            .await?;
        let last = i64::try_from(keep.max(1)).unwrap_or(i64::MAX) - 1;
        let _: String = self
            .bounded(self.client.ltrim(RECENT_REQUESTS_KEY, 0, last))
            .await?;
        Ok(())
    }

    /// The newest `limit` records of every replica, newest first.
    pub(crate) async fn recent_records(
        &self,
        limit: usize,
    ) -> Result<Vec<UsageRecord>, StoreError> {
        let last = i64::try_from(limit.max(1)).unwrap_or(i64::MAX) - 1;
        let list: Vec<String> = self
            .bounded(self.client.lrange(RECENT_REQUESTS_KEY, 0, last))
            .await?;
        Ok(list
            .iter()
            .filter_map(|json| serde_json::from_str(json).ok())
            .collect())
    }

    /// The record of request `id`, when any replica wrote it.
    pub(crate) async fn record(&self, id: &str) -> Result<Option<UsageRecord>, StoreError> {
        let json: Option<String> = self.bounded(self.client.get(request_key(id))).await?;
        Ok(json.and_then(|j| serde_json::from_str(&j).ok()))
    }
}
