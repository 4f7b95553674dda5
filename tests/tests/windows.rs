//! SPEC 5 usage windows end to end: what every response's headers do to the pool.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use keypool_core::{AccountId, Window};
use keypool_proxy::reject::format_utc;
use keypool_sim::{Behaviour, ErrorReply, Script, UnifiedHeaders};
use keypool_store::now_ms;
use keypool_tests::{AccountSpec, Harness, LogLines, admin_account, secret_of};

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
    let first = h.send_stream().await;
    assert_eq!(first.status, 200);
    // the account's window is not the client's business: not forwarded
    assert!(
        first
            .headers
            .keys()
            .all(|k| !k.as_str().starts_with("anthropic-ratelimit")),
        "{:?}",
        first.header_names()
    );
    assert_eq!(h.send_stream().await.status, 200);
    assert_eq!(h.upstream_order(), ["a", "b"]);
    h.finish().await;
}

const ADMIN_TOKEN: &str = "windows-admin-token-4c1e9b";

/// The weekly bound of a reset (docs/RELIABILITY.md, "Hostile rate-limit headers"):
/// 7 days and 5 minutes of slack after the response. The overall `-reset` has it too.
const WEEKLY_BOUND_MS: u64 = 7 * 24 * 3_600_000 + 5 * 60_000;

/// The `Retry-After` of `reply`, in seconds.
fn retry_after(reply: &keypool_tests::Reply) -> u64 {
    reply
        .header("retry-after")
        .expect("retry-after")
        .parse()
        .unwrap()
}

/// Every warning of this test process, captured by one global subscriber. (A
/// thread-local `set_default` lost lines now and then: tracing caches a callsite's
/// interest process-wide, so a callsite first reached on another test's thread, with
/// no subscriber there, could stay disabled.)
fn process_logs() -> LogLines {
    static LINES: std::sync::OnceLock<LogLines> = std::sync::OnceLock::new();
    LINES
        .get_or_init(|| {
            let lines = LogLines::default();
            let writer = lines.clone();
            let _ = tracing::subscriber::set_global_default(
                tracing_subscriber::fmt()
                    .with_max_level(tracing::Level::WARN)
                    .with_ansi(false)
                    .with_writer(move || writer.clone())
                    .finish(),
            );
            lines
        })
        .clone()
}

/// Issue 14 item 6: one 429 with `-status: rejected` and a reset in the year
/// 3 trillion took the account out until `u64::MAX`, told clients `Retry-After:
/// 18446742277600448`, and no admin route brought it back. Now the reset is clamped to
/// the weekly bound (with a warning naming the account and the header), the pool's 429
/// says at most that, and `clear-windows` returns the account to service.
#[tokio::test]
async fn a_far_future_reset_keeps_an_account_out_for_at_most_a_week_and_clear_windows_ends_it() {
    let lines = process_logs();
    let far_future = ErrorReply::rate_limited()
        .header("anthropic-ratelimit-unified-status", "rejected")
        .header("anthropic-ratelimit-unified-reset", "99999999999999999999")
        .header(
            "anthropic-ratelimit-unified-representative-claim",
            "five_hour",
        );
    let h = Harness::builder()
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
        .account(AccountSpec::new("far-acct", Script::ok().then(far_future)))
        .start()
        .await;
    let id = AccountId::from("far-acct");

    let before = now_ms();
    let first = h.send_message().await;
    let after = now_ms();
    first.assert_keypool_error(429, "rate_limit_error");
    let out = h
        .store()
        .out_of_window(&id, after)
        .expect("out of its window after the rejected 429");
    assert!(
        (before + WEEKLY_BOUND_MS..=after + WEEKLY_BOUND_MS).contains(&out.until),
        "out until {} (response at {before}..{after})",
        out.until
    );
    assert_eq!(out.limit.as_str(), "5h", "the claimed window");
    assert!(retry_after(&first) <= WEEKLY_BOUND_MS / 1000);

    // The pool's own 429 (every account out of its window): at most the bound.
    let asked = now_ms();
    let second = h.send_message().await;
    let answered = now_ms();
    let message = second.assert_keypool_error(429, "rate_limit_error");
    assert!(message.contains(&format_utc(out.until)), "{message}");
    let secs = retry_after(&second);
    assert!(
        ((out.until - answered).div_ceil(1000)..=(out.until - asked).div_ceil(1000))
            .contains(&secs),
        "Retry-After {secs}"
    );
    assert!(secs <= WEEKLY_BOUND_MS / 1000, "Retry-After {secs}");
    assert_eq!(second.header("x-should-retry"), Some("false"));
    assert_eq!(
        h.sim().total_stats().requests,
        1,
        "answered from the window state"
    );

    // The clamp was logged at warn, naming the account and the reset, no secret.
    let logs = lines.text();
    let warning = logs
        .lines()
        .find(|l| l.contains("WARN") && l.contains("reset=\"unified\""))
        .unwrap_or_else(|| panic!("no warning about the reset in:\n{logs}"));
    assert!(warning.contains("far-acct"), "{warning}");
    assert!(!logs.contains(&secret_of("far-acct")), "{logs}");

    // clear-windows: back in service at once, the window's cooldown gone with it.
    let cleared = h
        .client()
        .post(h.url("/admin/accounts/far-acct/clear-windows"))
        .bearer(ADMIN_TOKEN)
        .send()
        .await;
    assert_eq!(cleared.status, 200, "{}", cleared.text());
    assert_eq!(
        cleared.json(),
        serde_json::json!({
            "account": "far-acct",
            "cleared": {"limit": "5h", "until": out.until},
            "window_cooldown_cleared": true,
        })
    );
    assert_eq!(h.store().out_of_window(&id, now_ms()), None);
    assert_eq!(h.cooldown("far-acct"), None);
    let overview = h
        .get("/admin/accounts")
        .bearer(ADMIN_TOKEN)
        .send()
        .await
        .json();
    assert_eq!(admin_account(&overview, "far-acct")["state"], "active");
    assert_eq!(h.send_message().await.status, 200);
    assert_eq!(h.upstream_order(), ["far-acct", "far-acct"]);
    h.finish().await;
}

/// A 5-hour reset sent in unix milliseconds where seconds belong (a value beyond the
/// year 5138 as seconds) is read as milliseconds: the account is out until exactly that
/// moment, not for 54,000 years.
#[tokio::test]
async fn a_reset_in_unix_milliseconds_is_read_as_milliseconds() {
    let reset_ms = now_ms() + 2 * 3_600_000;
    let ms_headers = Script::ok()
        .header("anthropic-ratelimit-unified-5h-utilization", "1.0")
        .header("anthropic-ratelimit-unified-5h-reset", reset_ms.to_string());
    let h = Harness::with_accounts([("ms", ms_headers), ("b", Script::ok())]).await;
    assert_eq!(h.send_message().await.status, 200);
    let out = h
        .store()
        .out_of_window(&AccountId::from("ms"), now_ms())
        .expect("out of its 5-hour window");
    assert_eq!((out.limit.as_str(), out.until), ("5h", reset_ms));
    assert_eq!(h.send_message().await.status, 200);
    assert_eq!(h.upstream_order(), ["ms", "b"]);
    h.finish().await;
}
