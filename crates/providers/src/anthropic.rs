//! The Anthropic adapter's reading of rate-limit headers (SPEC 5, 6 and 8): the
//! `anthropic-ratelimit-*` family, `retry-after` and `retry-after-ms`, read into the
//! neutral [`RateLimitInfo`] of `keypool-cooldown`, which never sees a header.
//!
//! Every function here is pure: it reads a response's header lines (an
//! [`http::HeaderMap`] or any [`HeaderLines`]) or one header value and, where a header
//! is relative to "now" (`retry-after` as an HTTP date), takes `now` as an argument. A value that does not parse is ignored
//! (`None`), never an error and never a panic: upstream headers are untrusted input.
//! Every reset is bounded ([`RateLimitInfo::bound_resets`]) before the facts leave this
//! module.
//!
//! ```
//! use http::HeaderMap;
//! use keypool_cooldown::facts::UnifiedStatus;
//! use keypool_providers::anthropic::rate_limit_facts;
//!
//! let mut h = HeaderMap::new();
//! h.insert("retry-after", "30".parse().unwrap());
//! h.insert("anthropic-ratelimit-unified-status", "rejected".parse().unwrap());
//! h.insert("anthropic-ratelimit-unified-reset", "1700003600".parse().unwrap());
//! h.insert("anthropic-ratelimit-unified-5h-utilization", "0.97".parse().unwrap());
//! h.insert("anthropic-ratelimit-unified-5h-reset", "bogus".parse().unwrap());
//!
//! let info = rate_limit_facts(&h, 1_700_000_000_000);
//! assert_eq!(info.retry_after_ms, Some(30_000));
//! assert_eq!(info.unified_status, Some(UnifiedStatus::Rejected));
//! assert_eq!(info.unified_reset, Some(1_700_003_600_000));
//! assert_eq!(info.five_hour.utilization, Some(0.97));
//! assert_eq!(info.five_hour.reset, None); // malformed: ignored
//! assert!(info.corrections.is_empty());
//!
//! // A reset 3 trillion years ahead is clamped to 7 days (and 5 minutes of slack).
//! h.insert("anthropic-ratelimit-unified-reset", "99999999999999999999".parse().unwrap());
//! let info = rate_limit_facts(&h, 1_700_000_000_000);
//! assert_eq!(info.unified_reset, Some(1_700_000_000_000 + 7 * 86_400_000 + 300_000));
//! assert_eq!(info.corrections.len(), 1);
//! ```

use std::time::UNIX_EPOCH;

use crate::response::{HeaderLines, visible_text};
use keypool_cooldown::facts::{FamilyWeekly, RateLimitInfo, ResetKind, UnifiedStatus, WindowUsage};
use keypool_core::{ModelFamily, UnixMs};

/// `retry-after`: delay in seconds, or an HTTP date.
pub const RETRY_AFTER: &str = "retry-after";
/// `retry-after-ms`: delay in milliseconds (Anthropic, OpenAI).
pub const RETRY_AFTER_MS: &str = "retry-after-ms";
/// Overall unified status: `allowed`, `allowed_warning` or `rejected`.
pub const UNIFIED_STATUS: &str = "anthropic-ratelimit-unified-status";
/// Overall unified reset, unix seconds.
pub const UNIFIED_RESET: &str = "anthropic-ratelimit-unified-reset";
/// Which window the overall status stands for (`five_hour`, `seven_day`, ...).
pub const UNIFIED_REPRESENTATIVE_CLAIM: &str = "anthropic-ratelimit-unified-representative-claim";
/// 5-hour window utilisation, a fraction (0–1).
pub const UNIFIED_5H_UTILIZATION: &str = "anthropic-ratelimit-unified-5h-utilization";
/// 5-hour window reset, unix seconds.
pub const UNIFIED_5H_RESET: &str = "anthropic-ratelimit-unified-5h-reset";
/// 5-hour window status.
pub const UNIFIED_5H_STATUS: &str = "anthropic-ratelimit-unified-5h-status";
/// Weekly window utilisation, a fraction (0–1).
pub const UNIFIED_7D_UTILIZATION: &str = "anthropic-ratelimit-unified-7d-utilization";
/// Weekly window reset, unix seconds.
pub const UNIFIED_7D_RESET: &str = "anthropic-ratelimit-unified-7d-reset";
/// Weekly window status.
pub const UNIFIED_7D_STATUS: &str = "anthropic-ratelimit-unified-7d-status";
/// Per-family weekly windows (SPEC 16): utilisation, reset and status headers of
/// `anthropic-ratelimit-unified-7d_<family>-*`, indexed by [`ModelFamily::index`]. The
/// representative claim names the same windows `seven_day_<family>`.
pub const UNIFIED_7D_FAMILY: [[&str; 3]; 3] = [
    [
        "anthropic-ratelimit-unified-7d_opus-utilization",
        "anthropic-ratelimit-unified-7d_opus-reset",
        "anthropic-ratelimit-unified-7d_opus-status",
    ],
    [
        "anthropic-ratelimit-unified-7d_sonnet-utilization",
        "anthropic-ratelimit-unified-7d_sonnet-reset",
        "anthropic-ratelimit-unified-7d_sonnet-status",
    ],
    [
        "anthropic-ratelimit-unified-7d_haiku-utilization",
        "anthropic-ratelimit-unified-7d_haiku-reset",
        "anthropic-ratelimit-unified-7d_haiku-status",
    ],
];
/// API-key accounts: requests left in the current rate-limit period.
pub const REQUESTS_REMAINING: &str = "anthropic-ratelimit-requests-remaining";
/// API-key accounts: when the request limit refills (RFC 3339, or unix seconds).
pub const REQUESTS_RESET: &str = "anthropic-ratelimit-requests-reset";

/// Longest accepted representative-claim value; longer ones are ignored.
const MAX_CLAIM_LEN: usize = 64;

/// The header a reset of `kind` comes from.
pub const fn reset_header(kind: ResetKind) -> &'static str {
    match kind {
        ResetKind::Unified => UNIFIED_RESET,
        ResetKind::FiveHour => UNIFIED_5H_RESET,
        ResetKind::SevenDay => UNIFIED_7D_RESET,
        ResetKind::Requests => REQUESTS_RESET,
        ResetKind::FamilySevenDay(family) => UNIFIED_7D_FAMILY[family.index()][1],
    }
}

/// Reads every rate-limit header keypool knows from `headers`. `now` turns an
/// HTTP-date `retry-after` into a delay and bounds every reset
/// ([`RateLimitInfo::bound_resets`], reported in `corrections`).
pub fn rate_limit_facts<H: HeaderLines + ?Sized>(headers: &H, now: UnixMs) -> RateLimitInfo {
    let mut info = parse(headers, now);
    info.corrections = info.bound_resets(now);
    info
}

/// The headers as sent, without bounding the resets.
fn parse<H: HeaderLines + ?Sized>(headers: &H, now: UnixMs) -> RateLimitInfo {
    let found = Found::scan(headers);
    let get = |slot: usize| found.0[slot];
    let retry_after_ms = get(Found::RETRY_AFTER_MS)
        .and_then(parse_retry_after_ms)
        .or_else(|| get(Found::RETRY_AFTER).and_then(|v| parse_retry_after(v, now)));
    let window = |util: usize| WindowUsage {
        utilization: get(util).and_then(parse_utilization),
        reset: get(util + 1).and_then(parse_unix_seconds),
        status: get(util + 2).and_then(parse_unified_status),
    };
    let mut families = FamilyWeekly::default();
    for family in ModelFamily::ALL {
        *families.get_mut(*family) = window(Found::FAMILY + 3 * family.index());
    }
    RateLimitInfo {
        retry_after_ms,
        families,
        unified_status: get(Found::UNIFIED_STATUS).and_then(parse_unified_status),
        unified_reset: get(Found::UNIFIED_RESET).and_then(parse_unix_seconds),
        representative_claim: get(Found::CLAIM).and_then(parse_claim),
        five_hour: window(Found::FIVE_HOUR),
        seven_day: window(Found::SEVEN_DAY),
        requests_remaining: get(Found::REQUESTS_REMAINING).and_then(parse_u64),
        requests_reset: get(Found::REQUESTS_RESET).and_then(parse_timestamp),
        corrections: Vec::new(),
    }
}

/// The first value of every header [`RateLimitInfo`] reads, found in one pass over the
/// lines (the first value of a repeated header, as `HeaderMap::get` gives). One pass
/// compares each name once instead of looking up twelve names per response.
struct Found<'h>([Option<&'h [u8]>; 22]);

impl<'h> Found<'h> {
    const RETRY_AFTER: usize = 0;
    const RETRY_AFTER_MS: usize = 1;
    const UNIFIED_STATUS: usize = 2;
    const UNIFIED_RESET: usize = 3;
    const CLAIM: usize = 4;
    /// Utilisation, then reset, then status.
    const FIVE_HOUR: usize = 5;
    /// Utilisation, then reset, then status.
    const SEVEN_DAY: usize = 8;
    const REQUESTS_REMAINING: usize = 11;
    const REQUESTS_RESET: usize = 12;
    /// Per family (in [`ModelFamily::ALL`] order): utilisation, reset, status.
    const FAMILY: usize = 13;

    fn slot(name: &[u8]) -> Option<usize> {
        const PREFIX: &[u8] = b"anthropic-ratelimit-";
        let Some(rest) = name.strip_prefix(PREFIX) else {
            return if name == RETRY_AFTER.as_bytes() {
                Some(Self::RETRY_AFTER)
            } else if name == RETRY_AFTER_MS.as_bytes() {
                Some(Self::RETRY_AFTER_MS)
            } else {
                None
            };
        };
        let slot = |full: &str| full.as_bytes().get(PREFIX.len()..) == Some(rest);
        [
            (UNIFIED_STATUS, Self::UNIFIED_STATUS),
            (UNIFIED_RESET, Self::UNIFIED_RESET),
            (UNIFIED_REPRESENTATIVE_CLAIM, Self::CLAIM),
            (UNIFIED_5H_UTILIZATION, Self::FIVE_HOUR),
            (UNIFIED_5H_RESET, Self::FIVE_HOUR + 1),
            (UNIFIED_5H_STATUS, Self::FIVE_HOUR + 2),
            (UNIFIED_7D_UTILIZATION, Self::SEVEN_DAY),
            (UNIFIED_7D_RESET, Self::SEVEN_DAY + 1),
            (UNIFIED_7D_STATUS, Self::SEVEN_DAY + 2),
            (REQUESTS_REMAINING, Self::REQUESTS_REMAINING),
            (REQUESTS_RESET, Self::REQUESTS_RESET),
        ]
        .into_iter()
        .find_map(|(full, index)| slot(full).then_some(index))
        .or_else(|| {
            // `unified-7d_<family>-*`: only looked at for names that start so.
            rest.strip_prefix(b"unified-7d_")?;
            UNIFIED_7D_FAMILY
                .iter()
                .flatten()
                .position(|full| slot(full))
                .map(|i| Self::FAMILY + i)
        })
    }

    fn scan<H: HeaderLines + ?Sized>(headers: &'h H) -> Self {
        let mut found = Self([None; 22]);
        for (name, value) in headers.lines() {
            if let Some(slot) = Self::slot(name) {
                found.0[slot].get_or_insert(value);
            }
        }
        found
    }
}

/// A non-negative decimal number (`12`, `1.5`, `.5`) as an integer count of
/// `1/scale` units, rounded down; saturates at `u64::MAX`. Rejects signs, exponents,
/// empty parts and anything that is not ASCII digits and one dot.
fn parse_decimal_scaled(s: &str, scale: u64) -> Option<u64> {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (s, None),
    };
    let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int) || !frac.is_none_or(all_digits) {
        return None;
    }
    if int.is_empty() && frac.is_none_or(str::is_empty) {
        return None;
    }
    let mut whole: u64 = 0;
    for b in int.bytes() {
        whole = whole.saturating_mul(10).saturating_add(u64::from(b - b'0'));
    }
    let mut total = whole.saturating_mul(scale);
    // Fractional part: digit by digit, scale / 10, scale / 100, ...
    let mut unit = scale;
    for b in frac.unwrap_or("").bytes() {
        unit /= 10;
        if unit == 0 {
            break;
        }
        total = total.saturating_add(u64::from(b - b'0') * unit);
    }
    Some(total)
}

/// Parses `retry-after`: delay-seconds (`120`; a fraction like `1.5` is accepted) or an
/// HTTP date (`Wed, 21 Oct 2015 07:28:00 GMT`), returned as a delay in ms from `now`.
/// A date at or before `now` gives `Some(0)`.
pub fn parse_retry_after(value: impl AsRef<[u8]>, now: UnixMs) -> Option<u64> {
    let s = visible_text(value.as_ref())?;
    if let Some(ms) = parse_decimal_scaled(s, 1000) {
        return Some(ms);
    }
    let at = httpdate::parse_http_date(s).ok()?;
    let at_ms = u64::try_from(at.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
    Some(at_ms.saturating_sub(now))
}

/// Parses `retry-after-ms`: a non-negative number of milliseconds (fractions are
/// rounded down).
pub fn parse_retry_after_ms(value: impl AsRef<[u8]>) -> Option<u64> {
    parse_decimal_scaled(visible_text(value.as_ref())?, 1)
}

/// Parses a unix-seconds timestamp (`1700000000`, fractions accepted) into unix ms.
pub fn parse_unix_seconds(value: impl AsRef<[u8]>) -> Option<UnixMs> {
    parse_decimal_scaled(visible_text(value.as_ref())?, 1000)
}

/// Parses a timestamp given either as RFC 3339 (Anthropic's `-requests-reset`) or as
/// unix seconds, into unix ms.
pub fn parse_timestamp(value: impl AsRef<[u8]>) -> Option<UnixMs> {
    let s = visible_text(value.as_ref())?;
    parse_decimal_scaled(s, 1000).or_else(|| parse_rfc3339(s))
}

/// Parses a utilisation fraction: a finite, non-negative decimal (`0.97`, `1`, `1.2`).
pub fn parse_utilization(value: impl AsRef<[u8]>) -> Option<f64> {
    let s = visible_text(value.as_ref())?;
    // Reject what `f64::from_str` accepts but no upstream sends: inf, nan, exponents, signs.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let v: f64 = s.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v)
}

/// Parses a unified status (`allowed`, `allowed_warning`, `rejected`; ASCII case
/// ignored). Unknown values are ignored.
pub fn parse_unified_status(value: impl AsRef<[u8]>) -> Option<UnifiedStatus> {
    let s = visible_text(value.as_ref())?;
    [
        UnifiedStatus::Allowed,
        UnifiedStatus::AllowedWarning,
        UnifiedStatus::Rejected,
    ]
    .into_iter()
    .find(|st| st.as_str().eq_ignore_ascii_case(s))
}

/// Parses a non-negative integer (`anthropic-ratelimit-requests-remaining`).
pub fn parse_u64(value: impl AsRef<[u8]>) -> Option<u64> {
    let s = visible_text(value.as_ref())?;
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_claim(value: impl AsRef<[u8]>) -> Option<String> {
    let s = visible_text(value.as_ref())?;
    let ok = !s.is_empty()
        && s.len() <= MAX_CLAIM_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    ok.then(|| s.to_owned())
}

/// Strict RFC 3339 parser: `YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM)`, into unix ms.
///
/// `T` and `Z` may be lower case (RFC 3339 §5.6). Fractions beyond milliseconds are
/// truncated. A leap second (`:60`) lands on the first second of the next minute, as
/// unix time has no leap seconds. Dates before 1970 (after the offset) return `None`.
pub fn parse_rfc3339(s: &str) -> Option<UnixMs> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(range)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(
            part.iter()
                .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0')),
        )
    };
    let sep = |i: usize, chars: &[u8]| b.get(i).is_some_and(|c| chars.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut millis = 0i64;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            if i - start < 3 {
                millis = millis * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        let digits = i - start;
        if digits == 0 {
            return None;
        }
        for _ in digits..3 {
            millis *= 10;
        }
    }
    let offset_minutes = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let m = oh * 60 + om;
            if *sign == b'-' { -m } else { m }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    let ms = secs.checked_mul(1000)?.checked_add(millis)?;
    u64::try_from(ms).ok()
}

fn is_leap_year(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap_year(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (valid for years 0..=9999).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    // Count days in whole years, then whole months, then days.
    let y0 = y - 1;
    let leap_days = |yr: i64| yr / 4 - yr / 100 + yr / 400;
    let days_before_year = 365 * (y - 1970) + (leap_days(y0) - leap_days(1969));
    let days_before_month: i64 = (1..m).map(|mm| days_in_month(y, mm)).sum();
    days_before_year + days_before_month + (d - 1)
}
#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};
    use keypool_cooldown::facts::{ResetCorrection, claim_family};
    use keypool_core::Window;
    use proptest::prelude::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    fn map(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, hv(v));
        }
        h
    }

    const NOW: UnixMs = 1_700_000_000_000;

    #[test]
    fn retry_after_seconds() {
        assert_eq!(parse_retry_after(hv("120"), NOW), Some(120_000));
        assert_eq!(parse_retry_after(hv("0"), NOW), Some(0));
        assert_eq!(parse_retry_after(hv(" 7 "), NOW), Some(7_000));
        assert_eq!(parse_retry_after(hv("1.5"), NOW), Some(1_500));
        assert_eq!(parse_retry_after(hv("-5"), NOW), None);
        assert_eq!(parse_retry_after(hv("5s"), NOW), None);
        assert_eq!(parse_retry_after(hv(""), NOW), None);
        assert_eq!(parse_retry_after(hv("1e3"), NOW), None);
        assert_eq!(
            parse_retry_after(hv("99999999999999999999999"), NOW),
            Some(u64::MAX)
        );
    }

    #[test]
    fn retry_after_http_date_is_relative_to_now() {
        // 1445412480 = Wed, 21 Oct 2015 07:28:00 GMT
        let date = hv("Wed, 21 Oct 2015 07:28:00 GMT");
        let at = 1_445_412_480_000;
        assert_eq!(parse_retry_after(&date, at - 90_000), Some(90_000));
        assert_eq!(parse_retry_after(&date, at), Some(0));
        assert_eq!(parse_retry_after(&date, at + 5_000), Some(0));
        assert_eq!(
            parse_retry_after(hv("Wed, 21 Oct 2015 25:28:00 GMT"), 0),
            None
        );
    }

    #[test]
    fn retry_after_ms() {
        assert_eq!(parse_retry_after_ms(hv("1500")), Some(1500));
        assert_eq!(parse_retry_after_ms(hv("1500.9")), Some(1500));
        assert_eq!(parse_retry_after_ms(hv("abc")), None);
        assert_eq!(parse_retry_after_ms(hv("-1")), None);
        assert_eq!(parse_retry_after_ms(hv(".")), None);
    }

    #[test]
    fn retry_after_ms_wins_over_retry_after() {
        let h = map(&[(RETRY_AFTER, "30"), (RETRY_AFTER_MS, "2500")]);
        assert_eq!(rate_limit_facts(&h, NOW).retry_after_ms, Some(2500));
        let h = map(&[(RETRY_AFTER, "30"), (RETRY_AFTER_MS, "soon")]);
        assert_eq!(rate_limit_facts(&h, NOW).retry_after_ms, Some(30_000));
    }

    #[test]
    fn unified_headers_all_fields() {
        let h = map(&[
            (UNIFIED_STATUS, "allowed_warning"),
            (UNIFIED_RESET, "1700018000"),
            (UNIFIED_REPRESENTATIVE_CLAIM, "five_hour"),
            (UNIFIED_5H_UTILIZATION, "0.91"),
            (UNIFIED_5H_RESET, "1700018000"),
            (UNIFIED_5H_STATUS, "allowed_warning"),
            (UNIFIED_7D_UTILIZATION, "0.4"),
            (UNIFIED_7D_RESET, "1700500000"),
            (UNIFIED_7D_STATUS, "allowed"),
        ]);
        let info = rate_limit_facts(&h, NOW);
        assert_eq!(
            info,
            RateLimitInfo {
                retry_after_ms: None,
                unified_status: Some(UnifiedStatus::AllowedWarning),
                unified_reset: Some(1_700_018_000_000),
                representative_claim: Some("five_hour".into()),
                five_hour: WindowUsage {
                    utilization: Some(0.91),
                    reset: Some(1_700_018_000_000),
                    status: Some(UnifiedStatus::AllowedWarning),
                },
                families: FamilyWeekly::default(),
                seven_day: WindowUsage {
                    utilization: Some(0.4),
                    reset: Some(1_700_500_000_000),
                    status: Some(UnifiedStatus::Allowed),
                },
                requests_remaining: None,
                requests_reset: None,
                corrections: Vec::new(),
            }
        );
        assert_eq!(info.claimed_window(), Some(Window::FiveHour));
        assert_eq!(info.window(Window::Weekly).utilization, Some(0.4));
        assert!(!info.is_empty());
        assert!(rate_limit_facts(&HeaderMap::new(), NOW).is_empty());
    }

    #[test]
    fn malformed_unified_values_are_ignored() {
        let h = map(&[
            (UNIFIED_STATUS, "blocked"),
            (UNIFIED_RESET, "tomorrow"),
            (UNIFIED_REPRESENTATIVE_CLAIM, "has space"),
            (UNIFIED_5H_UTILIZATION, "NaN"),
            (UNIFIED_7D_UTILIZATION, "-0.5"),
            (UNIFIED_7D_RESET, "-1"),
            (REQUESTS_REMAINING, "-3"),
            (REQUESTS_RESET, "2025-13-01T00:00:00Z"),
        ]);
        assert!(rate_limit_facts(&h, NOW).is_empty());
        assert_eq!(parse_utilization(hv("inf")), None);
        assert_eq!(parse_utilization(hv("1e-2")), None);
        assert_eq!(parse_utilization(hv("1.2")), Some(1.2));
        assert_eq!(
            parse_unified_status(hv("Rejected")),
            Some(UnifiedStatus::Rejected)
        );
    }

    #[test]
    fn requests_headers_rfc3339_and_unix_seconds() {
        let h = map(&[
            (REQUESTS_REMAINING, "0"),
            (REQUESTS_RESET, "2023-11-14T22:14:20Z"),
        ]);
        let info = rate_limit_facts(&h, NOW);
        assert_eq!(info.requests_remaining, Some(0));
        assert_eq!(info.requests_reset, Some(1_700_000_060_000));
        let h = map(&[(REQUESTS_RESET, "1700000060")]);
        let info = rate_limit_facts(&h, NOW);
        assert_eq!(info.requests_reset, Some(1_700_000_060_000));
    }

    #[test]
    fn rfc3339_strict() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("1970-01-01t00:00:01z"), Some(1000));
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20Z"), Some(NOW));
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20.5Z"), Some(NOW + 500));
        assert_eq!(
            parse_rfc3339("2023-11-14T22:13:20.123456Z"),
            Some(NOW + 123)
        );
        assert_eq!(parse_rfc3339("2023-11-14T23:13:20+01:00"), Some(NOW));
        assert_eq!(parse_rfc3339("2023-11-14T21:43:20-00:30"), Some(NOW));
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00Z"),
            Some(1_709_164_800_000)
        );
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800_000));
        assert_eq!(
            parse_rfc3339("2016-12-31T23:59:60Z"),
            Some(1_483_228_800_000)
        );
        for bad in [
            "",
            "2023-11-14",
            "2023-11-14T22:13:20",
            "2023-11-14 22:13:20Z",
            "2023-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2023-04-31T00:00:00Z",
            "2023-00-10T00:00:00Z",
            "2023-11-14T24:00:00Z",
            "2023-11-14T22:60:00Z",
            "2023-11-14T22:13:61Z",
            "2023-11-14T22:13:20.Z",
            "2023-11-14T22:13:20+0100",
            "2023-11-14T22:13:20+24:00",
            "2023-11-14T22:13:20Zjunk",
            "+023-11-14T22:13:20Z",
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:00:00+00:01",
            "2023-11-14T22:13:20\u{e9}Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    /// Days since the epoch, counted one day at a time: a slow oracle for the formula.
    fn days_by_counting(y: i64, m: i64, d: i64) -> i64 {
        let mut days = 0;
        for yy in 1970..y {
            days += if is_leap_year(yy) { 366 } else { 365 };
        }
        for mm in 1..m {
            days += days_in_month(y, mm);
        }
        days + d - 1
    }

    /// The lookup-by-name reading that the one-pass scan replaced, kept as the
    /// reference: `HeaderMap::get` gives the first value of a name.
    fn by_lookup(headers: &HeaderMap, now: UnixMs) -> RateLimitInfo {
        let get = |name: &str| headers.get(name);
        let window = |util: &str, reset: &str, status: &str| WindowUsage {
            utilization: get(util).and_then(parse_utilization),
            reset: get(reset).and_then(parse_unix_seconds),
            status: get(status).and_then(parse_unified_status),
        };
        RateLimitInfo {
            retry_after_ms: get(RETRY_AFTER_MS)
                .and_then(parse_retry_after_ms)
                .or_else(|| get(RETRY_AFTER).and_then(|v| parse_retry_after(v, now))),
            unified_status: get(UNIFIED_STATUS).and_then(parse_unified_status),
            unified_reset: get(UNIFIED_RESET).and_then(parse_unix_seconds),
            representative_claim: get(UNIFIED_REPRESENTATIVE_CLAIM).and_then(parse_claim),
            five_hour: window(UNIFIED_5H_UTILIZATION, UNIFIED_5H_RESET, UNIFIED_5H_STATUS),
            seven_day: window(UNIFIED_7D_UTILIZATION, UNIFIED_7D_RESET, UNIFIED_7D_STATUS),
            requests_remaining: get(REQUESTS_REMAINING).and_then(parse_u64),
            requests_reset: get(REQUESTS_RESET).and_then(parse_timestamp),
            families: FamilyWeekly {
                opus: window(
                    UNIFIED_7D_FAMILY[0][0],
                    UNIFIED_7D_FAMILY[0][1],
                    UNIFIED_7D_FAMILY[0][2],
                ),
                sonnet: window(
                    UNIFIED_7D_FAMILY[1][0],
                    UNIFIED_7D_FAMILY[1][1],
                    UNIFIED_7D_FAMILY[1][2],
                ),
                haiku: window(
                    UNIFIED_7D_FAMILY[2][0],
                    UNIFIED_7D_FAMILY[2][1],
                    UNIFIED_7D_FAMILY[2][2],
                ),
            },
            corrections: Vec::new(),
        }
    }

    #[test]
    fn family_weekly_headers_and_claims() {
        let h = map(&[
            ("anthropic-ratelimit-unified-7d_opus-utilization", "1.0"),
            ("anthropic-ratelimit-unified-7d_opus-reset", "1700086400"),
            ("anthropic-ratelimit-unified-7d_opus-status", "rejected"),
            ("anthropic-ratelimit-unified-7d_sonnet-utilization", "0.25"),
            (
                "anthropic-ratelimit-unified-representative-claim",
                "seven_day_opus",
            ),
            ("anthropic-ratelimit-unified-7d_pous-utilization", "0.5"),
        ]);
        let info = rate_limit_facts(&h, NOW);
        assert_eq!(
            info.families.opus,
            WindowUsage {
                utilization: Some(1.0),
                reset: Some(1_700_086_400_000),
                status: Some(UnifiedStatus::Rejected)
            }
        );
        assert_eq!(info.families.sonnet.utilization, Some(0.25));
        assert!(info.families.haiku.is_empty());
        assert_eq!(info.claimed_family(), Some(ModelFamily::Opus));
        assert_eq!(info.claimed_window(), Some(Window::Weekly));
        assert!(!info.has_no_window_state());
        assert_eq!(parse(&h, NOW), by_lookup(&h, NOW));
        assert_eq!(claim_family("seven_day"), None);
        assert_eq!(claim_family("seven_day_sonnet"), Some(ModelFamily::Sonnet));
        assert_eq!(claim_family("five_hour"), None);
        // bounded like the weekly window
        let far = map(&[("anthropic-ratelimit-unified-7d_sonnet-reset", "99999999999")]);
        let info = rate_limit_facts(&far, NOW);
        assert_eq!(
            info.families.sonnet.reset,
            Some(NOW + 7 * 86_400_000 + 300_000)
        );
    }

    #[test]
    fn repeated_headers_take_their_first_value_and_look_alikes_are_ignored() {
        let mut h = HeaderMap::new();
        h.append(UNIFIED_5H_UTILIZATION, HeaderValue::from_static("0.5"));
        h.append(UNIFIED_5H_UTILIZATION, HeaderValue::from_static("0.9"));
        h.append(
            "anthropic-ratelimit-unified-5h-utilization-x",
            HeaderValue::from_static("0.7"),
        );
        h.append("anthropic-ratelimit-", HeaderValue::from_static("1"));
        h.append("x-retry-after", HeaderValue::from_static("5"));
        let info = rate_limit_facts(&h, NOW);
        assert_eq!(info.five_hour.utilization, Some(0.5));
        assert_eq!(info.retry_after_ms, None);
        assert_eq!(parse(&h, NOW), by_lookup(&h, NOW));
    }

    proptest! {
        #[test]
        fn arbitrary_header_values_never_panic(
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 12),
            now in any::<u64>(),
        ) {
            let names = [
                RETRY_AFTER, RETRY_AFTER_MS, UNIFIED_STATUS, UNIFIED_RESET,
                UNIFIED_REPRESENTATIVE_CLAIM, UNIFIED_5H_UTILIZATION, UNIFIED_5H_RESET,
                UNIFIED_5H_STATUS, UNIFIED_7D_UTILIZATION, UNIFIED_7D_RESET,
                UNIFIED_7D_STATUS, REQUESTS_REMAINING,
            ];
            let mut h = HeaderMap::new();
            for (name, bytes) in names.iter().zip(&values) {
                if let Ok(v) = HeaderValue::from_bytes(bytes) {
                    h.insert(*name, v.clone());
                    h.insert(REQUESTS_RESET, v);
                }
            }
            let info = rate_limit_facts(&h, now);
            if let Some(u) = info.five_hour.utilization {
                prop_assert!(u.is_finite() && u >= 0.0);
            }
            prop_assert_eq!(parse(&h, now), by_lookup(&h, now));
        }

        #[test]
        fn arbitrary_strings_never_panic_the_rfc3339_parser(s in "\\PC{0,40}") {
            let _ = parse_rfc3339(&s);
        }

        #[test]
        fn rfc3339_agrees_with_day_counting(
            y in 1970i64..2200, m in 1i64..=12, d in 1i64..=31,
            hh in 0i64..24, mi in 0i64..60, ss in 0i64..60, ms in 0i64..1000,
        ) {
            prop_assume!(d <= days_in_month(y, m));
            let s = format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mi:02}:{ss:02}.{ms:03}Z");
            let expected = (days_by_counting(y, m, d) * 86_400 + hh * 3600 + mi * 60 + ss) * 1000 + ms;
            prop_assert_eq!(parse_rfc3339(&s), Some(u64::try_from(expected).unwrap()));
        }

        #[test]
        fn integer_seconds_round_trip(secs in 0u64..10_000_000_000) {
            let v = HeaderValue::from_str(&secs.to_string()).unwrap();
            prop_assert_eq!(parse_unix_seconds(&v), Some(secs * 1000));
            prop_assert_eq!(parse_retry_after(&v, NOW), Some(secs * 1000));
        }
    }

    // ---- resets are bounded (docs/RELIABILITY.md, "Hostile rate-limit headers") ----

    const MIN: u64 = 60_000;
    const HOUR: u64 = 60 * MIN;
    /// The slack every bound allows for clock skew and rounding.
    const SLACK: u64 = 5 * MIN;
    /// Each reset header with its bound (ms after `now`), as documented.
    const BOUNDS: [(&str, u64); 7] = [
        (UNIFIED_5H_RESET, 5 * HOUR + SLACK),
        (UNIFIED_7D_RESET, 7 * 24 * HOUR + SLACK),
        (UNIFIED_RESET, 7 * 24 * HOUR + SLACK),
        (REQUESTS_RESET, HOUR + SLACK),
        (UNIFIED_7D_FAMILY[0][1], 7 * 24 * HOUR + SLACK),
        (UNIFIED_7D_FAMILY[1][1], 7 * 24 * HOUR + SLACK),
        (UNIFIED_7D_FAMILY[2][1], 7 * 24 * HOUR + SLACK),
    ];

    /// The reset `header` filled in `info`.
    fn reset_of(info: &RateLimitInfo, header: &str) -> Option<UnixMs> {
        match header {
            UNIFIED_5H_RESET => info.five_hour.reset,
            UNIFIED_7D_RESET => info.seven_day.reset,
            UNIFIED_RESET => info.unified_reset,
            REQUESTS_RESET => info.requests_reset,
            other => ModelFamily::ALL
                .iter()
                .find(|f| UNIFIED_7D_FAMILY[f.index()][1] == other)
                .map(|f| info.families.get(*f).reset)
                .unwrap_or_else(|| panic!("not a reset header: {other}")),
        }
    }

    fn reset_from(header: &'static str, value: &str, now: UnixMs) -> Option<UnixMs> {
        reset_of(&rate_limit_facts(&map(&[(header, value)]), now), header)
    }

    #[test]
    fn a_far_future_reset_is_clamped_to_its_bound() {
        for (header, bound) in BOUNDS {
            for far in [
                "99999999999999999999",
                "18446744073709551615",
                "99999999999",  // year 5138, as seconds
                "1702592000.5", // 30 days after NOW
            ] {
                assert_eq!(
                    reset_from(header, far, NOW),
                    Some(NOW + bound),
                    "{header}: {far}"
                );
            }
        }
        // what was corrected is reported, for the store to log
        let h = map(&[
            (UNIFIED_RESET, "99999999999999999999"),
            (UNIFIED_5H_RESET, "99999999999"),
            (UNIFIED_7D_RESET, "1700000060"),
        ]);
        assert_eq!(
            rate_limit_facts(&h, NOW).corrections,
            [
                ResetCorrection {
                    kind: ResetKind::Unified,
                    received: u64::MAX,
                    recorded: NOW + 7 * 24 * HOUR + SLACK,
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
        // 6 hours ahead: beyond the 5-hour bound, within the weekly one
        let six_hours = (NOW / 1000 + 6 * 3600).to_string();
        assert_eq!(
            reset_from(UNIFIED_5H_RESET, &six_hours, NOW),
            Some(NOW + 5 * HOUR + SLACK)
        );
        assert_eq!(
            reset_from(UNIFIED_7D_RESET, &six_hours, NOW),
            Some(NOW + 6 * HOUR)
        );
    }

    #[test]
    fn each_reset_header_has_its_kind_s_documented_bound() {
        let kinds: Vec<(&str, u64)> = ResetKind::ALL
            .iter()
            .map(|k| (reset_header(*k), k.bound_ms()))
            .collect();
        let mut expected = BOUNDS.to_vec();
        expected.sort_by_key(|(h, _)| ResetKind::ALL.iter().position(|k| reset_header(*k) == *h));
        assert_eq!(kinds, expected);
    }

    #[test]
    fn a_unix_ms_reset_is_read_as_ms_then_bounded() {
        for (header, bound) in BOUNDS {
            // 30 minutes from now, in unix ms: within every bound, taken exactly
            let soon = NOW + 30 * MIN + 123;
            assert_eq!(
                reset_from(header, &soon.to_string(), NOW),
                Some(soon),
                "{header}"
            );
            let info = rate_limit_facts(&map(&[(header, &soon.to_string())]), NOW);
            assert_eq!(
                info.corrections,
                [ResetCorrection {
                    kind: ResetKind::ALL
                        .into_iter()
                        .find(|k| reset_header(*k) == header)
                        .unwrap(),
                    received: soon * 1000,
                    recorded: soon,
                    read_as_ms: true,
                }]
            );
            // 30 days from now, in unix ms: read as ms, then clamped
            let far = NOW + 30 * 24 * HOUR;
            assert_eq!(
                reset_from(header, &far.to_string(), NOW),
                Some(NOW + bound),
                "{header}"
            );
            // an hour ago, in unix ms: still in the past
            let past = NOW - HOUR;
            assert_eq!(
                reset_from(header, &past.to_string(), NOW),
                Some(past),
                "{header}"
            );
        }
    }

    #[test]
    fn resets_within_their_bound_or_in_the_past_are_unchanged() {
        for (header, bound) in BOUNDS {
            for at in [
                NOW + bound,
                NOW + bound - 1_000,
                NOW + 1_000,
                NOW,
                NOW - 86_400_000,
                0,
            ] {
                let secs = format!("{}.{:03}", at / 1000, at % 1000);
                let info = rate_limit_facts(&map(&[(header, &secs)]), NOW);
                assert_eq!(reset_of(&info, header), Some(at), "{header}: {secs}");
                assert!(info.corrections.is_empty(), "{header}: {secs}");
            }
            // one second beyond is clamped to the bound, not dropped
            let beyond = (NOW + bound) / 1000 + 1;
            assert_eq!(
                reset_from(header, &beyond.to_string(), NOW),
                Some(NOW + bound),
                "{header}"
            );
        }
        // RFC 3339 requests-reset: the same bound
        assert_eq!(
            reset_from(REQUESTS_RESET, "2023-11-14T22:43:20Z", NOW),
            Some(NOW + 30 * MIN)
        );
        assert_eq!(
            reset_from(REQUESTS_RESET, "2023-11-15T22:13:20Z", NOW),
            Some(NOW + HOUR + SLACK)
        );
    }

    #[test]
    fn negative_and_garbage_resets_are_ignored() {
        for (header, _) in BOUNDS {
            for bad in [
                "-1",
                "-99999999999999999999",
                "soon",
                "1e12",
                "0x10",
                "",
                "1.2.3",
            ] {
                assert_eq!(reset_from(header, bad, NOW), None, "{header}: {bad:?}");
            }
        }
    }

    /// Header values of every shape an upstream could send for a reset.
    fn reset_values() -> impl Strategy<Value = String> {
        prop_oneof![
            // within or around the bounds, in seconds (with a fraction sometimes)
            (0u64..40 * 24 * 3600, any::<bool>()).prop_map(|(ahead, frac)| {
                let s = NOW / 1000 + ahead;
                if frac {
                    format!("{s}.5")
                } else {
                    s.to_string()
                }
            }),
            // in the past
            (0u64..NOW / 1000).prop_map(|s| s.to_string()),
            // unix ms sent as if it were seconds, past or future
            (NOW - 365 * 24 * HOUR..NOW + 365 * 24 * HOUR).prop_map(|ms| ms.to_string()),
            // huge numbers, beyond u64 too
            "[1-9][0-9]{11,30}",
            // negative numbers
            "-[0-9]{1,20}",
            // anything printable
            "\\PC{0,30}",
        ]
    }

    proptest! {
        /// Whatever the header says, the recorded reset is at most `now` + its bound; a
        /// value within the bound (or in the past) is taken exactly as parsed.
        #[test]
        fn every_recorded_reset_is_within_its_bound(
            values in proptest::collection::vec(reset_values(), 4),
            now in prop_oneof![Just(NOW), NOW - 1000 * HOUR..NOW + 1000 * HOUR, any::<u64>()],
        ) {
            let mut h = HeaderMap::new();
            for ((header, _), v) in BOUNDS.iter().zip(&values) {
                if let Ok(v) = HeaderValue::from_str(v) {
                    h.insert(*header, v);
                }
            }
            let info = rate_limit_facts(&h, now);
            for (header, bound) in BOUNDS {
                let limit = now.saturating_add(bound);
                let raw = h.get(header).and_then(|v| {
                    if header == REQUESTS_RESET { parse_timestamp(v) } else { parse_unix_seconds(v) }
                });
                let got = reset_of(&info, header);
                prop_assert_eq!(got.is_some(), raw.is_some(), "{}", header);
                if let (Some(raw), Some(got)) = (raw, got) {
                    prop_assert!(got <= limit, "{header}: {raw} gave {got} > {limit}");
                    if raw <= limit {
                        prop_assert_eq!(got, raw, "{}: within the bound", header);
                    } else if raw > 100_000_000_000_000 {
                        prop_assert_eq!(got, (raw / 1000).min(limit), "{}: read as ms", header);
                    } else {
                        prop_assert_eq!(got, limit, "{}: clamped", header);
                    }
                }
            }
        }
    }
}
