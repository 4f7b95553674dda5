//! Raw TOML → checked [`Config`], collecting every problem with its location.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use crate::resolve::PoolKey;
use keypool_core::{AccountId, AuthType, Provider, Strategy};
use serde::de::DeserializeOwned;

use super::env::apply_env_overrides;
use super::raw::{
    RawAccount, RawAdmin, RawConfig, RawGroup, RawKey, RawOrg, RawRating, RawServer, RawUrl,
    field_names,
};
use super::{
    Account, AdminSettings, Config, ConfigErrors, ConfigIssue, Group, KeyHash, KeyKind, KeyScope,
    LbKey, LegacyEntry, Org, RatingSettings, Secret, ServerSettings, StreamCommit, Threshold,
    UrlConfig, Weight, days_from_civil, secs_to_ms,
};

/// Route segments that are not free for org slugs or legacy `custom_url`s.
const RESERVED_SEGMENTS: &[&str] = &["admin", "healthz", "readyz", "metrics", "v1"];

struct Issues(Vec<ConfigIssue>);

impl Issues {
    fn push(&mut self, location: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigIssue {
            location: location.into(),
            message: message.into(),
        });
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
            issues.push(syntax_location(text, &e), syntax_message(&e));
            return Err(ConfigErrors(issues.0));
        }
    };

    let mut raw = RawConfig::default();
    check_unknown::<RawConfig>(&table, "", &mut issues);
    if let Some(v) = table.get("server") {
        if let Some(t) = v.as_table()
            && let Some(r) = t.get("rating")
        {
            check_element::<RawRating>(r, "server.rating", &mut issues);
        }
        let mut without_rating = v.clone();
        if let Some(t) = without_rating.as_table_mut() {
            t.remove("rating");
        }
        if let Some(mut s) = check_element::<RawServer>(&without_rating, "server", &mut issues) {
            s.rating = table["server"]
                .get("rating")
                .and_then(deserialize_lenient::<RawRating>)
                .unwrap_or_default();
            raw.server = s;
        }
    }
    let mut cooldown_settings = keypool_cooldown::CooldownSettings::default();
    if let Some(v) = table.get("cooldown") {
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
        if let Some(c) =
            check_element::<keypool_cooldown::CooldownSettings>(v, "cooldown", &mut issues)
        {
            cooldown_settings = c;
        }
    }
    if let Some(v) = table.get("admin")
        && let Some(a) = check_element::<RawAdmin>(v, "admin", &mut issues)
    {
        raw.admin = a;
    }
    let orgs = elements::<RawOrg>(&table, "orgs", &mut issues);
    let accounts = elements::<RawAccount>(&table, "accounts", &mut issues);
    let groups = elements::<RawGroup>(&table, "groups", &mut issues);
    let urls = elements::<RawUrl>(&table, "urls", &mut issues);
    let keys = elements::<RawKey>(&table, "keys", &mut issues);

    issues.0.extend(apply_env_overrides(&mut raw, env));

    let server = validate_server(&raw.server, base_dir, env, &mut issues);
    let admin = AdminSettings {
        token: raw.admin.token.as_deref().and_then(|t| {
            resolve_secret(t, raw.admin.token_from_env, "admin.token", env, &mut issues)
        }),
    };

    let mentioned = |section: &str, field: &str| -> HashSet<String> {
        table
            .get(section)
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|e| e.get(field).and_then(|v| v.as_str()).map(str::to_owned))
            .collect()
    };
    let mentioned_orgs = mentioned("orgs", "slug");
    let mentioned_accounts = mentioned("accounts", "id");
    let mentioned_groups = mentioned("groups", "id");
    // (org, custom_url) pairs of every [[urls]] element, parsed or not
    let mentioned_urls: HashSet<(String, String)> = table
        .get("urls")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let org = e.get("org")?.as_str()?.to_owned();
            Some((org, e.get("custom_url")?.as_str()?.to_owned()))
        })
        .collect();

    // orgs
    let mut org_builders: HashMap<Arc<str>, OrgBuilder> = HashMap::new();
    let mut org_first: HashMap<String, usize> = HashMap::new();
    for (i, o) in &orgs {
        let loc = format!("orgs[{i}].slug");
        if !check_segment(&o.slug, &loc, "org slug", &mut issues) {
            continue;
        }
        if let Some(j) = org_first.get(&o.slug) {
            issues.push(
                loc,
                format!(
                    "duplicate org slug `{}` (first at orgs[{j}]); slugs must be unique",
                    o.slug
                ),
            );
            continue;
        }
        org_first.insert(o.slug.clone(), *i);
        let slug: Arc<str> = Arc::from(o.slug.as_str());
        org_builders.insert(
            slug.clone(),
            OrgBuilder {
                slug,
                suspended: o.suspended,
                accounts: Vec::new(),
                groups: HashMap::new(),
                urls: HashMap::new(),
            },
        );
    }
    let org_ref = |builders: &HashMap<Arc<str>, OrgBuilder>,
                   org: &str,
                   loc: String,
                   issues: &mut Issues|
     -> Option<Arc<str>> {
        match builders.get_key_value(org) {
            Some((k, _)) => Some(k.clone()),
            None => {
                if !mentioned_orgs.contains(org) {
                    issues.push(
                        loc,
                        format!("no org with slug `{org}`; declare it in an [[orgs]] table"),
                    );
                }
                None
            }
        }
    };

    // accounts
    let mut accounts_out: HashMap<AccountId, Arc<Account>> = HashMap::new();
    let mut account_first: HashMap<String, usize> = HashMap::new();
    let mut account_orgs: HashMap<AccountId, (Arc<str>, usize)> = HashMap::new();
    let mut org_accounts: Vec<(Arc<str>, AccountId)> = Vec::new();
    for (i, a) in &accounts {
        let p = format!("accounts[{i}]");
        let mut ok = true;
        if a.id.trim().is_empty() {
            issues.push(
                format!("{p}.id"),
                "account id is empty; give every account a unique id",
            );
            ok = false;
        } else if let Some(j) = account_first.get(&a.id) {
            issues.push(format!("{p}.id"), format!("duplicate account id `{}` (first at accounts[{j}]); ids must be unique in the whole file", a.id));
            ok = false;
        } else {
            account_first.insert(a.id.clone(), *i);
        }
        let org = org_ref(&org_builders, &a.org, format!("{p}.org"), &mut issues);
        let provider = parse_named::<Provider>(&a.provider, &format!("{p}.provider"), &mut issues);
        let auth = parse_named::<AuthType>(&a.auth, &format!("{p}.auth"), &mut issues);
        if let (Some(pr), Some(au)) = (provider, auth) {
            let supported = match pr {
                Provider::Anthropic => matches!(au, AuthType::ApiKey | AuthType::OAuth),
                Provider::AnthropicCompatible => matches!(au, AuthType::ApiKey | AuthType::Bearer),
            };
            if !supported {
                issues.push(format!("{p}.auth"), format!("auth `{au}` is not supported by provider `{pr}` (anthropic: api_key, oauth; anthropic_compatible: api_key, bearer)"));
                ok = false;
            }
            if pr == Provider::AnthropicCompatible && a.base_url.is_none() {
                issues.push(format!("{p}.base_url"), "provider `anthropic_compatible` needs a base_url (where the third party serves the Messages API)");
                ok = false;
            }
        }
        let priority = i32::try_from(a.priority).ok();
        if priority.is_none() {
            issues.push(
                format!("{p}.priority"),
                format!(
                    "priority {} is out of range (a 32-bit integer; lower goes first)",
                    a.priority
                ),
            );
        }
        let secret = resolve_secret(&a.secret, false, &format!("{p}.secret"), env, &mut issues);
        if let Some(u) = &a.base_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            issues.push(
                format!("{p}.base_url"),
                "base_url must start with http:// or https://",
            );
            ok = false;
        }
        let weight = match a.weight {
            None => Weight::try_new(1),
            Some(w) => {
                let weight = Weight::try_new(w);
                if weight.is_none() {
                    issues.push(
                        format!("{p}.weight"),
                        format!("weight {w} is outside 1–100"),
                    );
                }
                weight
            }
        };
        let window_threshold = match a.window_threshold {
            None => Some(None),
            Some(t) => match Threshold::try_new(t) {
                Some(t) => Some(Some(t)),
                None => {
                    issues.push(
                        format!("{p}.window_threshold"),
                        format!("window_threshold {t} is outside 0–1 (a fraction, e.g. 0.95)"),
                    );
                    None
                }
            },
        };
        let max_concurrent = match a.max_concurrent {
            None => Some(None),
            Some(m) => match u32::try_from(m).ok().filter(|m| *m >= 1) {
                Some(m) => Some(Some(m)),
                None => {
                    issues.push(
                        format!("{p}.max_concurrent"),
                        format!("max_concurrent {m} must be at least 1 (omit it for no limit)"),
                    );
                    None
                }
            },
        };
        if let Some(m) = &a.model
            && m.trim().is_empty()
        {
            issues.push(
                format!("{p}.model"),
                "model is empty; omit it to keep the request's model",
            );
            ok = false;
        }
        if let (
            true,
            Some(priority),
            Some(org),
            Some(provider),
            Some(auth),
            Some(secret),
            Some(weight),
            Some(window_threshold),
            Some(max_concurrent),
        ) = (
            ok,
            priority,
            org,
            provider,
            auth,
            secret,
            weight,
            window_threshold,
            max_concurrent,
        ) {
            let id = AccountId::from(a.id.as_str());
            account_orgs.insert(id.clone(), (org.clone(), *i));
            org_accounts.push((org.clone(), id.clone()));
            accounts_out.insert(
                id.clone(),
                Arc::new(Account {
                    id,
                    org,
                    provider,
                    auth,
                    secret,
                    base_url: a.base_url.as_deref().map(Arc::from),
                    priority,
                    weight,
                    model: a.model.as_deref().map(Arc::from),
                    window_threshold,
                    max_concurrent,
                    active: a.active.unwrap_or(true),
                }),
            );
        }
    }
    for (org, id) in org_accounts {
        if let Some(b) = org_builders.get_mut(&org) {
            b.accounts.push(id);
        }
    }

    // groups
    for (i, g) in &groups {
        let p = format!("groups[{i}]");
        let mut ok = true;
        if !check_segment(&g.id, &format!("{p}.id"), "group id", &mut issues) {
            ok = false;
        }
        let org = org_ref(&org_builders, &g.org, format!("{p}.org"), &mut issues);
        let strategy = match &g.strategy {
            None => Some(Strategy::default()),
            Some(s) => parse_named::<Strategy>(s, &format!("{p}.strategy"), &mut issues),
        };
        if g.accounts.is_empty() {
            issues.push(
                format!("{p}.accounts"),
                "a group needs at least one account",
            );
            ok = false;
        }
        let mut seen = HashSet::new();
        let mut members = Vec::new();
        for (k, acc) in g.accounts.iter().enumerate() {
            let loc = format!("{p}.accounts[{k}]");
            if !seen.insert(acc.as_str()) {
                issues.push(loc, format!("account `{acc}` is listed twice"));
                ok = false;
                continue;
            }
            match account_orgs.get(acc.as_str()) {
                Some((acc_org, _)) => {
                    if let Some(org) = &org
                        && acc_org != org
                    {
                        issues.push(loc, format!("account `{acc}` belongs to org `{acc_org}`, not to the group's org `{org}`; pools are per organisation"));
                        ok = false;
                    }
                    members.push(AccountId::from(acc.as_str()));
                }
                None => {
                    ok = false;
                    if !mentioned_accounts.contains(acc) {
                        issues.push(loc, format!("no account with id `{acc}`"));
                    }
                }
            }
        }
        if let (true, Some(org), Some(strategy)) = (ok, org, strategy)
            && let Some(b) = org_builders.get_mut(&org)
        {
            if b.groups.contains_key(g.id.as_str()) {
                issues.push(
                    format!("{p}.id"),
                    format!("duplicate group id `{}` in org `{org}`", g.id),
                );
                continue;
            }
            let id: Arc<str> = Arc::from(g.id.as_str());
            b.groups.insert(
                id.clone(),
                Arc::new(Group {
                    id,
                    org,
                    strategy,
                    accounts: members,
                }),
            );
        }
    }

    // urls
    let mut orphan_urls: HashMap<String, usize> = HashMap::new();
    for (i, u) in &urls {
        let p = format!("urls[{i}]");
        if !check_segment(
            &u.custom_url,
            &format!("{p}.custom_url"),
            "custom_url",
            &mut issues,
        ) {
            continue;
        }
        match &u.org {
            None => {
                if u.group.is_some() {
                    issues.push(format!("{p}.group"), "a URL config without org cannot name a group: groups belong to an org; add `org` or remove `group`");
                }
                if let Some(j) = orphan_urls.get(&u.custom_url) {
                    issues.push(
                        format!("{p}.custom_url"),
                        format!(
                            "duplicate org-less custom_url `{}` (first at urls[{j}])",
                            u.custom_url
                        ),
                    );
                } else {
                    orphan_urls.insert(u.custom_url.clone(), *i);
                }
            }
            Some(o) => {
                let Some(org) = org_ref(&org_builders, o, format!("{p}.org"), &mut issues) else {
                    continue;
                };
                let Some(b) = org_builders.get_mut(&org) else {
                    continue;
                };
                if let Some(g) = &u.group
                    && !b.groups.contains_key(g.as_str())
                {
                    if !mentioned_groups.contains(g) {
                        issues.push(
                            format!("{p}.group"),
                            format!("no group `{g}` in org `{org}`"),
                        );
                    }
                    continue;
                }
                if b.urls.contains_key(u.custom_url.as_str()) {
                    issues.push(
                        format!("{p}.custom_url"),
                        format!("duplicate custom_url `{}` in org `{org}`", u.custom_url),
                    );
                    continue;
                }
                let custom_url: Arc<str> = Arc::from(u.custom_url.as_str());
                b.urls.insert(
                    custom_url.clone(),
                    Arc::new(UrlConfig {
                        custom_url,
                        pool: PoolKey::new(&org, u.group.as_deref()),
                        org,
                        group: u.group.as_deref().map(Arc::from),
                    }),
                );
            }
        }
    }

    // keys
    let mut keys_by_hash: HashMap<KeyHash, Arc<LbKey>> = HashMap::new();
    let mut key_first: HashMap<String, usize> = HashMap::new();
    let mut hash_first: HashMap<KeyHash, usize> = HashMap::new();
    for (i, k) in &keys {
        let p = format!("keys[{i}]");
        let mut ok = true;
        if k.id.trim().is_empty() {
            issues.push(format!("{p}.id"), "key id is empty");
            ok = false;
        } else if let Some(j) = key_first.get(&k.id) {
            issues.push(
                format!("{p}.id"),
                format!("duplicate key id `{}` (first at keys[{j}])", k.id),
            );
            ok = false;
        } else {
            key_first.insert(k.id.clone(), *i);
        }
        let org = org_ref(&org_builders, &k.org, format!("{p}.org"), &mut issues);
        let kind = match k.kind.as_str() {
            "user" => Some(KeyKind::User),
            "client" => Some(KeyKind::Client),
            other => {
                issues.push(
                    format!("{p}.kind"),
                    format!("unknown key kind {other:?}: expected `user` or `client`"),
                );
                None
            }
        };
        let hash = match KeyHash::from_hex(&k.sha256) {
            Some(h) => {
                if let Some(j) = hash_first.get(&h) {
                    issues.push(
                        format!("{p}.sha256"),
                        format!(
                            "same hash as keys[{j}]; every key needs its own (run `keypool keygen`)"
                        ),
                    );
                    ok = false;
                } else {
                    hash_first.insert(h, *i);
                }
                Some(h)
            }
            None => {
                let hint = if k.sha256.starts_with("sk-lb-") {
                    "this looks like a key, not its hash: put only the SHA-256 here (run `keypool keygen`)".to_owned()
                } else {
                    format!(
                        "sha256 must be 64 hex characters (got {} characters)",
                        k.sha256.chars().count()
                    )
                };
                issues.push(format!("{p}.sha256"), hint);
                None
            }
        };
        let scope = if k.urls.is_empty() {
            issues.push(format!("{p}.urls"), "urls is empty: list the custom_urls this key may use, or [\"*\"] for all of its org");
            None
        } else if k.urls.iter().any(|u| u == "*") {
            if k.urls.len() > 1 {
                issues.push(
                    format!("{p}.urls"),
                    "\"*\" already means every URL of the org; use it alone",
                );
                None
            } else {
                Some(KeyScope::AllUrls)
            }
        } else {
            let mut list = Vec::new();
            let mut all_ok = true;
            for (n, u) in k.urls.iter().enumerate() {
                let found = org
                    .as_ref()
                    .and_then(|o| org_builders.get(o))
                    .and_then(|b| b.urls.get_key_value(u.as_str()).map(|(k, _)| k.clone()));
                match found {
                    Some(url) => list.push(url),
                    None => {
                        all_ok = false;
                        if org.is_some() && !mentioned_urls.contains(&(k.org.clone(), u.clone())) {
                            issues.push(
                                format!("{p}.urls[{n}]"),
                                format!("no URL config `{u}` in org `{}`", k.org),
                            );
                        }
                    }
                }
            }
            all_ok.then_some(KeyScope::Urls(list))
        };
        if let (true, Some(org), Some(kind), Some(hash), Some(scope)) = (ok, org, kind, hash, scope)
        {
            keys_by_hash.insert(
                hash,
                Arc::new(LbKey {
                    id: Arc::from(k.id.as_str()),
                    org,
                    kind,
                    hash,
                    scope,
                    revoked: k.revoked,
                }),
            );
        }
    }

    let Some(server) = server else {
        return Err(ConfigErrors(issues.0));
    };
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

    let mut legacy: HashMap<Arc<str>, LegacyEntry> = HashMap::new();
    for b in org_builders.values() {
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

    Ok(Config {
        server,
        cooldown,
        admin,
        orgs: org_builders
            .into_iter()
            .map(|(k, b)| {
                (
                    k,
                    Arc::new(Org {
                        slug: b.slug,
                        suspended: b.suspended,
                        accounts: b.accounts,
                        groups: b.groups,
                        urls: b.urls,
                    }),
                )
            })
            .collect(),
        accounts: accounts_out,
        keys_by_hash,
        legacy,
    })
}

struct OrgBuilder {
    slug: Arc<str>,
    suspended: bool,
    accounts: Vec<AccountId>,
    groups: HashMap<Arc<str>, Arc<Group>>,
    urls: HashMap<Arc<str>, Arc<UrlConfig>>,
}

fn validate_server(
    s: &RawServer,
    base_dir: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> Option<ServerSettings> {
    let d = ServerSettings::default();
    let before = issues.0.len();
    let pos = |v: Option<i64>, name: &str, default: u64, scale: u64, issues: &mut Issues| -> u64 {
        match v {
            None => default,
            Some(n) if n > 0 => u64::try_from(n).unwrap_or(u64::MAX).saturating_mul(scale),
            Some(n) => {
                issues.push(
                    format!("server.{name}"),
                    format!("{name} must be a positive whole number (got {n})"),
                );
                default
            }
        }
    };
    let listen = match &s.listen {
        None => d.listen,
        Some(l) => SocketAddr::from_str(l).unwrap_or_else(|_| {
            issues.push("server.listen", format!("{l:?} is not a socket address; write host:port, e.g. 127.0.0.1:8080 or [::]:8080"));
            d.listen
        }),
    };
    let stream_commit = s
        .stream_commit
        .as_deref()
        .and_then(|v| parse_named::<StreamCommit>(v, "server.stream_commit", issues))
        .unwrap_or(d.stream_commit);
    let passthrough_statuses = match &s.passthrough_statuses {
        None => d.passthrough_statuses.clone(),
        Some(list) => list
            .iter()
            .enumerate()
            .filter_map(|(k, st)| {
                match u16::try_from(*st).ok().filter(|c| (400..=599).contains(c)) {
                    Some(c) => Some(c),
                    None => {
                        issues.push(
                            format!("server.passthrough_statuses[{k}]"),
                            format!("{st} is not an HTTP error status (400–599)"),
                        );
                        None
                    }
                }
            })
            .collect(),
    };
    let legacy_routes_until_unix_secs = match &s.legacy_routes_until {
        None => d.legacy_routes_until_unix_secs,
        Some(v) => parse_date_end(v).unwrap_or_else(|| {
            issues.push(
                "server.legacy_routes_until",
                "expected a date like 2026-12-31 (the last day legacy routes work, UTC)",
            );
            d.legacy_routes_until_unix_secs
        }),
    };
    let fraction = |v: Option<f64>, name: &str, default: f64, issues: &mut Issues| -> f64 {
        match v {
            None => default,
            Some(x) if (0.0..=1.0).contains(&x) => x,
            Some(x) => {
                issues.push(
                    format!("server.{name}"),
                    format!("{name} {x} is outside 0–1"),
                );
                default
            }
        }
    };
    let hedge_budget = fraction(s.hedge_budget, "hedge_budget", d.hedge_budget, issues);
    let default_window_threshold = Threshold(fraction(
        s.default_window_threshold,
        "default_window_threshold",
        d.default_window_threshold.get(),
        issues,
    ));
    let state_file = match s.state_file.as_deref() {
        // the default file sits next to the config file; a config given as text (tests,
        // embedders) has no folder and so no default state file
        None => base_dir
            .and(d.state_file.clone())
            .map(|f| anchor(f, base_dir)),
        Some("") => None,
        Some(f) => Some(anchor(PathBuf::from(f), base_dir)),
    };
    let redis_url = s.redis_url.as_deref().and_then(|u| {
        let secret = resolve_secret(u, s.redis_url_from_env, "server.redis_url", env, issues)?;
        match crate::state::redis::redis_target(secret.expose()) {
            Ok(_) => Some(secret),
            Err(problem) => {
                issues.push("server.redis_url", problem);
                None
            }
        }
    });
    let weight = |v: Option<f64>, name: &str, default: f64, issues: &mut Issues| -> f64 {
        match v {
            None => default,
            Some(x) if x.is_finite() && x >= 0.0 => x,
            Some(x) => {
                issues.push(
                    format!("server.rating.{name}"),
                    format!("{name} {x} must be a finite number ≥ 0"),
                );
                default
            }
        }
    };
    let dr = RatingSettings::default();
    let rating = RatingSettings {
        ttft_weight: weight(s.rating.ttft_weight, "ttft_weight", dr.ttft_weight, issues),
        total_weight: weight(
            s.rating.total_weight,
            "total_weight",
            dr.total_weight,
            issues,
        ),
        error_weight: weight(
            s.rating.error_weight,
            "error_weight",
            dr.error_weight,
            issues,
        ),
        max_sample_age_ms: pos(
            s.rating.max_sample_age_secs,
            "rating.max_sample_age_secs",
            dr.max_sample_age_ms,
            1000,
            issues,
        ),
    };
    let commit_hold_max_frames = pos(
        s.commit_hold_max_frames,
        "commit_hold_max_frames",
        u64::from(d.commit_hold_max_frames),
        1,
        issues,
    );
    let settings = ServerSettings {
        listen,
        max_body_bytes: pos(
            s.max_body_bytes,
            "max_body_bytes",
            d.max_body_bytes,
            1,
            issues,
        ),
        header_read_timeout_ms: pos(
            s.header_read_timeout_secs,
            "header_read_timeout_secs",
            d.header_read_timeout_ms,
            1000,
            issues,
        ),
        upstream_timeout_ms: pos(
            s.upstream_timeout_secs,
            "upstream_timeout_secs",
            d.upstream_timeout_ms,
            1000,
            issues,
        ),
        first_frame_timeout_ms: pos(
            s.first_frame_timeout_ms,
            "first_frame_timeout_ms",
            d.first_frame_timeout_ms,
            1,
            issues,
        ),
        stream_idle_timeout_ms: pos(
            s.stream_idle_timeout_secs,
            "stream_idle_timeout_secs",
            d.stream_idle_timeout_ms,
            1000,
            issues,
        ),
        stream_commit,
        commit_hold_max_frames: u32::try_from(commit_hold_max_frames).unwrap_or(u32::MAX),
        commit_hold_max_bytes: pos(
            s.commit_hold_max_bytes,
            "commit_hold_max_bytes",
            d.commit_hold_max_bytes,
            1,
            issues,
        ),
        max_frame_bytes: pos(
            s.max_frame_bytes,
            "max_frame_bytes",
            d.max_frame_bytes,
            1,
            issues,
        ),
        passthrough_statuses,
        auto_disable_on_error: s.auto_disable_on_error.unwrap_or(d.auto_disable_on_error),
        legacy_routes_until_unix_secs,
        snapshot_ttl_ms: match s.snapshot_ttl_secs {
            None => d.snapshot_ttl_ms,
            Some(n) if n >= 0 => secs_to_ms(u64::try_from(n).unwrap_or(0)),
            Some(n) => {
                issues.push("server.snapshot_ttl_secs", format!("snapshot_ttl_secs must be ≥ 0 (got {n}); 0 rebuilds the snapshot on every request"));
                d.snapshot_ttl_ms
            }
        },
        state_file,
        state_snapshot_interval_ms: pos(
            s.state_snapshot_interval_secs,
            "state_snapshot_interval_secs",
            d.state_snapshot_interval_ms,
            1000,
            issues,
        ),
        redis_url,
        redis_timeout_ms: pos(
            s.redis_timeout_ms,
            "redis_timeout_ms",
            d.redis_timeout_ms,
            1,
            issues,
        ),
        hedge_min_delay_ms: match s.hedge_min_delay_ms {
            None => d.hedge_min_delay_ms,
            Some(n) if n >= 0 => u64::try_from(n).unwrap_or(0),
            Some(n) => {
                issues.push(
                    "server.hedge_min_delay_ms",
                    format!("hedge_min_delay_ms must be ≥ 0 (got {n})"),
                );
                d.hedge_min_delay_ms
            }
        },
        hedge_budget,
        default_window_threshold,
        circuit_breaker: s.circuit_breaker.unwrap_or(d.circuit_breaker),
        shutdown_grace_ms: pos(
            s.shutdown_grace_secs,
            "shutdown_grace_secs",
            d.shutdown_grace_ms,
            1000,
            issues,
        ),
        session_affinity_ttl_ms: non_negative(
            s.session_affinity_ttl_secs,
            "session_affinity_ttl_secs",
            d.session_affinity_ttl_ms,
            1000,
            "0 turns session affinity off",
            issues,
        ),
        queue_max_wait_ms: non_negative(
            s.queue_max_wait_ms,
            "queue_max_wait_ms",
            d.queue_max_wait_ms,
            1,
            "0 answers 429 at once when every account is at its max_concurrent",
            issues,
        ),
        queue_max_depth: u32::try_from(non_negative(
            s.queue_max_depth,
            "queue_max_depth",
            u64::from(d.queue_max_depth),
            1,
            "0 means unbounded",
            issues,
        ))
        .unwrap_or(u32::MAX),
        workers: match s.workers {
            None => d.workers,
            Some(n @ 0..=MAX_WORKERS) => u32::try_from(n).unwrap_or(0),
            Some(n) => {
                issues.push(
                    "server.workers",
                    format!(
                        "workers must be between 0 and {MAX_WORKERS} (got {n}); 0 starts one per CPU"
                    ),
                );
                d.workers
            }
        },
        rating,
    };
    (issues.0.len() == before).then_some(settings)
}

/// The most serving threads `[server] workers` accepts.
const MAX_WORKERS: i64 = 1024;

/// A `[server]` integer that may be 0: `None` → `default`, else `value × scale`; a
/// negative value is an issue (`zero` says what 0 means).
fn non_negative(
    value: Option<i64>,
    name: &str,
    default: u64,
    scale: u64,
    zero: &str,
    issues: &mut Issues,
) -> u64 {
    match value {
        None => default,
        Some(n) if n >= 0 => u64::try_from(n).unwrap_or(0).saturating_mul(scale),
        Some(n) => {
            issues.push(
                format!("server.{name}"),
                format!("{name} must be ≥ 0 (got {n}); {zero}"),
            );
            default
        }
    }
}

fn anchor(path: PathBuf, base_dir: Option<&Path>) -> PathBuf {
    match base_dir {
        Some(dir) if path.is_relative() && !dir.as_os_str().is_empty() => dir.join(path),
        _ => path,
    }
}

/// `2026-12-31` (TOML date or string) → unix seconds of `2026-12-31T23:59:59Z`.
fn parse_date_end(v: &toml::Value) -> Option<u64> {
    let text = match v {
        toml::Value::Datetime(d) if d.time.is_none() && d.offset.is_none() => d.to_string(),
        toml::Value::String(s) => s.clone(),
        _ => return None,
    };
    let mut parts = text.splitn(3, '-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: u32 = parts.next()?.parse().ok()?;
    let d: u32 = parts.next()?.parse().ok()?;
    let days_in_month = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => return None,
    };
    if !(1970..=9999).contains(&y) || d == 0 || d > days_in_month {
        return None;
    }
    u64::try_from(days_from_civil(y, m, d) * 86_400 + 86_399).ok()
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
fn resolve_secret(
    value: &str,
    literal: bool,
    loc: &str,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> Option<Secret> {
    if !literal && let Some(name) = value.strip_prefix('$') {
        let valid = !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !name.as_bytes()[0].is_ascii_digit();
        if !valid {
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
    if value.is_empty() {
        issues.push(loc, "secret is empty");
        return None;
    }
    Some(Secret::new(value))
}

/// The elements of `[[section]]`, each deserialised on its own.
fn elements<T: DeserializeOwned>(
    table: &toml::Table,
    section: &str,
    issues: &mut Issues,
) -> Vec<(usize, T)> {
    match table.get(section) {
        None => Vec::new(),
        Some(toml::Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                check_element::<T>(v, &format!("{section}[{i}]"), issues).map(|t| (i, t))
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

fn syntax_location(text: &str, e: &toml::de::Error) -> String {
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
fn syntax_message(e: &toml::de::Error) -> String {
    format!("TOML syntax error: {}", e.message().trim())
}
