//! `[[urls]]`: a valid `custom_url`, unique in its org (or among the org-less legacy
//! ones), pointing at a group of its org or at the org's whole pool.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Context, Issues, check_segment};
use crate::config::UrlConfig;
use crate::config::raw::RawUrl;
use crate::resolve::PoolKey;

/// Validates the URL configs into their orgs; returns the org-less ones (legacy data)
/// by `custom_url` with their index.
pub(super) fn validate(
    urls: &[(usize, RawUrl)],
    ctx: &mut Context<'_>,
    issues: &mut Issues,
) -> HashMap<String, usize> {
    let mut orphans: HashMap<String, usize> = HashMap::new();
    for (i, u) in urls {
        let p = format!("urls[{i}]");
        if !check_segment(
            &u.custom_url,
            &format!("{p}.custom_url"),
            "custom_url",
            issues,
        ) {
            continue;
        }
        match &u.org {
            None => orphan(*i, u, &p, &mut orphans, issues),
            Some(o) => in_org(u, o, &p, ctx, issues),
        }
    }
    orphans
}

/// A URL config without org (legacy data): it may name no group.
fn orphan(
    i: usize,
    u: &RawUrl,
    p: &str,
    orphans: &mut HashMap<String, usize>,
    issues: &mut Issues,
) {
    if u.group.is_some() {
        issues.push(format!("{p}.group"), "a URL config without org cannot name a group: groups belong to an org; add `org` or remove `group`");
    }
    if let Some(j) = orphans.get(&u.custom_url) {
        issues.push(
            format!("{p}.custom_url"),
            format!(
                "duplicate org-less custom_url `{}` (first at urls[{j}])",
                u.custom_url
            ),
        );
    } else {
        orphans.insert(u.custom_url.clone(), i);
    }
}

/// A URL config of org `o`.
fn in_org(u: &RawUrl, o: &str, p: &str, ctx: &mut Context<'_>, issues: &mut Issues) {
    let Some(org) = ctx.org_ref(o, format!("{p}.org"), issues) else {
        return;
    };
    let group_mentioned = u
        .group
        .as_ref()
        .is_some_and(|g| ctx.mentioned.groups.contains(g));
    let Some(b) = ctx.orgs.get_mut(&org) else {
        return;
    };
    if let Some(g) = &u.group
        && !b.groups.contains_key(g.as_str())
    {
        if !group_mentioned {
            issues.push(
                format!("{p}.group"),
                format!("no group `{g}` in org `{org}`"),
            );
        }
        return;
    }
    if b.urls.contains_key(u.custom_url.as_str()) {
        issues.push(
            format!("{p}.custom_url"),
            format!("duplicate custom_url `{}` in org `{org}`", u.custom_url),
        );
        return;
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
