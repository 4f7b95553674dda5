//! `pool_unavailable`: the maintenance tick's look at every pool (an org's accounts,
//! and each group) through [`super::policy::PoolOutageTracker`].

use std::sync::Arc;

use keypool_core::{AccountId, UnixMs};

use super::{AlertEvent, AlertKind, AlertSubject};
use crate::Store;
use crate::resolve::PoolKey;

impl Store {
    /// Alerts the pools that have had at least 80 % of their accounts unavailable
    /// (inactive, disabled, cooling or out of a window) for `pool_unavailable_secs`,
    /// once per episode. Nothing to do without a webhook that wants it.
    pub(crate) fn watch_pools(&self, now: UnixMs) {
        let config = self.config();
        let settings = config.alerts();
        if !settings.wants(AlertKind::PoolUnavailable) {
            return;
        }
        let unavailable = |id: &AccountId| {
            let health = self.health();
            config.account(id.as_str()).is_none_or(|a| !a.active())
                || health.disabled.is_disabled(id)
                || health.cooldowns.cooldown_until(id, now).is_some()
                || self.out_of_window(id, now).is_some()
        };
        let mut pools: Vec<(PoolKey, Arc<str>, &[AccountId])> = Vec::new();
        for org in config.orgs() {
            pools.push((
                PoolKey::new(org.slug(), None),
                org.slug_shared().clone(),
                org.accounts(),
            ));
            for group in org.groups() {
                pools.push((
                    PoolKey::new(org.slug(), Some(group.id())),
                    org.slug_shared().clone(),
                    group.accounts(),
                ));
            }
        }
        let mut fired = Vec::new();
        {
            let mut tracker = self.alerts().outages();
            for (pool, org, accounts) in &pools {
                let out = accounts.iter().filter(|id| unavailable(id)).count();
                let seen = tracker.observe(
                    pool.as_str(),
                    out,
                    accounts.len(),
                    now,
                    settings.pool_unavailable_ms,
                );
                if let Some(outage) = seen {
                    fired.push((pool.clone(), org.clone(), outage));
                }
            }
            tracker.retain(|p| pools.iter().any(|(k, _, _)| k.as_str() == p));
        }
        for (pool, org, outage) in fired {
            self.alert(AlertEvent::new(
                AlertKind::PoolUnavailable,
                AlertSubject {
                    org: Some(org),
                    pool: Some(Arc::from(pool.as_str())),
                    ..AlertSubject::default()
                },
                format!(
                    "{} of its {} accounts unavailable since {}",
                    outage.unavailable,
                    outage.total,
                    super::rfc3339(outage.since)
                ),
                now,
            ));
        }
    }
}
