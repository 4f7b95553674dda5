//! Model prices and the cost of an answer (SPEC 11), in integer nano-USD.
//!
//! A [`PriceTable`] is a list of [`PriceRule`]s, each a [`ModelGlob`] and the four
//! per-token-kind prices; the first rule whose glob matches the served model prices it
//! (the operator's `[[prices]]` first, then keypool's [`default_rules`]). Prices are
//! kept as nano-USD per million tokens, so every price given with up to nine decimals
//! is exact, and a cost is one integer division of an exact sum.

use keypool_core::Usage;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::LedgerError;

/// An amount in billionths of a US dollar.
pub type NanoUsd = u64;

/// Nano-USD in one USD.
pub const NANO_PER_USD: u64 = 1_000_000_000;

/// Nano-USD written as a decimal USD amount with nine decimals (`12.400000000`): exact,
/// for logs, the admin API and CSV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usd(pub NanoUsd);

impl std::fmt::Display for Usd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:09}", self.0 / NANO_PER_USD, self.0 % NANO_PER_USD)
    }
}

/// Where the default prices come from, for the docs and the admin API.
pub const DEFAULT_PRICES_SOURCE: &str =
    "https://platform.claude.com/docs/en/about-claude/pricing and the model overview pages";

/// When the default prices were read from their source.
pub const DEFAULT_PRICES_DATE: &str = "2026-12-01";

/// A model-id pattern: `*` matches any run of characters (none included), `?` any one
/// character, every other character itself (case-sensitive, as model ids are).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ModelGlob {
    pattern: Box<str>,
    /// The length of the literal prefix when the pattern is `prefix*` (the usual shape,
    /// matched with one comparison), found once here rather than per request.
    prefix: Option<usize>,
}

impl ModelGlob {
    /// A glob for `pattern`.
    ///
    /// # Errors
    /// [`LedgerError::InvalidGlob`] for an empty pattern or one with whitespace or
    /// control characters (model ids have neither).
    pub fn try_new(pattern: &str) -> Result<Self, LedgerError> {
        if pattern.is_empty() || pattern.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(LedgerError::InvalidGlob(pattern.to_owned()));
        }
        let prefix = pattern
            .strip_suffix('*')
            .filter(|p| !p.contains(['*', '?']))
            .map(str::len);
        Ok(Self {
            pattern: pattern.into(),
            prefix,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether `model` matches.
    pub fn matches(&self, model: &str) -> bool {
        match self.prefix {
            Some(n) => model.as_bytes().starts_with(&self.pattern.as_bytes()[..n]),
            None => keypool_core::glob_match(&self.pattern, model),
        }
    }
}

impl TryFrom<String> for ModelGlob {
    type Error = LedgerError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::try_new(&value)
    }
}

impl From<ModelGlob> for String {
    fn from(glob: ModelGlob) -> Self {
        glob.pattern.into()
    }
}

/// A price per million tokens, kept as nano-USD per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PerMillion(pub u64);

impl PerMillion {
    /// The most a price per million tokens may be ($1,000,000: far above any model).
    pub const MAX_USD: f64 = 1_000_000.0;

    /// `usd` USD per million tokens, rounded to the nano-USD.
    ///
    /// # Errors
    /// [`LedgerError::InvalidPrice`] when `usd` is not a finite number in
    /// `0..=1,000,000`.
    pub fn try_from_usd(usd: f64) -> Result<Self, LedgerError> {
        if !usd.is_finite() || !(0.0..=Self::MAX_USD).contains(&usd) {
            return Err(LedgerError::InvalidPrice(usd));
        }
        Ok(Self((usd * NANO_PER_USD as f64).round() as u64))
    }

    /// The price in USD per million tokens (for display).
    pub fn usd(self) -> f64 {
        self.0 as f64 / NANO_PER_USD as f64
    }
}

/// The four prices of a model: per million input, output, cache-write and cache-read
/// tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prices {
    /// `input_tokens`.
    pub input: PerMillion,
    /// `output_tokens`.
    pub output: PerMillion,
    /// `cache_creation_input_tokens` (the 5-minute cache write, Anthropic's default).
    pub cache_write: PerMillion,
    /// `cache_read_input_tokens`.
    pub cache_read: PerMillion,
}

impl Prices {
    /// The cost of `usage` at these prices, rounded to the nearest nano-USD (halves up),
    /// saturating at `u64::MAX`.
    pub fn cost(&self, usage: &Usage) -> NanoUsd {
        let part = |tokens: u64, price: PerMillion| u128::from(tokens) * u128::from(price.0);
        let exact = part(usage.input_tokens, self.input)
            + part(usage.output_tokens, self.output)
            + part(usage.cache_creation_input_tokens, self.cache_write)
            + part(usage.cache_read_input_tokens, self.cache_read);
        let nano = (exact + 500_000) / 1_000_000;
        u64::try_from(nano).unwrap_or(u64::MAX)
    }
}

/// A model glob and its prices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceRule {
    /// The models it prices.
    pub glob: ModelGlob,
    /// Their prices.
    pub prices: Prices,
}

/// The prices keypool uses: the first rule whose glob matches the model.
///
/// A model's rule is found by walking the rules once, then remembered (at most
/// [`PRICE_CACHE_MODELS`] models; beyond, the walk is done every time): every
/// request prices its model, and the walk over the default rules was ~570
/// instructions (`docs/BENCHMARKS.md`).
#[derive(Debug, Default)]
pub struct PriceTable {
    rules: Vec<PriceRule>,
    /// How many of `rules` (the first ones) the operator wrote.
    operator: usize,
    /// Model → index of its rule (`None`: no rule matches).
    found: std::sync::RwLock<HashMap<Box<str>, Option<usize>, foldhash::fast::RandomState>>,
    /// This table's number in the process (each thread remembers the last model it
    /// priced per table number, see [`PriceTable::prices_for`]).
    id: u64,
}

/// The next [`PriceTable`]'s number.
fn next_table_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

thread_local! {
    /// The last model this thread priced: the table's number, the model, its rule.
    static LAST_PRICED: std::cell::RefCell<(u64, String, Option<usize>)> =
        const { std::cell::RefCell::new((0, String::new(), None)) };
}

/// The most models a [`PriceTable`] remembers the rule of.
pub const PRICE_CACHE_MODELS: usize = 1024;

impl Clone for PriceTable {
    fn clone(&self) -> Self {
        Self {
            rules: self.rules.clone(),
            operator: self.operator,
            found: std::sync::RwLock::default(),
            id: next_table_id(),
        }
    }
}

impl PartialEq for PriceTable {
    fn eq(&self, other: &Self) -> bool {
        self.rules == other.rules && self.operator == other.operator
    }
}

impl Eq for PriceTable {}

impl PriceTable {
    /// The operator's `rules` first, then [`default_rules`].
    pub fn with_defaults(rules: Vec<PriceRule>) -> Self {
        let operator = rules.len();
        let mut rules = rules;
        rules.extend(default_rules());
        Self {
            rules,
            operator,
            found: std::sync::RwLock::default(),
            id: next_table_id(),
        }
    }

    /// Only `rules` (no defaults).
    pub fn only(rules: Vec<PriceRule>) -> Self {
        let operator = rules.len();
        Self {
            rules,
            operator,
            found: std::sync::RwLock::default(),
            id: next_table_id(),
        }
    }

    /// Every rule in the order they are tried, and whether the operator wrote it.
    pub fn rules(&self) -> impl Iterator<Item = (&PriceRule, bool)> {
        self.rules
            .iter()
            .enumerate()
            .map(|(i, r)| (r, i < self.operator))
    }

    /// The prices of `model`, if any rule matches it.
    pub fn prices_for(&self, model: &str) -> Option<&Prices> {
        // Most requests of a thread ask for the model its last request asked for: that
        // costs a string compare here instead of the shared map's read lock (an atomic
        // write to a cache line both workers take turns to own).
        let last = LAST_PRICED
            .with_borrow(|(id, last, index)| (*id == self.id && last == model).then_some(*index));
        let index = match last {
            Some(index) => index,
            None => {
                let index = self.rule_of(model);
                LAST_PRICED.with_borrow_mut(|(id, last, found)| {
                    *id = self.id;
                    last.clear();
                    last.push_str(model);
                    *found = index;
                });
                index
            }
        };
        index.map(|i| &self.rules[i].prices)
    }

    /// The index of `model`'s rule: remembered in the shared map, else found.
    fn rule_of(&self, model: &str) -> Option<usize> {
        use std::sync::PoisonError;
        let known = self
            .found
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(model)
            .copied();
        match known {
            Some(index) => index,
            None => {
                let index = self.rules.iter().position(|r| r.glob.matches(model));
                let mut found = self.found.write().unwrap_or_else(PoisonError::into_inner);
                if found.len() < PRICE_CACHE_MODELS {
                    found.insert(Box::from(model), index);
                }
                index
            }
        }
    }

    /// The cost of `usage` on `model`; `None` when the model has no price.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<NanoUsd> {
        self.prices_for(model).map(|p| p.cost(usage))
    }
}

/// keypool's default prices for the Claude models ([`DEFAULT_PRICES_SOURCE`], read on
/// [`DEFAULT_PRICES_DATE`]): USD per million input, output, 5-minute cache-write and
/// cache-read tokens, most specific pattern first. Tiered prices (Haiku 5.5 above
/// 100,000 prompt tokens, 1-hour cache writes, batch and regional rates) are not
/// modelled: write `[[prices]]` for them.
const DEFAULTS: &[(&str, [f64; 4])] = &[
    ("claude-fable-5-1*", [10.0, 50.0, 12.5, 0.25]),
    ("claude-mythos-5-1*", [10.0, 50.0, 12.5, 0.25]),
    ("claude-fable-5*", [10.0, 50.0, 12.5, 1.0]),
    ("claude-mythos-5*", [10.0, 50.0, 12.5, 1.0]),
    ("claude-opus-5-5*", [4.0, 20.0, 5.0, 0.2]),
    ("claude-opus-5*", [5.0, 25.0, 6.25, 0.5]),
    ("claude-opus-4-8*", [5.0, 25.0, 6.25, 0.5]),
    ("claude-opus-4-7*", [5.0, 25.0, 6.25, 0.5]),
    ("claude-opus-4-6*", [5.0, 25.0, 6.25, 0.5]),
    ("claude-opus-4-5*", [5.0, 25.0, 6.25, 0.5]),
    ("claude-opus-4*", [15.0, 75.0, 18.75, 1.5]),
    ("claude-sonnet-5*", [2.0, 10.0, 2.5, 0.2]),
    ("claude-sonnet-4*", [3.0, 15.0, 3.75, 0.3]),
    ("claude-3-7-sonnet*", [3.0, 15.0, 3.75, 0.3]),
    ("claude-3-5-sonnet*", [3.0, 15.0, 3.75, 0.3]),
    ("claude-haiku-5-5*", [0.1, 0.5, 0.125, 0.01]),
    ("claude-haiku-4*", [1.0, 5.0, 1.25, 0.1]),
    ("claude-3-5-haiku*", [0.8, 4.0, 1.0, 0.08]),
    ("claude-3-haiku*", [0.25, 1.25, 0.3, 0.03]),
    ("claude-3-opus*", [15.0, 75.0, 18.75, 1.5]),
];

/// [`DEFAULTS`] as rules.
pub fn default_rules() -> Vec<PriceRule> {
    DEFAULTS
        .iter()
        .filter_map(|(glob, [input, output, write, read])| {
            let p = |usd: f64| PerMillion::try_from_usd(usd).ok();
            Some(PriceRule {
                glob: ModelGlob::try_new(glob).ok()?,
                prices: Prices {
                    input: p(*input)?,
                    output: p(*output)?,
                    cache_write: p(*write)?,
                    cache_read: p(*read)?,
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn usage(input: u64, output: u64, write: u64, read: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cache_creation_input_tokens: write,
            cache_read_input_tokens: read,
        }
    }

    #[test]
    fn every_default_rule_is_valid_and_tried_most_specific_first() {
        assert_eq!(default_rules().len(), DEFAULTS.len());
        let table = PriceTable::with_defaults(Vec::new());
        let input = |model: &str| table.prices_for(model).map(|p| p.input.usd());
        assert_eq!(input("claude-opus-4-1-20250805"), Some(15.0));
        assert_eq!(input("claude-opus-4-5-20251101"), Some(5.0));
        assert_eq!(input("claude-opus-5-5"), Some(4.0));
        assert_eq!(input("claude-opus-5"), Some(5.0));
        assert_eq!(input("claude-sonnet-4-5-20250929"), Some(3.0));
        assert_eq!(input("claude-sonnet-5-5"), Some(2.0));
        assert_eq!(input("claude-haiku-4-5"), Some(1.0));
        assert_eq!(input("claude-3-5-haiku-20241022"), Some(0.8));
        assert_eq!(input("claude-fable-5-1"), Some(10.0));
        assert_eq!(input("gpt-4o"), None);
    }

    #[test]
    fn each_table_prices_by_its_own_rules_when_one_thread_alternates_tables() {
        // The thread remembers the last model it priced: the memo must be per table
        // (a config reload builds a new table; a clone is a new table too).
        let defaults = PriceTable::with_defaults(Vec::new());
        let none = PriceTable::only(Vec::new());
        let copy = defaults.clone();
        for _ in 0..3 {
            assert_eq!(
                defaults
                    .prices_for("claude-haiku-4-5")
                    .map(|p| p.input.usd()),
                Some(1.0)
            );
            assert_eq!(none.prices_for("claude-haiku-4-5"), None);
            assert_eq!(
                copy.prices_for("claude-haiku-4-5").map(|p| p.input.usd()),
                Some(1.0)
            );
            assert_eq!(defaults.prices_for("gpt-4o"), None);
        }
    }

    #[test]
    fn costs_are_exact_in_nano_usd() {
        let table = PriceTable::with_defaults(Vec::new());
        // Sonnet 4.5: $3 in, $15 out, $3.75 write, $0.30 read per million.
        let cost = table
            .cost(
                "claude-sonnet-4-5",
                &usage(1_000_000, 1_000_000, 1_000_000, 1_000_000),
            )
            .unwrap();
        assert_eq!(cost, 22_050_000_000);
        // 25 input + 15 output tokens: 25 × 3,000 + 15 × 15,000 nano.
        assert_eq!(
            table.cost("claude-sonnet-4-5", &usage(25, 15, 0, 0)),
            Some(300_000)
        );
        // A third of a nano rounds down, two thirds up; halves up.
        let third = Prices {
            input: PerMillion(333_333),
            ..Prices::default()
        };
        assert_eq!(third.cost(&usage(1, 0, 0, 0)), 0);
        assert_eq!(third.cost(&usage(2, 0, 0, 0)), 1);
        let half = Prices {
            input: PerMillion(500_000),
            ..Prices::default()
        };
        assert_eq!(half.cost(&usage(1, 0, 0, 0)), 1);
        assert_eq!(table.cost("unknown-model", &usage(1, 1, 1, 1)), None);
    }

    #[test]
    fn operator_rules_come_first() {
        let mine = PriceRule {
            glob: ModelGlob::try_new("claude-sonnet-4-5*").unwrap(),
            prices: Prices {
                input: PerMillion::try_from_usd(1.5).unwrap(),
                ..Prices::default()
            },
        };
        let table = PriceTable::with_defaults(vec![mine]);
        assert_eq!(
            table.prices_for("claude-sonnet-4-5").map(|p| p.input.usd()),
            Some(1.5)
        );
        assert_eq!(
            table.prices_for("claude-sonnet-4-0").map(|p| p.input.usd()),
            Some(3.0)
        );
        let flags: Vec<bool> = table
            .rules()
            .map(|(_, operator)| operator)
            .take(2)
            .collect();
        assert_eq!(flags, [true, false]);
    }

    #[test]
    fn usd_is_written_exactly() {
        assert_eq!(Usd(0).to_string(), "0.000000000");
        assert_eq!(Usd(12_400_000_000).to_string(), "12.400000000");
        assert_eq!(Usd(1).to_string(), "0.000000001");
    }

    #[test]
    fn globs() {
        let g = |p: &str| ModelGlob::try_new(p).unwrap();
        assert!(g("claude-*").matches("claude-sonnet-4-5"));
        assert!(g("*").matches(""));
        assert!(g("claude-?-haiku*").matches("claude-3-haiku-2024"));
        assert!(!g("claude-?-haiku*").matches("claude-35-haiku"));
        assert!(g("*sonnet*").matches("claude-sonnet-4"));
        assert!(g("a*b*c").matches("axxbyyc"));
        assert!(!g("a*b*c").matches("axxbyy"));
        assert!(g("exact").matches("exact"));
        assert!(!g("exact").matches("exact-not"));
        assert!(ModelGlob::try_new("").is_err());
        assert!(ModelGlob::try_new("two words").is_err());
        assert!(PerMillion::try_from_usd(-1.0).is_err());
        assert!(PerMillion::try_from_usd(f64::NAN).is_err());
        assert_eq!(
            PerMillion::try_from_usd(0.3).unwrap(),
            PerMillion(300_000_000)
        );
    }

    /// A reference matcher: the regular-expression reading of the glob, by recursion.
    fn reference(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) => reference(&p[1..], t) || (!t.is_empty() && reference(p, &t[1..])),
            (Some(b'?'), Some(_)) => reference(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => reference(&p[1..], &t[1..]),
            _ => false,
        }
    }

    proptest! {
        #[test]
        fn glob_matching_agrees_with_the_reference(p in "[ab*?]{1,8}", t in "[ab]{0,10}") {
            let glob = ModelGlob::try_new(&p).unwrap();
            prop_assert_eq!(glob.matches(&t), reference(p.as_bytes(), t.as_bytes()));
        }

        /// A cost is the exact sum rounded once: never more than half a nano-USD off.
        #[test]
        fn costs_are_the_exact_sum_rounded_once(
            prices in proptest::array::uniform4(0u64..200_000_000_000),
            tokens in proptest::array::uniform4(0u64..10_000_000),
        ) {
            let p = Prices {
                input: PerMillion(prices[0]),
                output: PerMillion(prices[1]),
                cache_write: PerMillion(prices[2]),
                cache_read: PerMillion(prices[3]),
            };
            let u = usage(tokens[0], tokens[1], tokens[2], tokens[3]);
            let exact: u128 = tokens.iter().zip(prices).map(|(&t, p)| u128::from(t) * u128::from(p)).sum();
            let cost = u128::from(p.cost(&u));
            prop_assert!((cost * 1_000_000).abs_diff(exact) <= 500_000);
        }
    }
}
