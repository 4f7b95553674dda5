//! The server around the request path, end to end: many requests at once, graceful
//! drain, and a client going away while a hedge is in flight.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use keypool_sim::{Delay, OkSpec, Script};
use keypool_tests::{AccountSpec, Harness, MODEL, message_body};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_streams_all_complete() {
    let spec = OkSpec::default().chunks(8).chunk_interval(Delay::ms(5));
    let h = Harness::builder()
        .strategy("round_robin")
        .server("snapshot_ttl_secs", "15")
        .account(AccountSpec::new("a", Script::new(spec.clone())))
        .account(AccountSpec::new("b", Script::new(spec.clone())))
        .account(AccountSpec::new("c", Script::new(spec)))
        .start()
        .await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..60 {
        let request = h.messages(&message_body(MODEL, i % 2 == 0));
        tasks.spawn(async move { (i % 2 == 0, request.send().await) });
    }
    while let Some(done) = tasks.join_next().await {
        let (stream, r) = done.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        if stream {
            assert_eq!(r.events().last().map(String::as_str), Some("message_stop"));
        } else {
            assert_eq!(r.json()["type"], "message");
        }
    }
    assert_eq!(h.sim().total_stats().requests, 60);
    assert_eq!(h.sim().total_stats().finished, 60);
    assert_eq!(h.requests_per_account(&["a", "b", "c"]), [20, 20, 20]);
    h.finish().await;
}

/// `keypool serve`'s model: several threads, each its own runtime and upstream pool,
/// accepting from one socket. Every request is served, the shared state (round robin
/// counter, per-account counts, metrics) sees all of them, and shutdown drains every
/// thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_share_the_pool_state_and_drain_together() {
    let spec = OkSpec::default().chunks(4).chunk_interval(Delay::ms(5));
    let mut h = Harness::builder()
        .workers(3)
        .strategy("round_robin")
        .server("snapshot_ttl_secs", "15")
        .server("shutdown_grace_secs", "5")
        .account(AccountSpec::new("a", Script::new(spec.clone())))
        .account(AccountSpec::new("b", Script::new(spec)))
        .start()
        .await;
    let mut tasks = tokio::task::JoinSet::new();
    // Separate connections, placed by the threads' balance (by count until the threads'
    // loads are first measured, then packed onto the first thread that is not busy).
    for i in 0..40 {
        let request = h.messages(&message_body(MODEL, i % 2 == 0));
        tasks.spawn(async move { request.send().await });
    }
    while let Some(done) = tasks.join_next().await {
        let r = done.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(h.requests_per_account(&["a", "b"]), [20, 20]);
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"keypool_requests_total{org="acme",url="team",status="200"} 40"#),
        "{metrics}"
    );
    // the threads' balance is on /metrics: every thread's open connections, and the moves
    for worker in 0..3 {
        assert!(
            metrics.contains(&format!(
                "keypool_worker_connections{{worker=\"{worker}\"}} "
            )),
            "{metrics}"
        );
    }
    assert!(!metrics.contains(r#"keypool_worker_connections{worker="3"}"#));
    assert!(
        metrics.contains("keypool_connections_moved_total "),
        "{metrics}"
    );
    // A stream in flight on one of the threads finishes; then every thread is gone.
    let mut stream = h
        .messages(&message_body(MODEL, true))
        .send_streaming()
        .await;
    assert_eq!(stream.status, 200);
    h.begin_shutdown();
    let mut last = None;
    while let Some(frame) = stream.next_frame().await {
        last = frame.event;
    }
    assert_eq!(last.as_deref(), Some("message_stop"));
    h.wait_proxy_stopped().await;
    assert!(
        tokio::net::TcpStream::connect(h.base_url().trim_start_matches("http://"))
            .await
            .is_err(),
        "a worker thread still accepts connections after shutdown"
    );
    h.finish().await;
}

#[tokio::test]
async fn shutdown_lets_a_stream_in_flight_finish_and_refuses_new_connections() {
    const CHUNKS: u32 = 20;
    let spec = OkSpec::default()
        .chunks(CHUNKS)
        .chunk_interval(Delay::ms(100));
    let mut h = Harness::builder()
        .server("shutdown_grace_secs", "5")
        .account(AccountSpec::new("a", Script::new(spec)))
        .start()
        .await;
    let mut stream = h
        .messages(&message_body(MODEL, true))
        .send_streaming()
        .await;
    assert_eq!(stream.status, 200);
    let first = stream.next_frame().await.unwrap();
    assert_eq!(first.event.as_deref(), Some("message_start"));
    h.begin_shutdown();
    // draining: no new connection is accepted while the stream is still in flight
    let addr = h.base_url().trim_start_matches("http://").to_owned();
    tokio::time::timeout(Duration::from_secs(5), async {
        while tokio::net::TcpStream::connect(&addr).await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("keypool stops accepting within 5 s of the shutdown signal");
    assert_eq!(
        h.sim().stats("a").unwrap().in_flight,
        1,
        "refused while the stream was still in flight"
    );
    let mut events = vec![first.event.unwrap()];
    while let Some(frame) = stream.next_frame().await {
        events.push(frame.event.unwrap_or_default());
    }
    assert_eq!(
        events.last().map(String::as_str),
        Some("message_stop"),
        "{events:?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| *e == "content_block_delta")
            .count(),
        CHUNKS as usize,
        "{events:?}"
    );
    assert!(!events.iter().any(|e| e == "error"), "{events:?}");
    // once drained, keypool is gone
    h.wait_proxy_stopped().await;
    assert!(
        tokio::net::TcpStream::connect(&addr).await.is_err(),
        "keypool still accepts connections after shutdown"
    );
    assert_eq!(h.sim().stats("a").unwrap().finished, 1);
    h.finish().await;
}

#[tokio::test]
async fn client_going_away_during_a_hedge_cancels_both_attempts() {
    let slow = Script::new(OkSpec::default().ttft(Delay::ms(30_000)));
    let h = Harness::builder()
        .strategy("hedge")
        .server("first_frame_timeout_ms", "60000")
        .server("upstream_timeout_secs", "60")
        .account(
            AccountSpec::new("p", Script::ok())
                .url_label("p")
                .priority(0),
        )
        .account(
            AccountSpec::new("b", slow.clone())
                .url_label("b")
                .priority(1),
        )
        .start()
        .await;
    assert_eq!(h.send_stream().await.status, 200, "warm-up");
    h.sim().set_script("p", slow).unwrap();
    let request = h.messages(&message_body(MODEL, true)).send_streaming();
    let waiting = tokio::spawn(request);
    h.wait_until(
        "primary and backup in flight",
        Duration::from_secs(5),
        |s| s.stats("p").unwrap().in_flight == 1 && s.stats("b").unwrap().in_flight == 1,
    )
    .await;
    waiting.abort();
    h.wait_until("both attempts cancelled", Duration::from_secs(5), |s| {
        s.stats("p").unwrap().cancelled == 1 && s.stats("b").unwrap().cancelled == 1
    })
    .await;
    h.finish().await;
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = Harness::builder()
        .server("header_read_timeout_secs", "1")
        .account(AccountSpec::new("a", Script::ok()))
        .start()
        .await;
    // nothing at all, and a head that never ends
    for sent in [
        &b""[..],
        b"POST /acme/team/v1/messages HTTP/1.1\r\nhost: keypool\r\n",
    ] {
        let shown = String::from_utf8_lossy(sent);
        let mut socket = tokio::net::TcpStream::connect(h.base_url().trim_start_matches("http://"))
            .await
            .unwrap();
        socket.write_all(sent).await.unwrap();
        let started = std::time::Instant::now();
        let mut answer = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut answer)).await;
        assert!(
            read.is_ok(),
            "{shown:?}: the connection is still open after 5 s"
        );
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(900),
            "{shown:?}: cut after {took:?}"
        );
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "{shown:?}: unexpected answer: {answer}"
        );
    }
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

/// keypool's own HTTP/1.1 server (issue 22) keeps what hyper's did for a client that
/// asks to continue, one that speaks HTTP/1.0, and an idle connection at the drain.
#[tokio::test]
async fn expect_continue_http_10_and_idle_connections_at_the_drain() {
    use keypool_tests::raw::{read_head, status_of};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut h = Harness::builder()
        .account(AccountSpec::new("a", Script::ok()))
        .start()
        .await;
    let addr = h.base_url().trim_start_matches("http://").to_owned();
    let key = h.key(keypool_tests::KEY);
    let body = serde_json::to_vec(&message_body(MODEL, false)).unwrap();
    let head = |key: &str| {
        format!(
            "POST /acme/team/v1/messages HTTP/1.1\r\nhost: keypool\r\nx-api-key: {key}\r\n\
             content-type: application/json\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
    };
    // `100 Continue` once the request path reads the body, then the answer
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    socket.write_all(head(&key).as_bytes()).await.unwrap();
    let interim = read_head(&mut socket, Duration::from_secs(5)).await;
    assert_eq!(interim, "HTTP/1.1 100 Continue\r\n\r\n");
    socket.write_all(&body).await.unwrap();
    let answer = read_head(&mut socket, Duration::from_secs(5)).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    // a wrong key: answered at once, never invited to send its body
    let mut refused = tokio::net::TcpStream::connect(&addr).await.unwrap();
    refused
        .write_all(head("sk-lb-wrong").as_bytes())
        .await
        .unwrap();
    let answer = read_head(&mut refused, Duration::from_secs(5)).await;
    assert_eq!(status_of(&answer), 401, "{answer}");
    assert_eq!(h.sim().total_stats().requests, 1);

    // HTTP/1.0: answered in kind, closed unless it asks to keep the connection
    let mut old = tokio::net::TcpStream::connect(&addr).await.unwrap();
    old.write_all(b"GET /healthz HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut all = String::new();
    tokio::time::timeout(Duration::from_secs(5), old.read_to_string(&mut all))
        .await
        .expect("an HTTP/1.0 connection without keep-alive closes after its answer")
        .unwrap();
    assert!(all.starts_with("HTTP/1.0 200 OK\r\n"), "{all}");
    assert!(all.ends_with("\r\n\r\nok\n"), "{all}");
    let mut kept = tokio::net::TcpStream::connect(&addr).await.unwrap();
    for _ in 0..2 {
        kept.write_all(b"GET /healthz HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
            .await
            .unwrap();
        let mut answer = read_head(&mut kept, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
        assert!(answer.contains("connection: keep-alive\r\n"), "{answer}");
        // the body, `ok\n`, with the head or after it
        while !answer.ends_with("\r\n\r\nok\n") {
            let mut more = [0u8; 16];
            let n = kept.read(&mut more).await.unwrap();
            assert!(n > 0, "closed before the body: {answer}");
            answer.push_str(std::str::from_utf8(&more[..n]).unwrap());
        }
    }

    // an idle keep-alive connection is closed by the drain, which then ends at once
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: keypool\r\n\r\n")
        .await
        .unwrap();
    let answer = read_head(&mut idle, Duration::from_secs(5)).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let started = std::time::Instant::now();
    h.begin_shutdown();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut rest))
        .await
        .expect("the drain closes an idle connection")
        .unwrap();
    h.wait_proxy_stopped().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the drain waited for idle connections: {:?}",
        started.elapsed()
    );
    drop((socket, refused, kept));
    h.finish().await;
}
