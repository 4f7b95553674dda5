//! Failure classification: what one failed attempt says about its account (SPEC 6).
//!
//! [`classify`] maps an attempt's failure, an upstream status with its parsed headers or
//! a transport failure, to a [`Classification`]: the [`FailureClass`] (what happens to
//! the account) and the [`Trigger`] (which row of the SPEC 6 trigger table applied, and
//! so how long the cooldown lasts; see [`crate::CooldownConfig::trigger_duration_ms`]).
//!
//! ```
//! use http::StatusCode;
//! use keypool_cooldown::facts::RateLimitInfo;
//! use keypool_cooldown::{classify, AttemptFailure, FailureClass, Trigger};
//!
//! let info = RateLimitInfo { retry_after_ms: Some(20_000), ..Default::default() };
//! let c = classify(&AttemptFailure::Status { status: StatusCode::TOO_MANY_REQUESTS, rate_limit: &info, marks: Default::default() }, 0);
//! assert_eq!(c.class, FailureClass::RateLimit);
//! assert_eq!(c.trigger, Trigger::RetryAfter { wait_ms: 20_000 });
//! assert!(!c.is_request_error());
//! ```

use http::StatusCode;
use keypool_core::UnixMs;
use serde::{Deserialize, Serialize};

use keypool_core::ModelFamily;

use crate::facts::{RateLimitInfo, UnifiedStatus};

/// The class of a failed attempt (SPEC 6, first table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The credential itself is bad: the account is disabled (when
    /// `auto_disable_on_error` is on).
    KeyError,
    /// The credential is fine but exhausted now: cooldown set by the trigger.
    RateLimit,
    /// The attempt failed, the credential is probably fine: short backoff, or none.
    Transient,
}

impl FailureClass {
    /// Low-cardinality name for metrics and logs: `key_error`, `rate_limit`, `transient`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::KeyError => "key_error",
            Self::RateLimit => "rate_limit",
            Self::Transient => "transient",
        }
    }
}

/// A failure that produced no upstream status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportFailure {
    /// No response headers within `upstream_timeout`.
    Timeout,
    /// The connection (TCP or TLS) could not be established.
    Connect,
    /// The connection was reset or closed before the response was complete.
    Reset,
    /// Streaming: no valid first frame within `first_frame_timeout`, an `error` frame
    /// before the commit point, or a body that ended first.
    InvalidStreamStart,
    /// Not streaming: a 2xx that is not a valid answer (not JSON, empty, a content
    /// encoding although identity was asked for, an event stream, larger than the
    /// limit, or not complete in time).
    InvalidAnswer,
    /// Streaming: content bytes per second stayed below `stream_min_bytes_per_sec` over
    /// the slow-stream watchdog's window (SPEC 16).
    SlowStream,
}

/// What an error body says beyond its status (SPEC 16), found by
/// [`crate::CooldownConfig::marks`]: the only part of an upstream body classification
/// reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BodyMarks {
    /// The body matches one of `ban_markers` (the account is banned).
    pub ban: bool,
    /// The body says the credit balance is too low.
    pub credits: bool,
    /// The body's error type is `not_found_error` (a 404 for the model).
    pub not_found: bool,
}

/// The failure of one attempt, as the proxy saw it.
#[derive(Debug, Clone, Copy)]
pub enum AttemptFailure<'a> {
    /// The upstream answered with a non-2xx status (or a status the proxy treats as a
    /// failure), with the rate-limit headers of that response.
    Status {
        /// The upstream status.
        status: StatusCode,
        /// The response's parsed rate-limit headers.
        rate_limit: &'a RateLimitInfo,
        /// What its body says ([`BodyMarks`]).
        marks: BodyMarks,
    },
    /// No usable upstream status.
    Transport(TransportFailure),
}

/// Which row of the SPEC 6 trigger table applied. Carries what the cooldown needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Trigger {
    /// 401: the credential was refused (the account is disabled).
    AuthRejected {
        /// 401.
        status: u16,
    },
    /// 403 without a ban marker: a 60 s cooldown; the 3rd consecutive one bans the
    /// account (SPEC 16).
    Forbidden,
    /// An error body matching `ban_markers`: the account is banned at once.
    Banned {
        /// The upstream status.
        status: u16,
    },
    /// 402: billing, credits exhausted.
    PaymentRequired,
    /// Another status whose body says the credit balance is too low (Anthropic answers
    /// so with a 400): credits exhausted.
    CreditBalanceLow {
        /// The upstream status.
        status: u16,
    },
    /// 429 with unified `-status: rejected` and the representative claim of one model
    /// family's weekly window (`seven_day_opus`): the account is out for that family
    /// only (the window book holds it), no cooldown.
    FamilyWindowExhausted {
        /// The family.
        family: ModelFamily,
        /// The reset, unix ms.
        reset: UnixMs,
    },
    /// A `404 not_found_error`: the request's fault like any 404, and the model is
    /// locked on the account (SPEC 16 model lockout).
    ModelNotFound,
    /// 429 with unified `-status: rejected` and a future reset: cooldown until `reset`.
    WindowExhausted {
        /// The reset, unix ms.
        reset: UnixMs,
    },
    /// 429 with `retry-after` or `retry-after-ms`: cooldown for that long (clamped).
    RetryAfter {
        /// The upstream's wait in ms, not yet clamped.
        wait_ms: u64,
    },
    /// 429 with nothing else to go on: fixed cooldown, shorter in large pools.
    PlainRateLimit,
    /// 529 or 503: overloaded, fixed short cooldown.
    Overloaded {
        /// 529 or 503.
        status: u16,
    },
    /// Any other status that is not in the table (other 5xx, 3xx, other 4xx): backoff.
    OtherStatus {
        /// The status.
        status: u16,
    },
    /// A transport failure: backoff.
    Transport {
        /// What failed.
        failure: TransportFailure,
    },
    /// 400, 404, 413 or 422: the request's fault. No cooldown, no backoff.
    RequestError {
        /// The status.
        status: u16,
    },
}

impl Trigger {
    /// Low-cardinality name for metrics and logs.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::AuthRejected { .. } => "auth_rejected",
            Self::Forbidden => "forbidden",
            Self::Banned { .. } => "banned",
            Self::PaymentRequired => "payment_required",
            Self::CreditBalanceLow { .. } => "credit_balance_low",
            Self::FamilyWindowExhausted { .. } => "family_window_exhausted",
            Self::ModelNotFound => "model_not_found",
            Self::WindowExhausted { .. } => "window_exhausted",
            Self::RetryAfter { .. } => "retry_after",
            Self::PlainRateLimit => "rate_limited",
            Self::Overloaded { .. } => "overloaded",
            Self::OtherStatus { status } if *status >= 500 => "server_error",
            Self::OtherStatus { .. } => "other_status",
            Self::Transport { failure } => match failure {
                TransportFailure::Timeout => "timeout",
                TransportFailure::Connect => "connect_error",
                TransportFailure::Reset => "reset",
                TransportFailure::InvalidStreamStart => "invalid_stream_start",
                TransportFailure::InvalidAnswer => "invalid_answer",
                TransportFailure::SlowStream => "slow_stream",
            },
            Self::RequestError { .. } => "request_error",
        }
    }

    /// True for the rows whose cooldown is the exponential backoff (other statuses and
    /// transport failures).
    pub const fn is_backoff(&self) -> bool {
        matches!(self, Self::OtherStatus { .. } | Self::Transport { .. })
    }
}

/// The verdict on one failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Classification {
    /// What happens to the account.
    pub class: FailureClass,
    /// Which table row applied.
    pub trigger: Trigger,
}

impl Classification {
    /// True for 400, 404, 413 and 422: the request's fault, not the account's. The
    /// proxy tries at most one more account after one; the rating engine does not count
    /// it as an error; the cooldown book ignores it.
    pub const fn is_request_error(&self) -> bool {
        matches!(
            self.trigger,
            Trigger::RequestError { .. } | Trigger::ModelNotFound
        )
    }

    /// The terminal state this failure puts the account in at once (SPEC 16), when
    /// `auto_disable_on_error` is on: `disabled` (401), `credits_exhausted` (402, or a
    /// body saying the balance is too low), `banned` (a ban marker). A plain 403 is
    /// none: it bans only as the 3rd of a streak ([`crate::PoolHealth::record_failure`]).
    pub const fn terminal(&self) -> Option<crate::Terminal> {
        match self.trigger {
            Trigger::AuthRejected { .. } => Some(crate::Terminal::Disabled),
            Trigger::PaymentRequired | Trigger::CreditBalanceLow { .. } => {
                Some(crate::Terminal::CreditsExhausted)
            }
            Trigger::Banned { .. } => Some(crate::Terminal::Banned),
            _ => None,
        }
    }
}

/// The statuses that are the request's fault (SPEC 6 last row).
pub const REQUEST_ERROR_STATUSES: [u16; 4] = [400, 404, 413, 422];

/// Classifies one failed attempt exactly per the SPEC 6 tables.
///
/// For a 429 the rows are tried in table order: a window-exhausted 429 needs unified
/// `-status: rejected` and a reset after `now` (the unified `-reset`; when it is absent,
/// the latest reset of a window whose own status is `rejected`); then `retry-after-ms`
/// / `retry-after`; then the plain row. `now` is only used to skip a reset that has
/// already passed.
///
/// Statuses the table does not name (other 4xx such as 405 or 408, 3xx, and a 2xx the
/// proxy nevertheless counts as failed) are `transient` with the backoff of the "other
/// 5xx" row: the attempt failed, and nothing says the credential is bad.
///
/// The body's [`BodyMarks`] come first for 400, 401 and 403 (SPEC 16): a ban marker
/// is `banned`, a low credit balance `credits_exhausted`; a `404 not_found_error` is
/// [`Trigger::ModelNotFound`].
pub fn classify(failure: &AttemptFailure<'_>, now: UnixMs) -> Classification {
    let (class, trigger) = match *failure {
        AttemptFailure::Transport(failure) => {
            (FailureClass::Transient, Trigger::Transport { failure })
        }
        AttemptFailure::Status {
            status,
            rate_limit,
            marks,
        } => {
            let code = status.as_u16();
            let marked = matches!(code, 400 | 401 | 403);
            match code {
                _ if marked && marks.ban => {
                    (FailureClass::KeyError, Trigger::Banned { status: code })
                }
                _ if marked && marks.credits => (
                    FailureClass::KeyError,
                    Trigger::CreditBalanceLow { status: code },
                ),
                401 => (
                    FailureClass::KeyError,
                    Trigger::AuthRejected { status: code },
                ),
                403 => (FailureClass::KeyError, Trigger::Forbidden),
                402 => (FailureClass::KeyError, Trigger::PaymentRequired),
                404 if marks.not_found => (FailureClass::Transient, Trigger::ModelNotFound),
                429 => (FailureClass::RateLimit, rate_limit_trigger(rate_limit, now)),
                503 | 529 => (
                    FailureClass::Transient,
                    Trigger::Overloaded { status: code },
                ),
                400 | 404 | 413 | 422 => (
                    FailureClass::Transient,
                    Trigger::RequestError { status: code },
                ),
                _ => (
                    FailureClass::Transient,
                    Trigger::OtherStatus { status: code },
                ),
            }
        }
    };
    Classification { class, trigger }
}

fn rate_limit_trigger(info: &RateLimitInfo, now: UnixMs) -> Trigger {
    if let Some(reset) = window_exhausted_reset(info).filter(|&r| r > now) {
        return match info.claimed_family() {
            Some(family) => Trigger::FamilyWindowExhausted { family, reset },
            None => Trigger::WindowExhausted { reset },
        };
    }
    match info.retry_after_ms {
        Some(wait_ms) => Trigger::RetryAfter { wait_ms },
        None => Trigger::PlainRateLimit,
    }
}

fn window_exhausted_reset(info: &RateLimitInfo) -> Option<UnixMs> {
    if info.unified_status != Some(UnifiedStatus::Rejected) {
        return None;
    }
    info.unified_reset.or_else(|| {
        [&info.five_hour, &info.seven_day]
            .into_iter()
            .filter(|w| w.status == Some(UnifiedStatus::Rejected))
            .filter_map(|w| w.reset)
            .max()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::WindowUsage;

    const NOW: UnixMs = 1_700_000_000_000;

    fn status(code: u16, info: &RateLimitInfo) -> Classification {
        let status = StatusCode::from_u16(code).unwrap();
        classify(
            &AttemptFailure::Status {
                status,
                rate_limit: info,
                marks: BodyMarks::default(),
            },
            NOW,
        )
    }

    fn plain(code: u16) -> Classification {
        status(code, &RateLimitInfo::default())
    }

    fn marked(code: u16, marks: BodyMarks) -> Classification {
        classify(
            &AttemptFailure::Status {
                status: StatusCode::from_u16(code).unwrap(),
                rate_limit: &RateLimitInfo::default(),
                marks,
            },
            NOW,
        )
    }

    /// SPEC 6's rows for 401, 402 and 403 with SPEC 16's terminal states.
    #[test]
    fn terminal_rows_and_body_marks() {
        use crate::Terminal;
        let ban = BodyMarks {
            ban: true,
            ..BodyMarks::default()
        };
        let credits = BodyMarks {
            credits: true,
            ..BodyMarks::default()
        };
        assert_eq!(plain(401).terminal(), Some(Terminal::Disabled));
        assert_eq!(plain(402).terminal(), Some(Terminal::CreditsExhausted));
        assert_eq!(plain(403).trigger, Trigger::Forbidden);
        assert_eq!(plain(403).class, FailureClass::KeyError);
        assert_eq!(plain(403).terminal(), None);
        for code in [400, 401, 403] {
            assert_eq!(marked(code, ban).trigger, Trigger::Banned { status: code });
            assert_eq!(marked(code, ban).terminal(), Some(Terminal::Banned));
            assert_eq!(
                marked(code, credits).terminal(),
                Some(Terminal::CreditsExhausted)
            );
        }
        // a ban marker in a 429 or a 5xx body is not a ban
        assert_eq!(marked(429, ban).trigger, Trigger::PlainRateLimit);
        assert_eq!(marked(500, ban).trigger.as_str(), "server_error");
        // 404: a model lockout only with the error type not_found_error
        let nf = BodyMarks {
            not_found: true,
            ..BodyMarks::default()
        };
        assert_eq!(marked(404, nf).trigger, Trigger::ModelNotFound);
        assert!(marked(404, nf).is_request_error());
        assert_eq!(plain(404).trigger, Trigger::RequestError { status: 404 });
    }

    #[test]
    fn a_family_claim_is_not_the_whole_account() {
        let info = RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            unified_reset: Some(NOW + 3_600_000),
            representative_claim: Some("seven_day_opus".into()),
            ..Default::default()
        };
        assert_eq!(
            status(429, &info).trigger,
            Trigger::FamilyWindowExhausted {
                family: ModelFamily::Opus,
                reset: NOW + 3_600_000
            }
        );
        assert_eq!(status(429, &info).class, FailureClass::RateLimit);
    }

    #[test]
    fn auth_and_billing_are_key_errors() {
        let c = plain(401);
        assert_eq!(c.class, FailureClass::KeyError);
        assert_eq!(c.trigger, Trigger::AuthRejected { status: 401 });
        assert_eq!(plain(402).class, FailureClass::KeyError);
        assert_eq!(plain(402).trigger, Trigger::PaymentRequired);
    }

    #[test]
    fn rate_limit_rows_in_table_order() {
        let rejected = RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            unified_reset: Some(NOW + 3_600_000),
            retry_after_ms: Some(5_000),
            ..Default::default()
        };
        let c = status(429, &rejected);
        assert_eq!(c.class, FailureClass::RateLimit);
        assert_eq!(
            c.trigger,
            Trigger::WindowExhausted {
                reset: NOW + 3_600_000
            }
        );

        // A reset in the past does not make a window-exhausted row.
        let stale = RateLimitInfo {
            unified_reset: Some(NOW),
            ..rejected.clone()
        };
        assert_eq!(
            status(429, &stale).trigger,
            Trigger::RetryAfter { wait_ms: 5_000 }
        );

        // `allowed` with a reset is not the window row either.
        let allowed = RateLimitInfo {
            unified_status: Some(UnifiedStatus::Allowed),
            ..rejected.clone()
        };
        assert_eq!(
            status(429, &allowed).trigger,
            Trigger::RetryAfter { wait_ms: 5_000 }
        );

        assert_eq!(plain(429).trigger, Trigger::PlainRateLimit);
        assert_eq!(plain(429).class, FailureClass::RateLimit);
    }

    #[test]
    fn rejected_without_unified_reset_uses_the_rejected_windows_reset() {
        let info = RateLimitInfo {
            unified_status: Some(UnifiedStatus::Rejected),
            seven_day: WindowUsage {
                status: Some(UnifiedStatus::Rejected),
                reset: Some(NOW + 86_400_000),
                utilization: Some(1.0),
            },
            five_hour: WindowUsage {
                status: Some(UnifiedStatus::Allowed),
                reset: Some(NOW + 1_000),
                utilization: Some(0.2),
            },
            ..Default::default()
        };
        assert_eq!(
            status(429, &info).trigger,
            Trigger::WindowExhausted {
                reset: NOW + 86_400_000
            }
        );
    }

    #[test]
    fn overloaded_other_5xx_and_transport_are_transient() {
        for code in [503, 529] {
            assert_eq!(plain(code).class, FailureClass::Transient);
            assert_eq!(plain(code).trigger, Trigger::Overloaded { status: code });
            assert_eq!(plain(code).trigger.as_str(), "overloaded");
        }
        for code in [500, 502, 504, 599] {
            assert_eq!(plain(code).class, FailureClass::Transient);
            assert!(plain(code).trigger.is_backoff());
            assert_eq!(plain(code).trigger.as_str(), "server_error");
        }
        for (failure, name) in [
            (TransportFailure::Timeout, "timeout"),
            (TransportFailure::Connect, "connect_error"),
            (TransportFailure::Reset, "reset"),
            (TransportFailure::InvalidStreamStart, "invalid_stream_start"),
            (TransportFailure::InvalidAnswer, "invalid_answer"),
        ] {
            let c = classify(&AttemptFailure::Transport(failure), NOW);
            assert_eq!(c.class, FailureClass::Transient);
            assert_eq!(c.trigger, Trigger::Transport { failure });
            assert!(c.trigger.is_backoff());
            assert_eq!(c.trigger.as_str(), name);
        }
    }

    #[test]
    fn request_errors_are_transient_without_backoff() {
        for code in REQUEST_ERROR_STATUSES {
            let c = plain(code);
            assert_eq!(c.class, FailureClass::Transient);
            assert!(c.is_request_error());
            assert!(!c.trigger.is_backoff());
            assert_eq!(c.trigger.as_str(), "request_error");
        }
        for code in [401, 405, 408, 429, 500, 503] {
            assert!(!plain(code).is_request_error(), "{code}");
        }
        let c = plain(408);
        assert_eq!(
            (c.class, c.trigger.as_str()),
            (FailureClass::Transient, "other_status")
        );
    }

    proptest::proptest! {
        /// Every status classifies without panicking, request errors are exactly the
        /// four statuses, key errors exactly 401, 402, 403, rate limits exactly 429.
        #[test]
        fn every_status_has_exactly_one_row(code in 100u16..1000) {
            let c = plain(code);
            proptest::prop_assert_eq!(c.is_request_error(), REQUEST_ERROR_STATUSES.contains(&code));
            proptest::prop_assert_eq!(c.class == FailureClass::KeyError, matches!(code, 401..=403));
            proptest::prop_assert_eq!(c.class == FailureClass::RateLimit, code == 429);
        }
    }

    #[test]
    fn names_are_stable() {
        assert_eq!(FailureClass::KeyError.as_str(), "key_error");
        assert_eq!(FailureClass::RateLimit.as_str(), "rate_limit");
        assert_eq!(FailureClass::Transient.as_str(), "transient");
        assert_eq!(Trigger::PlainRateLimit.as_str(), "rate_limited");
        let json = serde_json::to_string(&plain(429)).unwrap();
        assert_eq!(
            json,
            r#"{"class":"rate_limit","trigger":{"kind":"plain_rate_limit"}}"#
        );
    }
}
