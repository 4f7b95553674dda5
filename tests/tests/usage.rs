//! SPEC 11 end to end: the usage ledger. A known mix of requests (two keys, streaming
//! and not, a failover, a stream the client abandons, a cache read, a subscription
//! account with a model override) goes through keypool against the simulator's fixed
//! usage figures; `/admin/usage` must give every total to the token and the nano-dollar,
//! by caller, account, model and org, for the day and the month, and again after a
//! restart; `/admin/requests` finds each request with its attempts.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use keypool_sim::{Delay, OkSpec, Script, Usage};
use keypool_store::testing::TempDir;
use keypool_tests::{AccountSpec, Harness, HarnessBuilder, MODEL, message_body};
use serde_json::{Value, json};

const ADMIN_TOKEN: &str = "usage-admin-token-7d6c5b4a3928";
const HAIKU: &str = "claude-haiku-4-5";

fn usage(input: u64, output: u64, write: u64, read: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cache_creation_input_tokens: write,
        cache_read_input_tokens: read,
    }
}

fn ok(u: Usage) -> OkSpec {
    OkSpec::default().usage(u)
}

/// Accounts `a` and `b` (API keys, pool `team`, priority order) and `c` (a subscription
/// account answering as Haiku, alone behind URL config `subs`); keys `alice` (user) and
/// `bot` (client). `a` answers 500 first (the failover to `b`), then a stream, a cache
/// read, and a slow stream the client abandons.
fn mix_builder(extra_server: &[(&str, &str)]) -> HarnessBuilder {
    let a = Script::new(ok(usage(1, 1, 0, 0)))
        .then(keypool_sim::Behaviour::status(500))
        .then(ok(usage(200, 50, 10, 0)))
        .then(ok(usage(5, 7, 0, 1000)))
        .then(
            ok(usage(40, 30, 0, 0))
                .chunks(20)
                .chunk_interval(Delay::ms(200)),
        );
    let mut b = Harness::builder()
        .account(AccountSpec::new("a", a).priority(0))
        .account(AccountSpec::new("b", Script::new(ok(usage(100, 20, 0, 0)))).priority(1))
        .account(
            AccountSpec::new("c", Script::new(ok(usage(1000, 100, 0, 0))))
                .provider("anthropic", "oauth")
                .model(HAIKU)
                .outside_pool(),
        )
        .key("bot", "acme", "kind = \"client\"\nurls = [\"*\"]")
        .extra_toml(&format!(
            "[admin]\ntoken = \"{ADMIN_TOKEN}\"\n\n[[groups]]\nid = \"subs\"\norg = \"acme\"\naccounts = [\"c\"]\n\n[[urls]]\ncustom_url = \"subs\"\norg = \"acme\"\ngroup = \"subs\""
        ));
    for (k, v) in extra_server {
        b = b.server(k, v);
    }
    b
}

/// Sends the mix; returns the request ids in order.
async fn send_mix(h: &Harness) -> Vec<String> {
    let id = |r: &keypool_tests::Reply| r.header("x-request-id").unwrap().to_owned();
    let mut ids = Vec::new();
    // 1. alice, not streaming: a answers 500, b serves.
    let r = h.send_message().await;
    assert_eq!(r.status, 200, "{}", r.text());
    ids.push(id(&r));
    // 2. alice, streaming: a serves.
    let r = h.send_stream().await;
    assert_eq!(r.events().last().map(String::as_str), Some("message_stop"));
    ids.push(id(&r));
    // 3. bot, not streaming: a serves from the cache.
    let bot = h.key("bot");
    let r = h
        .client()
        .post(h.messages_url())
        .api_key(&bot)
        .json(&message_body(MODEL, false))
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    ids.push(id(&r));
    // 4. bot, streaming, abandoned after the first delta (message_delta never seen).
    let mut stream = h
        .client()
        .post(h.messages_url())
        .api_key(&bot)
        .json(&message_body(MODEL, true))
        .send_streaming()
        .await;
    ids.push(stream.headers["x-request-id"].to_str().unwrap().to_owned());
    while let Some(frame) = stream.next_frame().await {
        if frame.event.as_deref() == Some("content_block_delta") {
            break;
        }
    }
    drop(stream);
    // 5. alice on `subs`: the subscription account, answering as Haiku.
    let r = h
        .client()
        .post(h.url("/acme/subs/v1/messages"))
        .api_key(&h.key("alice"))
        .json(&message_body(MODEL, false))
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    ids.push(id(&r));
    // The abandoned stream's record is written once keypool saw the client go.
    wait_for_records(h, 5).await;
    ids
}

async fn admin(h: &Harness, path: &str) -> Value {
    let r = h.get(path).bearer(ADMIN_TOKEN).send().await;
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()
}

/// Waits (at most 10 s) until `/admin/requests` lists `n` records.
async fn wait_for_records(h: &Harness, n: usize) {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let listed = admin(h, "/admin/requests").await;
            if listed["requests"].as_array().unwrap().len() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} usage records within 10 s"));
}

/// A row's tokens and cost: `[requests, input, output, cache write, cache read, cost
/// nano-USD, list-price-equivalent nano-USD]`.
fn figures(row: &Value) -> [u64; 7] {
    let n = |k: &str| row[k].as_u64().unwrap_or_else(|| panic!("{k} in {row}"));
    [
        n("requests"),
        n("input_tokens"),
        n("output_tokens"),
        n("cache_creation_input_tokens"),
        n("cache_read_input_tokens"),
        n("cost_nano_usd"),
        n("list_price_equivalent_nano_usd"),
    ]
}

fn rows_by(answer: &Value, column: &str) -> Vec<(String, [u64; 7])> {
    answer["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[column].as_str().unwrap().to_owned(), figures(r)))
        .collect()
}

// Prices (USD per million tokens; nano-USD per token = USD × 1,000): Sonnet 4.5 3 /
// 15 / 3.75 / 0.30, Haiku 4.5 1 / 5 / 1.25 / 0.10.
// 1. b, Sonnet, 100 in + 20 out: 300,000 + 300,000 = 600,000.
// 2. a, Sonnet, 200 in + 50 out + 10 cache write: 600,000 + 750,000 + 37,500 = 1,387,500.
// 3. a, Sonnet, 5 in + 7 out + 1,000 cache read: 15,000 + 105,000 + 300,000 = 420,000.
// 4. a, Sonnet, abandoned: message_start's 40 in + 1 out: 120,000 + 15,000 = 135,000.
// 5. c, Haiku (list-price equivalent), 1,000 in + 100 out: 1,000,000 + 500,000 = 1,500,000.
const BY_CALLER: [(&str, [u64; 7]); 2] = [
    ("alice", [3, 1300, 170, 10, 0, 3_487_500, 1_500_000]),
    ("bot", [2, 45, 8, 0, 1000, 555_000, 0]),
];
const BY_ACCOUNT: [(&str, [u64; 7]); 3] = [
    ("a", [3, 245, 58, 10, 1000, 1_942_500, 0]),
    ("b", [1, 100, 20, 0, 0, 600_000, 0]),
    ("c", [1, 1000, 100, 0, 0, 1_500_000, 1_500_000]),
];
const BY_MODEL: [(&str, [u64; 7]); 2] = [
    (HAIKU, [1, 1000, 100, 0, 0, 1_500_000, 1_500_000]),
    (MODEL, [4, 345, 78, 10, 1000, 2_542_500, 0]),
];

/// Every total of the mix, for the day and the month, by caller, account, model, org.
async fn assert_mix_totals(h: &Harness) {
    let expect = |rows: &[(&str, [u64; 7])]| -> Vec<(String, [u64; 7])> {
        rows.iter().map(|(k, f)| ((*k).to_owned(), *f)).collect()
    };
    for period in ["day", "month"] {
        let q = |by: &str| format!("/admin/usage?by={by}&period={period}");
        let callers = admin(h, &q("caller")).await;
        assert_eq!(rows_by(&callers, "caller"), expect(&BY_CALLER), "{callers}");
        assert_eq!(callers["rows"][0]["kind"], "user");
        assert_eq!(callers["rows"][1]["kind"], "client");
        assert_eq!(callers["total"]["cost_nano_usd"], 4_042_500);
        assert_eq!(callers["total"]["cost_usd"], "0.004042500");
        let accounts = admin(h, &q("account")).await;
        assert_eq!(
            rows_by(&accounts, "account"),
            expect(&BY_ACCOUNT),
            "{accounts}"
        );
        assert_eq!(accounts["rows"][2]["cost_basis"], "list_price_equivalent");
        assert_eq!(accounts["rows"][0]["cost_basis"], "api");
        let models = admin(h, &q("model")).await;
        assert_eq!(rows_by(&models, "model"), expect(&BY_MODEL), "{models}");
        let orgs = admin(h, &q("org")).await;
        assert_eq!(
            rows_by(&orgs, "org"),
            [(
                "acme".to_owned(),
                [5, 1345, 178, 10, 1000, 4_042_500, 1_500_000]
            )]
        );
    }
}

#[tokio::test]
async fn a_known_mix_is_counted_to_the_token_and_the_nano_dollar_and_survives_a_restart() {
    let dir = TempDir::new("usage").unwrap();
    let state = dir.path().join("state.json");
    let state_file = format!("{:?}", state.display().to_string());
    let h = mix_builder(&[("state_file", &state_file)]).start().await;
    let ids = send_mix(&h).await;
    assert_mix_totals(&h).await;

    // The records: newest first, with their attempts; one by id.
    let listed = admin(&h, "/admin/requests?caller=bot").await;
    let bot: Vec<&str> = listed["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(bot, [ids[3].as_str(), ids[2].as_str()]);
    let first = admin(&h, &format!("/admin/requests/{}", ids[0])).await;
    assert_eq!(first["caller"], json!({"kind": "user", "id": "alice"}));
    assert_eq!(first["account"], "b");
    assert_eq!(first["status"], 200);
    assert_eq!(first["cost_nano_usd"], 600_000);
    assert_eq!(first["cost_usd"], "0.000600000");
    let attempts: Vec<(Value, Value, Value)> = first["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["account"].clone(),
                a["status"].clone(),
                a["outcome"].clone(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [
            (json!("a"), json!(500), json!("server_error")),
            (json!("b"), json!(200), json!("ok")),
        ]
    );
    let abandoned = admin(&h, &format!("/admin/requests/{}", ids[3])).await;
    assert_eq!(abandoned["stream_end"], "client_gone");
    assert_eq!(abandoned["usage"]["output_tokens"], 1);
    let subs = admin(&h, &format!("/admin/requests/{}", ids[4])).await;
    assert_eq!(subs["model"], MODEL);
    assert_eq!(subs["model_sent"], HAIKU);
    assert_eq!(subs["cost_basis"], "list_price_equivalent");
    let errors = admin(&h, "/admin/requests?status=error").await;
    assert_eq!(errors["requests"], json!([]));
    let csv = h
        .get("/admin/usage?by=account&format=csv")
        .bearer(ADMIN_TOKEN)
        .send()
        .await;
    assert_eq!(csv.header("content-type"), Some("text/csv; charset=utf-8"));
    assert!(
        csv.text()
            .contains("\nacme,c,1,0,1000,100,0,0,0.001500000,0.001500000,0\n"),
        "{}",
        csv.text()
    );

    // The metrics.
    let metrics = h.metrics().await;
    for line in [
        "keypool_tokens_total{org=\"acme\",caller=\"alice\",type=\"input\"} 1300",
        "keypool_tokens_total{org=\"acme\",caller=\"bot\",type=\"cache_read\"} 1000",
        "keypool_cost_usd_total{org=\"acme\",caller=\"bot\"} 0.000555",
        "keypool_usage_unpriced_total 0",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }

    // A restart on the same state file: the same totals and records.
    h.finish().await;
    let h = mix_builder(&[("state_file", &state_file)]).start().await;
    assert_mix_totals(&h).await;
    let first = admin(&h, &format!("/admin/requests/{}", ids[0])).await;
    assert_eq!(first["account"], "b");
    h.finish().await;
}

/// Bad query parameters are `400 invalid_request_error` naming what is wrong; an
/// unknown request id is `404`.
#[tokio::test]
async fn bad_usage_queries_say_what_is_wrong() {
    let h = mix_builder(&[]).start().await;
    for (path, says) in [
        ("/admin/usage?by=team", "by \"team\" is not one of"),
        ("/admin/usage?period=week", "period \"week\" is not one of"),
        ("/admin/usage?date=2026-02-30", "is not a date"),
        ("/admin/usage?period=month&date=2026-12-01", "is not a date"),
        ("/admin/usage?format=xml", "format \"xml\""),
        ("/admin/requests?limit=0", "limit \"0\" must be"),
        ("/admin/requests?status=nope", "status \"nope\""),
    ] {
        let r = h.get(path).bearer(ADMIN_TOKEN).send().await;
        let message = r.assert_keypool_error(400, "invalid_request_error");
        assert!(message.contains(says), "{path}: {message}");
    }
    let r = h
        .get("/admin/requests/req_kp_nothing")
        .bearer(ADMIN_TOKEN)
        .send()
        .await;
    r.assert_keypool_error(404, "not_found_error");
    h.finish().await;
}

/// One account `a` answering every request with 10 input and 5 output tokens; keys
/// `alice` (user) and `bot` (client); on `redis`.
fn shared_builder(redis: &str) -> HarnessBuilder {
    Harness::builder()
        .account(AccountSpec::new("a", Script::new(ok(usage(10, 5, 0, 0)))))
        .key("bot", "acme", "kind = \"client\"\nurls = [\"*\"]")
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
        .server("redis_url", &format!("{redis:?}"))
}

/// Sends `n` messages as `key` (every other one streaming); the request ids.
async fn send_as(h: &Harness, key: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let r = h
            .client()
            .post(h.messages_url())
            .api_key(&h.key(key))
            .json(&message_body(MODEL, i % 2 == 1))
            .send()
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        ids.push(r.header("x-request-id").unwrap().to_owned());
    }
    ids
}

/// Waits (at most 10 s) until `/admin/usage?by=caller` of `h` shows `expected` from
/// Redis; returns the answer.
async fn wait_for_shared_totals(h: &Harness, expected: &[(&str, [u64; 7])]) -> Value {
    let expected: Vec<(String, [u64; 7])> = expected
        .iter()
        .map(|(k, f)| ((*k).to_owned(), *f))
        .collect();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let answer = admin(h, "/admin/usage?by=caller").await;
            if answer["source"] == "redis" && rows_by(&answer, "caller") == expected {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("shared totals {expected:?} within 10 s"))
}

// 10 in + 5 out on Sonnet 4.5: 30,000 + 75,000 = 105,000 nano-USD a request.
const PER_REQUEST: u64 = 105_000;

/// SPEC 11 with Redis: two replicas on one real `redis-server` add to the same totals
/// (each shows the sum of both), and a request served by one is found by id on the
/// other, and in its list of recent requests.
#[tokio::test]
async fn two_replicas_on_one_redis_add_up_and_find_each_others_requests() {
    let Some(redis) = keypool_store::testing::RedisServer::start_or_skip("two_replicas_add_up")
    else {
        return;
    };
    let a = shared_builder(&redis.url()).start().await;
    let b = shared_builder(&redis.url()).start().await;
    let on_a = send_as(&a, "alice", 3).await;
    let on_b = send_as(&b, "bot", 2).await;
    let expected = [
        ("alice", [3, 30, 15, 0, 0, 3 * PER_REQUEST, 0]),
        ("bot", [2, 20, 10, 0, 0, 2 * PER_REQUEST, 0]),
    ];
    wait_for_shared_totals(&a, &expected).await;
    let on_b_view = wait_for_shared_totals(&b, &expected).await;
    assert_eq!(on_b_view["total"]["requests"], 5);
    // Replica B finds a request replica A served, and lists A's requests too.
    let found = admin(&b, &format!("/admin/requests/{}", on_a[0])).await;
    assert_eq!(found["caller"]["id"], "alice");
    assert_eq!(found["cost_nano_usd"], PER_REQUEST);
    let listed = admin(&b, "/admin/requests?caller=alice").await;
    assert_eq!(listed["source"], "redis");
    let ids: Vec<&str> = listed["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [&on_a[2], &on_a[1], &on_a[0]]);
    let on_a_lookup = admin(&a, &format!("/admin/requests/{}", on_b[1])).await;
    assert_eq!(on_a_lookup["stream"], true);
    a.finish().await;
    b.finish().await;
}

/// SPEC 11 with Redis: Redis killed in the middle of the traffic (a durable one, whose
/// acknowledged writes survive as a production Redis's do) loses no count: what came
/// meanwhile waits in memory and is added once Redis is back, exactly once; a replica
/// started afterwards sees the whole.
#[tokio::test]
async fn killing_redis_during_the_traffic_loses_no_counts() {
    let Some(mut redis) = keypool_store::testing::RedisServer::durable("killing_redis") else {
        return;
    };
    let a = shared_builder(&redis.url()).start().await;
    send_as(&a, "alice", 3).await;
    wait_for_shared_totals(&a, &[("alice", [3, 30, 15, 0, 0, 3 * PER_REQUEST, 0])]).await;
    redis.kill();
    send_as(&a, "alice", 2).await;
    send_as(&a, "bot", 2).await;
    // Served from memory meanwhile: the totals say so.
    let local = admin(&a, "/admin/usage?by=caller").await;
    assert_eq!(local["source"], "memory");
    assert_eq!(local["total"]["requests"], 7);
    redis.restart().unwrap();
    let expected = [
        ("alice", [5, 50, 25, 0, 0, 5 * PER_REQUEST, 0]),
        ("bot", [2, 20, 10, 0, 0, 2 * PER_REQUEST, 0]),
    ];
    wait_for_shared_totals(&a, &expected).await;
    // Those totals include what replica A still holds (its answer merges its own
    // unsent additions); its next flush sends them: nothing is left behind.
    tokio::time::timeout(Duration::from_secs(10), async {
        while a.store().usage_unflushed() != (0, 0) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{:?} still unsent after 10 s", a.store().usage_unflushed()));
    // A replica without any of its own sees exactly the whole, from Redis alone.
    let late = shared_builder(&redis.url()).start().await;
    wait_for_shared_totals(&late, &expected).await;
    a.finish().await;
    late.finish().await;
}
