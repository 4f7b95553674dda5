//! Alerts (SPEC 15): the events worth telling an operator about, and the bounded queue
//! that takes them off the request path.
//!
//! Where something happens (an account disabled, out of a window, a budget reached, a
//! reload rejected; a pool unavailable, seen by the maintenance tick) the store calls
//! [`AlertQueue::emit`]: it never waits. An event no webhook wants is dropped at once;
//! the same event for the same subject passes at most once per `dedup_secs`
//! ([`policy::Deduplicator`]); a full queue drops it (counted). The proxy's sender task
//! takes the receiving end ([`AlertQueue::take_receiver`]) and delivers, with retries
//! ([`policy::RetrySchedule`]); its outcomes are counted in [`AlertCounters`].
//!
//! # Layout
//! - here: [`AlertKind`], [`AlertSubject`], [`AlertEvent`], [`AlertQueue`],
//!   [`AlertCounters`].
//! - [`policy`]: the pure state machines (deduplication, backoff, pool outages).
//! - `pools`: the maintenance tick's look at every pool for `pool_unavailable`.
//! - [`recent`]: the last alerts and their deliveries, for `GET /admin/alerts`.

pub mod policy;
mod pools;
pub mod recent;

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use dashmap::DashMap;
use keypool_core::UnixMs;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::config::AlertSettings;
use policy::{Deduplicator, PoolOutageTracker};

/// Events the queue holds before new ones are dropped.
pub const QUEUE_CAPACITY: usize = 1024;

/// The share of a pool's accounts that makes it unavailable (SPEC 15: 80 %).
pub const POOL_UNAVAILABLE_SHARE: f64 = 0.8;

/// Longest `reason` an event carries (a rejected reload can list many problems).
const MAX_REASON_CHARS: usize = 2000;

macro_rules! alert_kinds {
    ($($variant:ident => $name:literal, $doc:literal;)*) => {
        /// What an alert is about: the `event` of its payload and of `events = [...]`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum AlertKind {
            $(#[doc = $doc] $variant,)*
        }

        impl AlertKind {
            /// Every kind, in the order `docs/CONFIG.md` lists them.
            pub const ALL: &'static [AlertKind] = &[$(Self::$variant),*];

            /// The name in the config and the payload.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }
        }
    };
}

alert_kinds! {
    AccountDisabled => "account_disabled", "An account was disabled by an upstream answer (401/403: a key error), with the reason.";
    AccountBanned => "account_banned", "An account was banned (SPEC 16): an error body matched `ban_markers`, or its 3rd consecutive 403.";
    AccountExpired => "account_expired", "An OAuth account expired: its refresh token was refused (invalid_grant) or failed 3 times in a row (SPEC 14); it needs a new login.";
    AccountOutOfCredits => "account_out_of_credits", "An account ran out of credits (a 402, or a body saying the credit balance is too low): state `credits_exhausted`, with the reason.";
    OauthRefreshFailed => "oauth_refresh_failed", "An OAuth refresh failed for transport, a timeout, a 429 or a 5xx; retried after a backoff (SPEC 14).";
    AccountOutOfWindow => "account_out_of_window", "An account went out of a usage window (5 hours, weekly, or its request limit).";
    PoolUnavailable => "pool_unavailable", "At least 80 % of a pool's accounts were unavailable for `pool_unavailable_secs`.";
    BudgetReached => "budget_reached", "A caller (LB key, or an org's team budget) reached a token or USD budget.";
    ConfigReloadRejected => "config_reload_rejected", "A config reload was rejected (the old configuration keeps serving).";
}

impl AlertKind {
    fn index(self) -> usize {
        Self::ALL.iter().position(|&k| k == self).unwrap_or(0)
    }

    /// `account_disabled, account_banned, …`: for messages.
    pub fn names() -> String {
        Self::ALL
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for AlertKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AlertKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown event `{s}`; expected one of: {}", Self::names()))
    }
}

/// Whom an alert is about; the fields that apply are set. Never a secret, a key hash or
/// an LB key: account ids, org slugs, pool names and key ids come from the config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AlertSubject {
    /// The account.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<Arc<str>>,
    /// The org.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub org: Option<Arc<str>>,
    /// The pool: `org/*` (the org's accounts) or `org/group`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<Arc<str>>,
    /// The caller: the LB key's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caller: Option<Arc<str>>,
    /// The limit reached (`usd_per_day`, `team_usd_per_month`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<&'static str>,
}

impl AlertSubject {
    /// The subject as one string, for deduplication and messages: `account=a1 org=acme`.
    pub fn key(&self) -> String {
        let parts = [
            ("account", self.account.as_deref()),
            ("org", self.org.as_deref()),
            ("pool", self.pool.as_deref()),
            ("caller", self.caller.as_deref()),
            ("limit", self.limit),
        ];
        parts
            .iter()
            .filter_map(|(name, v)| v.map(|v| format!("{name}={v}")))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// One alert: what, about whom, why and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertEvent {
    /// Its number since boot (set when it is queued; `0` before).
    pub id: u64,
    /// What happened.
    pub kind: AlertKind,
    /// About whom.
    pub subject: AlertSubject,
    /// Why, for a human (secret-free, at most 2000 characters).
    pub reason: String,
    /// When, unix ms.
    pub at: UnixMs,
}

impl AlertEvent {
    /// An event; `reason` is cut to 2000 characters.
    pub fn new(
        kind: AlertKind,
        subject: AlertSubject,
        reason: impl Into<String>,
        at: UnixMs,
    ) -> Self {
        let mut reason: String = reason.into();
        if let Some((cut, _)) = reason.char_indices().nth(MAX_REASON_CHARS) {
            reason.truncate(cut);
            reason.push('…');
        }
        Self {
            id: 0,
            kind,
            subject,
            reason,
            at,
        }
    }

    /// One readable line: `keypool: account_disabled (account=a1 org=acme): <reason>`.
    pub fn summary(&self) -> String {
        let subject = self.subject.key();
        if subject.is_empty() {
            format!("keypool: {}: {}", self.kind, self.reason)
        } else {
            format!("keypool: {} ({subject}): {}", self.kind, self.reason)
        }
    }
}

/// Why an alert was dropped: the `reason` label of `keypool_alerts_dropped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The queue (or a webhook's own queue) was full.
    QueueFull,
    /// Every attempt of a delivery failed.
    RetriesExhausted,
}

impl DropReason {
    /// Both, in label order.
    pub const ALL: [DropReason; 2] = [Self::QueueFull, Self::RetriesExhausted];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::RetriesExhausted => "retries_exhausted",
        }
    }
}

type DeliveryKey = (AlertKind, Arc<str>);

/// What happened to alerts since boot, for the metrics.
#[derive(Debug, Default)]
pub struct AlertCounters {
    sent: DashMap<DeliveryKey, AtomicU64>,
    failed: DashMap<DeliveryKey, AtomicU64>,
    dropped: [AtomicU64; 2],
    suppressed: [AtomicU64; 9],
}

fn bump(map: &DashMap<DeliveryKey, AtomicU64>, kind: AlertKind, webhook: &Arc<str>) {
    if let Some(c) = map.get(&(kind, webhook.clone())) {
        c.fetch_add(1, Ordering::Relaxed);
        return;
    }
    map.entry((kind, webhook.clone()))
        .or_default()
        .fetch_add(1, Ordering::Relaxed);
}

fn rows(map: &DashMap<DeliveryKey, AtomicU64>) -> Vec<(AlertKind, Arc<str>, u64)> {
    let mut rows: Vec<_> = map
        .iter()
        .map(|e| {
            (
                e.key().0,
                e.key().1.clone(),
                e.value().load(Ordering::Relaxed),
            )
        })
        .collect();
    rows.sort();
    rows
}

impl AlertCounters {
    /// A delivery of `kind` the webhook named `webhook` accepted (2xx).
    pub fn sent(&self, kind: AlertKind, webhook: &Arc<str>) {
        bump(&self.sent, kind, webhook);
    }
    /// An attempt to deliver `kind` to `webhook` that failed (timeout, connection,
    /// non-2xx).
    pub fn failed(&self, kind: AlertKind, webhook: &Arc<str>) {
        bump(&self.failed, kind, webhook);
    }
    /// An alert dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) {
        self.dropped[reason as usize].fetch_add(1, Ordering::Relaxed);
    }
    /// Deliveries accepted, by event and webhook, sorted.
    pub fn sent_rows(&self) -> Vec<(AlertKind, Arc<str>, u64)> {
        rows(&self.sent)
    }
    /// Failed attempts, by event and webhook, sorted.
    pub fn failed_rows(&self) -> Vec<(AlertKind, Arc<str>, u64)> {
        rows(&self.failed)
    }
    /// Alerts dropped for `reason`.
    pub fn dropped_total(&self, reason: DropReason) -> u64 {
        self.dropped[reason as usize].load(Ordering::Relaxed)
    }
    /// Events of `kind` suppressed as repeats.
    pub fn suppressed_total(&self, kind: AlertKind) -> u64 {
        self.suppressed[kind.index()].load(Ordering::Relaxed)
    }
}

/// The bounded queue between where events happen and the sender task.
#[derive(Debug)]
pub struct AlertQueue {
    sender: mpsc::Sender<Arc<AlertEvent>>,
    receiver: Mutex<Option<mpsc::Receiver<Arc<AlertEvent>>>>,
    dedup: Mutex<Deduplicator>,
    outages: Mutex<PoolOutageTracker>,
    counters: Arc<AlertCounters>,
    recent: Arc<recent::RecentAlerts>,
    next_id: AtomicU64,
}

impl Default for AlertQueue {
    fn default() -> Self {
        Self::with_capacity(QUEUE_CAPACITY)
    }
}

impl AlertQueue {
    /// A queue holding at most `capacity` events.
    pub fn with_capacity(capacity: usize) -> Self {
        let (sender, receiver) = mpsc::channel(capacity.max(1));
        Self {
            sender,
            receiver: Mutex::new(Some(receiver)),
            dedup: Mutex::new(Deduplicator::new(0)),
            outages: Mutex::new(PoolOutageTracker::new(POOL_UNAVAILABLE_SHARE)),
            counters: Arc::default(),
            recent: Arc::default(),
            next_id: AtomicU64::new(1),
        }
    }

    /// Queues `event` for the webhooks of `settings` that want it, without waiting:
    /// `false` when none wants it, it repeats one sent less than `dedup_secs` ago
    /// (counted as suppressed) or the queue is full (counted as dropped).
    pub fn emit(&self, settings: &AlertSettings, mut event: AlertEvent) -> bool {
        if !settings.wants(event.kind) {
            return false;
        }
        let subject = event.subject.key();
        let mut dedup = self.dedup.lock().unwrap_or_else(PoisonError::into_inner);
        if !dedup.admit(event.kind, &subject, event.at, settings.dedup_ms) {
            self.counters.suppressed[event.kind.index()].fetch_add(1, Ordering::Relaxed);
            return false;
        }
        event.id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let kind = event.kind;
        match self.sender.try_send(Arc::new(event)) {
            Ok(()) => true,
            Err(_) => {
                // never sent: the next one of its kind is not a repeat
                dedup.forget(kind, &subject);
                self.counters.dropped(DropReason::QueueFull);
                false
            }
        }
    }

    /// The receiving end, for the one sender task (later calls return `None`).
    pub fn take_receiver(&self) -> Option<mpsc::Receiver<Arc<AlertEvent>>> {
        self.receiver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// The outcome counters (shared with the sender task).
    pub fn counters(&self) -> &Arc<AlertCounters> {
        &self.counters
    }

    /// The last alerts and their deliveries (shared with the sender task).
    pub fn recent(&self) -> &Arc<recent::RecentAlerts> {
        &self.recent
    }

    /// The pool outage tracker, for the maintenance tick.
    pub(crate) fn outages(&self) -> std::sync::MutexGuard<'_, PoolOutageTracker> {
        self.outages.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `2026-05-01T12:00:00Z`: an alert's time as its payload writes it.
pub fn rfc3339(ms: UnixMs) -> String {
    let t = keypool_core::UtcDateTime::from_unix_secs(ms / 1000);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AlertFormat, Secret, Webhook};

    fn settings(events: Vec<AlertKind>) -> AlertSettings {
        AlertSettings {
            webhooks: vec![Arc::new(Webhook {
                name: Arc::from("0"),
                url: Secret::new("http://127.0.0.1:9/hook"),
                format: AlertFormat::Json,
                events,
                timeout_ms: 100,
            })],
            ..AlertSettings::default()
        }
    }

    fn disabled(account: &str, at: UnixMs) -> AlertEvent {
        AlertEvent::new(
            AlertKind::AccountDisabled,
            AlertSubject {
                account: Some(Arc::from(account)),
                ..AlertSubject::default()
            },
            "key_error",
            at,
        )
    }

    #[test]
    fn emit_drops_unwanted_suppresses_repeats_and_counts_a_full_queue() {
        let queue = AlertQueue::with_capacity(2);
        assert!(!queue.emit(&AlertSettings::default(), disabled("a", 0)));
        assert!(!queue.emit(&settings(vec![AlertKind::BudgetReached]), disabled("a", 0)));
        let s = settings(AlertKind::ALL.to_vec());
        assert!(queue.emit(&s, disabled("a", 1_000)));
        assert!(!queue.emit(&s, disabled("a", 2_000)));
        assert_eq!(
            queue
                .counters()
                .suppressed_total(AlertKind::AccountDisabled),
            1
        );
        assert!(queue.emit(&s, disabled("b", 2_000)));
        assert!(!queue.emit(&s, disabled("c", 2_000)));
        assert_eq!(queue.counters().dropped_total(DropReason::QueueFull), 1);
        // dropped, not sent: a second one is dropped again, not suppressed
        assert!(!queue.emit(&s, disabled("c", 2_500)));
        assert_eq!(queue.counters().dropped_total(DropReason::QueueFull), 2);
        assert_eq!(
            queue
                .counters()
                .suppressed_total(AlertKind::AccountDisabled),
            1
        );
        let mut rx = queue.take_receiver().expect("the receiver, once");
        assert!(queue.take_receiver().is_none());
        let ids: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, [1, 2]);
    }

    #[test]
    fn a_reason_is_cut_and_the_summary_names_the_subject() {
        let long = AlertEvent::new(
            AlertKind::ConfigReloadRejected,
            AlertSubject::default(),
            "x".repeat(5000),
            0,
        );
        assert_eq!(long.reason.chars().count(), MAX_REASON_CHARS + 1);
        assert_eq!(
            disabled("a1", 0).summary(),
            "keypool: account_disabled (account=a1): key_error"
        );
        assert_eq!(
            AlertEvent::new(
                AlertKind::ConfigReloadRejected,
                AlertSubject::default(),
                "bad",
                0
            )
            .summary(),
            "keypool: config_reload_rejected: bad"
        );
        assert_eq!(rfc3339(1_764_547_200_000), "2025-12-01T00:00:00Z");
        assert_eq!("pool_unavailable".parse(), Ok(AlertKind::PoolUnavailable));
        assert!("nope".parse::<AlertKind>().is_err());
    }
}
