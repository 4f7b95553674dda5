//! [`UsageRecord`]: what one authenticated request did (SPEC 11).

use std::borrow::Cow;
use std::sync::Arc;

use keypool_core::{AccountId, UnixMs, Usage};
use serde::{Deserialize, Serialize};

use crate::price::NanoUsd;

/// Which kind of LB key called (SPEC 1: `user_api_key_id` or `client_api_key_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallerKind {
    /// A person's key.
    User,
    /// A service's key.
    Client,
}

impl CallerKind {
    /// `user` or `client`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Client => "client",
        }
    }
}

/// The caller of a request: its key's kind and id (never the key).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CallerRef {
    /// `user` or `client`.
    pub kind: CallerKind,
    /// The key id of the configuration.
    pub id: Arc<str>,
}

/// How a record's cost was priced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostBasis {
    /// An API-key account: the cost is what the provider bills.
    Api,
    /// A subscription (OAuth) account: the API list price of the same tokens, which
    /// the subscription does not bill per token.
    ListPriceEquivalent,
    /// The model has no price: the cost is 0.
    Unpriced,
}

/// One upstream attempt of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The account it went to.
    pub account: AccountId,
    /// The upstream's status, when it answered with one.
    pub status: Option<u16>,
    /// What it came to: `ok`, the failure's trigger (`rate_limited`, `overloaded`,
    /// `timeout`, `reset`, …), `aborted` (a hedge/race loser), `breaker_open`,
    /// `local_failure`.
    pub outcome: Cow<'static, str>,
    /// The failure class (`key_error`, `rate_limit`, `transient`), for a failure.
    pub class: Option<Cow<'static, str>>,
    /// How long it ran, ms (to its answer, its failure, or its abort).
    pub ms: u64,
}

/// What one authenticated request did: who called, which account served, what it cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// The request id (`x-request-id`).
    pub request_id: Arc<str>,
    /// When the request arrived, unix ms.
    pub at: UnixMs,
    /// The org.
    pub org: Arc<str>,
    /// The URL config.
    pub url: Arc<str>,
    /// The caller.
    pub caller: CallerRef,
    /// `messages` or `count_tokens`.
    pub endpoint: Cow<'static, str>,
    /// The model the request asked for (`None` when its body was refused).
    pub model: Option<Arc<str>>,
    /// The model sent upstream (the serving account's `model` override, the model a
    /// `[[models]]` rule chose, or the one asked).
    pub model_sent: Option<Arc<str>>,
    /// How a `[[models]]` rule routed the request (its alias and the chain position
    /// that served), when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<ModelRouting>,
    /// Whether the request streamed.
    pub stream: bool,
    /// The status the client got.
    pub status: u16,
    /// The account that served the answer, if one did.
    pub account: Option<AccountId>,
    /// Every upstream attempt, in order.
    pub attempts: Vec<AttemptRecord>,
    /// The tokens of the answer (what a stream cut short had reported so far).
    pub usage: Usage,
    /// The cost, nano-USD.
    pub cost_nano_usd: NanoUsd,
    /// How the cost was priced.
    pub cost_basis: CostBasis,
    /// Time to first token, ms, when an answer started.
    pub ttft_ms: Option<u64>,
    /// Time from arrival to the end of the answer, ms.
    pub total_ms: u64,
    /// How a committed stream ended (`completed`, `upstream_failed`, `idle_timeout`,
    /// `client_gone`).
    pub stream_end: Option<Cow<'static, str>>,
    /// The caller limit that refused the request (SPEC 12), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<crate::limits::LimitKind>,
}

/// How a `[[models]]` rule (issue 24) routed one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRouting {
    /// The alias the request named (`auto:high`); `None` for a plain model's fallback.
    pub alias: Option<Arc<str>>,
    /// The position in the chain (as tried for this caller) of the model that served:
    /// 0 = the first choice, above 0 = a fallback.
    pub position: u32,
}

impl UsageRecord {
    /// The model the usage is counted under: the one sent upstream, else the one asked.
    pub fn counted_model(&self) -> Option<&Arc<str>> {
        self.model_sent.as_ref().or(self.model.as_ref())
    }

    /// Whether the client got an error.
    pub fn is_error(&self) -> bool {
        self.status >= 400 || self.status < 100
    }
}
