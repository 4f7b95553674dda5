//! Configuration, org/URL/LB-key resolution and shared runtime state.
//!
//! `keypool-store` is the only crate that reads configuration files and the only crate
//! that talks to Redis. It turns `keypool.toml` into checked types ([`config`]), answers
//! the first questions of every request (which org and URL config, which caller, which
//! candidate accounts: [`resolve`]), and keeps the runtime state the policy crates need
//! alive across restarts and replicas.
//!
//! ```
//! use keypool_store::config::Config;
//! let toml = r#"
//!     [[orgs]]
//!     slug = "acme"
//!     [[accounts]]
//!     id = "a1"
//!     org = "acme"
//!     provider = "anthropic"
//!     auth = "api_key"
//!     secret = "$ACME_KEY"
//!     [[urls]]
//!     custom_url = "team"
//!     org = "acme"
//! "#;
//! let env = |name: &str| (name == "ACME_KEY").then(|| "sk-ant-xyz".to_owned());
//! let config = Config::from_toml_str(toml, None, &env).unwrap();
//! let account = config.account("a1").unwrap();
//! assert_eq!(format!("{:?}", account.secret()), "[redacted]");
//! assert_eq!(account.weight().get(), 1);
//! ```
//!
//! The request path, in order (SPEC 3):
//!
//! ```text
//! let config = store.config();                        // Arc<Config>, held for the request
//! let route = config.resolve(org, url)?;              // or resolve_legacy(url)
//! let key = keys::presented_key(x_api_key, authorization);
//! let caller = config.authenticate(&route, key)?;     // 401 / 403 ORG_SUSPENDED
//! let snapshot = store.snapshot(&route, now);         // Snapshot: candidates in SPEC order
//! let counter = store.next_counter(route.pool_key().as_str()).await;
//! let bound = store.session_account(&session_key, now).await;  // session affinity
//! // ... plan with keypool-selector (preferring `bound`), then per attempt:
//! let slot = store.slots().try_acquire(&account, max_concurrent).await; // capped only
//! // (none free anywhere: store.slots().wait("acme/alice", &wants, max_wait, max_depth).await)
//! store.record_failure(&attempt, &classification, now);   // or record_success
//! store.observe_windows(&account, &rate_limit_info, now);
//! store.record_rating(&account, sample, now);
//! store.bind_session(&session_key, &served_by, ttl_ms, now).await;
//! ```
//!
//! # Layout
//! - [`alerts`]: the alert events of SPEC 15, their pure policy (deduplication,
//!   backoff, pool outages) and the bounded queue the proxy's sender drains.
//! - [`clock`]: the wall and monotonic clocks, read at most once per poll of a
//!   connection's task ([`clock::once_per_poll`]); [`store::now_ms`] reads through it.
//! - [`config`]: the TOML schema, validation with located errors, env overrides,
//!   [`config::Secret`].
//! - [`error`]: the crate error, [`StoreError`].
//! - [`keys`]: LB key hashing, extraction from headers, generation (`keypool keygen`).
//! - [`resolve`]: org/URL resolution ([`resolve::Route`], [`resolve::ResolveError`]) and
//!   key validation ([`resolve::Caller`], [`resolve::AuthError`]).
//! - [`sessions`]: session-affinity bindings in memory ([`sessions::SessionBook`]); the
//!   store keeps them in Redis too when configured.
//! - [`slots`]: per-account concurrency slots (`max_concurrent`), the FIFO queue for
//!   them and, with Redis, the cross-replica leases ([`slots::SlotGuard`]).
//! - [`state`]: the runtime state around the policy crates' books, the state file, the
//!   Redis mirror and its reply guard ([`state::resp_guard`]).
//! - [`store`]: [`Store`]: live config (`ArcSwap`), snapshots, state writes that are
//!   mirrored, readiness.
//! - [`limits`]: the caller limits of SPEC 12 ([`limits::LimitGuard`]: what an
//!   admitted request holds until it settles).
//! - [`usage`]: the usage ledger's books ([`usage::UsageBook`]) and the store's usage
//!   methods (record, totals, recent requests, lookup; Redis batches exactly once).
//! - [`testing`]: a per-test `redis-server`, a fake Redis that misbehaves on demand and
//!   temp folders, for this crate's tests and the end-to-end suites.

pub mod alerts;
pub mod clock;
pub mod config;
pub mod document;
pub mod error;
pub mod keys;
pub mod limits;
mod local;
pub mod oauth;
pub mod resolve;
pub mod sessions;
pub mod slots;
pub mod snapshot;
pub mod state;
pub mod store;
pub mod testing;
pub mod usage;

pub use error::StoreError;
pub use snapshot::{CandidateSignals, KeptSurvivors, SURVIVOR_SCOPES, Snapshot, survivor_scope};
pub use store::{BackendKind, BackendStatus, BootState, ReloadOutcomes, Store, WeakStore, now_ms};
