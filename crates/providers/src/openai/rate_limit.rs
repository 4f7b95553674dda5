//! The rate-limit headers of OpenAI-compatible upstreams, parsed into neutral facts.
//!
//! OpenAI (and the many servers that copy it) send, on every answer:
//! `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`,
//! `x-ratelimit-reset-requests` and the same three for `tokens`. The resets are Go-style
//! durations (`1s`, `6m0s`, `20ms`, `1h2m3.5s`) until the budget is whole again. This
//! module reads them into [`OpenAiRateLimits`]: counts, and a reset as milliseconds from
//! the response, which the caller adds to its `now`. It reads no clock and decides
//! nothing: turning a fact into a cooldown is another crate's policy.

use crate::response::HeaderLines;
use keypool_cooldown::facts::RateLimitInfo;
use keypool_core::UnixMs;
use serde::Serialize;

/// One budget's reading (requests or tokens); absent or unreadable headers are `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct LimitReading {
    /// `x-ratelimit-limit-*`: the budget's size.
    pub limit: Option<u64>,
    /// `x-ratelimit-remaining-*`: what is left of it.
    pub remaining: Option<u64>,
    /// `x-ratelimit-reset-*`: milliseconds from the response until it is whole again
    /// (rounded up).
    pub reset_after_ms: Option<u64>,
}

impl LimitReading {
    /// Whether no header of this budget was readable.
    pub fn is_empty(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.reset_after_ms.is_none()
    }

    /// Whether the budget is used up (`remaining` is 0).
    pub fn is_exhausted(&self) -> bool {
        self.remaining == Some(0)
    }
}

/// Both budgets of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct OpenAiRateLimits {
    /// The request budget (`*-requests`).
    pub requests: LimitReading,
    /// The token budget (`*-tokens`).
    pub tokens: LimitReading,
}

impl OpenAiRateLimits {
    /// The budgets `headers` report.
    pub fn from_headers<H: HeaderLines + ?Sized>(headers: &H) -> Self {
        Self {
            requests: reading(headers, "requests"),
            tokens: reading(headers, "tokens"),
        }
    }

    /// When an exhausted budget (or both) is whole again, in milliseconds from the
    /// response: the later reset of the exhausted ones, `None` when none is exhausted
    /// or its reset is unknown.
    pub fn exhausted_reset_after_ms(&self) -> Option<u64> {
        [self.requests, self.tokens]
            .iter()
            .filter(|r| r.is_exhausted())
            .filter_map(|r| r.reset_after_ms)
            .max()
    }
}

impl OpenAiRateLimits {
    /// Adds these facts to `info`, the neutral form `keypool-cooldown` reads (so that
    /// an `openai` account cools like an Anthropic one): the request budget becomes
    /// `requests_remaining` / `requests_reset`, and an exhausted token budget counts as
    /// no request left until it is whole again (the later reset of the exhausted
    /// ones); without a `retry-after` of its own, an exhausted budget's reset is the
    /// wait. `now` is when the response arrived (unix ms); headers already in `info`
    /// win.
    pub fn apply_to(&self, info: &mut RateLimitInfo, now: UnixMs) {
        let exhausted = self.exhausted_reset_after_ms();
        if info.requests_remaining.is_none() {
            info.requests_remaining = match exhausted {
                Some(_) => Some(0),
                None => self.requests.remaining,
            };
        }
        if info.requests_reset.is_none() {
            info.requests_reset = exhausted
                .or(self.requests.reset_after_ms)
                .map(|ms| now.saturating_add(ms));
        }
        if info.retry_after_ms.is_none() {
            info.retry_after_ms = exhausted;
        }
    }
}

fn reading<H: HeaderLines + ?Sized>(headers: &H, budget: &str) -> LimitReading {
    let header = |kind: &str| headers.first_str(&format!("x-ratelimit-{kind}-{budget}"));
    let count = |kind: &str| header(kind).and_then(|v| v.parse::<u64>().ok());
    LimitReading {
        limit: count("limit"),
        remaining: count("remaining"),
        reset_after_ms: header("reset").and_then(parse_duration_ms),
    }
}

/// Nanoseconds per unit of a Go duration, longest unit names first so `ms` is not read
/// as `m`.
const UNITS: [(&str, u128); 7] = [
    ("ms", 1_000_000),
    ("us", 1_000),
    ("µs", 1_000),
    ("ns", 1),
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
];

/// A Go-style duration (`1s`, `6m0s`, `20ms`, `1h2m3.5s`, `0.5s`), or a bare number of
/// seconds (`"2"`, `"1.5"`, as some compatible servers send), in milliseconds rounded
/// up. `None` for anything else (empty, negative, a unit it does not know, overflow).
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if let Some(nanos) = number_nanos(text, 1_000_000_000) {
        return nanos_to_ms(nanos);
    }
    let mut rest = text;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        let (unit, per_unit) = UNITS.iter().find(|(name, _)| after.starts_with(name))?;
        total = total.checked_add(number_nanos(number, *per_unit)?)?;
        rest = &after[unit.len()..];
    }
    nanos_to_ms(total)
}

/// `number` (digits, optionally `.` and more digits) times `per_unit` nanoseconds.
fn number_nanos(number: &str, per_unit: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty() || !digits(whole) || !digits(fraction) {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut nanos = whole.checked_mul(per_unit)?;
    // Sub-nanosecond digits cannot matter; 30 fraction digits stay within u128.
    let fraction = &fraction[..fraction.len().min(30)];
    if !fraction.is_empty() {
        let scale = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
        let part: u128 = fraction.parse().ok()?;
        nanos = nanos.checked_add(part.checked_mul(per_unit)?.div_ceil(scale))?;
    }
    Some(nanos)
}

fn nanos_to_ms(nanos: u128) -> Option<u64> {
    u64::try_from(nanos.div_ceil(1_000_000)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;
    use http::HeaderValue;
    use proptest::prelude::*;

    #[test]
    fn go_durations_become_milliseconds() {
        for (text, ms) in [
            ("1s", 1_000),
            ("6m0s", 360_000),
            ("20ms", 20),
            ("1h2m3.5s", 3_723_500),
            ("0s", 0),
            ("0.5s", 500),
            ("1.5ms", 2),
            ("250us", 1),
            ("1µs", 1),
            ("3ns", 1),
            ("2", 2_000),
            ("1.25", 1_250),
            (" 17ms ", 17),
            ("7m12.345s", 432_345),
        ] {
            assert_eq!(parse_duration_ms(text), Some(ms), "{text}");
        }
    }

    #[test]
    fn other_text_is_no_duration() {
        for text in [
            "", "s", "1x", "-1s", "1s2", "1..2s", ".s", "1 s", "abc", "1e3s",
        ] {
            assert_eq!(parse_duration_ms(text), None, "{text:?}");
        }
        assert_eq!(parse_duration_ms(&format!("{}h", u128::MAX)), None);
    }

    #[test]
    fn headers_give_both_budgets() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "6m0s"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-tokens", "29950"),
            ("x-ratelimit-reset-tokens", "100ms"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        let limits = OpenAiRateLimits::from_headers(&headers);
        assert_eq!(
            limits,
            OpenAiRateLimits {
                requests: LimitReading {
                    limit: Some(500),
                    remaining: Some(0),
                    reset_after_ms: Some(360_000),
                },
                tokens: LimitReading {
                    limit: Some(30_000),
                    remaining: Some(29_950),
                    reset_after_ms: Some(100),
                },
            }
        );
        assert!(limits.requests.is_exhausted());
        assert_eq!(limits.exhausted_reset_after_ms(), Some(360_000));
    }

    #[test]
    fn missing_or_garbled_headers_are_none() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-ratelimit-remaining-tokens",
            HeaderValue::from_static("many"),
        );
        headers.insert("x-ratelimit-reset-tokens", HeaderValue::from_static("soon"));
        let limits = OpenAiRateLimits::from_headers(&headers);
        assert!(limits.requests.is_empty());
        assert!(limits.tokens.is_empty());
        assert_eq!(limits.exhausted_reset_after_ms(), None);
        assert_eq!(
            OpenAiRateLimits::from_headers(&HeaderMap::new()),
            OpenAiRateLimits::default()
        );
    }

    #[test]
    fn exhausted_budgets_become_neutral_cooldown_facts() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("x-ratelimit-remaining-requests", "12"),
            ("x-ratelimit-reset-requests", "2s"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        let mut info = RateLimitInfo::default();
        OpenAiRateLimits::from_headers(&headers).apply_to(&mut info, 1_000);
        assert_eq!(info.requests_remaining, Some(0));
        assert_eq!(info.requests_reset, Some(361_000));
        assert_eq!(info.retry_after_ms, Some(360_000));

        // Nothing exhausted: the request budget as it is, no wait.
        let mut fresh = HeaderMap::new();
        fresh.insert(
            "x-ratelimit-remaining-requests",
            HeaderValue::from_static("5"),
        );
        fresh.insert("x-ratelimit-reset-requests", HeaderValue::from_static("1s"));
        let mut info = RateLimitInfo {
            retry_after_ms: Some(7),
            ..RateLimitInfo::default()
        };
        OpenAiRateLimits::from_headers(&fresh).apply_to(&mut info, 0);
        assert_eq!(info.requests_remaining, Some(5));
        assert_eq!(info.requests_reset, Some(1_000));
        assert_eq!(
            info.retry_after_ms,
            Some(7),
            "the upstream's own retry-after wins"
        );
    }

    proptest! {
        #[test]
        fn composed_durations_add_up(h in 0u64..100, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            let expected = ((h * 60 + m) * 60 + s) * 1000 + ms;
            prop_assert_eq!(parse_duration_ms(&text), Some(expected));
        }

        #[test]
        fn any_text_parses_without_panicking(text in "\\PC{0,24}") {
            let _ = parse_duration_ms(&text);
        }
    }
}
