//! `[[groups]]`: a valid id, an org, a strategy, and accounts of that org, each listed
//! once.

use std::collections::HashSet;
use std::sync::Arc;

use keypool_core::{AccountId, Strategy};

use super::{Context, Issues, check_segment, parse_named};
use crate::config::Group;
use crate::config::raw::RawGroup;

/// Validates the groups into their orgs.
pub(super) fn validate(groups: &[(usize, RawGroup)], ctx: &mut Context<'_>, issues: &mut Issues) {
    for (i, g) in groups {
        let p = format!("groups[{i}]");
        let mut ok = check_segment(&g.id, &format!("{p}.id"), "group id", issues);
        let org = ctx.org_ref(&g.org, format!("{p}.org"), issues);
        let strategy = match &g.strategy {
            None => Some(Strategy::default()),
            Some(s) => parse_named::<Strategy>(s, &format!("{p}.strategy"), issues),
        };
        if g.accounts.is_empty() {
            issues.push(
                format!("{p}.accounts"),
                "a group needs at least one account",
            );
            ok = false;
        }
        let members = members(g, &p, org.as_ref(), ctx, issues);
        if let (true, Some(org), Some(strategy), Some(members)) = (ok, org, strategy, members)
            && let Some(b) = ctx.orgs.get_mut(&org)
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
}

/// The group's accounts, each valid, once, of the group's `org`; `None` when any is
/// not (every problem reported).
fn members(
    g: &RawGroup,
    p: &str,
    org: Option<&Arc<str>>,
    ctx: &Context<'_>,
    issues: &mut Issues,
) -> Option<Vec<AccountId>> {
    let mut ok = true;
    let mut seen = HashSet::new();
    let mut members = Vec::new();
    for (k, acc) in g.accounts.iter().enumerate() {
        let loc = format!("{p}.accounts[{k}]");
        if !seen.insert(acc.as_str()) {
            issues.push(loc, format!("account `{acc}` is listed twice"));
            ok = false;
            continue;
        }
        match ctx.account_orgs.get(acc.as_str()) {
            Some((acc_org, _)) => {
                if let Some(org) = org
                    && acc_org != org
                {
                    issues.push(loc, format!("account `{acc}` belongs to org `{acc_org}`, not to the group's org `{org}`; pools are per organisation"));
                    ok = false;
                }
                members.push(AccountId::from(acc.as_str()));
            }
            None => {
                ok = false;
                if !ctx.mentioned.accounts.contains(acc) {
                    issues.push(loc, format!("no account with id `{acc}`"));
                }
            }
        }
    }
    ok.then_some(members)
}
