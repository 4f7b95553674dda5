//! Failure classification: what one failed attempt says about its account (SPEC 6).
//!
//! [`classify`] maps an attempt's failure, an upstream status with its parsed headers or
//! a transport failure, to a [`Classification`]: the [`FailureClass`] (what happens to
//! the account) and the [`Trigger`] (which row of the SPEC 6 trigger table applied, and
//! so how long the cooldown lasts; see [`crate::CooldownConfig::trigger_duration_ms`]).
//!
//! ```
//! use http::StatusCode;
//! use keypool_cooldown::headers::RateLimitInfo;
//! use keypool_cooldown::{classify, AttemptFailure, FailureClass, Trigger};
//!
//! let info = RateLimitInfo { retry_after_ms: Some(20_000), ..Default::default() };
//! let c = classify(&AttemptFailure::Status { status: StatusCode::TOO_MANY_REQUESTS, rate_limit: &info }, 0);
//! assert_eq!(c.class, FailureClass::RateLimit);
//! assert_eq!(c.trigger, Trigger::RetryAfter { wait_ms: 20_000 });
//! assert!(!c.is_request_error());
//! ```

use http::StatusCode;
use keypool_core::UnixMs;
use serde::{Deserialize, Serialize};

use crate::headers::{RateLimitInfo, UnifiedStatus};

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
    },
    /// No usable upstream status.
    Transport(TransportFailure),
}

/// Which row of the SPEC 6 trigger table applied. Carries what the cooldown needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Trigger {
    /// 401 or 403: the credential was refused.
    AuthRejected {
        /// 401 or 403.
        status: u16,
    },
    /// 402: billing, credits exhausted.
    PaymentRequired,
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
            Self::PaymentRequired => "payment_required",
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
        matches!(self.trigger, Trigger::RequestError { .. })
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
pub fn classify(failure: &AttemptFailure<'_>, now: UnixMs) -> Classification {
    let (class, trigger) = match *failure {
        AttemptFailure::Transport(failure) => {
            (FailureClass::Transient, Trigger::Transport { failure })
        }
        AttemptFailure::Status { status, rate_limit } => {
            let code = status.as_u16();
            match code {
                401 | 403 => (
                    FailureClass::KeyError,
                    Trigger::AuthRejected { status: code },
                ),
                402 => (FailureClass::KeyError, Trigger::PaymentRequired),
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
        return Trigger::WindowExhausted { reset };
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
    use crate::headers::WindowUsage;

    const NOW: UnixMs = 1_700_000_000_000;

    fn status(code: u16, info: &RateLimitInfo) -> Classification {
        let status = StatusCode::from_u16(code).unwrap();
        classify(
            &AttemptFailure::Status {
                status,
                rate_limit: info,
            },
            NOW,
        )
    }

    fn plain(code: u16) -> Classification {
        status(code, &RateLimitInfo::default())
    }

    #[test]
    fn auth_and_billing_are_key_errors() {
        for code in [401, 403] {
            let c = plain(code);
            assert_eq!(c.class, FailureClass::KeyError);
            assert_eq!(c.trigger, Trigger::AuthRejected { status: code });
        }
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
