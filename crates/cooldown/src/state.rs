//! [`PoolHealth`]: every book together, one config reload, one export/import.
//!
//! This is what the store mirrors to Redis and snapshots to the local state file. All
//! times in a [`HealthExport`] are absolute unix ms, so a reload at a later `now` keeps
//! exactly the remaining time of every entry (SPEC 6: a 4-hour window cooldown with 3
//! hours left comes back with 3 hours left).
//!
//! ```
//! use keypool_cooldown::{Classification, FailureClass, PoolHealth, Trigger};
//! use keypool_core::AccountId;
//!
//! let health = PoolHealth::default();
//! let a = AccountId::from("a");
//! let window = Classification {
//!     class: FailureClass::RateLimit,
//!     trigger: Trigger::WindowExhausted { reset: 4 * 3_600_000 },
//! };
//! health.cooldowns.record_failure(&a, &window, 0, 10, 1);
//! let json = serde_json::to_string(&health.export(3_600_000)).unwrap();
//!
//! let restored = PoolHealth::default();
//! restored.import(serde_json::from_str(&json).unwrap(), 3_600_000);
//! assert_eq!(restored.cooldowns.cooldown_until(&a, 3_600_000), Some(4 * 3_600_000));
//! ```

use keypool_core::{AccountId, UnixMs};
use serde::{Deserialize, Serialize};

use crate::breaker::{BreakerOutcome, CircuitBreakers};
use crate::classify::{Classification, FailureClass, Trigger};
use crate::config::CooldownConfig;
use crate::cooldown::{CooldownBook, CooldownCorrection, CooldownEntry, CooldownRecord};
use crate::disabled::disable_reason;
use crate::disabled::{DisabledBook, DisabledRecord, Terminal};
use crate::facts::ResetCorrection;
use crate::lockout::{LockoutBook, LockoutRecord};
use crate::window::{WindowBook, WindowRecord, WindowState};

/// The serialisable state of a [`PoolHealth`]. The circuit breakers are not part of it:
/// their state is per replica and lives at most `open_ms`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthExport {
    /// When the export was taken, unix ms (informational; import uses its own `now`).
    pub exported_at: UnixMs,
    /// Cooldown entries.
    pub cooldowns: Vec<CooldownRecord>,
    /// Disabled accounts.
    pub disabled: Vec<DisabledRecord>,
    /// Usage-window states.
    pub windows: Vec<WindowRecord>,
    /// Model lockouts (SPEC 16).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lockouts: Vec<LockoutRecord>,
}

/// What [`PoolHealth::import`] took, and the persisted times it bounded (for the
/// store to log: an older keypool may have persisted a far-future reset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportCounts {
    /// Cooldown entries kept.
    pub cooldowns: usize,
    /// Disabled accounts kept.
    pub disabled: usize,
    /// Window states kept.
    pub windows: usize,
    /// Model lockouts kept.
    pub lockouts: usize,
    /// Window resets bounded ([`WindowBook::import`]).
    pub corrected_resets: Vec<(AccountId, ResetCorrection)>,
    /// Cooldown expiries clamped ([`CooldownBook::import`]).
    pub corrected_cooldowns: Vec<(AccountId, CooldownCorrection)>,
}

/// What [`PoolHealth::clear_windows`] removed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClearedWindows {
    /// The account's window state.
    pub state: Option<WindowState>,
    /// Its cooldown, when a window had set it (trigger `window_exhausted`).
    pub cooldown: Option<CooldownEntry>,
}

/// The attempt whose outcome is being recorded.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    /// The account that was tried.
    pub account: &'a AccountId,
    /// Its `base_url` (the empty string when it has none), for the circuit breaker.
    pub base_url: &'a str,
    /// When the attempt started, unix ms (herd protection).
    pub started_at: UnixMs,
    /// How many accounts the request's snapshot held (the plain-429 row).
    pub snapshot_len: usize,
    /// The model the attempt asked for (the body's `model`, after any per-account
    /// override; empty when unknown): a `404 not_found_error` locks it on the account.
    pub model: &'a str,
}

/// What [`PoolHealth::record_failure`] did to the account.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailureEffect {
    /// The account's cooldown expiry afterwards, if it is cooling at `now`.
    pub cooldown_until: Option<UnixMs>,
    /// Whether the account is disabled afterwards.
    pub disabled: bool,
    /// The terminal state this failure put the account in (`None` when it was already
    /// in one, or stays in rotation).
    pub terminal: Option<Terminal>,
    /// The model lockout this failure set or extended, unix ms.
    pub locked_until: Option<UnixMs>,
}

/// The health of a pool's accounts: cooldowns, disabled accounts, usage windows and the
/// per-`base_url` circuit breakers. Thread-safe; share it in an `Arc`.
#[derive(Debug, Default)]
pub struct PoolHealth {
    /// Cooldowns and backoff.
    pub cooldowns: CooldownBook,
    /// Disabled accounts.
    pub disabled: DisabledBook,
    /// Usage windows.
    pub windows: WindowBook,
    /// Circuit breakers.
    pub breakers: CircuitBreakers,
    /// Model lockouts (SPEC 16).
    pub lockouts: LockoutBook,
}

impl PoolHealth {
    /// Empty books with `config`.
    pub fn new(config: CooldownConfig) -> Self {
        Self {
            disabled: DisabledBook::new(&config),
            windows: WindowBook::new(&config),
            breakers: CircuitBreakers::new(&config),
            lockouts: LockoutBook::new(config.clone()),
            cooldowns: CooldownBook::new(config),
        }
    }

    /// Changes so far of any cooldown or window signal (the sum of both books'
    /// `signal_epoch`): what a cache of results computed from the signals is keyed on.
    pub fn signal_epoch(&self) -> u64 {
        self.cooldowns
            .signal_epoch()
            .wrapping_add(self.windows.signal_epoch())
            .wrapping_add(self.lockouts.signal_epoch())
    }

    /// Hands a reloaded config to every book. State is kept.
    pub fn set_config(&self, config: CooldownConfig) {
        self.disabled.set_config(&config);
        self.windows.set_config(&config);
        self.breakers.set_config(&config);
        self.lockouts.set_config(config.clone());
        self.cooldowns.set_config(config);
    }

    /// Applies one failed attempt to every book: a `key_error` puts the account in its
    /// terminal state ([`Classification::terminal`], when `auto_disable_on_error` is on),
    /// a `403` without a ban marker cools it `forbidden_ms` and bans it as the
    /// `ban_after_forbidden`-th of a streak, a `404 not_found_error` locks the attempt's
    /// model on it, every other class goes to the cooldown book (request errors change
    /// nothing there), and the outcome is counted by the `base_url`'s breaker. Window
    /// headers are recorded separately with [`WindowBook::observe`], for successes too.
    pub fn record_failure(
        &self,
        attempt: &Attempt<'_>,
        classification: &Classification,
        now: UnixMs,
    ) -> FailureEffect {
        let account = attempt.account;
        let cooldown_until = self.cooldowns.record_failure(
            account,
            classification,
            attempt.started_at,
            attempt.snapshot_len,
            now,
        );
        let terminal = match classification.trigger {
            Trigger::Forbidden => {
                let streak = self.cooldowns.forbidden_streak(account);
                let limit = self.cooldowns.config().settings().ban_after_forbidden;
                (streak >= limit).then_some(Terminal::Banned)
            }
            _ if classification.class == FailureClass::KeyError => classification.terminal(),
            _ => None,
        };
        let was = self.disabled.is_disabled(account);
        let disabled = match terminal {
            Some(state) => {
                let reason = terminal_reason(
                    state,
                    classification,
                    self.cooldowns.forbidden_streak(account),
                );
                self.disabled.disable_as(account, state, reason, now)
            }
            None => was,
        };
        let locked_until = (classification.trigger == Trigger::ModelNotFound
            && !attempt.model.is_empty())
        .then(|| {
            self.lockouts
                .lock(account, attempt.model, attempt.started_at, now)
        });
        self.breakers.record(
            attempt.base_url,
            BreakerOutcome::of(Some(classification)),
            now,
        );
        FailureEffect {
            cooldown_until,
            disabled,
            terminal: terminal.filter(|_| disabled && !was),
            locked_until,
        }
    }

    /// Applies one successful attempt: resets the account's failure count, backoff
    /// level and 403 streak, halves the failure count of its lockout for the model,
    /// and counts a success for its breaker.
    pub fn record_success(&self, attempt: &Attempt<'_>, now: UnixMs) {
        self.cooldowns.record_success(attempt.account, now);
        self.lockouts
            .record_success(attempt.account, attempt.model, now);
        self.breakers
            .record(attempt.base_url, BreakerOutcome::Success, now);
    }

    /// The operator's "clear windows": forgets the account's window state and a
    /// cooldown that a window set (trigger `window_exhausted`), so that the account is
    /// back in service at once. Any other cooldown stays. Returns what was removed.
    pub fn clear_windows(&self, account: &AccountId) -> ClearedWindows {
        ClearedWindows {
            state: self.windows.clear(account),
            cooldown: self.cooldowns.clear_if(account, |e| {
                matches!(e.trigger, Trigger::WindowExhausted { .. })
            }),
        }
    }

    /// Every book's state with absolute times.
    pub fn export(&self, now: UnixMs) -> HealthExport {
        HealthExport {
            exported_at: now,
            cooldowns: self.cooldowns.export(),
            disabled: self.disabled.export(),
            windows: self.windows.export(),
            lockouts: self.lockouts.export(),
        }
    }

    /// Loads an export at `now`: unexpired cooldowns and windows keep their absolute
    /// expiry, expired ones are dropped, disabled accounts are all kept. Resets and
    /// expiries beyond what keypool would set at `now` are bounded and reported.
    pub fn import(&self, export: HealthExport, now: UnixMs) -> ImportCounts {
        let cooldowns = self.cooldowns.import(export.cooldowns, now);
        let windows = self.windows.import(export.windows, now);
        ImportCounts {
            cooldowns: cooldowns.taken,
            disabled: self.disabled.import(export.disabled),
            windows: windows.taken,
            lockouts: self.lockouts.import(export.lockouts, now),
            corrected_resets: windows.corrected,
            corrected_cooldowns: cooldowns.corrected,
        }
    }
}

/// The operator-facing reason of a terminal state: the classification's own reason
/// (`key_error: upstream answered 402 (payment_required)`), and for a ban by streak,
/// which 403 it was.
fn terminal_reason(state: Terminal, classification: &Classification, streak: u32) -> String {
    let base = disable_reason(classification);
    match (state, classification.trigger) {
        (Terminal::Banned, Trigger::Forbidden) => {
            format!("{base}: the {streak} consecutive 403s of the account")
        }
        _ => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{AttemptFailure, TransportFailure, classify};
    use crate::config::CooldownSettings;
    use crate::facts::{RateLimitInfo, UnifiedStatus, WindowUsage};
    use crate::window::UsageLimit;
    use http::StatusCode;
    use keypool_core::Window;

    const NOW: UnixMs = 1_700_000_000_000;
    const H: u64 = 3_600_000;

    fn status(code: u16, info: &RateLimitInfo) -> Classification {
        let status = StatusCode::from_u16(code).unwrap();
        classify(
            &AttemptFailure::Status {
                status,
                rate_limit: info,
                marks: Default::default(),
            },
            NOW,
        )
    }

    fn attempt(account: &AccountId) -> Attempt<'_> {
        Attempt {
            account,
            base_url: "",
            started_at: NOW - 10,
            snapshot_len: 20,
            model: "claude-opus-4-5",
        }
    }

    /// The SPEC 6 class table, through the one entry point the proxy calls.
    #[test]
    fn class_table_through_pool_health() {
        let none = RateLimitInfo::default();
        let health = PoolHealth::default();
        // key_error: disabled with reason and time, no cooldown.
        let k = AccountId::from("k");
        let effect = health.record_failure(&attempt(&k), &status(401, &none), NOW);
        assert_eq!(
            effect,
            FailureEffect {
                cooldown_until: None,
                disabled: true,
                terminal: Some(crate::Terminal::Disabled),
                locked_until: None,
            }
        );
        let d = health.disabled.get(&k).unwrap();
        assert_eq!(
            (d.reason.as_str(), d.at),
            ("key_error: upstream answered 401 (auth_rejected)", NOW)
        );
        // rate_limit: cooldown set by the trigger.
        let r = AccountId::from("r");
        let effect = health.record_failure(&attempt(&r), &status(429, &none), NOW);
        assert_eq!(
            effect,
            FailureEffect {
                cooldown_until: Some(NOW + 60_000),
                ..FailureEffect::default()
            }
        );
        // transient: none the first time, short backoff after.
        let t = AccountId::from("t");
        let c = classify(&AttemptFailure::Transport(TransportFailure::Timeout), NOW);
        assert_eq!(
            health.record_failure(&attempt(&t), &c, NOW),
            FailureEffect::default()
        );
        let second = Attempt {
            started_at: NOW + 1,
            ..attempt(&t)
        };
        assert_eq!(
            health.record_failure(&second, &c, NOW + 2).cooldown_until,
            Some(NOW + 2 + 5_000)
        );
        health.record_success(&second, NOW + 3);
        assert_eq!(health.cooldowns.entry(&t).unwrap().backoff_level, 0);
    }

    fn forbidden(marks: crate::BodyMarks) -> Classification {
        classify(
            &AttemptFailure::Status {
                status: StatusCode::FORBIDDEN,
                rate_limit: &RateLimitInfo::default(),
                marks,
            },
            NOW,
        )
    }

    /// SPEC 6/16: the 1st and 2nd consecutive 403 are a 60 s cooldown, the 3rd bans;
    /// a ban marker bans at once; a 402 is credits_exhausted; a 404 not_found_error
    /// locks the model only.
    #[test]
    fn the_403_streak_ban_markers_credits_and_model_lockout() {
        let health = PoolHealth::default();
        let f = AccountId::from("f");
        let mut at = NOW;
        for n in 1..=2 {
            let effect = health.record_failure(
                &Attempt {
                    started_at: at,
                    ..attempt(&f)
                },
                &forbidden(Default::default()),
                at + 1,
            );
            assert_eq!(effect.cooldown_until, Some(at + 1 + 60_000), "403 #{n}");
            assert!(!effect.disabled);
            at += 61_000;
        }
        let effect = health.record_failure(
            &Attempt {
                started_at: at,
                ..attempt(&f)
            },
            &forbidden(Default::default()),
            at + 1,
        );
        assert_eq!(effect.terminal, Some(Terminal::Banned));
        let d = health.disabled.get(&f).unwrap();
        assert_eq!(d.state, Terminal::Banned);
        assert_eq!(
            d.reason,
            "key_error: upstream answered 403 (forbidden): the 3 consecutive 403s of the account"
        );

        // a success in between ends the streak
        let g = AccountId::from("g");
        for _ in 0..2 {
            at += 61_000;
            health.record_failure(
                &Attempt {
                    started_at: at,
                    ..attempt(&g)
                },
                &forbidden(Default::default()),
                at + 1,
            );
        }
        health.record_success(&attempt(&g), at + 2);
        at += 61_000;
        let effect = health.record_failure(
            &Attempt {
                started_at: at,
                ..attempt(&g)
            },
            &forbidden(Default::default()),
            at + 1,
        );
        assert!(!effect.disabled);
        assert_eq!(health.cooldowns.forbidden_streak(&g), 1);

        let b = AccountId::from("b");
        let ban = crate::BodyMarks {
            ban: true,
            ..Default::default()
        };
        let effect = health.record_failure(&attempt(&b), &forbidden(ban), NOW);
        assert_eq!(
            (effect.terminal, effect.cooldown_until),
            (Some(Terminal::Banned), None)
        );

        let c = AccountId::from("c");
        health.record_failure(&attempt(&c), &status(402, &RateLimitInfo::default()), NOW);
        assert_eq!(
            health.disabled.get(&c).unwrap().state,
            Terminal::CreditsExhausted
        );

        let m = AccountId::from("m");
        let nf = classify(
            &AttemptFailure::Status {
                status: StatusCode::NOT_FOUND,
                rate_limit: &RateLimitInfo::default(),
                marks: crate::BodyMarks {
                    not_found: true,
                    ..Default::default()
                },
            },
            NOW,
        );
        let effect = health.record_failure(&attempt(&m), &nf, NOW);
        assert_eq!(effect.locked_until, Some(NOW + 600_000));
        assert_eq!(effect.cooldown_until, None);
        assert_eq!(
            health.lockouts.locked_until(&m, "claude-opus-4-5", NOW),
            Some(NOW + 600_000)
        );
        assert_eq!(
            health.lockouts.locked_until(&m, "claude-sonnet-4-5", NOW),
            None
        );
        // persisted and loaded back with its end
        let json = serde_json::to_string(&health.export(NOW)).unwrap();
        let restored = PoolHealth::default();
        let counts = restored.import(serde_json::from_str(&json).unwrap(), NOW + 1);
        assert_eq!((counts.lockouts, counts.disabled), (1, 3));
        assert_eq!(
            restored
                .lockouts
                .locked_until(&m, "claude-opus-4-5", NOW + 1),
            Some(NOW + 600_000)
        );
        assert_eq!(restored.disabled.get(&f).unwrap().state, Terminal::Banned);
    }

    proptest::proptest! {
        /// The 403 streak as a state machine: an account is banned exactly when
        /// `ban_after_forbidden` fresh 403s came with no other outcome in between;
        /// every 403 before that is a 60 s cooldown.
        #[test]
        fn the_403_streak_state_machine(steps in proptest::collection::vec(0u8..4, 1..30)) {
            let health = PoolHealth::default();
            let a = AccountId::from("a");
            let mut at = NOW;
            let mut streak = 0u32;
            let mut banned = false;
            for step in steps {
                at += 100_000;
                let att = Attempt { started_at: at, ..attempt(&a) };
                match step {
                    0 | 1 => {
                        let effect = health.record_failure(&att, &forbidden(Default::default()), at + 1);
                        streak += 1;
                        if !banned {
                            proptest::prop_assert_eq!(effect.cooldown_until, Some(at + 1 + 60_000));
                        }
                        if streak >= 3 && !banned {
                            proptest::prop_assert_eq!(effect.terminal, Some(Terminal::Banned));
                            banned = true;
                        } else {
                            proptest::prop_assert_eq!(effect.terminal, None);
                        }
                    }
                    2 => {
                        health.record_success(&att, at + 1);
                        streak = 0;
                    }
                    _ => {
                        let c = status(429, &RateLimitInfo::default());
                        health.record_failure(&att, &c, at + 1);
                        streak = 0;
                    }
                }
                proptest::prop_assert_eq!(health.disabled.is_disabled(&a), banned);
            }
        }
    }

    #[test]
    fn auto_disable_off_keeps_key_errors_in_rotation() {
        let off = CooldownSettings {
            auto_disable_on_error: false,
            ..Default::default()
        };
        let health = PoolHealth::new(CooldownConfig::try_new(off).unwrap());
        let k = AccountId::from("k");
        let effect =
            health.record_failure(&attempt(&k), &status(401, &RateLimitInfo::default()), NOW);
        assert_eq!(effect, FailureEffect::default());
        assert!(!health.disabled.is_disabled(&k));
        // nor banned by a streak of 403s (each still cools the account)
        for n in 0..4u64 {
            let at = NOW + n * 100_000;
            let effect = health.record_failure(
                &Attempt {
                    started_at: at,
                    ..attempt(&k)
                },
                &status(403, &RateLimitInfo::default()),
                at + 1,
            );
            assert_eq!(effect.cooldown_until, Some(at + 1 + 60_000));
            assert!(!effect.disabled);
        }
    }

    #[test]
    fn export_import_of_every_book_at_a_later_now() {
        let health = PoolHealth::default();
        let (w, p, d) = (
            AccountId::from("w"),
            AccountId::from("p"),
            AccountId::from("d"),
        );
        let rejected = RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            unified_reset: Some(NOW + 4 * H),
            seven_day: WindowUsage {
                utilization: Some(0.99),
                reset: Some(NOW + 48 * H),
                status: None,
            },
            ..Default::default()
        };
        health.windows.observe(&w, &rejected, NOW);
        health.record_failure(&attempt(&w), &status(429, &rejected), NOW);
        health.record_failure(&attempt(&p), &status(429, &RateLimitInfo::default()), NOW);
        health.record_failure(&attempt(&d), &status(402, &RateLimitInfo::default()), NOW);

        let json = serde_json::to_string(&health.export(NOW)).unwrap();
        let later = NOW + H;
        let restored = PoolHealth::default();
        let counts = restored.import(serde_json::from_str(&json).unwrap(), later);
        assert_eq!(
            counts,
            ImportCounts {
                cooldowns: 1,
                disabled: 1,
                windows: 1,
                ..Default::default()
            }
        );
        // The window cooldown comes back with 3 h left, never as a fresh 60 s.
        assert_eq!(
            restored.cooldowns.cooldown_until(&w, later),
            Some(later + 3 * H)
        );
        assert_eq!(restored.cooldowns.cooldown_until(&p, later), None);
        assert!(restored.disabled.is_disabled(&d));
        let out = restored.windows.out_of_window(&w, None, later).unwrap();
        assert_eq!(
            (out.limit, out.until),
            (UsageLimit::Window(Window::Weekly), NOW + 48 * H)
        );
    }

    /// An older keypool turned a far-future `-reset` into a cooldown until `u64::MAX`
    /// and persisted it: loaded again, it ends no later than the longest cooldown any
    /// trigger sets (the weekly window's bound, with the default settings).
    #[test]
    fn import_bounds_a_cooldown_an_older_version_persisted() {
        let far = AccountId::from("far");
        let export = HealthExport {
            exported_at: NOW,
            cooldowns: vec![CooldownRecord {
                account: far.clone(),
                entry: crate::CooldownEntry {
                    until: u64::MAX,
                    set_at: NOW - 1,
                    trigger: crate::Trigger::WindowExhausted { reset: u64::MAX },
                    backoff_level: 0,
                    consecutive_failures: 1,
                    forbidden_streak: 0,
                },
            }],
            ..Default::default()
        };
        let json = serde_json::to_string(&export).unwrap();
        let restored = PoolHealth::default();
        let counts = restored.import(serde_json::from_str(&json).unwrap(), NOW);
        let bound = NOW + 7 * 24 * H + 300_000;
        assert_eq!(restored.cooldowns.cooldown_until(&far, NOW), Some(bound));
        assert_eq!(restored.cooldowns.signal(&far).until(), bound);
        assert_eq!(
            restored.cooldowns.entry(&far).unwrap().trigger,
            crate::Trigger::WindowExhausted { reset: bound }
        );
        assert_eq!(
            counts.corrected_cooldowns,
            [(
                far.clone(),
                CooldownCorrection {
                    received: u64::MAX,
                    recorded: bound
                }
            )]
        );
        assert_eq!(counts.cooldowns, 1);
        // a configured cap longer than a week is the bound then
        let month = 30 * 24 * H;
        let long = CooldownSettings {
            retry_after_max_ms: month,
            ..Default::default()
        };
        let restored = PoolHealth::new(CooldownConfig::try_new(long).unwrap());
        let _ = restored.import(serde_json::from_str(&json).unwrap(), NOW);
        assert_eq!(
            restored.cooldowns.cooldown_until(&far, NOW),
            Some(NOW + month)
        );
    }

    /// The operator's "clear windows": the window state and the cooldown a window set
    /// go; a cooldown of another trigger stays.
    #[test]
    fn clear_windows_ends_the_window_and_its_cooldown_only() {
        let health = PoolHealth::default();
        let (w, r) = (AccountId::from("w"), AccountId::from("r"));
        let rejected = RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            unified_reset: Some(NOW + 4 * H),
            ..Default::default()
        };
        for account in [&w, &r] {
            health.windows.observe(account, &rejected, NOW);
        }
        health.record_failure(&attempt(&w), &status(429, &rejected), NOW);
        let retry = RateLimitInfo {
            retry_after_ms: Some(600_000),
            ..Default::default()
        };
        health.record_failure(&attempt(&r), &status(429, &retry), NOW);
        let signal = health.windows.signal_with_threshold(&w, None);
        assert!(signal.may_block(NOW));

        let cleared = health.clear_windows(&w);
        assert_eq!(cleared.state.unwrap().info.unified_reset, Some(NOW + 4 * H));
        assert_eq!(cleared.cooldown.unwrap().until, NOW + 4 * H);
        assert_eq!(health.windows.out_of_window(&w, None, NOW), None);
        assert_eq!(health.cooldowns.cooldown_until(&w, NOW), None);
        assert!(!signal.may_block(NOW));
        assert!(!health.cooldowns.signal(&w).may_block(NOW));

        let cleared = health.clear_windows(&r);
        assert!(cleared.state.is_some());
        assert_eq!(
            cleared.cooldown, None,
            "a retry-after cooldown is not a window's"
        );
        assert_eq!(health.windows.out_of_window(&r, None, NOW), None);
        assert_eq!(
            health.cooldowns.cooldown_until(&r, NOW),
            Some(NOW + 600_000)
        );
        // nothing left to clear
        assert_eq!(health.clear_windows(&w), ClearedWindows::default());
    }
}
