//! `[alerts]` and `[[alerts.webhooks]]` (SPEC 15). A webhook's `url` is a secret (a
//! Slack webhook URL is one): resolved like the others, and never quoted in a message.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Issues, parse_named, resolve_secret};
use crate::alerts::AlertKind;
use crate::config::raw::{RawAlerts, RawWebhook};
use crate::config::{AlertFormat, AlertSettings, Secret, Webhook};

/// Validates `[alerts]` and its webhooks.
pub(super) fn validate(
    raw: &RawAlerts,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> AlertSettings {
    let d = AlertSettings::default();
    let mut bounded =
        |field: &str, value: Option<i64>, min: i64, max: i64, default: u64| match value {
            None => default,
            Some(n) if (min..=max).contains(&n) => n.unsigned_abs(),
            Some(n) => {
                issues.push(
                    format!("alerts.{field}"),
                    format!("{field} must be between {min} and {max} (got {n})"),
                );
                default
            }
        };
    let dedup_secs = bounded("dedup_secs", raw.dedup_secs, 0, 86_400, d.dedup_ms / 1000);
    let retry_initial_ms = bounded(
        "retry_initial_ms",
        raw.retry_initial_ms,
        10,
        60_000,
        d.retry_initial_ms,
    );
    let max_attempts = bounded(
        "max_attempts",
        raw.max_attempts,
        1,
        20,
        u64::from(d.max_attempts),
    );
    let pool_secs = bounded(
        "pool_unavailable_secs",
        raw.pool_unavailable_secs,
        1,
        86_400,
        d.pool_unavailable_ms / 1000,
    );
    let mut names: HashMap<String, usize> = HashMap::new();
    let webhooks = raw
        .webhooks
        .iter()
        .filter_map(|(i, w)| {
            let hook = webhook(*i, w, env, issues);
            let name = w.name.clone().unwrap_or_else(|| i.to_string());
            if let Some(first) = names.get(&name) {
                issues.push(
                    format!("alerts.webhooks[{i}].name"),
                    format!(
                        "webhook name {name:?} is used twice (first at alerts.webhooks[{first}]); names label the metrics"
                    ),
                );
                return None;
            }
            names.insert(name, *i);
            hook.map(Arc::new)
        })
        .collect();
    AlertSettings {
        webhooks,
        dedup_ms: dedup_secs * 1000,
        retry_initial_ms,
        max_attempts: u32::try_from(max_attempts).unwrap_or(d.max_attempts),
        pool_unavailable_ms: pool_secs * 1000,
    }
}

fn webhook(
    i: usize,
    w: &RawWebhook,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> Option<Webhook> {
    let loc = |field: &str| format!("alerts.webhooks[{i}].{field}");
    let url = resolve_secret(&w.url, false, &loc("url"), env, issues)
        .and_then(|url| check_url(url, &loc("url"), issues));
    let name = match &w.name {
        None => Some(Arc::from(i.to_string())),
        Some(n) if is_label(n) => Some(Arc::from(n.as_str())),
        Some(n) => {
            issues.push(
                loc("name"),
                format!("webhook name {n:?} may only use letters, digits, `.`, `_` and `-` (1 to 64 of them; it labels the metrics)"),
            );
            None
        }
    };
    let format = match &w.format {
        None => Some(AlertFormat::Json),
        Some(f) => parse_named::<AlertFormat>(f, &loc("format"), issues),
    };
    let events = match &w.events {
        None => Some(AlertKind::ALL.to_vec()),
        Some(list) if list.is_empty() => {
            issues.push(
                loc("events"),
                "events is empty; leave it out to receive every event",
            );
            None
        }
        Some(list) => {
            let parsed: Vec<Option<AlertKind>> = list
                .iter()
                .map(|e| parse_named::<AlertKind>(e, &loc("events"), issues))
                .collect();
            parsed.into_iter().collect::<Option<Vec<_>>>()
        }
    };
    let timeout_ms = match w.timeout_ms {
        None => Some(5_000),
        Some(n @ 100..=60_000) => Some(n.unsigned_abs()),
        Some(n) => {
            issues.push(
                loc("timeout_ms"),
                format!("timeout_ms must be between 100 and 60000 (got {n})"),
            );
            None
        }
    };
    Some(Webhook {
        name: name?,
        url: url?,
        format: format?,
        events: events?,
        timeout_ms: timeout_ms?,
    })
}

/// `http://host…` or `https://host…`; the message never quotes the URL.
fn check_url(url: Secret, loc: &str, issues: &mut Issues) -> Option<Secret> {
    let value = url.expose();
    let rest = value
        .strip_prefix("https://")
        .or_else(|| value.strip_prefix("http://"));
    let Some(rest) = rest else {
        issues.push(
            loc,
            "the webhook URL must start with http:// or https:// (the value is not shown: it may be a secret)",
        );
        return None;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty()
        || host.chars().any(char::is_whitespace)
        || value.contains(char::is_whitespace)
    {
        issues.push(
            loc,
            "the webhook URL has no host or contains spaces (the value is not shown: it may be a secret)",
        );
        return None;
    }
    Some(url)
}

fn is_label(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}
