//! `[[keys]]`: LB keys as SHA-256 hashes only, each with a unique id and hash, a kind,
//! an org, and the URL configs of that org it may use (or `"*"`).

use std::collections::HashMap;
use std::sync::Arc;

use super::{Context, Issues};
use crate::config::raw::RawKey;
use crate::config::{KeyHash, KeyKind, KeyScope, LbKey};

/// Validates the keys; the valid ones are returned by hash.
pub(super) fn validate(
    keys: &[(usize, RawKey)],
    ctx: &Context<'_>,
    issues: &mut Issues,
) -> HashMap<KeyHash, Arc<LbKey>> {
    let mut by_hash: HashMap<KeyHash, Arc<LbKey>> = HashMap::new();
    let mut first_id: HashMap<String, usize> = HashMap::new();
    let mut first_hash: HashMap<KeyHash, usize> = HashMap::new();
    for (i, k) in keys {
        let p = format!("keys[{i}]");
        let mut ok = true;
        if k.id.trim().is_empty() {
            issues.push(format!("{p}.id"), "key id is empty");
            ok = false;
        } else if let Some(j) = first_id.get(&k.id) {
            issues.push(
                format!("{p}.id"),
                format!("duplicate key id `{}` (first at keys[{j}])", k.id),
            );
            ok = false;
        } else {
            first_id.insert(k.id.clone(), *i);
        }
        let org = ctx.org_ref(&k.org, format!("{p}.org"), issues);
        let kind = kind(&k.kind, &p, issues);
        let hash = hash(*i, k, &p, &mut first_hash, &mut ok, issues);
        let scope = scope(k, &p, org.as_ref(), ctx, issues);
        let own = k
            .limits
            .as_ref()
            .map(|l| super::limits::validate(l, &format!("{p}.limits"), issues));
        let defaults = org
            .as_ref()
            .and_then(|o| ctx.orgs.get(o))
            .and_then(|o| o.limits.as_ref());
        let limits = super::limits::merge(own.as_ref(), defaults);
        if let (true, Some(org), Some(kind), Some(hash), Some(scope)) = (ok, org, kind, hash, scope)
        {
            by_hash.insert(
                hash,
                Arc::new(LbKey {
                    id: Arc::from(k.id.as_str()),
                    org,
                    kind,
                    hash,
                    scope,
                    revoked: k.revoked,
                    limits: (!limits.is_empty()).then(|| Arc::new(limits)),
                }),
            );
        }
    }
    by_hash
}

fn kind(kind: &str, p: &str, issues: &mut Issues) -> Option<KeyKind> {
    match kind {
        "user" => Some(KeyKind::User),
        "client" => Some(KeyKind::Client),
        other => {
            issues.push(
                format!("{p}.kind"),
                format!("unknown key kind {other:?}: expected `user` or `client`"),
            );
            None
        }
    }
}

/// The key's hash; a hash another key already has makes the key invalid (`ok`).
fn hash(
    i: usize,
    k: &RawKey,
    p: &str,
    first: &mut HashMap<KeyHash, usize>,
    ok: &mut bool,
    issues: &mut Issues,
) -> Option<KeyHash> {
    let Some(h) = KeyHash::from_hex(&k.sha256) else {
        let hint = if k.sha256.starts_with("sk-lb-") {
            "this looks like a key, not its hash: put only the SHA-256 here (run `keypool keygen`)"
                .to_owned()
        } else {
            format!(
                "sha256 must be 64 hex characters (got {} characters)",
                k.sha256.chars().count()
            )
        };
        issues.push(format!("{p}.sha256"), hint);
        return None;
    };
    if let Some(j) = first.get(&h) {
        issues.push(
            format!("{p}.sha256"),
            format!("same hash as keys[{j}]; every key needs its own (run `keypool keygen`)"),
        );
        *ok = false;
    } else {
        first.insert(h, i);
    }
    Some(h)
}

/// The URL configs the key may use: `"*"` alone, or URL configs of its org.
fn scope(
    k: &RawKey,
    p: &str,
    org: Option<&Arc<str>>,
    ctx: &Context<'_>,
    issues: &mut Issues,
) -> Option<KeyScope> {
    if k.urls.is_empty() {
        issues.push(
            format!("{p}.urls"),
            "urls is empty: list the custom_urls this key may use, or [\"*\"] for all of its org",
        );
        return None;
    }
    if k.urls.iter().any(|u| u == "*") {
        if k.urls.len() > 1 {
            issues.push(
                format!("{p}.urls"),
                "\"*\" already means every URL of the org; use it alone",
            );
            return None;
        }
        return Some(KeyScope::AllUrls);
    }
    let mut list = Vec::new();
    let mut all_ok = true;
    for (n, u) in k.urls.iter().enumerate() {
        let found = org
            .and_then(|o| ctx.orgs.get(o))
            .and_then(|b| b.urls.get_key_value(u.as_str()).map(|(k, _)| k.clone()));
        match found {
            Some(url) => list.push(url),
            None => {
                all_ok = false;
                if org.is_some() && !ctx.mentioned.urls.contains(&(k.org.clone(), u.clone())) {
                    issues.push(
                        format!("{p}.urls[{n}]"),
                        format!("no URL config `{u}` in org `{}`", k.org),
                    );
                }
            }
        }
    }
    all_ok.then_some(KeyScope::Urls(list))
}
