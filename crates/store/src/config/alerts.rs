//! `[alerts]` and `[[alerts.webhooks]]` (SPEC 15), validated.

use std::sync::Arc;

use super::Secret;
use crate::alerts::AlertKind;
use crate::alerts::policy::RetrySchedule;

/// The longest wait between two attempts of one delivery.
pub const RETRY_CAP_MS: u64 = 60_000;

/// How a webhook's body is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertFormat {
    /// `{"event", "subject", "reason", "at", "keypool"}`.
    Json,
    /// `{"text": "<one readable line>"}` (a Slack incoming webhook).
    Slack,
}

impl std::str::FromStr for AlertFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "json" => Ok(Self::Json),
            "slack" => Ok(Self::Slack),
            other => Err(format!("unknown format `{other}`; expected json or slack")),
        }
    }
}

/// One `[[alerts.webhooks]]` element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    /// Its metric label: `name`, or its index in `[[alerts.webhooks]]`.
    pub name: Arc<str>,
    /// Where alerts are POSTed (a secret: a Slack webhook URL is one).
    pub url: Secret,
    /// How the body is written.
    pub format: AlertFormat,
    /// The events it receives (every one by default).
    pub events: Vec<AlertKind>,
    /// How long one attempt may take, ms.
    pub timeout_ms: u64,
}

impl Webhook {
    /// Whether it receives events of `kind`.
    pub fn wants(&self, kind: AlertKind) -> bool {
        self.events.contains(&kind)
    }
}

/// `[alerts]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertSettings {
    /// The webhooks, in file order.
    pub webhooks: Vec<Arc<Webhook>>,
    /// The same event for the same subject at most once per this (`dedup_secs`), ms.
    pub dedup_ms: u64,
    /// The wait after a delivery's first failed attempt (`retry_initial_ms`); it doubles
    /// up to 60 s.
    pub retry_initial_ms: u64,
    /// Attempts of one delivery in all (`max_attempts`).
    pub max_attempts: u32,
    /// How long a pool must be unavailable before it is alerted
    /// (`pool_unavailable_secs`), ms.
    pub pool_unavailable_ms: u64,
}

impl Default for AlertSettings {
    fn default() -> Self {
        Self {
            webhooks: Vec::new(),
            dedup_ms: 600_000,
            retry_initial_ms: 1_000,
            max_attempts: 8,
            pool_unavailable_ms: 60_000,
        }
    }
}

impl AlertSettings {
    /// Whether some webhook receives events of `kind`.
    pub fn wants(&self, kind: AlertKind) -> bool {
        self.webhooks.iter().any(|w| w.wants(kind))
    }

    /// The retry schedule of every delivery.
    pub fn retry_schedule(&self) -> RetrySchedule {
        RetrySchedule {
            initial_ms: self.retry_initial_ms,
            cap_ms: RETRY_CAP_MS.max(self.retry_initial_ms),
            max_attempts: self.max_attempts,
        }
    }
}
