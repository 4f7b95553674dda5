//! The test support checks itself: the global "no sk-lb- upstream" assertion can fail.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use keypool_sim::Script;
use keypool_tests::{Client, Harness, MODEL, message_body, secret_of};

/// Sends a request straight to the simulator (bypassing keypool) with `header`.
async fn leak_directly(h: &Harness, header: (&str, &str)) {
    let r = Client::new()
        .post(format!("{}/v1/messages", h.sim().base_url()))
        .api_key(&secret_of("a"))
        .header(header.0, header.1)
        .json(&message_body(MODEL, false))
        .send()
        .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
#[should_panic(expected = "the upstream received an sk-lb- value")]
async fn the_global_check_catches_an_lb_key_upstream() {
    let h = Harness::with_accounts([("a", Script::ok())]).await;
    let key = h.key("alice");
    leak_directly(&h, ("x-forwarded-key", &key)).await;
    h.finish().await;
}

#[tokio::test]
#[should_panic(expected = "the random part of LB key alice")]
async fn the_global_check_catches_a_stripped_prefix() {
    let h = Harness::with_accounts([("a", Script::ok())]).await;
    let key = h.key("alice");
    leak_directly(&h, ("x-forwarded-key", &key["sk-lb-".len()..])).await;
    h.finish().await;
}

#[tokio::test]
#[should_panic(expected = "the upstream received an sk-lb- value")]
async fn dropping_a_harness_checks_too() {
    let h = Harness::with_accounts([("a", Script::ok())]).await;
    leak_directly(&h, ("x-anything", "sk-lb-whatever")).await;
    drop(h);
}
