//! Hostile input (SPEC 3.1–3.4): keypool answers whatever a client throws at it with a
//! clear 4xx, never a 5xx, a panic or a hang, and never an upstream call.
//!
//! - a huge chunked body is refused with `413` long before it has all been sent (not
//!   buffered whole), and so is an announced `content-length` over the limit;
//! - a client trickling its headers one byte at a time is still cut off at the header
//!   timeout, and a body that stalls gets `408`;
//! - invalid JSON, non-UTF-8 bytes, missing or non-string `model`, deep nesting, huge
//!   header counts and sizes, odd paths (`..`, encoded slashes, very long slugs) → 4xx;
//! - thousands of idle connections: memory stays bounded, requests are still served, and
//!   the header timeout closes every one of them;
//! - any generated method, path, key and body gets a well-formed answer (a property).

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use keypool_sim::Script;
use keypool_tests::raw::{exchange, header_of, post, read_head, status_of};
use keypool_tests::{AccountSpec, Harness, KEY, MODEL, check_property, message_body};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn harness(limits: &[(&str, &str)]) -> Harness {
    let mut b = Harness::builder().account(AccountSpec::new("a", Script::ok()));
    for (k, v) in limits {
        b = b.server(k, v);
    }
    b.start().await
}

fn host(h: &Harness) -> String {
    h.base_url().trim_start_matches("http://").to_owned()
}

async fn raw(h: &Harness, request: &[u8]) -> (u16, String) {
    exchange(&host(h), request).await
}

/// The resident set size of this process, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_chunked_body_gets_413_before_it_is_all_sent() {
    const LIMIT: usize = 1 << 20;
    const WOULD_SEND: usize = 256 << 20;
    let h = harness(&[("max_body_bytes", &LIMIT.to_string())]).await;
    let mut socket = TcpStream::connect(host(&h)).await.unwrap();
    let head = format!(
        "POST /acme/team/v1/messages HTTP/1.1\r\nhost: keypool\r\nx-api-key: {}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
        h.key(KEY)
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let (mut read, mut write) = socket.into_split();
    let writer = tokio::spawn(async move {
        let chunk = vec![b' '; 64 * 1024];
        let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
        frame.extend_from_slice(&chunk);
        frame.extend_from_slice(b"\r\n");
        let mut sent = 0usize;
        while sent < WOULD_SEND {
            if write.write_all(&frame).await.is_err() {
                break;
            }
            sent += chunk.len();
        }
        sent
    });
    let text = read_head(&mut read, Duration::from_secs(20)).await;
    assert_eq!(status_of(&text), 413, "a 413 head within 20 s: {text}");
    drop(read);
    let sent = writer.await.unwrap();
    eprintln!("413 after {sent} bytes of a {WOULD_SEND}-byte body (limit {LIMIT})");
    assert!(
        sent < WOULD_SEND / 4,
        "answered after {sent} of {WOULD_SEND} bytes: the server read on long past the limit"
    );
    assert_eq!(h.sim().total_stats().requests, 0);

    // an announced length over the limit is refused from the head alone
    let mut request = format!(
        "POST /acme/team/v1/messages HTTP/1.1\r\nhost: keypool\r\nconnection: close\r\n\
         x-api-key: {}\r\ncontent-length: {}\r\n\r\n",
        h.key(KEY),
        WOULD_SEND
    )
    .into_bytes();
    request.extend_from_slice(b"{\"model\":");
    let started = Instant::now();
    let (status, text) = raw(&h, &request).await;
    assert_eq!(status, 413, "{text}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(text.contains("request_too_large"), "{text}");
    h.finish().await;
}

#[tokio::test]
async fn headers_trickled_byte_by_byte_are_cut_at_the_header_timeout() {
    let h = harness(&[("header_read_timeout_secs", "1")]).await;
    let mut socket = TcpStream::connect(host(&h)).await.unwrap();
    let started = Instant::now();
    let head = b"POST /acme/team/v1/messages HTTP/1.1\r\nhost: keypool\r\nx-padding: ".to_vec();
    let closed = tokio::time::timeout(Duration::from_secs(6), async {
        let mut i = 0usize;
        loop {
            let byte = head.get(i).copied().unwrap_or(b'a');
            if socket.write_all(&[byte]).await.is_err() {
                return;
            }
            i += 1;
            let mut buf = [0u8; 256];
            // the server closing (EOF or reset) shows as a read within the pause
            if let Ok(r) =
                tokio::time::timeout(Duration::from_millis(100), socket.read(&mut buf)).await
            {
                match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => assert!(
                        status_of(&String::from_utf8_lossy(&buf[..n])) == 408,
                        "only a 408 may answer a slow head"
                    ),
                }
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "still open after 6 s of trickling");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "cut after {took:?} with a 1 s header timeout"
    );
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

/// The head timeout counts from the moment the server waits for each head (after the
/// previous answer), not from the connection's first request: heads 700 ms apart on
/// one kept-alive connection are all served past the first head's 1 s, and the idle
/// connection closes 1 s after its last answer.
#[tokio::test]
async fn the_header_timeout_counts_from_each_answer_on_a_kept_alive_connection() {
    let h = harness(&[("header_read_timeout_secs", "1")]).await;
    let mut socket = TcpStream::connect(host(&h)).await.unwrap();
    let started = Instant::now();
    for i in 0..3 {
        if i > 0 {
            // the client's own pace between requests, the thing under test
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        socket
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: k\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        let read = tokio::time::timeout(Duration::from_secs(5), async {
            while !answer.ends_with(b"\r\n\r\nok\n") {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => answer.extend_from_slice(&buf[..n]),
                }
            }
            true
        })
        .await;
        let text = String::from_utf8_lossy(&answer);
        assert_eq!(
            read,
            Ok(true),
            "request {i} at {:?}: {text}",
            started.elapsed()
        );
        assert_eq!(status_of(&text), 200, "{text}");
    }
    assert!(started.elapsed() > Duration::from_millis(1_300));
    let last_answer = Instant::now();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "the idle connection must close, got {closed:?}"
    );
    let idle = last_answer.elapsed();
    assert!(
        idle >= Duration::from_millis(900) && idle < Duration::from_secs(3),
        "closed {idle:?} after the last answer with a 1 s header timeout"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_body_that_stalls_gets_408() {
    let h = harness(&[("header_read_timeout_secs", "1")]).await;
    let mut request = post("/acme/team/v1/messages", &h.key(KEY), "", &[0u8; 100]);
    request.truncate(request.len() - 90); // 10 of the 100 announced bytes
    let started = Instant::now();
    let mut socket = TcpStream::connect(host(&h)).await.unwrap();
    socket.write_all(&request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut answer))
        .await
        .expect("answered within 5 s")
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert_eq!(status_of(&text), 408, "{text}");
    assert!(text.contains("invalid_request_error"), "{text}");
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

/// Sends a head announcing `announced` body bytes and then `sent` of them, and keeps
/// the connection open without sending more; returns the answer's head (what arrived
/// within `within`) and the connection (dropped by the caller).
async fn partial_body(
    h: &Harness,
    head: &str,
    announced: usize,
    sent: usize,
    within: Duration,
) -> (String, TcpStream) {
    let mut socket = TcpStream::connect(host(h)).await.unwrap();
    let request =
        format!("{head}content-type: application/json\r\ncontent-length: {announced}\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    // the server may answer and stop reading before all of it is in: that is the point
    let _ = tokio::time::timeout(
        Duration::from_millis(500),
        socket.write_all(&vec![b' '; sent]),
    )
    .await;
    let answer = read_head(&mut socket, within).await;
    (answer, socket)
}

/// SPEC 3.1: route and key are answered from the head alone. A client without a valid
/// key (or for an unknown org) that declares a 30 MiB body, sends part of it and stalls
/// gets its 401/404 at once, with `connection: close`, and keypool never holds its body
/// (before the fix the body was read first: the answer was a 408 after the body stalled
/// for the idle timeout, here 20 s).
#[tokio::test]
async fn an_unauthenticated_body_is_never_read() {
    let h = Harness::builder()
        .account(AccountSpec::new("a", Script::ok()))
        .server("header_read_timeout_secs", "20")
        .extra_toml("[admin]\ntoken = \"admin-secret-token\"")
        .start()
        .await;
    let key = h.key(KEY);
    let wrong = format!("sk-lb-{}", "x".repeat(40));
    let cases = [
        (
            "no key",
            "/acme/team/v1/messages".to_owned(),
            String::new(),
            401,
        ),
        (
            "wrong key",
            "/acme/team/v1/messages".to_owned(),
            format!("x-api-key: {wrong}\r\n"),
            401,
        ),
        (
            "unknown org",
            "/nobody/team/v1/messages".to_owned(),
            format!("x-api-key: {key}\r\n"),
            404,
        ),
        (
            "unknown URL",
            "/acme/nothing/v1/messages".to_owned(),
            format!("x-api-key: {key}\r\n"),
            404,
        ),
        (
            "wrong admin token",
            "/admin/reload".to_owned(),
            "authorization: Bearer not-the-token\r\n".to_owned(),
            401,
        ),
    ];
    for (case, path, auth, status) in cases {
        let head = format!("POST {path} HTTP/1.1\r\nhost: keypool\r\n{auth}");
        let (answer, _socket) =
            partial_body(&h, &head, 30 << 20, 256 << 10, Duration::from_secs(5)).await;
        assert_eq!(status_of(&answer), status, "{case}: {answer}");
        assert_eq!(
            header_of(&answer, "connection"),
            Some("close"),
            "{case}: {answer}"
        );
    }
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

/// SPEC 3.1: the body has an overall deadline as well as the idle one. A client that
/// sends a byte every 200 ms (never idle for the 5 s idle timeout) gets `408` once
/// `body_read_timeout_secs` (1 s) has passed since its body started (before the fix it
/// was read to its end, 3 s later, and served).
#[tokio::test]
async fn a_body_trickled_past_the_body_deadline_gets_408() {
    let h = harness(&[
        ("header_read_timeout_secs", "5"),
        ("body_read_timeout_secs", "1"),
    ])
    .await;
    let body = serde_json::to_vec(&message_body(MODEL, false)).unwrap();
    let mut request = post("/acme/team/v1/messages", &h.key(KEY), "", &body);
    let cut = request.len() - body.len();
    let rest = request.split_off(cut);
    let socket = TcpStream::connect(host(&h)).await.unwrap();
    let (mut read, mut write) = socket.into_split();
    write.write_all(&request).await.unwrap();
    let trickle = tokio::spawn(async move {
        // 15 bytes over 3 s, then the rest: the whole body takes 3 s
        for byte in rest.iter().take(15) {
            if write.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = write.write_all(&rest[15..]).await;
    });
    let answer = read_head(&mut read, Duration::from_secs(10)).await;
    assert_eq!(status_of(&answer), 408, "{answer}");
    assert!(
        answer.contains("took longer than 1 s to arrive"),
        "{answer}"
    );
    trickle.abort();
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

/// SPEC 3.1: the memory held by bodies in flight is bounded for the whole process. With
/// `max_body_bytes_in_flight` = 2 × `max_body_bytes`, two clients each holding a 1 MiB
/// body leave no room for a third: it gets `503 overloaded_error` with `Retry-After: 1`
/// at once (before the fix it was read like the others); once one of them is done, the
/// next fits again; the gauge shows what is held and returns to 0.
#[tokio::test]
async fn bodies_in_flight_are_bounded_for_the_whole_process() {
    const LIMIT: usize = 1 << 20;
    let h = harness(&[
        ("max_body_bytes", &LIMIT.to_string()),
        ("max_body_bytes_in_flight", &(2 * LIMIT).to_string()),
        ("header_read_timeout_secs", "20"),
    ])
    .await;
    let key = h.key(KEY);
    let head =
        format!("POST /acme/team/v1/messages HTTP/1.1\r\nhost: keypool\r\nx-api-key: {key}\r\n");
    let (first, mut first_socket) =
        partial_body(&h, &head, LIMIT, LIMIT / 2, Duration::from_millis(300)).await;
    assert_eq!(first, "", "the first body is being read");
    let (second, _second_socket) =
        partial_body(&h, &head, LIMIT, LIMIT / 2, Duration::from_millis(300)).await;
    assert_eq!(second, "", "the second body is being read");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(&format!(
            "keypool_body_in_flight_bytes{{kind=\"request\"}} {}",
            2 * LIMIT
        )),
        "{metrics}"
    );
    let (third, _third_socket) = partial_body(&h, &head, LIMIT, 1024, Duration::from_secs(5)).await;
    assert_eq!(status_of(&third), 503, "{third}");
    assert_eq!(header_of(&third, "retry-after"), Some("1"), "{third}");
    assert!(third.contains("overloaded_error"), "{third}");
    assert!(
        h.metrics()
            .await
            .contains("keypool_body_budget_rejections_total 1")
    );

    // The first client completes its body (a valid request padded with spaces): served.
    let json = serde_json::to_vec(&message_body(MODEL, false)).unwrap();
    // the spaces first: JSON allows leading whitespace
    let mut body = vec![b' '; LIMIT - LIMIT / 2 - json.len()];
    body.extend_from_slice(&json);
    first_socket.write_all(&body).await.unwrap();
    let answer = read_head(&mut first_socket, Duration::from_secs(5)).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    drop(first_socket);
    // Now one more fits.
    let mut whole = vec![b' '; LIMIT - 200];
    whole.extend_from_slice(&serde_json::to_vec(&message_body(MODEL, false)).unwrap());
    let (status, text) = raw(&h, &post("/acme/team/v1/messages", &key, "", &whole)).await;
    assert_eq!(status, 200, "{text}");
    drop((_second_socket, _third_socket));
    // Everything given back once the requests are done (bounded wait: the server sees
    // the closed connections asynchronously).
    let released = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let m = h.metrics().await;
            if m.contains("keypool_body_in_flight_bytes{kind=\"request\"} 0") {
                return m;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the budget is given back");
    assert!(released.contains("keypool_body_in_flight_bytes{kind=\"answer\"} 0"));
    h.finish().await;
}

#[tokio::test]
async fn malformed_bodies_are_400_from_keypool_without_an_upstream_call() {
    let h = harness(&[]).await;
    let key = h.key(KEY);
    let deep = format!(
        "{{\"model\":\"{MODEL}\",\"x\":{}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not JSON", b"hello".to_vec()),
        ("truncated JSON", br#"{"model":"claude"#.to_vec()),
        ("empty body", Vec::new()),
        (
            "non-UTF-8",
            b"{\"model\":\"\xff\xfe\xfd\",\"max_tokens\":1}".to_vec(),
        ),
        (
            "invalid UTF-8 escape",
            br#"{"model":"\ud800","max_tokens":1}"#.to_vec(),
        ),
        (
            "missing model",
            br#"{"max_tokens":1,"messages":[]}"#.to_vec(),
        ),
        (
            "model not a string",
            br#"{"model":5,"messages":[]}"#.to_vec(),
        ),
        ("null model", br#"{"model":null}"#.to_vec()),
        ("array body", br#"[{"model":"claude"}]"#.to_vec()),
        ("NUL bytes", b"\0\0\0\0".to_vec()),
    ];
    for (case, body) in cases {
        let (status, text) = raw(&h, &post("/acme/team/v1/messages", &key, "", &body)).await;
        assert_eq!(status, 400, "{case}: {text}");
        assert!(text.contains("invalid_request_error"), "{case}: {text}");
        let (status, text) = raw(
            &h,
            &post("/acme/team/v1/messages/count_tokens", &key, "", &body),
        )
        .await;
        assert_eq!(status, 400, "count_tokens, {case}: {text}");
    }
    assert_eq!(h.sim().total_stats().requests, 0);
    // 100,000 levels of nesting are valid JSON with a model: keypool neither overflows
    // its stack nor refuses it (the upstream decides)
    let (status, text) = raw(
        &h,
        &post("/acme/team/v1/messages", &key, "", deep.as_bytes()),
    )
    .await;
    assert_eq!(status, 200, "deeply nested: {text}");
    assert_eq!(h.sim().total_stats().requests, 1);
    // keypool still serves
    assert_eq!(h.send_message().await.status, 200);
    h.finish().await;
}

#[tokio::test]
async fn huge_header_counts_and_sizes_are_4xx() {
    let h = harness(&[]).await;
    let key = h.key(KEY);
    let body = serde_json::to_vec(&message_body(MODEL, false)).unwrap();
    let many: String = (0..5_000).map(|i| format!("x-h-{i}: v\r\n")).collect();
    let big = format!("x-big: {}\r\n", "a".repeat(1 << 20));
    let long_key = format!("sk-lb-{}", "A".repeat(100_000));
    for (case, request) in [
        (
            "5,000 headers",
            post("/acme/team/v1/messages", &key, &many, &body),
        ),
        (
            "a 1 MiB header",
            post("/acme/team/v1/messages", &key, &big, &body),
        ),
        (
            "a 100 kB key",
            post("/acme/team/v1/messages", &long_key, "", &body),
        ),
        (
            "a non-ASCII key",
            post("/acme/team/v1/messages", "sk-lb-\u{e9}\u{e9}", "", &body),
        ),
        (
            "an empty bearer",
            post(
                "/acme/team/v1/messages",
                "",
                "authorization: Bearer \r\n",
                &body,
            ),
        ),
    ] {
        let (status, text) = raw(&h, &request).await;
        assert!(
            (400..500).contains(&status),
            "{case}: a 4xx, got {status}: {}",
            text.chars().take(300).collect::<String>()
        );
    }
    assert_eq!(h.sim().total_stats().requests, 0);
    assert_eq!(h.send_message().await.status, 200);
    h.finish().await;
}

#[tokio::test]
async fn odd_paths_are_4xx_and_never_reach_the_upstream() {
    let h = harness(&[]).await;
    let key = h.key(KEY);
    let body = serde_json::to_vec(&message_body(MODEL, false)).unwrap();
    let long = "a".repeat(10_000);
    let paths = [
        "/acme/../acme/team/v1/messages".to_owned(),
        "/acme/team/../team/v1/messages".to_owned(),
        "/acme/team/v1/../v1/messages".to_owned(),
        "/../../etc/passwd".to_owned(),
        "/acme%2Fteam/v1/messages".to_owned(),
        "/acme/team%2Fv1%2Fmessages".to_owned(),
        "/acme/team/v1%2Fmessages".to_owned(),
        "/%2e%2e/team/v1/messages".to_owned(),
        "/acme/%2e%2e/v1/messages".to_owned(),
        "//v1/messages".to_owned(),
        "/acme//v1/messages".to_owned(),
        "/acme/team//v1/messages".to_owned(),
        "/acme/team/v1/messages/".to_owned(),
        "/acme/team/v1/messages/extra".to_owned(),
        "/acme/team%00/v1/messages".to_owned(),
        "/acme/t%C3%A9am/v1/messages".to_owned(),
        "/acme/%ff%fe/v1/messages".to_owned(),
        format!("/{long}/team/v1/messages"),
        format!("/acme/{long}/v1/messages"),
        format!("/{long}/v1/messages"),
        format!("/acme/team/v1/messages?{long}=1"),
        "*".to_owned(),
        "/admin/../acme/team/v1/messages".to_owned(),
    ];
    for path in &paths {
        let (status, text) = raw(&h, &post(path, &key, "", &body)).await;
        let shown: String = path.chars().take(60).collect();
        if path.starts_with("/acme/team/v1/messages?") {
            // a long query string is still the messages route
            assert_eq!(status, 200, "{shown}: {text}");
            continue;
        }
        assert!(
            (400..500).contains(&status),
            "{shown}: a 4xx, got {status}: {}",
            text.chars().take(300).collect::<String>()
        );
    }
    // the same with GET and other methods
    for method in ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        let request = format!(
            "{method} /acme/team/v1/messages HTTP/1.1\r\nhost: keypool\r\nconnection: close\r\n\
             x-api-key: {key}\r\ncontent-length: 0\r\n\r\n"
        );
        let (status, text) = raw(&h, request.as_bytes()).await;
        assert_eq!(status, 405, "{method}: {text}");
        assert!(text.contains("invalid_request_error"), "{method}: {text}");
    }
    assert_eq!(
        h.sim().total_stats().requests,
        1,
        "only the long-query request"
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_connections_stay_bounded_and_requests_are_still_served() {
    let fd_limit: usize = std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or(1024);
    // both ends of every connection live in this process
    let idle = 2_000.min(fd_limit.saturating_sub(256) / 2);
    eprintln!("idle connections: {idle} (open-file soft limit {fd_limit})");
    assert!(
        idle >= 400,
        "the open-file limit {fd_limit} is too low for this test"
    );
    let h = harness(&[("header_read_timeout_secs", "5")]).await;
    // warm up, so that the baseline includes the pools
    assert_eq!(h.send_message().await.status, 200);
    let before = rss_kib();
    let started = Instant::now();
    let mut sockets = Vec::with_capacity(idle);
    for i in 0..idle {
        let mut s = TcpStream::connect(host(&h)).await.unwrap();
        if i % 2 == 0 {
            // half of them send part of a head, then nothing
            s.write_all(b"POST /acme/team/v1/messages HTTP/1.1\r\nhost: k")
                .await
                .unwrap();
        }
        sockets.push(s);
    }
    // every connection is accepted and held: requests are still served meanwhile
    for stream in [false, true, false, true] {
        let r = h.messages(&message_body(MODEL, stream)).send().await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let grown_kib = rss_kib().saturating_sub(before);
    eprintln!("RSS growth with {idle} idle connections: {grown_kib} KiB");
    // measured ~27 KiB per connection (both ends, debug build): a per-connection
    // buffer of the body limit, or a leak per connection, would blow this bound
    let per_connection = grown_kib * 1024 / idle as u64;
    assert!(
        per_connection < 64 * 1024,
        "{idle} idle connections cost {grown_kib} KiB ({per_connection} B each, both ends)"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the check ran inside the header timeout; make the timeout longer"
    );
    // the header timeout closes every idle connection
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        for s in &mut sockets {
            let mut buf = [0u8; 512];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "idle connections still open 10 s later");
    assert!(
        started.elapsed() >= Duration::from_millis(4_900),
        "closed before the header timeout"
    );
    assert_eq!(h.send_message().await.status, 200);
    h.finish().await;
}

#[tokio::test]
async fn ambiguous_framing_is_refused_and_pipelined_requests_are_answered_in_order() {
    let h = harness(&[("max_body_bytes", "4096")]).await;
    let key = h.key(KEY);
    let body = serde_json::to_string(&message_body(MODEL, false)).unwrap();
    // request smuggling shapes: two lengths, length + chunked, a bad chunk size
    for (case, request) in [
        (
            "two content-lengths",
            format!(
                "POST /acme/team/v1/messages HTTP/1.1\r\nhost: k\r\nconnection: close\r\n\
                 x-api-key: {key}\r\ncontent-length: {}\r\ncontent-length: 3\r\n\r\n{body}",
                body.len()
            ),
        ),
        (
            "bad chunk size",
            format!(
                "POST /acme/team/v1/messages HTTP/1.1\r\nhost: k\r\nconnection: close\r\n\
                 x-api-key: {key}\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{body}\r\n0\r\n\r\n"
            ),
        ),
        (
            "expect 100-continue over the limit",
            format!(
                "POST /acme/team/v1/messages HTTP/1.1\r\nhost: k\r\nconnection: close\r\n\
                 x-api-key: {key}\r\nexpect: 100-continue\r\ncontent-length: 100000000\r\n\r\n"
            ),
        ),
    ] {
        let (status, text) = raw(&h, request.as_bytes()).await;
        assert!(
            (400..500).contains(&status),
            "{case}: a 4xx, got {status}: {text}"
        );
        assert!(!text.contains("HTTP/1.1 200"), "{case}: {text}");
    }
    assert_eq!(h.sim().total_stats().requests, 0);
    // content-length and chunked (RFC 9112 6.3): refused, or read as chunked and the
    // connection closed after the answer, so that nothing smuggled behind it is served
    let smuggled = format!(
        "POST /acme/team/v1/messages HTTP/1.1\r\nhost: k\r\n\
         x-api-key: {key}\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n\
         {:x}\r\n{body}\r\n0\r\n\r\n\
         POST /acme/team/v1/messages HTTP/1.1\r\nhost: k\r\nconnection: close\r\n\
         x-api-key: {key}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len(),
        body.len()
    );
    let (status, text) = raw(&h, smuggled.as_bytes()).await;
    assert!(status == 200 || (400..500).contains(&status), "{text}");
    assert_eq!(
        text.matches("HTTP/1.1 ").count(),
        1,
        "the request behind a CL+TE request was served: {text}"
    );
    h.sim().clear_requests();
    let served_before = h.sim().total_stats().requests;
    // three pipelined requests in one write: three answers, in order
    let one = |model: &str, close: bool| {
        let b = serde_json::to_string(&message_body(model, false)).unwrap();
        format!(
            "POST /acme/team/v1/messages HTTP/1.1\r\nhost: k\r\n{}x-api-key: {key}\r\n\
             content-length: {}\r\n\r\n{b}",
            if close { "connection: close\r\n" } else { "" },
            b.len()
        )
    };
    let pipelined = format!(
        "{}{}{}",
        one(MODEL, false),
        one("", false),
        one(MODEL, true)
    );
    let (status, text) = raw(&h, pipelined.as_bytes()).await;
    assert_eq!(status, 200, "{text}");
    let statuses: Vec<u16> = text
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| status_of(&text[i..]))
        .collect();
    // an empty model is still a string: keypool forwards it (the upstream decides)
    assert_eq!(statuses, [200, 200, 200], "{text}");
    assert_eq!(h.sim().total_stats().requests, served_before + 3);
    h.finish().await;
}

/// A request `App::handle` can be given: the key in both `x-api-key` and
/// `authorization` when it is a valid header value; `None` when `path` is no URI.
fn generated_request(
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

/// Whatever arrives, keypool answers: an Anthropic-shaped JSON error (or a fixed route),
/// an `x-request-id`, never a panic, never an upstream call (no generated key is valid).
#[test]
fn any_request_gets_a_well_formed_answer() {
    let inputs = (
        prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"]),
        prop_oneof![
            "(/[a-z0-9_%.-]{0,8}){0,6}",
            Just("/acme/team/v1/messages".to_owned()),
            Just("/team/v1/messages/count_tokens".to_owned()),
        ],
        prop::collection::vec(any::<u8>(), 0..64),
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            Just(br#"{"model":"m","stream":true}"#.to_vec()),
            Just(br#"{"model":1}"#.to_vec()),
        ],
    );
    let builder = Harness::builder().account(AccountSpec::new("a", Script::ok()));
    check_property(
        builder,
        128,
        file!(),
        inputs,
        async |h, (method, path, key, body)| {
            let Some(request) = generated_request(method, &path, &key, body) else {
                return;
            };
            let r = h.handle(request).await;
            let status = r.status.as_u16();
            assert!(r.header("x-request-id").is_some(), "{status} {path}");
            if status >= 400 && path != "/readyz" {
                assert_eq!(r.header("content-type"), Some("application/json"));
                let json = r.json();
                assert_eq!(json["type"], "error");
                assert!(json["error"]["type"].is_string());
                assert!(json["request_id"].is_string());
            } else {
                assert!(
                    matches!(path.as_str(), "/healthz" | "/readyz" | "/metrics"),
                    "{status} {path}"
                );
            }
            assert!(
                [200, 401, 404, 405, 409, 410, 413].contains(&status),
                "{status} {path}"
            );
            assert_eq!(h.sim().total_stats().requests, 0, "{method} {path}");
        },
    );
}
