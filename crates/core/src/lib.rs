//! Domain types shared by several keypool crates.
//!
//! keypool's policy crates (`keypool-selector`, `keypool-cooldown`) and its I/O crates
//! (`keypool-store`, `keypool-proxy`) must agree on a handful of small types without
//! depending on each other. They live here, and only here:
//!
//! - [`AccountId`]: the id of one upstream account, cheap to clone.
//! - [`Provider`] and [`AuthType`]: which wire format and credential an account uses.
//! - [`Window`]: the two subscription usage windows (`5h`, `weekly`).
//! - [`ModelFamily`]: `opus`, `sonnet`, `haiku`, from a model id (SPEC 16: a weekly
//!   window the upstream reports for one family takes an account out for that family).
//! - [`glob_match`]: the `*`/`?` wildcard match of every glob in the config (prices,
//!   caller model lists, restatement rules).
//! - [`Strategy`]: the name of a group's selection strategy.
//! - [`StreamCommit`]: where a stream's point of no return is (`stream_commit`).
//! - [`UnixMs`]: absolute time in unix milliseconds. Policy code never reads the clock:
//!   `now: UnixMs` is always an argument. [`UtcDateTime`] turns unix seconds into a
//!   calendar date (log timestamps, dates in error messages).
//!
//! This crate has no I/O and no runtime; it depends only on `serde` and `thiserror`.
//!
//! ```
//! use keypool_core::{AccountId, AuthType, Provider, Strategy};
//! let id = AccountId::from("acct-1");
//! assert_eq!(id.as_str(), "acct-1");
//! assert_eq!("oauth".parse::<AuthType>().unwrap(), AuthType::OAuth);
//! assert_eq!("anthropic".parse::<Provider>().unwrap(), Provider::Anthropic);
//! assert_eq!(Strategy::default(), Strategy::RoundRobin);
//! ```
//!
//! - [`per_thread`]: state that every serving thread writes on every request, in one
//!   copy per thread (usage history and totals, metric rows).
//!
//! # Layout
//! The types are in `lib.rs`: they are small and belong together. `per_thread.rs`
//! holds [`per_thread::PerThread`] and the thread numbering it shares with the metric
//! rows.

pub mod per_thread;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Absolute time in milliseconds since the unix epoch.
pub type UnixMs = u64;

/// A UTC calendar date and time of day (proleptic Gregorian calendar).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcDateTime {
    /// The year (`1970` and later).
    pub year: u64,
    /// `1..=12`.
    pub month: u64,
    /// `1..=31`.
    pub day: u64,
    /// `0..=23`.
    pub hour: u64,
    /// `0..=59`.
    pub minute: u64,
    /// `0..=59`.
    pub second: u64,
}

impl UtcDateTime {
    /// Days from 1970-01-01 to `year-month-day` (H. Hinnant's `days_from_civil`; negative
    /// before the epoch): the inverse of the date part of [`UtcDateTime::from_unix_secs`].
    pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
        let y = if month <= 2 { year - 1 } else { year };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let m = i64::from(month);
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// The UTC date and time `secs` seconds after the unix epoch (H. Hinnant's
    /// `civil_from_days`): the one calendar conversion of the workspace, for log
    /// timestamps and the dates in error messages.
    pub fn from_unix_secs(secs: u64) -> Self {
        let z = secs / 86_400 + 719_468;
        let era = z / 146_097;
        let doe = z % 146_097;
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let rem = secs % 86_400;
        Self {
            year: yoe + era * 400 + u64::from(month <= 2),
            month,
            day: doy - (153 * mp + 2) / 5 + 1,
            hour: rem / 3600,
            minute: rem % 3600 / 60,
            second: rem % 60,
        }
    }
}

/// The id of one upstream account, as written in the configuration.
///
/// Backed by an `Arc<str>` so that cloning it on the request path is a reference-count
/// increment, not an allocation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AccountId(Arc<str>);

impl AccountId {
    /// Creates an id from any string.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shared string behind the id (cloning it is a reference-count increment).
    pub fn as_arc(&self) -> &Arc<str> {
        &self.0
    }
}

impl From<&str> for AccountId {
    fn from(s: &str) -> Self {
        Self(Arc::from(s))
    }
}

impl From<String> for AccountId {
    fn from(s: String) -> Self {
        Self(Arc::from(s))
    }
}

impl std::borrow::Borrow<str> for AccountId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A value that is not one of the names an enum accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}: expected one of {expected}")]
pub struct UnknownName {
    /// What kind of name was expected (`provider`, `auth type`, ...).
    pub what: &'static str,
    /// The value that was given.
    pub value: String,
    /// The accepted names, comma separated.
    pub expected: &'static str,
}

macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $what:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The name used in configuration, metrics and logs.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownName {
                        what: $what,
                        value: s.to_owned(),
                        expected: concat!($("`", $text, "` "),+),
                    }),
                }
            }
        }
    };
}

named_enum! {
    /// The upstream provider of an account: decides the wire format and headers.
    Provider, "provider" {
        /// Anthropic's own API (`api.anthropic.com`).
        Anthropic = "anthropic",
        /// A third party that exposes the Anthropic Messages API at its own `base_url`.
        AnthropicCompatible = "anthropic_compatible",
        /// An OpenAI-compatible Chat Completions API at its own `base_url` (issue 23):
        /// serves only chat completions, passed through natively.
        OpenAi = "openai",
    }
}

named_enum! {
    /// How an account authenticates upstream.
    AuthType, "auth type" {
        /// `x-api-key: <secret>`.
        ApiKey = "api_key",
        /// `Authorization: Bearer <secret>` plus the OAuth beta flag (subscription accounts).
        OAuth = "oauth",
        /// `Authorization: Bearer <secret>` for compatible third parties.
        Bearer = "bearer",
    }
}

impl Provider {
    /// The auth types this provider's adapter serves (SPEC 8): `anthropic` takes
    /// `api_key` and `oauth`, `anthropic_compatible` `api_key` and `bearer`, `openai`
    /// `api_key` (sent as `Authorization: Bearer`). The one
    /// place this rule is written: the configuration loader checks accounts with it and
    /// the provider adapter picks its credential header by it.
    pub const fn auth_types(self) -> &'static [AuthType] {
        match self {
            Self::Anthropic => &[AuthType::ApiKey, AuthType::OAuth],
            Self::AnthropicCompatible => &[AuthType::ApiKey, AuthType::Bearer],
            Self::OpenAi => &[AuthType::ApiKey],
        }
    }

    /// Whether this provider speaks the Anthropic Messages API (`anthropic`,
    /// `anthropic_compatible`); `openai` speaks only OpenAI Chat Completions. A
    /// Messages request is never sent to an account that does not.
    pub const fn speaks_messages(self) -> bool {
        !matches!(self, Self::OpenAi)
    }

    /// Whether this provider serves accounts of `auth` type.
    pub fn accepts(self, auth: AuthType) -> bool {
        self.auth_types().contains(&auth)
    }

    /// Whether this provider has a default base URL (`anthropic`: Anthropic's API);
    /// accounts of the others must name their `base_url`.
    pub const fn has_default_base_url(self) -> bool {
        matches!(self, Self::Anthropic)
    }
}

/// The tokens one answer used, as the upstream reported them (SPEC 8, 11): the four
/// kinds Anthropic bills separately.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// `input_tokens`: input not read from nor written to the prompt cache.
    pub input_tokens: u64,
    /// `output_tokens`.
    pub output_tokens: u64,
    /// `cache_creation_input_tokens`: input written to the prompt cache.
    pub cache_creation_input_tokens: u64,
    /// `cache_read_input_tokens`: input read from the prompt cache.
    pub cache_read_input_tokens: u64,
}

impl Usage {
    /// All four kinds summed (what token limits count).
    pub const fn total(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_creation_input_tokens)
            .saturating_add(self.cache_read_input_tokens)
    }
}

named_enum! {
    /// One of the two subscription usage windows (SPEC 5).
    Window, "window" {
        /// The rolling 5-hour window.
        FiveHour = "5h",
        /// The weekly (7-day) window.
        Weekly = "weekly",
    }
}

named_enum! {
    /// A model family (SPEC 16), read from the model id by [`ModelFamily::of`].
    ModelFamily, "model family" {
        /// `claude-opus-*`, `claude-3-opus-*`, …
        Opus = "opus",
        /// `claude-sonnet-*`, `claude-3-5-sonnet-*`, …
        Sonnet = "sonnet",
        /// `claude-haiku-*`, `claude-3-haiku-*`, …
        Haiku = "haiku",
    }
}

impl ModelFamily {
    /// The family a model id names: the first of `opus`, `sonnet`, `haiku` that the id
    /// contains, ASCII case-insensitively (`claude-opus-4-5`, `claude-3-5-sonnet-latest`,
    /// `anthropic/claude-haiku-4-5`). `None` for ids of no family.
    pub fn of(model: &str) -> Option<Self> {
        let bytes = model.as_bytes();
        let contains = |needle: &[u8]| {
            bytes
                .windows(needle.len())
                .any(|w| w.eq_ignore_ascii_case(needle))
        };
        Self::ALL
            .iter()
            .copied()
            .find(|family| contains(family.as_str().as_bytes()))
    }

    /// The position of the family in [`ModelFamily::ALL`] (for per-family arrays).
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// Wildcard matching of `text` against `pattern`: `*` matches any run of bytes, `?` any
/// one byte, everything else itself. Iterative and linear in practice (on a mismatch it
/// goes back to the last `*` only).
///
/// ```
/// use keypool_core::glob_match;
/// assert!(glob_match("claude-opus-*", "claude-opus-4-5"));
/// assert!(glob_match("https://*.example.com*", "https://api.example.com/v1"));
/// assert!(!glob_match("claude-?", "claude-10"));
/// ```
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (pattern, text) = (pattern.as_bytes(), text.as_bytes());
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

named_enum! {
    /// A group's selection strategy (SPEC 4). The default is `round_robin`.
    #[derive(Default)]
    Strategy, "strategy" {
        /// Rotate the snapshot by a per-group counter.
        #[default]
        RoundRobin = "round_robin",
        /// Snapshot order: lowest priority first, then least recently used.
        Priority = "priority",
        /// Each account owns `weight` consecutive slots of a per-group counter.
        Weighted = "weighted",
        /// Ascending rating score (TTFT, latency, errors).
        Rated = "rated",
        /// `rated`, plus one backup fired after the hedge delay.
        Hedge = "hedge",
        /// `rated`, plus one backup fired at once.
        Race = "race",
        /// Prefer the account whose 5-hour window resets soonest, ties by rating.
        ResetAware = "reset_aware",
    }
}

named_enum! {
    /// The `stream_commit` setting: where a stream's point of no return is (SPEC 3.8).
    /// The default is `first_content`.
    #[derive(Default)]
    StreamCommit, "stream_commit" {
        /// Keep holding past `message_start` and `ping` until the first content frame:
        /// Anthropic often sends `message_start` and then an in-band `overloaded_error`,
        /// which is still a failover here.
        #[default]
        FirstContent = "first_content",
        /// Commit at the first valid frame (`message_start`).
        FirstFrame = "first_frame",
    }
}

/// Base64url without padding (RFC 4648 §5): PKCE verifiers and challenges (RFC 7636).
pub fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64url_is_rfc_4648_without_padding() {
        assert_eq!(super::base64url(b""), "");
        assert_eq!(super::base64url(b"f"), "Zg");
        assert_eq!(super::base64url(b"fo"), "Zm8");
        assert_eq!(super::base64url(b"foo"), "Zm9v");
        assert_eq!(super::base64url(b"foob"), "Zm9vYg");
        assert_eq!(super::base64url(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn utc_dates_from_unix_seconds() {
        let at = |secs| {
            let t = UtcDateTime::from_unix_secs(secs);
            (t.year, t.month, t.day, t.hour, t.minute, t.second)
        };
        assert_eq!(at(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(at(951_782_400), (2000, 2, 29, 0, 0, 0));
        assert_eq!(at(1_709_251_199), (2024, 2, 29, 23, 59, 59));
        assert_eq!(at(1_798_761_599), (2026, 12, 31, 23, 59, 59));
    }

    use super::*;

    #[test]
    fn model_families_from_model_ids() {
        for (model, family) in [
            ("claude-opus-4-5", Some(ModelFamily::Opus)),
            ("claude-opus-4-1-20250805", Some(ModelFamily::Opus)),
            ("claude-3-opus-20240229", Some(ModelFamily::Opus)),
            ("claude-sonnet-4-5", Some(ModelFamily::Sonnet)),
            ("claude-3-5-sonnet-latest", Some(ModelFamily::Sonnet)),
            ("anthropic/Claude-Haiku-4-5", Some(ModelFamily::Haiku)),
            ("claude-2.1", None),
            ("gpt-4o", None),
            ("", None),
        ] {
            assert_eq!(ModelFamily::of(model), family, "{model}");
        }
        for (i, f) in ModelFamily::ALL.iter().enumerate() {
            assert_eq!(f.index(), i);
        }
    }

    #[test]
    fn names_round_trip_through_fromstr_and_serde() {
        for s in Strategy::ALL {
            assert_eq!(s.as_str().parse::<Strategy>().unwrap(), *s);
            let json = serde_json::to_string(s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
        }
        for w in Window::ALL {
            assert_eq!(w.as_str().parse::<Window>().unwrap(), *w);
        }
        assert_eq!(Window::FiveHour.to_string(), "5h");
    }

    #[test]
    fn unknown_name_lists_the_accepted_ones() {
        let err = "fastest".parse::<Strategy>().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("unknown strategy \"fastest\""), "{msg}");
        assert!(msg.contains("`round_robin`"), "{msg}");
    }

    #[test]
    fn account_id_is_transparent_in_serde_and_debug() {
        let id = AccountId::from("a-1");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"a-1\"");
        assert_eq!(format!("{id:?}"), "\"a-1\"");
        assert_eq!(id.clone(), AccountId::new("a-1"));
    }
}
