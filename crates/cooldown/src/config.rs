//! The numbers of SPEC 5 and 6, all configurable, validated once.
//!
//! [`CooldownSettings`] is the plain, deserialisable form (every field has the SPEC
//! default); [`CooldownConfig::try_new`] checks it and yields a config that cannot hold
//! an invalid value. [`CooldownConfig::trigger_duration_ms`] is the one place that turns
//! a trigger into a cooldown length.

use keypool_core::UnixMs;
use serde::{Deserialize, Serialize};

use crate::classify::{BodyMarks, Trigger};
use crate::error::CooldownError;
use crate::facts::ResetKind;

/// Cooldown, backoff, window and breaker settings as written in configuration.
/// `Default` is the SPEC default for every field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CooldownSettings {
    /// Master switch for disabling on `key_error` (`AUTO_DISABLE_ON_ERROR`). Default `true`.
    pub auto_disable_on_error: bool,
    /// Lower clamp of a 429's `retry-after`, ms. Default 1 s.
    pub retry_after_min_ms: u64,
    /// Upper clamp of a 429's `retry-after`, ms. Default 1 h.
    pub retry_after_max_ms: u64,
    /// Cooldown after a plain 429, ms. Default 60 s.
    pub rate_limit_ms: u64,
    /// A snapshot with more accounts than this is a large pool. Default 100.
    pub large_pool_accounts: usize,
    /// Cooldown after a plain 429 in a large pool, ms. Default 10 s.
    pub large_pool_rate_limit_ms: u64,
    /// Cooldown after a 529 or 503, ms. Default 15 s.
    pub overloaded_ms: u64,
    /// Backoff of the 2nd consecutive transient failure, ms; doubles after. Default 5 s.
    pub backoff_base_ms: u64,
    /// Longest backoff, ms. Default 5 min.
    pub backoff_max_ms: u64,
    /// Default usage-window threshold (fraction, `0 < t <= 1`). Default 0.95.
    pub window_threshold: f64,
    /// Cooldown after a `403` without a ban marker, ms (SPEC 16). Default 60 s.
    pub forbidden_ms: u64,
    /// The consecutive `403` that bans the account (SPEC 16: the 3rd). Default 3.
    pub ban_after_forbidden: u32,
    /// Texts that, found in a 400, 401 or 403 error body (ASCII case ignored), ban the
    /// account at once. Default: [`DEFAULT_BAN_MARKERS`].
    pub ban_markers: Vec<String>,
    /// Texts that, found in a 400, 401 or 403 error body, mean the credit balance is
    /// exhausted (`credits_exhausted`). Default: [`DEFAULT_CREDIT_MARKERS`].
    pub credit_markers: Vec<String>,
    /// First model lockout after a `404 not_found_error`, ms (SPEC 16). Default 10 min.
    pub model_lockout_ms: u64,
    /// Longest model lockout, ms. Default 6 h.
    pub model_lockout_max_ms: u64,
    /// The per-`base_url` circuit breaker.
    pub breaker: BreakerSettings,
}

/// The default `ban_markers`: how Anthropic and Anthropic-compatible upstreams word an
/// account that was shut down for good.
pub const DEFAULT_BAN_MARKERS: [&str; 4] = [
    "organization has been disabled",
    "account has been disabled",
    "account has been suspended",
    "account has been banned",
];

/// The default `credit_markers` (Anthropic's 400 for an empty prepaid balance).
pub const DEFAULT_CREDIT_MARKERS: [&str; 1] = ["credit balance is too low"];

impl Default for CooldownSettings {
    fn default() -> Self {
        Self {
            auto_disable_on_error: true,
            retry_after_min_ms: 1_000,
            retry_after_max_ms: 3_600_000,
            rate_limit_ms: 60_000,
            large_pool_accounts: 100,
            large_pool_rate_limit_ms: 10_000,
            overloaded_ms: 15_000,
            backoff_base_ms: 5_000,
            backoff_max_ms: 300_000,
            window_threshold: 0.95,
            forbidden_ms: 60_000,
            ban_after_forbidden: 3,
            ban_markers: DEFAULT_BAN_MARKERS.map(String::from).to_vec(),
            credit_markers: DEFAULT_CREDIT_MARKERS.map(String::from).to_vec(),
            model_lockout_ms: 600_000,
            model_lockout_max_ms: 21_600_000,
            breaker: BreakerSettings::default(),
        }
    }
}

/// Circuit-breaker settings (SPEC 6). Off by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerSettings {
    /// Whether the breaker runs at all. Default `false`.
    pub enabled: bool,
    /// Opens when at least this fraction of the window's attempts failed transiently.
    /// Default 0.5.
    pub failure_ratio: f64,
    /// ... and the window held at least this many attempts. Default 10.
    pub min_attempts: u32,
    /// The sliding window, ms (counted in whole seconds). Default 60 s.
    pub window_ms: u64,
    /// How long the breaker stays open before one probe, ms. Default 30 s.
    pub open_ms: u64,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            failure_ratio: 0.5,
            min_attempts: 10,
            window_ms: 60_000,
            open_ms: 30_000,
        }
    }
}

/// Validated [`CooldownSettings`]. `Default` is the SPEC defaults.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CooldownConfig {
    settings: CooldownSettings,
}

fn invalid(field: &'static str, value: impl ToString, expected: &'static str) -> CooldownError {
    CooldownError::InvalidSetting {
        field,
        value: value.to_string(),
        expected,
    }
}

fn positive(field: &'static str, v: u64) -> Result<(), CooldownError> {
    if v == 0 {
        return Err(invalid(field, v, "must be greater than 0"));
    }
    Ok(())
}

fn fraction(field: &'static str, v: f64) -> Result<(), CooldownError> {
    if !(v.is_finite() && v > 0.0 && v <= 1.0) {
        return Err(invalid(
            field,
            v,
            "must be a fraction greater than 0 and at most 1",
        ));
    }
    Ok(())
}

impl CooldownConfig {
    /// Checks every value: durations greater than 0, `retry_after_min_ms <=
    /// retry_after_max_ms`, `backoff_base_ms <= backoff_max_ms`, fractions in `(0, 1]`,
    /// `breaker.min_attempts >= 1`, `breaker.window_ms >= 1000`.
    pub fn try_new(settings: CooldownSettings) -> Result<Self, CooldownError> {
        let s = &settings;
        positive("retry_after_min_ms", s.retry_after_min_ms)?;
        if s.retry_after_max_ms < s.retry_after_min_ms {
            return Err(invalid(
                "retry_after_max_ms",
                s.retry_after_max_ms,
                "must be at least retry_after_min_ms",
            ));
        }
        positive("rate_limit_ms", s.rate_limit_ms)?;
        positive("large_pool_rate_limit_ms", s.large_pool_rate_limit_ms)?;
        positive("overloaded_ms", s.overloaded_ms)?;
        positive("backoff_base_ms", s.backoff_base_ms)?;
        if s.backoff_max_ms < s.backoff_base_ms {
            return Err(invalid(
                "backoff_max_ms",
                s.backoff_max_ms,
                "must be at least backoff_base_ms",
            ));
        }
        fraction("window_threshold", s.window_threshold)?;
        fraction("breaker.failure_ratio", s.breaker.failure_ratio)?;
        if s.breaker.min_attempts == 0 {
            return Err(invalid("breaker.min_attempts", 0, "must be at least 1"));
        }
        if s.breaker.window_ms < 1_000 {
            return Err(invalid(
                "breaker.window_ms",
                s.breaker.window_ms,
                "must be at least 1000 (the window counts whole seconds)",
            ));
        }
        positive("breaker.open_ms", s.breaker.open_ms)?;
        positive("forbidden_ms", s.forbidden_ms)?;
        if s.ban_after_forbidden == 0 {
            return Err(invalid("ban_after_forbidden", 0, "must be at least 1"));
        }
        positive("model_lockout_ms", s.model_lockout_ms)?;
        if s.model_lockout_max_ms < s.model_lockout_ms {
            return Err(invalid(
                "model_lockout_max_ms",
                s.model_lockout_max_ms,
                "must be at least model_lockout_ms",
            ));
        }
        let mut settings = settings;
        for (field, markers) in [
            ("ban_markers", &mut settings.ban_markers),
            ("credit_markers", &mut settings.credit_markers),
        ] {
            for m in markers.iter_mut() {
                if m.trim().is_empty() {
                    return Err(invalid(
                        field,
                        format!("{m:?}"),
                        "must not hold an empty text",
                    ));
                }
                m.make_ascii_lowercase();
            }
        }
        Ok(Self { settings })
    }

    /// What an error body says (SPEC 16): a ban marker, a credit marker (ASCII case
    /// ignored), the error type `not_found_error`. Only failed attempts' bodies (a few
    /// KiB at most) are read.
    pub fn marks(&self, body: &[u8]) -> BodyMarks {
        if body.is_empty() {
            return BodyMarks::default();
        }
        let text = String::from_utf8_lossy(body).to_ascii_lowercase();
        let any = |markers: &[String]| markers.iter().any(|m| text.contains(m.as_str()));
        BodyMarks {
            ban: any(&self.settings.ban_markers),
            credits: any(&self.settings.credit_markers),
            not_found: text.contains("not_found_error"),
        }
    }

    /// The model lockout after the `failures`-th consecutive `404 not_found_error` of
    /// one (account, model), ms: `model_lockout_ms × 2^(failures − 1)`, capped at
    /// `model_lockout_max_ms` (SPEC 16: 10 min doubling up to 6 h).
    pub fn lockout_ms(&self, failures: u32) -> u64 {
        let s = &self.settings;
        let factor = 1u64
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u64::MAX);
        s.model_lockout_ms
            .saturating_mul(factor)
            .min(s.model_lockout_max_ms)
    }

    /// The validated settings.
    pub fn settings(&self) -> &CooldownSettings {
        &self.settings
    }

    /// The backoff of the "other transient" row at `backoff_level` (the number of
    /// consecutive such failures): 0 for levels 0 and 1, then
    /// `backoff_base_ms × 2^(level − 2)`, capped at `backoff_max_ms`.
    pub fn backoff_ms(&self, backoff_level: u32) -> u64 {
        let s = &self.settings;
        if backoff_level <= 1 {
            return 0;
        }
        let factor = 1u64.checked_shl(backoff_level - 2).unwrap_or(u64::MAX);
        s.backoff_base_ms
            .saturating_mul(factor)
            .min(s.backoff_max_ms)
    }

    /// The longest cooldown any trigger can set, ms: the weekly window's reset bound
    /// ([`ResetKind::longest_bound_ms`], a `window_exhausted` cooldown lasts until a
    /// bounded reset) or a configured duration, whichever is longer. A persisted
    /// cooldown is never loaded longer than this.
    pub fn longest_cooldown_ms(&self) -> u64 {
        let s = &self.settings;
        [
            ResetKind::longest_bound_ms(),
            s.retry_after_max_ms,
            s.rate_limit_ms,
            s.large_pool_rate_limit_ms,
            s.overloaded_ms,
            s.backoff_max_ms,
            s.forbidden_ms,
        ]
        .into_iter()
        .max()
        .unwrap_or(u64::MAX)
    }

    /// How long `trigger` says the account must rest, in ms from `now` (0: no
    /// cooldown), exactly per the SPEC 6 trigger table. `backoff_level` is only used by
    /// the backoff rows, `snapshot_len` only by the plain-429 row.
    pub fn trigger_duration_ms(
        &self,
        trigger: &Trigger,
        backoff_level: u32,
        snapshot_len: usize,
        now: UnixMs,
    ) -> u64 {
        let s = &self.settings;
        match *trigger {
            Trigger::AuthRejected { .. }
            | Trigger::Banned { .. }
            | Trigger::PaymentRequired
            | Trigger::CreditBalanceLow { .. }
            | Trigger::FamilyWindowExhausted { .. }
            | Trigger::ModelNotFound
            | Trigger::RequestError { .. } => 0,
            Trigger::Forbidden => s.forbidden_ms,
            Trigger::WindowExhausted { reset } => reset.saturating_sub(now),
            Trigger::RetryAfter { wait_ms } => {
                wait_ms.clamp(s.retry_after_min_ms, s.retry_after_max_ms)
            }
            Trigger::PlainRateLimit if snapshot_len > s.large_pool_accounts => {
                s.large_pool_rate_limit_ms
            }
            Trigger::PlainRateLimit => s.rate_limit_ms,
            Trigger::Overloaded { .. } => s.overloaded_ms,
            Trigger::OtherStatus { .. } | Trigger::Transport { .. } => {
                self.backoff_ms(backoff_level)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_cooldown_is_the_weekly_bound_or_a_longer_configured_one() {
        let week = ResetKind::longest_bound_ms();
        assert_eq!(week, 7 * 86_400_000 + 300_000);
        assert_eq!(CooldownConfig::default().longest_cooldown_ms(), week);
        for field in 0..5 {
            let mut s = CooldownSettings::default();
            let long = week + 1 + field;
            match field {
                0 => s.retry_after_max_ms = long,
                1 => s.rate_limit_ms = long,
                2 => s.large_pool_rate_limit_ms = long,
                3 => s.overloaded_ms = long,
                _ => (s.backoff_base_ms, s.backoff_max_ms) = (long, long),
            }
            let config = CooldownConfig::try_new(s).unwrap();
            assert_eq!(config.longest_cooldown_ms(), long, "field {field}");
        }
    }

    #[test]
    fn body_marks_and_lockout_lengths() {
        let c = CooldownConfig::default();
        let ban = br#"{"type":"error","error":{"type":"permission_error","message":"This Organization has been disabled."}}"#;
        assert!(c.marks(ban).ban);
        let credit = br#"{"error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#;
        let m = c.marks(credit);
        assert!(m.credits && !m.ban && !m.not_found);
        let nf =
            br#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-x"}}"#;
        assert!(c.marks(nf).not_found);
        assert_eq!(c.marks(b""), BodyMarks::default());
        // configured markers are matched case-insensitively
        let custom = CooldownConfig::try_new(CooldownSettings {
            ban_markers: vec!["Account TERMINATED".into()],
            ..Default::default()
        })
        .unwrap();
        assert!(custom.marks(b"your account terminated").ban);
        assert!(!custom.marks(ban).ban);
        let empty = CooldownSettings {
            ban_markers: vec![" ".into()],
            ..Default::default()
        };
        assert!(CooldownConfig::try_new(empty).is_err());
        // 10 min, doubling, up to 6 h
        let minutes = |f| c.lockout_ms(f) / 60_000;
        assert_eq!(
            [1, 2, 3, 4, 5, 6, 7, 100].map(minutes),
            [10, 20, 40, 80, 160, 320, 360, 360]
        );
        assert_eq!(c.lockout_ms(0), 600_000);
    }

    #[test]
    fn defaults_are_the_spec_numbers_and_valid() {
        let c = CooldownConfig::try_new(CooldownSettings::default()).unwrap();
        assert_eq!(c, CooldownConfig::default());
        let s = c.settings();
        assert!(s.auto_disable_on_error);
        assert_eq!(
            (s.retry_after_min_ms, s.retry_after_max_ms),
            (1_000, 3_600_000)
        );
        assert_eq!(
            (s.rate_limit_ms, s.large_pool_rate_limit_ms),
            (60_000, 10_000)
        );
        assert_eq!(s.large_pool_accounts, 100);
        assert_eq!(s.overloaded_ms, 15_000);
        assert_eq!((s.backoff_base_ms, s.backoff_max_ms), (5_000, 300_000));
        assert_eq!(s.window_threshold, 0.95);
        let b = &s.breaker;
        assert!(!b.enabled);
        assert_eq!((b.failure_ratio, b.min_attempts), (0.5, 10));
        assert_eq!((b.window_ms, b.open_ms), (60_000, 30_000));
    }

    #[test]
    fn backoff_sequence() {
        let c = CooldownConfig::default();
        let got: Vec<u64> = (0..=10).map(|l| c.backoff_ms(l)).collect();
        assert_eq!(
            got,
            [
                0, 0, 5_000, 10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000, 300_000
            ]
        );
        assert_eq!(c.backoff_ms(u32::MAX), 300_000);
    }

    #[test]
    fn invalid_settings_name_the_field() {
        let cases: Vec<(CooldownSettings, &str)> = vec![
            (
                CooldownSettings {
                    retry_after_min_ms: 0,
                    ..Default::default()
                },
                "retry_after_min_ms",
            ),
            (
                CooldownSettings {
                    retry_after_max_ms: 500,
                    ..Default::default()
                },
                "retry_after_max_ms",
            ),
            (
                CooldownSettings {
                    rate_limit_ms: 0,
                    ..Default::default()
                },
                "rate_limit_ms",
            ),
            (
                CooldownSettings {
                    large_pool_rate_limit_ms: 0,
                    ..Default::default()
                },
                "large_pool_rate_limit_ms",
            ),
            (
                CooldownSettings {
                    overloaded_ms: 0,
                    ..Default::default()
                },
                "overloaded_ms",
            ),
            (
                CooldownSettings {
                    backoff_base_ms: 0,
                    ..Default::default()
                },
                "backoff_base_ms",
            ),
            (
                CooldownSettings {
                    backoff_max_ms: 1,
                    ..Default::default()
                },
                "backoff_max_ms",
            ),
            (
                CooldownSettings {
                    window_threshold: 0.0,
                    ..Default::default()
                },
                "window_threshold",
            ),
            (
                CooldownSettings {
                    window_threshold: f64::NAN,
                    ..Default::default()
                },
                "window_threshold",
            ),
            (
                CooldownSettings {
                    window_threshold: 1.5,
                    ..Default::default()
                },
                "window_threshold",
            ),
            (
                CooldownSettings {
                    breaker: BreakerSettings {
                        failure_ratio: 0.0,
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "breaker.failure_ratio",
            ),
            (
                CooldownSettings {
                    breaker: BreakerSettings {
                        min_attempts: 0,
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "breaker.min_attempts",
            ),
            (
                CooldownSettings {
                    breaker: BreakerSettings {
                        window_ms: 999,
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "breaker.window_ms",
            ),
            (
                CooldownSettings {
                    breaker: BreakerSettings {
                        open_ms: 0,
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "breaker.open_ms",
            ),
        ];
        for (settings, field) in cases {
            let err = CooldownConfig::try_new(settings).unwrap_err();
            let CooldownError::InvalidSetting { field: got, .. } = &err;
            assert_eq!(*got, field);
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn settings_deserialise_with_defaults_and_reject_unknown_fields() {
        let s: CooldownSettings =
            serde_json::from_str(r#"{"rate_limit_ms": 30000, "breaker": {"enabled": true}}"#)
                .unwrap();
        assert_eq!(s.rate_limit_ms, 30_000);
        assert!(s.breaker.enabled);
        assert_eq!(s.breaker.min_attempts, 10);
        assert!(serde_json::from_str::<CooldownSettings>(r#"{"rate_limt_ms": 1}"#).is_err());
    }
}
