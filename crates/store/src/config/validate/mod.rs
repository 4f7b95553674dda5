//! Raw TOML → checked [`Config`], collecting every problem with its location.
//!
//! One module per section, each a function from the raw section and the shared
//! [`Context`] to validated values, pushing located problems into one [`Issues`]
//! collector; the order of the problems is the order of the sections, then of the
//! elements, then of their fields (pinned by `tests/golden/every_error.txt`).
//!
//! # Layout
//! - `elements`: the document read into raw sections, element by element (unknown and
//!   mistyped keys, syntax errors).
//! - `server`: `[server]` and `[server.rating]`.
//! - `orgs`, `accounts`, `groups`, `urls`, `keys`: the array sections.
//! - `prices`: `[[prices]]` and `[usage]`.
//! - `restate`: `[[restate]]` (SPEC 16).
//! - `models`: `[[models]]` aliases and fallback chains (issue 24).
//! - `alerts`: `[alerts]` and `[[alerts.webhooks]]`.
//! - `limits`: `[keys.limits]` and `[orgs.limits]`, and a key's merged over its org's.
//! - here: the orchestration, the shared [`Context`], and the value checks more than
//!   one section uses (route segments, names, secrets).

mod accounts;
mod alerts;
mod elements;
mod groups;
mod keys;
mod limits;
mod models;
mod oauth;
mod orgs;
mod prices;
mod restate;
mod server;
mod urls;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use keypool_core::{AccountId, Provider};

use super::env::apply_env_overrides;
use super::{Account, AdminSettings, Config, ConfigErrors, ConfigIssue, LegacyEntry, Org, Secret};
use orgs::OrgBuilder;

/// Route segments that are not free for org slugs or legacy `custom_url`s.
const RESERVED_SEGMENTS: &[&str] = &["admin", "healthz", "readyz", "metrics", "v1"];

/// Every problem found, in order, each with its location.
struct Issues(Vec<ConfigIssue>);

impl Issues {
    fn push(&mut self, location: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigIssue {
            location: location.into(),
            message: message.into(),
        });
    }
}

/// What the array sections share while they are validated: the environment, the
/// names the document mentions (so that a reference to an element that failed its own
/// validation is not reported a second time), the orgs being built, and which org each
/// valid account belongs to.
struct Context<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
    mentioned: Mentioned,
    orgs: HashMap<Arc<str>, OrgBuilder>,
    /// Valid accounts: their org and index in `[[accounts]]`.
    account_orgs: HashMap<AccountId, (Arc<str>, usize)>,
}

impl Context<'_> {
    /// The org `org` refers to, if it is valid; a problem at `loc` when the document
    /// declares no such org at all.
    fn org_ref(&self, org: &str, loc: String, issues: &mut Issues) -> Option<Arc<str>> {
        match self.orgs.get_key_value(org) {
            Some((k, _)) => Some(k.clone()),
            None => {
                if !self.mentioned.orgs.contains(org) {
                    issues.push(
                        loc,
                        format!("no org with slug `{org}`; declare it in an [[orgs]] table"),
                    );
                }
                None
            }
        }
    }
}

/// The names every element of the document mentions, parsed or not.
struct Mentioned {
    orgs: HashSet<String>,
    accounts: HashSet<String>,
    groups: HashSet<String>,
    /// `(org, custom_url)` of every `[[urls]]` element.
    urls: HashSet<(String, String)>,
}

impl Mentioned {
    fn of(table: &toml::Table) -> Self {
        let elements = |section: &str| {
            table
                .get(section)
                .and_then(|v| v.as_array())
                .into_iter()
                .flatten()
        };
        let names = |section: &str, field: &str| -> HashSet<String> {
            elements(section)
                .filter_map(|e| e.get(field).and_then(|v| v.as_str()).map(str::to_owned))
                .collect()
        };
        Self {
            orgs: names("orgs", "slug"),
            accounts: names("accounts", "id"),
            groups: names("groups", "id"),
            urls: elements("urls")
                .filter_map(|e| {
                    let org = e.get("org")?.as_str()?.to_owned();
                    Some((org, e.get("custom_url")?.as_str()?.to_owned()))
                })
                .collect(),
        }
    }
}

pub(super) fn parse_and_validate(
    text: &str,
    base_dir: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    let mut issues = Issues(Vec::new());
    let table = match text.parse::<toml::Table>() {
        Ok(t) => t,
        Err(e) => {
            issues.push(
                elements::syntax_location(text, &e),
                elements::syntax_message(&e),
            );
            return Err(ConfigErrors(issues.0));
        }
    };
    let mut sections = elements::read_sections(&table, &mut issues);
    issues.0.extend(apply_env_overrides(&mut sections.raw, env));
    let raw = &sections.raw;
    let server = server::validate_server(&raw.server, base_dir, env, &mut issues);
    let admin = AdminSettings {
        token: raw.admin.token.as_deref().and_then(|t| {
            resolve_secret(t, raw.admin.token_from_env, "admin.token", env, &mut issues)
        }),
    };
    let mut ctx = Context {
        env,
        mentioned: Mentioned::of(&table),
        orgs: HashMap::new(),
        account_orgs: HashMap::new(),
    };
    orgs::validate(&sections.orgs, &mut ctx, &mut issues);
    let accounts = accounts::validate(&sections.accounts, &mut ctx, &mut issues);
    let mut warnings = accounts::secret_warnings(&sections.accounts, &accounts);
    warnings.extend(accounts::unsealed_token_warnings(
        &sections.accounts,
        &accounts,
        env,
    ));
    groups::validate(&sections.groups, &mut ctx, &mut issues);
    let orphan_urls = urls::validate(&sections.urls, &mut ctx, &mut issues);
    let keys_by_hash = keys::validate(&sections.keys, &ctx, &mut issues);
    let usage = prices::validate_usage(&sections.usage, &mut issues);
    let oauth = oauth::validate(&sections.oauth, &mut issues);
    let price_table = prices::validate_prices(&sections.prices, &usage, &mut issues);
    let alerts = alerts::validate(&sections.alerts, env, &mut issues);
    let restate = restate::validate(&sections.restate, &mut issues);
    let account_models: Vec<&str> = accounts.values().filter_map(|a| a.model()).collect();
    let model_routes =
        models::validate(&sections.models, &price_table, &account_models, &mut issues);

    let Some(server) = server else {
        return Err(ConfigErrors(issues.0));
    };
    let mut cooldown_settings = sections.cooldown;
    cooldown_settings.auto_disable_on_error = server.auto_disable_on_error;
    cooldown_settings.window_threshold = server.default_window_threshold.get();
    cooldown_settings.breaker.enabled = server.circuit_breaker;
    let cooldown = match keypool_cooldown::CooldownConfig::try_new(cooldown_settings) {
        Ok(c) => Some(c),
        Err(e) => {
            issues.push("cooldown", e.to_string());
            None
        }
    };
    if let Err(e) = server.rating.to_rating_config().validate() {
        issues.push("server.rating", e.to_string());
    }
    let Some(cooldown) = cooldown else {
        return Err(ConfigErrors(issues.0));
    };
    if !issues.0.is_empty() {
        return Err(ConfigErrors(issues.0));
    }
    let legacy = legacy_routes(&ctx.orgs, &orphan_urls);
    Ok(Config {
        server,
        cooldown,
        admin,
        orgs: ctx
            .orgs
            .into_iter()
            .map(|(k, b)| (k, Arc::new(b.into_org(&accounts))))
            .collect(),
        accounts: accounts.into_iter().collect(),
        keys_by_hash: keys_by_hash.into_iter().collect(),
        legacy: legacy.into_iter().collect(),
        prices: price_table,
        warnings,
        usage,
        oauth,
        alerts,
        restate,
        model_routes,
    })
}

/// The legacy route table: each `custom_url` → its one org, `Ambiguous` when several
/// orgs have it, `Orphan` for a URL config without org.
fn legacy_routes(
    orgs: &HashMap<Arc<str>, OrgBuilder>,
    orphan_urls: &HashMap<String, usize>,
) -> HashMap<Arc<str>, LegacyEntry> {
    let mut legacy: HashMap<Arc<str>, LegacyEntry> = HashMap::new();
    for b in orgs.values() {
        for url in b.urls.keys() {
            legacy
                .entry(url.clone())
                .and_modify(|e| *e = LegacyEntry::Ambiguous)
                .or_insert_with(|| LegacyEntry::One(b.slug.clone()));
        }
    }
    for url in orphan_urls.keys() {
        legacy
            .entry(Arc::from(url.as_str()))
            .and_modify(|e| *e = LegacyEntry::Ambiguous)
            .or_insert(LegacyEntry::Orphan);
    }
    legacy
}

/// `anthropic: api_key, oauth; anthropic_compatible: api_key, bearer`, from
/// [`Provider::auth_types`].
fn supported_auth_types() -> String {
    Provider::ALL
        .iter()
        .map(|p| {
            let auths: Vec<&str> = p.auth_types().iter().map(|a| a.as_str()).collect();
            format!("{p}: {}", auths.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A path segment usable in a route: `[A-Za-z0-9._~-]+`, not reserved.
fn check_segment(value: &str, loc: &str, what: &str, issues: &mut Issues) -> bool {
    if value.is_empty() {
        issues.push(loc, format!("{what} is empty"));
        return false;
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._~-".contains(&b))
    {
        issues.push(loc, format!("{what} {value:?} may only use letters, digits, `.`, `_`, `~` and `-` (it is a URL path segment)"));
        return false;
    }
    if RESERVED_SEGMENTS.contains(&value) {
        issues.push(
            loc,
            format!("{what} {value:?} is reserved for keypool's own routes; pick another name"),
        );
        return false;
    }
    true
}

fn parse_named<T: FromStr>(value: &str, loc: &str, issues: &mut Issues) -> Option<T>
where
    T::Err: std::fmt::Display,
{
    value
        .parse::<T>()
        .map_err(|e| issues.push(loc, e.to_string()))
        .ok()
}

/// `$ENV_NAME` → the variable's value; anything else is the secret itself. Messages name
/// the variable, never a value.
/// Whether `name` (after the `$`) is an environment variable name keypool reads:
/// letters, digits and `_`, not starting with a digit.
fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
}

fn resolve_secret(
    value: &str,
    literal: bool,
    loc: &str,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> Option<Secret> {
    if !literal && let Some(name) = value.strip_prefix('$') {
        if !is_env_name(name) {
            issues.push(
                loc,
                "a secret starting with `$` must be `$ENV_NAME` (letters, digits, `_`)",
            );
            return None;
        }
        return match env(name) {
            Some(v) if !v.is_empty() => Some(Secret::new(v)),
            Some(_) => {
                issues.push(loc, format!("environment variable `{name}` is empty"));
                None
            }
            None => {
                issues.push(loc, format!("environment variable `{name}` is not set; export it or write the secret in the file"));
                None
            }
        };
    }
    if !literal && let Some(path) = value.strip_prefix("file:") {
        return read_secret_file(path, loc, issues);
    }
    if !literal && super::sealed::is_sealed(value) {
        let key = env(super::sealed::SECRETS_KEY_ENV);
        return match super::sealed::open(key.as_deref(), value) {
            Ok(secret) if !secret.is_empty() => Some(Secret::new(secret)),
            Ok(_) => {
                issues.push(loc, "secret is empty");
                None
            }
            Err(e) => {
                issues.push(loc, e.to_string());
                None
            }
        };
    }
    if value.is_empty() {
        issues.push(loc, "secret is empty");
        return None;
    }
    Some(Secret::new(value))
}

/// `file:/path`: the file's text, read at every load (a mounted secret that rotates is
/// picked up by the next reload), without one final line break. Messages name the
/// path, never what it holds.
fn read_secret_file(path: &str, loc: &str, issues: &mut Issues) -> Option<Secret> {
    if path.is_empty() {
        issues.push(
            loc,
            "file: needs a path, e.g. file:/run/secrets/anthropic-1",
        );
        return None;
    }
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let text = text
                .strip_suffix("\r\n")
                .or_else(|| text.strip_suffix('\n'))
                .unwrap_or(&text);
            if text.is_empty() {
                issues.push(loc, format!("the secret file {path} is empty"));
                return None;
            }
            Some(Secret::new(text))
        }
        Err(e) => {
            issues.push(
                loc,
                format!("cannot read the secret file {path}: {e}; mount it or fix the path"),
            );
            None
        }
    }
}

impl OrgBuilder {
    fn into_org(self, accounts: &HashMap<AccountId, Arc<Account>>) -> Org {
        let mut override_models: Vec<Arc<str>> = self
            .accounts
            .iter()
            .filter_map(|id| accounts.get(id)?.model_shared().cloned())
            .collect();
        override_models.sort();
        override_models.dedup();
        Org {
            override_models,
            slug: self.slug,
            suspended: self.suspended,
            team_usd_per_month: self.limits.as_ref().and_then(|l| l.usd_per_month),
            accounts: self.accounts,
            groups: self.groups.into_iter().collect(),
            urls: self.urls.into_iter().collect(),
        }
    }
}
