//! Session affinity end to end (issue 10): a session stays on its account whatever the
//! strategy, moves when that account starts cooling, and replicas on one Redis agree.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use keypool_proxy::metrics::AffinityOutcome;
use keypool_sim::{Behaviour, ErrorReply};
use keypool_tests::{Harness, MODEL, message_body};

const SESSION: &str = "x-claude-code-session-id";

async fn round_robin_pool() -> Harness {
    Harness::builder()
        .strategy("round_robin")
        // a fixed snapshot order, so that round_robin visibly rotates
        .server("snapshot_ttl_secs", "15")
        .healthy_accounts(&["a", "b", "c"])
        .start()
        .await
}

/// Sends one message (with `session` when given) and returns the account that served it.
async fn served_by(h: &Harness, session: Option<&str>) -> String {
    let mut request = h.messages(&message_body(MODEL, false));
    if let Some(session) = session {
        request = request.header(SESSION, session);
    }
    let reply = request.send().await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    h.upstream_order().last().cloned().unwrap()
}

fn affinity(h: &Harness) -> [u64; 3] {
    AffinityOutcome::ALL.map(|o| h.app().metrics().affinity_count(o))
}

#[tokio::test]
async fn a_session_sticks_across_20_requests_while_others_round_robin() {
    let h = round_robin_pool().await;
    let mut session_accounts = Vec::new();
    let mut others = Vec::new();
    for _ in 0..20 {
        session_accounts.push(served_by(&h, Some("s-1")).await);
        others.push(served_by(&h, None).await);
    }
    assert!(
        session_accounts.iter().all(|a| *a == session_accounts[0]),
        "{session_accounts:?}"
    );
    // The pool keeps rotating for everyone else (the session's requests advance the
    // counter too, so each account gets about a third).
    for id in ["a", "b", "c"] {
        let n = others.iter().filter(|o| *o == id).count();
        assert!((6..=7).contains(&n), "{id}: {n} of {others:?}");
    }
    // hit, miss, rebind
    assert_eq!(affinity(&h), [19, 1, 0]);
    // Session headers never reach the upstream.
    assert!(
        h.sim()
            .requests()
            .iter()
            .all(|r| r.header(SESSION).is_none())
    );
    h.finish().await;
}

#[tokio::test]
async fn the_session_part_of_metadata_user_id_is_a_session_key() {
    let h = round_robin_pool().await;
    let mut body = message_body(MODEL, false);
    body["metadata"] = serde_json::json!({
        "user_id": "user_5dd07c33da27e6d2968d94ea20bf47a7b090b6b158b82328d54da2909a108e84_account__session_d2e70091-3007-41a3-a916-cb8b0d3098de"
    });
    let mut served = Vec::new();
    for _ in 0..6 {
        let r = h.messages(&body).send().await;
        assert_eq!(r.status, 200, "{}", r.text());
        served.push(h.upstream_order().last().cloned().unwrap());
    }
    assert!(served.iter().all(|a| *a == served[0]), "{served:?}");
    assert_eq!(affinity(&h), [5, 1, 0]);
    h.finish().await;
}

#[tokio::test]
async fn a_session_moves_exactly_when_its_account_starts_cooling() {
    let h = round_robin_pool().await;
    let first = served_by(&h, Some("s-2")).await;
    for _ in 0..3 {
        assert_eq!(served_by(&h, Some("s-2")).await, first);
    }
    assert!(h.cooldown(&first).is_none());
    // Its account answers the next request with a 429: it starts cooling, the request
    // fails over, and the session follows the account that served it.
    h.sim()
        .push(
            &first,
            [Behaviour::from(
                ErrorReply::rate_limited().retry_after_secs(60),
            )],
        )
        .unwrap();
    let moved_to = served_by(&h, Some("s-2")).await;
    assert_ne!(moved_to, first);
    assert!(h.cooldown(&first).is_some());
    assert_eq!(affinity(&h), [4, 1, 1]);
    // It stays there, even once the old account is back.
    h.store()
        .clear_cooldown(&keypool_core::AccountId::from(first.as_str()));
    for _ in 0..3 {
        assert_eq!(served_by(&h, Some("s-2")).await, moved_to);
    }
    assert_eq!(affinity(&h), [7, 1, 1]);
    h.finish().await;
}

#[tokio::test]
async fn a_disabled_or_removed_account_releases_its_sessions_and_ttl_zero_turns_affinity_off() {
    let h = round_robin_pool().await;
    let first = served_by(&h, Some("s-3")).await;
    h.store().disable(
        &keypool_core::AccountId::from(first.as_str()),
        "test",
        keypool_store::now_ms(),
    );
    let moved_to = served_by(&h, Some("s-3")).await;
    assert_ne!(moved_to, first);
    assert_eq!(served_by(&h, Some("s-3")).await, moved_to);
    h.finish().await;

    let h = Harness::builder()
        .strategy("round_robin")
        .server("snapshot_ttl_secs", "15")
        .server("session_affinity_ttl_secs", "0")
        .healthy_accounts(&["a", "b"])
        .start()
        .await;
    let served = [
        served_by(&h, Some("s-4")).await,
        served_by(&h, Some("s-4")).await,
    ];
    assert_ne!(served[0], served[1], "affinity is off: the pool rotates");
    assert_eq!(affinity(&h), [0, 0, 0]);
    h.finish().await;
}
