//! SPEC 5 usage windows end to end: what every response's headers do to the pool.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use keypool_core::Window;
use keypool_proxy::rescue::format_utc;
use keypool_sim::{Behaviour, ErrorReply, Script, UnifiedHeaders};
use keypool_store::now_ms;
use keypool_tests::{AccountSpec, Harness};

fn at(window: Window, utilization: f64, reset_s: u64) -> Script {
    Script::ok().unified(&UnifiedHeaders::allowed().window(
        window,
        utilization,
        reset_s,
        "allowed_warning",
    ))
}

#[tokio::test]
async fn each_account_uses_its_own_window_threshold() {
    let reset = now_ms() / 1000 + 3600;
    let h = Harness::builder()
        .account(
            AccountSpec::new("a", at(Window::FiveHour, 0.6, reset))
                .toml("window_threshold = 0.5")
                .priority(0),
        )
        .account(AccountSpec::new("b", at(Window::FiveHour, 0.6, reset)).priority(1))
        .start()
        .await;
    for _ in 0..3 {
        assert_eq!(h.send_message().await.status, 200);
    }
    // a is out at 60 % (its threshold is 50 %), b stays in (default 95 %)
    assert_eq!(h.upstream_order(), ["a", "b", "b"]);
    h.finish().await;
}

#[tokio::test]
async fn a_window_rejected_429_takes_the_account_out_until_its_reset() {
    let reset = now_ms() / 1000 + 2 * 3600;
    let h = Harness::with_accounts([(
        "a",
        Script::new(ErrorReply::rate_limited().unified(&UnifiedHeaders::rejected(reset))),
    )])
    .await;
    let r = h.send_message().await;
    r.assert_keypool_error(429, "rate_limit_error");
    // the next request is answered at once from the window state: nothing upstream
    let r = h.send_message().await;
    let message = r.assert_keypool_error(429, "rate_limit_error");
    assert!(message.contains("5h"), "{message}");
    assert!(message.contains(&format_utc(reset * 1000)), "{message}");
    assert_eq!(h.sim().total_stats().requests, 1);
    h.finish().await;
}

/// SPEC 5: `requests-remaining: 0` takes an API-key account out until the reset. The
/// proxy treats it as a cooldown (its documented decision: a request limit is not a
/// `5h`/`weekly` window), so with every account out the earliest one is still tried.
#[tokio::test]
async fn api_key_accounts_with_no_requests_remaining_leave_rotation_until_the_reset() {
    let reset_ms = (now_ms() / 1000 + 1800) * 1000;
    let exhausted = Script::ok()
        .header("anthropic-ratelimit-requests-remaining", "0")
        .header("anthropic-ratelimit-requests-reset", format_utc(reset_ms));
    let h = Harness::with_accounts([("a", exhausted), ("b", Script::ok())]).await;
    for _ in 0..3 {
        assert_eq!(h.send_message().await.status, 200);
    }
    assert_eq!(
        h.upstream_order(),
        ["a", "b", "b"],
        "a is out until its reset"
    );
    h.finish().await;
}

#[tokio::test]
async fn passing_the_reset_puts_the_account_back_without_any_request() {
    let reset_s = now_ms() / 1000 + 1;
    let h = Harness::with_accounts([("a", at(Window::FiveHour, 0.99, reset_s))]).await;
    assert_eq!(h.send_message().await.status, 200);
    h.sim()
        .set_script("a", Script::new(Behaviour::ok()))
        .unwrap();
    let r = h.send_message().await;
    r.assert_keypool_error(429, "rate_limit_error");
    assert_eq!(h.sim().total_stats().requests, 1);
    // the reset is a point in time: once it has passed the account is back
    let wait = (reset_s * 1000 + 20).saturating_sub(now_ms());
    tokio::time::sleep(Duration::from_millis(wait)).await;
    assert_eq!(h.send_message().await.status, 200);
    assert_eq!(h.sim().total_stats().requests, 2);
    h.finish().await;
}

#[tokio::test]
async fn window_headers_of_a_stream_count_too() {
    let reset = now_ms() / 1000 + 3600;
    let h =
        Harness::with_accounts([("a", at(Window::Weekly, 0.99, reset)), ("b", Script::ok())]).await;
    assert_eq!(h.send_stream().await.status, 200);
    assert_eq!(h.send_stream().await.status, 200);
    assert_eq!(h.upstream_order(), ["a", "b"]);
    h.finish().await;
}
