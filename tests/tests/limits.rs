//! SPEC 12 end to end: caller limits through the loopback server. One test per limit
//! kind asserts the exact status, error type, `Retry-After` (and `x-should-retry`
//! past a minute) and that the upstream saw no request; the budget tests show that a
//! request that fits is never cut off and the next one is refused with its reset; the
//! reservation of a request is given back on every path (success, failure, a stream
//! the client abandons). Two replicas on one real `redis-server` share one rate and one
//! budget; with Redis killed, `limits_fail_mode` decides.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use keypool_ledger::{Day, Month, Period, Spend, SpendKey, Who};
use keypool_sim::{Behaviour, Delay, OkSpec, Script, Usage};
use keypool_store::now_ms;
use keypool_tests::{AccountSpec, Harness, HarnessBuilder, MODEL, Reply, message_body};
use serde_json::{Value, json};

const ADMIN_TOKEN: &str = "limits-admin-token-5e4d3c2b1a09";

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 0,
    }
}

/// One account `a` answering with `input` + `output` tokens; key `lim` of org acme
/// with `limits` (an inline TOML table).
fn limited(limits: &str, input: u64, output: u64) -> HarnessBuilder {
    Harness::builder()
        .account(AccountSpec::new(
            "a",
            Script::new(OkSpec::default().usage(usage(input, output))),
        ))
        .key("lim", "acme", &format!("urls = [\"*\"]\nlimits = {limits}"))
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
}

async fn send(h: &Harness, key: &str, body: &Value) -> Reply {
    h.client()
        .post(h.messages_url())
        .api_key(&h.key(key))
        .json(body)
        .send()
        .await
}

/// Sends a message as `key` and expects it refused by a limit: the answer and its
/// message.
async fn refused(h: &Harness, key: &str) -> (Reply, String) {
    let r = send(h, key, &message_body(MODEL, false)).await;
    let message = r.assert_keypool_error(429, "rate_limit_error");
    (r, message)
}

/// Sends a message as `key` and expects it served.
async fn served(h: &Harness, key: &str) {
    let r = send(h, key, &message_body(MODEL, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

fn who(caller: &str) -> Who {
    Who {
        org: Arc::from("acme"),
        caller: Arc::from(caller),
    }
}

fn today() -> Period {
    Period::Day(Day::of(now_ms()))
}

fn this_month() -> Period {
    Period::Month(Month::of(now_ms()))
}

/// The key's use of its budget of `period`, settled and reserved.
async fn used(h: &Harness, caller: &str, period: Period) -> Spend {
    h.store()
        .limit_usage(&SpendKey {
            org: Arc::from("acme"),
            caller: Some(Arc::from(caller)),
            period,
        })
        .await
}

/// Seconds from now to the end of the UTC day.
fn secs_to_midnight() -> u64 {
    let now = now_ms();
    let end = (now / 86_400_000 + 1) * 86_400_000;
    (end - now).div_ceil(1000)
}

/// A refusal's `Retry-After`, checked against `expected` seconds (the test's own
/// clock ran a little since the answer).
fn assert_retry_after_near(r: &Reply, expected: u64) {
    let got: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(
        got <= expected + 1 && got + 2 >= expected,
        "Retry-After {got}, expected about {expected}"
    );
    let should_retry = r.header("x-should-retry");
    if got > 60 {
        assert_eq!(should_retry, Some("false"));
    } else {
        assert_eq!(should_retry, None);
    }
}

#[tokio::test]
async fn a_model_outside_the_keys_models_is_refused_403_naming_the_model_and_the_allowed_ones() {
    let h = limited(
        "{ models = [\"claude-haiku-*\", \"claude-opus-4-5\"], deny_models = [\"claude-haiku-3*\"] }",
        10,
        5,
    )
    .start()
    .await;
    let r = send(&h, "lim", &message_body(MODEL, false)).await;
    let message = r.assert_keypool_error(403, "permission_error");
    assert_eq!(
        message,
        "This key may not use model \"claude-sonnet-4-5\"; it may use: claude-haiku-*, claude-opus-4-5"
    );
    assert!(r.header("retry-after").is_none());
    let r = send(&h, "lim", &message_body("claude-haiku-3-5", false)).await;
    let message = r.assert_keypool_error(403, "permission_error");
    assert!(
        message.contains("deny_models: claude-haiku-3*"),
        "{message}"
    );
    assert_eq!(h.sim().requests().len(), 0, "the upstream saw no request");
    // An allowed model goes through; another key is not limited.
    let r = send(&h, "lim", &message_body("claude-haiku-4-5", false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(&h, "alice", &message_body(MODEL, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.sim().requests().len(), 2);
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(
            "keypool_limit_rejections_total{org=\"acme\",caller=\"lim\",limit=\"models\"} 1"
        ),
        "{metrics}"
    );
    assert!(metrics.contains(
        "keypool_limit_rejections_total{org=\"acme\",caller=\"lim\",limit=\"deny_models\"} 1"
    ));
    // The refusals are in the usage records, with their reason.
    let listed = h
        .get("/admin/requests?caller=lim")
        .bearer(ADMIN_TOKEN)
        .send()
        .await
        .json();
    let limits: Vec<&Value> = listed["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["limit"])
        .collect();
    assert_eq!(
        limits,
        [&Value::Null, &json!("deny_models"), &json!("models")]
    );
    h.finish().await;
}

#[tokio::test]
async fn requests_per_minute_past_the_burst_is_429_with_the_wait_until_admitted() {
    let h = limited("{ requests_per_minute = 1 }", 10, 5).start().await;
    let r = send(&h, "lim", &message_body(MODEL, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (r, message) = refused(&h, "lim").await;
    // One a minute, burst 1: the next is admitted a minute after the first.
    assert_retry_after_near(&r, 60);
    assert!(
        message.starts_with("This key is over its request rate: requests_per_minute = 1;"),
        "{message}"
    );
    assert_eq!(
        h.sim().requests().len(),
        1,
        "the refused one never went upstream"
    );
    assert!(h.metrics().await.contains(
        "keypool_limit_rejections_total{org=\"acme\",caller=\"lim\",limit=\"requests_per_minute\"} 1"
    ));
    h.finish().await;
}

#[tokio::test]
async fn a_burst_is_admitted_at_once_and_count_tokens_counts_against_the_rate() {
    let h = limited(
        "{ requests_per_minute = 2, burst = 3, tokens_per_day = 1 }",
        10,
        5,
    )
    .start()
    .await;
    let count = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hello"}]});
    for _ in 0..3 {
        // count_tokens: the rate only (a token budget of 1 would refuse any message).
        let r = h
            .client()
            .post(format!("{}/v1/messages/count_tokens", h.pool_base_url()))
            .api_key(&h.key("lim"))
            .json(&count)
            .send()
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = h
        .client()
        .post(format!("{}/v1/messages/count_tokens", h.pool_base_url()))
        .api_key(&h.key("lim"))
        .json(&count)
        .send()
        .await;
    r.assert_keypool_error(429, "rate_limit_error");
    // Two a minute: one more comes 30 s after the burst's first.
    assert_retry_after_near(&r, 30);
    assert_eq!(h.sim().requests().len(), 3);
    h.finish().await;
}

#[tokio::test]
async fn max_concurrent_refuses_a_request_past_the_cap_with_retry_after_1() {
    let slow = OkSpec::default()
        .usage(usage(10, 5))
        .chunks(10)
        .chunk_interval(Delay::ms(100));
    let h = Harness::builder()
        .account(AccountSpec::new("a", Script::new(slow)))
        .key(
            "lim",
            "acme",
            "urls = [\"*\"]\nlimits = { max_concurrent = 1 }",
        )
        .start()
        .await;
    let mut first = h
        .client()
        .post(h.messages_url())
        .api_key(&h.key("lim"))
        .json(&message_body(MODEL, true))
        .send_streaming()
        .await;
    assert_eq!(first.status, 200);
    let (r, message) = refused(&h, "lim").await;
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("x-should-retry"), None);
    assert_eq!(
        message,
        "This key already has 1 requests in flight (max_concurrent = 1); retry when one ends"
    );
    assert_eq!(h.sim().requests().len(), 1);
    // The first ends: its place comes back.
    while first.next_frame().await.is_some() {}
    drop(first);
    h.wait_until_settled("lim", 0).await;
    let r = send(&h, "lim", &message_body(MODEL, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    h.finish().await;
}

trait SettledExt {
    async fn wait_until_settled(&self, caller: &str, in_flight: u32);
}

impl SettledExt for Harness {
    /// Waits (at most 10 s) until `caller` has `in_flight` requests held by its limits
    /// (a stream's end is settled when keypool saw it).
    async fn wait_until_settled(&self, caller: &str, in_flight: u32) {
        let who = who(caller);
        tokio::time::timeout(Duration::from_secs(10), async {
            while self.store().limit_in_flight(&who) != in_flight {
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{caller}: {in_flight} in flight within 10 s"));
    }
}

/// The body's worst case in tokens (body bytes / 3, rounded up, plus `max_tokens`).
fn worst_tokens(body: &Value) -> u64 {
    let bytes = serde_json::to_vec(body).unwrap().len() as u64;
    bytes.div_ceil(3) + body["max_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn a_token_budget_never_cuts_an_answer_off_and_refuses_the_next_until_midnight() {
    let body = message_body(MODEL, true);
    let worst = worst_tokens(&body);
    // The first request's worst case fits; its real use (2,000 tokens) is past it.
    let limit = worst + 10;
    let h = limited(&format!("{{ tokens_per_day = {limit} }}"), 1000, 1000)
        .start()
        .await;
    let r = send(&h, "lim", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.events().last().map(String::as_str),
        Some("message_stop"),
        "the answer that fit was never cut off"
    );
    h.wait_until_settled("lim", 0).await;
    assert_eq!(
        used(&h, "lim", today()).await,
        Spend {
            tokens: 2000,
            nano_usd: 18_000_000
        }
    );
    let r = send(&h, "lim", &body).await;
    let message = r.assert_keypool_error(429, "rate_limit_error");
    assert_retry_after_near(&r, secs_to_midnight());
    let midnight = keypool_proxy::reject::format_utc((now_ms() / 86_400_000 + 1) * 86_400_000);
    assert_eq!(
        message,
        format!(
            "This key's budget (tokens_per_day = {limit} tokens) is used: 2000 tokens spent or reserved, and this request may take up to {worst} tokens; it resets at {midnight}"
        )
    );
    assert_eq!(h.sim().requests().len(), 1);
    h.finish().await;
}

#[tokio::test]
async fn a_token_budget_per_month_refuses_with_the_reset_at_the_months_end() {
    let body = message_body(MODEL, false);
    let h = limited("{ tokens_per_month = 100 }", 10, 5).start().await;
    // Its worst case alone (body / 3 + 64) is under 100: admitted; then 15 used.
    let r = send(&h, "lim", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // 15 used + a worst case of about 100 is past it.
    let r = send(&h, "lim", &body).await;
    let message = r.assert_keypool_error(429, "rate_limit_error");
    let end = Month::of(now_ms()).end();
    assert_retry_after_near(&r, (end - now_ms()).div_ceil(1000));
    assert!(
        message.contains("tokens_per_month = 100 tokens"),
        "{message}"
    );
    assert!(
        message.ends_with(&keypool_proxy::reject::format_utc(end)),
        "{message}"
    );
    assert_eq!(used(&h, "lim", this_month()).await.tokens, 15);
    h.finish().await;
}

// Sonnet 4.5: $3 / M input, $15 / M output. 1,000 + 1,000 tokens: $0.018.
const BIG_REQUEST_NANO: u64 = 18_000_000;

#[tokio::test]
async fn a_usd_budget_per_day_refuses_once_spent_naming_value_use_and_reset() {
    let h = limited("{ usd_per_day = 0.01, usd_per_month = 100.0 }", 1000, 1000)
        .start()
        .await;
    let r = send(&h, "lim", &message_body(MODEL, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(used(&h, "lim", today()).await.nano_usd, BIG_REQUEST_NANO);
    let (r, message) = refused(&h, "lim").await;
    assert_retry_after_near(&r, secs_to_midnight());
    assert!(
        message.starts_with(
            "This key's budget (usd_per_day = $0.01) is used: $0.01 spent or reserved"
        ),
        "{message}"
    );
    assert_eq!(h.sim().requests().len(), 1);
    assert!(h.metrics().await.contains(
        "keypool_limit_rejections_total{org=\"acme\",caller=\"lim\",limit=\"usd_per_day\"} 1"
    ));
    h.finish().await;
}

#[tokio::test]
async fn a_usd_budget_per_month_refuses_once_spent() {
    let h = limited("{ usd_per_month = 0.02 }", 1000, 1000)
        .start()
        .await;
    served(&h, "lim").await;
    // $0.018 spent + a worst case of about $0.001: fits.
    served(&h, "lim").await;
    let (r, message) = refused(&h, "lim").await;
    let end = Month::of(now_ms()).end();
    assert_retry_after_near(&r, (end - now_ms()).div_ceil(1000));
    assert!(
        message.starts_with("This key's budget (usd_per_month = $0.02) is used: $0.03"),
        "{message}"
    );
    h.finish().await;
}

#[tokio::test]
async fn the_orgs_usd_per_month_is_one_team_budget_for_all_its_keys_and_key_limits_win() {
    let h = Harness::builder()
        .account(AccountSpec::new(
            "a",
            Script::new(OkSpec::default().usage(usage(1000, 1000))),
        ))
        .org_line("limits = { usd_per_month = 0.03, requests_per_minute = 1 }")
        .key(
            "bob",
            "acme",
            "urls = [\"*\"]\nlimits = { requests_per_minute = 100 }",
        )
        .start()
        .await;
    // alice and bob share $0.03: two requests of $0.018 leave no room for a third.
    // bob's own rate wins over the org's default; alice has the org's (1 a minute).
    served(&h, "alice").await;
    served(&h, "bob").await;
    let (_, message) = refused(&h, "alice").await;
    assert!(message.contains("requests_per_minute = 1"), "{message}");
    let (r, message) = refused(&h, "bob").await;
    assert!(
        message.starts_with(
            "The team budget of org \"acme\" (usd_per_month = $0.03) is used: $0.03 spent or reserved"
        ),
        "{message}"
    );
    let end = Month::of(now_ms()).end();
    assert_retry_after_near(&r, (end - now_ms()).div_ceil(1000));
    assert_eq!(h.sim().requests().len(), 2);
    let team = h
        .store()
        .limit_usage(&SpendKey {
            org: Arc::from("acme"),
            caller: None,
            period: this_month(),
        })
        .await;
    assert_eq!(team.nano_usd, 2 * BIG_REQUEST_NANO);
    h.finish().await;
}

/// Budgets reserve the worst case and settle to the real cost on every path: a
/// success, an upstream failure, a stream the client abandons. Nothing stays reserved.
#[tokio::test]
async fn a_reservation_is_never_leaked_on_success_failure_or_an_abandoned_stream() {
    // `then` answers come first, in order.
    let script = Script::new(OkSpec::default().usage(usage(10, 5)))
        .then(OkSpec::default().usage(usage(10, 5)))
        .then(Behaviour::status(400))
        .then(
            OkSpec::default()
                .usage(usage(40, 30))
                .chunks(20)
                .chunk_interval(Delay::ms(200)),
        );
    let h = Harness::builder()
        .account(AccountSpec::new("a", script))
        .key(
            "lim",
            "acme",
            "urls = [\"*\"]\nlimits = { tokens_per_day = 1000000, usd_per_day = 10.0, max_concurrent = 5 }",
        )
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
        .start()
        .await;
    // 1. Success: 15 tokens, 10 × 3,000 + 5 × 15,000 nano-USD.
    let r = send(&h, "lim", &message_body(MODEL, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    h.wait_until_settled("lim", 0).await;
    let after_success = Spend {
        tokens: 15,
        nano_usd: 105_000,
    };
    assert_eq!(used(&h, "lim", today()).await, after_success);
    // 2. Failure: the upstream answers 400 (not a request keypool can fail over);
    // nothing is spent, nothing held.
    let r = send(&h, "lim", &message_body(MODEL, false)).await;
    assert!(r.status.as_u16() >= 400, "{}", r.text());
    h.wait_until_settled("lim", 0).await;
    assert_eq!(used(&h, "lim", today()).await, after_success);
    // 3. A stream abandoned after its first delta: what it reported so far is spent
    // (message_start's 40 input tokens), nothing stays reserved.
    let mut stream = h
        .client()
        .post(h.messages_url())
        .api_key(&h.key("lim"))
        .json(&message_body(MODEL, true))
        .send_streaming()
        .await;
    assert_eq!(stream.status, 200);
    while let Some(frame) = stream.next_frame().await {
        if frame.event.as_deref() == Some("content_block_delta") {
            break;
        }
    }
    // While it runs, its worst case is reserved.
    assert!(used(&h, "lim", today()).await.tokens > after_success.tokens + 40);
    assert_eq!(h.store().limit_in_flight(&who("lim")), 1);
    drop(stream);
    h.wait_until_settled("lim", 0).await;
    let spent = used(&h, "lim", today()).await;
    let record = h
        .get("/admin/requests?caller=lim&limit=1")
        .bearer(ADMIN_TOKEN)
        .send()
        .await
        .json();
    let last = &record["requests"][0];
    assert_eq!(last["stream_end"], "client_gone");
    let last_tokens: u64 = ["input_tokens", "output_tokens"]
        .iter()
        .map(|f| last["usage"][f].as_u64().unwrap())
        .sum();
    assert_eq!(
        spent,
        Spend {
            tokens: after_success.tokens + last_tokens,
            nano_usd: after_success.nano_usd + last["cost_nano_usd"].as_u64().unwrap(),
        },
        "settled to exactly the recorded cost, nothing left reserved"
    );
    h.finish().await;
}

/// A key with a shared limit on Redis: `requests_per_minute` and `usd_per_day`.
fn shared_builder(redis: &str, limits: &str, fail_mode: &str) -> HarnessBuilder {
    Harness::builder()
        .account(AccountSpec::new(
            "a",
            Script::new(OkSpec::default().usage(usage(10, 5))),
        ))
        .key("lim", "acme", &format!("urls = [\"*\"]\nlimits = {limits}"))
        .server("redis_url", &format!("{redis:?}"))
        .server("limits_fail_mode", &format!("{fail_mode:?}"))
}

/// Sends requests from `workers` concurrent loops on each replica until each loop is
/// refused; returns (admitted, refused statuses).
async fn hammer(replicas: &[&Harness], workers: usize, body: &Value) -> (usize, Vec<u16>) {
    let mut tasks = Vec::new();
    for h in replicas {
        for _ in 0..workers {
            let client = h.client().clone();
            let url = h.messages_url();
            let key = h.key("lim");
            let body = body.clone();
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                loop {
                    let r = client.post(&url).api_key(&key).json(&body).send().await;
                    if r.status == 200 {
                        admitted += 1;
                    } else {
                        return (admitted, r.status.as_u16());
                    }
                }
            }));
        }
    }
    let mut admitted = 0;
    let mut refused = Vec::new();
    for t in tasks {
        let (n, status) = t.await.unwrap();
        admitted += n;
        refused.push(status);
    }
    (admitted, refused)
}

/// SPEC 12 across replicas: two replicas on one real `redis-server`, four concurrent
/// loops each, enforce one `requests_per_minute` (burst 5: exactly 5 admitted, 6 if
/// the test spans a refill) for the key.
#[tokio::test]
async fn two_replicas_on_one_redis_share_one_request_rate() {
    let Some(redis) = keypool_store::testing::RedisServer::start_or_skip("shared_rate") else {
        return;
    };
    let limits = "{ requests_per_minute = 6, burst = 5 }";
    let a = shared_builder(&redis.url(), limits, "open").start().await;
    let b = shared_builder(&redis.url(), limits, "open").start().await;
    let (admitted, refused) = hammer(&[&a, &b], 4, &message_body(MODEL, false)).await;
    assert!((5..=6).contains(&admitted), "admitted {admitted}");
    assert!(refused.iter().all(|s| *s == 429), "{refused:?}");
    assert_eq!(
        a.sim().requests().len() + b.sim().requests().len(),
        admitted,
        "refused requests never went upstream"
    );
    a.finish().await;
    b.finish().await;
}

/// SPEC 12 across replicas: one `usd_per_day` shared by two replicas under concurrent
/// load from both. Each request costs 105,000 nano-USD and reserves its worst case
/// (body / 3 input tokens and `max_tokens` 1); once nothing is reserved, the budget
/// has admitted exactly the requests a single sequential caller would have.
#[tokio::test]
async fn two_replicas_on_one_redis_share_one_usd_budget_within_one_request() {
    let Some(redis) = keypool_store::testing::RedisServer::start_or_skip("shared_budget") else {
        return;
    };
    let mut body = message_body(MODEL, false);
    body["max_tokens"] = json!(1);
    let bytes = serde_json::to_vec(&body).unwrap().len() as u64;
    let worst_nano = bytes.div_ceil(3) * 3_000 + 15_000;
    let cost = 105_000;
    let limit = 1_050_000u64; // $0.00105
    let limits = "{ usd_per_day = 0.00105 }";
    let a = shared_builder(&redis.url(), limits, "open").start().await;
    let b = shared_builder(&redis.url(), limits, "open").start().await;
    let (mut admitted, refused) = hammer(&[&a, &b], 4, &body).await;
    assert!(refused.iter().all(|s| *s == 429), "{refused:?}");
    // Reservations of requests in flight may have refused some early: drain once
    // nothing is held.
    a.wait_until_settled("lim", 0).await;
    b.wait_until_settled("lim", 0).await;
    let (more, _) = hammer(&[&a, &b], 1, &body).await;
    admitted += more;
    // The exact answer: requests are admitted while spent + worst case ≤ limit.
    let exact = (0..).take_while(|k| k * cost + worst_nano <= limit).count();
    assert_eq!(admitted, exact, "admitted {admitted}, exact {exact}");
    let spent_a = used(&a, "lim", today()).await;
    let spent_b = used(&b, "lim", today()).await;
    assert_eq!(spent_a, spent_b, "both replicas read the same total");
    assert_eq!(spent_a.nano_usd, admitted as u64 * cost);
    assert!(spent_a.nano_usd <= limit);
    a.finish().await;
    b.finish().await;
}

/// `limits_fail_mode = "open"` (the default): with Redis killed, a request with a
/// shared limit is admitted and counted in this process.
#[tokio::test]
async fn with_redis_killed_fail_open_admits_and_counts_locally() {
    let Some(mut redis) = keypool_store::testing::RedisServer::start_or_skip("limits_fail_open")
    else {
        return;
    };
    let h = shared_builder(&redis.url(), "{ requests_per_minute = 2 }", "open")
        .start()
        .await;
    served(&h, "lim").await;
    redis.kill();
    // Admitted from this process's book, which starts on its own: two a minute.
    served(&h, "lim").await;
    served(&h, "lim").await;
    refused(&h, "lim").await;
    assert_eq!(h.sim().requests().len(), 3);
    h.finish().await;
}

/// `limits_fail_mode = "closed"`: with Redis killed, a request with a shared limit is
/// answered 503 without reaching an upstream; a key whose only limit is its models
/// (checked in the process) is served.
#[tokio::test]
async fn with_redis_killed_fail_closed_answers_503_for_shared_limits_only() {
    let Some(mut redis) = keypool_store::testing::RedisServer::start_or_skip("limits_fail_closed")
    else {
        return;
    };
    let h = shared_builder(&redis.url(), "{ usd_per_day = 5.0 }", "closed")
        .key(
            "models_only",
            "acme",
            "urls = [\"*\"]\nlimits = { models = [\"claude-*\"] }",
        )
        .start()
        .await;
    served(&h, "lim").await;
    redis.kill();
    let r = send(&h, "lim", &message_body(MODEL, false)).await;
    let message = r.assert_keypool_error(503, "overloaded_error");
    assert!(
        message.contains("limits_fail_mode is \"closed\""),
        "{message}"
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(
        h.sim().requests().len(),
        1,
        "the refused one never went upstream"
    );
    let r = send(&h, "models_only", &message_body(MODEL, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(h.metrics().await.contains(
        "keypool_limit_rejections_total{org=\"acme\",caller=\"lim\",limit=\"redis_unavailable\"} 1"
    ));
    h.finish().await;
}

/// The limits survive a restart of the real binary: the budget starts again from the
/// usage totals the state file kept, the request-rate cell from the state file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_keeps_budgets_and_rate_cells_across_a_restart() {
    use keypool_tests::process::{KeypoolProcess, binary_config, config_file, free_port};
    let port = free_port();
    let h = Harness::builder()
        .account(AccountSpec::new(
            "a",
            Script::new(OkSpec::default().usage(usage(1000, 1000))),
        ))
        // alice (the harness key) has the org's budget; `rated` its own rate.
        .org_line("limits = { usd_per_day = 0.01 }")
        .key(
            "rated",
            "acme",
            "urls = [\"*\"]\nlimits = { requests_per_minute = 1 }",
        )
        .start()
        .await;
    let (dir, file) = config_file(
        "limits-restart",
        &binary_config(&h, port, &[("state_file", "\"state.json\"")]),
    );
    let rated = |k: &KeypoolProcess| {
        h.client()
            .post(k.url("/acme/team/v1/messages"))
            .api_key(&h.key("rated"))
            .json(&message_body(MODEL, false))
            .send()
    };
    let mut k = KeypoolProcess::start(&file, port).await;
    assert_eq!(k.send_message(&h, false).await.status, 200);
    assert_eq!(rated(&k).await.status, 200);
    k.signal("TERM");
    assert_eq!(k.wait_exit(Duration::from_secs(10)).await, Some(0));
    assert!(dir.join("state.json").exists());
    drop(k);

    let k = KeypoolProcess::start(&file, port).await;
    let r = k.send_message(&h, false).await;
    let message = r.assert_keypool_error(429, "rate_limit_error");
    assert!(message.contains("usd_per_day = $0.01"), "{message}");
    let r = rated(&k).await;
    let message = r.assert_keypool_error(429, "rate_limit_error");
    assert!(message.contains("requests_per_minute = 1"), "{message}");
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "Retry-After {wait}");
    assert_eq!(
        h.sim().requests().len(),
        2,
        "nothing went upstream after the restart"
    );
    drop(k);
    h.finish().await;
}

/// The limit scripts on a Redis Cluster (three primaries): every key of a check is under
/// one hash tag, so a rate and a budget hold as on one server.
#[tokio::test]
async fn limits_hold_on_a_redis_cluster() {
    let Some(cluster) = keypool_store::testing::RedisCluster::start_or_skip("limits_cluster")
    else {
        return;
    };
    let h = shared_builder(
        &cluster.url(),
        "{ requests_per_minute = 2, usd_per_day = 5.0, max_concurrent = 3 }",
        "closed",
    )
    .start()
    .await;
    served(&h, "lim").await;
    served(&h, "lim").await;
    let (_, message) = refused(&h, "lim").await;
    assert!(message.contains("requests_per_minute = 2"), "{message}");
    // Admitted through the cluster (closed: a failed script would be a 503), the
    // budget counted there.
    assert_eq!(h.sim().requests().len(), 2);
    h.wait_until_settled("lim", 0).await;
    assert_eq!(used(&h, "lim", today()).await.nano_usd, 2 * 105_000);
    h.finish().await;
}
