//! The admin API (`/admin/…`, SPEC 10) and the status page in a real browser.
//!
//! One request through a pool ordered `revoked` → `limited` → `exhausted` → `healthy`
//! leaves one account disabled (401), one cooling (429 + retry-after 600 s), one out of
//! its 5-hour window (429 rejected), and one serving with window readings. The tests
//! read that state back through the API and through headless Chromium.

#![allow(clippy::unwrap_used)]

use std::time::{SystemTime, UNIX_EPOCH};

use keypool_core::Window;
use keypool_sim::{Behaviour, Delay, ErrorReply, OkSpec, Script, UnifiedHeaders};
use keypool_tests::browser::{headless, row};
use keypool_tests::{AccountSpec, Harness, Reply, admin_account};
use serde_json::Value;

const TOKEN: &str = "admin-test-token-0123456789";

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Starts keypool with the four accounts and sends the one request that sets their
/// states; `admin` adds `[admin] token`.
async fn pool(admin: bool) -> Harness {
    let now = unix_now();
    let answer = OkSpec::default()
        .latency(Delay::ms(180))
        .ttft(Delay::ms(140));
    let healthy = Script::new(answer).unified(
        &UnifiedHeaders::allowed()
            .window(Window::FiveHour, 0.42, now + 2 * 3600, "allowed")
            .window(Window::Weekly, 0.87, now + 3 * 86_400, "allowed_warning"),
    );
    let exhausted = Script::new(ErrorReply::rate_limited().unified(
        &UnifiedHeaders::rejected(now + 3 * 3600).window(
            Window::FiveHour,
            1.0,
            now + 3 * 3600,
            "rejected",
        ),
    ));
    let mut b = Harness::builder()
        .account(AccountSpec::new("revoked", Script::new(Behaviour::status(401))).priority(0))
        .account(
            AccountSpec::new(
                "limited",
                Script::new(ErrorReply::rate_limited().retry_after_secs(600)),
            )
            .priority(1),
        )
        .account(AccountSpec::new("exhausted", exhausted).priority(2))
        .account(AccountSpec::new("healthy", healthy).priority(3))
        .key(
            "bob",
            keypool_tests::ORG,
            "urls = [\"team\"]\nlimits = { usd_per_day = 20.0, requests_per_minute = 100 }",
        )
        .org_line("limits = { usd_per_month = 500.0 }");
    if admin {
        b = b.extra_toml(&format!("[admin]\ntoken = \"{TOKEN}\""));
    }
    let h = b.start().await;
    assert_eq!(h.send_message().await.status, 200);
    // bob's one request is not JSON: an error on the page, no tokens.
    let bad = h
        .client()
        .post(h.messages_url())
        .api_key(&h.key("bob"))
        .body("{not json")
        .send()
        .await;
    assert_eq!(bad.status, 400);
    h
}

/// alice's one answer: 12 input and 4 output tokens of claude-sonnet-4-5 at the default
/// $3 and $15 per million.
const ALICE_COST_NANO: u64 = 12 * 3_000 + 4 * 15_000;

async fn admin_get(h: &Harness, path: &str, token: Option<&str>) -> Reply {
    let mut r = h.get(path);
    if let Some(t) = token {
        r = r.bearer(t);
    }
    r.send().await
}

async fn admin_post(h: &Harness, path: &str) -> Reply {
    h.client().post(h.url(path)).bearer(TOKEN).send().await
}

#[tokio::test]
async fn admin_is_off_without_a_token() {
    let h = pool(false).await;
    for path in ["/admin", "/admin/accounts", "/admin/ui"] {
        admin_get(&h, path, Some(TOKEN))
            .await
            .assert_keypool_error(404, "not_found_error");
    }
    h.finish().await;
}

#[tokio::test]
async fn admin_wants_the_bearer_token() {
    let h = pool(true).await;
    for token in [None, Some("wrong"), Some("admin-test-token-012345678")] {
        let message = admin_get(&h, "/admin/accounts", token)
            .await
            .assert_keypool_error(401, "authentication_error");
        assert!(message.contains("admin token"), "{message}");
    }
    // The LB key is not an admin token.
    let key = h.key(keypool_tests::KEY);
    admin_get(&h, "/admin/accounts", Some(&key))
        .await
        .assert_keypool_error(401, "authentication_error");
    admin_post(&h, "/admin/accounts/healthy/nothing")
        .await
        .assert_keypool_error(404, "not_found_error");
    h.finish().await;
}

#[tokio::test]
async fn accounts_show_live_state_and_operator_actions_change_it() {
    let h = pool(true).await;
    let reply = admin_get(&h, "/admin/accounts", Some(TOKEN)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let overview = reply.json();
    assert_eq!(overview["backend"], "memory");
    let org = &overview["orgs"][0];
    assert_eq!(org["slug"], "acme");
    assert_eq!(org["groups"][0]["id"], "pool");
    assert_eq!(org["groups"][0]["strategy"], "priority");
    let now = overview["now"].as_u64().unwrap();

    let revoked = admin_account(&overview, "revoked");
    assert_eq!(revoked["state"], "disabled");
    assert_eq!(
        revoked["disabled"]["reason"],
        "key_error: upstream answered 401 (auth_rejected)"
    );

    let limited = admin_account(&overview, "limited");
    assert_eq!(limited["state"], "cooling");
    assert_eq!(limited["cooldown"]["trigger"], "retry_after");
    let remaining = limited["cooldown"]["remaining_ms"].as_u64().unwrap();
    assert!((590_000..=600_000).contains(&remaining), "{remaining}");
    assert_eq!(
        limited["cooldown"]["until"].as_u64().unwrap(),
        now + remaining
    );

    let exhausted = admin_account(&overview, "exhausted");
    assert_eq!(exhausted["state"], "out_of_window");
    assert_eq!(exhausted["windows"]["out_of_window"]["limit"], "5h");
    assert_eq!(exhausted["windows"]["five_hour"]["utilization"], 1.0);
    assert_eq!(exhausted["windows"]["unified_status"], "rejected");
    let exhausted_until = exhausted["windows"]["out_of_window"]["until"].clone();

    let healthy = admin_account(&overview, "healthy");
    assert_eq!(healthy["state"], "active");
    assert_eq!(healthy["windows"]["five_hour"]["utilization"], 0.42);
    assert_eq!(healthy["windows"]["weekly"]["utilization"], 0.87);
    assert_eq!(healthy["windows"]["weekly"]["status"], "allowed_warning");
    assert_eq!(healthy["rating"]["samples"], 1);
    assert!(healthy["rating"]["score"].as_f64().is_some());
    assert!(healthy["last_used"].as_u64().unwrap() <= now);
    assert_eq!(healthy["in_flight"], 0);
    assert!(revoked["last_used"].is_null());
    // No secret in the admin API.
    assert!(!reply.text().contains(&keypool_tests::secret_of("healthy")));

    // One account alone.
    let one = admin_get(&h, "/admin/accounts/limited", Some(TOKEN))
        .await
        .json();
    assert_eq!(one["state"], "cooling");
    admin_get(&h, "/admin/accounts/nobody", Some(TOKEN))
        .await
        .assert_keypool_error(404, "not_found_error");

    // Re-enable the revoked account and clear the cooldown.
    let enabled = admin_post(&h, "/admin/accounts/revoked/enable").await;
    assert_eq!(enabled.status, 200, "{}", enabled.text());
    assert_eq!(
        enabled.json()["was_disabled"]["reason"],
        "key_error: upstream answered 401 (auth_rejected)"
    );
    let cleared = admin_post(&h, "/admin/accounts/limited/clear-cooldown").await;
    assert_eq!(cleared.json()["cleared"]["trigger"], "retry_after");
    // Clear the exhausted account's windows: its window and the cooldown it set go.
    let cleared = admin_post(&h, "/admin/accounts/exhausted/clear-windows").await;
    assert_eq!(cleared.status, 200, "{}", cleared.text());
    assert_eq!(
        cleared.json(),
        serde_json::json!({
            "account": "exhausted",
            "cleared": {"limit": "5h", "until": exhausted_until},
            "window_cooldown_cleared": true,
        })
    );
    let overview = admin_get(&h, "/admin/accounts", Some(TOKEN)).await.json();
    assert_eq!(admin_account(&overview, "revoked")["state"], "active");
    assert!(admin_account(&overview, "revoked")["disabled"].is_null());
    assert_eq!(admin_account(&overview, "limited")["state"], "active");
    let exhausted = admin_account(&overview, "exhausted");
    assert_eq!(exhausted["state"], "active");
    assert!(exhausted["cooldown"].is_null());
    assert!(exhausted["windows"]["five_hour"].is_null());
    // Doing it again reports that there was nothing to do.
    assert!(
        admin_post(&h, "/admin/accounts/revoked/enable")
            .await
            .json()["was_disabled"]
            .is_null()
    );
    assert_eq!(
        admin_post(&h, "/admin/accounts/exhausted/clear-windows")
            .await
            .json(),
        serde_json::json!({"account": "exhausted", "cleared": null, "window_cooldown_cleared": false})
    );
    // The actions take POST.
    for action in ["enable", "clear-windows"] {
        admin_get(
            &h,
            &format!("/admin/accounts/revoked/{action}"),
            Some(TOKEN),
        )
        .await
        .assert_keypool_error(405, "invalid_request_error");
    }
    admin_post(&h, "/admin/accounts/nobody/clear-windows")
        .await
        .assert_keypool_error(404, "not_found_error");
    h.finish().await;
}

#[tokio::test]
async fn the_usage_summary_has_today_this_month_and_the_last_hour() {
    let h = pool(true).await;
    let summary = admin_get(&h, "/admin/usage/summary", Some(TOKEN)).await;
    assert_eq!(summary.status, 200);
    let summary = summary.json();
    for period in ["today", "month"] {
        let view = &summary[period];
        let callers = view["by_caller"].as_array().unwrap();
        assert_eq!(callers.len(), 2, "{view}");
        let alice = callers.iter().find(|r| r["caller"] == "alice").unwrap();
        assert_eq!(alice["requests"], 1);
        assert_eq!(alice["errors"], 0);
        assert_eq!(alice["tokens"], 16);
        assert_eq!(alice["cost_nano_usd"], ALICE_COST_NANO);
        let bob = callers.iter().find(|r| r["caller"] == "bob").unwrap();
        assert_eq!(
            (bob["requests"].clone(), bob["errors"].clone()),
            (1.into(), 1.into())
        );
        assert_eq!(bob["tokens"], 0);
        let healthy = view["by_account"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["account"] == "healthy")
            .unwrap_or_else(|| panic!("no row for the serving account: {view}"));
        assert_eq!(healthy["tokens"], 16);
        assert_eq!(healthy["cost_basis"], "api");
        assert_eq!(view["total"]["requests"], 2);
    }
    let today = summary["today"]["date"].as_str().unwrap();
    assert_eq!(summary["month"]["date"].as_str().unwrap(), &today[..7]);
    // Each caller's use against its limits: bob's budget and rate, the org's team
    // budget (alice's request counts in it).
    let limits = summary["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2, "{limits:?}");
    assert_eq!(limits[0]["caller"], "bob");
    let bob: Vec<&str> = limits[0]["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        bob,
        [
            "bob: 100 requests a minute, 100 at once",
            "bob: $0.00 of $20.00 today, resets 00:00 UTC"
        ]
    );
    assert_eq!(limits[1]["team"], true);
    let team = &limits[1]["limits"][0];
    assert_eq!(team["used"], ALICE_COST_NANO);
    assert_eq!(team["value"], 500_000_000_000u64);
    let month_end = keypool_proxy::reject::format_utc(team["resets_at"].as_u64().unwrap());
    assert_eq!(
        team["text"],
        format!(
            "acme (team): $0.000096 of $500.00 this month, resets {} 00:00 UTC",
            &month_end[..10]
        )
    );
    // The same under GET /admin/usage?by=caller.
    let by_caller = admin_get(&h, "/admin/usage?by=caller", Some(TOKEN))
        .await
        .json();
    assert_eq!(by_caller["limits"], summary["limits"]);
    let minutes = summary["minutes"].as_array().unwrap();
    assert_eq!(minutes.len(), 60);
    let sum = |field: &str| {
        minutes
            .iter()
            .map(|m| m[field].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!((sum("requests"), sum("errors"), sum("tokens")), (2, 1, 16));
    // Minutes are consecutive, oldest first, the last one holding now.
    let now = summary["now"].as_u64().unwrap();
    let last = minutes[59]["at"].as_u64().unwrap();
    assert!(last <= now && now < last + 60_000);
    assert_eq!(minutes[0]["at"].as_u64().unwrap(), last - 59 * 60_000);
    assert_eq!(
        admin_get(&h, "/admin/usage/summary", None).await.status,
        401
    );
    h.finish().await;
}

#[tokio::test]
async fn reload_rereads_the_config_file() {
    let h = pool(true).await;
    // Without a config file (embedded config) there is nothing to reload.
    let r = admin_post(&h, "/admin/reload").await;
    r.assert_keypool_error(409, "invalid_request_error");

    let dir = std::env::temp_dir().join(format!("keypool-admin-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keypool.toml");
    std::fs::write(&file, h.toml()).unwrap();
    let _ = h.app().clone().with_config_path(&file);
    let r = admin_post(&h, "/admin/reload").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["accounts"], 4);

    std::fs::write(
        &file,
        h.toml().replace("priority = 3", "priority = \"high\""),
    )
    .unwrap();
    let r = admin_post(&h, "/admin/reload").await;
    assert_eq!(r.status, 400, "{}", r.text());
    let problems = r.json()["problems"].clone();
    assert!(problems.to_string().contains("priority"), "{problems}");
    // The old configuration keeps serving.
    assert_eq!(h.send_message().await.status, 200);
    std::fs::remove_dir_all(&dir).unwrap();
    h.finish().await;
}

#[tokio::test]
async fn metrics_show_per_account_gauges() {
    let h = pool(true).await;
    let text = h.metrics().await;
    for line in [
        "keypool_account_disabled{account=\"revoked\"} 1",
        "keypool_account_disabled{account=\"healthy\"} 0",
        "keypool_account_in_flight{account=\"healthy\"} 0",
        "keypool_accounts_disabled 1",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    h.finish().await;
}

/// The `<tr>` of `key` in the usage card `card` (`today-caller`, `month-account`, …).
fn usage_row<'a>(dom: &'a str, card: &str, key: &str) -> &'a str {
    let start = dom
        .find(&format!("data-usage=\"{card}\""))
        .unwrap_or_else(|| panic!("no usage card {card} in the page:\n{dom}"));
    let card_end = dom[start..].find("</table>").unwrap() + start;
    let row = dom[start..card_end]
        .find(&format!("data-key=\"{key}\""))
        .unwrap_or_else(|| panic!("no {key} in usage card {card}:\n{}", &dom[start..card_end]))
        + start;
    &dom[row..dom[row..].find("</tr>").unwrap() + row]
}

/// The texts of a usage row's number cells, each up to its first tag.
fn cells(row: &str) -> Vec<&str> {
    row.split("<td class=\"num right\"")
        .skip(1)
        .map(|s| {
            let s = &s[s.find('>').unwrap() + 1..];
            &s[..s.find('<').unwrap()]
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_what_a_person_needs() {
    // The 10-minute cooldown starts at the pool's one request, inside `pool`.
    let set_at = std::time::Instant::now();
    let h = pool(true).await;
    let profile = std::env::temp_dir().join(format!("keypool-chromium-{}", std::process::id()));
    // The token travels in the fragment, which never reaches the server.
    let url = format!("{}#token={TOKEN}", h.url("/admin/ui"));
    let dom = {
        let url = url.clone();
        let profile = profile.clone();
        tokio::task::spawn_blocking(move || headless(&url, "--dump-dom", &profile))
            .await
            .unwrap()
    };

    // The disabled account, in red, with its reason.
    let revoked = row(&dom, "revoked");
    assert!(revoked.contains("data-state=\"disabled\""), "{revoked}");
    assert!(
        revoked.contains("class=\"state s-disabled\">disabled</span>"),
        "{revoked}"
    );
    assert!(
        revoked.contains("key_error: upstream answered 401 (auth_rejected)"),
        "{revoked}"
    );
    // A cooldown countdown (about ten minutes) with its trigger.
    let limited = row(&dom, "limited");
    assert!(limited.contains(">cooling</span>"), "{limited}");
    let countdown = limited
        .split("class=\"countdown\"")
        .nth(1)
        .and_then(|s| s.split('>').nth(1))
        .and_then(|s| s.split('<').next())
        .unwrap_or_else(|| panic!("no countdown in {limited}"));
    // What is left of the ten minutes when the page was rendered: at most 10m, at
    // least 10m less the time the test has taken so far (a loaded machine takes longer).
    let shown: u64 = {
        let (m, rest) = countdown
            .split_once("m ")
            .unwrap_or_else(|| panic!("countdown {countdown:?}"));
        m.parse::<u64>().unwrap() * 60 + rest.trim_end_matches('s').parse::<u64>().unwrap()
    };
    let taken = set_at.elapsed().as_secs();
    assert!(
        shown <= 600 && shown + taken + 1 >= 600,
        "countdown {countdown:?} after {taken} s"
    );
    assert!(limited.contains("retry_after"), "{limited}");
    // Utilisation bars: 42 % of the 5-hour window, 87 % of the weekly one (a warning colour).
    let healthy = row(&dom, "healthy");
    assert!(healthy.contains(">active</span>"), "{healthy}");
    assert!(
        healthy.contains("aria-valuenow=\"42\"") && healthy.contains("width: 42%"),
        "{healthy}"
    );
    assert!(healthy.contains("class=\"bar warn\""), "{healthy}");
    assert!(healthy.contains("87%"), "{healthy}");
    // The exhausted window: a full bar and its own countdown to the reset.
    let exhausted = row(&dom, "exhausted");
    assert!(exhausted.contains(">out of window</span>"), "{exhausted}");
    assert!(exhausted.contains("class=\"bar full\""), "{exhausted}");
    assert!(exhausted.contains("5h window exhausted"), "{exhausted}");
    // The summary pills count the states.
    assert!(dom.contains("<b>1</b> disabled"), "summary pills");
    // Usage today and this month, per caller and per account, with cost.
    for period in ["today", "month"] {
        let alice = usage_row(&dom, &format!("{period}-caller"), "alice");
        let cost = format!("${:.6}", ALICE_COST_NANO as f64 / 1e9);
        assert_eq!(cells(alice), ["1", "0", "16", cost.as_str()], "{alice}");
        let bob = usage_row(&dom, &format!("{period}-caller"), "bob");
        assert_eq!(cells(bob), ["1", "1", "0", "$0"], "{bob}");
        let healthy = usage_row(&dom, &format!("{period}-account"), "healthy");
        assert_eq!(cells(healthy), ["1", "0", "16", cost.as_str()], "{healthy}");
    }
    // The callers' limits, as a person reads them.
    let limits = &dom[dom.find("data-usage=\"limits\"").expect("no limits card")..];
    let limits = &limits[..limits.find("</ul>").unwrap()];
    assert!(
        limits.contains("bob: $0.00 of $20.00 today, resets 00:00 UTC"),
        "{limits}"
    );
    assert!(limits.contains("data-caller=\"acme (team)\""), "{limits}");
    // The last hour's trend: 60 minutes, the two requests, bob's error, alice's tokens.
    let chart = &dom[dom.find("<svg id=\"trend\"").expect("no trend chart")..];
    let chart = &chart[..chart.find("</svg>").unwrap()];
    assert!(chart.contains("data-minutes=\"60\""), "{chart}");
    assert_eq!(chart.matches("<g data-minute=").count(), 60);
    let total = |attr: &str| -> u64 {
        chart
            .split(&format!("{attr}=\""))
            .skip(1)
            .map(|s| s[..s.find('"').unwrap()].parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(
        (
            total("data-requests"),
            total("data-errors"),
            total("data-tokens")
        ),
        (2, 1, 16)
    );
    assert_eq!(
        chart.matches("class=\"e-bar\"").count(),
        1,
        "one red error bar"
    );
    // The token stays in the tab: neither the page nor the address bar shows it.
    assert!(!dom.contains(TOKEN), "the token is in the DOM");

    // A screenshot when asked (KEYPOOL_SCREENSHOT=target/status-page.png).
    if let Ok(path) = std::env::var("KEYPOOL_SCREENSHOT") {
        let target = keypool_tests::workspace_root().join(path);
        let mode = format!("--screenshot={}", target.display());
        tokio::task::spawn_blocking(move || headless(&url, &mode, &profile))
            .await
            .unwrap();
        assert!(std::fs::metadata(&target).unwrap().len() > 10_000);
    }
    let _ = std::fs::remove_dir_all(
        std::env::temp_dir().join(format!("keypool-chromium-{}", std::process::id())),
    );
    h.finish().await;
}

#[tokio::test]
async fn in_flight_counts_a_stream_until_it_ends() {
    let slow_stream = OkSpec::default().chunks(3).chunk_interval(Delay::ms(400));
    let h = Harness::builder()
        .account(AccountSpec::new("streamer", Script::new(slow_stream)))
        .extra_toml(&format!("[admin]\ntoken = \"{TOKEN}\""))
        .start()
        .await;
    let in_flight = |overview: Value| admin_account(&overview, "streamer")["in_flight"].clone();
    let mut stream = h
        .messages(&keypool_tests::message_body(keypool_tests::MODEL, true))
        .send_streaming()
        .await;
    assert_eq!(stream.status, 200);
    // The stream is committed (its head arrived) and still running upstream.
    assert!(stream.next_frame().await.is_some());
    let during = admin_get(&h, "/admin/accounts", Some(TOKEN)).await.json();
    assert_eq!(in_flight(during), 1);
    let metrics = h.metrics().await;
    assert!(metrics.contains("keypool_account_in_flight{account=\"streamer\"} 1"));
    let reply = stream.read_to_end().await;
    assert!(reply.events().contains(&"message_stop".to_owned()));
    // The count drops when the stream's completion is credited, right after its last
    // frame; bounded wait for that hand-over.
    tokio::time::timeout(std::time::Duration::from_secs(2), async {
        while h.app().metrics().in_flight(&"streamer".into()) != 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("in_flight back to 0 after the stream ended");
    let after = admin_get(&h, "/admin/accounts", Some(TOKEN)).await.json();
    assert_eq!(in_flight(after), 0);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_asks_for_the_token() {
    let h = pool(true).await;
    let profile = std::env::temp_dir().join(format!("keypool-chromium-ask-{}", std::process::id()));
    let page = h.url("/admin/ui");
    let wrong = format!("{page}#token=not-the-token");
    let (without, refused) = tokio::task::spawn_blocking(move || {
        (
            headless(&page, "--dump-dom", &profile.join("a")),
            headless(&wrong, "--dump-dom", &profile.join("b")),
        )
    })
    .await
    .unwrap();
    // Without a token: the form, no data.
    assert!(
        without.contains("<form id=\"login\" class=\"\">"),
        "{without}"
    );
    assert!(
        without.contains("<div id=\"status\" class=\"hidden\">"),
        "{without}"
    );
    assert!(!without.contains("data-account="), "{without}");
    // A wrong token: refused, said so, asked again.
    assert!(
        refused.contains("That token was refused (401)."),
        "{refused}"
    );
    assert!(!refused.contains("data-account="), "{refused}");
    let _ = std::fs::remove_dir_all(
        std::env::temp_dir().join(format!("keypool-chromium-ask-{}", std::process::id())),
    );
    h.finish().await;
}
