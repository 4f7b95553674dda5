//! The Redis backend against a real `redis-server` that each test starts on a free port.
//! Under `CI=true` a missing `redis-server` fails these tests instead of skipping them.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use keypool_core::AccountId;
use keypool_store::testing::{FakeRedis, FakeReply, FaultyRedis, RedisServer};
use keypool_store::{BackendKind, BootState, Store, now_ms};

fn redis_config(redis: &RedisServer, n: usize) -> keypool_store::config::Config {
    config(&config_text(
        n,
        &format!("redis_url = {:?}\nredis_timeout_ms = 200", redis.url()),
    ))
}

/// Polls `cond` every 10 ms until it holds or `within` passes; returns the time it took.
/// Only for cross-process propagation, which has no event to wait on.
async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if cond() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond().then(|| start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_of_keypool_preserves_a_window_cooldown_with_its_remaining_time() {
    let Some(redis) = RedisServer::start_or_skip("redis_restart_preserves_expiry") else {
        return;
    };
    let a0 = AccountId::from("a0");
    let now = now_ms();
    let reset = now + 3 * HOUR_MS;
    {
        let store = Store::open(redis_config(&redis, 2)).await.unwrap();
        assert!(matches!(
            store.take_boot_state(),
            Some(BootState::Redis { loaded: true })
        ));
        assert_eq!(store.backend_status().kind, BackendKind::Redis);
        store.record_failure(&attempt(&a0, now), &window_exhausted(reset), now);
        store.persist(now).await.unwrap(); // what shutdown does
    }
    // in Redis with an absolute expiry (PXAT): its TTL is about 3 hours
    let ttl = pttl(&redis, "keypool:cooldown:a0");
    assert!(
        ttl > (3 * HOUR_MS - 60_000) as i64 && ttl <= (3 * HOUR_MS) as i64,
        "PTTL {ttl}"
    );

    let store = Store::open(redis_config(&redis, 2)).await.unwrap();
    assert!(matches!(
        store.take_boot_state(),
        Some(BootState::Redis { loaded: true })
    ));
    let later = now_ms();
    assert_eq!(
        store.health().cooldowns.cooldown_until(&a0, later),
        Some(reset),
        "same absolute expiry, not a fresh 60 s"
    );
}

/// One command in the Redis protocol (for values with quotes and spaces, which the
/// inline form of [`RedisServer::command`] would split).
fn resp(args: &[&str]) -> String {
    let mut s = format!("*{}", args.len());
    for a in args {
        s += &format!("\r\n${}\r\n{a}", a.len());
    }
    s
}

/// `PTTL key`: the key's remaining time to live in ms (-1: none, -2: no such key).
fn pttl(redis: &RedisServer, key: &str) -> i64 {
    let reply = redis
        .command(&format!("PTTL {key}"))
        .unwrap_or_else(|e| panic!("PTTL {key}: {e}"));
    reply
        .trim_start_matches(':')
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("PTTL {key} answered {reply:?}: {e}"))
}

/// Redis holds what an older keypool mirrored after a far-future reset (window and
/// cooldown until `u64::MAX`, `PXAT` at the largest expiry Redis takes): a store that
/// boots on it takes both within the weekly bound, and writes them back bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_future_reset_mirrored_in_redis_is_bounded_at_boot() {
    let Some(redis) = RedisServer::start_or_skip("redis_far_future_reset") else {
        return;
    };
    let written = now_ms();
    let far = i64::MAX.to_string();
    for (key, json) in [
        ("keypool:window:a0", far_future_window_json("a0", written)),
        (
            "keypool:cooldown:a0",
            far_future_cooldown_json("a0", written),
        ),
    ] {
        let reply = redis
            .command(&resp(&["SET", key, &json, "PXAT", &far]))
            .unwrap();
        assert_eq!(reply.trim(), "+OK", "{key}");
    }
    let before = now_ms();
    let store = Store::open(redis_config(&redis, 2)).await.unwrap();
    let after = now_ms();
    assert!(matches!(
        store.take_boot_state(),
        Some(BootState::Redis { loaded: true })
    ));
    let a0 = AccountId::from("a0");
    let bounded = before + WEEKLY_BOUND_MS..=after + WEEKLY_BOUND_MS;
    let out = store
        .out_of_window(&a0, after)
        .expect("still out until the bound");
    assert!(bounded.contains(&out.until), "out until {}", out.until);
    let cooling = store.health().cooldowns.cooldown_until(&a0, after).unwrap();
    assert!(bounded.contains(&cooling), "cooling until {cooling}");
    // the reconciliation pushed the bounded state back: Redis forgets it at the bound
    for key in ["keypool:window:a0", "keypool:cooldown:a0"] {
        let ttl = pttl(&redis, key);
        assert!(
            ttl > 0 && ttl <= WEEKLY_BOUND_MS as i64,
            "{key}: PTTL {ttl} beyond the weekly bound"
        );
    }
}

/// The operator's clear-windows on one replica: the other replica drops the window
/// and the cooldown the window set within a second (pub/sub), Redis forgets both, and
/// a replica that boots afterwards loads neither back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_windows_on_one_replica_clears_them_on_the_other() {
    let Some(redis) = RedisServer::start_or_skip("redis_clear_windows") else {
        return;
    };
    let one = Store::open(redis_config(&redis, 2)).await.unwrap();
    let two = Store::open(redis_config(&redis, 2)).await.unwrap();
    let a0 = AccountId::from("a0");
    let now = now_ms();
    let reset = now + 2 * HOUR_MS;
    one.observe_windows(&a0, &rejected_until(reset), now);
    one.record_failure(&attempt(&a0, now), &window_exhausted(reset), now);
    let seen = eventually(Duration::from_secs(1), || {
        two.out_of_window(&a0, now_ms()).map(|o| o.until) == Some(reset)
            && two.health().cooldowns.cooldown_until(&a0, now_ms()) == Some(reset)
    })
    .await;
    assert!(seen.is_some(), "the other replica did not see the window");

    let cleared = one.clear_windows(&a0);
    assert_eq!(cleared.state.unwrap().info.unified_reset, Some(reset));
    assert_eq!(cleared.cooldown.unwrap().until, reset);
    assert_eq!(one.out_of_window(&a0, now_ms()), None);
    assert_eq!(one.health().cooldowns.cooldown_until(&a0, now_ms()), None);
    let gone = eventually(Duration::from_secs(1), || {
        two.out_of_window(&a0, now_ms()).is_none()
            && two
                .health()
                .cooldowns
                .cooldown_until(&a0, now_ms())
                .is_none()
    })
    .await;
    assert!(gone.is_some(), "the other replica still holds the window");
    let forgotten = eventually(Duration::from_secs(1), || {
        ["keypool:window:a0", "keypool:cooldown:a0"]
            .iter()
            .all(|key| {
                redis
                    .command(&format!("EXISTS {key}"))
                    .is_ok_and(|r| r.trim() == ":0")
            })
    })
    .await;
    assert!(
        forgotten.is_some(),
        "Redis still holds the window or its cooldown"
    );
    let three = Store::open(redis_config(&redis, 2)).await.unwrap();
    assert_eq!(three.out_of_window(&a0, now_ms()), None);
    assert_eq!(three.health().cooldowns.cooldown_until(&a0, now_ms()), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_share_the_rotation_and_see_each_others_cooldowns_within_one_second() {
    let Some(redis) = RedisServer::start_or_skip("two_stores_share") else {
        return;
    };
    let n = 5;
    let a = Store::open(redis_config(&redis, n)).await.unwrap();
    let b = Store::open(redis_config(&redis, n)).await.unwrap();
    let config = a.config();
    let route = config.resolve("acme", "grp").unwrap();
    let snapshot = a.snapshot(&route, now_ms());
    let pool = route.pool_key();
    // n picks alternating between the replicas cover every account exactly once
    let mut picked = Vec::new();
    for i in 0..n {
        let store = if i % 2 == 0 { &a } else { &b };
        let counter = store.next_counter(pool.as_str()).await;
        picked.push(snapshot[(counter % n as u64) as usize].id.clone());
    }
    let distinct: BTreeSet<_> = picked.iter().collect();
    assert_eq!(distinct.len(), n, "picks {picked:?}");

    // a cooldown set by A is honoured by B within 1 s (pub/sub)
    let a3 = AccountId::from("a3");
    let now = now_ms();
    let until = a
        .record_failure(&attempt(&a3, now), &plain_429(), now)
        .cooldown_until;
    assert_eq!(until, Some(now + 60_000));
    let took = eventually(Duration::from_secs(1), || {
        b.health().cooldowns.cooldown_until(&a3, now_ms()) == Some(now + 60_000)
    })
    .await;
    assert!(took.is_some(), "B did not see A's cooldown within 1 s");

    // disabling and re-enabling travel too
    let a1 = AccountId::from("a1");
    assert!(b.disable(&a1, "operator", now));
    assert!(
        eventually(Duration::from_secs(1), || a
            .health()
            .disabled
            .is_disabled(&a1))
        .await
        .is_some()
    );
    a.reenable(&a1);
    assert!(
        eventually(Duration::from_secs(1), || !b
            .health()
            .disabled
            .is_disabled(&a1))
        .await
        .is_some()
    );
    // a usage window that takes an account out travels too
    let a4 = AccountId::from("a4");
    let reset = now_ms() + HOUR_MS;
    a.observe_windows(&a4, &five_hour_at(0.99, reset), now_ms());
    assert!(a.out_of_window(&a4, now_ms()).is_some());
    assert!(
        eventually(Duration::from_secs(1), || b
            .out_of_window(&a4, now_ms())
            .map(|o| o.until)
            == Some(reset))
        .await
        .is_some()
    );
    // and so does an operator's cleared cooldown
    b.clear_cooldown(&a3);
    assert!(
        eventually(Duration::from_secs(1), || a
            .health()
            .cooldowns
            .cooldown_until(&a3, now_ms())
            .is_none())
        .await
        .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_test_memory_answers_and_restarted_redis_catches_up() {
    let Some(mut redis) = RedisServer::start_or_skip("redis_killed") else {
        return;
    };
    let store = Store::open(redis_config(&redis, 3)).await.unwrap();
    assert!(store.ready());
    assert_eq!(store.next_counter("acme/g").await, 0);
    assert_eq!(store.next_counter("acme/g").await, 1);

    redis.kill();
    // every operation still answers, from memory, within the configured bound
    let started = Instant::now();
    let counter = store.next_counter("acme/g").await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        counter, 2,
        "the local counter continues the shared rotation"
    );
    let a2 = AccountId::from("a2");
    let now = now_ms();
    let reset = now + 3 * HOUR_MS;
    store.record_failure(&attempt(&a2, now), &window_exhausted(reset), now);
    assert_eq!(
        store.health().cooldowns.cooldown_until(&a2, now),
        Some(reset)
    );
    assert!(!store.ready());
    let status = store.backend_status();
    assert_eq!(status.redis_ready, Some(false));
    assert!(status.redis_fallbacks >= 1);

    // a fresh, empty Redis on the same port: the store reconnects and pushes its state
    redis.restart().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || store.ready())
            .await
            .is_some(),
        "not ready again"
    );
    let other = Store::open(redis_config(&redis, 3)).await.unwrap();
    assert_eq!(
        other.health().cooldowns.cooldown_until(&a2, now_ms()),
        Some(reset)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_opens_and_serves_when_redis_is_down_at_boot() {
    let Some(mut redis) = RedisServer::start_or_skip("redis_down_at_boot") else {
        return;
    };
    redis.kill();
    let store = Store::open(redis_config(&redis, 2)).await.unwrap();
    assert!(matches!(
        store.take_boot_state(),
        Some(BootState::Redis { loaded: false })
    ));
    assert!(!store.ready());
    assert_eq!(store.next_counter("acme/g").await, 0);
    redis.restart().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || store.ready())
            .await
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_session_bindings_and_concurrency_leases() {
    let Some(redis) = RedisServer::start_or_skip("replicas_share_sessions_and_leases") else {
        return;
    };
    let one = Store::open(redis_config(&redis, 2)).await.unwrap();
    let two = Store::open(redis_config(&redis, 2)).await.unwrap();
    let (a0, a1) = (AccountId::from("a0"), AccountId::from("a1"));
    let now = now_ms();

    // A binding written by one replica is read by the other, with its TTL in Redis.
    one.bind_session("acme/team/s1", &a1, 60_000, now).await;
    assert_eq!(
        two.session_account("acme/team/s1", now).await,
        Some(a1.clone())
    );
    let ttl = pttl(&redis, "keypool:session:acme/team/s1");
    assert!(ttl > 55_000 && ttl <= 60_000, "PTTL {ttl}");
    two.bind_session("acme/team/s1", &a0, 60_000, now).await;
    assert_eq!(
        one.session_account("acme/team/s1", now).await,
        Some(a0.clone())
    );

    // A cap of 1 holds across replicas; the slot comes back when its holder drops it.
    let held = one.slots().try_acquire(&a0, 1).await.unwrap();
    assert!(two.slots().try_acquire(&a0, 1).await.is_none());
    assert_eq!(
        two.slots().in_use(&a0),
        0,
        "a refused lease leaves no local count"
    );
    let waiting = {
        let two = two.clone();
        let a0 = a0.clone();
        tokio::spawn(async move {
            two.slots()
                .wait("acme/alice", &[(a0, 1)], Duration::from_secs(5), 0)
                .await
                .map(|g| g.account().clone())
        })
    };
    drop(held);
    assert_eq!(waiting.await.unwrap().unwrap(), a0);
    // The waiter's guard was dropped: its lease goes too (released in the background).
    let empty = eventually(Duration::from_secs(2), || {
        redis
            .command("ZCARD keypool:leases:a0")
            .is_ok_and(|n| n.trim_start_matches(':').trim() == "0")
    })
    .await;
    assert!(empty.is_some(), "leases left behind");

    // A crashed replica's lease (expired) does not count.
    let stale = now_ms() - 1;
    redis
        .command(&format!("ZADD keypool:leases:a1 {stale} dead-replica:1"))
        .unwrap();
    let guard = two.slots().try_acquire(&a1, 1).await;
    assert!(guard.is_some(), "an expired lease must not hold the slot");
    assert!(one.slots().try_acquire(&a1, 1).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_request_given_up_while_redis_answers_leaves_no_local_count() {
    let Some(redis) = RedisServer::start_or_skip("slot_request_given_up") else {
        return;
    };
    let store = Store::open(redis_config(&redis, 1)).await.unwrap();
    let a0 = AccountId::from("a0");
    // One poll (the local reservation, then the wait for Redis's lease answer), then
    // the future is dropped: a request cancelled by its client at that point. While the
    // store still reconciles with Redis a slot is taken locally at once; try again.
    let mut given_up = false;
    for _ in 0..100 {
        match tokio::time::timeout(Duration::ZERO, store.slots().try_acquire(&a0, 1)).await {
            Err(_) => {
                given_up = true;
                break;
            }
            Ok(guard) => drop(guard),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(given_up, "every slot request was answered within one poll");
    assert_eq!(
        store.slots().in_use(&a0),
        0,
        "the reservation was not undone"
    );
}

/// A store on `url` with `redis_timeout_ms = timeout_ms`. The periodic rating sync is
/// off (once an hour), so that the background task's only Redis work is the probe.
async fn open_on(url: &str, timeout_ms: u64) -> Store {
    Store::open(config(&config_text(
        2,
        &format!(
            "redis_url = {url:?}\nredis_timeout_ms = {timeout_ms}\nstate_snapshot_interval_secs = 3600"
        ),
    )))
    .await
    .unwrap_or_else(|e| panic!("the store does not open: {e}"))
}

/// Levels of nesting the hostile fake answers with: far beyond any stack.
const DEEP: usize = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_answering_a_million_nested_arrays_at_boot_is_cut_off_and_the_store_serves_from_memory()
 {
    let fake = FakeRedis::start(FakeReply::Nested(DEEP)).unwrap();
    let store = open_on(&fake.url(), 500).await;
    assert!(matches!(
        store.take_boot_state(),
        Some(BootState::Redis { loaded: false })
    ));
    assert!(!store.ready(), "a Redis answering garbage is not ready");
    assert!(fake.count("PING") >= 1, "the fake was asked and answered");
    // the store answers from memory, and the process is still alive to say so
    assert_eq!(store.next_counter("acme/g").await, 0);
    assert_eq!(store.next_counter("acme/g").await, 1);
    assert!(store.backend_status().redis_fallbacks >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_turns_to_nested_replies_at_runtime_is_cut_off_and_comes_back_when_sane() {
    let fake = FakeRedis::start(FakeReply::Normal).unwrap();
    let store = open_on(&fake.url(), 500).await;
    assert!(store.ready(), "the fake answers like a Redis at first");
    assert_eq!(store.next_counter("acme/g").await, 0);
    assert_eq!(fake.count("INCR"), 1);

    fake.set_mode(FakeReply::Nested(DEEP));
    // this INCR gets the nested answer: cut off, the counter comes from memory
    assert_eq!(store.next_counter("acme/g").await, 1);
    assert!(fake.count("INCR") >= 2, "the INCR reached the fake");
    assert!(!store.ready());

    fake.set_mode(FakeReply::Normal);
    assert!(
        eventually(Duration::from_secs(10), || store.ready())
            .await
            .is_some(),
        "not reconciled after the fake answered sanely again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_passes_auth_and_select_through_to_redis() {
    let fake = FakeRedis::start(FakeReply::Normal).unwrap();
    let url = format!("redis://:relay-pw-0x5e@127.0.0.1:{}/3", fake.port());
    let store = open_on(&url, 500).await;
    assert!(store.ready());
    let commands = fake.commands();
    assert!(
        commands.contains(&vec!["AUTH".to_owned(), "relay-pw-0x5e".to_owned()]),
        "{commands:?}"
    );
    assert!(
        commands.contains(&vec!["SELECT".to_owned(), "3".to_owned()]),
        "{commands:?}"
    );
}

/// `redis_timeout_ms` of the hung-Redis tests: a request that waited on Redis would
/// take this long, far beyond [`NO_WAIT`].
const HUNG_TIMEOUT_MS: u64 = 10_000;

/// The bound on 20 rounds of every request-path call once Redis is known unhealthy:
/// half of one Redis timeout, so a single call that waited on Redis breaks it.
const NO_WAIT: Duration = Duration::from_secs(5);

/// Every Redis call one request can make: the rotation counter, the session lookup
/// and binding, a capped slot taken and given back, and a slot waited for.
async fn every_request_path_call(store: &Store) {
    let a0 = AccountId::from("a0");
    let now = now_ms();
    store.next_counter("acme/g").await;
    let _ = store.session_account("acme/team/s1", now).await;
    store.bind_session("acme/team/s1", &a0, 60_000, now).await;
    drop(store.slots().try_acquire(&a0, 1).await);
    let waited = store
        .slots()
        .wait("acme/alice", &[(a0.clone(), 1)], Duration::from_secs(1), 0)
        .await;
    assert!(waited.is_ok(), "{waited:?}");
}

/// Once the first failure marked Redis unhealthy, no request-path call waits on it nor
/// sends it anything (the background probe alone does) until it is reconciled.
async fn unhealthy_redis_is_left_to_the_background_probe(fault: Option<FakeReply>, test: &str) {
    let Some(redis) = FaultyRedis::start_or_skip(fault, test) else {
        return;
    };
    let store = open_on(&redis.url(), HUNG_TIMEOUT_MS).await;
    assert!(store.ready());
    every_request_path_call(&store).await;
    // leases are given back in the background: wait until both arrived
    let released = eventually(Duration::from_secs(5), || {
        redis.leases_held("a0") == Some(0)
    })
    .await;
    assert!(released.is_some(), "the leases were not given back");
    let before_fault = redis.request_path_commands().expect("the server can count");

    redis.break_it();
    // the first call after the fault finds out (a hung Redis: after its timeout)
    store.next_counter("acme/g").await;
    let marked = eventually(Duration::from_millis(HUNG_TIMEOUT_MS * 2), || {
        !store.ready()
    })
    .await;
    assert!(marked.is_some(), "never marked unhealthy");
    // a fake can say at once what it received; a stopped server only once resumed
    let sent = redis.request_path_commands();
    // 20 rounds paced over ~1 s: several maintenance ticks (200 ms), so most rounds run
    // while a background probe is in flight (it hangs for a hung Redis)
    let rounds = tokio::time::timeout(NO_WAIT, async {
        let mut pace = tokio::time::interval(Duration::from_millis(50));
        for _ in 0..20 {
            pace.tick().await;
            every_request_path_call(&store).await;
        }
    })
    .await;
    assert!(
        rounds.is_ok(),
        "a request-path call waited on the unhealthy Redis"
    );
    if sent.is_some() {
        assert_eq!(
            redis.request_path_commands(),
            sent,
            "a request-path call was sent to the unhealthy Redis"
        );
    }
    assert!(!store.ready());

    redis.restore();
    let back = eventually(Duration::from_millis(HUNG_TIMEOUT_MS * 2), || store.ready()).await;
    assert!(back.is_some(), "not reconciled after Redis recovered");
    let after = redis.request_path_commands().expect("the server can count");
    assert_eq!(
        after,
        sent.unwrap_or(before_fault + 1),
        "only the call that found the fault reached Redis"
    );
    let fallbacks = store.backend_status().redis_fallbacks;
    every_request_path_call(&store).await;
    assert_eq!(
        store.backend_status().redis_fallbacks,
        fallbacks,
        "Redis answered again"
    );
    assert!(
        redis.request_path_commands().expect("the server can count") >= after + 5,
        "the calls use Redis again (INCR, GET, SET, EVAL at least)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigstopped_redis_is_not_waited_for_by_requests_once_known_unhealthy() {
    unhealthy_redis_is_left_to_the_background_probe(None, "sigstopped_redis_requests").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_never_answers_is_not_asked_by_requests_once_known_unhealthy() {
    unhealthy_redis_is_left_to_the_background_probe(Some(FakeReply::Silent), "silent").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_answering_garbage_is_not_asked_by_requests_once_known_unhealthy() {
    unhealthy_redis_is_left_to_the_background_probe(Some(FakeReply::Garbage), "garbage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_answering_err_to_everything_is_not_asked_by_requests_once_known_unhealthy() {
    unhealthy_redis_is_left_to_the_background_probe(Some(FakeReply::Error), "err").await;
}

/// SPEC 16 through Redis: a model lockout and a terminal state (`banned`) set on one
/// replica are seen by the other within a second and by a store opened later; clearing
/// the lockout on one clears it everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockouts_and_terminal_states_are_shared_through_redis() {
    use keypool_cooldown::{Classification, FailureClass, Terminal, Trigger};
    let Some(redis) = RedisServer::start_or_skip("redis_lockouts_and_bans") else {
        return;
    };
    let one = Store::open(redis_config(&redis, 2)).await.unwrap();
    let two = Store::open(redis_config(&redis, 2)).await.unwrap();
    let (a0, a1) = (AccountId::from("a0"), AccountId::from("a1"));
    let now = now_ms();
    let not_found = Classification {
        class: FailureClass::Transient,
        trigger: Trigger::ModelNotFound,
    };
    let locked = one.record_failure(&attempt(&a0, now), &not_found, now);
    let until = locked
        .locked_until
        .expect("a 404 not_found_error locks the model");
    let banned = Classification {
        class: FailureClass::KeyError,
        trigger: Trigger::Banned { status: 403 },
    };
    assert_eq!(
        one.record_failure(&attempt(&a1, now), &banned, now)
            .terminal,
        Some(Terminal::Banned)
    );
    let seen = eventually(Duration::from_secs(1), || {
        two.health()
            .lockouts
            .locked_until(&a0, "claude-sonnet-4-5", now_ms())
            == Some(until)
            && two
                .health()
                .disabled
                .get(&a1)
                .is_some_and(|d| d.state == Terminal::Banned)
    })
    .await;
    assert!(
        seen.is_some(),
        "the other replica did not see the lockout and the ban"
    );
    let three = Store::open(redis_config(&redis, 2)).await.unwrap();
    assert_eq!(
        three
            .health()
            .lockouts
            .locked_until(&a0, "claude-sonnet-4-5", now_ms()),
        Some(until)
    );
    assert_eq!(
        three.health().disabled.get(&a1).unwrap().state,
        Terminal::Banned
    );

    assert_eq!(one.clear_lockouts(&a0, None, now_ms()), 1);
    let gone = eventually(Duration::from_secs(1), || {
        two.health().lockouts.is_empty()
            && redis
                .command("HLEN keypool:lockouts")
                .is_ok_and(|r| r.trim() == ":0")
    })
    .await;
    assert!(gone.is_some(), "the lockout is still held elsewhere");
}
