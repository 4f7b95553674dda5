//! SPEC 4 plan orders end to end: which account serves each request of a sequence.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use keypool_sim::{Behaviour, Script};
use keypool_tests::{AccountSpec, Harness};

async fn serve(h: &Harness, n: usize) -> Vec<String> {
    for _ in 0..n {
        let r = h.send_message().await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    h.upstream_order()
}

fn count(order: &[String], id: &str) -> usize {
    order.iter().filter(|s| *s == id).count()
}

#[tokio::test]
async fn round_robin_rotates_over_the_pool() {
    let h = Harness::builder()
        .strategy("round_robin")
        .server("snapshot_ttl_secs", "15")
        .healthy_accounts(&["a", "b", "c"])
        .start()
        .await;
    let order = serve(&h, 9).await;
    for id in ["a", "b", "c"] {
        assert_eq!(count(&order, id), 3, "{order:?}");
    }
    // never the same account twice in a row while all are available
    assert!(order.windows(2).all(|w| w[0] != w[1]), "{order:?}");
    h.finish().await;
}

#[tokio::test]
async fn no_group_pool_uses_round_robin() {
    let h = Harness::builder()
        .no_group()
        .server("snapshot_ttl_secs", "15")
        .healthy_accounts(&["a", "b"])
        .start()
        .await;
    let order = serve(&h, 4).await;
    assert_eq!(count(&order, "a"), 2, "{order:?}");
    assert_eq!(count(&order, "b"), 2, "{order:?}");
    h.finish().await;
}

#[tokio::test]
async fn weighted_serves_each_account_its_weight() {
    let h = Harness::builder()
        .strategy("weighted")
        .server("snapshot_ttl_secs", "15")
        .account(AccountSpec::new("a", Script::ok()).toml("weight = 3"))
        .account(AccountSpec::new("b", Script::ok()).toml("weight = 2"))
        .account(AccountSpec::new("c", Script::ok()).toml("weight = 1"))
        .start()
        .await;
    let order = serve(&h, 12).await;
    assert_eq!(
        (count(&order, "a"), count(&order, "b"), count(&order, "c")),
        (6, 4, 2),
        "{order:?}"
    );
    h.finish().await;
}

#[tokio::test]
async fn priority_serves_the_lowest_priority_first() {
    let h = Harness::builder()
        .strategy("priority")
        .account(AccountSpec::new("low", Script::ok()).priority(5))
        .account(AccountSpec::new("high", Script::ok()).priority(-1))
        .start()
        .await;
    let order = serve(&h, 3).await;
    assert_eq!(order, ["high", "high", "high"]);
    h.finish().await;
}

#[tokio::test]
async fn rated_puts_an_erroring_account_last() {
    let h = Harness::builder()
        .strategy("rated")
        .account(AccountSpec::new("a", Script::ok().then(Behaviour::status(500))).priority(0))
        .account(AccountSpec::new("b", Script::ok()).priority(1))
        .start()
        .await;
    // a fails once (b serves), then b is ahead of a by error rate
    let order = serve(&h, 3).await;
    assert_eq!(order, ["a", "b", "b", "b"]);
    h.finish().await;
}

/// With `snapshot_ttl_secs = 0` (or under low traffic, when every request finds the
/// cached snapshot expired) the snapshot is re-sorted by `last_used` for every request;
/// `round_robin` still rotates, because it rotates the stable (`priority`, `id`) order.
#[tokio::test]
async fn round_robin_rotates_even_when_the_snapshot_is_rebuilt_per_request() {
    let h = Harness::builder()
        .strategy("round_robin")
        .server("snapshot_ttl_secs", "0")
        .healthy_accounts(&["a", "b", "c"])
        .start()
        .await;
    let order = serve(&h, 9).await;
    for id in ["a", "b", "c"] {
        assert_eq!(count(&order, id), 3, "{order:?}");
    }
    h.finish().await;
}

/// With a cached snapshot the planner reuses the filters' survivors between requests
/// (`KeptSurvivors`): a new cooldown must drop them at once, and so must its clearing.
#[tokio::test]
async fn kept_survivors_follow_a_new_cooldown_and_its_clearing() {
    let h = Harness::builder()
        .strategy("round_robin")
        .server("snapshot_ttl_secs", "15")
        .account(AccountSpec::new("a", Script::ok()))
        .account(AccountSpec::new(
            "b",
            Script::ok().then(keypool_sim::ErrorReply::rate_limited().retry_after_secs(600)),
        ))
        .account(AccountSpec::new("c", Script::ok()))
        .start()
        .await;
    // Three requests: one of them reaches b, which answers 429 (10-minute cooldown);
    // that request fails over. Survivors were kept before it.
    let first = serve(&h, 3).await;
    assert_eq!(count(&first, "b"), 1, "{first:?}");
    // From now on b is cooling: the kept survivors that included b must be gone.
    let cooling = serve(&h, 12).await;
    assert_eq!(
        count(&cooling, "b"),
        1,
        "b was tried while cooling: {cooling:?}"
    );
    assert_eq!(
        count(&cooling, "a") + count(&cooling, "c"),
        16 - 1,
        "{cooling:?}"
    );
    // Clearing the cooldown brings b back without waiting for the snapshot to expire.
    h.store()
        .clear_cooldown(&keypool_core::AccountId::from("b"));
    let back = serve(&h, 6).await;
    assert!(
        count(&back, "b") > 1,
        "b not back after its cooldown was cleared: {back:?}"
    );
    h.finish().await;
}
