//! Configuration: one test per validation error class, the example file, env overrides.

use keypool_core::{AuthType, Provider, Strategy};
use keypool_store::config::{Config, ConfigErrors, KeyKind, KeyScope, StreamCommit};

const HASH_A: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";
const HASH_B: &str = "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9";

/// A small valid file that each test breaks in one way.
const BASE: &str = r#"
[[orgs]]
slug = "acme"

[[orgs]]
slug = "other"

[[accounts]]
id = "a1"
org = "acme"
provider = "anthropic"
auth = "api_key"
secret = "sk-ant-SECRET-VALUE-1"

[[accounts]]
id = "a2"
org = "acme"
provider = "anthropic"
auth = "oauth"
secret = "$ACME_TOKEN"
weight = 5

[[accounts]]
id = "o1"
org = "other"
provider = "anthropic"
auth = "api_key"
secret = "sk-ant-SECRET-VALUE-2"

[[groups]]
id = "g"
org = "acme"
strategy = "weighted"
accounts = ["a1", "a2"]

[[urls]]
custom_url = "team"
org = "acme"
group = "g"

[[urls]]
custom_url = "all"
org = "acme"

[[keys]]
id = "k1"
org = "acme"
kind = "user"
sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
urls = ["team"]
"#;

fn env(name: &str) -> Option<String> {
    match name {
        "ACME_TOKEN" => Some("sk-ant-oat01-SECRET-FROM-ENV".to_owned()),
        _ => None,
    }
}

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::from_toml_str(text, None, &env)
}

/// Parses `text`, expects failure, checks that no secret leaks into any message.
fn errors(text: &str) -> ConfigErrors {
    let errs = parse(text).expect_err("config should be rejected");
    let all = errs.to_string();
    for secret in ["SECRET-VALUE", "SECRET-FROM-ENV"] {
        assert!(!all.contains(secret), "a secret leaked into: {all}");
    }
    errs
}

fn locations(errs: &ConfigErrors) -> Vec<&str> {
    errs.issues().iter().map(|i| i.location.as_str()).collect()
}

#[test]
fn base_file_is_valid_and_resolved_into_checked_types() {
    let c = parse(BASE).unwrap();
    let a2 = c.account("a2").unwrap();
    assert_eq!(a2.secret().expose(), "sk-ant-oat01-SECRET-FROM-ENV");
    assert_eq!(a2.auth(), AuthType::OAuth);
    assert_eq!(a2.provider(), Provider::Anthropic);
    assert_eq!(a2.weight().get(), 5);
    assert_eq!(c.account("a1").unwrap().weight().get(), 1);
    assert!(c.account("a1").unwrap().active());
    let acme = c.org("acme").unwrap();
    assert_eq!(
        acme.accounts()
            .iter()
            .map(|a| a.as_str())
            .collect::<Vec<_>>(),
        ["a1", "a2"]
    );
    assert_eq!(acme.group("g").unwrap().strategy(), Strategy::Weighted);
    assert_eq!(acme.url("all").unwrap().group(), None);
    let key = c.keys().next().unwrap();
    assert_eq!(key.kind(), KeyKind::User);
    assert!(matches!(key.scope(), KeyScope::Urls(u) if u.len() == 1));
    assert_eq!(key.hash().to_hex(), HASH_A);
}

#[test]
fn defaults_follow_the_spec() {
    let s = parse(BASE).unwrap().server().clone();
    assert_eq!(s.max_body_bytes, 32 * 1024 * 1024);
    assert_eq!(s.upstream_timeout_ms, 180_000);
    assert_eq!(s.first_frame_timeout_ms, 15_000);
    assert_eq!(s.stream_idle_timeout_ms, 300_000);
    assert_eq!(s.stream_commit, StreamCommit::FirstContent);
    assert_eq!(s.passthrough_statuses, vec![429, 402]);
    assert!(s.auto_disable_on_error);
    // Thu, 31 Dec 2026 23:59:59 GMT
    assert_eq!(s.legacy_routes_until_unix_secs, 1_798_761_599);
    assert_eq!(s.snapshot_ttl_ms, 15_000);
    assert_eq!(s.hedge_min_delay_ms, 200);
    assert_eq!(s.hedge_budget, 0.10);
    assert_eq!(s.default_window_threshold.get(), 0.95);
    assert_eq!(s.redis_url, None);
    assert_eq!(s.rating.error_weight, 10_000.0);
    assert_eq!(s.rating.total_weight, 0.1);
    assert_eq!(s.session_affinity_ttl_ms, 3_600_000);
    assert_eq!(s.queue_max_wait_ms, 30_000);
    assert_eq!(s.queue_max_depth, 0);
    assert_eq!(s.workers, 0);
}

#[test]
fn workers_take_zero_to_1024() {
    for (value, expected) in [("0", 0), ("1", 1), ("1024", 1024)] {
        let text = BASE.to_owned() + &format!("[server]\nworkers = {value}\n");
        assert_eq!(parse(&text).unwrap().server().workers, expected);
    }
    for bad in ["-1", "1025"] {
        let errs = errors(&(BASE.to_owned() + &format!("[server]\nworkers = {bad}\n")));
        assert_eq!(locations(&errs), ["server.workers"], "{errs}");
        assert!(errs.to_string().contains("0 starts one per CPU"), "{errs}");
    }
}

#[test]
fn affinity_and_queue_options_take_zero_and_reject_negatives() {
    let zero = BASE.to_owned()
        + "[server]\nsession_affinity_ttl_secs = 0\nqueue_max_wait_ms = 0\nqueue_max_depth = 0\n";
    let s = parse(&zero).unwrap().server().clone();
    assert_eq!(
        (
            s.session_affinity_ttl_ms,
            s.queue_max_wait_ms,
            s.queue_max_depth
        ),
        (0, 0, 0)
    );
    let set = BASE.to_owned()
        + "[server]\nsession_affinity_ttl_secs = 90\nqueue_max_wait_ms = 250\nqueue_max_depth = 8\n";
    let s = parse(&set).unwrap().server().clone();
    assert_eq!(
        (
            s.session_affinity_ttl_ms,
            s.queue_max_wait_ms,
            s.queue_max_depth
        ),
        (90_000, 250, 8)
    );
    let negative = BASE.to_owned()
        + "[server]\nsession_affinity_ttl_secs = -1\nqueue_max_wait_ms = -5\nqueue_max_depth = -2\n";
    let errs = errors(&negative);
    assert_eq!(
        locations(&errs),
        [
            "server.session_affinity_ttl_secs",
            "server.queue_max_wait_ms",
            "server.queue_max_depth"
        ],
        "{errs}"
    );
    assert!(
        errs.to_string().contains("0 turns session affinity off"),
        "{errs}"
    );
}

#[test]
fn the_example_file_validates() {
    let text = include_str!("../../../examples/keypool.toml");
    // only the secrets of accounts that can serve: the inactive `acme-proxy` and the
    // suspended org's `globex-api-1` may name unset variables (issue 21)
    let secrets = ["KEYPOOL_ADMIN_TOKEN", "ACME_OAUTH_1", "ACME_API_1"];
    let env = |name: &str| secrets.contains(&name).then(|| format!("value-of-{name}"));
    let c = Config::from_toml_str(text, None, &env).unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.account("acme-proxy").unwrap().active());
    assert!(c.org("globex").unwrap().suspended());
    assert_eq!(c.server().legacy_routes_until_unix_secs, 1_798_761_599);
    assert!(c.admin().token.is_some());
    // `[keys.limits]` after its `[[keys]]` is that key's table; an inline one works too.
    let bot = c.lb_key_by_id("ci-bot").unwrap().limits().unwrap();
    assert_eq!(
        (
            bot.rate.map(|r| (r.per_minute, r.burst)),
            bot.max_concurrent
        ),
        (Some((30, 60)), Some(8))
    );
    let alice = c.lb_key_by_id("alice").unwrap().limits().unwrap();
    assert_eq!(
        alice.rate.map(|r| r.per_minute),
        Some(120),
        "acme's default"
    );
    assert_eq!(alice.usd_per_day, Some(20_000_000_000));
    assert_eq!(
        c.org("acme").unwrap().team_usd_per_month(),
        Some(500_000_000_000)
    );
}

#[test]
fn toml_syntax_error_has_a_line_and_no_source_text() {
    let errs = errors("[[accounts]]\nid = \"a\"\nsecret = \"sk-ant-SECRET-VALUE-9\n");
    assert_eq!(errs.issues().len(), 1);
    assert!(errs.issues()[0].location.starts_with("line 3"), "{errs}");
}

#[test]
fn unknown_fields_are_each_reported_with_their_location() {
    let text = BASE
        .replace("slug = \"other\"", "slug = \"other\"\ncolour = \"red\"")
        .replace("weight = 5", "weight = 5\nwieght = 5\nnotes = \"x\"")
        + "\n[serverr]\n[server]\nlisten2 = 1\n[server.rating]\nfoo = 1\n";
    let errs = errors(&text);
    let locs = locations(&errs);
    for expected in [
        "orgs[1].colour",
        "accounts[1].wieght",
        "accounts[1].notes",
        "serverr",
        "server.listen2",
        "server.rating.foo",
    ] {
        assert!(locs.contains(&expected), "missing {expected} in {errs}");
    }
    assert_eq!(locs.len(), 6, "{errs}");
}

#[test]
fn duplicate_ids_slugs_and_urls_are_reported() {
    let text = BASE.to_owned()
        + r#"
[[orgs]]
slug = "acme"
[[accounts]]
id = "a1"
org = "other"
provider = "anthropic"
auth = "api_key"
secret = "x"
[[groups]]
id = "g"
org = "acme"
accounts = ["a1"]
[[urls]]
custom_url = "team"
org = "acme"
[[keys]]
id = "k1"
org = "acme"
kind = "client"
sha256 = "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9"
urls = ["*"]
[[keys]]
id = "k3"
org = "acme"
kind = "client"
sha256 = "2C26B46B68FFC68FF99B453C1D30413413422D706483BFA0F98A5E886266E7AE"
urls = ["*"]
"#;
    let errs = errors(&text);
    let locs = locations(&errs);
    for expected in [
        "orgs[2].slug",
        "accounts[3].id",
        "groups[1].id",
        "urls[2].custom_url",
        "keys[1].id",
        "keys[2].sha256",
    ] {
        assert!(locs.contains(&expected), "missing {expected} in {errs}");
    }
}

#[test]
fn same_custom_url_in_two_orgs_is_fine() {
    let text = BASE.to_owned() + "[[urls]]\ncustom_url = \"team\"\norg = \"other\"\n";
    parse(&text).unwrap();
}

#[test]
fn group_with_missing_or_foreign_account_is_reported() {
    let text = BASE.replace(
        "accounts = [\"a1\", \"a2\"]",
        "accounts = [\"a1\", \"ghost\", \"o1\", \"a1\"]",
    );
    let errs = errors(&text);
    assert_eq!(
        locations(&errs),
        [
            "groups[0].accounts[1]",
            "groups[0].accounts[2]",
            "groups[0].accounts[3]"
        ],
        "{errs}"
    );
    assert!(
        errs.issues()[1].message.contains("belongs to org `other`"),
        "{errs}"
    );
}

#[test]
fn weights_outside_1_to_100_are_reported() {
    for bad in ["0", "101", "-3"] {
        let errs = errors(&BASE.replace("weight = 5", &format!("weight = {bad}")));
        assert_eq!(locations(&errs), ["accounts[1].weight"], "{errs}");
    }
    for good in ["1", "100"] {
        parse(&BASE.replace("weight = 5", &format!("weight = {good}"))).unwrap();
    }
}

#[test]
fn thresholds_outside_0_to_1_are_reported() {
    let text = BASE.replace("weight = 5", "window_threshold = 1.5")
        + "[server]\nhedge_budget = -0.1\ndefault_window_threshold = 2.0\n";
    let errs = errors(&text);
    assert_eq!(
        locations(&errs),
        [
            "server.hedge_budget",
            "server.default_window_threshold",
            "accounts[1].window_threshold"
        ],
        "{errs}"
    );
    let nan = BASE.replace("weight = 5", "window_threshold = nan");
    assert_eq!(locations(&errors(&nan)), ["accounts[1].window_threshold"]);
}

#[test]
fn malformed_hashes_are_reported() {
    for bad in [
        "abc",
        &"g".repeat(64),
        &"a".repeat(63),
        &"a".repeat(65),
        "sk-lb-SECRET-VALUE-abcdefghijklmnopqrstuvwxyz0123456789",
    ] {
        let errs = errors(&BASE.replace(HASH_A, bad));
        assert_eq!(locations(&errs), ["keys[0].sha256"], "{bad}: {errs}");
    }
    let _ = HASH_B;
}

#[test]
fn unknown_strategy_provider_auth_and_kind_are_reported() {
    let text = BASE
        .replace("strategy = \"weighted\"", "strategy = \"fastest\"")
        .replace("auth = \"oauth\"", "auth = \"password\"")
        .replace("kind = \"user\"", "kind = \"robot\"")
        .replacen("provider = \"anthropic\"", "provider = \"gemini\"", 1);
    let errs = errors(&text);
    assert_eq!(
        locations(&errs),
        [
            "accounts[0].provider",
            "accounts[1].auth",
            "groups[0].strategy",
            "keys[0].kind"
        ],
        "{errs}"
    );
    assert!(errs.issues()[2].message.contains("`round_robin`"), "{errs}");
}

/// Issue 23: `provider = "openai"` takes `api_key` and needs a `base_url`.
#[test]
fn openai_accounts_need_an_api_key_and_a_base_url() {
    let openai = BASE.replacen(
        "provider = \"anthropic\"\nauth = \"api_key\"\nsecret = \"sk-ant-SECRET-VALUE-1\"",
        "provider = \"openai\"\nauth = \"api_key\"\nsecret = \"sk-SECRET-VALUE-1\"\nbase_url = \"https://api.openai.com\"",
        1,
    );
    let c = parse(&openai).unwrap();
    assert_eq!(c.account("a1").unwrap().provider(), Provider::OpenAi);
    let no_base = openai.replace("base_url = \"https://api.openai.com\"\n", "");
    let errs = errors(&no_base);
    assert_eq!(locations(&errs), ["accounts[0].base_url"], "{errs}");
    assert!(
        errs.to_string().contains("OpenAI Chat Completions"),
        "{errs}"
    );
    let oauth = openai.replacen("auth = \"api_key\"", "auth = \"oauth\"", 1);
    assert_eq!(locations(&errors(&oauth)), ["accounts[0].auth"]);
}

#[test]
fn unsupported_provider_auth_combination_is_reported() {
    let errs = errors(&BASE.replace("auth = \"oauth\"", "auth = \"bearer\""));
    assert_eq!(locations(&errs), ["accounts[1].auth"], "{errs}");
}

#[test]
fn unset_env_secret_is_reported_by_name_only() {
    let errs = errors(&BASE.replace("$ACME_TOKEN", "$NOT_SET_ANYWHERE"));
    assert_eq!(locations(&errs), ["accounts[1].secret"]);
    assert!(
        errs.issues()[0]
            .message
            .contains("`NOT_SET_ANYWHERE` is not set"),
        "{errs}"
    );
}

#[test]
fn unknown_org_everywhere_is_reported() {
    let text = BASE.to_owned()
        + r#"
[[accounts]]
id = "z"
org = "nope"
provider = "anthropic"
auth = "api_key"
secret = "x"
[[groups]]
id = "zg"
org = "nope"
accounts = ["a1"]
[[urls]]
custom_url = "z"
org = "nope"
[[keys]]
id = "kz"
org = "nope"
kind = "user"
sha256 = "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9"
urls = ["*"]
"#;
    let errs = errors(&text);
    let locs = locations(&errs);
    for expected in [
        "accounts[3].org",
        "groups[1].org",
        "urls[2].org",
        "keys[1].org",
    ] {
        assert!(locs.contains(&expected), "missing {expected} in {errs}");
    }
}

#[test]
fn key_naming_an_unknown_url_is_reported() {
    let errs = errors(&BASE.replace("urls = [\"team\"]", "urls = [\"team\", \"nowhere\"]"));
    assert_eq!(locations(&errs), ["keys[0].urls[1]"], "{errs}");
    // a URL of another org is unknown too
    let text = BASE.replace("urls = [\"team\"]", "urls = [\"elsewhere\"]")
        + "[[urls]]\ncustom_url = \"elsewhere\"\norg = \"other\"\n";
    assert_eq!(locations(&errors(&text)), ["keys[0].urls[0]"]);
    assert_eq!(
        locations(&errors(
            &BASE.replace("urls = [\"team\"]", "urls = [\"*\", \"team\"]")
        )),
        ["keys[0].urls"]
    );
}

#[test]
fn url_naming_a_missing_group_is_reported() {
    let errs = errors(&BASE.replace("group = \"g\"", "group = \"nogroup\""));
    assert_eq!(locations(&errs), ["urls[0].group"], "{errs}");
}

#[test]
fn missing_required_fields_and_wrong_types_are_located() {
    let text = BASE
        .replace("secret = \"sk-ant-SECRET-VALUE-2\"", "")
        .replace("weight = 5", "weight = \"heavy\"");
    let errs = errors(&text);
    let locs = locations(&errs);
    assert!(locs.contains(&"accounts[2].secret"), "{errs}");
    assert!(locs.iter().any(|l| l.starts_with("accounts[1]")), "{errs}");
}

#[test]
fn server_settings_out_of_range_are_reported() {
    let text = BASE.to_owned()
        + "[server]\nlisten = \"not an address\"\nupstream_timeout_secs = 0\nstream_commit = \"later\"\npassthrough_statuses = [429, 200]\nlegacy_routes_until = \"2026-02-30\"\n";
    let errs = errors(&text);
    assert_eq!(
        locations(&errs),
        [
            "server.listen",
            "server.stream_commit",
            "server.passthrough_statuses[1]",
            "server.legacy_routes_until",
            "server.upstream_timeout_secs"
        ],
        "{errs}"
    );
}

#[test]
fn all_problems_are_reported_at_once() {
    let text = BASE
        .replace("weight = 5", "weight = 500")
        .replace("strategy = \"weighted\"", "strategy = \"x\"")
        .replace(HASH_A, "zz");
    assert_eq!(errors(&text).issues().len(), 3);
}

#[test]
fn env_overrides_beat_the_file() {
    let text = BASE.to_owned() + "[server]\nupstream_timeout_secs = 10\nlisten = \"127.0.0.1:1\"\n";
    let env = |name: &str| -> Option<String> {
        match name {
            "ACME_TOKEN" => Some("t".into()),
            "UPSTREAM_TIMEOUT" => Some("42".into()),
            "AUTO_DISABLE_ON_ERROR" => Some("false".into()),
            "REDIS_URL" => Some("redis://127.0.0.1:6390".into()),
            "KEYPOOL_LISTEN" => Some("0.0.0.0:9999".into()),
            "KEYPOOL_ADMIN_TOKEN" => Some("admintok".into()),
            _ => None,
        }
    };
    let c = Config::from_toml_str(&text, None, &env).unwrap();
    assert_eq!(c.server().upstream_timeout_ms, 42_000);
    assert!(!c.server().auto_disable_on_error);
    assert_eq!(
        c.server().redis_url.as_ref().unwrap().expose(),
        "redis://127.0.0.1:6390"
    );
    assert_eq!(c.server().listen.to_string(), "0.0.0.0:9999");
    assert_eq!(c.admin().token.as_ref().unwrap().expose(), "admintok");
}

#[test]
fn bad_env_override_is_reported_by_variable() {
    let env = |name: &str| -> Option<String> {
        match name {
            "ACME_TOKEN" => Some("t".into()),
            "UPSTREAM_TIMEOUT" => Some("soon".into()),
            "KEYPOOL_LISTEN" => Some("nowhere".into()),
            _ => None,
        }
    };
    let errs = Config::from_toml_str(BASE, None, &env).unwrap_err();
    assert_eq!(
        locations(&errs),
        ["env UPSTREAM_TIMEOUT", "server.listen"],
        "{errs}"
    );
}

#[test]
fn redis_url_problems_never_show_the_url() {
    let text = BASE.to_owned() + "[server]\nredis_url = \"http://user:SECRET-VALUE@host\"\n";
    assert_eq!(locations(&errors(&text)), ["server.redis_url"]);
}

#[test]
fn redis_url_takes_a_server_a_sentinel_or_a_cluster_and_says_what_is_supported_otherwise() {
    let with = |url: &str| BASE.to_owned() + &format!("[server]\nredis_url = {url:?}\n");
    for ok in [
        "redis://127.0.0.1:6379/",
        "redis://redis.internal",
        "redis://:SECRET-VALUE@10.0.0.7:6380/3",
        "redis://user:SECRET-VALUE@[::1]:6379/0",
        // issue 21: Sentinel and Cluster, behind the reply guard like one server
        "redis-cluster://:SECRET-VALUE@a:7000?node=b:7001&node=c:7002",
        "redis-cluster://a:7000",
        "redis-sentinel://a:26379/0?sentinelServiceName=mymaster",
        "redis-sentinel://:SECRET-VALUE@a:26379/2?sentinelServiceName=mymaster&node=b:26379&sentinelPassword=SECRET-VALUE",
    ] {
        let c = parse(&with(ok)).unwrap_or_else(|e| panic!("{ok} refused: {e}"));
        assert!(c.server().redis_url.is_some());
    }
    // each refused form: the message names what is not supported and the forms that are
    for (url, names) in [
        ("rediss://:SECRET-VALUE@redis.internal:6380/0", "TLS"),
        ("rediss-cluster://:SECRET-VALUE@a:7000", "TLS"),
        ("valkeys://redis.internal:6380", "TLS"),
        ("redis+unix:///run/redis.sock", "Unix sockets"),
        ("unix:///run/redis.sock", "Unix sockets"),
        (
            "redis-sentinel://:SECRET-VALUE@a:26379/0",
            "needs ?sentinelServiceName=",
        ),
        (
            "redis://:SECRET-VALUE@a:26379/0?sentinelServiceName=mymaster",
            "redis-sentinel://",
        ),
        ("http://user:SECRET-VALUE@host", "redis-cluster:// URL"),
        ("redis://:SECRET-VALUE@host:notaport/0", "not a valid"),
        ("redis://:SECRET-VALUE@host/a/b", "not a valid"),
        ("redis-cluster://:SECRET-VALUE@a:7000?node=b", "not a valid"),
    ] {
        let errs = errors(&with(url));
        assert_eq!(locations(&errs), ["server.redis_url"], "{url}");
        let message = errs.to_string();
        assert!(message.contains(names), "{url}: {message}");
        for form in [
            "redis://[[user]:password@]host[:port][/db]",
            "redis-sentinel://",
            "redis-cluster://",
        ] {
            assert!(message.contains(form), "{url}: {message}");
        }
    }
}

#[test]
fn relative_state_file_is_anchored_at_the_config_folder() {
    let c = Config::from_toml_str(BASE, Some(std::path::Path::new("/etc/keypool")), &env).unwrap();
    assert_eq!(
        c.server().state_file.as_deref(),
        Some(std::path::Path::new("/etc/keypool/keypool-state.json"))
    );
    let off = BASE.to_owned() + "[server]\nstate_file = \"\"\n";
    assert_eq!(
        Config::from_toml_str(&off, Some(std::path::Path::new("/etc/keypool")), &env)
            .unwrap()
            .server()
            .state_file,
        None
    );
    // parsed from text with no folder: no default file (nothing written to the cwd)
    assert_eq!(parse(BASE).unwrap().server().state_file, None);
    let explicit = BASE.to_owned() + "[server]\nstate_file = \"s.json\"\n";
    assert_eq!(
        parse(&explicit).unwrap().server().state_file.as_deref(),
        Some(std::path::Path::new("s.json"))
    );
}

#[test]
fn orphan_url_with_a_group_and_bad_or_reserved_names_are_reported() {
    let text = BASE.to_owned()
        + "[[urls]]\ncustom_url = \"legacy\"\ngroup = \"g\"\n[[urls]]\ncustom_url = \"admin\"\norg = \"acme\"\n[[urls]]\ncustom_url = \"a/b\"\norg = \"acme\"\n[[groups]]\nid = \"*\"\norg = \"acme\"\naccounts = [\"a1\"]\n";
    assert_eq!(
        locations(&errors(&text)),
        [
            "groups[1].id",
            "urls[2].group",
            "urls[3].custom_url",
            "urls[4].custom_url"
        ]
    );
}

#[test]
fn load_reads_the_file_and_names_it_in_errors() {
    let err = Config::load(std::path::Path::new("/nonexistent/keypool.toml")).unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/keypool.toml"),
        "{err}"
    );
}

#[test]
fn cooldown_table_feeds_the_cooldown_books_and_server_switches_win() {
    let text = BASE.to_owned()
        + "[server]\nauto_disable_on_error = false\ndefault_window_threshold = 0.8\ncircuit_breaker = true\n[cooldown]\nrate_limit_ms = 30000\n";
    let c = parse(&text).unwrap();
    let s = c.cooldown().settings();
    assert_eq!(s.rate_limit_ms, 30_000);
    assert!(!s.auto_disable_on_error);
    assert_eq!(s.window_threshold, 0.8);
    assert!(s.breaker.enabled);
    assert_eq!(
        parse(BASE).unwrap().cooldown().settings().rate_limit_ms,
        60_000
    );
}

#[test]
fn cooldown_table_problems_are_located() {
    let text = BASE.to_owned()
        + "[cooldown]\nauto_disable_on_error = false\nrate_limitt_ms = 1\n[cooldown.breaker]\nenabled = true\n";
    let errs = errors(&text);
    let locs = locations(&errs);
    for expected in [
        "cooldown.auto_disable_on_error",
        "cooldown.breaker.enabled",
        "cooldown.rate_limitt_ms",
    ] {
        assert!(locs.contains(&expected), "missing {expected} in {errs}");
    }
}

mod properties {
    use keypool_store::config::{KeyHash, Threshold, Weight};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn weight_accepts_exactly_1_to_100(w in any::<i64>()) {
            prop_assert_eq!(Weight::try_new(w).is_some(), (1..=100).contains(&w));
            if let Some(weight) = Weight::try_new(w) {
                prop_assert_eq!(i64::from(weight.get()), w);
            }
        }

        #[test]
        fn threshold_accepts_exactly_0_to_1(t in any::<f64>()) {
            prop_assert_eq!(Threshold::try_new(t).is_some(), (0.0..=1.0).contains(&t));
        }

        #[test]
        fn key_hash_hex_round_trips(bytes in any::<[u8; 32]>()) {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let hash = KeyHash::from_hex(&hex).unwrap();
            prop_assert_eq!(hash.as_bytes(), &bytes);
            prop_assert_eq!(hash.to_hex(), hex.clone());
            prop_assert_eq!(KeyHash::from_hex(&hex.to_uppercase()), Some(hash));
        }

        #[test]
        fn key_hash_rejects_anything_but_64_hex_chars(s in "\\PC{0,80}") {
            let valid = s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
            prop_assert_eq!(KeyHash::from_hex(&s).is_some(), valid);
        }
    }
}

#[test]
fn wrong_type_message_names_the_field_without_quoting_the_value() {
    let errs = errors(&BASE.replace("weight = 5", "weight = \"SECRET-VALUE-heavy\""));
    assert_eq!(errs.issues().len(), 1, "{errs}");
    let issue = &errs.issues()[0];
    assert_eq!(issue.location, "accounts[1].weight", "{errs}");
    assert_eq!(issue.message, "invalid type: a string, expected i64");
    let errs =
        errors(&(BASE.to_owned() + "[server]\nauto_disable_on_error = \"yes\"\nlisten = 8080\n"));
    let mut locs = locations(&errs);
    locs.sort_unstable();
    assert_eq!(
        locs,
        ["server.auto_disable_on_error", "server.listen"],
        "{errs}"
    );
}

/// Every validation error class of `golden/every_error.toml` at once: the located
/// errors, their texts and their order are pinned in `golden/every_error.txt`
/// (`KEYPOOL_BLESS=1` rewrites it for review). A refactoring of the validation must
/// leave this file unchanged; no secret appears in it.
#[test]
fn every_error_is_reported_in_order() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let text = std::fs::read_to_string(dir.join("every_error.toml")).unwrap();
    let errs = errors(&text);
    let actual: String = errs
        .issues()
        .iter()
        .map(|i| format!("{}: {}\n", i.location, i.message))
        .collect();
    let path = dir.join("every_error.txt");
    if std::env::var("KEYPOOL_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        actual, expected,
        "run with KEYPOOL_BLESS=1 to review a change"
    );
}

#[test]
fn a_dormant_account_may_name_an_unset_secret_and_an_active_one_may_not() {
    let text = "[[orgs]]\nslug = \"a\"\n[[orgs]]\nslug = \"gone\"\nsuspended = true\n\
        [[accounts]]\nid = \"off\"\norg = \"a\"\nprovider = \"anthropic\"\nauth = \"api_key\"\nsecret = \"$UNSET_1\"\nactive = false\n\
        [[accounts]]\nid = \"suspended\"\norg = \"gone\"\nprovider = \"anthropic\"\nauth = \"api_key\"\nsecret = \"$UNSET_2\"\n\
        [[accounts]]\nid = \"on\"\norg = \"a\"\nprovider = \"anthropic\"\nauth = \"api_key\"\nsecret = \"$UNSET_3\"\n";
    let errs = errors(text);
    let issues: Vec<String> = errs.issues().iter().map(ToString::to_string).collect();
    assert_eq!(
        issues,
        [
            "accounts[2].secret: environment variable `UNSET_3` is not set; export it or write the secret in the file"
        ]
    );
    // a malformed name is still an error, dormant or not
    let malformed = text
        .replace("$UNSET_1", "$1BAD")
        .replace("$UNSET_3", "literal");
    let issues: Vec<String> = errors(&malformed)
        .issues()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert!(issues[0].starts_with("accounts[0].secret:"), "{issues:?}");
}

#[test]
fn proxy_urls_are_checked_with_a_location_and_never_quoted() {
    let account = |url: &str| {
        format!(
            "[[orgs]]\nslug = \"a\"\n[[accounts]]\nid = \"x\"\norg = \"a\"\nprovider = \"anthropic\"\n\
             auth = \"api_key\"\nsecret = \"k\"\nproxy_url = {url:?}\n"
        )
    };
    for good in [
        "http://proxy.internal:3128",
        "socks5://127.0.0.1:1080",
        "socks5h://u:p@proxy:1080/",
        "http://[::1]:8080",
    ] {
        let c = Config::from_toml_str(&account(good), None, &|_| None)
            .unwrap_or_else(|e| panic!("{good}: {e}"));
        assert_eq!(c.account("x").unwrap().proxy_url().unwrap().expose(), good);
    }
    for (bad, why) in [
        (
            "https://user:hunter2@proxy:443",
            "a TLS (https://) proxy is not supported",
        ),
        (
            "ftp://hunter2@proxy:21",
            "proxy_url's scheme must be http, socks5 or socks5h",
        ),
        ("http://hunter2@proxy", "proxy_url needs a port (host:port)"),
        (
            "http://proxy:3128/path?hunter2",
            "proxy_url must not have a path or query",
        ),
        (
            "socks5://proxy:99999",
            "proxy_url's port is not a number between 1 and 65535",
        ),
        ("proxy:3128", "proxy_url has no scheme"),
    ] {
        let errs = errors(&account(bad));
        let issue = &errs.issues()[0];
        assert_eq!(issue.location, "accounts[0].proxy_url", "{bad}");
        assert!(issue.message.starts_with(why), "{bad}: {}", issue.message);
        assert!(
            !issue.to_string().contains("hunter2"),
            "the value was quoted: {issue}"
        );
    }
}

#[test]
fn listeners_and_tls_files_are_checked() {
    let c = Config::from_toml_str(
        "[server]\nlisten = \"0.0.0.0:8080\"\nadmin_listen = \"127.0.0.1:9090\"\ntls_cert_file = \"c.pem\"\ntls_key_file = \"/k.pem\"\n",
        Some(std::path::Path::new("/etc/keypool")),
        &|_| None,
    )
    .unwrap();
    assert_eq!(
        c.server().admin_listen,
        Some("127.0.0.1:9090".parse().unwrap())
    );
    let tls = c.server().tls.as_ref().unwrap();
    assert_eq!(tls.cert, std::path::Path::new("/etc/keypool/c.pem"));
    assert_eq!(tls.key, std::path::Path::new("/k.pem"));
    for (text, location) in [
        (
            "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:1\"\n",
            "server.admin_listen",
        ),
        ("[server]\nadmin_listen = \"nine\"\n", "server.admin_listen"),
        (
            "[server]\ntls_cert_file = \"c.pem\"\n",
            "server.tls_key_file",
        ),
        (
            "[server]\ntls_key_file = \"k.pem\"\n",
            "server.tls_cert_file",
        ),
    ] {
        let errs = errors(text);
        assert_eq!(errs.issues()[0].location, location, "{text}");
    }
    // KEYPOOL_ADMIN_LISTEN overrides
    let env = |name: &str| (name == "KEYPOOL_ADMIN_LISTEN").then(|| "127.0.0.1:9999".to_owned());
    let c = Config::from_toml_str("", None, &env).unwrap();
    assert_eq!(
        c.server().admin_listen,
        Some("127.0.0.1:9999".parse().unwrap())
    );
}

/// SPEC 12: `[keys.limits]` and `[orgs.limits]`, each problem at its location.
#[test]
fn limit_problems_are_located() {
    let text = BASE
        .replace(
            "slug = \"acme\"\n",
            "slug = \"acme\"\nlimits = { usd_per_month = -1.0, burst = 3, tokens_per_day = 0 }\n",
        )
        .replace(
            "urls = [\"team\"]\n",
            "urls = [\"team\"]\nlimits = { models = [], deny_models = [\"\"], requests_per_minute = 0, max_concurrent = -2, usd_per_day = 1e12 }\n",
        );
    let errs = errors(&text);
    let issues: Vec<String> = errs.issues().iter().map(ToString::to_string).collect();
    let located: Vec<&str> = locations(&errs);
    for loc in [
        "orgs[0].limits.usd_per_month",
        "orgs[0].limits.burst",
        "orgs[0].limits.tokens_per_day",
        "keys[0].limits.models",
        "keys[0].limits.deny_models[0]",
        "keys[0].limits.requests_per_minute",
        "keys[0].limits.max_concurrent",
        "keys[0].limits.usd_per_day",
    ] {
        assert!(located.contains(&loc), "{loc} missing from {issues:#?}");
    }
    assert_eq!(located.len(), 8, "{issues:#?}");
    // A table that does not parse is reported field by field.
    let text = BASE.replace(
        "urls = [\"team\"]\n",
        "urls = [\"team\"]\nlimits = { max_concurrent = 1.5, colour = \"red\" }\n",
    );
    let errs = errors(&text);
    assert_eq!(
        locations(&errs),
        ["keys[0].limits.colour", "keys[0].limits.max_concurrent"]
    );
    let burst = issues
        .iter()
        .find(|i| i.starts_with("orgs[0].limits.burst"))
        .unwrap();
    assert!(burst.contains("needs requests_per_minute"), "{burst}");
}

/// A key's own limit wins over its org's; the org's `usd_per_month` is the team
/// budget, not a default of each key; `burst` defaults to the rate.
#[test]
fn key_limits_win_over_the_orgs_and_the_team_budget_is_the_orgs() {
    let text = BASE
        .replace(
            "slug = \"acme\"\n",
            "slug = \"acme\"\nlimits = { requests_per_minute = 10, usd_per_day = 5.0, usd_per_month = 100.0, models = [\"claude-*\"] }\n",
        )
        .replace(
            "urls = [\"team\"]\n",
            "urls = [\"team\"]\nlimits = { requests_per_minute = 60, burst = 7, max_concurrent = 2 }\n",
        );
    let config = parse(&text).unwrap();
    let key = config.lb_key_by_id("k1").unwrap();
    let limits = key.limits().unwrap();
    assert_eq!(
        limits.rate,
        Some(keypool_ledger::Rate {
            per_minute: 60,
            burst: 7
        })
    );
    assert_eq!(limits.max_concurrent, Some(2));
    assert_eq!(limits.usd_per_day, Some(5_000_000_000));
    assert_eq!(limits.usd_per_month, None, "the org's is the team budget");
    assert_eq!(limits.models.len(), 1);
    assert_eq!(
        config.org("acme").unwrap().team_usd_per_month(),
        Some(100_000_000_000)
    );
    let org_only = BASE.replace(
        "slug = \"acme\"\n",
        "slug = \"acme\"\nlimits = { requests_per_minute = 10 }\n",
    );
    let config = parse(&org_only).unwrap();
    let limits = config.lb_key_by_id("k1").unwrap().limits().unwrap().clone();
    assert_eq!(
        limits.rate,
        Some(keypool_ledger::Rate {
            per_minute: 10,
            burst: 10
        })
    );
    assert!(
        parse(BASE)
            .unwrap()
            .lb_key_by_id("k1")
            .unwrap()
            .limits()
            .is_none()
    );
}

#[test]
fn limits_fail_mode_takes_open_or_closed() {
    let with = |v: &str| format!("[server]\nlimits_fail_mode = {v:?}\n{BASE}");
    assert_eq!(
        parse(&with("closed")).unwrap().server().limits_fail_mode,
        keypool_store::config::LimitsFailMode::Closed
    );
    assert_eq!(
        parse(BASE).unwrap().server().limits_fail_mode,
        keypool_store::config::LimitsFailMode::Open
    );
    let errs = errors(&with("ajar"));
    assert_eq!(locations(&errs), ["server.limits_fail_mode"]);
}

/// SPEC 13: `config_store` takes `file` (the default) or `redis`, which needs `redis_url`.
#[test]
fn config_store_takes_file_or_redis_and_redis_needs_a_url() {
    use keypool_store::config::ConfigStore;
    let with = |lines: &str| format!("[server]\n{lines}\n{BASE}");
    let redis = with("config_store = \"redis\"\nredis_url = \"redis://127.0.0.1:6379\"");
    assert_eq!(
        parse(&redis).unwrap().server().config_store,
        ConfigStore::Redis
    );
    assert_eq!(
        parse(BASE).unwrap().server().config_store,
        ConfigStore::File
    );
    let errs = errors(&with("config_store = \"redis\""));
    assert_eq!(locations(&errs), ["server.config_store"]);
    assert!(
        errs.issues()[0].to_string().contains("set redis_url"),
        "{errs}"
    );
    let errs = errors(&with("config_store = \"etcd\""));
    assert_eq!(locations(&errs), ["server.config_store"]);
}

/// SPEC 13: `check-config` flags secrets that load but cannot work, at their location,
/// without quoting them.
#[test]
fn secrets_that_cannot_work_are_flagged_without_being_shown() {
    let account = |i: usize, auth: &str, secret: &str| {
        format!(
            "[[accounts]]\nid = \"s{i}\"\norg = \"acme\"\nprovider = \"anthropic\"\nauth = \"{auth}\"\nsecret = \"{secret}\"\n"
        )
    };
    let text = format!(
        "[[orgs]]\nslug = \"acme\"\n{}{}{}{}{}",
        account(0, "api_key", "sk-ant-api03-GOOD-ONE"),
        account(1, "api_key", "sk-ant-api03-TRAILING\\n"),
        account(2, "api_key", "sk-ant-oat01-WRONG-KIND"),
        account(3, "oauth", "sk-ant-api03-WRONG-KIND-TOO"),
        account(4, "api_key", "sk-ant-api03-…"),
    );
    let config = parse(&text).unwrap();
    let warnings: Vec<String> = config.warnings().iter().map(ToString::to_string).collect();
    let locations: Vec<&str> = config
        .warnings()
        .iter()
        .map(|w| w.location.as_str())
        .collect();
    assert_eq!(
        locations,
        [
            "accounts[1].secret",
            "accounts[2].secret",
            "accounts[3].secret",
            "accounts[4].secret"
        ],
        "{warnings:#?}"
    );
    assert!(warnings[1].contains("OAuth access token (sk-ant-oat…) on an api_key account"));
    for w in &warnings {
        assert!(!w.contains("TRAILING") && !w.contains("WRONG"), "{w}");
    }
    assert!(parse(BASE).unwrap().warnings().is_empty());
}

/// SPEC 14: `refresh_token` and `expires_at` on `oauth` accounts, `[oauth]` with its
/// defaults; every problem located, no secret shown.
#[test]
fn oauth_refresh_fields_and_the_oauth_table_are_validated() {
    let account = |lines: &str| {
        format!(
            "[[orgs]]\nslug = \"acme\"\n\n[[accounts]]\nid = \"max\"\norg = \"acme\"\nprovider = \"anthropic\"\n{lines}\n"
        )
    };
    let ok = parse(&account(
        "auth = \"oauth\"\nsecret = \"sk-ant-oat01-A\"\nrefresh_token = \"sk-ant-ort01-R\"\nexpires_at = 1798761599",
    ))
    .unwrap();
    let seed = ok.account("max").unwrap().oauth().unwrap();
    assert_eq!(seed.refresh_token.expose(), "sk-ant-ort01-R");
    assert_eq!(seed.expires_at_ms, Some(1_798_761_599_000));
    assert!(!format!("{seed:?}").contains("sk-ant-ort01-R"));
    assert_eq!(
        ok.oauth().token_url,
        keypool_store::config::DEFAULT_TOKEN_URL
    );
    assert_eq!(ok.oauth().refresh_lead_ms, 300_000);
    let on_api_key = errors(&account(
        "auth = \"api_key\"\nsecret = \"sk-ant-api03-A\"\nrefresh_token = \"sk-ant-ort01-R\"",
    ));
    assert_eq!(locations(&on_api_key), ["accounts[0].refresh_token"]);
    assert!(!on_api_key.to_string().contains("sk-ant-ort01-R"));
    let millis = errors(&account(
        "auth = \"oauth\"\nsecret = \"a\"\nrefresh_token = \"r\"\nexpires_at = 1798761599000",
    ));
    assert_eq!(locations(&millis), ["accounts[0].expires_at"]);
    assert!(millis.to_string().contains("milliseconds"), "{millis}");
    let alone = errors(&account(
        "auth = \"oauth\"\nsecret = \"a\"\nexpires_at = 1798761599",
    ));
    assert_eq!(locations(&alone), ["accounts[0].expires_at"]);
    let table = errors(&format!(
        "[oauth]\ntoken_url = \"ftp://x\"\nclient_id = \"\"\nrefresh_lead_secs = 99999\n{BASE}"
    ));
    assert_eq!(
        locations(&table),
        [
            "oauth.token_url",
            "oauth.client_id",
            "oauth.refresh_lead_secs"
        ]
    );
    let set = parse(&format!(
        "[oauth]\ntoken_url = \"http://127.0.0.1:9/v1/oauth/token\"\nclient_id = \"c\"\nrefresh_lead_secs = 1\n{BASE}"
    ))
    .unwrap();
    assert_eq!(
        (set.oauth().client_id.as_str(), set.oauth().refresh_lead_ms),
        ("c", 1000)
    );
}

#[test]
fn alerts_webhooks_have_defaults_and_their_url_is_a_secret() {
    use keypool_store::alerts::AlertKind;
    use keypool_store::config::AlertFormat;
    let text = format!(
        "{BASE}\n[alerts]\ndedup_secs = 60\n\n[[alerts.webhooks]]\nurl = \"$HOOK_URL\"\n\n\
         [[alerts.webhooks]]\nname = \"slack\"\nurl = \"https://hooks.slack.example/services/T/B/tok\"\n\
         format = \"slack\"\nevents = [\"pool_unavailable\", \"budget_reached\"]\ntimeout_ms = 2000\n"
    );
    let with_hook = |name: &str| match name {
        "HOOK_URL" => Some("http://127.0.0.1:9/hook".to_owned()),
        other => env(other),
    };
    let config = Config::from_toml_str(&text, None, &with_hook).unwrap();
    let alerts = config.alerts();
    assert_eq!(alerts.dedup_ms, 60_000);
    assert_eq!(alerts.retry_initial_ms, 1_000);
    assert_eq!(alerts.max_attempts, 8);
    assert_eq!(alerts.pool_unavailable_ms, 60_000);
    let [json, slack] = &alerts.webhooks[..] else {
        panic!("two webhooks: {alerts:?}")
    };
    assert_eq!(&*json.name, "0");
    assert_eq!(json.url.expose(), "http://127.0.0.1:9/hook");
    assert_eq!(json.format, AlertFormat::Json);
    assert_eq!(json.events, AlertKind::ALL);
    assert_eq!(json.timeout_ms, 5_000);
    assert_eq!(&*slack.name, "slack");
    assert_eq!(slack.format, AlertFormat::Slack);
    assert_eq!(
        slack.events,
        [AlertKind::PoolUnavailable, AlertKind::BudgetReached]
    );
    assert!(alerts.wants(AlertKind::AccountDisabled));
    let debug = format!("{config:?}");
    assert!(!debug.contains("/services/T/B/tok") && !debug.contains("127.0.0.1:9"));
    assert!(parse(BASE).unwrap().alerts().webhooks.is_empty());
}

/// SPEC 16: `[[restate]]` rules are validated element by element with located errors;
/// a valid rule is kept with its markers in lower case. `[cooldown]`'s SPEC 16 settings
/// and the watchdog's `[server]` settings are checked too.
#[test]
fn restate_rules_and_account_state_settings_are_validated_with_locations() {
    let good = format!(
        "{BASE}\n[[restate]]\nbase_url = \"https://gw.example.com*\"\nfrom_statuses = [403]\nmarkers = [\"Quota Exceeded\"]\nto_status = 429\nretry_after_ms = 60000\n"
    );
    let c = parse(&good).unwrap();
    let rule = &c.restate_rules()[0];
    assert_eq!(
        (rule.to_status, rule.markers[0].as_str()),
        (429, "quota exceeded")
    );

    let bad = format!(
        "{BASE}
[[restate]]
from_statuses = []
to_status = 200

[[restate]]
account = \"gw *\"
from_statuses = [403, 99]
markers = [\" \"]
to_status = 429
retry_after_ms = 0

[[restate]]
account = \"gw\"
from_statuses = [403]
to_status = 429
colour = \"red\"
"
    );
    let errs = errors(&bad);
    assert_eq!(
        locations(&errs),
        [
            "restate[2].colour",
            "restate[0].base_url",
            "restate[0].from_statuses",
            "restate[0].to_status",
            "restate[1].account",
            "restate[1].from_statuses",
            "restate[1].retry_after_ms",
            "restate[1].markers",
        ],
        "{errs}"
    );
    let text = errs.to_string();
    assert!(text.contains("set `base_url` or `account`"), "{text}");
    assert!(text.contains("99 is not an error status"), "{text}");

    let settings = format!(
        "{BASE}\n[cooldown]\nban_after_forbidden = 0\nmodel_lockout_ms = 100\nmodel_lockout_max_ms = 10\n"
    );
    assert_eq!(locations(&errors(&settings)), ["cooldown"]);
    let watchdog =
        format!("[server]\nstream_min_bytes_per_sec = -1\nstream_watchdog_window_ms = 0\n{BASE}");
    assert_eq!(
        locations(&errors(&watchdog)),
        [
            "server.stream_min_bytes_per_sec",
            "server.stream_watchdog_window_ms"
        ]
    );
}

/// Issue 24: `[[models]]` rules are validated with located errors: an unknown model in a
/// chain, an alias in a chain (what could form a cycle), a fallback with a fallback of
/// its own, weights that do not match the chain, an alias shadowing a model id.
#[test]
fn model_rules_are_validated_with_locations() {
    let good = format!(
        "{BASE}\n[[models]]\nalias = \"auto:high\"\nchain = [\"claude-opus-4-5\", \"claude-sonnet-4-5\"]\nweights = [90, 10]\n\n[[models]]\nmodel = \"claude-opus-*\"\nfallback = [\"claude-sonnet-4-5\"]\n"
    );
    let c = parse(&good).unwrap();
    let routes = c.model_routes();
    assert!(routes.is_alias("auto:high"));
    let (alias, order) = routes.order_for("claude-opus-4-1", "alice").unwrap();
    assert_eq!(
        (alias, order),
        (None, vec!["claude-opus-4-1", "claude-sonnet-4-5"])
    );
    assert!(routes.order_for("claude-sonnet-4-5", "alice").is_none());

    let bad = format!(
        "{BASE}
[[models]]
alias = \"auto:high\"
chain = [\"claude-opus-4-5\", \"claude-opuss-9\", \"auto:low\"]
weights = [1, 2]

[[models]]
alias = \"auto:low\"
chain = [\"claude-haiku-4-5\"]

[[models]]
alias = \"claude-sonnet-4-5\"
chain = [\"claude-haiku-4-5\"]

[[models]]
model = \"claude-opus-*\"
fallback = [\"claude-sonnet-4-5\"]

[[models]]
model = \"claude-sonnet-*\"
fallback = [\"claude-opus-4-5\"]

[[models]]
chain = [\"claude-haiku-4-5\"]
"
    );
    let errs = errors(&bad);
    assert_eq!(
        locations(&errs),
        [
            "models[0].chain[1]",
            "models[0].chain[2]",
            "models[0].weights",
            "models[2].alias",
            "models[3].fallback[0]",
            "models[4].fallback[0]",
            "models[5].alias",
        ],
        "{errs}"
    );
    let text = errs.to_string();
    assert!(text.contains("unknown model \"claude-opuss-9\""), "{text}");
    assert!(text.contains("is an alias"), "{text}");
    assert!(text.contains("shadows a real model id"), "{text}");
    assert!(text.contains("has a fallback of its own"), "{text}");
}
