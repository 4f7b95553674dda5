//! [`Totals`]: requests, tokens and cost added up.

use serde::{Deserialize, Serialize};

use crate::price::NanoUsd;
use crate::record::{CostBasis, UsageRecord};

/// What a set of requests added up to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Requests.
    pub requests: u64,
    /// Requests whose client got an error status (4xx, 5xx, or none at all).
    pub errors: u64,
    /// `input_tokens`.
    pub input_tokens: u64,
    /// `output_tokens`.
    pub output_tokens: u64,
    /// `cache_creation_input_tokens`.
    pub cache_creation_input_tokens: u64,
    /// `cache_read_input_tokens`.
    pub cache_read_input_tokens: u64,
    /// The cost, nano-USD (API prices and list-price equivalents together).
    pub cost_nano_usd: NanoUsd,
    /// The part of `cost_nano_usd` that is the list-price equivalent of subscription
    /// (OAuth) accounts, which are not billed per token.
    pub list_price_equivalent_nano_usd: NanoUsd,
    /// Requests whose model had no price (counted at 0).
    pub unpriced: u64,
}

impl Totals {
    /// One record's contribution.
    pub fn of(record: &UsageRecord) -> Self {
        let u = &record.usage;
        Self {
            requests: 1,
            errors: u64::from(record.is_error()),
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cache_creation_input_tokens: u.cache_creation_input_tokens,
            cache_read_input_tokens: u.cache_read_input_tokens,
            cost_nano_usd: record.cost_nano_usd,
            list_price_equivalent_nano_usd: if record.cost_basis == CostBasis::ListPriceEquivalent {
                record.cost_nano_usd
            } else {
                0
            },
            unpriced: u64::from(record.cost_basis == CostBasis::Unpriced && u.total() > 0),
        }
    }

    /// Adds `other` (saturating).
    pub fn add(&mut self, other: &Totals) {
        for (mine, theirs) in self.fields_mut().into_iter().zip(other.fields()) {
            *mine = mine.saturating_add(theirs);
        }
    }

    /// All four token kinds.
    pub fn tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_creation_input_tokens)
            .saturating_add(self.cache_read_input_tokens)
    }

    /// The fields, in [`Totals::FIELDS`] order.
    pub fn fields(&self) -> [u64; 9] {
        [
            self.requests,
            self.errors,
            self.input_tokens,
            self.output_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
            self.cost_nano_usd,
            self.list_price_equivalent_nano_usd,
            self.unpriced,
        ]
    }

    fn fields_mut(&mut self) -> [&mut u64; 9] {
        [
            &mut self.requests,
            &mut self.errors,
            &mut self.input_tokens,
            &mut self.output_tokens,
            &mut self.cache_creation_input_tokens,
            &mut self.cache_read_input_tokens,
            &mut self.cost_nano_usd,
            &mut self.list_price_equivalent_nano_usd,
            &mut self.unpriced,
        ]
    }

    /// The field names, as the admin API and a shared store write them.
    pub const FIELDS: [&'static str; 9] = [
        "requests",
        "errors",
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "cost_nano_usd",
        "list_price_equivalent_nano_usd",
        "unpriced",
    ];

    /// Totals from `(field name, value)` pairs (unknown names are ignored).
    pub fn from_fields<'a>(pairs: impl IntoIterator<Item = (&'a str, u64)>) -> Self {
        let mut t = Self::default();
        for (name, value) in pairs {
            if let Some(i) = Self::FIELDS.iter().position(|f| *f == name) {
                *t.fields_mut()[i] = value;
            }
        }
        t
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.fields().iter().all(|&v| v == 0)
    }
}
