//! SPEC 3.2–3.3: route resolution outcomes and LB key validation.

use keypool_core::Strategy;
use keypool_store::config::Config;
use keypool_store::keys::hash_key;
use keypool_store::resolve::{AuthError, Caller, ResolveError};

fn config() -> Config {
    let h = |k: &str| hash_key(k).to_hex();
    let text = format!(
        r#"
[[orgs]]
slug = "acme"
[[orgs]]
slug = "beta"
[[orgs]]
slug = "gone"
suspended = true

[[accounts]]
id = "a1"
org = "acme"
provider = "anthropic"
auth = "api_key"
secret = "s"
[[accounts]]
id = "g1"
org = "gone"
provider = "anthropic"
auth = "api_key"
secret = "s"

[[groups]]
id = "fast"
org = "acme"
strategy = "rated"
accounts = ["a1"]

[[urls]]
custom_url = "team"
org = "acme"
group = "fast"
[[urls]]
custom_url = "open"
org = "acme"
[[urls]]
custom_url = "shared"
org = "acme"
[[urls]]
custom_url = "shared"
org = "beta"
[[urls]]
custom_url = "ghost"
[[urls]]
custom_url = "tools"
org = "gone"

[[keys]]
id = "alice"
org = "acme"
kind = "user"
sha256 = "{alice}"
urls = ["*"]
[[keys]]
id = "bot"
org = "acme"
kind = "client"
sha256 = "{bot}"
urls = ["open"]
[[keys]]
id = "old"
org = "acme"
kind = "user"
sha256 = "{old}"
urls = ["*"]
revoked = true
[[keys]]
id = "bob"
org = "beta"
kind = "user"
sha256 = "{bob}"
urls = ["*"]
[[keys]]
id = "gina"
org = "gone"
kind = "user"
sha256 = "{gina}"
urls = ["*"]
"#,
        alice = h("sk-lb-alice"),
        bot = h("sk-lb-bot"),
        old = h("sk-lb-old"),
        bob = h("sk-lb-bob"),
        gina = h("sk-lb-gina"),
    );
    Config::from_toml_str(&text, None, &|_| None).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn org_route_resolves_group_and_strategy() {
    let c = config();
    let r = c.resolve("acme", "team").unwrap();
    assert_eq!(r.org().slug(), "acme");
    assert_eq!(r.url().custom_url(), "team");
    assert_eq!(r.group().unwrap().id(), "fast");
    assert_eq!(r.strategy(), Strategy::Rated);
    assert_eq!(r.pool_key().as_str(), "acme/fast");
    assert!(!r.legacy());
    let open = c.resolve("acme", "open").unwrap();
    assert!(open.group().is_none());
    assert_eq!(open.strategy(), Strategy::RoundRobin);
    assert_eq!(open.pool_key().as_str(), "acme/*");
}

#[test]
fn unknown_org_and_unknown_url_are_indistinguishable() {
    let c = config();
    let a = c.resolve("nope", "team").unwrap_err();
    let b = c.resolve("acme", "nope").unwrap_err();
    assert_eq!(a, ResolveError::NotFound);
    assert_eq!(a, b);
    assert_eq!(a.to_string(), b.to_string());
    assert_eq!(a.to_string(), "Custom URL config not found");
}

#[test]
fn legacy_outcomes() {
    let c = config();
    let one = c.resolve_legacy("team").unwrap();
    assert_eq!(one.org().slug(), "acme");
    assert!(one.legacy());
    assert_eq!(
        c.resolve_legacy("nothing").unwrap_err(),
        ResolveError::NotFound
    );
    assert_eq!(
        c.resolve_legacy("shared").unwrap_err(),
        ResolveError::LegacyConflict
    );
    assert_eq!(c.resolve_legacy("ghost").unwrap_err(), ResolveError::NoPool);
    // the org-less config is not reachable through an org route
    assert_eq!(
        c.resolve("acme", "ghost").unwrap_err(),
        ResolveError::NotFound
    );
}

#[test]
fn key_validation_and_caller_identity() {
    let c = config();
    let team = c.resolve("acme", "team").unwrap();
    let open = c.resolve("acme", "open").unwrap();
    let alice = c.authenticate(&team, Some("sk-lb-alice")).unwrap();
    assert_eq!(alice, Caller::User("alice".into()));
    assert_eq!(alice.user_api_key_id(), Some("alice"));
    assert_eq!(alice.client_api_key_id(), None);
    let bot = c.authenticate(&open, Some("sk-lb-bot")).unwrap();
    assert_eq!(bot.client_api_key_id(), Some("bot"));
    assert_eq!(bot.user_api_key_id(), None);

    // missing, unknown, revoked, URL not in the list, other org
    assert_eq!(c.authenticate(&team, None), Err(AuthError::Unauthenticated));
    assert_eq!(
        c.authenticate(&team, Some("")),
        Err(AuthError::Unauthenticated)
    );
    assert_eq!(
        c.authenticate(&team, Some("sk-lb-nobody")),
        Err(AuthError::Unauthenticated)
    );
    assert_eq!(
        c.authenticate(&team, Some("sk-lb-old")),
        Err(AuthError::Unauthenticated)
    );
    assert_eq!(
        c.authenticate(&team, Some("sk-lb-bot")),
        Err(AuthError::Unauthenticated)
    );
    assert_eq!(
        c.authenticate(&team, Some("sk-lb-bob")),
        Err(AuthError::Unauthenticated)
    );
    // legacy route: the same visibility rule
    let legacy = c.resolve_legacy("team").unwrap();
    assert!(c.authenticate(&legacy, Some("sk-lb-alice")).is_ok());
    assert_eq!(
        c.authenticate(&legacy, Some("sk-lb-bob")),
        Err(AuthError::Unauthenticated)
    );
}

#[test]
fn suspension_is_checked_only_after_the_key_is_valid() {
    let c = config();
    let tools = c.resolve("gone", "tools").unwrap();
    assert_eq!(
        c.authenticate(&tools, Some("sk-lb-gina")),
        Err(AuthError::OrgSuspended)
    );
    assert!(
        AuthError::OrgSuspended
            .to_string()
            .contains("ORG_SUSPENDED")
    );
    // an invalid key on a suspended org learns nothing about the suspension
    assert_eq!(
        c.authenticate(&tools, Some("sk-lb-alice")),
        Err(AuthError::Unauthenticated)
    );
    assert_eq!(
        c.authenticate(&tools, None),
        Err(AuthError::Unauthenticated)
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    const URLS: [&str; 4] = ["u0", "u1", "u2", "u3"];
    const ORGS: [&str; 3] = ["o0", "o1", "o2"];

    /// `orgs[i]` = which of URLS org i has; `orphans` = which exist without org.
    fn build(orgs: &[[bool; 4]; 3], orphans: &[bool; 4]) -> Config {
        let mut s = String::new();
        for (i, org) in ORGS.iter().enumerate() {
            s += &format!("[[orgs]]\nslug = \"{org}\"\n");
            for (u, has) in URLS.iter().zip(orgs[i]) {
                if has {
                    s += &format!("[[urls]]\ncustom_url = \"{u}\"\norg = \"{org}\"\n");
                }
            }
        }
        for (u, has) in URLS.iter().zip(orphans) {
            if *has {
                s += &format!("[[urls]]\ncustom_url = \"{u}\"\n");
            }
        }
        Config::from_toml_str(&s, None, &|_| None).unwrap_or_else(|e| panic!("{e}"))
    }

    proptest! {
        #[test]
        fn resolution_matches_the_counting_model(
            orgs in any::<[[bool; 4]; 3]>(),
            orphans in any::<[bool; 4]>(),
        ) {
            let c = build(&orgs, &orphans);
            for (k, url) in URLS.iter().enumerate() {
                let owners: Vec<&str> = (0..3).filter(|&i| orgs[i][k]).map(|i| ORGS[i]).collect();
                let total = owners.len() + usize::from(orphans[k]);
                let got = c.resolve_legacy(url).map(|r| r.org().slug().to_owned());
                let expected = match (total, owners.first()) {
                    (0, _) => Err(ResolveError::NotFound),
                    (1, Some(org)) => Ok((*org).to_owned()),
                    (1, None) => Err(ResolveError::NoPool),
                    _ => Err(ResolveError::LegacyConflict),
                };
                prop_assert_eq!(got, expected, "legacy {}", url);
                for (i, org) in ORGS.iter().enumerate() {
                    let r = c.resolve(org, url);
                    prop_assert_eq!(r.is_ok(), orgs[i][k]);
                    if let Err(e) = r {
                        prop_assert_eq!(e, ResolveError::NotFound);
                    }
                }
                prop_assert_eq!(c.resolve("nope", url).unwrap_err(), ResolveError::NotFound);
            }
        }
    }
}
