//! Redis beyond one server (issue 21): a three-node Cluster and a Sentinel deployment,
//! each started by the test on free loopback ports. Replicas share state as on one
//! server (counters, cooldowns over pub/sub, session bindings, the lease script,
//! state read back at boot), and every connection keypool's client makes (seed nodes,
//! discovered nodes, sentinel and primary) goes through the reply guard; a hostile
//! seed node cannot crash the process. Under `CI=true` a missing `redis-server` or
//! `redis-cli` fails these tests instead of skipping them.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use keypool_core::AccountId;
use keypool_store::testing::{FakeRedis, FakeReply, RedisCluster, RedisSentinel};
use keypool_store::{BootState, Store, now_ms};

fn store_config(url: &str, n: usize) -> keypool_store::config::Config {
    config(&config_text(
        n,
        &format!("redis_url = {url:?}\nredis_timeout_ms = 500"),
    ))
}

/// Polls `cond` every 10 ms until it holds or `within` passes.
async fn eventually(within: Duration, mut cond: impl AsyncFnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond().await
}

/// Opens a store on `url` and waits (bounded) until its first reconciliation made it
/// ready.
async fn ready_store(url: &str, n: usize) -> Store {
    let store = Store::open(store_config(url, n)).await.unwrap();
    let ready = eventually(Duration::from_secs(10), async || {
        store.maintain(now_ms()).await;
        store.ready()
    })
    .await;
    assert!(ready, "the store never became ready on {url}");
    store
}

/// What two replicas on the same Redis must share, whatever the topology.
async fn replicas_share_state(one: &Store, two: &Store) {
    // the rotation counter (INCR): the two stores never hand out the same value
    let mut seen = BTreeSet::new();
    for _ in 0..5 {
        assert!(seen.insert(one.next_counter("acme/g").await));
        assert!(seen.insert(two.next_counter("acme/g").await));
    }
    assert_eq!(seen.len(), 10);
    // a cooldown, published: the other replica sees it within a second
    let a0 = AccountId::from("a0");
    let now = now_ms();
    one.record_failure(&attempt(&a0, now), &plain_429(), now);
    let until = one.health().cooldowns.cooldown_until(&a0, now).unwrap();
    assert!(
        eventually(Duration::from_secs(1), async || {
            two.health().cooldowns.cooldown_until(&a0, now_ms()) == Some(until)
        })
        .await,
        "the other replica did not see the cooldown"
    );
    // a session binding
    let a1 = AccountId::from("a1");
    one.bind_session("acme/team/s1", &a1, 60_000, now_ms())
        .await;
    assert_eq!(
        two.session_account("acme/team/s1", now_ms()).await,
        Some(a1.clone())
    );
    // the lease script (one key): a cap of 1 holds across the replicas
    let slot = one
        .slots()
        .try_acquire(&a1, 1)
        .await
        .expect("the first slot");
    assert!(
        two.slots().try_acquire(&a1, 1).await.is_none(),
        "two leases under a cap of 1"
    );
    drop(slot);
    assert!(
        eventually(Duration::from_secs(2), async || two
            .slots()
            .try_acquire(&a1, 1)
            .await
            .is_some())
        .await,
        "the released lease never came back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_a_three_node_cluster_share_state_through_the_reply_guard() {
    let Some(cluster) = RedisCluster::start_or_skip("redis_cluster") else {
        return;
    };
    let url = cluster.url();
    let one = ready_store(&url, 4).await;
    let two = ready_store(&url, 4).await;
    replicas_share_state(&one, &two).await;
    // the keys are spread over the nodes by slot, each command sent where its key lives
    let now = now_ms();
    for i in 0..4 {
        let account = AccountId::from(format!("a{i}").as_str());
        one.record_failure(&attempt(&account, now), &plain_429(), now);
    }
    assert!(
        eventually(Duration::from_secs(2), async || cluster
            .keys_per_node()
            .iter()
            .filter(|&&n| n > 0)
            .count()
            >= 2)
        .await,
        "keys on one node only: {:?}",
        cluster.keys_per_node()
    );
    let key = "keypool:cooldown:a3";
    assert!(
        eventually(Duration::from_secs(2), async || cluster
            .command_for_key(key, &format!("EXISTS {key}"))
            .is_ok_and(|r| r.trim() == ":1"))
        .await
    );
    // a replica that boots now reads every cooldown back by key (no SCAN)
    let three = Store::open(store_config(&url, 4)).await.unwrap();
    assert!(matches!(
        three.take_boot_state(),
        Some(BootState::Redis { loaded: true })
    ));
    for i in 0..4 {
        let account = AccountId::from(format!("a{i}").as_str());
        assert!(
            three
                .health()
                .cooldowns
                .cooldown_until(&account, now_ms())
                .is_some(),
            "a{i}"
        );
    }
    // every node was reached through a relay of the reply guard, and nothing else
    for store in [&one, &two, &three] {
        let relayed: BTreeSet<String> = store.redis_relay_targets().into_iter().collect();
        let nodes: BTreeSet<String> = cluster.addresses().into_iter().collect();
        assert_eq!(relayed, nodes);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_through_a_sentinel_share_state_through_the_reply_guard() {
    let Some(sentinel) = RedisSentinel::start_or_skip("redis_sentinel") else {
        return;
    };
    let url = sentinel.url();
    let one = ready_store(&url, 2).await;
    let two = ready_store(&url, 2).await;
    replicas_share_state(&one, &two).await;
    // the state is on the primary the sentinel named
    assert_eq!(
        sentinel
            .primary_command("EXISTS keypool:cooldown:a0")
            .unwrap()
            .trim(),
        ":1"
    );
    let (sentinel_addr, primary_addr) = sentinel.addresses();
    for store in [&one, &two] {
        let relayed: BTreeSet<String> = store.redis_relay_targets().into_iter().collect();
        assert_eq!(
            relayed,
            BTreeSet::from([sentinel_addr.clone(), primary_addr.clone()])
        );
    }
}

/// A "cluster seed" or "sentinel" answering every command a million arrays deep:
/// the reply guard refuses it, the store serves from memory, the process lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_cluster_seed_or_sentinel_is_refused_by_the_reply_guard() {
    for scheme in ["redis-cluster", "redis-sentinel"] {
        let fake = FakeRedis::start(FakeReply::Nested(1_000_000)).unwrap();
        let url = match scheme {
            "redis-cluster" => format!("redis-cluster://127.0.0.1:{}", fake.port()),
            _ => format!(
                "redis-sentinel://127.0.0.1:{}/0?sentinelServiceName=mymaster",
                fake.port()
            ),
        };
        let store = Store::open(store_config(&url, 2)).await.unwrap();
        assert!(matches!(
            store.take_boot_state(),
            Some(BootState::Redis { loaded: false })
        ));
        for _ in 0..5 {
            store.maintain(now_ms()).await;
        }
        assert!(!store.ready(), "{scheme}: a hostile Redis is not ready");
        assert!(
            !fake_commands(&fake).is_empty(),
            "{scheme}: the fake was asked nothing"
        );
        assert_eq!(
            store.redis_relay_targets(),
            [format!("127.0.0.1:{}", fake.port())],
            "{scheme}"
        );
        // still serving from memory
        let a0 = AccountId::from("a0");
        let now = now_ms();
        store.record_failure(&attempt(&a0, now), &plain_429(), now);
        assert!(store.health().cooldowns.cooldown_until(&a0, now).is_some());
    }
}

/// The commands the fake received (any that fred sends first: `CLUSTER`, `SENTINEL`,
/// `HELLO`, `PING`, `CLIENT`, …).
fn fake_commands(fake: &FakeRedis) -> Vec<&'static str> {
    [
        "CLUSTER", "SENTINEL", "HELLO", "PING", "CLIENT", "INFO", "ROLE",
    ]
    .into_iter()
    .filter(|c| fake.count(c) > 0)
    .collect()
}
