//! Reading the TOML document into the raw sections, element by element: every unknown
//! key is named with its location, a value of the wrong type is reported at its key,
//! and one bad element never hides the problems of the others.

use serde::de::DeserializeOwned;

use super::Issues;
use crate::config::raw::{
    RawAccount, RawAdmin, RawAlerts, RawConfig, RawGroup, RawKey, RawLimits, RawOAuth, RawOrg,
    RawPrice, RawRating, RawServer, RawUrl, RawUsage, RawWebhook, field_names,
};

/// The document's sections as written, each element deserialised on its own with its
/// index in its array.
pub(super) struct Sections {
    pub raw: RawConfig,
    pub cooldown: keypool_cooldown::CooldownSettings,
    pub orgs: Vec<(usize, RawOrg)>,
    pub accounts: Vec<(usize, RawAccount)>,
    pub groups: Vec<(usize, RawGroup)>,
    pub urls: Vec<(usize, RawUrl)>,
    pub keys: Vec<(usize, RawKey)>,
    pub prices: Vec<(usize, RawPrice)>,
    pub restate: Vec<(usize, keypool_cooldown::RestateRule)>,
    pub models: Vec<(usize, crate::config::raw::RawModel)>,
    pub usage: RawUsage,
    pub oauth: RawOAuth,
    pub alerts: RawAlerts,
}

/// Reads every section of `table`, reporting unknown and mistyped keys.
pub(super) fn read_sections(table: &toml::Table, issues: &mut Issues) -> Sections {
    let mut raw = RawConfig::default();
    check_unknown::<RawConfig>(table, "", issues);
    if let Some(v) = table.get("server") {
        raw.server = read_server(v, issues).unwrap_or(raw.server);
    }
    let cooldown = table
        .get("cooldown")
        .and_then(|v| read_cooldown(v, issues))
        .unwrap_or_default();
    if let Some(v) = table.get("admin")
        && let Some(a) = check_element::<RawAdmin>(v, "admin", issues)
    {
        raw.admin = a;
    }
    let usage = table
        .get("usage")
        .and_then(|v| check_element::<RawUsage>(v, "usage", issues))
        .unwrap_or_default();
    let oauth = table
        .get("oauth")
        .and_then(|v| check_element::<RawOAuth>(v, "oauth", issues))
        .unwrap_or_default();
    Sections {
        raw,
        cooldown,
        orgs: with_limits(
            elements_without::<RawOrg>(table, "orgs", "limits", issues),
            table,
            "orgs",
            issues,
            |o, l| o.limits = l,
        ),
        accounts: elements::<RawAccount>(table, "accounts", issues),
        groups: elements::<RawGroup>(table, "groups", issues),
        urls: elements::<RawUrl>(table, "urls", issues),
        keys: with_limits(
            elements_without::<RawKey>(table, "keys", "limits", issues),
            table,
            "keys",
            issues,
            |k, l| k.limits = l,
        ),
        prices: elements::<RawPrice>(table, "prices", issues),
        restate: elements::<keypool_cooldown::RestateRule>(table, "restate", issues),
        models: elements::<crate::config::raw::RawModel>(table, "models", issues),
        usage,
        oauth,
        alerts: table
            .get("alerts")
            .and_then(|v| read_alerts(v, issues))
            .unwrap_or_default(),
    }
}

/// `[alerts]` and each of its `[[alerts.webhooks]]`, checked on their own.
fn read_alerts(v: &toml::Value, issues: &mut Issues) -> Option<RawAlerts> {
    let mut without_webhooks = v.clone();
    let webhooks = without_webhooks
        .as_table_mut()
        .and_then(|t| t.remove("webhooks"));
    // the webhooks are checked even when a setting of [alerts] is mistyped
    let mut alerts = check_element::<RawAlerts>(&without_webhooks, "alerts", issues);
    let mut read = Vec::new();
    match webhooks {
        None => {}
        Some(toml::Value::Array(items)) => {
            read = items
                .iter()
                .enumerate()
                .filter_map(|(i, w)| {
                    check_element::<RawWebhook>(w, &format!("alerts.webhooks[{i}]"), issues)
                        .map(|w| (i, w))
                })
                .collect();
        }
        Some(_) => issues.push(
            "alerts.webhooks",
            "`alerts.webhooks` must be an array of tables: write [[alerts.webhooks]]",
        ),
    }
    if let Some(a) = alerts.as_mut() {
        a.webhooks = read;
    }
    alerts
}

/// `[server]` with its `[server.rating]`, each checked on its own.
fn read_server(v: &toml::Value, issues: &mut Issues) -> Option<RawServer> {
    if let Some(t) = v.as_table()
        && let Some(r) = t.get("rating")
    {
        check_element::<RawRating>(r, "server.rating", issues);
    }
    let mut without_rating = v.clone();
    if let Some(t) = without_rating.as_table_mut() {
        t.remove("rating");
    }
    let mut server = check_element::<RawServer>(&without_rating, "server", issues)?;
    server.rating = v
        .get("rating")
        .and_then(deserialize_lenient::<RawRating>)
        .unwrap_or_default();
    Some(server)
}

/// `[cooldown]`, and the keys that belong in `[server]` instead.
fn read_cooldown(
    v: &toml::Value,
    issues: &mut Issues,
) -> Option<keypool_cooldown::CooldownSettings> {
    if let Some(t) = v.as_table() {
        for (key, server_name) in [
            ("auto_disable_on_error", "auto_disable_on_error"),
            ("window_threshold", "default_window_threshold"),
        ] {
            if t.contains_key(key) {
                issues.push(
                    format!("cooldown.{key}"),
                    format!("set this in [server] as `{server_name}`"),
                );
            }
        }
        if t.get("breaker").and_then(|b| b.get("enabled")).is_some() {
            issues.push(
                "cooldown.breaker.enabled",
                "set this in [server] as `circuit_breaker`",
            );
        }
    }
    check_element::<keypool_cooldown::CooldownSettings>(v, "cooldown", issues)
}

/// The elements of `[[section]]`, each deserialised on its own.
fn elements<T: DeserializeOwned>(
    table: &toml::Table,
    section: &str,
    issues: &mut Issues,
) -> Vec<(usize, T)> {
    elements_without::<T>(table, section, "", issues)
}

/// The `[section.limits]` table of each element, checked on its own
/// (`keys[3].limits.burst`) and handed to `set`.
fn with_limits<T>(
    mut elements: Vec<(usize, T)>,
    table: &toml::Table,
    section: &str,
    issues: &mut Issues,
    set: impl Fn(&mut T, Option<RawLimits>),
) -> Vec<(usize, T)> {
    let Some(toml::Value::Array(items)) = table.get(section) else {
        return elements;
    };
    // Every element's limits are checked, also those of an element that is itself
    // invalid (its problems are reported all the same).
    let mut limits: Vec<Option<RawLimits>> = items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.get("limits").and_then(|l| {
                check_element::<RawLimits>(l, &format!("{section}[{i}].limits"), issues)
            })
        })
        .collect();
    for (i, element) in &mut elements {
        set(element, limits.get_mut(*i).and_then(Option::take));
    }
    elements
}

/// The elements of `[[section]]` without their `nested` table (read on its own), each
/// deserialised on its own.
fn elements_without<T: DeserializeOwned>(
    table: &toml::Table,
    section: &str,
    nested: &str,
    issues: &mut Issues,
) -> Vec<(usize, T)> {
    match table.get(section) {
        None => Vec::new(),
        Some(toml::Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let mut v = v.clone();
                if let Some(t) = v.as_table_mut() {
                    t.remove(nested);
                }
                check_element::<T>(&v, &format!("{section}[{i}]"), issues).map(|t| (i, t))
            })
            .collect(),
        Some(_) => {
            issues.push(
                section,
                format!("`{section}` must be an array of tables: write [[{section}]]"),
            );
            Vec::new()
        }
    }
}

/// Reports unknown keys of `value` at `loc.key`, then deserialises it without them.
fn check_element<T: DeserializeOwned>(
    value: &toml::Value,
    loc: &str,
    issues: &mut Issues,
) -> Option<T> {
    let Some(table) = value.as_table() else {
        issues.push(loc, "expected a table");
        return None;
    };
    check_unknown::<T>(table, loc, issues);
    let known = field_names::<T>();
    let cleaned: toml::Table = table
        .iter()
        .filter(|(k, _)| known.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Each round reports one problem; a value of the wrong type is reported at its key
    // and removed, so that the next round finds the next one.
    let mut table = cleaned;
    let mut removed: Vec<String> = Vec::new();
    loop {
        let e = match toml::Value::Table(table.clone()).try_into::<T>() {
            Ok(t) => return removed.is_empty().then_some(t),
            Err(e) => e,
        };
        let msg = e.message().trim().to_owned();
        if let Some(f) = msg
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
        {
            if !removed.iter().any(|r| r == f) {
                issues.push(join(loc, f), format!("missing field `{f}`"));
            }
            return None;
        }
        match offending_key::<T>(&table).filter(|k| table.contains_key(k)) {
            Some(key) => {
                issues.push(join(loc, &key), sanitize(&msg));
                table.remove(&key);
                removed.push(key);
            }
            None => {
                issues.push(loc, sanitize(&msg));
                return None;
            }
        }
    }
}

/// The key whose value a type error is about: the element is written back as TOML
/// text and parsed again, which gives the error a span; the key is read from the line
/// at that span. The text (it may hold a secret) is never shown.
fn offending_key<T: DeserializeOwned>(element: &toml::Table) -> Option<String> {
    let text = toml::to_string(element).ok()?;
    let span = toml::from_str::<T>(&text).err()?.span()?;
    let line_start = text[..span.start.min(text.len())]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    (!key.is_empty() && !key.starts_with('[')).then(|| key.to_owned())
}

fn deserialize_lenient<T: DeserializeOwned>(value: &toml::Value) -> Option<T> {
    let known = field_names::<T>();
    let cleaned: toml::Table = value
        .as_table()?
        .iter()
        .filter(|(k, _)| known.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    toml::Value::Table(cleaned).try_into::<T>().ok()
}

fn check_unknown<T: DeserializeOwned>(table: &toml::Table, loc: &str, issues: &mut Issues) {
    let known = field_names::<T>();
    for key in table.keys() {
        if !known.contains(&key.as_str()) {
            issues.push(
                join(loc, key),
                format!(
                    "unknown field `{key}`; expected one of: {}",
                    known.join(", ")
                ),
            );
        }
    }
}

fn join(loc: &str, key: &str) -> String {
    if loc.is_empty() {
        key.to_owned()
    } else {
        format!("{loc}.{key}")
    }
}

/// A serde type error can quote the offending value; keep only its shape.
fn sanitize(msg: &str) -> String {
    match msg.find("invalid type: string \"") {
        Some(_) => {
            let expected = msg.rsplit("expected ").next().unwrap_or("another type");
            format!("invalid type: a string, expected {expected}")
        }
        None => msg.to_owned(),
    }
}

/// Where a TOML syntax error is: `line L, column C`.
pub(super) fn syntax_location(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {col}")
        }
        None => "file".to_owned(),
    }
}

/// The parser's message without the quoted source line (which may hold a secret).
pub(super) fn syntax_message(e: &toml::de::Error) -> String {
    format!("TOML syntax error: {}", e.message().trim())
}
