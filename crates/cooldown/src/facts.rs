//! Rate-limit facts: what an upstream said about an account's limits, in a form that
//! names no provider (SPEC 5, 6 and 8).
//!
//! A provider adapter (`keypool-providers`: Anthropic's `anthropic-ratelimit-*`
//! headers, an OpenAI-compatible server's `x-ratelimit-*`) reads one response into a
//! [`RateLimitInfo`]; the classifier ([`crate::classify`]) and the [`crate::WindowBook`]
//! read only that. This crate never sees a header.
//!
//! **Resets are bounded.** A reset is the upstream's claim about the future, and one
//! absurd claim must not take an account out for good. Each reset kind has a bound
//! ([`ResetKind::bound_ms`]: the window's length plus [`RESET_SLACK_MS`]) and
//! [`ResetKind::bound`] is the one rule applied to it, by the adapters for every
//! response ([`RateLimitInfo::bound_resets`]) and by [`crate::WindowBook::import`] for
//! persisted state: a reset within its bound (or in the past) is kept exactly; one
//! beyond it that is also later than the year 5138 as seconds
//! ([`UNIX_MS_READING_ABOVE`]) was sent in unix milliseconds and is read so; whatever
//! is still beyond the bound is clamped to it. Each correction is reported in
//! [`RateLimitInfo::corrections`] (this crate does not log; the store does).
//!
//! ```
//! use keypool_cooldown::facts::{RateLimitInfo, ResetKind};
//!
//! let now = 1_700_000_000_000;
//! let mut info = RateLimitInfo {
//!     retry_after_ms: Some(30_000),
//!     // 3 trillion years ahead
//!     unified_reset: Some(u64::MAX),
//!     ..RateLimitInfo::default()
//! };
//! let corrections = info.bound_resets(now);
//! // clamped to 7 days and 5 minutes of slack
//! assert_eq!(info.unified_reset, Some(now + 7 * 86_400_000 + 300_000));
//! assert_eq!(corrections[0].kind, ResetKind::Unified);
//! ```

use keypool_core::{ModelFamily, UnixMs, Window};
use serde::{Deserialize, Serialize};

/// What every reset bound allows beyond its window's length, ms (5 minutes): clock
/// skew between keypool and the upstream, and an upstream that rounds its reset up.
pub const RESET_SLACK_MS: u64 = 5 * 60_000;

/// A reset beyond its bound and later than this (10^11 s after the epoch, the year
/// 5138, here in ms) was sent in unix milliseconds where seconds belong: it is read as
/// milliseconds (then bounded like any other).
pub const UNIX_MS_READING_ABOVE: UnixMs = 100_000_000_000_000;

const HOUR_MS: u64 = 3_600_000;

/// Which reset a value is: each kind has its own bound ([`ResetKind::bound_ms`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResetKind {
    /// The overall reset (the unified window): may stand for the weekly window, so the
    /// weekly bound.
    Unified,
    /// The 5-hour window's reset.
    FiveHour,
    /// The weekly window's reset.
    SevenDay,
    /// The request limit's refill (API-key accounts, a cooldown): the
    /// 1 hour of the default `retry_after_max_ms`, the cap of every other 429 wait.
    Requests,
    /// A model family's weekly window: the weekly bound.
    FamilySevenDay(ModelFamily),
}

impl ResetKind {
    /// Every kind.
    pub const ALL: [Self; 7] = [
        Self::Unified,
        Self::FiveHour,
        Self::SevenDay,
        Self::Requests,
        Self::FamilySevenDay(ModelFamily::Opus),
        Self::FamilySevenDay(ModelFamily::Sonnet),
        Self::FamilySevenDay(ModelFamily::Haiku),
    ];

    /// The kind's name in logs and persisted state: `unified`, `five_hour`,
    /// `seven_day`, `requests`, `seven_day_<family>`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Unified => "unified",
            Self::FiveHour => "five_hour",
            Self::SevenDay => "seven_day",
            Self::Requests => "requests",
            Self::FamilySevenDay(ModelFamily::Opus) => "seven_day_opus",
            Self::FamilySevenDay(ModelFamily::Sonnet) => "seven_day_sonnet",
            Self::FamilySevenDay(ModelFamily::Haiku) => "seven_day_haiku",
        }
    }

    /// How far after `now` a reset of this kind may lie, ms: 5 h (the 5-hour window),
    /// 7 d (the weekly windows and the overall reset), 1 h (the request limit), each plus
    /// [`RESET_SLACK_MS`].
    pub const fn bound_ms(self) -> u64 {
        let window = match self {
            Self::FiveHour => 5 * HOUR_MS,
            Self::Unified | Self::SevenDay | Self::FamilySevenDay(_) => 7 * 24 * HOUR_MS,
            Self::Requests => HOUR_MS,
        };
        window + RESET_SLACK_MS
    }

    /// The longest bound of any kind (the weekly one).
    pub const fn longest_bound_ms() -> u64 {
        Self::SevenDay.bound_ms()
    }

    /// The one rule for a reset `at` (unix ms) seen at `now`: kept exactly within
    /// `now + bound_ms` (a reset in the past stays in the past); beyond it, read as
    /// unix ms when later than [`UNIX_MS_READING_ABOVE`], then clamped to the bound.
    /// Returns the value to record and, when it differs from `at`, the correction.
    pub fn bound(self, at: UnixMs, now: UnixMs) -> (UnixMs, Option<ResetCorrection>) {
        let limit = now.saturating_add(self.bound_ms());
        if at <= limit {
            return (at, None);
        }
        let read_as_ms = at > UNIX_MS_READING_ABOVE;
        let recorded = if read_as_ms { at / 1000 } else { at }.min(limit);
        let correction = ResetCorrection {
            kind: self,
            received: at,
            recorded,
            read_as_ms,
        };
        (recorded, Some(correction))
    }
}

/// A reset that was not recorded as received (see [`ResetKind::bound`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetCorrection {
    /// Which reset.
    pub kind: ResetKind,
    /// The value as received, unix ms (seconds × 1000, saturated, when it came as seconds).
    pub received: UnixMs,
    /// The value recorded instead, unix ms.
    pub recorded: UnixMs,
    /// Whether `received` was read as unix milliseconds.
    pub read_as_ms: bool,
}

/// A rate-limit status: of the account overall, or of one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnifiedStatus {
    /// Requests are allowed.
    Allowed,
    /// Requests are allowed, but the limit is close.
    AllowedWarning,
    /// Requests are rejected until the reset.
    Rejected,
}

impl UnifiedStatus {
    /// The spelling in logs, state and the admin API (`allowed`, `allowed_warning`,
    /// `rejected`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::AllowedWarning => "allowed_warning",
            Self::Rejected => "rejected",
        }
    }
}

/// What the upstream said about one usage window (5-hour, weekly, a family's weekly).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowUsage {
    /// Fraction of the window used; finite and `>= 0` (may exceed 1).
    pub utilization: Option<f64>,
    /// When the window resets, unix ms.
    pub reset: Option<UnixMs>,
    /// The window's own status.
    pub status: Option<UnifiedStatus>,
}

impl WindowUsage {
    /// True when no field was present.
    pub fn is_empty(&self) -> bool {
        self.utilization.is_none() && self.reset.is_none() && self.status.is_none()
    }

    /// Takes every field `newer` has; keeps the others.
    pub fn merge(&mut self, newer: &WindowUsage) {
        self.utilization = newer.utilization.or(self.utilization);
        self.reset = newer.reset.or(self.reset);
        self.status = newer.status.or(self.status);
    }
}

/// The per-family weekly windows of one account (SPEC 16), one [`WindowUsage`] per
/// [`ModelFamily`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FamilyWeekly {
    /// Opus's weekly window.
    #[serde(skip_serializing_if = "WindowUsage::is_empty")]
    pub opus: WindowUsage,
    /// Sonnet's weekly window.
    #[serde(skip_serializing_if = "WindowUsage::is_empty")]
    pub sonnet: WindowUsage,
    /// Haiku's weekly window.
    #[serde(skip_serializing_if = "WindowUsage::is_empty")]
    pub haiku: WindowUsage,
}

impl FamilyWeekly {
    /// The window of `family`.
    pub fn get(&self, family: ModelFamily) -> &WindowUsage {
        match family {
            ModelFamily::Opus => &self.opus,
            ModelFamily::Sonnet => &self.sonnet,
            ModelFamily::Haiku => &self.haiku,
        }
    }

    /// The window of `family`, to change.
    pub fn get_mut(&mut self, family: ModelFamily) -> &mut WindowUsage {
        match family {
            ModelFamily::Opus => &mut self.opus,
            ModelFamily::Sonnet => &mut self.sonnet,
            ModelFamily::Haiku => &mut self.haiku,
        }
    }

    /// True when no family has any field.
    pub fn is_empty(&self) -> bool {
        ModelFamily::ALL.iter().all(|f| self.get(*f).is_empty())
    }
}

/// Everything keypool learnt about an account's limits from one upstream response, as
/// a provider adapter read it (Anthropic's names in brackets).
///
/// Every field is optional: what the response did not say (or said in a form that does
/// not parse) is `None`. The field names are those of persisted state: keep them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RateLimitInfo {
    /// How long the upstream asked to wait, in ms: `retry-after-ms` when it parses,
    /// else `retry-after` (seconds, or an HTTP date relative to `now`; a date in the
    /// past gives 0). Not clamped here; the cooldown book clamps it.
    pub retry_after_ms: Option<u64>,
    /// The account's overall status (`anthropic-ratelimit-unified-status`).
    pub unified_status: Option<UnifiedStatus>,
    /// When the overall status resets, unix ms (`…-unified-reset`).
    pub unified_reset: Option<UnixMs>,
    /// Which window the overall status stands for: `five_hour`, `seven_day`,
    /// `seven_day_<family>` ([`claim_window`], [`claim_family`];
    /// `…-unified-representative-claim`).
    pub representative_claim: Option<String>,
    /// The 5-hour window (`…-unified-5h-*`).
    pub five_hour: WindowUsage,
    /// The weekly window (`…-unified-7d-*`).
    pub seven_day: WindowUsage,
    /// API-key accounts: requests left in the current period
    /// (`anthropic-ratelimit-requests-remaining`, OpenAI's `x-ratelimit-remaining-requests`).
    pub requests_remaining: Option<u64>,
    /// When the request limit refills, unix ms (`…-requests-reset`).
    pub requests_reset: Option<UnixMs>,
    /// The per-family weekly windows (`…-unified-7d_<family>-*`).
    #[serde(default, skip_serializing_if = "FamilyWeekly::is_empty")]
    pub families: FamilyWeekly,
    /// The resets the adapter bounded ([`RateLimitInfo::bound_resets`]; empty for a
    /// sane upstream), for the caller to log. Never persisted.
    #[serde(skip)]
    pub corrections: Vec<ResetCorrection>,
}

impl RateLimitInfo {
    /// The reset of `kind`, if known.
    pub fn reset(&self, kind: ResetKind) -> Option<UnixMs> {
        match kind {
            ResetKind::Unified => self.unified_reset,
            ResetKind::FiveHour => self.five_hour.reset,
            ResetKind::SevenDay => self.seven_day.reset,
            ResetKind::Requests => self.requests_reset,
            ResetKind::FamilySevenDay(family) => self.families.get(family).reset,
        }
    }

    fn reset_mut(&mut self, kind: ResetKind) -> &mut Option<UnixMs> {
        match kind {
            ResetKind::Unified => &mut self.unified_reset,
            ResetKind::FiveHour => &mut self.five_hour.reset,
            ResetKind::SevenDay => &mut self.seven_day.reset,
            ResetKind::Requests => &mut self.requests_reset,
            ResetKind::FamilySevenDay(family) => &mut self.families.get_mut(family).reset,
        }
    }

    /// Applies [`ResetKind::bound`] at `now` to every reset and returns the corrections
    /// (the provider adapter does this for each response; the window book's import for
    /// persisted state).
    pub fn bound_resets(&mut self, now: UnixMs) -> Vec<ResetCorrection> {
        let mut corrections = Vec::new();
        for kind in ResetKind::ALL {
            let reset = self.reset_mut(kind);
            if let Some(at) = *reset {
                let (recorded, correction) = kind.bound(at, now);
                *reset = Some(recorded);
                corrections.extend(correction);
            }
        }
        corrections
    }

    /// What the response said about one usage window.
    pub fn window(&self, window: Window) -> &WindowUsage {
        match window {
            Window::FiveHour => &self.five_hour,
            Window::Weekly => &self.seven_day,
        }
    }

    /// The window the representative claim names, if it names one
    /// (`five_hour` → 5h; `seven_day`, `seven_day_opus`, ... → weekly).
    pub fn claimed_window(&self) -> Option<Window> {
        claim_window(self.representative_claim.as_deref()?)
    }

    /// The model family the representative claim names (`seven_day_opus` → opus), if
    /// it names one: an overall `rejected` then stands for that family only.
    pub fn claimed_family(&self) -> Option<ModelFamily> {
        claim_family(self.representative_claim.as_deref()?)
    }

    /// True when the response said nothing about the account's limits.
    pub fn is_empty(&self) -> bool {
        self.retry_after_ms.is_none() && self.has_no_window_state()
    }

    /// True when the response said nothing but how long to wait: nothing the window
    /// book keeps.
    pub fn has_no_window_state(&self) -> bool {
        self.unified_status.is_none()
            && self.unified_reset.is_none()
            && self.representative_claim.is_none()
            && self.five_hour.is_empty()
            && self.seven_day.is_empty()
            && self.requests_remaining.is_none()
            && self.requests_reset.is_none()
            && self.families.is_empty()
    }
}

/// The model family a representative-claim value names (`seven_day_opus`,
/// `seven_day_sonnet`, `seven_day_haiku`), if any.
pub fn claim_family(claim: &str) -> Option<ModelFamily> {
    let family = claim.strip_prefix("seven_day_")?;
    ModelFamily::ALL
        .iter()
        .copied()
        .find(|f| f.as_str() == family)
}

/// The window a representative-claim value names, if any.
pub fn claim_window(claim: &str) -> Option<Window> {
    if claim == "five_hour" || claim.starts_with("five_hour_") || claim == "5h" {
        Some(Window::FiveHour)
    } else if claim == "seven_day" || claim.starts_with("seven_day_") || claim == "7d" {
        Some(Window::Weekly)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: UnixMs = 1_700_000_000_000;
    const MIN: u64 = 60_000;
    const HOUR: u64 = 60 * MIN;
    const SLACK: u64 = 5 * MIN;
    const WEEK: u64 = 7 * 24 * HOUR;

    #[test]
    fn claim_names_map_to_windows_and_families() {
        assert_eq!(claim_window("five_hour"), Some(Window::FiveHour));
        assert_eq!(claim_window("seven_day"), Some(Window::Weekly));
        assert_eq!(claim_window("seven_day_opus"), Some(Window::Weekly));
        assert_eq!(claim_window("overage"), None);
        assert_eq!(claim_family("seven_day"), None);
        assert_eq!(claim_family("seven_day_sonnet"), Some(ModelFamily::Sonnet));
        assert_eq!(claim_family("five_hour"), None);
        let info = RateLimitInfo {
            representative_claim: Some("seven_day_opus".into()),
            ..RateLimitInfo::default()
        };
        assert_eq!(info.claimed_family(), Some(ModelFamily::Opus));
        assert_eq!(info.claimed_window(), Some(Window::Weekly));
        assert!(!info.has_no_window_state());
    }

    #[test]
    fn each_reset_kind_has_the_documented_bound_and_name() {
        let kinds: Vec<(&str, u64)> = ResetKind::ALL
            .iter()
            .map(|k| (k.name(), k.bound_ms()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("unified", WEEK + SLACK),
                ("five_hour", 5 * HOUR + SLACK),
                ("seven_day", WEEK + SLACK),
                ("requests", HOUR + SLACK),
                ("seven_day_opus", WEEK + SLACK),
                ("seven_day_sonnet", WEEK + SLACK),
                ("seven_day_haiku", WEEK + SLACK),
            ]
        );
        assert_eq!(ResetKind::longest_bound_ms(), WEEK + SLACK);
        assert_eq!(RESET_SLACK_MS, SLACK);
        // the 1-hour request-limit bound is the default cap of every other 429 wait
        assert_eq!(
            ResetKind::Requests.bound_ms() - RESET_SLACK_MS,
            crate::CooldownSettings::default().retry_after_max_ms
        );
    }

    #[test]
    fn bound_keeps_clamps_and_reads_ms() {
        let k = ResetKind::FiveHour;
        let limit = NOW + 5 * HOUR + SLACK;
        assert_eq!(k.bound(NOW + HOUR, NOW), (NOW + HOUR, None));
        assert_eq!(k.bound(NOW - HOUR, NOW), (NOW - HOUR, None));
        assert_eq!(k.bound(limit, NOW), (limit, None));
        let (at, c) = k.bound(limit + 1, NOW);
        assert_eq!(at, limit);
        assert!(!c.unwrap().read_as_ms);
        // 30 minutes ahead, sent in ms where seconds belong (×1000 on reading)
        let soon = NOW + 30 * MIN;
        assert_eq!(
            k.bound(soon * 1000, NOW),
            (
                soon,
                Some(ResetCorrection {
                    kind: k,
                    received: soon * 1000,
                    recorded: soon,
                    read_as_ms: true
                })
            )
        );
        assert_eq!(k.bound(u64::MAX, NOW).0, limit);
    }

    #[test]
    fn bound_resets_reports_each_correction() {
        let mut info = RateLimitInfo {
            unified_reset: Some(u64::MAX),
            five_hour: WindowUsage {
                reset: Some(99_999_999_999_000),
                ..WindowUsage::default()
            },
            seven_day: WindowUsage {
                reset: Some(NOW + MIN),
                ..WindowUsage::default()
            },
            ..RateLimitInfo::default()
        };
        let corrections = info.bound_resets(NOW);
        assert_eq!(
            corrections,
            [
                ResetCorrection {
                    kind: ResetKind::Unified,
                    received: u64::MAX,
                    recorded: NOW + WEEK + SLACK,
                    read_as_ms: true,
                },
                ResetCorrection {
                    kind: ResetKind::FiveHour,
                    received: 99_999_999_999_000,
                    recorded: NOW + 5 * HOUR + SLACK,
                    read_as_ms: false,
                },
            ]
        );
        assert_eq!(info.seven_day.reset, Some(NOW + MIN));
    }

    #[test]
    fn persisted_state_of_an_older_keypool_still_reads() {
        let json = serde_json::to_string(&RateLimitInfo::default()).unwrap();
        assert!(!json.contains("families"), "{json}");
        let old: RateLimitInfo = serde_json::from_str(&json).unwrap();
        assert!(old.families.is_empty());
        assert!(old.is_empty());
    }

    proptest! {
        /// Whatever the reset, what is recorded is at most `now` + its bound, and a
        /// reset within the bound is kept exactly.
        #[test]
        fn every_recorded_reset_is_within_its_bound(
            at in any::<u64>(),
            now in prop_oneof![Just(NOW), any::<u64>()],
            kind in proptest::sample::select(ResetKind::ALL.to_vec()),
        ) {
            let limit = now.saturating_add(kind.bound_ms());
            let (got, correction) = kind.bound(at, now);
            prop_assert!(got <= limit);
            if at <= limit {
                prop_assert_eq!((got, correction), (at, None));
            } else {
                prop_assert_eq!(correction.map(|c| c.received), Some(at));
            }
        }
    }
}
