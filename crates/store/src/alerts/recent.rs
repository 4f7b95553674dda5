//! [`RecentAlerts`]: the last alerts queued and what became of each delivery, for
//! `GET /admin/alerts`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;

use super::AlertEvent;

/// Alerts kept (the oldest go first).
pub const RECENT_ALERTS: usize = 100;

/// Where one delivery of one alert to one webhook is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Queued for the webhook, not tried yet.
    Pending,
    /// An attempt failed; it is tried again.
    Retrying,
    /// The webhook accepted it.
    Sent,
    /// Given up: every attempt failed, or the webhook's queue was full.
    Dropped,
}

/// One delivery: the webhook's name, its state, attempts made and the last failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Delivery {
    /// The webhook's name (never its URL).
    pub webhook: Arc<str>,
    /// Where it is.
    pub state: DeliveryState,
    /// Attempts made.
    pub attempts: u32,
    /// Why the last attempt failed (never the URL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// One alert and its deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentAlert {
    /// The alert.
    pub event: Arc<AlertEvent>,
    /// One per webhook that wants it.
    pub deliveries: Vec<Delivery>,
}

/// The last [`RECENT_ALERTS`] alerts handed to webhooks. A std `Mutex`: nothing
/// awaits while it is held, and only the sender and the admin API take it.
#[derive(Debug, Default)]
pub struct RecentAlerts(Mutex<VecDeque<RecentAlert>>);

impl RecentAlerts {
    /// Records `event`, pending for each of `webhooks`.
    pub fn queued(&self, event: &Arc<AlertEvent>, webhooks: &[Arc<str>]) {
        let mut recent = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.len() >= RECENT_ALERTS {
            recent.pop_front();
        }
        recent.push_back(RecentAlert {
            event: event.clone(),
            deliveries: webhooks
                .iter()
                .map(|w| Delivery {
                    webhook: w.clone(),
                    state: DeliveryState::Pending,
                    attempts: 0,
                    last_error: None,
                })
                .collect(),
        });
    }

    /// Updates the delivery of the alert `id` to `webhook` (if it is still kept):
    /// `attempted` counts one more attempt, `error` is its failure.
    pub fn update(
        &self,
        id: u64,
        webhook: &str,
        state: DeliveryState,
        attempted: bool,
        error: Option<&str>,
    ) {
        let mut recent = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let delivery = recent
            .iter_mut()
            .rev()
            .find(|a| a.event.id == id)
            .and_then(|a| a.deliveries.iter_mut().find(|d| &*d.webhook == webhook));
        if let Some(d) = delivery {
            d.state = state;
            d.attempts += u32::from(attempted);
            if let Some(e) = error {
                d.last_error = Some(e.to_owned());
            }
        }
    }

    /// The alerts kept, newest first.
    pub fn newest_first(&self) -> Vec<RecentAlert> {
        let recent = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        recent.iter().rev().cloned().collect()
    }
}
