//! SPEC 4 hedge and race end to end: the backup fires after the hedge delay, the first
//! to commit wins, the loser is aborted in flight and credited with nothing, and two
//! accounts of the same `base_url` never run together.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use keypool_core::AccountId;
use keypool_sim::{Behaviour, Delay, OkSpec, Script};
use keypool_store::now_ms;
use keypool_tests::{AccountSpec, Harness};

/// `GET /metrics`: the value of the series `name{label="value"}`.
async fn metric(h: &Harness, name: &str, label: &str, value: &str) -> u64 {
    let series = format!("{name}{{{label}=\"{value}\"}}");
    let r = h.get("/metrics").send().await;
    assert_eq!(r.status, 200);
    let text = r.text();
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in /metrics:\n{text}"))
}

/// `keypool_hedge_backups_total` of `strategy`.
async fn backups(h: &Harness, strategy: &str) -> u64 {
    metric(h, "keypool_hedge_backups_total", "strategy", strategy).await
}

/// `keypool_hedge_gate_total` of `reason`.
async fn gate(h: &Harness, reason: &str) -> u64 {
    metric(h, "keypool_hedge_gate_total", "reason", reason).await
}

/// Account `id` (healthy) on the simulator's base URL `<sim>/<label>`, at `priority`.
fn on(id: &str, label: &str, priority: i32) -> AccountSpec {
    AccountSpec::new(id, Script::ok())
        .url_label(label)
        .priority(priority)
}

fn slow_stream(ms: u64) -> Behaviour {
    OkSpec::default().ttft(Delay::ms(ms)).into()
}

/// Two accounts on different base URLs (`p` first by priority), after one request that
/// gives the group TTFT data (served by `p` on the single path).
async fn warmed_pair(strategy: &str, second_label: &str) -> Harness {
    // A race must not look like a hedge: any delayed backup would come after 1 s.
    let min_delay = if strategy == "race" { "1000" } else { "200" };
    let h = Harness::builder()
        .strategy(strategy)
        .server("hedge_min_delay_ms", min_delay)
        .account(on("p", "p", 0))
        .account(on("b", second_label, 1))
        .start()
        .await;
    let r = h.send_stream().await;
    assert_eq!(r.status, 200);
    assert_eq!(h.upstream_order(), ["p"], "warm-up on the single path");
    // the gate's first reason that applies: no partner before no TTFT data
    let reason = if second_label == "p" {
        "no_partner"
    } else {
        "no_ttft_data"
    };
    assert_eq!(gate(&h, reason).await, 1);
    h
}

/// What the store credited to `id`: (TTFT average, error rate, last used).
fn credit(h: &Harness, id: &str) -> (Option<f64>, Option<f64>, Option<u64>) {
    let now = now_ms();
    let account = AccountId::from(id);
    let rating = h.store().rating().rating(&account, now);
    let last_used = h.store().export_state(now).last_used.get(&account).copied();
    (rating.ttft_ms, rating.error_rate, last_used)
}

#[tokio::test]
async fn hedge_primary_slow_backup_wins_and_is_credited() {
    let h = warmed_pair("hedge", "b").await;
    let (_, p_errors_before, p_used_before) = credit(&h, "p");
    assert_eq!(credit(&h, "b"), (None, None, None));
    h.sim().set_default("p", slow_stream(3_000)).unwrap();
    let started = Instant::now();
    let r = h.send_stream().await;
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.events().last().map(String::as_str), Some("message_stop"));
    // the backup fired after the hedge delay (200 ms) and won long before p's 3 s
    assert!(
        took >= Duration::from_millis(180) && took < Duration::from_millis(2_500),
        "{took:?}"
    );
    assert_eq!(h.upstream_order(), ["p", "p", "b"]);
    let b_request = &h.sim().requests_for("b")[0];
    assert_eq!(
        r.frames()[0].json()["message"]["id"],
        format!("msg_sim{:020}", b_request.seq)
    );
    // the loser is aborted in flight
    h.wait_until("p's attempt is aborted", Duration::from_secs(5), |s| {
        s.stats("p").unwrap().cancelled == 1
    })
    .await;
    // credited: b served (rating sample, last_used); p only keeps what it had
    let (b_ttft, b_errors, b_used) = credit(&h, "b");
    assert!(b_ttft.is_some(), "b has a TTFT sample");
    assert_eq!(b_errors, Some(0.0));
    assert!(b_used.is_some(), "b's last_used is set");
    let (_, p_errors, p_used) = credit(&h, "p");
    assert_eq!(p_errors, p_errors_before, "an abort is not a failure");
    assert_eq!(p_used, p_used_before, "p did not serve");
    assert_eq!(h.cooldown("p"), None);
    assert_eq!(backups(&h, "hedge").await, 1);
    assert_eq!(
        metric(&h, "keypool_hedge_wins_total", "winner", "backup").await,
        1
    );
    h.finish().await;
}

#[tokio::test]
async fn hedge_primary_fast_fires_no_backup() {
    let h = warmed_pair("hedge", "b").await;
    let r = h.send_stream().await;
    assert_eq!(r.status, 200);
    assert_eq!(h.upstream_order(), ["p", "p"]);
    assert_eq!(backups(&h, "hedge").await, 0);
    h.finish().await;
}

#[tokio::test]
async fn hedge_non_streaming_first_complete_answer_wins() {
    let h = warmed_pair("hedge", "b").await;
    h.sim()
        .set_default("p", OkSpec::default().latency(Delay::ms(3_000)))
        .unwrap();
    let started = Instant::now();
    let r = h.send_message().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(started.elapsed() < Duration::from_millis(2_500));
    assert_eq!(h.upstream_order(), ["p", "p", "b"]);
    h.wait_until("p's attempt is aborted", Duration::from_secs(5), |s| {
        s.stats("p").unwrap().cancelled == 1
    })
    .await;
    h.finish().await;
}

#[tokio::test]
async fn race_fires_both_at_once_and_the_first_to_commit_wins() {
    let h = warmed_pair("race", "b").await;
    h.sim().set_default("p", slow_stream(3_000)).unwrap();
    let r = h.send_stream().await;
    assert_eq!(r.status, 200, "{}", r.text());
    let requests = h.sim().requests();
    assert_eq!(h.upstream_order(), ["p", "p", "b"]);
    let gap = requests[2].received_at - requests[1].received_at;
    assert!(
        gap < Duration::from_millis(500),
        "race fires at once, not after {gap:?}"
    );
    assert_eq!(h.sim().total_stats().peak_in_flight, 2, "both ran together");
    h.wait_until("p's attempt is aborted", Duration::from_secs(5), |s| {
        s.stats("p").unwrap().cancelled == 1
    })
    .await;
    assert!(credit(&h, "b").2.is_some(), "b credited");
    assert_eq!(backups(&h, "race").await, 1);
    h.finish().await;
}

/// A race of two non-streaming answers: the first complete one wins, the other is
/// aborted. b's `base_url` is p's with a trailing slash: another string (so a partner)
/// for the same upstream, and served there.
#[tokio::test]
async fn race_fires_both_and_the_first_to_commit_wins() {
    let h = warmed_pair("race", "p/").await;
    h.sim()
        .set_default("p", OkSpec::default().latency(Delay::ms(3_000)))
        .unwrap();
    h.sim()
        .set_default("b", OkSpec::default().text("from-b"))
        .unwrap();
    let r = h.send_message().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("from-b"), "{}", r.text());
    assert_eq!(h.requests_per_account(&["p", "b"]), [2, 1]);
    h.wait_until("p's attempt is aborted", Duration::from_secs(5), |s| {
        s.stats("p").unwrap().cancelled == 1
    })
    .await;
    h.finish().await;
}

#[tokio::test]
async fn race_never_runs_two_accounts_of_the_same_base_url_together() {
    // p and b share one base_url: no partner, the single path, one at a time.
    let h = warmed_pair("race", "p").await;
    h.sim()
        .set_default(
            "p",
            Behaviour::StallBeforeHeaders(Duration::from_millis(300)),
        )
        .unwrap();
    h.sim().set_default("b", slow_stream(300)).unwrap();
    for _ in 0..3 {
        let r = h.send_stream().await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // request 2: p stalls 300 ms and fails, then b alone; after that p's error rate
    // puts b first
    assert_eq!(h.upstream_order(), ["p", "p", "b", "b", "b"]);
    assert_eq!(
        h.sim().total_stats().peak_in_flight,
        1,
        "two accounts of the same base_url ran together"
    );
    assert!(gate(&h, "no_partner").await >= 3);
    assert_eq!(backups(&h, "race").await, 0);
    h.finish().await;
}

#[tokio::test]
async fn race_partner_is_the_account_with_another_base_url() {
    // a and b share a base_url, c has its own: the race pairs a with c, never with b.
    let h = Harness::builder()
        .strategy("race")
        .account(on("a", "x", 0))
        .account(on("b", "x", 1))
        .account(on("c", "y", 2))
        .start()
        .await;
    assert_eq!(h.send_stream().await.status, 200);
    assert_eq!(h.upstream_order(), ["a"]);
    let stall = Behaviour::StallBeforeHeaders(Duration::from_millis(400));
    h.sim().set_default("a", stall.clone()).unwrap();
    h.sim().set_default("c", stall).unwrap();
    let r = h.send_stream().await;
    assert_eq!(r.status, 200, "{}", r.text());
    let requests = h.sim().requests();
    let order = h.upstream_order();
    assert_eq!(order[0..1], ["a"]);
    let mut raced: Vec<&str> = order[1..3].iter().map(String::as_str).collect();
    raced.sort_unstable();
    assert_eq!(raced, ["a", "c"], "a races with c");
    assert_eq!(order[3], "b", "b only after both failed");
    let a_started = requests[1..3]
        .iter()
        .find(|r| r.account.as_ref().is_some_and(|id| id.as_str() == "a"))
        .unwrap()
        .received_at;
    let gap = requests[3].received_at - a_started;
    assert!(
        gap >= Duration::from_millis(350),
        "b started {gap:?} after a, while a was still in flight"
    );
    h.finish().await;
}

#[tokio::test]
async fn hedge_loser_is_credited_with_its_own_real_failure_only() {
    let h = warmed_pair("hedge", "b").await;
    // p fails for real at 400 ms (after the backup fired at 200 ms); b is slow but wins
    h.sim()
        .set_default(
            "p",
            Behaviour::StallBeforeHeaders(Duration::from_millis(400)),
        )
        .unwrap();
    h.sim().set_default("b", slow_stream(1_000)).unwrap();
    let r = h.send_stream().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.upstream_order(), ["p", "p", "b"]);
    let (_, p_errors, _) = credit(&h, "p");
    assert!(
        p_errors.is_some_and(|e| e > 0.0),
        "p's failure counts: {p_errors:?}"
    );
    let (b_ttft, b_errors, b_used) = credit(&h, "b");
    assert!(
        b_ttft.is_some_and(|t| t >= 900.0),
        "b's own TTFT: {b_ttft:?}"
    );
    assert_eq!(b_errors, Some(0.0));
    assert!(b_used.is_some());
    h.finish().await;
}

#[tokio::test]
async fn hedge_primary_failing_before_the_delay_falls_over_to_the_partner_once() {
    let h = warmed_pair("hedge", "b").await;
    h.sim().set_default("p", Behaviour::status(529)).unwrap();
    let r = h.send_stream().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        h.upstream_order(),
        ["p", "p", "b"],
        "b once, as the next attempt"
    );
    assert_eq!(backups(&h, "hedge").await, 0);
    h.finish().await;
}

#[tokio::test]
async fn count_tokens_never_hedges() {
    let h = warmed_pair("race", "b").await;
    h.sim().set_default("p", slow_stream(300)).unwrap();
    let r = h
        .client()
        .post(format!("{}/v1/messages/count_tokens", h.pool_base_url()))
        .api_key(&h.key("alice"))
        .json(&serde_json::json!({"model": keypool_tests::MODEL, "messages": []}))
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.sim().total_stats().requests, 2, "one upstream call");
    assert_eq!(gate(&h, "count_tokens").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn a_partner_must_share_provider_and_auth_type() {
    let h = Harness::builder()
        .strategy("hedge")
        .account(on("p", "p", 0))
        .account(on("b", "b", 1).provider("anthropic", "oauth"))
        .start()
        .await;
    assert_eq!(h.send_stream().await.status, 200);
    h.sim().set_default("p", slow_stream(600)).unwrap();
    assert_eq!(h.send_stream().await.status, 200);
    assert_eq!(
        h.upstream_order(),
        ["p", "p"],
        "no backup across auth types"
    );
    assert_eq!(gate(&h, "no_partner").await, 2);
    assert_eq!(backups(&h, "hedge").await, 0);
    h.finish().await;
}
