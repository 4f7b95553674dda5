//! The request path over real loopback HTTP against keypool-sim: failover order, the
//! request-error rule, the commit rule, hedge and race, cancellation, routes.

mod support;

use std::time::Duration;

use keypool_cooldown::headers::{RateLimitInfo, UnifiedStatus, WindowUsage};
use keypool_core::AccountId;
use keypool_selector::Sample;
use keypool_sim::{Behaviour, Cut, Delay, ErrorReply, OkSpec, Script};
use keypool_store::now_ms;
use support::{TestAccount, body, frames, start};

fn cooldown_secs(h: &support::Harness, id: &str) -> Option<u64> {
    let now = now_ms();
    h.store
        .health()
        .cooldowns
        .cooldown_until(&AccountId::from(id), now)
        .map(|until| (until - now).div_ceil(1000))
}

#[tokio::test]
async fn failover_walks_the_plan_once_per_account_in_order() {
    let h = start(
        vec![
            TestAccount::new("a", Script::new(Behaviour::status(429))),
            TestAccount::new("b", Script::new(Behaviour::status(529))),
            TestAccount::new("c", Script::ok()),
        ],
        "priority",
        "",
    )
    .await;
    let answer = h.messages(false).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["type"], "message");
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert!(
        answer
            .header("x-request-id")
            .is_some_and(|id| id.starts_with("req_kp_"))
    );
    // Nothing of the upstream's own identifiers reaches the client.
    assert_eq!(answer.header("request-id"), None);
    let order: Vec<_> = h
        .sim
        .requests()
        .iter()
        .map(|r| r.account.clone().unwrap().to_string())
        .collect();
    assert_eq!(order, ["a", "b", "c"]);
    // SPEC 6: plain 429 → 60 s, 529 → 15 s, success → none.
    assert!(matches!(cooldown_secs(&h, "a"), Some(59..=60)));
    assert!(matches!(cooldown_secs(&h, "b"), Some(14..=15)));
    assert_eq!(cooldown_secs(&h, "c"), None);
    // The next request skips both cooling accounts.
    assert_eq!(h.messages(false).await.status, 200);
    assert_eq!(
        (h.requests("a"), h.requests("b"), h.requests("c")),
        (1, 1, 2)
    );
    h.finish().await;
}

#[tokio::test]
async fn a_bad_request_stops_after_two_attempts_with_the_generic_503() {
    let bad = || {
        Script::new(
            ErrorReply::new(http::StatusCode::BAD_REQUEST)
                .message("prompt is too long: secret-detail"),
        )
    };
    let h = start(
        vec![
            TestAccount::new("a", bad()),
            TestAccount::new("b", bad()),
            TestAccount::new("c", Script::ok()),
        ],
        "priority",
        "",
    )
    .await;
    let answer = h.messages(false).await;
    assert_eq!(answer.status, 503);
    assert_eq!(
        (h.requests("a"), h.requests("b"), h.requests("c")),
        (1, 1, 0)
    );
    let json = answer.json();
    assert_eq!(json["error"]["type"], "overloaded_error");
    assert_eq!(json["error"]["message"], "Overloaded");
    assert_eq!(json["request_id"], answer.header("x-request-id").unwrap());
    assert!(!answer.text().contains("secret-detail"));
    // Request errors cool nobody: Retry-After is the 1 s minimum.
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(cooldown_secs(&h, "a"), None);
    h.finish().await;
}

#[tokio::test]
async fn one_request_error_then_one_more_account() {
    let h = start(
        vec![
            TestAccount::new("a", Script::new(Behaviour::status(400))),
            TestAccount::new("b", Script::new(Behaviour::status(529))),
            TestAccount::new("c", Script::ok()),
        ],
        "priority",
        "",
    )
    .await;
    // a: request error; b: the one more account, fails; c is never tried.
    let answer = h.messages(false).await;
    assert_eq!(answer.status, 503);
    assert_eq!(answer.header("retry-after"), Some("15"));
    assert_eq!(
        (h.requests("a"), h.requests("b"), h.requests("c")),
        (1, 1, 0)
    );
    h.finish().await;
}

#[tokio::test]
async fn terminal_429_and_402_carry_only_the_upstream_message() {
    let h = start(
        vec![TestAccount::new(
            "a",
            Script::new(
                ErrorReply::rate_limited()
                    .message("Number of request tokens has exceeded your per-minute rate limit")
                    .retry_after_secs(90)
                    .header("anthropic-organization-id", "upstream-org"),
            ),
        )],
        "priority",
        "",
    )
    .await;
    let answer = h.messages(false).await;
    assert_eq!(answer.status, 429);
    assert_eq!(answer.header("retry-after"), Some("90"));
    assert_eq!(answer.header("x-should-retry"), Some("false"));
    assert_eq!(answer.header("anthropic-organization-id"), None);
    let json = answer.json();
    assert_eq!(json["error"]["type"], "rate_limit_error");
    assert_eq!(
        json["error"]["message"],
        "Number of request tokens has exceeded your per-minute rate limit"
    );
    h.sim
        .set_default(
            "a",
            ErrorReply::new(http::StatusCode::PAYMENT_REQUIRED).message("credit balance too low"),
        )
        .unwrap();
    h.store.clear_cooldown(&AccountId::from("a"));
    let answer = h.messages(false).await;
    assert_eq!(answer.status, 402);
    assert_eq!(answer.json()["error"]["message"], "credit balance too low");
    assert_eq!(answer.header("retry-after"), None);
    // 402 is a key error: the account is disabled (then the pool has nobody: 503).
    assert!(h.store.health().disabled.is_disabled(&AccountId::from("a")));
    assert_eq!(h.messages(false).await.status, 503);
    h.finish().await;
}

#[tokio::test]
async fn every_account_out_of_its_window_is_an_immediate_429() {
    let h = start(
        vec![
            TestAccount::new("a", Script::ok()),
            TestAccount::new("b", Script::ok()),
        ],
        "round_robin",
        "",
    )
    .await;
    let now = now_ms();
    for (id, reset_in) in [("a", 7_200_000), ("b", 3_600_000)] {
        let info = RateLimitInfo {
            five_hour: WindowUsage {
                utilization: Some(0.99),
                reset: Some(now + reset_in),
                status: Some(UnifiedStatus::AllowedWarning),
            },
            ..RateLimitInfo::default()
        };
        h.store.observe_windows(&AccountId::from(id), &info, now);
    }
    let answer = h.messages(false).await;
    assert_eq!(answer.status, 429);
    assert!(matches!(
        answer
            .header("retry-after")
            .map(|s| s.parse::<u64>().unwrap()),
        Some(3599..=3600)
    ));
    assert_eq!(answer.header("x-should-retry"), Some("false"));
    let message = answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("5h usage window"), "{message}");
    assert_eq!(h.sim.total_stats().requests, 0);
    h.finish().await;
}

#[tokio::test]
async fn model_override_and_count_tokens_are_forwarded() {
    let h = start(
        vec![TestAccount::new("a", Script::ok()).extra("model = \"claude-override\"")],
        "priority",
        "",
    )
    .await;
    let answer = h
        .post(
            "/acme/team/v1/messages?beta=true",
            &body("claude-client", false),
        )
        .await;
    assert_eq!(answer.status, 200);
    let recorded = &h.sim.requests()[0];
    assert_eq!(recorded.body_json().unwrap()["model"], "claude-override");
    assert_eq!(recorded.path_and_query, "/v1/messages?beta=true");
    assert_eq!(
        recorded.header("x-api-key"),
        Some(support::secret("a").as_str())
    );
    let answer = h
        .post(
            "/acme/team/v1/messages/count_tokens",
            &body("claude-client", false),
        )
        .await;
    assert_eq!(answer.status, 200);
    assert!(answer.json()["input_tokens"].is_u64());
    assert_eq!(
        h.sim.requests()[1].path_and_query,
        "/v1/messages/count_tokens"
    );
    h.finish().await;
}

#[tokio::test]
async fn stream_error_before_content_fails_over_without_splicing() {
    let h = start(
        vec![
            TestAccount::new("a", Script::new(Behaviour::in_band_error())),
            TestAccount::new("b", Script::new(OkSpec::default().text("from-b"))),
        ],
        "priority",
        "",
    )
    .await;
    let answer = h.messages(true).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-type"), Some("text/event-stream"));
    let events: Vec<String> = frames(&answer.body).into_iter().map(|(e, _)| e).collect();
    assert_eq!(events.iter().filter(|e| *e == "message_start").count(), 1);
    assert!(!events.contains(&"error".to_owned()));
    assert_eq!(events.last().map(String::as_str), Some("message_stop"));
    assert!(answer.text().contains("from-b"));
    assert_eq!((h.requests("a"), h.requests("b")), (1, 1));
    h.finish().await;
}

#[tokio::test]
async fn strict_first_frame_commit_sends_the_error_frame_instead() {
    let h = start(
        vec![
            TestAccount::new("a", Script::new(Behaviour::in_band_error())),
            TestAccount::new("b", Script::ok()),
        ],
        "priority",
        "stream_commit = \"first_frame\"",
    )
    .await;
    let answer = h.messages(true).await;
    assert_eq!(answer.status, 200);
    let f = frames(&answer.body);
    assert_eq!(f.first().unwrap().0, "message_start");
    assert_eq!(f.last().unwrap().1, keypool_sse::OVERLOADED_ERROR_FRAME);
    assert_eq!((h.requests("a"), h.requests("b")), (1, 0));
    h.finish().await;
}

#[tokio::test]
async fn no_first_frame_in_time_fails_over() {
    let h = start(
        vec![
            TestAccount::new(
                "a",
                Script::new(Behaviour::StallBeforeFirstFrame(Duration::from_secs(30))),
            ),
            TestAccount::new("b", Script::ok()),
        ],
        "priority",
        "first_frame_timeout_ms = 300",
    )
    .await;
    let started = std::time::Instant::now();
    let answer = h.messages(true).await;
    assert_eq!(answer.status, 200);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(frames(&answer.body).last().unwrap().0, "message_stop");
    assert_eq!((h.requests("a"), h.requests("b")), (1, 1));
    // The stalled attempt's connection was closed.
    tokio::time::timeout(
        Duration::from_secs(5),
        h.sim.wait_until(|s| s.stats("a").unwrap().in_flight == 0),
    )
    .await
    .unwrap();
    h.finish().await;
}

#[tokio::test]
async fn a_slow_but_valid_first_frame_is_fine() {
    let h = start(
        vec![
            TestAccount::new("a", Script::new(OkSpec::default().ttft(Delay::ms(600)))),
            TestAccount::new("b", Script::ok()),
        ],
        "priority",
        "first_frame_timeout_ms = 2000",
    )
    .await;
    let answer = h.messages(true).await;
    assert_eq!(answer.status, 200);
    assert_eq!((h.requests("a"), h.requests("b")), (1, 0));
    h.finish().await;
}

#[tokio::test]
async fn a_cut_after_commit_ends_with_exactly_one_generic_error_frame() {
    for cut in [Cut::EndOfBody, Cut::Close, Cut::Reset] {
        let h = start(
            vec![
                TestAccount::new("a", Script::new(Behaviour::cut_after(4, cut))),
                TestAccount::new("b", Script::ok()),
            ],
            "priority",
            "",
        )
        .await;
        let answer = h.messages(true).await;
        assert_eq!(answer.status, 200);
        let f = frames(&answer.body);
        let errors = f.iter().filter(|(e, _)| e == "error").count();
        assert_eq!(errors, 1, "{cut:?}: {}", answer.text());
        assert_eq!(f.last().unwrap().1, keypool_sse::OVERLOADED_ERROR_FRAME);
        assert!(f.iter().any(|(e, _)| e == "content_block_delta"));
        // No switch back after the head: b is never tried.
        assert_eq!(h.requests("b"), 0, "{cut:?}");
        h.finish().await;
    }
}

#[tokio::test]
async fn an_idle_committed_stream_ends_with_the_error_frame() {
    let h = start(
        vec![TestAccount::new(
            "a",
            Script::new(OkSpec::default().chunks(3).chunk_interval(Delay::ms(3_000))),
        )],
        "priority",
        "stream_idle_timeout_secs = 1",
    )
    .await;
    let answer = h.messages(true).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        frames(&answer.body).last().unwrap().1,
        keypool_sse::OVERLOADED_ERROR_FRAME
    );
    // A mid-stream failure is the serving account's: backoff starts at the 2nd one, so
    // none yet, but the stream failure is counted.
    let metrics = h.app.metrics().render(&h.store, now_ms());
    assert!(
        metrics.contains("keypool_stream_failures_total 1"),
        "{metrics}"
    );
    h.finish().await;
}

/// Gives both accounts a TTFT so the hedge/race gate opens.
fn prime_rating(h: &support::Harness, ids: &[&str]) {
    for id in ids {
        h.store.record_rating(
            &AccountId::from(*id),
            Sample::Success {
                ttft_ms: 100,
                total_ms: 400,
            },
            now_ms(),
        );
    }
}

#[tokio::test]
async fn hedge_backup_wins_and_is_credited_while_the_primary_is_aborted() {
    let h = start(
        vec![
            TestAccount::new("a", Script::new(OkSpec::default().ttft(Delay::ms(5_000)))),
            TestAccount::new("b", Script::new(OkSpec::default().text("from-b"))).url_variant(1),
        ],
        "hedge",
        "hedge_budget = 1.0\nhedge_min_delay_ms = 200",
    )
    .await;
    prime_rating(&h, &["a", "b"]);
    let started = std::time::Instant::now();
    let answer = h.messages(true).await;
    assert_eq!(answer.status, 200);
    assert!(answer.text().contains("from-b"));
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!((h.requests("a"), h.requests("b")), (1, 1));
    // The primary was aborted in flight: its upstream request was cancelled.
    tokio::time::timeout(
        Duration::from_secs(5),
        h.sim.wait_until(|s| s.stats("a").unwrap().cancelled == 1),
    )
    .await
    .unwrap();
    // Credit: b served (last_used, a fresh sample); a got nothing, not even a failure.
    let now = now_ms();
    let route = h.store.config().resolve("acme", "team").unwrap();
    let snapshot = h.store.snapshot(&route, now);
    let last_used = |id: &str| {
        snapshot
            .iter()
            .find(|c| c.id.as_str() == id)
            .unwrap()
            .last_used
    };
    assert!(last_used("b") > 0);
    assert_eq!(last_used("a"), 0);
    assert_eq!(cooldown_secs(&h, "a"), None);
    assert_eq!(
        h.store
            .rating()
            .rating(&AccountId::from("a"), now)
            .error_rate,
        Some(0.0)
    );
    let metrics = h.app.metrics().render(&h.store, now);
    assert!(
        metrics.contains("keypool_hedge_wins_total{winner=\"backup\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("keypool_hedge_backups_total{strategy=\"hedge\"} 1"));
    h.finish().await;
}

#[tokio::test]
async fn race_fires_both_and_the_first_to_commit_wins() {
    let h = start(
        vec![
            TestAccount::new(
                "a",
                Script::new(OkSpec::default().latency(Delay::ms(3_000))),
            ),
            TestAccount::new("b", Script::new(OkSpec::default().text("from-b"))).url_variant(1),
        ],
        "race",
        "hedge_budget = 1.0",
    )
    .await;
    prime_rating(&h, &["a", "b"]);
    let answer = h.messages(false).await;
    assert_eq!(answer.status, 200);
    assert!(answer.text().contains("from-b"));
    assert_eq!((h.requests("a"), h.requests("b")), (1, 1));
    tokio::time::timeout(
        Duration::from_secs(5),
        h.sim.wait_until(|s| s.stats("a").unwrap().cancelled == 1),
    )
    .await
    .unwrap();
    h.finish().await;
}

#[tokio::test]
async fn race_never_runs_two_accounts_of_the_same_base_url_together() {
    let h = start(
        vec![
            TestAccount::new("a", Script::new(OkSpec::default().latency(Delay::ms(300)))),
            TestAccount::new("b", Script::new(OkSpec::default().latency(Delay::ms(300)))),
        ],
        "race",
        "hedge_budget = 1.0",
    )
    .await;
    prime_rating(&h, &["a", "b"]);
    for _ in 0..3 {
        assert_eq!(h.messages(false).await.status, 200);
    }
    assert_eq!(h.sim.total_stats().peak_in_flight, 1);
    let metrics = h.app.metrics().render(&h.store, now_ms());
    assert!(
        metrics.contains("keypool_hedge_gate_total{reason=\"no_partner\"} 3"),
        "{metrics}"
    );
    h.finish().await;
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_attempt() {
    let h = start(
        vec![TestAccount::new(
            "a",
            Script::new(Behaviour::StallBeforeHeaders(Duration::from_secs(30))),
        )],
        "priority",
        "",
    )
    .await;
    // Before the head: the client gives up while keypool waits for the upstream.
    let request = h.request("POST", "/acme/team/v1/messages", &body("m", false));
    let gave_up = tokio::time::timeout(Duration::from_millis(300), h.send_raw(request)).await;
    assert!(gave_up.is_err());
    tokio::time::timeout(
        Duration::from_secs(5),
        h.sim.wait_until(|s| s.stats("a").unwrap().cancelled == 1),
    )
    .await
    .expect("the upstream request is cancelled when the client leaves");

    // Mid-stream: the client reads the head, then leaves.
    h.sim
        .set_default(
            "a",
            OkSpec::default().chunks(50).chunk_interval(Delay::ms(100)),
        )
        .unwrap();
    let response = h
        .send_raw(h.request("POST", "/acme/team/v1/messages", &body("m", true)))
        .await;
    assert_eq!(response.status(), 200);
    drop(response);
    tokio::time::timeout(
        Duration::from_secs(5),
        h.sim.wait_until(|s| s.stats("a").unwrap().cancelled == 2),
    )
    .await
    .expect("the upstream stream is cancelled when the client leaves");
    h.finish().await;
}

#[tokio::test]
async fn routes_head_health_and_identical_not_found_answers() {
    let h = start(vec![TestAccount::new("a", Script::ok())], "priority", "").await;
    for path in [
        "/api/hello",
        "/nope/x/v1/messages",
        "/acme/team/v1/messages",
        "/",
    ] {
        let answer = h.send(h.request("HEAD", path, "")).await;
        assert_eq!(answer.status, 200, "{path}");
        assert!(answer.body.is_empty());
    }
    assert_eq!(h.sim.total_stats().requests, 0);
    let unknown_org = h.post("/nope/team/v1/messages", &body("m", false)).await;
    let unknown_url = h.post("/acme/nope/v1/messages", &body("m", false)).await;
    assert_eq!(unknown_org.status, 404);
    let strip = |a: &support::Answer| {
        let id = a.header("x-request-id").unwrap().to_owned();
        let mut headers: Vec<_> = a
            .headers
            .iter()
            .filter(|(n, _)| *n != "x-request-id" && *n != "date")
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        headers.sort();
        (a.status, headers, a.text().replace(&id, "ID"))
    };
    assert_eq!(strip(&unknown_org), strip(&unknown_url));
    assert_eq!(
        unknown_org.json()["error"]["message"],
        "Custom URL config not found"
    );

    // Legacy routes: deprecation headers; an ambiguous custom URL is a 409.
    let legacy = h.post("/team/v1/messages", &body("m", false)).await;
    assert_eq!(legacy.status, 200);
    assert_eq!(legacy.header("deprecation"), Some("true"));
    assert_eq!(
        legacy.header("sunset"),
        Some("Thu, 31 Dec 2026 23:59:59 GMT")
    );
    let ambiguous = h.post("/shared/v1/messages", &body("m", false)).await;
    assert_eq!(ambiguous.status, 409);
    assert_eq!(ambiguous.header("deprecation"), Some("true"));

    // Key validation and body parsing.
    let mut no_key = h.request("POST", "/acme/team/v1/messages", &body("m", false));
    no_key.headers_mut().remove("x-api-key");
    no_key.headers_mut().insert(
        "authorization",
        "Bearer sk-ant-oat01-client-own".parse().unwrap(),
    );
    assert_eq!(h.send(no_key).await.status, 401);
    let bad = h.post("/acme/team/v1/messages", "{not json").await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["type"], "invalid_request_error");

    for (path, status) in [
        ("/healthz", 200),
        ("/readyz", 200),
        ("/metrics", 200),
        ("/admin", 404),
    ] {
        let answer = h.send(h.request("GET", path, "")).await;
        assert_eq!(answer.status, status, "{path}");
    }
    let get = h.send(h.request("GET", "/acme/team/v1/messages", "")).await;
    assert_eq!(get.status, 405);
    let metrics = h.send(h.request("GET", "/metrics", "")).await.text();
    assert!(metrics.contains("keypool_requests_total{org=\"acme\",url=\"team\",status=\"200\"} 1"));
    // (the Messages routes of an unknown org or URL config)
    assert!(metrics.contains("keypool_requests_total{org=\"-\",url=\"-\",status=\"404\"} 2"));
    // keypool's own routes are counted apart (issue 21): probes and scrapes do not
    // inflate keypool_requests_total
    assert!(metrics.contains("keypool_internal_requests_total{route=\"admin\",status=\"404\"} 1"));
    assert!(
        metrics.contains("keypool_internal_requests_total{route=\"healthz\",status=\"200\"} 1")
    );
    assert!(!metrics.contains("sk-lb-") && !metrics.contains("sk-ant-"));
    h.finish().await;
}

#[tokio::test]
async fn oversized_bodies_are_413_with_or_without_content_length() {
    let h = start(
        vec![TestAccount::new("a", Script::ok())],
        "priority",
        "max_body_bytes = 1024",
    )
    .await;
    let big = body(&"m".repeat(2_000), false);
    let answer = h.post("/acme/team/v1/messages", &big).await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.json()["error"]["type"], "request_too_large");
    // Without content-length (a streamed request body).
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
    let request = http::Request::builder()
        .method("POST")
        .uri(h.url("/acme/team/v1/messages"))
        .header("x-api-key", support::KEY)
        .body(ChannelBody(rx))
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let send = tokio::spawn(async move { client.request(request).await.map(|r| r.status()) });
    for _ in 0..3 {
        let _ = tx.send(bytes::Bytes::from(vec![b' '; 600])).await;
    }
    drop(tx);
    let status = send.await.unwrap();
    // keypool may answer (and close) before the client finished sending.
    assert!(
        status.as_ref().is_ok_and(|s| *s == 413) || status.is_err(),
        "{status:?}"
    );
    assert_eq!(h.sim.total_stats().requests, 0);
    h.finish().await;
}

/// A request body fed through a channel: no `content-length`.
struct ChannelBody(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(http_body::Frame::data(b))))
    }
}

#[tokio::test]
async fn a_client_that_sends_no_headers_is_disconnected() {
    use tokio::io::AsyncReadExt;
    let h = start(
        vec![TestAccount::new("a", Script::ok())],
        "priority",
        "header_read_timeout_secs = 1",
    )
    .await;
    for partial in [&b""[..], b"POST /acme/team/v1/mess"] {
        let mut socket = tokio::net::TcpStream::connect(h.addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut socket, partial)
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "still open after 5 s with {partial:?}");
        assert!(started.elapsed() >= Duration::from_millis(900));
    }
    h.finish().await;
}

#[tokio::test]
async fn a_client_that_stalls_mid_body_gets_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = start(
        vec![TestAccount::new("a", Script::ok())],
        "priority",
        "header_read_timeout_secs = 1",
    )
    .await;
    let mut socket = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let head = format!(
        "POST /acme/team/v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {}\r\ncontent-length: 100\r\n\r\n{{\"model\"",
        support::KEY
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut buf))
        .await
        .expect("answered within 5 s")
        .unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("invalid_request_error"));
    assert_eq!(h.sim.total_stats().requests, 0);
    h.finish().await;
}

#[tokio::test]
async fn shutdown_stops_accepting_and_lets_streams_in_flight_finish() {
    let mut h = start(
        vec![TestAccount::new(
            "a",
            Script::new(OkSpec::default().chunks(8).chunk_interval(Delay::ms(100))),
        )],
        "priority",
        "",
    )
    .await;
    let response = h
        .send_raw(h.request("POST", "/acme/team/v1/messages", &body("m", true)))
        .await;
    assert_eq!(response.status(), 200);
    h.stop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // No new connections once draining started.
    assert!(tokio::net::TcpStream::connect(h.addr).await.is_err());
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let f = frames(&bytes);
    assert_eq!(f.last().unwrap().0, "message_stop");
    assert_eq!(
        f.iter().filter(|(e, _)| e == "content_block_delta").count(),
        8
    );
    h.finish().await;
}

#[tokio::test]
async fn legacy_routes_answer_410_after_their_removal_date() {
    let h = start(
        vec![TestAccount::new("a", Script::ok())],
        "priority",
        "legacy_routes_until = 2020-01-01",
    )
    .await;
    let answer = h.post("/team/v1/messages", &body("m", false)).await;
    assert_eq!(answer.status, 410);
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    let message = answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("/{org}/team/v1/messages"), "{message}");
    assert_eq!(answer.header("deprecation"), Some("true"));
    assert_eq!(
        answer.header("sunset"),
        Some("Wed, 01 Jan 2020 23:59:59 GMT")
    );
    // The org-scoped route is unaffected.
    assert_eq!(h.messages(false).await.status, 200);
    assert_eq!(h.sim.total_stats().requests, 1);
    h.finish().await;
}

#[tokio::test]
async fn readyz_is_200_and_says_so_while_the_configured_redis_is_unreachable() {
    let toml = "[server]\nstate_file = \"\"\nredis_url = \"redis://127.0.0.1:1/\"\nredis_timeout_ms = 50\n";
    let config = keypool_store::config::Config::from_toml_str(toml, None, &|_| None).unwrap();
    let store = keypool_store::Store::open(config).await.unwrap();
    let app = keypool_proxy::App::new(store);
    let get = |path: &str| {
        http::Request::get(path)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    // keypool serves from memory: ready (a Redis blip must not take every replica
    // out of a load balancer), with the degradation in the body and in the metrics
    let response = app.handle(get("/readyz")).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("x-request-id"));
    let text = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&text),
        "ready, serving from memory; but redis is configured but unreachable: state is not shared with other replicas until it answers\n"
    );
    // only a draining keypool is not ready
    app.begin_drain();
    assert_eq!(app.handle(get("/readyz")).await.status(), 503);
    // Liveness does not depend on Redis.
    assert_eq!(app.handle(get("/healthz")).await.status(), 200);
    let metrics = http_body_util::BodyExt::collect(app.handle(get("/metrics")).await.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert!(String::from_utf8_lossy(&metrics).contains("keypool_redis_ready 0"));
}

#[tokio::test]
async fn window_headers_of_a_successful_stream_take_the_account_out() {
    let reset = now_ms() / 1000 + 7_200;
    let weekly = keypool_sim::UnifiedHeaders::allowed().window(
        keypool_core::Window::Weekly,
        0.97,
        reset,
        "allowed_warning",
    );
    let h = start(
        vec![TestAccount::new("a", Script::ok().unified(&weekly))],
        "priority",
        "",
    )
    .await;
    // The stream succeeds and its head carried the window reading: 0.97 ≥ 0.95.
    let first = h.messages(true).await;
    assert_eq!(first.status, 200);
    // The account's window is not the client's business: not forwarded.
    assert!(
        first
            .headers
            .keys()
            .all(|k| !k.as_str().starts_with("anthropic-ratelimit"))
    );
    let answer = h.messages(false).await;
    assert_eq!(answer.status, 429);
    let message = answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("weekly usage window"), "{message}");
    let retry: u64 = answer.header("retry-after").unwrap().parse().unwrap();
    assert!((7_190..=7_200).contains(&retry), "{retry}");
    assert_eq!(h.requests("a"), 1);
    h.finish().await;
}

mod bad_input {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use proptest::prelude::*;

    fn request(
        method: &str,
        path: &str,
        key: &[u8],
        body: Vec<u8>,
    ) -> Option<http::Request<Full<Bytes>>> {
        let mut builder = http::Request::builder().method(method).uri(path);
        if let Ok(value) = http::HeaderValue::from_bytes(key) {
            builder = builder
                .header("x-api-key", value.clone())
                .header("authorization", value);
        }
        builder.body(Full::new(Bytes::from(body))).ok()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Whatever arrives, keypool answers: an Anthropic-shaped JSON error (or a fixed
        /// route), an `x-request-id`, never a panic, never an upstream call (no key is
        /// valid here).
        #[test]
        fn any_request_gets_a_well_formed_answer(
            method in prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"]),
            path in prop_oneof![
                "(/[a-z0-9_%.-]{0,8}){0,6}",
                Just("/acme/team/v1/messages".to_owned()),
                Just("/team/v1/messages/count_tokens".to_owned()),
            ],
            key in prop::collection::vec(any::<u8>(), 0..64),
            body in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..256),
                Just(br#"{"model":"m","stream":true}"#.to_vec()),
                Just(br#"{"model":1}"#.to_vec()),
            ],
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let toml = "[server]\nstate_file = \"\"\n[[orgs]]\nslug = \"acme\"\n[[accounts]]\nid = \"a\"\norg = \"acme\"\nprovider = \"anthropic\"\nauth = \"api_key\"\nsecret = \"s\"\nbase_url = \"http://127.0.0.1:9\"\n[[urls]]\ncustom_url = \"team\"\norg = \"acme\"\n";
                let config = keypool_store::config::Config::from_toml_str(toml, None, &|_| None).unwrap();
                let app = keypool_proxy::App::new(keypool_store::Store::open(config).await.unwrap());
                let Some(request) = request(method, &path, &key, body) else { return };
                let response = app.handle(request).await;
                let status = response.status().as_u16();
                assert!(response.headers().contains_key("x-request-id"));
                let content_type = response
                    .headers()
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_owned());
                let bytes = response.into_body().collect().await.unwrap().to_bytes();
                if status >= 400 && path != "/readyz" {
                    assert_eq!(content_type.as_deref(), Some("application/json"));
                    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                    assert_eq!(json["type"], "error");
                    assert!(json["error"]["type"].is_string());
                    assert!(json["request_id"].is_string());
                } else {
                    assert!(matches!(path.as_str(), "/healthz" | "/readyz" | "/metrics"), "{status} {path}");
                }
                assert!([200, 401, 404, 405, 409, 410, 413].contains(&status), "{status} {path}");
            });
        }
    }
}
