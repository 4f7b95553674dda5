//! Who used what (SPEC 11): the usage record of every authenticated request, model
//! prices and costs in integer nano-USD, and the totals per UTC day and month by
//! caller, account and model.
//!
//! Pure policy like the selector and the cooldown crates: no I/O, no runtime, no clock
//! (every time is an argument). The proxy fills a [`UsageRecord`] on the request path
//! and hands it to the store, which adds it to the [`Aggregates`], keeps it in
//! [`RecentRecords`], persists both (state file, Redis) and answers the admin API.
//!
//! ```
//! use std::sync::Arc;
//! use keypool_core::{AccountId, Usage};
//! use keypool_ledger::*;
//!
//! let prices = PriceTable::with_defaults(Vec::new());
//! let usage = Usage { input_tokens: 1_000, output_tokens: 500, ..Usage::default() };
//! // Sonnet 4.5: $3 per million input tokens, $15 per million output tokens.
//! let cost = prices.cost("claude-sonnet-4-5", &usage).unwrap();
//! assert_eq!(cost, 10_500_000); // $0.0105
//!
//! let record = UsageRecord {
//!     request_id: Arc::from("req_1"),
//!     at: 1_796_126_400_000, // 2026-12-01T12:00:00Z
//!     org: Arc::from("acme"),
//!     url: Arc::from("team"),
//!     caller: CallerRef { kind: CallerKind::User, id: Arc::from("alice") },
//!     endpoint: "messages".into(),
//!     model: Some(Arc::from("claude-sonnet-4-5")),
//!     model_sent: Some(Arc::from("claude-sonnet-4-5")),
//!     routing: None,
//!     stream: false,
//!     status: 200,
//!     account: Some(AccountId::from("a1")),
//!     attempts: Vec::new(),
//!     usage,
//!     cost_nano_usd: cost,
//!     cost_basis: CostBasis::Api,
//!     ttft_ms: Some(120),
//!     total_ms: 400,
//!     stream_end: None,
//!     limit: None,
//! };
//! let aggregates = Aggregates::new(false);
//! aggregates.record(&record);
//! let day = "2026-12-01".parse::<Day>().unwrap();
//! let rows = aggregates.rows(Period::Day(day), Dimension::Caller);
//! assert_eq!(rows[0].2.cost_nano_usd, 10_500_000);
//! assert_eq!(rows[0].2.requests, 1);
//! ```
//!
//! # Layout
//! - [`price`]: [`ModelGlob`], [`Prices`], [`PriceTable`] (the operator's rules, then
//!   [`default_rules`]), nano-USD arithmetic.
//! - [`period`]: UTC [`Day`] and [`Month`], [`Period`].
//! - [`record`]: [`UsageRecord`] and its parts.
//! - [`totals`]: [`Totals`], requests, tokens and cost added up.
//! - [`aggregates`]: [`Aggregates`] per period, dimension, org and key, with the deltas a
//!   shared store has not taken yet.
//! - [`recent`]: [`RecentRecords`], the last records, for request lookup, each kept
//!   packed into one small allocation (the private `packed` module).
//! - [`history`]: [`MinuteHistory`], the last hour per minute.
//! - [`limits`]: SPEC 12's caller limits: [`Limits`], the GCRA [`Rate`], budgets and
//!   their [`LimitBook`] of reservations.
//! - [`error`]: the crate error, [`LedgerError`].

pub mod aggregates;
pub mod error;
pub mod history;
pub mod limits;
mod packed;
pub mod period;
pub mod price;
pub mod recent;
pub mod record;
pub mod totals;

pub use aggregates::{AggregateKey, Aggregates, Dimension, MAX_MODELS, OTHER_MODELS, keys_of};
pub use error::LedgerError;
pub use history::{Minute, MinuteHistory};
pub use limits::{
    Ask, Budget, LimitBook, LimitKind, Limits, Rate, Refusal, Reservation, Spend, SpendEntry,
    SpendKey, Who, worst_case,
};
pub use period::{Day, Month, Period};
pub use price::{
    DEFAULT_PRICES_DATE, DEFAULT_PRICES_SOURCE, ModelGlob, NANO_PER_USD, NanoUsd, PerMillion,
    PriceRule, PriceTable, Prices, Usd, default_rules,
};
pub use recent::{RecentRecords, RecordFilter, StatusFilter};
pub use record::{AttemptRecord, CallerKind, CallerRef, CostBasis, ModelRouting, UsageRecord};
pub use totals::Totals;
