//! Failure classes, cooldown and backoff, disabling, usage windows and the circuit
//! breaker for upstream accounts: SPEC 5, 6 and 16 as pure policy.
//!
//! After every attempt the proxy asks this crate what the outcome means for the account
//! ([`classify`]), records it ([`CooldownBook`], [`DisabledBook`], [`WindowBook`],
//! [`CircuitBreakers`], together in [`PoolHealth`]), and before every request the
//! selector asks "may this account be used at `now`, and if not, until when?".
//!
//! The crate does no I/O, has no runtime and never reads the clock: `now` (unix ms) is
//! an argument of every operation. Shared state is `DashMap`s and atomics, safe to use
//! from many request tasks at once. Persistence is the store's job; this crate only
//! offers [`PoolHealth::export`] / [`PoolHealth::import`] with absolute expiries.
//!
//! ```
//! use http::StatusCode;
//! use keypool_core::AccountId;
//! use keypool_cooldown::facts::RateLimitInfo;
//! use keypool_cooldown::{classify, AttemptFailure, FailureClass, PoolHealth};
//!
//! let health = PoolHealth::default();
//! let account = AccountId::from("acct-1");
//! let (started, now) = (1_700_000_000_000, 1_700_000_000_350);
//!
//! // What a provider adapter read from a 429 (`retry-after: 20`).
//! let info = RateLimitInfo { retry_after_ms: Some(20_000), ..RateLimitInfo::default() };
//! health.windows.observe(&account, &info, now);
//!
//! let failure = AttemptFailure::Status { status: StatusCode::TOO_MANY_REQUESTS, rate_limit: &info, marks: Default::default() };
//! let c = classify(&failure, now);
//! assert_eq!(c.class, FailureClass::RateLimit);
//! let until = health.cooldowns.record_failure(&account, &c, started, 12, now);
//! assert_eq!(until, Some(now + 20_000));
//! assert_eq!(health.cooldowns.cooldown_until(&account, now + 20_000), None);
//! ```
//!
//! # Layout
//! - [`facts`]: [`facts::RateLimitInfo`], the rate-limit facts of one response in a
//!   form that names no provider (the adapters of `keypool-providers` read the
//!   headers), and the bound of every reset ([`facts::ResetKind::bound`]).
//! - `classify`: [`classify`] maps a failed attempt to a [`Classification`]
//!   ([`FailureClass`] + [`Trigger`]), the SPEC 6 tables.
//! - `config`: [`CooldownSettings`] (every number, SPEC defaults) validated into
//!   [`CooldownConfig`], which also turns a trigger into a duration.
//! - `cooldown`: [`CooldownBook`], per-account expiry, backoff level, herd protection.
//! - `disabled`: [`DisabledBook`], key-error disabling behind `auto_disable_on_error`,
//!   into one of the terminal states of SPEC 16 ([`Terminal`]).
//! - `lockout`: [`LockoutBook`], per-(account, model) lockouts after a `404
//!   not_found_error` (SPEC 16).
//! - `restate`: [`restate`], the `[[restate]]` rules that rewrite a third party's status
//!   before classification (SPEC 16).
//! - `window`: [`WindowBook`], the 5-hour / weekly / request-limit "out until" answer.
//! - `breaker`: [`CircuitBreakers`], the optional per-`base_url` breaker.
//! - `signal`: [`CooldownSignal`], [`WindowSignal`], the books' lock-free per-account
//!   summaries that the request path reads instead of looking every account up.
//! - `state`: [`PoolHealth`] and its serde [`HealthExport`].
//! - `error`: [`CooldownError`].

mod book;
mod breaker;
mod classify;
mod config;
mod cooldown;
mod disabled;
mod error;
pub mod facts;

mod lockout;
mod restate;
mod signal;
mod state;
mod window;

/// The hasher of the books' per-account maps: `foldhash` (randomly seeded per map),
/// not SipHash, since a request looks several accounts up in several books. Their
/// keys are configured account ids.
type Hasher = foldhash::fast::RandomState;

pub use book::Imported;
pub use breaker::{BreakerOutcome, BreakerState, CircuitBreaker, CircuitBreakers};
pub use classify::{
    AttemptFailure, BodyMarks, Classification, FailureClass, REQUEST_ERROR_STATUSES,
    TransportFailure, Trigger, classify,
};
pub use config::{
    BreakerSettings, CooldownConfig, CooldownSettings, DEFAULT_BAN_MARKERS, DEFAULT_CREDIT_MARKERS,
};
pub use cooldown::{CooldownBook, CooldownCorrection, CooldownEntry, CooldownRecord};
pub use disabled::{DisabledAccount, DisabledBook, DisabledRecord, Terminal, disable_reason};
pub use error::CooldownError;
pub use lockout::{Lockout, LockoutBook, LockoutRecord, MAX_MODELS_PER_ACCOUNT};
pub use restate::{RestateRule, Restatement, restate};
pub use signal::{CooldownSignal, WindowSignal};
pub use state::{Attempt, ClearedWindows, FailureEffect, HealthExport, ImportCounts, PoolHealth};
pub use window::{OutOfWindow, UsageLimit, WindowBook, WindowChange, WindowRecord, WindowState};
