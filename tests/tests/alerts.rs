//! SPEC 15 end to end: webhooks receive the alerts of accounts disabled by the
//! upstream, of a pool mostly unavailable, of a caller's budget and of a rejected
//! reload, in JSON and in Slack format, each (event, subject) at most once per
//! `dedup_secs`. A receiver that hangs or answers 500 changes no request's status nor
//! its latency beyond a bound, and gets every pending alert once it answers 200 again.
//! The webhook URL (a secret) appears in no log line and no metric.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use keypool_core::AccountId;
use keypool_core::Window;
use keypool_sim::{Behaviour, ErrorReply, Script, UnifiedHeaders};
use keypool_tests::{AccountSpec, Harness, HarnessBuilder, LogLines, MODEL, message_body};
use serde_json::Value;

const ADMIN_TOKEN: &str = "alerts-admin-token-7c1e9b2d4f60";

use keypool_tests::webhook::{ANSWER, FAIL, HANG, Receiver};

fn of_event<'a>(bodies: &'a [Value], event: &str) -> Vec<&'a Value> {
    bodies.iter().filter(|b| b["event"] == event).collect()
}

/// `[alerts]` with one webhook at `url` (extra lines for the webhook appended).
fn alerts_toml(url: &str, settings: &str, webhook: &str) -> String {
    format!("[alerts]\n{settings}\n\n[[alerts.webhooks]]\nurl = \"{url}\"\n{webhook}\n")
}

/// The value of one series line of `/metrics`.
fn series(metrics: &str, line_start: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `revoked` answers 401 (disabled as a key error), `ok` answers.
fn revoked_then_ok() -> HarnessBuilder {
    Harness::builder()
        .account(AccountSpec::new("revoked", Script::new(Behaviour::status(401))).priority(0))
        .account(AccountSpec::new("ok", Script::ok()).priority(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_account_is_alerted_once_in_json_and_a_repeat_is_suppressed() {
    let receiver = Receiver::start().await;
    let h = revoked_then_ok()
        .extra_toml(&alerts_toml(&receiver.url("/hook"), "", "name = \"ops\""))
        .start()
        .await;
    assert_eq!(h.send_message().await.status, 200);
    let bodies = receiver
        .wait_for(Duration::from_secs(10), |b| !b.is_empty())
        .await;
    assert_eq!(bodies.len(), 1, "{bodies:#?}");
    let alert = &bodies[0];
    assert_eq!(alert["event"], "account_disabled");
    assert_eq!(
        alert["subject"],
        serde_json::json!({"account": "revoked", "org": "acme"})
    );
    assert_eq!(
        alert["reason"],
        "key_error: upstream answered 401 (auth_rejected)"
    );
    assert!(alert["at"].as_str().unwrap().ends_with('Z'), "{alert}");
    assert_eq!(alert["keypool"]["version"], env!("CARGO_PKG_VERSION"));

    // The same cause again within dedup_secs (600 s by default): not sent again.
    h.store().reenable(&AccountId::new("revoked"));
    assert_eq!(h.send_message().await.status, 200);
    let metrics = h.metrics().await;
    assert_eq!(
        series(
            &metrics,
            "keypool_alerts_suppressed_total{event=\"account_disabled\"}"
        ),
        1,
        "{metrics}"
    );
    assert_eq!(
        series(
            &metrics,
            "keypool_alerts_sent_total{event=\"account_disabled\",webhook=\"ops\"}"
        ),
        1,
        "{metrics}"
    );
    assert_eq!(receiver.bodies().len(), 1);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_out_of_credits_and_one_out_of_its_window_are_alerted() {
    let receiver = Receiver::start().await;
    let reset = keypool_store::now_ms() / 1000 + 3 * 3600;
    let exhausted = Script::new(ErrorReply::rate_limited().unified(
        &UnifiedHeaders::rejected(reset).window(Window::FiveHour, 1.0, reset, "rejected"),
    ));
    let h = Harness::builder()
        .account(AccountSpec::new("broke", Script::new(Behaviour::status(402))).priority(0))
        .account(AccountSpec::new("exhausted", exhausted).priority(1))
        .account(AccountSpec::new("ok", Script::ok()).priority(2))
        .extra_toml(&alerts_toml(&receiver.url("/hook"), "", ""))
        .start()
        .await;
    assert_eq!(h.send_message().await.status, 200);
    let bodies = receiver
        .wait_for(Duration::from_secs(10), |b| b.len() >= 2)
        .await;
    let credits = of_event(&bodies, "account_out_of_credits");
    assert_eq!(credits.len(), 1, "{bodies:#?}");
    assert_eq!(
        credits[0]["subject"],
        serde_json::json!({"account": "broke", "org": "acme"})
    );
    assert!(
        credits[0]["reason"].as_str().unwrap().contains("402"),
        "{bodies:#?}"
    );
    let window = of_event(&bodies, "account_out_of_window");
    assert_eq!(window.len(), 1, "{bodies:#?}");
    assert_eq!(
        window[0]["subject"],
        serde_json::json!({"account": "exhausted", "org": "acme"})
    );
    assert_eq!(
        window[0]["reason"],
        format!(
            "out of its 5h limit until {}",
            keypool_store::alerts::rfc3339(reset * 1000)
        )
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slack_webhook_gets_one_readable_line_and_only_its_events() {
    let receiver = Receiver::start().await;
    let h = revoked_then_ok()
        .key(
            "lim",
            "acme",
            "urls = [\"*\"]\nlimits = { tokens_per_day = 1 }",
        )
        .extra_toml(&alerts_toml(
            &receiver.url("/services/T0/B0/x"),
            "",
            "format = \"slack\"\nevents = [\"account_disabled\"]",
        ))
        .start()
        .await;
    // a budget refusal first: this webhook does not want it
    let r = h
        .client()
        .post(h.messages_url())
        .api_key(&h.key("lim"))
        .json(&message_body(MODEL, false))
        .send()
        .await;
    assert_eq!(r.status, 429);
    assert_eq!(h.send_message().await.status, 200);
    let bodies = receiver
        .wait_for(Duration::from_secs(10), |b| !b.is_empty())
        .await;
    assert_eq!(
        bodies,
        [
            serde_json::json!({"text": "keypool: account_disabled (account=revoked org=acme): key_error: upstream answered 401 (auth_rejected)"})
        ]
    );
    h.finish().await;
}

/// Sends `n` requests that are answered 200 and the budget refusal of `lim`, each
/// timed: the longest.
async fn longest_of(h: &Harness, n: usize) -> Duration {
    let mut longest = Duration::ZERO;
    for _ in 0..n {
        let t = Instant::now();
        assert_eq!(h.send_message().await.status, 200);
        let r = h
            .client()
            .post(h.messages_url())
            .api_key(&h.key("lim"))
            .json(&message_body(MODEL, false))
            .send()
            .await;
        assert_eq!(r.status, 429);
        longest = longest.max(t.elapsed());
    }
    longest
}

fn three_revoked(webhook: Option<&str>) -> HarnessBuilder {
    let mut b = Harness::builder()
        .account(AccountSpec::new("r1", Script::new(Behaviour::status(401))).priority(0))
        .account(AccountSpec::new("r2", Script::new(Behaviour::status(401))).priority(1))
        .account(AccountSpec::new("r3", Script::new(Behaviour::status(401))).priority(2))
        .account(AccountSpec::new("ok", Script::ok()).priority(3))
        .key(
            "lim",
            "acme",
            "urls = [\"*\"]\nlimits = { tokens_per_day = 1 }",
        );
    if let Some(url) = webhook {
        b = b.extra_toml(&alerts_toml(
            url,
            "retry_initial_ms = 200\nmax_attempts = 20",
            &format!("timeout_ms = 300\n\n[admin]\ntoken = \"{ADMIN_TOKEN}\""),
        ));
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_then_failing_receiver_slows_no_request_and_gets_its_alerts_once_it_recovers() {
    // the same traffic without alerts, for comparison
    let baseline = three_revoked(None).start().await;
    let without = longest_of(&baseline, 10).await;
    baseline.finish().await;

    let receiver = Receiver::start().await;
    receiver.set(HANG);
    let h = three_revoked(Some(&receiver.url("/hook"))).start().await;
    // the first request disables r1, r2 and r3 (three alerts), every one of them a
    // budget refusal too (one alert, then suppressed)
    let hanging = longest_of(&h, 10).await;
    assert!(
        hanging < Duration::from_millis(500) && hanging < without + Duration::from_millis(300),
        "requests took up to {hanging:?} with a hanging receiver ({without:?} without alerts)"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while receiver.attempts() < 2 {
        assert!(Instant::now() < deadline, "the sender never retried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    receiver.set(FAIL);
    let failing = longest_of(&h, 5).await;
    assert!(
        failing < Duration::from_millis(500),
        "requests took up to {failing:?} with a receiver answering 500"
    );
    let attempts = receiver.attempts();
    let deadline = Instant::now() + Duration::from_secs(10);
    while receiver.attempts() == attempts {
        assert!(
            Instant::now() < deadline,
            "no attempt while it answered 500"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(receiver.bodies().is_empty());

    receiver.set(ANSWER);
    let bodies = receiver
        .wait_for(Duration::from_secs(20), |b| b.len() >= 4)
        .await;
    let mut disabled: Vec<&str> = of_event(&bodies, "account_disabled")
        .iter()
        .map(|b| b["subject"]["account"].as_str().unwrap())
        .collect();
    disabled.sort_unstable();
    assert_eq!(disabled, ["r1", "r2", "r3"], "{bodies:#?}");
    let budget = of_event(&bodies, "budget_reached");
    assert_eq!(budget.len(), 1, "{bodies:#?}");
    assert_eq!(
        budget[0]["subject"],
        serde_json::json!({"org": "acme", "caller": "lim", "limit": "tokens_per_day"})
    );
    eprintln!(
        "longest request: {without:?} without alerts, {hanging:?} with the receiver hanging, {failing:?} with it answering 500"
    );
    let metrics = h.metrics().await;
    assert!(
        series(
            &metrics,
            "keypool_alerts_failed_total{event=\"account_disabled\",webhook=\"0\"}"
        ) >= 2,
        "{metrics}"
    );
    assert_eq!(
        series(
            &metrics,
            "keypool_alerts_sent_total{event=\"account_disabled\",webhook=\"0\"}"
        ),
        3,
        "{metrics}"
    );
    assert_eq!(
        series(
            &metrics,
            "keypool_alerts_dropped_total{reason=\"retries_exhausted\"}"
        ),
        0
    );

    // GET /admin/alerts: the webhook without its URL, each delivery sent, the first one
    // after its failed attempts
    let r = h.get("/admin/alerts").bearer(ADMIN_TOKEN).send().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!r.text().contains(&receiver.url("")), "{}", r.text());
    let view: Value = serde_json::from_str(&r.text()).unwrap();
    assert_eq!(
        view["webhooks"],
        serde_json::json!([{"name": "0", "format": "json", "events": keypool_store::alerts::AlertKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>(), "timeout_ms": 300}])
    );
    let listed = view["alerts"].as_array().unwrap();
    assert_eq!(listed.len(), 4, "{view:#}");
    for alert in listed {
        let deliveries = alert["deliveries"].as_array().unwrap();
        assert_eq!(deliveries.len(), 1, "{alert:#}");
        assert_eq!(deliveries[0]["webhook"], "0");
        assert_eq!(deliveries[0]["state"], "sent", "{alert:#}");
    }
    let oldest = &listed[listed.len() - 1];
    assert_eq!(oldest["event"], "account_disabled");
    assert!(
        oldest["deliveries"][0]["attempts"].as_u64().unwrap() >= 3,
        "{oldest:#}"
    );
    assert!(
        oldest["deliveries"][0]["last_error"].is_string(),
        "{oldest:#}"
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_reload_and_a_mostly_unavailable_pool_are_alerted() {
    let receiver = Receiver::start().await;
    let mut b = Harness::builder();
    for id in ["r1", "r2", "r3", "r4"] {
        b = b.account(AccountSpec::new(id, Script::new(Behaviour::status(401))).priority(0));
    }
    let h = b
        .account(AccountSpec::new("ok", Script::ok()).priority(1))
        .extra_toml(&alerts_toml(
            &receiver.url("/hook"),
            "pool_unavailable_secs = 1",
            "",
        ))
        .start()
        .await;
    // 4 of 5 accounts disabled: 80 % of the pool (and of the org's accounts)
    assert_eq!(h.send_message().await.status, 200);
    let bodies = receiver
        .wait_for(Duration::from_secs(10), |b| {
            of_event(b, "pool_unavailable").len() == 2
        })
        .await;
    let mut pools: Vec<&str> = of_event(&bodies, "pool_unavailable")
        .iter()
        .map(|b| b["subject"]["pool"].as_str().unwrap())
        .collect();
    pools.sort_unstable();
    assert_eq!(pools, ["acme/*", "acme/pool"]);
    assert_eq!(
        of_event(&bodies, "pool_unavailable")[0]["reason"]
            .as_str()
            .unwrap()
            .split(" since ")
            .next(),
        Some("4 of its 5 accounts unavailable")
    );

    let dir = keypool_store::testing::TempDir::new("alerts-reload").unwrap();
    let path = dir.path().join("keypool.toml");
    std::fs::write(&path, "[server]\nlisten = \"not an address\"\n").unwrap();
    assert!(h.store().reload(&path).is_err());
    let bodies = receiver
        .wait_for(Duration::from_secs(10), |b| {
            !of_event(b, "config_reload_rejected").is_empty()
        })
        .await;
    let rejected = of_event(&bodies, "config_reload_rejected");
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0]["subject"], serde_json::json!({}));
    let reason = rejected[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("server.listen")
            && reason.starts_with("the old configuration keeps serving"),
        "{reason}"
    );
    // one episode: no second pool alert while it lasts
    assert_eq!(of_event(&receiver.bodies(), "pool_unavailable").len(), 2);
    h.finish().await;
}

/// Logs are captured on this one thread: the runtime is single-threaded so that every
/// task of keypool logs into the capture.
#[tokio::test(flavor = "current_thread")]
async fn the_webhook_url_is_in_no_log_line_and_no_metric() {
    const SECRET_PATH: &str = "/services/T0001/B0002/s3cr3tW3bh00kT0k3n";
    let capture = LogLines::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let receiver = Receiver::start().await;
    receiver.set(FAIL);
    let h = revoked_then_ok()
        .extra_toml(&alerts_toml(
            &receiver.url(SECRET_PATH),
            "retry_initial_ms = 50\nmax_attempts = 3",
            "format = \"slack\"\ntimeout_ms = 200",
        ))
        .start()
        .await;
    assert_eq!(h.send_message().await.status, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut metrics = String::new();
    while series(
        &metrics,
        "keypool_alerts_dropped_total{reason=\"retries_exhausted\"}",
    ) == 0
    {
        assert!(Instant::now() < deadline, "the alert was never given up");
        tokio::time::sleep(Duration::from_millis(20)).await;
        metrics = h.metrics().await;
    }
    assert_eq!(receiver.attempts(), 3);
    // a reload refused for a bad webhook URL does not quote it either
    let dir = keypool_store::testing::TempDir::new("alerts-redaction").unwrap();
    let path = dir.path().join("keypool.toml");
    let bad = format!("ftp://127.0.0.1{SECRET_PATH}");
    std::fs::write(&path, alerts_toml(&bad, "", "")).unwrap();
    let error = h.store().reload(&path).unwrap_err().to_string();
    assert!(error.contains("alerts.webhooks[0].url"), "{error}");
    let debug = format!("{:?}", h.store().config().alerts());
    h.finish().await;

    let logs = capture.text();
    assert!(logs.contains("alert dropped"), "{logs}");
    for (what, text) in [
        ("logs", &logs),
        ("metrics", &metrics),
        ("reload error", &error),
        ("config debug", &debug),
    ] {
        assert!(!text.contains("s3cr3tW3bh00kT0k3n"), "{what}: {text}");
    }
}
