//! The disabled book: accounts taken out of rotation after a `key_error` (SPEC 6), each
//! in one of the terminal states of SPEC 16 ([`Terminal`]: `disabled`,
//! `credits_exhausted`, `banned`, `expired`) with its reason and time.
//!
//! Disabling is honoured only while `auto_disable_on_error` is on; re-enabling is always
//! an explicit operator action, whatever the state.
//!
//! ```
//! use keypool_cooldown::{CooldownConfig, DisabledBook};
//! use keypool_core::AccountId;
//!
//! let book = DisabledBook::new(&CooldownConfig::default());
//! let a = AccountId::from("a");
//! assert!(book.disable(&a, "upstream answered 401 (auth_rejected)", 1_000));
//! assert!(book.is_disabled(&a));
//! assert_eq!(book.get(&a).unwrap().at, 1_000);
//! assert!(book.reenable(&a).is_some());
//! assert!(!book.is_disabled(&a));
//! ```

use std::sync::atomic::{AtomicBool, Ordering};

use dashmap::DashMap;
use keypool_core::{AccountId, UnixMs};
use serde::{Deserialize, Serialize};

use crate::book;
use crate::classify::{Classification, Trigger};
use crate::config::CooldownConfig;

/// The terminal states of an account (SPEC 16): out of rotation until an operator
/// re-enables it. Persisted with the reason; state written by an older keypool (no
/// `state`) reads as `disabled`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Terminal {
    /// The credential was refused (401), or an operator disabled it.
    #[default]
    Disabled,
    /// Billing: a 402, or a body saying the credit balance is too low.
    CreditsExhausted,
    /// A body matching `ban_markers`, or the 3rd consecutive 403.
    Banned,
    /// An OAuth account whose refresh token is dead (SPEC 14): it needs a new login.
    Expired,
}

impl Terminal {
    /// Every state, in declaration order.
    pub const ALL: [Self; 4] = [
        Self::Disabled,
        Self::CreditsExhausted,
        Self::Banned,
        Self::Expired,
    ];

    /// The name in the admin API, metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::CreditsExhausted => "credits_exhausted",
            Self::Banned => "banned",
            Self::Expired => "expired",
        }
    }

    fn is_disabled(&self) -> bool {
        *self == Self::Disabled
    }
}

/// Why and when an account was disabled, and in which terminal state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisabledAccount {
    /// A short, secret-free reason for the operator.
    pub reason: String,
    /// When it was disabled, unix ms.
    pub at: UnixMs,
    /// The terminal state (`disabled` unless a more precise one applies).
    #[serde(default, skip_serializing_if = "Terminal::is_disabled")]
    pub state: Terminal,
}

/// One exported disabled account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisabledRecord {
    /// The account.
    pub account: AccountId,
    /// Reason and time.
    #[serde(flatten)]
    pub disabled: DisabledAccount,
}

/// The operator-facing reason for disabling after `classification`, e.g.
/// `key_error: upstream answered 401 (auth_rejected)`. Contains no upstream text.
pub fn disable_reason(classification: &Classification) -> String {
    let status = match classification.trigger {
        Trigger::AuthRejected { status }
        | Trigger::Banned { status }
        | Trigger::CreditBalanceLow { status } => Some(status),
        Trigger::Forbidden => Some(403),
        Trigger::PaymentRequired => Some(402),
        Trigger::ModelNotFound => Some(404),
        Trigger::WindowExhausted { .. }
        | Trigger::FamilyWindowExhausted { .. }
        | Trigger::RetryAfter { .. }
        | Trigger::PlainRateLimit => Some(429),
        Trigger::Overloaded { status }
        | Trigger::OtherStatus { status }
        | Trigger::RequestError { status } => Some(status),
        Trigger::Transport { .. } => None,
    };
    let class = classification.class.as_str();
    let trigger = classification.trigger.as_str();
    match status {
        Some(s) => format!("{class}: upstream answered {s} ({trigger})"),
        None => format!("{class}: {trigger}"),
    }
}

/// Disabled accounts. Thread-safe.
#[derive(Debug)]
pub struct DisabledBook {
    auto_disable_on_error: AtomicBool,
    entries: DashMap<AccountId, DisabledAccount, crate::Hasher>,
}

impl Default for DisabledBook {
    fn default() -> Self {
        Self::new(&CooldownConfig::default())
    }
}

impl DisabledBook {
    /// An empty book honouring the config's `auto_disable_on_error`.
    pub fn new(config: &CooldownConfig) -> Self {
        Self {
            auto_disable_on_error: AtomicBool::new(config.settings().auto_disable_on_error),
            entries: DashMap::default(),
        }
    }

    /// Takes `auto_disable_on_error` from a reloaded config. Accounts already disabled
    /// stay disabled until re-enabled.
    pub fn set_config(&self, config: &CooldownConfig) {
        self.auto_disable_on_error
            .store(config.settings().auto_disable_on_error, Ordering::Relaxed);
    }

    /// The master switch.
    pub fn auto_disable_on_error(&self) -> bool {
        self.auto_disable_on_error.load(Ordering::Relaxed)
    }

    /// Disables the account with `reason` at `now`, if `auto_disable_on_error` is on.
    /// An account already disabled keeps its first reason and time. Returns whether the
    /// account is disabled afterwards.
    pub fn disable(&self, account: &AccountId, reason: impl Into<String>, now: UnixMs) -> bool {
        self.disable_as(account, Terminal::Disabled, reason, now)
    }

    /// [`DisabledBook::disable`] into the terminal `state`. An account already in a
    /// terminal state keeps its first state, reason and time.
    pub fn disable_as(
        &self,
        account: &AccountId,
        state: Terminal,
        reason: impl Into<String>,
        now: UnixMs,
    ) -> bool {
        if self.entries.contains_key(account) {
            return true;
        }
        if !self.auto_disable_on_error() {
            return false;
        }
        self.entries
            .entry(account.clone())
            .or_insert_with(|| DisabledAccount {
                reason: reason.into(),
                at: now,
                state,
            });
        true
    }

    /// True while the account is disabled.
    pub fn is_disabled(&self, account: &AccountId) -> bool {
        self.entries.contains_key(account)
    }

    /// Reason and time, if the account is disabled.
    pub fn get(&self, account: &AccountId) -> Option<DisabledAccount> {
        self.entries.get(account).map(|e| e.clone())
    }

    /// Re-enables the account (operator action). Returns what it was disabled for.
    pub fn reenable(&self, account: &AccountId) -> Option<DisabledAccount> {
        self.entries.remove(account).map(|(_, d)| d)
    }

    /// Every disabled account, for the state file and Redis.
    pub fn export(&self) -> Vec<DisabledRecord> {
        book::export(&self.entries, |account, disabled| DisabledRecord {
            account,
            disabled,
        })
    }

    /// Loads exported entries (they do not expire). An account already disabled here
    /// keeps its own entry. Returns how many were taken.
    pub fn import(&self, records: impl IntoIterator<Item = DisabledRecord>) -> usize {
        let records = records.into_iter().map(|r| (r.account, r.disabled));
        book::import(&self.entries, records, |_, _| false, |_, _, _| {})
    }

    /// Number of disabled accounts.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no account is disabled.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{AttemptFailure, TransportFailure, classify};
    use crate::config::CooldownSettings;
    use crate::facts::RateLimitInfo;
    use http::StatusCode;

    fn status(code: u16) -> Classification {
        let info = RateLimitInfo::default();
        let status = StatusCode::from_u16(code).unwrap();
        classify(
            &AttemptFailure::Status {
                status,
                rate_limit: &info,
                marks: Default::default(),
            },
            0,
        )
    }

    #[test]
    fn key_error_disables_with_reason_and_time_until_reenabled() {
        let book = DisabledBook::default();
        let a = AccountId::from("a");
        for (code, reason) in [
            (401, "key_error: upstream answered 401 (auth_rejected)"),
            (403, "key_error: upstream answered 403 (forbidden)"),
            (402, "key_error: upstream answered 402 (payment_required)"),
        ] {
            assert!(book.disable(&a, disable_reason(&status(code)), 5_000));
            assert_eq!(
                book.get(&a),
                Some(DisabledAccount {
                    reason: reason.into(),
                    at: 5_000,
                    state: Terminal::Disabled,
                })
            );
            // A second key error keeps the first reason and time.
            assert!(book.disable(&a, "other", 9_000));
            assert_eq!(book.get(&a).unwrap().at, 5_000);
            assert_eq!(book.reenable(&a).unwrap().reason, reason);
            assert!(!book.is_disabled(&a));
            assert_eq!(book.reenable(&a), None);
        }
    }

    #[test]
    fn auto_disable_off_never_disables() {
        let off = CooldownConfig::try_new(CooldownSettings {
            auto_disable_on_error: false,
            ..Default::default()
        })
        .unwrap();
        let book = DisabledBook::new(&off);
        let a = AccountId::from("a");
        assert!(!book.disable(&a, disable_reason(&status(401)), 1));
        assert!(!book.is_disabled(&a));
        assert!(book.is_empty());
        // Switched back on by a reload: honoured again.
        book.set_config(&CooldownConfig::default());
        assert!(book.disable(&a, "x", 2));
        // Switched off again: the account already disabled stays disabled.
        book.set_config(&off);
        assert!(book.is_disabled(&a));
    }

    #[test]
    fn export_import_round_trip() {
        let book = DisabledBook::default();
        book.disable(&AccountId::from("a"), "r", 7);
        let json = serde_json::to_string(&book.export()).unwrap();
        assert_eq!(json, r#"[{"account":"a","reason":"r","at":7}]"#);
        let restored = DisabledBook::default();
        assert_eq!(
            restored.import(serde_json::from_str::<Vec<DisabledRecord>>(&json).unwrap()),
            1
        );
        assert_eq!(
            restored.get(&AccountId::from("a")),
            Some(DisabledAccount {
                reason: "r".into(),
                at: 7,
                state: Terminal::Disabled,
            })
        );
        assert_eq!(restored.len(), 1);
    }

    /// Each terminal state is kept through export and import with its reason; an
    /// account already in one keeps its first; re-enabling clears any of them.
    #[test]
    fn terminal_states_round_trip_and_clear() {
        let book = DisabledBook::default();
        for (i, state) in Terminal::ALL.into_iter().enumerate() {
            let a = AccountId::from(format!("a{i}"));
            assert!(book.disable_as(&a, state, format!("why {i}"), 10 + i as u64));
            assert!(book.disable_as(&a, Terminal::Banned, "later", 99));
            assert_eq!(book.get(&a).unwrap().state, state);
        }
        let json = serde_json::to_string(&book.export()).unwrap();
        assert!(json.contains(r#""state":"credits_exhausted""#), "{json}");
        let restored = DisabledBook::default();
        restored.import(serde_json::from_str::<Vec<DisabledRecord>>(&json).unwrap());
        for (i, state) in Terminal::ALL.into_iter().enumerate() {
            let a = AccountId::from(format!("a{i}"));
            let d = restored.get(&a).unwrap();
            assert_eq!(
                (d.state, d.reason.as_str(), d.at),
                (state, format!("why {i}").as_str(), 10 + i as u64)
            );
            assert_eq!(restored.reenable(&a).unwrap().state, state);
            assert!(!restored.is_disabled(&a));
        }
    }

    #[test]
    fn reason_for_transport_has_no_status() {
        let c = classify(&AttemptFailure::Transport(TransportFailure::Reset), 0);
        assert_eq!(disable_reason(&c), "transient: reset");
    }
}
