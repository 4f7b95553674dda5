//! `[[accounts]]`: each raw account converted on its own ([`validate_account`]), every
//! field checked before any is required, so that all of an account's problems are
//! reported at once.

use std::collections::HashMap;
use std::sync::Arc;

use keypool_core::{AccountId, AuthType, Provider};

use super::{Context, Issues, is_env_name, parse_named, resolve_secret, supported_auth_types};
use crate::config::raw::RawAccount;
use crate::config::{Account, Secret, Threshold, Weight};

/// Validates the accounts; the valid ones are returned by id and recorded in their
/// orgs (in file order) and in `ctx.account_orgs`.
pub(super) fn validate(
    accounts: &[(usize, RawAccount)],
    ctx: &mut Context<'_>,
    issues: &mut Issues,
) -> HashMap<AccountId, Arc<Account>> {
    let mut out: HashMap<AccountId, Arc<Account>> = HashMap::new();
    let mut first: HashMap<String, usize> = HashMap::new();
    let mut in_order: Vec<(Arc<str>, AccountId)> = Vec::new();
    for (i, raw) in accounts {
        let Some(account) = validate_account(*i, raw, &mut first, ctx, issues) else {
            continue;
        };
        let id = account.id.clone();
        ctx.account_orgs
            .insert(id.clone(), (account.org.clone(), *i));
        in_order.push((account.org.clone(), id.clone()));
        out.insert(id, Arc::new(account));
    }
    for (org, id) in in_order {
        if let Some(b) = ctx.orgs.get_mut(&org) {
            b.accounts.push(id);
        }
    }
    out
}

/// Secrets that load but cannot work (SPEC 13, `check-config`): whitespace or a line
/// break around them, an OAuth token (`sk-ant-oat…`) on an `api_key` account or an
/// API key (`sk-ant-api…`) on an `oauth` one, a placeholder (`…`, `...`, `xxxx`,
/// `changeme`, `<…>`). Located at `accounts[i].secret`; never quoting the secret.
/// OAuth accounts that renew themselves while `KEYPOOL_SECRETS_KEY` is unset: their
/// rotated tokens would be kept unencrypted (in the owner-only state file, and in
/// Redis).
pub(super) fn unsealed_token_warnings(
    raw: &[(usize, RawAccount)],
    accounts: &HashMap<AccountId, Arc<Account>>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<crate::config::ConfigIssue> {
    if env(crate::config::sealed::SECRETS_KEY_ENV).is_some() {
        return Vec::new();
    }
    raw.iter()
        .filter(|(_, r)| accounts.get(r.id.as_str()).is_some_and(|a| a.oauth.is_some()))
        .map(|(i, _)| crate::config::ConfigIssue {
            location: format!("accounts[{i}].refresh_token"),
            message: format!(
                "{} is not set: the tokens this account rotates are kept unencrypted (the state file is owner-only; Redis is not); set it to seal them",
                crate::config::sealed::SECRETS_KEY_ENV
            ),
        })
        .collect()
}

pub(super) fn secret_warnings(
    raw: &[(usize, RawAccount)],
    accounts: &HashMap<AccountId, Arc<Account>>,
) -> Vec<crate::config::ConfigIssue> {
    let mut out = Vec::new();
    for (i, r) in raw {
        let Some(account) = accounts.get(r.id.as_str()) else {
            continue;
        };
        let secret = account.secret.expose();
        if secret.is_empty() {
            continue;
        }
        let mut warn = |message: &str| {
            out.push(crate::config::ConfigIssue {
                location: format!("accounts[{i}].secret"),
                message: message.to_owned(),
            });
        };
        if secret.trim() != secret {
            warn(
                "the secret begins or ends with whitespace or a line break: the upstream will refuse it; remove them",
            );
        }
        let lower = secret.to_ascii_lowercase();
        let placeholder = ["…", "...", "xxxx", "changeme", "your-key", "your_key", "<"];
        if placeholder.iter().any(|p| lower.contains(p)) {
            warn(
                "the secret looks like a placeholder (…, xxxx, changeme, <…>): put the real credential here",
            );
        }
        match account.auth {
            AuthType::ApiKey if secret.starts_with("sk-ant-oat") => warn(
                "an OAuth access token (sk-ant-oat…) on an api_key account: set auth = \"oauth\", or use an API key (sk-ant-api…)",
            ),
            AuthType::OAuth if secret.starts_with("sk-ant-api") => warn(
                "an API key (sk-ant-api…) on an oauth account: set auth = \"api_key\", or use the subscription's OAuth token",
            ),
            _ => {}
        }
    }
    out
}

/// One `[[accounts]]` element (`accounts[i]`) → an [`Account`], or `None` with every
/// problem it has in `issues`. `first` holds the ids seen so far.
fn validate_account(
    i: usize,
    a: &RawAccount,
    first: &mut HashMap<String, usize>,
    ctx: &Context<'_>,
    issues: &mut Issues,
) -> Option<Account> {
    let p = format!("accounts[{i}]");
    let mut ok = unique_id(i, a, first, &p, issues);
    let org = ctx.org_ref(&a.org, format!("{p}.org"), issues);
    let (provider, auth) = provider_and_auth(a, &p, &mut ok, issues);
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
    // An account that can never serve (`active = false`, or of a suspended org) may
    // name an unset `$ENV_NAME`: its secret is never sent, and making it active again
    // (a reload) checks the variable like any other.
    let dormant =
        a.active == Some(false) || ctx.orgs.get(a.org.as_str()).is_some_and(|o| o.suspended);
    let secret = if dormant && unset_env_secret(&a.secret, ctx.env) {
        Some(Secret::new(""))
    } else {
        resolve_secret(&a.secret, false, &format!("{p}.secret"), ctx.env, issues)
    };
    // `Some(None)`: none set; `None`: invalid
    let proxy_url = match a.proxy_url.as_deref() {
        None => Some(None),
        Some(u) => proxy_url(u, &format!("{p}.proxy_url"), ctx.env, issues).map(Some),
    };
    if let Some(u) = &a.base_url
        && !(u.starts_with("http://") || u.starts_with("https://"))
    {
        issues.push(
            format!("{p}.base_url"),
            "base_url must start with http:// or https://",
        );
        ok = false;
    }
    let oauth = oauth_seed(a, &p, ctx, issues);
    let weight = weight(a.weight, &p, issues);
    let window_threshold = window_threshold(a.window_threshold, &p, issues);
    let max_concurrent = max_concurrent(a.max_concurrent, &p, issues);
    if a.model.as_ref().is_some_and(|m| m.trim().is_empty()) {
        issues.push(
            format!("{p}.model"),
            "model is empty; omit it to keep the request's model",
        );
        ok = false;
    }
    if !ok {
        return None;
    }
    Some(Account {
        id: AccountId::from(a.id.as_str()),
        org: org?,
        provider: provider?,
        auth: auth?,
        secret: secret?,
        base_url: a.base_url.as_deref().map(Arc::from),
        priority: priority?,
        weight: weight?,
        model: a.model.as_deref().map(Arc::from),
        window_threshold: window_threshold?,
        max_concurrent: max_concurrent?,
        active: a.active.unwrap_or(true),
        proxy_url: proxy_url?,
        oauth: oauth?,
    })
}

/// `refresh_token` and `expires_at` (SPEC 14): only on `oauth` accounts; `expires_at`
/// in unix seconds. `Some(None)`: none; `None`: invalid.
fn oauth_seed(
    a: &RawAccount,
    p: &str,
    ctx: &Context<'_>,
    issues: &mut Issues,
) -> Option<Option<crate::config::OAuthSeed>> {
    if let Some(at) = a.expires_at {
        let problem = if a.refresh_token.is_none() {
            Some("expires_at needs refresh_token: without it keypool cannot renew the access token")
        } else if at <= 0 {
            Some("expires_at must be a unix time in seconds (e.g. 1798761599)")
        } else if at > 100_000_000_000 {
            Some("expires_at looks like milliseconds: write unix seconds (divide by 1000)")
        } else {
            None
        };
        if let Some(problem) = problem {
            issues.push(format!("{p}.expires_at"), problem);
            return None;
        }
    }
    let Some(token) = a.refresh_token.as_deref() else {
        return Some(None);
    };
    if a.auth != "oauth" {
        issues.push(
            format!("{p}.refresh_token"),
            "refresh_token is for auth = \"oauth\" accounts (a subscription's token); remove it or set auth = \"oauth\"",
        );
        return None;
    }
    let refresh_token =
        resolve_secret(token, false, &format!("{p}.refresh_token"), ctx.env, issues)?;
    Some(Some(crate::config::OAuthSeed {
        refresh_token,
        expires_at_ms: a
            .expires_at
            .and_then(|s| u64::try_from(s).ok())
            .map(|s| s.saturating_mul(1000)),
    }))
}

/// Checks the account's id: not empty, not a duplicate (else remembered).
fn unique_id(
    i: usize,
    a: &RawAccount,
    first: &mut HashMap<String, usize>,
    p: &str,
    issues: &mut Issues,
) -> bool {
    if a.id.trim().is_empty() {
        issues.push(
            format!("{p}.id"),
            "account id is empty; give every account a unique id",
        );
        return false;
    }
    if let Some(j) = first.get(&a.id) {
        issues.push(format!("{p}.id"), format!("duplicate account id `{}` (first at accounts[{j}]); ids must be unique in the whole file", a.id));
        return false;
    }
    first.insert(a.id.clone(), i);
    true
}

/// The account's provider and auth type, and whether they go together (and the
/// provider has a default `base_url` or the account sets one); `ok` is cleared when not.
fn provider_and_auth(
    a: &RawAccount,
    p: &str,
    ok: &mut bool,
    issues: &mut Issues,
) -> (Option<Provider>, Option<AuthType>) {
    let provider = parse_named::<Provider>(&a.provider, &format!("{p}.provider"), issues);
    let auth = parse_named::<AuthType>(&a.auth, &format!("{p}.auth"), issues);
    if let (Some(pr), Some(au)) = (provider, auth) {
        if !pr.accepts(au) {
            issues.push(
                format!("{p}.auth"),
                format!(
                    "auth `{au}` is not supported by provider `{pr}` ({})",
                    supported_auth_types()
                ),
            );
            *ok = false;
        }
        if !pr.has_default_base_url() && a.base_url.is_none() {
            let serves = if pr.speaks_messages() {
                "the Messages API"
            } else {
                "the OpenAI Chat Completions API, e.g. https://api.openai.com"
            };
            issues.push(
                format!("{p}.base_url"),
                format!("provider `{pr}` needs a base_url (where the third party serves {serves})"),
            );
            *ok = false;
        }
    }
    (provider, auth)
}

/// Whether `secret` is a well-formed `$ENV_NAME` whose variable is unset or empty.
fn unset_env_secret(secret: &str, env: &dyn Fn(&str) -> Option<String>) -> bool {
    secret
        .strip_prefix('$')
        .is_some_and(|name| is_env_name(name) && env(name).is_none_or(|v| v.is_empty()))
}

/// `proxy_url`: `http://[user:password@]host:port` (HTTP CONNECT) or
/// `socks5://` / `socks5h://` (`socks5h`: the proxy resolves the name), a secret
/// (`$ENV_NAME` allowed: it may hold a password). `None` (with a problem) when invalid;
/// the problem never quotes the value.
fn proxy_url(
    value: &str,
    loc: &str,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> Option<Secret> {
    let secret = resolve_secret(value, false, loc, env, issues)?;
    match check_proxy_url(secret.expose()) {
        Ok(()) => Some(secret),
        Err(problem) => {
            issues.push(
                loc,
                format!("{problem}; write http://host:port, socks5://host:port or socks5h://host:port, with user:password@ before the host if the proxy needs it (value not shown: it may hold a password)"),
            );
            None
        }
    }
}

/// The shape of a proxy URL: a supported scheme, a host and a port, nothing after them.
pub(crate) fn check_proxy_url(url: &str) -> Result<(), &'static str> {
    let (scheme, rest) = url.split_once("://").ok_or("proxy_url has no scheme")?;
    if !matches!(scheme, "http" | "socks5" | "socks5h") {
        return Err(if scheme == "https" {
            "a TLS (https://) proxy is not supported"
        } else {
            "proxy_url's scheme must be http, socks5 or socks5h"
        });
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#']) {
        return Err("proxy_url must not have a path or query");
    }
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = host_port
        .rsplit_once(':')
        .ok_or("proxy_url needs a port (host:port)")?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.contains(['[', ']', ' ']) {
        return Err("proxy_url has no valid host");
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err("proxy_url's port is not a number between 1 and 65535"),
    }
}

/// `weight`: 1–100, default 1; `None` when out of range.
fn weight(w: Option<i64>, p: &str, issues: &mut Issues) -> Option<Weight> {
    let Some(w) = w else {
        return Weight::try_new(1);
    };
    let weight = Weight::try_new(w);
    if weight.is_none() {
        issues.push(
            format!("{p}.weight"),
            format!("weight {w} is outside 1–100"),
        );
    }
    weight
}

/// `window_threshold`: a fraction in 0–1, or none (the default applies); the outer
/// `None` when out of range.
fn window_threshold(t: Option<f64>, p: &str, issues: &mut Issues) -> Option<Option<Threshold>> {
    let Some(t) = t else {
        return Some(None);
    };
    match Threshold::try_new(t) {
        Some(t) => Some(Some(t)),
        None => {
            issues.push(
                format!("{p}.window_threshold"),
                format!("window_threshold {t} is outside 0–1 (a fraction, e.g. 0.95)"),
            );
            None
        }
    }
}

/// `max_concurrent`: at least 1, or none (no limit); the outer `None` when invalid.
fn max_concurrent(m: Option<i64>, p: &str, issues: &mut Issues) -> Option<Option<u32>> {
    let Some(m) = m else {
        return Some(None);
    };
    match u32::try_from(m).ok().filter(|m| *m >= 1) {
        Some(m) => Some(Some(m)),
        None => {
            issues.push(
                format!("{p}.max_concurrent"),
                format!("max_concurrent {m} must be at least 1 (omit it for no limit)"),
            );
            None
        }
    }
}
