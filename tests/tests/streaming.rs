//! SPEC 3.8 for streams end to end: the hold until the first valid frame (and, under
//! `first_content`, the first content frame), failover before the commit point, the one
//! generic error frame after it, idle timeout, and the client going away.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use keypool_sim::{Behaviour, Cut, Delay, OkSpec, Script};
use keypool_sse::OVERLOADED_ERROR_FRAME;
use keypool_tests::{AccountSpec, Harness, MODEL, Reply, message_body};

/// The events of a whole default stream (4 deltas).
const FULL: [&str; 10] = [
    "message_start",
    "content_block_start",
    "ping",
    "content_block_delta",
    "content_block_delta",
    "content_block_delta",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
];

/// The message id the simulator gives its `n`-th request.
fn sim_message_id(n: u64) -> String {
    format!("msg_sim{n:020}")
}

/// Asserts a committed stream: `200 text/event-stream`, these events.
fn assert_stream(r: &Reply, events: &[&str]) {
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|v| v.starts_with("text/event-stream")),
        "content-type {:?}",
        r.header("content-type")
    );
    assert!(r.header("x-request-id").is_some());
    assert_eq!(r.events(), events, "body: {}", r.text());
}

/// Asserts a committed stream that failed after its first `frames` frames: those of a
/// whole stream ([`FULL`]), then exactly one error frame, the generic one byte for byte
/// (not the upstream's).
fn assert_failed_after(r: &Reply, frames: usize) {
    let mut events = FULL[..frames].to_vec();
    events.push("error");
    assert_stream(r, &events);
    assert_eq!(
        &r.frames().last().unwrap().raw[..],
        OVERLOADED_ERROR_FRAME,
        "the generic frame, not the upstream's"
    );
    assert!(r.body.ends_with(OVERLOADED_ERROR_FRAME));
}

fn text_spec(text: &str) -> OkSpec {
    OkSpec::default().text(text)
}

#[tokio::test]
async fn a_stream_is_forwarded_frame_for_frame() {
    let h = Harness::with_accounts([("a", Script::ok())]).await;
    let r = h.send_stream().await;
    assert_stream(&r, &FULL);
    let frames = r.frames();
    assert_eq!(frames[0].json()["message"]["id"], sim_message_id(0));
    assert_eq!(frames[3].json()["delta"]["text"], "Hello");
    // the upstream's own header does not reach the client
    assert_eq!(r.header("request-id"), None);
    h.finish().await;
}

#[tokio::test]
async fn streaming_failover_429_529_200_in_plan_order() {
    let h = Harness::with_accounts([
        ("a", Script::new(Behaviour::status(429))),
        ("b", Script::new(Behaviour::status(529))),
        ("c", Script::ok()),
    ])
    .await;
    let r = h.send_stream().await;
    assert_stream(&r, &FULL);
    assert_eq!(h.upstream_order(), ["a", "b", "c"]);
    assert_eq!(r.frames()[0].json()["message"]["id"], sim_message_id(2));
    assert_eq!(h.cooldown("a").map(|e| e.until - e.set_at), Some(60_000));
    assert_eq!(h.cooldown("b").map(|e| e.until - e.set_at), Some(15_000));
    h.finish().await;
}

#[tokio::test]
async fn a_first_frame_after_two_seconds_is_fine() {
    let h = Harness::builder()
        .server("first_frame_timeout_ms", "4000")
        .accounts([
            ("a", Script::new(OkSpec::default().ttft(Delay::ms(2000)))),
            ("b", Script::ok()),
        ])
        .start()
        .await;
    let started = Instant::now();
    let r = h.send_stream().await;
    assert!(started.elapsed() >= Duration::from_millis(1900));
    assert_stream(&r, &FULL);
    assert_eq!(h.upstream_order(), ["a"], "no failover");
    h.finish().await;
}

#[tokio::test]
async fn no_first_frame_within_first_frame_timeout_fails_over() {
    let h = Harness::builder()
        .server("first_frame_timeout_ms", "300")
        .accounts([
            (
                "a",
                Script::new(Behaviour::StallBeforeFirstFrame(Duration::from_secs(30))),
            ),
            ("b", Script::ok()),
        ])
        .start()
        .await;
    let started = Instant::now();
    let r = h.send_stream().await;
    let took = started.elapsed();
    assert_stream(&r, &FULL);
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(h.upstream_order(), ["a", "b"]);
    h.wait_until(
        "a's stalled attempt is cancelled and closed",
        Duration::from_secs(5),
        |s| {
            let a = s.stats("a").unwrap();
            a.cancelled == 1 && a.in_flight == 0
        },
    )
    .await;
    h.finish().await;
}

#[tokio::test]
async fn a_body_that_ends_before_the_first_frame_fails_over() {
    for cut in [Cut::EndOfBody, Cut::Close, Cut::Reset] {
        let h = Harness::with_accounts([
            ("a", Script::new(Behaviour::cut_after(0, cut))),
            ("b", Script::ok()),
        ])
        .await;
        let r = h.send_stream().await;
        assert_stream(&r, &FULL);
        assert_eq!(h.upstream_order(), ["a", "b"], "{cut:?}");
        h.finish().await;
    }
}

#[tokio::test]
async fn message_start_then_in_band_overloaded_fails_over_under_first_content() {
    let h = Harness::with_accounts([
        (
            "a",
            Script::new(Behaviour::InBandError {
                after_frames: 1,
                spec: text_spec("ATTEMPT-ONE"),
            }),
        ),
        ("b", Script::new(text_spec("attempt-two"))),
    ])
    .await;
    let r = h.send_stream().await;
    assert_stream(&r, &FULL);
    assert_eq!(h.upstream_order(), ["a", "b"]);
    let frames = r.frames();
    // nothing of attempt 1: one message_start, b's
    assert_eq!(frames[0].json()["message"]["id"], sim_message_id(1));
    assert!(!r.text().contains(&sim_message_id(0)), "{}", r.text());
    assert!(!r.text().contains("ATTEMPT-ONE"));
    assert_eq!(frames[3].json()["delta"]["text"], "attempt-two");
    h.finish().await;
}

#[tokio::test]
async fn with_first_frame_commit_the_same_error_reaches_the_client_as_one_generic_frame() {
    let h = Harness::builder()
        .server("stream_commit", "\"first_frame\"")
        .accounts([
            ("a", Script::new(Behaviour::in_band_error())),
            ("b", Script::ok()),
        ])
        .start()
        .await;
    let r = h.send_stream().await;
    assert_failed_after(&r, 1);
    assert_eq!(
        h.upstream_order(),
        ["a"],
        "no switch after the commit point"
    );
    h.finish().await;
}

async fn cut_after_commit(cut: Cut) {
    let h = Harness::with_accounts([
        ("a", Script::new(Behaviour::cut_after(5, cut))),
        ("b", Script::ok()),
    ])
    .await;
    let r = h.send_stream().await;
    assert_failed_after(&r, 5);
    assert_eq!(
        h.upstream_order(),
        ["a"],
        "no switch after the commit point"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_stream_reset_after_commit_ends_with_exactly_one_generic_error_frame() {
    cut_after_commit(Cut::Reset).await;
}

#[tokio::test]
async fn a_stream_closed_after_commit_ends_with_exactly_one_generic_error_frame() {
    cut_after_commit(Cut::Close).await;
}

#[tokio::test]
async fn a_stream_ending_without_message_stop_ends_with_exactly_one_generic_error_frame() {
    cut_after_commit(Cut::EndOfBody).await;
}

#[tokio::test]
async fn an_upstream_error_frame_after_commit_is_replaced_by_the_generic_one() {
    let h = Harness::with_accounts([
        (
            "a",
            Script::new(Behaviour::InBandError {
                after_frames: 4,
                spec: OkSpec::default(),
            }),
        ),
        ("b", Script::ok()),
    ])
    .await;
    let r = h.send_stream().await;
    assert_failed_after(&r, 4);
    assert_eq!(h.upstream_order(), ["a"]);
    h.finish().await;
}

/// One account `a` answering `spec`, behind `stream_idle_timeout_secs = 1`.
async fn with_one_second_idle_timeout(spec: OkSpec) -> Harness {
    Harness::builder()
        .server("stream_idle_timeout_secs", "1")
        .account(AccountSpec::new("a", Script::new(spec)))
        .start()
        .await
}

#[tokio::test]
async fn a_stall_inside_a_committed_stream_ends_with_the_generic_error_frame() {
    let h = with_one_second_idle_timeout(
        OkSpec::default()
            .chunks(3)
            .chunk_interval(Delay::ms(30_000)),
    )
    .await;
    let started = Instant::now();
    let r = h.send_stream().await;
    let took = started.elapsed();
    assert_failed_after(&r, 4);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    h.wait_until(
        "the stalled upstream is cancelled",
        Duration::from_secs(5),
        |s| s.stats("a").unwrap().cancelled == 1,
    )
    .await;
    // a failure after the head is the serving account's, counted as a stream failure
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("keypool_stream_failures_total 1"),
        "{metrics}"
    );
    h.finish().await;
}

#[tokio::test]
async fn chunks_closer_than_the_idle_timeout_keep_a_stream_alive_past_it() {
    // Three pauses of 500 ms: 1.5 s in all, past the 1 s idle timeout, never 1 s silent.
    let h = with_one_second_idle_timeout(OkSpec::default().chunk_interval(Delay::ms(500))).await;
    let started = Instant::now();
    let r = h.send_stream().await;
    assert!(started.elapsed() >= Duration::from_millis(1_400));
    assert_stream(&r, &FULL);
    h.finish().await;
}

#[tokio::test]
async fn client_disconnect_mid_stream_cancels_the_upstream_request() {
    let h = Harness::with_accounts([(
        "a",
        Script::new(OkSpec::default().chunks(200).chunk_interval(Delay::ms(100))),
    )])
    .await;
    let mut stream = h
        .messages(&message_body(MODEL, true))
        .send_streaming()
        .await;
    assert_eq!(stream.status, 200);
    loop {
        let frame = stream.next_frame().await.expect("a frame before the end");
        if frame.event.as_deref() == Some("content_block_delta") {
            break;
        }
    }
    assert_eq!(h.sim().stats("a").unwrap().in_flight, 1);
    drop(stream);
    h.wait_until(
        "the upstream request is cancelled",
        Duration::from_secs(5),
        |s| {
            let a = s.stats("a").unwrap();
            a.cancelled == 1 && a.in_flight == 0
        },
    )
    .await;
    assert_eq!(h.sim().stats("a").unwrap().finished, 0);
    h.finish().await;
}

#[tokio::test]
async fn client_disconnect_during_the_hold_cancels_the_upstream_request() {
    let h = Harness::builder()
        .server("first_frame_timeout_ms", "20000")
        .account(AccountSpec::new(
            "a",
            Script::new(Behaviour::StallBeforeFirstFrame(Duration::from_secs(30))),
        ))
        .start()
        .await;
    let request = h.messages(&message_body(MODEL, true)).send_streaming();
    let gave_up = tokio::time::timeout(Duration::from_millis(300), request).await;
    assert!(gave_up.is_err(), "keypool held the head as it should");
    h.wait_until(
        "the upstream request is cancelled",
        Duration::from_secs(5),
        |s| s.stats("a").unwrap().cancelled == 1,
    )
    .await;
    h.finish().await;
}

#[tokio::test]
async fn client_disconnect_before_a_non_streaming_answer_cancels_the_upstream_request() {
    let h = Harness::with_accounts([(
        "a",
        Script::new(OkSpec::default().latency(Delay::ms(30_000))),
    )])
    .await;
    let request = h.messages(&message_body(MODEL, false)).send_streaming();
    let gave_up = tokio::time::timeout(Duration::from_millis(300), request).await;
    assert!(gave_up.is_err());
    h.wait_until(
        "the upstream request is cancelled",
        Duration::from_secs(5),
        |s| s.stats("a").unwrap().cancelled == 1,
    )
    .await;
    // the abandoned request is still counted, as "client closed request"
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"keypool_requests_total{org="acme",url="team",status="499"} 1"#),
        "{metrics}"
    );
    h.finish().await;
}

#[tokio::test]
async fn stream_bytes_are_forwarded_unchanged() {
    let spec = OkSpec::default()
        .chunks(500)
        .text("byte-exact \u{e9}\u{1f600} ");
    let h = Harness::with_accounts([("a", Script::new(spec))]).await;
    let through_keypool = h.send_stream().await;
    assert_eq!(through_keypool.status, 200);
    // the same request straight to the simulator (its next message id is 1, not 0)
    let direct = keypool_tests::Client::new()
        .post(format!("{}/v1/messages", h.sim().base_url()))
        .api_key(&keypool_tests::secret_of("a"))
        .json(&message_body(MODEL, true))
        .send()
        .await;
    assert_eq!(direct.status, 200);
    let expected = direct
        .text()
        .replace(&sim_message_id(1), &sim_message_id(0));
    assert_eq!(through_keypool.frames().len(), 506);
    assert!(
        through_keypool.body == expected.as_bytes(),
        "the forwarded bytes differ from the upstream's"
    );
    h.finish().await;
}
