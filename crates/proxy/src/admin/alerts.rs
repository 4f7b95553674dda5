//! `GET /admin/alerts` (SPEC 15): the webhooks (never their URLs) and the last alerts
//! with the state of each delivery.

use keypool_store::Store;
use keypool_store::alerts::rfc3339;
use keypool_store::config::AlertFormat;
use serde_json::{Value, json};

/// The configured webhooks and the last 100 alerts, newest first.
pub(super) fn alerts(store: &Store) -> Value {
    let config = store.config();
    let webhooks: Vec<Value> = config
        .alerts()
        .webhooks
        .iter()
        .map(|w| {
            json!({
                "name": &*w.name,
                "format": match w.format {
                    AlertFormat::Json => "json",
                    AlertFormat::Slack => "slack",
                },
                "events": w.events.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
                "timeout_ms": w.timeout_ms,
            })
        })
        .collect();
    let recent: Vec<Value> = store
        .alerts()
        .recent()
        .newest_first()
        .into_iter()
        .map(|a| {
            json!({
                "id": a.event.id,
                "event": a.event.kind.as_str(),
                "subject": &a.event.subject,
                "reason": &a.event.reason,
                "at": rfc3339(a.event.at),
                "deliveries": a.deliveries,
            })
        })
        .collect();
    json!({ "webhooks": webhooks, "alerts": recent })
}
