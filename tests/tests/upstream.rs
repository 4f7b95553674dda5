//! Careless and hostile upstreams (issue 14's campaign): what an upstream sends is never
//! forwarded blind. Each test plays one misbehaviour with a [`FakeUpstream`] that writes
//! exactly the scripted bytes, in front of a healthy simulator account that the request
//! fails over to.
//!
//! - a 429/402 (or another pass-through status) whose message echoes the credential and
//!   the request headers reaches the client without any of it;
//! - a 2xx to a non-streaming request that is not a valid answer (an event stream, gzip,
//!   not JSON, empty, `204`, `299`, too large, too slow) fails over;
//! - a stream is complete at `message_stop`, whatever its body does next;
//! - a `Retry-After` date ends the cooldown at that date, however late the body came;
//! - a passed-through `Retry-After` is capped as the cooldown is.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use keypool_sim::Script;
use keypool_tests::fake_upstream::{FakeUpstream, Part, Received, messages_answer, stream_frames};
use keypool_tests::{AccountSpec, Harness, MODEL, message_body, secret_of};

/// A harness with account `a` on `fake` (priority 0) and account `b` on the simulator
/// (priority 1), with extra `[server]` options.
async fn with_fake(fake: &FakeUpstream, server: &[(&str, &str)]) -> Harness {
    let mut b = Harness::builder()
        .account(AccountSpec::new("a", Script::ok()).base_url(&fake.base_url()))
        .account(AccountSpec::new("b", Script::ok()).priority(1));
    for (k, v) in server {
        b = b.server(k, v);
    }
    b.start().await
}

/// An Anthropic-shaped error answer with `status` and `message`, and extra head lines.
fn error_answer(status: &str, error_type: &str, message: &str, extra: &str) -> Vec<u8> {
    let body = serde_json::json!({"type":"error","error":{"type":error_type,"message":message}})
        .to_string();
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A careless upstream that quotes the request it was sent: every head line (`host`
/// included; the credential header too when `with_credential`) goes into its error
/// message, with other tokens.
fn echoing(
    status: &'static str,
    error_type: &'static str,
    with_credential: bool,
) -> impl Fn(&Received) -> Vec<Part> {
    move |request: &Received| {
        let quoted = request
            .head
            .lines()
            .filter(|l| with_credential || !l.to_ascii_lowercase().starts_with("x-api-key"))
            .collect::<Vec<_>>()
            .join(" | ");
        let message = format!(
            "limit reached for this key; request was: {quoted} (also try sk-ant-oat01-OTHERTOKEN_1 or sk-lb-0123456789abcdef0123456789abcdef)"
        );
        vec![Part::Bytes(error_answer(status, error_type, &message, ""))]
    }
}

/// Issue 14.2: the 429/402 pass-through (and an operator's extra `passthrough_statuses`)
/// never carries the account's secret, any `sk-ant-`/`sk-lb-` token, the account's base
/// URL or host, in JSON and streaming requests alike (before the fix the message was
/// passed verbatim).
#[tokio::test]
async fn passthrough_messages_carry_nothing_of_the_account() {
    for (status, error_type, code, with_credential) in [
        ("429 Too Many Requests", "rate_limit_error", 429, true),
        ("429 Too Many Requests", "rate_limit_error", 429, false),
        ("402 Payment Required", "billing_error", 402, false),
        ("400 Bad Request", "invalid_request_error", 400, true),
    ] {
        // A fresh pool per request: a 402 disables its account.
        for stream in [false, true] {
            let fake = FakeUpstream::start(echoing(status, error_type, with_credential)).await;
            let host = fake.base_url().trim_start_matches("http://").to_owned();
            let h = Harness::builder()
                .account(AccountSpec::new("a", Script::ok()).base_url(&fake.base_url()))
                .server("passthrough_statuses", "[429, 402, 400]")
                .start()
                .await;
            let reply = h.messages(&message_body(MODEL, stream)).send().await;
            let message = reply.assert_keypool_error(code, error_type);
            if with_credential {
                // The secret was in it: no redaction can be trusted with a text that
                // quotes it, so the status's own reason is sent instead.
                assert_eq!(Some(message.as_str()), reply.status.canonical_reason());
            } else {
                assert!(
                    message
                        .starts_with("limit reached for this key; request was: POST /v1/messages"),
                    "{message}"
                );
                assert!(message.contains("host: [redacted]"), "{message}");
            }
            for leaked in [
                secret_of("a").as_str(),
                &secret_of("a")[..16],
                "sk-ant-",
                "sk-lb-",
                &host,
                "127.0.0.1",
            ] {
                assert!(
                    !message.contains(leaked),
                    "{status}, stream {stream}: {leaked:?} reached the client: {message}"
                );
            }
            // The upstream really did get the secret (and quoted it when told to).
            assert!(fake.received()[0].head.contains(&secret_of("a")));
            h.finish().await;
        }
    }
}

/// Issue 14.5: an upstream that answers a non-streaming request with an event stream
/// (as one that coerces `"stream": "true"` would) is not forwarded blind: the attempt
/// fails and the request fails over (before the fix the client got the event stream,
/// with the upstream's error frame, as a `200`).
#[tokio::test]
async fn an_event_stream_to_a_non_streaming_request_fails_over() {
    let fake = FakeUpstream::start(|_| {
        let frames = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n\
             event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"upstream-internal\"}}\n\n";
        vec![
            Part::text(format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{frames}",
                frames.len()
            )),
        ]
    })
    .await;
    let h = with_fake(&fake, &[]).await;
    let reply = h.send_message().await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.json()["type"], "message");
    assert!(!reply.text().contains("upstream-internal"));
    assert_eq!(h.requests_per_account(&["b"]), [1]);
    assert_eq!(fake.received().len(), 1);
    assert!(
        h.metrics()
            .await
            .contains("keypool_failovers_total{class=\"transient\",trigger=\"invalid_answer\"} 1")
    );
    h.finish().await;
}

/// Issue 14.10: a non-streaming 2xx that is not a valid Messages answer is a failed
/// attempt, and the request fails over (before the fix each was forwarded, or counted as
/// a success: gzip bytes labelled JSON, an empty `200`, a `204`, a `299`).
#[tokio::test]
async fn two_hundreds_that_are_not_answers_fail_over() {
    let gzip =
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xab\xae\x05\x00\x43\xbf\xa6\xa3\x02\x00\x00\x00";
    let mut gzipped = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\ncontent-length: 22\r\n\r\n".to_vec();
    gzipped.extend_from_slice(gzip);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("gzip although identity was asked", gzipped),
        (
            "not JSON",
            b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 15\r\n\r\n<html>ok</html>".to_vec(),
        ),
        (
            "empty 200",
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n".to_vec(),
        ),
        ("204", b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()),
        (
            "299",
            {
                let ok = messages_answer();
                let mut v = b"HTTP/1.1 299 Whatever".to_vec();
                v.extend_from_slice(&ok["HTTP/1.1 200 OK".len()..]);
                v
            },
        ),
        (
            "JSON that is not an answer",
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 16\r\n\r\n{\"type\":\"error\"}".to_vec(),
        ),
    ];
    for (case, answer) in cases {
        let fake = FakeUpstream::start(move |_| vec![Part::Bytes(answer.clone())]).await;
        let h = with_fake(&fake, &[]).await;
        let reply = h.send_message().await;
        assert_eq!(reply.status, 200, "{case}: {}", reply.text());
        assert_eq!(reply.json()["type"], "message", "{case}");
        assert_eq!(reply.header("content-encoding"), None, "{case}");
        assert_eq!(h.requests_per_account(&["b"]), [1], "{case}: served by b");
        assert_eq!(fake.received().len(), 1, "{case}");
        h.finish().await;
    }
}

/// Issue 14.10: a non-streaming answer larger than `max_response_body_bytes`, or one
/// that does not complete within `upstream_timeout` of its head (however steadily it
/// trickles), fails over (before the fix both were read to their end and served).
#[tokio::test]
async fn answers_too_large_or_too_slow_fail_over() {
    // 2 MiB of valid JSON against a 1 MiB limit.
    let padding = " ".repeat(2 << 20);
    let big = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{padding}{{\"type\":\"message\"}}",
        padding.len() + 16
    )
    .into_bytes();
    let fake = FakeUpstream::start(move |_| vec![Part::Bytes(big.clone())]).await;
    let h = with_fake(&fake, &[("max_response_body_bytes", "1048576")]).await;
    let reply = h.send_message().await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        h.requests_per_account(&["b"]),
        [1],
        "too large: served by b"
    );
    h.finish().await;

    // A valid answer trickled over 3 s, never idle for the 10 s idle timeout, against
    // a 1 s upstream timeout.
    let fake = FakeUpstream::start(|_| {
        let answer = messages_answer();
        let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let mut parts = vec![Part::Bytes(answer[..head_end].to_vec())];
        for chunk in answer[head_end..].chunks(answer.len().div_ceil(10)) {
            parts.push(Part::Pause(Duration::from_millis(300)));
            parts.push(Part::Bytes(chunk.to_vec()));
        }
        parts
    })
    .await;
    let h = with_fake(&fake, &[("upstream_timeout_secs", "1")]).await;
    let reply = h.send_message().await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(h.requests_per_account(&["b"]), [1], "too slow: served by b");
    assert!(
        h.metrics()
            .await
            .contains("keypool_failovers_total{class=\"transient\",trigger=\"timeout\"} 1")
    );
    h.finish().await;
}

/// Issue 14.11: a stream is complete at `message_stop`. A body that then ends short of
/// its `content-length`, or an upstream that keeps the connection open, ends the
/// client's stream cleanly, credited as a success (before the fix the client got
/// keypool's generic error frame after the clean `message_stop`, the second only after
/// the idle timeout).
#[tokio::test]
async fn a_stream_is_complete_at_message_stop() {
    for (case, after) in [
        ("body shorter than its content-length", Part::Close),
        ("connection held open", Part::Pause(Duration::from_secs(30))),
    ] {
        let fake = FakeUpstream::start(move |_| {
            let frames = stream_frames();
            vec![
                Part::text(format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{frames}",
                    frames.len() + 100
                )),
                after.clone(),
            ]
        })
        .await;
        let h = with_fake(&fake, &[]).await;
        let reply = tokio::time::timeout(Duration::from_secs(5), h.send_stream())
            .await
            .unwrap_or_else(|_| panic!("{case}: the stream did not end within 5 s"));
        assert_eq!(reply.status, 200, "{case}");
        let events = reply.events();
        assert_eq!(
            events.last().map(String::as_str),
            Some("message_stop"),
            "{case}: {events:?}"
        );
        assert!(!events.iter().any(|e| e == "error"), "{case}: {events:?}");
        assert_eq!(h.requests_per_account(&["b"]), [0], "{case}");
        assert!(
            h.metrics()
                .await
                .contains("keypool_stream_failures_total 0"),
            "{case}"
        );
        assert_eq!(h.cooldown("a"), None, "{case}: a success, no backoff");
        h.finish().await;
    }
}

/// Issue 14.13: a `Retry-After` HTTP date is absolute: the cooldown ends at that date,
/// however long the error body took to arrive after the head (before the fix it ended
/// late by the body's delay, here 1.5 s).
#[tokio::test]
async fn a_retry_after_date_ends_the_cooldown_at_that_date() {
    let date_ms = (keypool_store::now_ms() / 1000 + 20) * 1000;
    let date = httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_millis(date_ms));
    let fake = FakeUpstream::start(move |_| {
        let answer = error_answer(
            "429 Too Many Requests",
            "rate_limit_error",
            "slow down",
            &format!("retry-after: {date}\r\n"),
        );
        let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        vec![
            Part::Bytes(answer[..head_end].to_vec()),
            Part::Pause(Duration::from_millis(1500)),
            Part::Bytes(answer[head_end..].to_vec()),
        ]
    })
    .await;
    let h = with_fake(&fake, &[("first_frame_timeout_ms", "5000")]).await;
    let reply = h.send_message().await;
    assert_eq!(reply.status, 200, "failed over to b: {}", reply.text());
    let cooldown = h.cooldown("a").expect("a is cooling");
    assert_eq!(cooldown.until, date_ms, "the cooldown ends at the date");
    h.finish().await;
}

/// Issue 14.8: a passed-through `Retry-After` is capped as the cooldown is (1 h by
/// default), with `x-should-retry: false` (before the fix `999999999999999999999` reached
/// the client as `18446744073709552`).
#[tokio::test]
async fn a_passed_through_retry_after_is_capped() {
    let fake = FakeUpstream::start(|_| {
        vec![Part::Bytes(error_answer(
            "429 Too Many Requests",
            "rate_limit_error",
            "slow down",
            "retry-after: 999999999999999999999\r\n",
        ))]
    })
    .await;
    let h = Harness::builder()
        .account(AccountSpec::new("a", Script::ok()).base_url(&fake.base_url()))
        .start()
        .await;
    let reply = h.send_message().await;
    reply.assert_keypool_error(429, "rate_limit_error");
    assert_eq!(reply.header("retry-after"), Some("3600"));
    assert_eq!(reply.header("x-should-retry"), Some("false"));
    h.finish().await;
}

/// Issue 14.10: the buffered answers held at once are bounded for the whole process
/// (`max_body_bytes_in_flight`), not only per answer: while one 700 KiB answer is being
/// read, a second does not fit in the 1 MiB budget; that attempt fails as keypool's own
/// failure (`503`, never counted against the account), and the first is served (before
/// the fix 20 parallel 10 MB answers took RSS from 40 to 361 MiB).
#[tokio::test]
async fn buffered_answers_are_bounded_for_the_whole_process() {
    let fake = FakeUpstream::start(|_| {
        let padding = " ".repeat(700 << 10);
        let body = format!(
            "{padding}{}",
            r#"{"type":"message","usage":{"input_tokens":1,"output_tokens":1}}"#
        );
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let (first, second) = body.split_at(body.len() - 100);
        vec![
            Part::text(head),
            Part::text(first),
            Part::Pause(Duration::from_millis(1500)),
            Part::text(second),
        ]
    })
    .await;
    let h = Harness::builder()
        .account(AccountSpec::new("a", Script::ok()).base_url(&fake.base_url()))
        .server("max_body_bytes", "65536")
        .server("max_body_bytes_in_flight", "1048576")
        .start()
        .await;
    let first = h.send_message();
    let second = async {
        // The second starts once the first answer is being held.
        tokio::time::timeout(Duration::from_secs(5), async {
            while answer_bytes_held(&h.metrics().await) < 600 << 10 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the first answer is held");
        h.send_message().await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.status, 200, "{}", first.text());
    second.assert_keypool_error(503, "overloaded_error");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("keypool_local_failures_total{resource=\"body_budget\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("keypool_body_in_flight_bytes{kind=\"answer\"} 0"),
        "{metrics}"
    );
    assert_eq!(
        h.cooldown("a"),
        None,
        "keypool's own failure is not the account's"
    );
    h.finish().await;
}

/// The `keypool_body_in_flight_bytes{kind="answer"}` gauge.
fn answer_bytes_held(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("keypool_body_in_flight_bytes{kind=\"answer\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Requests and answers of every size on both sides of the bound under which keypool
/// sends a body in one buffer with its head (4 KiB, `h1::COALESCE_MAX`; larger ones go
/// beside it in a vectored write): each arrives whole and byte for byte, the request
/// at the upstream and the answer, whole or streamed, at the client.
#[tokio::test]
async fn bodies_on_both_sides_of_the_one_write_bound_arrive_whole() {
    const BOUND: usize = 4 * 1024;
    /// The `200` answer whose body is `size` bytes (its text padded to fit).
    fn answer_of(size: usize) -> (Vec<u8>, Vec<u8>) {
        let without_text = String::from_utf8(messages_answer()).unwrap();
        let body_at = without_text.find("\r\n\r\n").unwrap() + 4;
        let template = without_text[body_at..].replace("\"fake\"", "\"\"");
        let text = "x".repeat(size - template.len());
        let body = template.replace("\"text\":\"\"", &format!("\"text\":\"{text}\""));
        assert_eq!(body.len(), size);
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {size}\r\n\r\n"
        );
        (
            [head.as_bytes(), body.as_bytes()].concat(),
            body.into_bytes(),
        )
    }
    for size in [BOUND - 1, BOUND, BOUND + 1, 70_000] {
        let (answer, answer_body) = answer_of(size);
        let fake = FakeUpstream::start(move |_| vec![Part::Bytes(answer.clone())]).await;
        let h = with_fake(&fake, &[]).await;
        // The request body: `size` bytes too, give or take the JSON around the text.
        let mut body = message_body(MODEL, false);
        body["messages"][0]["content"] = serde_json::Value::String("y".repeat(size));
        for _ in 0..2 {
            let reply = h.messages(&body).send().await;
            assert_eq!(reply.status, 200, "{size}: {}", reply.text());
            assert_eq!(reply.body, answer_body, "{size}: the answer, byte for byte");
        }
        let received = fake.received();
        assert_eq!(received.len(), 2, "{size}: both served by the fake");
        for r in &received {
            assert_eq!(r.body, serde_json::to_vec(&body).unwrap(), "{size}");
        }
        assert_eq!(h.requests_per_account(&["b"]), [0], "{size}");
        h.finish().await;
    }
    // A stream whose delta frame is small, then one past the bound.
    for size in [10, BOUND + 100] {
        let frames = stream_frames().replace(
            "\"text\":\"fake\"",
            &format!("\"text\":\"{}\"", "z".repeat(size)),
        );
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{frames}",
            frames.len()
        );
        let fake = FakeUpstream::start(move |_| vec![Part::text(answer.clone())]).await;
        let h = with_fake(&fake, &[]).await;
        let reply = h.messages(&message_body(MODEL, true)).send().await;
        assert_eq!(reply.status, 200, "stream {size}: {}", reply.text());
        assert_eq!(
            reply.text(),
            frames,
            "stream {size}: the frames, byte for byte"
        );
        h.finish().await;
    }
}
