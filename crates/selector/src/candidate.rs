//! Candidate accounts and the snapshot order.

use std::cmp::Ordering;
use std::sync::Arc;

use keypool_core::{AccountId, AuthType, Provider, UnixMs};

/// The lowest weight an account can have (`weighted` strategy).
pub const MIN_WEIGHT: u8 = 1;
/// The highest weight an account can have (`weighted` strategy).
pub const MAX_WEIGHT: u8 = 100;

/// One account as the selector sees it: only what choosing needs, no secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The account's id.
    pub id: AccountId,
    /// Its provider (decides the response format; hedge partners must match).
    pub provider: Provider,
    /// Its auth type (decides the headers; hedge partners must match).
    pub auth: AuthType,
    /// Its upstream base URL; `None` is the provider's default. Two `None`s are the same
    /// URL.
    pub base_url: Option<Arc<str>>,
    /// Lower goes first.
    pub priority: i32,
    /// `1..=100`; values outside are clamped into that range by the `weighted` strategy.
    pub weight: u8,
    /// When the account last served a request (unix ms; `0` = never).
    pub last_used: UnixMs,
    /// `false` once disabled; the filter drops it.
    pub active: bool,
    /// The account's place in the snapshot's stable rotation order (`priority` asc,
    /// `id` asc), set by [`sort_snapshot`]. `round_robin` rotates over this order rather
    /// than over the snapshot order, whose `last_used` part changes with every request:
    /// rotating a list that was just re-sorted by `last_used` would not rotate.
    pub rotation_rank: u32,
}

impl Candidate {
    /// An active account with priority 0, weight 1, never used, no `base_url`.
    pub fn new(id: impl Into<AccountId>, provider: Provider, auth: AuthType) -> Self {
        Self {
            id: id.into(),
            provider,
            auth,
            base_url: None,
            priority: 0,
            weight: MIN_WEIGHT,
            last_used: 0,
            active: true,
            rotation_rank: 0,
        }
    }

    /// The weight clamped into `1..=100`.
    pub fn clamped_weight(&self) -> u8 {
        self.weight.clamp(MIN_WEIGHT, MAX_WEIGHT)
    }

    /// Whether `other` may run beside `self` in a hedge or race (SPEC 4): same provider,
    /// same auth type, different `base_url` (strict string equality; two absent URLs are
    /// the same URL).
    pub fn can_pair_with(&self, other: &Candidate) -> bool {
        self.provider == other.provider
            && self.auth == other.auth
            && self.base_url.as_deref() != other.base_url.as_deref()
    }
}

/// The snapshot order: `priority` asc, then `last_used` asc, then `id` asc.
pub fn snapshot_order(a: &Candidate, b: &Candidate) -> Ordering {
    a.priority
        .cmp(&b.priority)
        .then(a.last_used.cmp(&b.last_used))
        .then_with(|| a.id.cmp(&b.id))
}

/// Sorts candidates into the snapshot order ([`snapshot_order`]) and numbers them in
/// the stable rotation order (`priority` asc, `id` asc, [`Candidate::rotation_rank`]).
/// The planner takes the snapshot as given, so call this once when the snapshot is
/// captured.
pub fn sort_snapshot(candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| a.priority.cmp(&b.priority).then_with(|| a.id.cmp(&b.id)));
    for (rank, c) in candidates.iter_mut().enumerate() {
        c.rotation_rank = u32::try_from(rank).unwrap_or(u32::MAX);
    }
    candidates.sort_by(snapshot_order);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: &str, priority: i32, last_used: UnixMs) -> Candidate {
        Candidate {
            priority,
            last_used,
            ..Candidate::new(id, Provider::Anthropic, AuthType::ApiKey)
        }
    }

    #[test]
    fn snapshot_sorts_by_priority_then_last_used_then_id() {
        let mut v = vec![
            cand("c", 1, 5),
            cand("b", 0, 9),
            cand("a", 0, 9),
            cand("d", 0, 1),
            cand("e", -1, 100),
        ];
        sort_snapshot(&mut v);
        let ids: Vec<&str> = v.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["e", "d", "a", "b", "c"]);
    }

    #[test]
    fn pairing_needs_same_provider_and_auth_and_another_url() {
        let base = Candidate::new("a", Provider::Anthropic, AuthType::OAuth);
        let same_url = Candidate::new("b", Provider::Anthropic, AuthType::OAuth);
        assert!(
            !base.can_pair_with(&same_url),
            "two absent base_urls are one URL"
        );
        let other_url = Candidate {
            base_url: Some("https://x".into()),
            ..same_url.clone()
        };
        assert!(base.can_pair_with(&other_url));
        let other_auth = Candidate {
            auth: AuthType::ApiKey,
            ..other_url.clone()
        };
        assert!(!base.can_pair_with(&other_auth));
        let other_provider = Candidate {
            provider: Provider::AnthropicCompatible,
            ..other_url.clone()
        };
        assert!(!base.can_pair_with(&other_provider));
        let a = Candidate {
            base_url: Some("https://x".into()),
            ..base.clone()
        };
        let b = Candidate {
            base_url: Some("https://x/".into()),
            ..base
        };
        assert!(
            a.can_pair_with(&b),
            "strict string equality, no normalisation"
        );
        assert!(!a.can_pair_with(&other_url), "same string is the same URL");
    }

    #[test]
    fn weight_is_clamped() {
        let mut c = Candidate::new("a", Provider::Anthropic, AuthType::ApiKey);
        c.weight = 0;
        assert_eq!(c.clamped_weight(), 1);
        c.weight = 250;
        assert_eq!(c.clamped_weight(), 100);
    }
}
