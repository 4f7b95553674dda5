//! SPEC 16 end to end against the simulator: model-family weekly windows, model
//! lockouts, the terminal states (`credits_exhausted`, `banned`) and the 403 streak,
//! status restatement, and the slow-stream watchdog.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use keypool_core::ModelFamily;
use keypool_proxy::reject::format_utc;
use keypool_sim::{Behaviour, Delay, ErrorReply, OkSpec, Script, UnifiedHeaders};
use keypool_store::now_ms;
use keypool_tests::{AccountSpec, Harness, HarnessBuilder, admin_account, message_body};
use serde_json::Value;

const ADMIN_TOKEN: &str = "states-admin-token-5e6f7a8b9c0d";
const OPUS: &str = "claude-opus-4-5";
const SONNET: &str = "claude-sonnet-4-5";

fn builder() -> HarnessBuilder {
    Harness::builder().extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
}

async fn overview(h: &Harness) -> Value {
    let r = h.get("/admin/accounts").bearer(ADMIN_TOKEN).send().await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Waits until the moment `until_ms` (a lockout's or cooldown's known end) has passed.
async fn sleep_past(until_ms: u64) {
    let wait = (until_ms + 5).saturating_sub(now_ms());
    tokio::time::sleep(Duration::from_millis(wait)).await;
}

async fn send(h: &Harness, model: &str) -> keypool_tests::Reply {
    h.messages(&message_body(model, false)).send().await
}

/// An account whose Opus weekly window is used up: every answer says so in its
/// unified headers, and an Opus request is refused with the family's 429.
fn opus_exhausted(reset: u64) -> Script {
    let headers = UnifiedHeaders::allowed().family(ModelFamily::Opus, 1.0, reset, "rejected");
    Script::ok().unified(&headers).for_model(
        "opus",
        ErrorReply::rate_limited()
            .unified(&UnifiedHeaders::family_rejected(ModelFamily::Opus, reset)),
    )
}

/// SPEC 16: an Opus-exhausted account still serves Sonnet and is skipped for Opus; with
/// every account Opus-exhausted an Opus request is the immediate 429 naming the Opus
/// weekly window, and Sonnet requests are still served.
#[tokio::test]
async fn an_opus_weekly_window_takes_an_account_out_for_opus_only() {
    let reset = now_ms() / 1000 + 48 * 3600;
    let h = builder()
        .accounts([("a", opus_exhausted(reset)), ("b", Script::ok())])
        .start()
        .await;
    // Sonnet: a (priority 0) serves, and its headers tell keypool about Opus.
    assert_eq!(send(&h, SONNET).await.status, 200);
    // Opus: a is skipped at once, b serves.
    assert_eq!(send(&h, OPUS).await.status, 200);
    assert_eq!(h.upstream_order(), ["a", "b"]);
    assert_eq!(send(&h, SONNET).await.status, 200);
    assert_eq!(h.upstream_order().last().unwrap(), "a");
    let o = overview(&h).await;
    let a = admin_account(&o, "a");
    assert_eq!(a["state"], "active", "{a}");
    assert_eq!(a["windows"]["families"][0]["family"], "opus");
    assert_eq!(
        a["windows"]["families"][0]["out_of_window"]["limit"],
        "weekly_opus"
    );

    // Now b is Opus-exhausted too (learned from its 429).
    h.sim().set_script("b", opus_exhausted(reset)).unwrap();
    let before = h.sim().total_stats().requests;
    let r = send(&h, OPUS).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(
        h.sim().total_stats().requests,
        before + 1,
        "only b was asked"
    );
    // every account is out of its Opus window: answered at once, nothing upstream
    let r = send(&h, OPUS).await;
    let message = r.assert_keypool_error(429, "rate_limit_error");
    assert!(message.contains("weekly (opus)"), "{message}");
    assert!(message.contains(&format_utc(reset * 1000)), "{message}");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(retry > 47 * 3600 && retry <= 48 * 3600, "{retry}");
    assert_eq!(h.sim().total_stats().requests, before + 1);
    // Sonnet is untouched.
    assert_eq!(send(&h, SONNET).await.status, 200);
    h.finish().await;
}

async fn lockouts_of(h: &Harness, account: &str) -> Vec<Value> {
    admin_account(&overview(h).await, account)["lockouts"]
        .as_array()
        .unwrap()
        .clone()
}

/// SPEC 16 model lockout: a `404 not_found_error` for model X locks only X on that
/// account, for `model_lockout_ms` doubling on repeats; a success halves the count;
/// listed and cleared through the admin API.
#[tokio::test]
async fn a_404_for_a_model_locks_only_that_model_doubling_and_halving() {
    const X: &str = "claude-x-preview";
    let not_found = || Script::ok().for_model(X, Behaviour::status(404));
    let h = builder()
        .cooldown("model_lockout_ms = 400")
        .cooldown("model_lockout_max_ms = 10000")
        .accounts([("a", not_found()), ("b", Script::ok())])
        .start()
        .await;
    assert_eq!(send(&h, X).await.status, 200, "b serves X after a's 404");
    assert_eq!(h.upstream_order(), ["a", "b"]);
    // X skips a now; other models still go to a.
    assert_eq!(send(&h, X).await.status, 200);
    assert_eq!(send(&h, SONNET).await.status, 200);
    assert_eq!(h.upstream_order(), ["a", "b", "b", "a"]);
    let locks = lockouts_of(&h, "a").await;
    assert_eq!(locks.len(), 1, "{locks:?}");
    assert_eq!(
        (locks[0]["model"].as_str(), locks[0]["failures"].as_u64()),
        (Some(X), Some(1))
    );
    let first = locks[0]["until"].as_u64().unwrap() - now_ms();
    assert!(first <= 400, "{first}");
    let all = h
        .get("/admin/lockouts")
        .bearer(ADMIN_TOKEN)
        .send()
        .await
        .json();
    assert_eq!(all["lockouts"][0]["account"], "a");
    assert!(h.metrics().await.contains("\nkeypool_model_lockouts 1\n"));

    // After the lockout a second 404 doubles it.
    sleep_past(locks[0]["until"].as_u64().unwrap()).await;
    let at = now_ms();
    assert_eq!(send(&h, X).await.status, 200);
    let locks = lockouts_of(&h, "a").await;
    assert_eq!(locks[0]["failures"], 2);
    let second = locks[0]["until"].as_u64().unwrap() - at;
    assert!((700..=900).contains(&second), "doubled: {second} ms");

    // A success of X on a halves the count: the next 404 locks for 800 ms again, not 1600.
    sleep_past(locks[0]["until"].as_u64().unwrap()).await;
    h.sim().set_script("a", Script::ok()).unwrap();
    assert_eq!(send(&h, X).await.status, 200);
    assert_eq!(h.upstream_order().last().unwrap(), "a");
    h.sim().set_script("a", not_found()).unwrap();
    let at = now_ms();
    assert_eq!(send(&h, X).await.status, 200);
    let locks = lockouts_of(&h, "a").await;
    assert_eq!(locks[0]["failures"], 2, "1 (halved from 2) + 1");
    let third = locks[0]["until"].as_u64().unwrap() - at;
    assert!((700..=900).contains(&third), "{third} ms");

    // Cleared by the operator: X goes to a again.
    let r = h
        .client()
        .post(h.url("/admin/accounts/a/clear-lockouts?model=claude-x-preview"))
        .bearer(ADMIN_TOKEN)
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["cleared"], 1);
    assert!(lockouts_of(&h, "a").await.is_empty());
    h.finish().await;
}

fn forbidden(message: &'static str) -> Script {
    Script::new(ErrorReply::new(http::StatusCode::FORBIDDEN).message(message))
}

/// SPEC 6/16: 402 → `credits_exhausted`; two 403s → 60 s cooldowns (here 100 ms), the
/// 3rd → `banned`; a ban-marker body → `banned` at once. Each shows with its reason in
/// `/admin/accounts` and in `keypool_accounts{state}`, and re-enabling clears it.
#[tokio::test]
async fn terminal_states_credits_exhausted_and_banned() {
    let h = builder()
        .cooldown("forbidden_ms = 100")
        .accounts([
            ("credits", Script::new(Behaviour::status(402))),
            ("marked", forbidden("This organization has been disabled.")),
            ("streak", forbidden("Permission denied for this resource.")),
            ("healthy", Script::ok()),
        ])
        .start()
        .await;
    // credits (402) and marked (ban marker) end on the first request; streak cools.
    assert_eq!(send(&h, SONNET).await.status, 200);
    assert_eq!(
        h.upstream_order(),
        ["credits", "marked", "streak", "healthy"]
    );
    let o = overview(&h).await;
    assert_eq!(admin_account(&o, "credits")["state"], "credits_exhausted");
    assert_eq!(
        admin_account(&o, "credits")["disabled"]["reason"],
        "key_error: upstream answered 402 (payment_required)"
    );
    assert_eq!(admin_account(&o, "marked")["state"], "banned");
    assert_eq!(
        admin_account(&o, "marked")["disabled"]["reason"],
        "key_error: upstream answered 403 (banned)"
    );
    let streak = admin_account(&o, "streak");
    assert_eq!(streak["state"], "cooling", "{streak}");
    assert_eq!(streak["cooldown"]["trigger"], "forbidden");
    assert_eq!(streak["cooldown"]["forbidden_streak"], 1);
    // 2nd and 3rd 403 after each cooldown ends: banned at the 3rd.
    for n in 2..=3 {
        sleep_past(h.cooldown("streak").map_or(0, |e| e.until)).await;
        assert_eq!(send(&h, SONNET).await.status, 200);
        let state = admin_account(&overview(&h).await, "streak")["state"].clone();
        assert_eq!(
            state,
            if n == 3 { "banned" } else { "cooling" },
            "after 403 #{n}"
        );
    }
    let o = overview(&h).await;
    assert_eq!(
        admin_account(&o, "streak")["disabled"]["reason"],
        "key_error: upstream answered 403 (forbidden): the 3 consecutive 403s of the account"
    );
    let m = h.metrics().await;
    for line in [
        "keypool_accounts{state=\"credits_exhausted\"} 1",
        "keypool_accounts{state=\"banned\"} 2",
        "keypool_accounts{state=\"available\"} 1",
    ] {
        assert!(m.contains(line), "{line} in\n{m}");
    }
    // Re-enabled by the operator: back in rotation (and answering 402 again).
    let r = h
        .client()
        .post(h.url("/admin/accounts/credits/enable"))
        .bearer(ADMIN_TOKEN)
        .send()
        .await;
    assert_eq!(r.json()["was_disabled"]["state"], "credits_exhausted");
    assert_eq!(
        admin_account(&overview(&h).await, "credits")["state"],
        "active"
    );
    h.finish().await;
}

/// SPEC 16 restatement: a third party's `403` with its quota text becomes a `429`
/// cooldown of the rule's length; an excluded marker keeps the `403`.
#[tokio::test]
async fn a_restate_rule_turns_a_quota_403_into_a_429_cooldown() {
    let quota = "Daily quota exceeded for this key, try again later";
    let h = builder()
        .account(
            AccountSpec::new("gw", forbidden(quota))
                .provider("anthropic_compatible", "api_key")
                .priority(0),
        )
        .account(AccountSpec::new("healthy", Script::ok()).priority(1))
        .extra_toml(
            r#"
[[restate]]
account = "gw*"
from_statuses = [403]
markers = ["quota exceeded"]
exclude_markers = ["banned"]
to_status = 429
retry_after_ms = 120000
"#,
        )
        .start()
        .await;
    let before = now_ms();
    assert_eq!(send(&h, SONNET).await.status, 200);
    let entry = h.cooldown("gw").expect("gw cools");
    assert_eq!(entry.trigger.as_str(), "retry_after");
    let wait = entry.until - before;
    assert!((119_000..=121_000).contains(&wait), "{wait}");
    assert_eq!(entry.forbidden_streak, 0, "not a 403 any more");
    assert!(
        h.metrics()
            .await
            .contains("keypool_restatements_total{rule=\"0\"} 1")
    );

    // The excluded marker: the rule does not apply, the 403 stays a 403.
    h.store().clear_cooldown(&"gw".into());
    h.sim()
        .set_script("gw", forbidden("quota exceeded: this key is banned"))
        .unwrap();
    assert_eq!(send(&h, SONNET).await.status, 200);
    let entry = h.cooldown("gw").unwrap();
    assert_eq!(
        (entry.trigger.as_str(), entry.forbidden_streak),
        ("forbidden", 1)
    );
    h.finish().await;
}

/// SPEC 16 watchdog, here with a 100 ms warm-up and a 300 ms window: a committed stream
/// that trickles is ended with the generic error frame; a stream whose content does not
/// start fails over before its commit point; with the watchdog off nothing changes.
#[tokio::test]
async fn the_slow_stream_watchdog_ends_a_trickle_and_fails_over_a_slow_start() {
    let trickle = OkSpec::default().chunks(20).chunk_interval(Delay::ms(60));
    let slow_start = OkSpec::default()
        .chunks(2)
        .chunk_interval(Delay::ms(800))
        .pace_first_delta();
    let watched = |b: HarnessBuilder| {
        b.server("stream_min_bytes_per_sec", "100000")
            .server("stream_watchdog_warmup_ms", "100")
            .server("stream_watchdog_window_ms", "300")
    };
    // A trickle: committed at the first delta, ended by the watchdog.
    let h = watched(builder())
        .accounts([("t", Script::new(trickle.clone()))])
        .start()
        .await;
    let r = h.send_stream().await;
    assert_eq!(r.status, 200);
    let text = r.text();
    assert!(text.contains("event: error"), "{text}");
    assert!(!text.contains("message_stop"), "{text}");
    let entry = h.store().health().cooldowns.entry(&"t".into()).unwrap();
    assert_eq!(
        (entry.trigger.as_str(), entry.consecutive_failures),
        ("slow_stream", 1)
    );
    h.finish().await;

    // A slow start: the hold fails over to the next account.
    let h = watched(builder())
        .accounts([
            ("slow", Script::new(slow_start.clone())),
            ("fast", Script::ok()),
        ])
        .start()
        .await;
    let r = h.send_stream().await;
    assert_eq!(r.status, 200);
    assert!(
        r.text().contains("message_stop"),
        "{} {:?}",
        r.text(),
        h.upstream_order()
    );
    assert_eq!(h.upstream_order(), ["slow", "fast"]);
    h.finish().await;

    // Off (the default): both streams complete.
    let h = builder()
        .strategy("round_robin")
        .accounts([("t", Script::new(trickle)), ("s", Script::new(slow_start))])
        .start()
        .await;
    for _ in 0..2 {
        let r = h.send_stream().await;
        assert!(r.text().contains("message_stop"), "{}", r.text());
    }
    let mut order = h.upstream_order();
    order.sort();
    assert_eq!(order, ["s", "t"]);
    h.finish().await;
}

/// SPEC 16: the terminal states and a model lockout survive a restart of the real
/// binary (state file), show in `/admin/accounts` with their reasons, and on the status
/// page (headless Chromium).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_states_and_lockouts_survive_a_restart_and_show_on_the_status_page() {
    use keypool_tests::browser::{headless, row};
    use keypool_tests::process::{KeypoolProcess, binary_config, config_file, free_port};
    const X: &str = "claude-x-preview";
    let h = builder()
        .accounts([
            ("credits", Script::new(Behaviour::status(402))),
            ("marked", forbidden("Your account has been suspended.")),
            ("nf", Script::ok().for_model(X, Behaviour::status(404))),
            ("healthy", Script::ok()),
        ])
        .start()
        .await;
    let port = free_port();
    let (dir, file) = config_file(
        "states-restart",
        &binary_config(&h, port, &[("state_file", "\"state.json\"")]),
    );
    let admin = |k: &KeypoolProcess| {
        let (client, url) = (h.client().clone(), k.url("/admin/accounts"));
        async move {
            client
                .request(http::Method::GET, url)
                .bearer(ADMIN_TOKEN)
                .send()
                .await
                .json()
        }
    };
    let mut k = KeypoolProcess::start(&file, port).await;
    assert_eq!(k.send_message(&h, false).await.status, 200);
    let x = h
        .client()
        .post(k.url("/acme/team/v1/messages"))
        .api_key(&h.key(keypool_tests::KEY))
        .json(&message_body(X, false))
        .send()
        .await;
    assert_eq!(x.status, 200, "{}", x.text());
    let before = admin(&k).await;
    let states = |o: &Value| {
        ["credits", "marked", "nf", "healthy"].map(|id| {
            let a = admin_account(o, id);
            let locks: Vec<_> = a["lockouts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    (
                        l["model"].clone(),
                        l["until"].clone(),
                        l["failures"].clone(),
                    )
                })
                .collect();
            (a["state"].clone(), a["disabled"]["reason"].clone(), locks)
        })
    };
    let seen = states(&before);
    assert_eq!(seen[0].0, "credits_exhausted");
    assert_eq!(seen[1].0, "banned");
    assert_eq!(seen[2].2[0].0, X);
    k.signal("TERM");
    assert_eq!(k.wait_exit(Duration::from_secs(10)).await, Some(0));
    drop(k);
    let k = KeypoolProcess::start(&file, port).await;
    let after = admin(&k).await;
    assert_eq!(
        states(&after),
        seen,
        "the same states, reasons and lockouts after the restart"
    );

    let profile = dir.join("chromium");
    let url = format!("{}#token={ADMIN_TOKEN}", k.url("/admin/ui"));
    let dom = tokio::task::spawn_blocking(move || headless(&url, "--dump-dom", &profile))
        .await
        .unwrap();
    let credits = row(&dom, "credits");
    assert!(
        credits.contains("class=\"state s-credits_exhausted\">credits exhausted</span>"),
        "{credits}"
    );
    assert!(
        credits.contains("upstream answered 402 (payment_required)"),
        "{credits}"
    );
    let marked = row(&dom, "marked");
    assert!(
        marked.contains("class=\"state s-banned\">banned</span>"),
        "{marked}"
    );
    let nf = row(&dom, "nf");
    assert!(nf.contains("data-lockout=\"claude-x-preview\""), "{nf}");
    assert!(nf.contains("Clear lockouts"), "{nf}");
    drop(k);
    std::fs::remove_dir_all(&dir).unwrap();
    h.finish().await;
}

/// SPEC 5 (the fix of issue 20): an API-key account with `requests-remaining: 0` is
/// shown as cooling (trigger `requests_exhausted`) until the reset, never as
/// `out_of_window`, as routing treats it.
#[tokio::test]
async fn a_request_limit_shows_as_cooling_not_out_of_window() {
    let reset_ms = (now_ms() / 1000 + 1800) * 1000;
    let exhausted = Script::ok()
        .header("anthropic-ratelimit-requests-remaining", "0")
        .header("anthropic-ratelimit-requests-reset", format_utc(reset_ms));
    let h = builder()
        .accounts([("a", exhausted), ("b", Script::ok())])
        .start()
        .await;
    assert_eq!(send(&h, SONNET).await.status, 200);
    let o = overview(&h).await;
    let a = admin_account(&o, "a");
    assert_eq!(a["state"], "cooling", "{a}");
    assert_eq!(a["cooldown"]["trigger"], "requests_exhausted");
    assert_eq!(a["cooldown"]["until"], reset_ms);
    assert!(a["windows"]["out_of_window"].is_null(), "{a}");
    assert!(
        h.metrics()
            .await
            .contains("keypool_accounts{state=\"cooling\"} 1")
    );
    h.finish().await;
}
