//! Issue 21, what keypool tells its operators: a real scrape of `/metrics` with every
//! feature exercised (failover, a disabled, a cooling, an inactive and a capped
//! account, usage windows, streams, session affinity, reloads, health checks, a state
//! file, and Redis), checked against the Prometheus naming rules
//! (`keypool_tests::prometheus`); labels bounded by the configuration; the shipped
//! rules file and Grafana dashboard naming only metrics keypool really exports; and
//! the metrics table of `docs/OPERATIONS.md` listing exactly those families.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use keypool_core::Window;
use keypool_sim::{Behaviour, ErrorReply, Script, UnifiedHeaders};
use keypool_store::testing::{RedisServer, TempDir};
use keypool_tests::prometheus::{Scrape, metric_names_in, naming_problems};
use keypool_tests::{
    AccountSpec, Harness, HarnessBuilder, KEY, MODEL, message_body, workspace_root,
};
use yaml_rust2::YamlLoader;

/// The prefixes of every family keypool exports.
const PREFIXES: [&str; 2] = ["keypool_", "process_"];

/// Accounts of every state: revoked (401, disabled), limited (429, cooling), windowed
/// (serves, reports its windows), capped (`max_concurrent`), inactive.
fn pool() -> HarnessBuilder {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let windowed = Script::ok().unified(
        &UnifiedHeaders::allowed()
            .window(Window::FiveHour, 0.42, now + 2 * 3600, "allowed")
            .window(Window::Weekly, 0.87, now + 3 * 86_400, "allowed_warning"),
    );
    Harness::builder()
        .account(AccountSpec::new("revoked", Script::new(Behaviour::status(401))).priority(0))
        .account(
            AccountSpec::new(
                "limited",
                Script::new(ErrorReply::rate_limited().retry_after_secs(600)),
            )
            .priority(1),
        )
        .account(AccountSpec::new("windowed", windowed).priority(2))
        .account(
            AccountSpec::new("capped", Script::ok())
                .priority(3)
                .toml("max_concurrent = 2"),
        )
        .account(
            AccountSpec::new("inactive", Script::ok())
                .priority(4)
                .toml("active = false"),
        )
}

/// Exercises everything a request can touch, then scrapes.
async fn exercised_scrape(h: &Harness, dir: &TempDir) -> String {
    // one request walks revoked (401), limited (429) and windowed (200)
    let r = h.send_message().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.send_stream().await.status, 200);
    for _ in 0..2 {
        let r = h
            .messages(&message_body(MODEL, false))
            .header("x-session-id", "observability-session")
            .send()
            .await;
        assert_eq!(r.status, 200);
    }
    // an unknown org, a HEAD, the health routes
    let r = h
        .client()
        .post(h.url("/nope/team/v1/messages"))
        .api_key(&h.key(KEY))
        .json(&message_body(MODEL, false))
        .send()
        .await;
    assert_eq!(r.status, 404);
    for (method, path) in [
        ("HEAD", "/"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/nothing"),
    ] {
        let method: http::Method = method.parse().unwrap();
        h.client().request(method, h.url(path)).send().await;
    }
    // a reload applied and one rejected
    let good = dir.path().join("good.toml");
    std::fs::write(&good, h.toml()).unwrap();
    h.store().reload(&good).unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[server]\nlisten = 1\n").unwrap();
    assert!(h.store().reload(&bad).is_err());
    h.metrics().await
}

/// The scrape of a memory + state file harness, and of a Redis one when redis-server
/// can run (under `CI=true` it must).
/// Also the folder of the state file and the Redis server, which must outlive the
/// harnesses.
async fn scrapes() -> (Vec<(String, Harness)>, TempDir, Option<RedisServer>) {
    let dir = TempDir::new("observability").unwrap();
    let state = dir.path().join("state.json");
    // two serving threads, so that their balance's families are on /metrics too
    let h = pool()
        .server("state_file", &format!("{:?}", state.display().to_string()))
        .workers(2)
        .start()
        .await;
    let mut out = vec![(exercised_scrape(&h, &dir).await, h)];
    let redis = RedisServer::start_or_skip("observability");
    if let Some(redis) = &redis {
        let h = pool()
            .server("redis_url", &format!("{:?}", redis.url()))
            .start()
            .await;
        out.push((exercised_scrape(&h, &dir).await, h));
    }
    (out, dir, redis)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_follows_the_naming_rules_and_the_rules_file_names_only_real_metrics() {
    let (scrapes, _dir, _redis) = scrapes().await;
    let mut families = BTreeSet::new();
    let mut all = Scrape::default();
    for (text, _) in &scrapes {
        let scrape = Scrape::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let problems = naming_problems(&scrape, &PREFIXES);
        assert!(
            problems.is_empty(),
            "naming problems:\n{}",
            problems.join("\n")
        );
        // labels come from the configuration or from fixed names
        let accounts: BTreeSet<String> = ["revoked", "limited", "windowed", "capped", "inactive"]
            .map(String::from)
            .into();
        assert!(
            scrape.label_values("account").is_subset(&accounts),
            "{:?}",
            scrape.label_values("account")
        );
        assert!(
            scrape
                .label_values("org")
                .is_subset(&["acme".into(), "-".into()].into())
        );
        assert!(
            scrape
                .label_values("url")
                .is_subset(&["team".into(), "-".into()].into())
        );
        for sample in scrape.families.values().flat_map(|f| &f.samples) {
            for value in sample.labels.values() {
                assert!(!value.contains("sk-"), "a key in a label: {sample:?}");
            }
        }
        families.extend(scrape.families.keys().cloned());
        all.families.extend(scrape.families);
    }
    // what the exercised features must show
    for expected in [
        "keypool_account_upstream_requests_total{account=\"revoked\"} 1",
        "keypool_account_upstream_failures_total{account=\"revoked\",class=\"key_error\"} 1",
        "keypool_account_upstream_failures_total{account=\"limited\",class=\"rate_limit\"} 1",
        "keypool_account_window_utilization_ratio{account=\"windowed\",window=\"5h\"} 0.42",
        "keypool_account_window_utilization_ratio{account=\"windowed\",window=\"weekly\"} 0.87",
        "keypool_accounts_disabled 1",
        "keypool_accounts_inactive 1",
        "keypool_account_disabled{account=\"inactive\"} 0",
        "keypool_config_reloads_total{outcome=\"applied\"} 1",
        "keypool_config_reloads_total{outcome=\"rejected\"} 1",
        "keypool_internal_requests_total{route=\"head\",status=\"200\"} 1",
        "keypool_internal_requests_total{route=\"healthz\",status=\"200\"} 1",
        "keypool_internal_requests_total{route=\"other\",status=\"404\"} 1",
        "keypool_requests_total{org=\"-\",url=\"-\",status=\"404\"} 1",
        "keypool_requests_total{org=\"acme\",url=\"team\",status=\"200\"} 4",
        "keypool_build_info{version=\"0.1.0\",commit=\"unknown\"} 1",
    ] {
        assert!(
            scrapes[0].0.contains(expected),
            "no {expected:?} in\n{}",
            scrapes[0].0
        );
    }
    assert!(
        scrapes[0]
            .0
            .contains("keypool_account_cooldown_until_timestamp_seconds{account=\"limited\"} ")
    );
    assert!(scrapes[0].0.contains(
        "keypool_account_window_reset_timestamp_seconds{account=\"windowed\",window=\"5h\"} "
    ));
    for family in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "keypool_state_file_writable",
    ] {
        assert!(families.contains(family), "no {family}");
    }
    if scrapes.len() > 1 {
        assert!(
            scrapes[1].0.contains("keypool_redis_ready 1"),
            "{}",
            scrapes[1].0
        );
    }

    // the rules file and the dashboard name only exported metrics
    let rules_path = workspace_root().join("deploy/prometheus/keypool-rules.yaml");
    let rules_text = std::fs::read_to_string(&rules_path).unwrap();
    let rules = YamlLoader::load_from_str(&rules_text).unwrap();
    let mut exprs = Vec::new();
    for group in rules[0]["groups"].as_vec().unwrap() {
        for rule in group["rules"].as_vec().unwrap() {
            exprs.push(rule["expr"].as_str().unwrap().to_owned());
        }
    }
    assert!(exprs.len() >= 10, "{} rules", exprs.len());
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("deploy/grafana/keypool-dashboard.json"))
            .unwrap(),
    )
    .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    let mut named = BTreeSet::new();
    for expr in &exprs {
        for name in metric_names_in(expr, &PREFIXES) {
            assert!(all.exports(&name), "{name} (in `{expr}`) is not exported");
            named.insert(name);
        }
    }
    // the alerts cover the operator's main signals
    for family in [
        "keypool_account_disabled",
        "keypool_redis_ready",
        "keypool_state_file_writable",
        "keypool_config_reloads_total",
    ] {
        assert!(named.contains(family), "no rule or panel uses {family}");
    }

    // docs/OPERATIONS.md lists exactly the exported families
    let operations = std::fs::read_to_string(workspace_root().join("docs/OPERATIONS.md")).unwrap();
    let documented: BTreeSet<String> = operations
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_owned()))
        .filter(|name| PREFIXES.iter().any(|p| name.starts_with(p)))
        .collect();
    assert_eq!(
        documented.difference(&families).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "documented but not exported"
    );
    assert_eq!(
        families.difference(&documented).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "exported but not in docs/OPERATIONS.md's metrics table"
    );
    for (_, h) in scrapes {
        h.finish().await;
    }
}
