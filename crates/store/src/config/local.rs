//! [`Config::local_copy`]: a config whose reference-counted parts are allocated anew,
//! so that one worker thread's requests count references on memory no other thread
//! writes (see [`crate::Store::config`]).
//!
//! A request clones a dozen of the config's `Arc`s (its org and URL labels, the
//! account ids of its attempts, the route's org, URL and group, the account).
//! Shared by every worker, each clone and drop is an atomic write to a cache line the
//! other workers write too, which costs several times an uncontended one
//! (`docs/BENCHMARKS.md`, "Per-thread config"). Only the parts a request clones are
//! copied; the rest (legacy routes, prices, settings) stays shared.

use std::sync::Arc;

use keypool_core::AccountId;

use super::{Account, Config, Group, LbKey, Org, UrlConfig};

fn text(s: &Arc<str>) -> Arc<str> {
    Arc::from(&**s)
}

fn id(a: &AccountId) -> AccountId {
    AccountId::new(a.as_str())
}

impl Config {
    /// This config, equal in every value, with its orgs, groups, URL configs, accounts
    /// and keys (and the strings in them) in allocations of their own.
    pub(crate) fn local_copy(&self) -> Config {
        let mut copy = self.clone();
        copy.orgs = self
            .orgs
            .iter()
            .map(|(slug, org)| (text(slug), Arc::new(org.local_copy())))
            .collect();
        copy.accounts = self
            .accounts
            .iter()
            .map(|(key, account)| (id(key), Arc::new(account.local_copy())))
            .collect();
        copy.keys_by_hash = self
            .keys_by_hash
            .iter()
            .map(|(hash, key)| (*hash, Arc::new(key.local_copy())))
            .collect();
        copy
    }
}

impl Org {
    fn local_copy(&self) -> Org {
        Org {
            slug: text(&self.slug),
            suspended: self.suspended,
            team_usd_per_month: self.team_usd_per_month,
            override_models: self.override_models.iter().map(text).collect(),
            accounts: self.accounts.iter().map(id).collect(),
            groups: self
                .groups
                .iter()
                .map(|(k, g)| (text(k), Arc::new(g.local_copy())))
                .collect(),
            urls: self
                .urls
                .iter()
                .map(|(k, u)| (text(k), Arc::new(u.local_copy())))
                .collect(),
        }
    }
}

impl Group {
    fn local_copy(&self) -> Group {
        Group {
            id: text(&self.id),
            org: text(&self.org),
            strategy: self.strategy,
            accounts: self.accounts.iter().map(id).collect(),
        }
    }
}

impl UrlConfig {
    fn local_copy(&self) -> UrlConfig {
        UrlConfig {
            custom_url: text(&self.custom_url),
            org: text(&self.org),
            group: self.group.as_ref().map(text),
            pool: self.pool.local_copy(),
        }
    }
}

impl Account {
    fn local_copy(&self) -> Account {
        Account {
            id: id(&self.id),
            org: text(&self.org),
            secret: self.secret.local_copy(),
            base_url: self.base_url.as_ref().map(text),
            model: self.model.as_ref().map(text),
            ..self.clone()
        }
    }
}

impl LbKey {
    fn local_copy(&self) -> LbKey {
        LbKey {
            id: text(&self.id),
            org: text(&self.org),
            limits: self.limits.as_ref().map(|l| Arc::new((**l).clone())),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = r#"
[[orgs]]
slug = "acme"

[[accounts]]
id = "a1"
org = "acme"
provider = "anthropic"
auth = "api_key"
secret = "sk-ant-api03-a1"
base_url = "http://127.0.0.1:1"
model = "claude-sonnet-4-5"

[[accounts]]
id = "a2"
org = "acme"
provider = "anthropic"
auth = "api_key"
secret = "sk-ant-api03-a2"

[[groups]]
id = "g"
org = "acme"
strategy = "round_robin"
accounts = ["a1", "a2"]

[[urls]]
custom_url = "main"
org = "acme"
group = "g"

[[keys]]
id = "k"
org = "acme"
kind = "client"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
urls = ["main"]
limits = { requests_per_minute = 10 }
"#;

    #[test]
    fn a_local_copy_is_equal_and_shares_no_part_a_request_clones() {
        let config = Config::from_toml_str(TOML, None, &|_| None).unwrap();
        let copy = config.local_copy();
        for (slug, org) in &config.orgs {
            let other = &copy.orgs[slug];
            assert!(!Arc::ptr_eq(org, other));
            assert!(!Arc::ptr_eq(&org.slug, &other.slug));
            assert_eq!(org.slug, other.slug);
            assert_eq!(org.accounts, other.accounts);
            for (name, url) in &org.urls {
                let u = &other.urls[name];
                assert!(!Arc::ptr_eq(url, u) && !Arc::ptr_eq(&url.custom_url, &u.custom_url));
                assert_eq!(
                    (&url.custom_url, &url.org, &url.group),
                    (&u.custom_url, &u.org, &u.group)
                );
                assert_eq!(url.pool, u.pool);
                assert_ne!(url.pool.as_str().as_ptr(), u.pool.as_str().as_ptr());
            }
            for (name, group) in &org.groups {
                let g = &other.groups[name];
                assert!(!Arc::ptr_eq(group, g));
                assert_eq!(
                    (&group.id, &group.accounts, group.strategy),
                    (&g.id, &g.accounts, g.strategy)
                );
                assert_ne!(
                    group.accounts[0].as_str().as_ptr(),
                    g.accounts[0].as_str().as_ptr()
                );
            }
        }
        assert_eq!(config.accounts.len(), copy.accounts.len());
        for (key, account) in &config.accounts {
            let other = &copy.accounts[key];
            assert!(!Arc::ptr_eq(account, other));
            assert_eq!(**account, **other);
            assert_ne!(account.id.as_str().as_ptr(), other.id.as_str().as_ptr());
            assert_ne!(
                account.secret.expose().as_ptr(),
                other.secret.expose().as_ptr()
            );
        }
        for (hash, key) in &config.keys_by_hash {
            let other = &copy.keys_by_hash[hash];
            assert!(!Arc::ptr_eq(key, other));
            assert_eq!(**key, **other);
            assert!(!Arc::ptr_eq(
                key.limits.as_ref().unwrap(),
                other.limits.as_ref().unwrap()
            ));
        }
    }
}
