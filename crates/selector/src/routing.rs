//! Model routing rules (seeds 003 and 004; issue 24): an alias or a plain model maps to a
//! chain of models tried in order when the earlier ones have no available account, with
//! an optional sticky canary split of the first choice.
//!
//! [`ModelChain::order`] is pure: the caller's stable id (its LB key id, or the body's
//! `metadata.user_id`) is hashed into `0..sum(weights)`, and the model whose weight band
//! holds it goes first; the rest of the chain follows in its written order. The same
//! caller always lands on the same side.
//!
//! ```
//! use keypool_selector::ModelChain;
//! let chain = ModelChain::new(
//!     Some("auto:high".into()),
//!     vec!["claude-opus-4-5".into(), "claude-sonnet-4-5".into()],
//!     None,
//! );
//! assert_eq!(chain.order("alice"), ["claude-opus-4-5", "claude-sonnet-4-5"]);
//! ```

use std::hash::Hasher;
use std::sync::Arc;

/// One routing rule: the models a request is tried with, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelChain {
    /// The alias the request named (`auto:high`), or `None` for a plain model's
    /// fallback chain.
    pub alias: Option<Arc<str>>,
    /// The models, first choice first.
    pub models: Vec<Arc<str>>,
    /// Canary weights, one per model (validated: same length, sum > 0).
    pub weights: Option<Vec<u32>>,
}

impl ModelChain {
    /// A chain of `models` (not empty) under `alias`, with optional `weights`.
    pub fn new(alias: Option<Arc<str>>, models: Vec<Arc<str>>, weights: Option<Vec<u32>>) -> Self {
        Self {
            alias,
            models,
            weights,
        }
    }

    /// The models to try for a caller of stable id `caller`: the canary's pick first
    /// (by weight band of the caller's hash), then the others in chain order.
    pub fn order(&self, caller: &str) -> Vec<&str> {
        let first = self.canary_index(caller);
        let mut out = Vec::with_capacity(self.models.len());
        out.push(&*self.models[first]);
        out.extend(
            self.models
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != first)
                .map(|(_, m)| &**m),
        );
        out
    }

    /// The index of the model the canary sends `caller` to first (0 without weights).
    pub fn canary_index(&self, caller: &str) -> usize {
        let Some(weights) = self
            .weights
            .as_ref()
            .filter(|w| w.len() == self.models.len())
        else {
            return 0;
        };
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        if total == 0 {
            return 0;
        }
        let point = stable_hash(caller) % total;
        let mut upto = 0u64;
        for (i, &w) in weights.iter().enumerate() {
            upto += u64::from(w);
            if point < upto {
                return i;
            }
        }
        0
    }
}

/// A hash of `id` that is the same in every process and release (the crate's fixed
/// multiply-fold hasher), so a caller's canary side does not change with a restart or
/// between replicas.
fn stable_hash(id: &str) -> u64 {
    let mut h = crate::hash::IdHasher::default();
    h.write(id.as_bytes());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chain(weights: Option<Vec<u32>>) -> ModelChain {
        ModelChain::new(
            Some("auto:high".into()),
            vec!["opus".into(), "sonnet".into(), "haiku".into()],
            weights,
        )
    }

    /// A [90, 10] canary over 1,000 callers splits within statistical bounds (a binomial
    /// of n = 1,000, p = 0.1 lies in 60..=140 with probability far above 1 − 10⁻⁶), and
    /// every caller always lands on the same side.
    #[test]
    fn a_90_10_canary_splits_1000_callers_and_is_sticky() {
        let c = ModelChain::new(
            None,
            vec!["stable".into(), "canary".into()],
            Some(vec![90, 10]),
        );
        let canary = (0..1000)
            .filter(|i| c.order(&format!("caller-{i}"))[0] == "canary")
            .count();
        assert!(
            (60..=140).contains(&canary),
            "{canary} of 1000 on the canary"
        );
        for i in 0..1000 {
            let id = format!("caller-{i}");
            assert_eq!(c.order(&id), c.order(&id), "{id} moved");
        }
    }

    #[test]
    fn without_weights_the_chain_is_its_order() {
        assert_eq!(chain(None).order("x"), ["opus", "sonnet", "haiku"]);
        assert_eq!(
            chain(Some(vec![0, 0, 1])).order("x"),
            ["haiku", "opus", "sonnet"]
        );
    }

    proptest! {
        /// The order is always a permutation of the chain whose tail keeps the chain's
        /// order, and the first model is one with a weight above 0.
        #[test]
        fn the_order_is_a_permutation(caller in "\\PC{0,20}", w in proptest::collection::vec(0u32..5, 3)) {
            prop_assume!(w.iter().any(|&x| x > 0));
            let c = chain(Some(w.clone()));
            let order = c.order(&caller);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, vec!["haiku", "opus", "sonnet"]);
            let first = c.canary_index(&caller);
            prop_assert!(w[first] > 0);
            let rest: Vec<&str> = c.models.iter().enumerate().filter(|(i, _)| *i != first).map(|(_, m)| &**m).collect();
            prop_assert_eq!(&order[1..], &rest[..]);
        }
    }
}
