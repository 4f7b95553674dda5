//! The alert sender (SPEC 15): drains the store's alert queue and POSTs each event to
//! the webhooks that want it, off the request path.
//!
//! One dispatcher task reads the queue and hands each event to one task per webhook
//! (by name), through that webhook's own bounded queue: a receiver that hangs delays
//! only its own deliveries, each attempt bounded by its `timeout_ms`, and never a
//! request (the request path only calls the non-blocking
//! [`AlertQueue::emit`](keypool_store::alerts::AlertQueue::emit)). A failed attempt
//! is tried again after the retry schedule's wait; after `max_attempts` the delivery
//! is dropped and counted. The webhook URL is a secret: it is never logged.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use keypool_store::alerts::recent::{DeliveryState, RecentAlerts};
use keypool_store::alerts::{AlertCounters, AlertEvent, DropReason, rfc3339};
use keypool_store::config::{AlertFormat, Webhook};
use keypool_store::{Store, WeakStore};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use crate::upstream::UpstreamClient;

/// Deliveries one webhook's queue holds before new ones are dropped.
const WEBHOOK_QUEUE: usize = 256;

/// Where outcomes are recorded: the metrics' counters and the recent alerts.
#[derive(Clone)]
struct Outcomes {
    counters: Arc<AlertCounters>,
    recent: Arc<RecentAlerts>,
}

impl Outcomes {
    fn of(store: &Store) -> Self {
        Self {
            counters: store.alerts().counters().clone(),
            recent: store.alerts().recent().clone(),
        }
    }

    fn update(&self, d: &Delivery, state: DeliveryState, attempted: bool, error: Option<&str>) {
        self.recent
            .update(d.event.id, &d.hook.name, state, attempted, error);
    }
}

/// One event for one webhook, with the retry schedule in force when it was queued.
struct Delivery {
    event: Arc<AlertEvent>,
    hook: Arc<Webhook>,
    schedule: keypool_store::alerts::policy::RetrySchedule,
}

/// Starts the sender for `store`'s alert queue, if no sender took it yet. It ends with
/// the store. Must run inside a tokio runtime.
pub(crate) fn spawn_sender(store: &Store, client: Arc<UpstreamClient>) {
    if let Some(events) = store.alerts().take_receiver() {
        tokio::spawn(dispatch(store.downgrade(), events, client));
    }
}

/// Hands every queued event to the webhooks of the configuration in force that want
/// it.
async fn dispatch(
    store: WeakStore,
    mut events: mpsc::Receiver<Arc<AlertEvent>>,
    client: Arc<UpstreamClient>,
) {
    let mut workers: HashMap<Arc<str>, mpsc::Sender<Delivery>> = HashMap::new();
    while let Some(event) = events.recv().await {
        let Some(store) = store.upgrade() else { return };
        let config = store.config();
        let outcomes = Outcomes::of(&store);
        drop(store);
        let settings = config.alerts();
        let hooks: Vec<&Arc<Webhook>> = settings
            .webhooks
            .iter()
            .filter(|w| w.wants(event.kind))
            .collect();
        let names: Vec<Arc<str>> = hooks.iter().map(|w| w.name.clone()).collect();
        outcomes.recent.queued(&event, &names);
        for hook in hooks {
            let delivery = Delivery {
                event: event.clone(),
                hook: hook.clone(),
                schedule: settings.retry_schedule(),
            };
            hand_over(&mut workers, delivery, &client, &outcomes);
        }
    }
}

/// Puts `delivery` in its webhook's queue (starting the webhook's task when it has
/// none, or when it ended); a full queue drops it.
fn hand_over(
    workers: &mut HashMap<Arc<str>, mpsc::Sender<Delivery>>,
    mut delivery: Delivery,
    client: &Arc<UpstreamClient>,
    outcomes: &Outcomes,
) {
    let name = delivery.hook.name.clone();
    for _ in 0..2 {
        let worker = workers
            .entry(name.clone())
            .or_insert_with(|| spawn_worker(client.clone(), outcomes.clone()));
        match worker.try_send(delivery) {
            Ok(()) => return,
            Err(TrySendError::Full(d)) => {
                outcomes.counters.dropped(DropReason::QueueFull);
                outcomes.update(
                    &d,
                    DeliveryState::Dropped,
                    false,
                    Some("the webhook's queue was full"),
                );
                tracing::warn!(webhook = %name, event = %d.event.kind, "alert dropped: the webhook's queue is full");
                return;
            }
            Err(TrySendError::Closed(d)) => {
                workers.remove(&name);
                delivery = d;
            }
        }
    }
}

fn spawn_worker(client: Arc<UpstreamClient>, outcomes: Outcomes) -> mpsc::Sender<Delivery> {
    let (tx, mut rx) = mpsc::channel::<Delivery>(WEBHOOK_QUEUE);
    tokio::spawn(async move {
        while let Some(delivery) = rx.recv().await {
            deliver(&client, &outcomes, &delivery).await;
        }
    });
    tx
}

/// Sends one delivery, trying again on the schedule; counts every outcome.
async fn deliver(client: &UpstreamClient, outcomes: &Outcomes, d: &Delivery) {
    let counters = &outcomes.counters;
    let body = Bytes::from(payload(d.hook.format, &d.event));
    let (kind, name) = (d.event.kind, &d.hook.name);
    let mut failed = 0;
    loop {
        let why = match post(client, &d.hook, body.clone()).await {
            Ok(()) => {
                counters.sent(kind, name);
                outcomes.update(d, DeliveryState::Sent, true, None);
                tracing::debug!(webhook = %name, event = %kind, "alert delivered");
                return;
            }
            Err(why) => why,
        };
        counters.failed(kind, name);
        failed += 1;
        match d.schedule.delay_after(failed) {
            Some(wait) => {
                outcomes.update(d, DeliveryState::Retrying, true, Some(&why));
                tracing::debug!(webhook = %name, event = %kind, error = %why, attempt = failed, retry_in_ms = wait, "alert delivery failed; retrying");
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            None => {
                counters.dropped(DropReason::RetriesExhausted);
                outcomes.update(d, DeliveryState::Dropped, true, Some(&why));
                tracing::warn!(webhook = %name, event = %kind, error = %why, attempts = failed, "alert dropped: every delivery attempt failed");
                return;
            }
        }
    }
}

/// One POST, bounded by the webhook's timeout; `Err` says why (never the URL).
async fn post(client: &UpstreamClient, hook: &Webhook, body: Bytes) -> Result<(), String> {
    let uri: http::Uri = hook
        .url
        .expose()
        .parse()
        .map_err(|_| "the webhook URL is not a valid URI".to_owned())?;
    let request = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(
            http::header::USER_AGENT,
            concat!("keypool/", env!("CARGO_PKG_VERSION")),
        )
        .body(Full::new(body))
        .map_err(|_| "the request could not be built".to_owned())?;
    let timeout = Duration::from_millis(hook.timeout_ms);
    match tokio::time::timeout(timeout, client.request(request)).await {
        Err(_) => Err(format!("no answer within {} ms", hook.timeout_ms)),
        Ok(Err(e)) if e.is_connect() => Err("could not connect".to_owned()),
        Ok(Err(_)) => Err("the connection failed".to_owned()),
        Ok(Ok(response)) if response.status().is_success() => Ok(()),
        Ok(Ok(response)) => Err(format!("answered {}", response.status().as_u16())),
    }
}

/// The body for `format`: the JSON event, or Slack's `{"text": …}`.
pub(crate) fn payload(format: AlertFormat, event: &AlertEvent) -> Vec<u8> {
    let value = match format {
        AlertFormat::Json => serde_json::json!({
            "event": event.kind.as_str(),
            "subject": &event.subject,
            "reason": &event.reason,
            "at": rfc3339(event.at),
            "keypool": { "version": env!("CARGO_PKG_VERSION") },
        }),
        AlertFormat::Slack => serde_json::json!({ "text": event.summary() }),
    };
    serde_json::to_vec(&value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use keypool_store::alerts::{AlertKind, AlertSubject};

    fn event() -> AlertEvent {
        AlertEvent::new(
            AlertKind::AccountDisabled,
            AlertSubject {
                account: Some(Arc::from("a1")),
                org: Some(Arc::from("acme")),
                ..AlertSubject::default()
            },
            "key_error: upstream answered 401 (auth_rejected)",
            1_764_547_200_000,
        )
    }

    #[test]
    fn json_payload_names_event_subject_reason_and_time() {
        let v: serde_json::Value =
            serde_json::from_slice(&payload(AlertFormat::Json, &event())).unwrap_or_default();
        assert_eq!(v["event"], "account_disabled");
        assert_eq!(
            v["subject"],
            serde_json::json!({"account": "a1", "org": "acme"})
        );
        assert_eq!(
            v["reason"],
            "key_error: upstream answered 401 (auth_rejected)"
        );
        assert_eq!(v["at"], "2025-12-01T00:00:00Z");
        assert_eq!(v["keypool"]["version"], env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn slack_payload_is_one_readable_line() {
        let v: serde_json::Value =
            serde_json::from_slice(&payload(AlertFormat::Slack, &event())).unwrap_or_default();
        assert_eq!(
            v,
            serde_json::json!({"text": "keypool: account_disabled (account=a1 org=acme): key_error: upstream answered 401 (auth_rejected)"})
        );
    }
}
