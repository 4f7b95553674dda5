//! `[[orgs]]`: unique, valid slugs; each org starts as an [`OrgBuilder`] the later
//! sections fill with accounts, groups and URL configs.

use std::collections::HashMap;
use std::sync::Arc;

use keypool_core::AccountId;

use super::{Context, Issues, check_segment};
use crate::config::raw::RawOrg;
use crate::config::{Group, LimitSettings, UrlConfig};

/// An org while the document is validated.
pub(super) struct OrgBuilder {
    pub slug: Arc<str>,
    pub suspended: bool,
    /// `[orgs.limits]`: the defaults of its keys, and its team budget.
    pub limits: Option<LimitSettings>,
    pub accounts: Vec<AccountId>,
    pub groups: HashMap<Arc<str>, Arc<Group>>,
    pub urls: HashMap<Arc<str>, Arc<UrlConfig>>,
}

/// Validates the orgs into `ctx.orgs`.
pub(super) fn validate(orgs: &[(usize, RawOrg)], ctx: &mut Context<'_>, issues: &mut Issues) {
    let mut first: HashMap<String, usize> = HashMap::new();
    for (i, o) in orgs {
        let limits = o
            .limits
            .as_ref()
            .map(|l| super::limits::validate(l, &format!("orgs[{i}].limits"), issues));
        let loc = format!("orgs[{i}].slug");
        if !check_segment(&o.slug, &loc, "org slug", issues) {
            continue;
        }
        if let Some(j) = first.get(&o.slug) {
            issues.push(
                loc,
                format!(
                    "duplicate org slug `{}` (first at orgs[{j}]); slugs must be unique",
                    o.slug
                ),
            );
            continue;
        }
        first.insert(o.slug.clone(), *i);
        let slug: Arc<str> = Arc::from(o.slug.as_str());
        ctx.orgs.insert(
            slug.clone(),
            OrgBuilder {
                slug,
                suspended: o.suspended,
                limits,
                accounts: Vec::new(),
                groups: HashMap::new(),
                urls: HashMap::new(),
            },
        );
    }
}
