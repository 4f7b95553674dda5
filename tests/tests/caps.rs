//! Per-account concurrency caps end to end (issue 10): `max_concurrent` serialises,
//! the FIFO queue answers `429` when it waits too long or is full, slots always come
//! back, and two replicas on one Redis share caps and session bindings.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use keypool_proxy::App;
use keypool_sim::{Behaviour, Cut, Delay, OkSpec, Script};
use keypool_store::config::Config;
use keypool_store::testing::RedisServer;
use keypool_store::{Store, now_ms};
use keypool_tests::{AccountSpec, Client, Harness, KEY, MODEL, ORG, URL, message_body};

fn slow(ms: u64) -> Script {
    Script::new(OkSpec::default().latency(Delay::ms(ms)).ttft(Delay::ms(ms)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_of_one_serialises_three_concurrent_requests() {
    let h = Harness::builder()
        .account(AccountSpec::new("a", slow(150)).toml("max_concurrent = 1"))
        .start()
        .await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..3 {
        let request = h.messages(&message_body(MODEL, i == 1));
        tasks.spawn(async move { request.send().await });
    }
    while let Some(r) = tasks.join_next().await {
        let r = r.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let stats = h.sim().stats("a").unwrap();
    assert_eq!((stats.requests, stats.peak_in_flight), (3, 1));
    assert_eq!(h.store().slots().total_in_use(), 0);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_at_its_cap_is_skipped_while_another_is_free() {
    let h = Harness::builder()
        .account(
            AccountSpec::new("a", slow(300))
                .priority(0)
                .toml("max_concurrent = 1"),
        )
        .account(AccountSpec::new("b", slow(300)).priority(1))
        .start()
        .await;
    let first = h.messages(&message_body(MODEL, false));
    let first = tokio::spawn(async move { first.send().await });
    h.wait_until("a busy", Duration::from_secs(5), |sim| {
        sim.stats("a").unwrap().in_flight == 1
    })
    .await;
    // a is first by priority but at its cap: b serves at once, without waiting.
    let second = h.send_message().await;
    assert_eq!(second.status, 200);
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(h.requests_per_account(&["a", "b"]), [1, 1]);
    assert_eq!(h.store().slots().total_in_use(), 0);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_timeout_and_full_queue_answer_429_with_retry_after() {
    let h = Harness::builder()
        .server("queue_max_wait_ms", "400")
        .server("queue_max_depth", "1")
        .account(AccountSpec::new("a", slow(3_000)).toml("max_concurrent = 1"))
        .start()
        .await;
    let holder = h.messages(&message_body(MODEL, false));
    let holder = tokio::spawn(async move { holder.send().await });
    h.wait_until("a busy", Duration::from_secs(5), |sim| {
        sim.stats("a").unwrap().in_flight == 1
    })
    .await;
    let waiter = h.messages(&message_body(MODEL, true));
    let started = tokio::time::Instant::now();
    let waiter = tokio::spawn(async move { waiter.send().await });
    // The queue holds one: the next request is refused at once.
    let store = h.store().clone();
    tokio::time::timeout(Duration::from_secs(5), async {
        while store.slots().waiting() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    let full = h.send_message().await;
    assert!(started.elapsed() < Duration::from_millis(400));
    let message = full.assert_keypool_error(429, "rate_limit_error");
    assert!(message.contains("queue_max_depth"), "{message}");
    assert_eq!(full.header("retry-after"), Some("1"));
    assert_eq!(full.header("x-should-retry"), Some("true"));
    // The waiter gives up after queue_max_wait_ms.
    let timed_out = waiter.await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(400));
    let message = timed_out.assert_keypool_error(429, "rate_limit_error");
    assert!(message.contains("queue_max_wait_ms"), "{message}");
    assert_eq!(timed_out.header("retry-after"), Some("1"));
    assert_eq!(timed_out.header("x-should-retry"), Some("true"));
    assert_eq!(holder.await.unwrap().status, 200);
    assert_eq!(h.sim().stats("a").unwrap().requests, 1);
    let metrics = h.app().metrics().render(h.store(), now_ms());
    assert!(
        metrics.contains("keypool_queue_rejections_total{reason=\"full\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("keypool_queue_rejections_total{reason=\"timeout\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("keypool_account_slots_in_use{account=\"a\"} 0"),
        "{metrics}"
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_accounting_returns_to_zero_after_a_burst_of_mixed_failures() {
    let stream = OkSpec::default().chunks(6).chunk_interval(Delay::ms(20));
    let flaky = |ok: Script| {
        ok.then(Behaviour::status(500))
            .then(Behaviour::cut_after(1, Cut::Reset))
            .then(Behaviour::in_band_error())
            .then(Behaviour::status(529))
            .then(Behaviour::StallBeforeHeaders(Duration::from_secs(30)))
            .then(Behaviour::cut_after(3, Cut::Close))
    };
    let h = Harness::builder()
        .strategy("round_robin")
        .server("upstream_timeout_secs", "1")
        .server("queue_max_wait_ms", "10000")
        // failures must not take accounts out of rotation for this test
        .cooldown("overloaded_ms = 1")
        .cooldown("backoff_base_ms = 1")
        .cooldown("backoff_max_ms = 1")
        .account(
            AccountSpec::new("a", flaky(Script::new(stream.clone()))).toml("max_concurrent = 2"),
        )
        .account(
            AccountSpec::new("b", flaky(Script::new(stream.clone()))).toml("max_concurrent = 1"),
        )
        .account(AccountSpec::new("c", Script::new(stream)).toml("max_concurrent = 2"))
        .start()
        .await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..24 {
        let request = h.messages(&message_body(MODEL, i % 3 != 0));
        tasks.spawn(async move {
            if i % 5 == 4 {
                // A client that goes away mid-request.
                let _ =
                    tokio::time::timeout(Duration::from_millis(30), request.send_streaming()).await;
                None
            } else {
                Some(request.send().await.status)
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        if let Some(status) = done.unwrap() {
            assert!(
                [200, 429, 503].contains(&status.as_u16()),
                "unexpected status {status}"
            );
        }
    }
    // Every upstream attempt ended (its slot is dropped with it)...
    h.wait_until(
        "no upstream attempt in flight",
        Duration::from_secs(10),
        |sim| sim.total_stats().in_flight == 0,
    )
    .await;
    // ...and every slot came back exactly once: none held, none over-released.
    let slots = h.store().slots();
    assert_eq!((slots.total_in_use(), slots.waiting()), (0, 0));
    // (The simulator's own peak is no measure here: it notices an abandoned stall or a
    // gone client only later, while the proxy has already given the slot back.)
    // A slot handed out again works: the caps still hold exactly.
    let a = keypool_core::AccountId::from("a");
    let one = slots.try_acquire(&a, 2).await.unwrap();
    let two = slots.try_acquire(&a, 2).await.unwrap();
    assert!(slots.try_acquire(&a, 2).await.is_none());
    drop((one, two));
    assert_eq!(slots.total_in_use(), 0);
    h.finish().await;
}

/// A second proxy on the same configuration (and so the same Redis and simulator).
async fn replica(toml: &str) -> (Store, String) {
    let config = Config::from_toml_str(toml, None, &|_| None).unwrap();
    let store = Store::open(config).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = App::new(store.clone());
    tokio::spawn(keypool_proxy::run(
        listener,
        app,
        std::future::pending::<()>(),
    ));
    (store, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_agree_on_bindings_and_caps() {
    let Some(redis) = RedisServer::start_or_skip("two_replicas_agree_on_bindings_and_caps") else {
        return;
    };
    let h = Harness::builder()
        .strategy("round_robin")
        .server("redis_url", &format!("{:?}", redis.url()))
        .server("redis_timeout_ms", "500")
        .server("snapshot_ttl_secs", "15")
        .account(AccountSpec::new("a", slow(50)))
        .account(AccountSpec::new("b", slow(50)))
        .account(AccountSpec::new("c", slow(600)).toml("max_concurrent = 1"))
        .extra_toml(
            "[[groups]]\nid = \"c-group\"\norg = \"acme\"\naccounts = [\"c\"]\n\
             [[urls]]\ncustom_url = \"c-only\"\norg = \"acme\"\ngroup = \"c-group\"",
        )
        .start()
        .await;
    let (_store, other) = replica(h.toml()).await;
    let client = Client::new();
    let to = |base: &str, session: Option<&str>, stream: bool| {
        let mut r = client
            .post(format!("{base}/{ORG}/{URL}/v1/messages"))
            .api_key(&h.key(KEY))
            .json(&message_body(MODEL, stream));
        if let Some(s) = session {
            r = r.header("x-session-id", s);
        }
        r
    };
    // Bindings: the session bound on one replica is served by the same account on the
    // other, while the shared round-robin counter keeps rotating.
    let r = to(&h.base_url(), Some("shared"), false).send().await;
    assert_eq!(r.status, 200, "{}", r.text());
    let bound = h.upstream_order().last().cloned().unwrap();
    for base in [
        other.as_str(),
        &h.base_url(),
        other.as_str(),
        other.as_str(),
    ] {
        let r = to(base, Some("shared"), false).send().await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(h.upstream_order().last().unwrap(), &bound);
    }

    // Caps: c (cap 1) is held through replica 1; replica 2 must not call it meanwhile.
    h.sim().clear_requests();
    let c_only = |base: &str| {
        client
            .post(format!("{base}/{ORG}/c-only/v1/messages"))
            .api_key(&h.key(KEY))
            .json(&message_body(MODEL, false))
    };
    let first = c_only(&h.base_url());
    let first = tokio::spawn(async move { first.send().await });
    h.wait_until("c busy", Duration::from_secs(5), |sim| {
        sim.stats("c").unwrap().in_flight == 1
    })
    .await;
    let second = c_only(&other).send().await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(first.await.unwrap().status, 200);
    let stats = h.sim().stats("c").unwrap();
    assert_eq!(stats.peak_in_flight, 1, "the cap held across replicas");
    assert_eq!(h.sim().requests_for("c").len(), 2);
    h.finish().await;
}
