//! The selector's [`Availability`] over the store's health books (SPEC 3.5).
//!
//! Usage windows come from [`WindowBook::out_of_window`](keypool_cooldown::WindowBook)
//! with each account's own `window_threshold` (else the default); cooldowns from the
//! cooldown book; the 5-hour reset `reset_aware` orders by from the window book too.
//!
//! **Decision: an API-key request limit is a cooldown, not a window.** The window book
//! also reports `anthropic-ratelimit-requests-remaining: 0` as
//! [`UsageLimit::Requests`]. SPEC 3.5.2's immediate `429` names a subscription window
//! (`5h` or `weekly`), and a request limit resets within about a minute, so this adapter
//! reports it as "cooling until the reset": the account leaves rotation until then like
//! any cooling account, and when every account is cooling the earliest one is still
//! tried (the last resort of SPEC 3.5.3) instead of refusing the request outright.
//!
//! **Model scope (SPEC 16).** An availability is for one request's model: a family's
//! weekly window ([`UsageLimit::FamilyWeekly`]) keeps an account out of requests of that
//! family only (as a window: when every account is out, the immediate `429` names
//! `weekly (opus)`), and a model lockout keeps it out of requests for that model only
//! (as a cooldown: when every account is cooling or locked, the earliest is still
//! tried).
//!
//! **The request path reads signals, not the books.** With a snapshot's signals
//! ([`HealthAvailability::with_signals`]) the planner's per-account question is two
//! atomic loads ([`keypool_cooldown::CooldownSignal`],
//! [`keypool_cooldown::WindowSignal`], exact for the account's own threshold); only a
//! blocked account is looked up in the books, for the details of its block. At 1,000
//! accounts this replaced three hash lookups per account and request.

use keypool_cooldown::{PoolHealth, UsageLimit};
use keypool_core::{AccountId, ModelFamily, UnixMs};
use keypool_selector::{AccountStatus, Availability, Candidate, WindowBlock};
use keypool_store::CandidateSignals;
use keypool_store::config::Config;

/// Window and cooldown facts of the live books, for one request.
#[derive(Debug, Clone, Copy)]
pub struct HealthAvailability<'a> {
    health: &'a PoolHealth,
    config: &'a Config,
    signals: &'a [CandidateSignals],
    /// The request's model (empty: no model, no lockout applies) and its family.
    model: &'a str,
    family: Option<ModelFamily>,
}

impl<'a> HealthAvailability<'a> {
    /// Reads `health`, with per-account window thresholds from `config`.
    pub fn new(health: &'a PoolHealth, config: &'a Config) -> Self {
        Self {
            health,
            config,
            signals: &[],
            model: "",
            family: None,
        }
    }

    /// Answers for a request of `model`: its family's weekly window and its lockouts
    /// count (SPEC 16).
    pub fn for_model(mut self, model: &'a str) -> Self {
        self.model = model;
        self.family = ModelFamily::of(model);
        self
    }

    /// The request's model family.
    pub fn family(&self) -> Option<ModelFamily> {
        self.family
    }

    /// Answers [`Availability::status_of`] from the signals of the snapshot being
    /// planned (`signals[i]` belongs to the snapshot's candidate `i`).
    pub fn with_signals(mut self, signals: &'a [CandidateSignals]) -> Self {
        self.signals = signals;
        self
    }

    fn facts(&self, id: &AccountId, now: UnixMs) -> (Option<WindowBlock>, Option<UnixMs>) {
        let threshold = self
            .config
            .account(id.as_str())
            .and_then(|a| a.window_threshold())
            .map(|t| t.get());
        let mut cooldown = self.health.cooldowns.cooldown_until(id, now);
        if !self.model.is_empty()
            && let Some(locked) = self.health.lockouts.locked_until(id, self.model, now)
        {
            cooldown = Some(cooldown.map_or(locked, |c| c.max(locked)));
        }
        match self.health.windows.out_for(id, self.family, threshold, now) {
            Some(out) => match out.limit {
                UsageLimit::Window(window) => (Some(WindowBlock::new(window, out.until)), cooldown),
                UsageLimit::FamilyWeekly(family) => (
                    Some(WindowBlock {
                        family: Some(family),
                        ..WindowBlock::new(keypool_core::Window::Weekly, out.until)
                    }),
                    cooldown,
                ),
                UsageLimit::Requests => {
                    (None, Some(cooldown.map_or(out.until, |c| c.max(out.until))))
                }
            },
            None => (None, cooldown),
        }
    }
}

impl HealthAvailability<'_> {
    /// The books' answer, for an account whose signal says it is blocked (or without
    /// signals): out of the planner's loop.
    #[cold]
    #[inline(never)]
    fn status_cold(&self, id: &AccountId, now: UnixMs) -> AccountStatus {
        self.status(id, now)
    }
}

impl Availability for HealthAvailability<'_> {
    fn window_block(&self, id: &AccountId, now: UnixMs) -> Option<WindowBlock> {
        self.facts(id, now).0
    }

    fn cooldown_until(&self, id: &AccountId, now: UnixMs) -> Option<UnixMs> {
        self.facts(id, now).1
    }

    /// The 5-hour reset from the account's latest rate-limit headers, while in the
    /// future (read by `reset_aware`).
    fn five_hour_reset(&self, id: &AccountId, now: UnixMs) -> Option<UnixMs> {
        self.health
            .windows
            .state(id)
            .and_then(|state| state.info.five_hour.reset)
            .filter(|&reset| reset > now)
    }

    fn status(&self, id: &AccountId, now: UnixMs) -> AccountStatus {
        match self.facts(id, now) {
            (Some(block), _) if block.until > now => AccountStatus::OutOfWindow(block),
            (_, Some(until)) if until > now => AccountStatus::CoolingUntil(until),
            _ => AccountStatus::Available,
        }
    }

    #[inline]
    fn status_of(&self, index: usize, candidate: &Candidate, now: UnixMs) -> AccountStatus {
        match self.signals.get(index) {
            Some(signals) if !signals.blocked(now) => AccountStatus::Available,
            _ => self.status_cold(&candidate.id, now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keypool_cooldown::facts::{RateLimitInfo, UnifiedStatus, WindowUsage};
    use keypool_cooldown::{AttemptFailure, classify};
    use keypool_core::Window;

    const NOW: UnixMs = 1_800_000_000_000;

    fn config() -> Config {
        let toml = r#"
            [server]
            state_file = ""
            [[orgs]]
            slug = "acme"
            [[accounts]]
            id = "strict"
            org = "acme"
            provider = "anthropic"
            auth = "oauth"
            secret = "s1"
            window_threshold = 0.5
            [[accounts]]
            id = "plain"
            org = "acme"
            provider = "anthropic"
            auth = "api_key"
            secret = "s2"
        "#;
        Config::from_toml_str(toml, None, &|_| None).unwrap()
    }

    fn five_hour(utilization: f64, reset: UnixMs) -> RateLimitInfo {
        RateLimitInfo {
            five_hour: WindowUsage {
                utilization: Some(utilization),
                reset: Some(reset),
                status: Some(UnifiedStatus::Allowed),
            },
            ..RateLimitInfo::default()
        }
    }

    #[test]
    fn per_account_threshold_decides_the_window() {
        let config = config();
        let health = PoolHealth::new(config.cooldown().clone());
        let (strict, plain) = (AccountId::from("strict"), AccountId::from("plain"));
        let reset = NOW + 3_600_000;
        health.windows.observe(&strict, &five_hour(0.6, reset), NOW);
        health.windows.observe(&plain, &five_hour(0.6, reset), NOW);
        let av = HealthAvailability::new(&health, &config);
        assert_eq!(
            av.status(&strict, NOW),
            AccountStatus::OutOfWindow(WindowBlock::new(Window::FiveHour, reset))
        );
        // 0.6 is under the default 0.95.
        assert_eq!(av.status(&plain, NOW), AccountStatus::Available);
        // reset_aware reads the 5-hour reset, only while it is ahead.
        assert_eq!(av.five_hour_reset(&plain, NOW), Some(reset));
        assert_eq!(av.five_hour_reset(&plain, reset), None);
        // Back exactly at the reset, without any request.
        assert_eq!(av.status(&strict, reset), AccountStatus::Available);
    }

    #[test]
    fn a_request_limit_is_reported_as_a_cooldown() {
        let config = config();
        let health = PoolHealth::new(config.cooldown().clone());
        let plain = AccountId::from("plain");
        let info = RateLimitInfo {
            requests_remaining: Some(0),
            requests_reset: Some(NOW + 20_000),
            ..RateLimitInfo::default()
        };
        health.windows.observe(&plain, &info, NOW);
        let av = HealthAvailability::new(&health, &config);
        assert_eq!(av.window_block(&plain, NOW), None);
        assert_eq!(
            av.status(&plain, NOW),
            AccountStatus::CoolingUntil(NOW + 20_000)
        );
        // A longer cooldown of the same account wins.
        let rl = RateLimitInfo {
            retry_after_ms: Some(60_000),
            ..RateLimitInfo::default()
        };
        let failure = AttemptFailure::Status {
            status: http::StatusCode::TOO_MANY_REQUESTS,
            rate_limit: &rl,
            marks: Default::default(),
        };
        health
            .cooldowns
            .record_failure(&plain, &classify(&failure, NOW), NOW, 2, NOW);
        assert_eq!(
            av.status(&plain, NOW),
            AccountStatus::CoolingUntil(NOW + 60_000)
        );
        assert_eq!(av.status(&plain, NOW + 60_000), AccountStatus::Available);
    }

    /// SPEC 16 through the request's availability: a family's weekly window is a window
    /// for that family only, a model lockout a cooldown for that model only; the
    /// snapshot's signals say "look" and the books answer exactly.
    #[test]
    fn family_windows_and_lockouts_are_scoped_to_the_request() {
        use keypool_cooldown::facts::FamilyWeekly;
        let config = config();
        let health = PoolHealth::new(config.cooldown().clone());
        let (strict, plain) = (AccountId::from("strict"), AccountId::from("plain"));
        let info = RateLimitInfo {
            families: FamilyWeekly {
                opus: WindowUsage {
                    utilization: Some(1.0),
                    reset: Some(NOW + 3_600_000),
                    status: Some(UnifiedStatus::Rejected),
                },
                ..FamilyWeekly::default()
            },
            ..RateLimitInfo::default()
        };
        health.windows.observe(&strict, &info, NOW);
        health.lockouts.lock(&plain, "claude-sonnet-4-5", NOW, NOW);
        let signals = signals_of(&health, &config, &[&strict, &plain]);
        let base = HealthAvailability::new(&health, &config).with_signals(&signals);
        let candidate = |id: &AccountId| {
            Candidate::new(
                id.clone(),
                keypool_core::Provider::Anthropic,
                keypool_core::AuthType::OAuth,
            )
        };
        let opus = base.for_model("claude-opus-4-5");
        assert_eq!(
            opus.status_of(0, &candidate(&strict), NOW),
            AccountStatus::OutOfWindow(WindowBlock {
                family: Some(ModelFamily::Opus),
                ..WindowBlock::new(Window::Weekly, NOW + 3_600_000)
            })
        );
        assert_eq!(
            opus.status_of(1, &candidate(&plain), NOW),
            AccountStatus::Available
        );
        let sonnet = base.for_model("claude-sonnet-4-5");
        assert_eq!(
            sonnet.status_of(0, &candidate(&strict), NOW),
            AccountStatus::Available
        );
        assert_eq!(
            sonnet.status_of(1, &candidate(&plain), NOW),
            AccountStatus::CoolingUntil(NOW + 600_000)
        );
        // a request without a model (count_tokens of no family) sees neither
        assert_eq!(
            base.status_of(0, &candidate(&strict), NOW),
            AccountStatus::Available
        );
        assert_eq!(
            base.status_of(1, &candidate(&plain), NOW),
            AccountStatus::Available
        );
    }

    fn signals_of(
        health: &PoolHealth,
        config: &Config,
        ids: &[&AccountId],
    ) -> Vec<CandidateSignals> {
        ids.iter()
            .map(|id| {
                let account = config.account(id.as_str()).expect("a configured account");
                CandidateSignals {
                    cooldown: health.cooldowns.signal(id),
                    lockout: health.lockouts.signal(id),
                    window: health
                        .windows
                        .signal_with_threshold(id, account.window_threshold().map(|t| t.get())),
                    account: account.clone(),
                }
            })
            .collect()
    }

    proptest::proptest! {
        /// Answering from the snapshot's signals gives exactly the books' answer, for
        /// signals resolved before any state existed, whatever the headers and
        /// failures, at any later moment.
        #[test]
        fn signals_answer_as_the_books_do(
            u5 in proptest::option::of(0.0f64..1.0), r5 in 0u64..7_200_000,
            rejected in proptest::bool::ANY, remaining in proptest::option::of(0u64..2),
            retry in proptest::option::of(1u64..600_000),
            which in 0usize..2,
            probes in proptest::collection::vec(0u64..8_000_000, 4),
        ) {
            let config = config();
            let health = PoolHealth::new(config.cooldown().clone());
            let ids = [AccountId::from("strict"), AccountId::from("plain")];
            let signals = signals_of(&health, &config, &[&ids[0], &ids[1]]);
            let info = RateLimitInfo {
                five_hour: WindowUsage { utilization: u5, reset: Some(NOW + r5), status: None },
                unified_status: rejected.then_some(UnifiedStatus::Rejected),
                unified_reset: Some(NOW + r5 / 2),
                requests_remaining: remaining,
                requests_reset: Some(NOW + 30_000),
                ..RateLimitInfo::default()
            };
            health.windows.observe(&ids[which], &info, NOW);
            if let Some(ms) = retry {
                let rl = RateLimitInfo { retry_after_ms: Some(ms), ..RateLimitInfo::default() };
                let failure = AttemptFailure::Status {
                    status: http::StatusCode::TOO_MANY_REQUESTS,
                    rate_limit: &rl,
                    marks: Default::default(),
                };
                health.cooldowns.record_failure(&ids[1 - which], &classify(&failure, NOW), NOW, 2, NOW);
            }
            let books = HealthAvailability::new(&health, &config);
            let fast = books.with_signals(&signals);
            for t in probes.iter().map(|p| NOW + p) {
                for (i, id) in ids.iter().enumerate() {
                    let candidate = Candidate::new(id.clone(), keypool_core::Provider::Anthropic, keypool_core::AuthType::OAuth);
                    proptest::prop_assert_eq!(fast.status_of(i, &candidate, t), books.status(id, t));
                }
            }
        }
    }
}
