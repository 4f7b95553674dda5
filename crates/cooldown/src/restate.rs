//! Status restatement (SPEC 16): `[[restate]]` rules that rewrite an upstream's status
//! before classification, for third-party Anthropic-compatible gateways that report a
//! temporary quota with the wrong status (a `403` that says "quota exceeded" is a rate
//! limit, not a dead key).
//!
//! A rule applies to an error answer when all of these hold: its `account` glob
//! matches the account id (if given), its `base_url` glob matches the account's base URL
//! (if given), the status is one of `from_statuses`, the body contains one of `markers`
//! (ASCII case ignored; no markers = any body), and the body contains none of
//! `exclude_markers`. The first rule that applies wins: the status becomes
//! `to_status`, and `retry_after_ms` (if given) replaces the answer's own wait, so that a
//! restated `429` cools the account exactly that long.
//!
//! ```
//! use keypool_cooldown::{RestateRule, Restatement, restate};
//!
//! let rule = RestateRule {
//!     base_url: Some("https://gw.example.com*".into()),
//!     from_statuses: vec![403],
//!     markers: vec!["quota exceeded".into()],
//!     exclude_markers: vec!["banned".into()],
//!     to_status: 429,
//!     retry_after_ms: Some(120_000),
//!     ..RestateRule::default()
//! };
//! let rules = [rule.normalized()];
//! let quota = br#"{"error":{"message":"Daily Quota Exceeded"}}"#;
//! assert_eq!(
//!     restate(&rules, "acct", "https://gw.example.com/v1", 403, quota),
//!     Some(Restatement { rule: 0, status: 429, retry_after_ms: Some(120_000) })
//! );
//! assert_eq!(restate(&rules, "acct", "https://gw.example.com/v1", 403, b"quota exceeded: banned"), None);
//! assert_eq!(restate(&rules, "acct", "https://api.anthropic.com", 403, quota), None);
//! ```

use keypool_core::glob_match;
use serde::{Deserialize, Serialize};

/// One `[[restate]]` rule, as configured (validated by the store's config loader).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RestateRule {
    /// Glob over the account id (`*`, `?`); `None` = any account.
    pub account: Option<String>,
    /// Glob over the account's base URL; `None` = any. An account without a `base_url`
    /// is matched as the empty string.
    pub base_url: Option<String>,
    /// The upstream statuses the rule rewrites (non-2xx).
    pub from_statuses: Vec<u16>,
    /// Texts of which the body must contain one (ASCII case ignored); empty = any body.
    pub markers: Vec<String>,
    /// Texts none of which the body may contain.
    pub exclude_markers: Vec<String>,
    /// The status classification then sees (and a terminal pass-through answers with).
    pub to_status: u16,
    /// The wait the restated answer asks for, ms (replaces `retry-after`).
    pub retry_after_ms: Option<u64>,
}

impl RestateRule {
    /// The rule with its markers in lower case, as [`restate`] compares them.
    pub fn normalized(mut self) -> Self {
        for m in self.markers.iter_mut().chain(&mut self.exclude_markers) {
            m.make_ascii_lowercase();
        }
        self
    }

    fn applies(&self, account: &str, base_url: &str, status: u16, body: &str) -> bool {
        self.from_statuses.contains(&status)
            && self
                .account
                .as_deref()
                .is_none_or(|g| glob_match(g, account))
            && self
                .base_url
                .as_deref()
                .is_none_or(|g| glob_match(g, base_url))
            && (self.markers.is_empty() || self.markers.iter().any(|m| body.contains(m.as_str())))
            && !self
                .exclude_markers
                .iter()
                .any(|m| body.contains(m.as_str()))
    }
}

/// What a rule made of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restatement {
    /// The index of the rule that applied.
    pub rule: usize,
    /// The status to classify instead.
    pub status: u16,
    /// The wait to use instead of the answer's own, if the rule sets one.
    pub retry_after_ms: Option<u64>,
}

/// The first of `rules` (already [`RestateRule::normalized`]) that applies to an error
/// answer of `status` with `body` from `account` at `base_url`; `None` when none does
/// (the answer is classified as it came).
pub fn restate(
    rules: &[RestateRule],
    account: &str,
    base_url: &str,
    status: u16,
    body: &[u8],
) -> Option<Restatement> {
    if rules.is_empty() || !rules.iter().any(|r| r.from_statuses.contains(&status)) {
        return None;
    }
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    rules
        .iter()
        .position(|r| r.applies(account, base_url, status, &text))
        .map(|rule| Restatement {
            rule,
            status: rules[rule].to_status,
            retry_after_ms: rules[rule].retry_after_ms,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rule() -> RestateRule {
        RestateRule {
            account: Some("gw-*".into()),
            from_statuses: vec![403, 402],
            markers: vec!["Quota".into(), "limit reached".into()],
            exclude_markers: vec!["Suspended".into()],
            to_status: 429,
            retry_after_ms: Some(30_000),
            ..RestateRule::default()
        }
        .normalized()
    }

    #[test]
    fn first_matching_rule_wins_and_every_condition_counts() {
        let catch_all = RestateRule {
            from_statuses: vec![403],
            to_status: 503,
            ..RestateRule::default()
        };
        let rules = [rule(), catch_all];
        let hit = |account, status, body: &str| {
            restate(&rules, account, "", status, body.as_bytes()).map(|r| (r.rule, r.status))
        };
        assert_eq!(hit("gw-1", 403, "QUOTA exceeded"), Some((0, 429)));
        assert_eq!(hit("gw-1", 402, "daily limit reached"), Some((0, 429)));
        // excluded marker: the first rule does not apply, the catch-all does
        assert_eq!(hit("gw-1", 403, "quota: account suspended"), Some((1, 503)));
        // no marker: first rule out
        assert_eq!(hit("gw-1", 403, "forbidden"), Some((1, 503)));
        // other account: first rule out
        assert_eq!(hit("anthropic-1", 403, "quota"), Some((1, 503)));
        // status in no rule
        assert_eq!(hit("gw-1", 401, "quota"), None);
        assert_eq!(restate(&[], "gw-1", "", 403, b"quota"), None);
    }

    proptest! {
        /// Restatement is exactly the rule's conditions: a rule applies iff the status is
        /// listed, some marker is in the body (case ignored), and no excluded one is.
        #[test]
        fn matching_is_the_conditions(
            status in prop::sample::select(vec![401u16, 402, 403, 429, 500]),
            words in proptest::collection::vec(prop::sample::select(vec!["quota", "LIMIT reached", "suspended", "hello"]), 0..4),
        ) {
            let body = words.join(" ");
            let lower = body.to_ascii_lowercase();
            let expected = [403u16, 402].contains(&status)
                && (lower.contains("quota") || lower.contains("limit reached"))
                && !lower.contains("suspended");
            let got = restate(&[rule()], "gw-7", "https://x", status, body.as_bytes());
            prop_assert_eq!(got.is_some(), expected);
            if let Some(r) = got {
                prop_assert_eq!((r.status, r.retry_after_ms), (429, Some(30_000)));
            }
        }
    }
}
