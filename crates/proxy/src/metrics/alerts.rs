//! The alert series (SPEC 15): deliveries, failed attempts, dropped and suppressed
//! alerts, read from the store's [`AlertCounters`](keypool_store::alerts::AlertCounters).
//! The `webhook` label is the webhook's `name` (or its index), never its URL.

use std::fmt::Write as _;

use keypool_store::Store;
use keypool_store::alerts::{AlertKind, DropReason};

use super::escape;

/// `keypool_alerts_sent_total`, `keypool_alerts_failed_total`,
/// `keypool_alerts_dropped_total` and `keypool_alerts_suppressed_total`.
pub(super) fn render_alerts(out: &mut String, store: &Store) {
    let counters = store.alerts().counters();
    for (name, help, rows) in [
        (
            "keypool_alerts_sent_total",
            "Alerts a webhook accepted (2xx), by event and webhook (its name or index).",
            counters.sent_rows(),
        ),
        (
            "keypool_alerts_failed_total",
            "Alert delivery attempts that failed (timeout, connection, non-2xx answer), by event and webhook; each is retried until max_attempts.",
            counters.failed_rows(),
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (kind, webhook, n) in rows {
            let _ = writeln!(
                out,
                "{name}{{event=\"{}\",webhook=\"{}\"}} {n}",
                kind.as_str(),
                escape(&webhook)
            );
        }
    }
    super::counter_family(
        out,
        "keypool_alerts_dropped_total",
        "Alerts dropped, by reason: queue_full (the queue or a webhook's queue was full), retries_exhausted (every attempt failed).",
        "reason",
        DropReason::ALL.map(|r| (r.as_str(), counters.dropped_total(r))),
    );
    super::counter_family(
        out,
        "keypool_alerts_suppressed_total",
        "Alerts not sent because the same event for the same subject was sent less than dedup_secs ago, by event.",
        "event",
        AlertKind::ALL
            .iter()
            .map(|&k| (k.as_str(), counters.suppressed_total(k))),
    );
}
