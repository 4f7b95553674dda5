//! keypool's own resources under attack, seen from the real binary (issue 14): the
//! memory a crowd of unauthenticated clients can make it hold, and running out of file
//! descriptors, which is keypool's failure, never the accounts'.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use keypool_sim::Script;
use keypool_tests::process::{KeypoolProcess, binary_config, config_file, free_port};
use keypool_tests::raw::{header_of, read_answer, read_head, status_of};
use keypool_tests::{AccountSpec, Harness, KEY, MODEL, message_body};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const ADMIN_TOKEN: &str = "resources-admin-token-5f4e3d2c1b";

/// Issue 14.1, automated: 50 connections without a valid key each declare a 30 MiB body
/// and try to send 4 MiB of it (200 MiB in all). Each gets its `401` within a second of
/// its head, with `connection: close`, and keypool's resident memory stays under
/// 100 MiB (before the fix every body was read before the key was checked: no answer
/// came until the body stalled, and RSS grew with every connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_unauthenticated_30_mib_bodies_get_401_at_once_and_memory_stays_bounded() {
    const CLIENTS: usize = 50;
    const RSS_BOUND_KIB: u64 = 100 * 1024;
    let h = Harness::builder()
        .account(AccountSpec::new("a", Script::ok()))
        .start()
        .await;
    let port = free_port();
    let text = binary_config(&h, port, &[]).replacen(
        "[server]\n",
        "[server]\nheader_read_timeout_secs = 30\n",
        1,
    );
    let (_dir, file) = config_file("unauth-bodies", &text);
    let k = KeypoolProcess::start(&file, port).await;
    let before = k.rss_kib();
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let addr = format!("127.0.0.1:{port}");
        clients.push(tokio::spawn(async move {
            let socket = TcpStream::connect(&addr).await.unwrap();
            let (mut read, mut write) = socket.into_split();
            let key = if i % 2 == 0 {
                String::new()
            } else {
                format!("x-api-key: sk-lb-{}\r\n", "w".repeat(40))
            };
            let head = format!(
                "POST /acme/team/v1/messages HTTP/1.1\r\nhost: keypool\r\n{key}\
                 content-type: application/json\r\ncontent-length: {}\r\n\r\n",
                30 << 20
            );
            write.write_all(head.as_bytes()).await.unwrap();
            let writer = tokio::spawn(async move {
                let chunk = vec![b' '; 64 << 10];
                for _ in 0..64 {
                    if write.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
                write
            });
            let answer = read_head(&mut read, Duration::from_secs(1)).await;
            (answer, writer)
        }));
    }
    let mut writers = Vec::new();
    for client in clients {
        let (answer, writer) = client.await.unwrap();
        assert_eq!(status_of(&answer), 401, "a 401 within a second: {answer:?}");
        assert_eq!(header_of(&answer, "connection"), Some("close"), "{answer}");
        writers.push(writer);
    }
    let rss = k.rss_kib();
    eprintln!("keypool RSS {before} KiB idle, {rss} KiB with {CLIENTS} unauthenticated bodies");
    assert!(rss > 0, "RSS readable");
    assert!(rss < RSS_BOUND_KIB, "RSS {rss} KiB with {CLIENTS} clients");
    for writer in writers {
        writer.abort();
    }
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

/// Issue 14.7: out of file descriptors (`EMFILE`), an attempt cannot open its upstream
/// connection. That is keypool's own failure: the answer is the generic `503`, nothing
/// is counted against the accounts (no `connect_error`, no backoff, nothing disabled) and
/// `keypool_local_failures_total{resource="resources"}` counts it (before the fix each
/// account was charged a `connect_error`, and the second request's failures put the
/// whole pool in backoff).
#[tokio::test]
async fn out_of_file_descriptors_is_keypools_failure_not_the_accounts() {
    let h = Harness::builder()
        .strategy("round_robin")
        .account(AccountSpec::new("a", Script::ok()))
        .account(AccountSpec::new("b", Script::ok()))
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
        .start()
        .await;
    let port = free_port();
    let text = binary_config(&h, port, &[]).replacen(
        "[server]\n",
        "[server]\nworkers = 1\nheader_read_timeout_secs = 30\n",
        1,
    );
    let (_dir, file) = config_file("emfile", &text);
    let k = KeypoolProcess::start(&file, port).await;
    let baseline = settled_fds(&k).await;
    k.set_file_limit(baseline + 6);
    // The requests' connection first (accepted, kept alive), then idle ones until
    // keypool can accept no more: every descriptor is taken, and an attempt's upstream
    // connection finds none.
    let mut socket = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut idle = Vec::new();
    let mut fds = settled_fds(&k).await;
    loop {
        idle.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
        let now = settled_fds(&k).await;
        if now == fds {
            break; // this one waits in the backlog: keypool is at its limit
        }
        fds = now;
        assert!(
            idle.len() < 20,
            "keypool kept accepting at {fds} descriptors"
        );
    }
    let body = serde_json::to_vec(&message_body(MODEL, false)).unwrap();
    for round in 0..2 {
        let request = format!(
            "POST /acme/team/v1/messages HTTP/1.1\r\nhost: keypool\r\nx-api-key: {}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            h.key(KEY),
            body.len()
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        socket.write_all(&body).await.unwrap();
        let answer = read_answer(&mut socket, Duration::from_secs(10)).await;
        assert_eq!(status_of(&answer), 503, "round {round}: {answer}");
        assert_eq!(
            header_of(&answer, "retry-after"),
            Some("1"),
            "round {round}"
        );
        assert!(
            answer.contains("overloaded_error"),
            "round {round}: {answer}"
        );
    }
    drop((idle, socket));
    let metrics = h
        .client()
        .request(http::Method::GET, k.url("/metrics"))
        .send()
        .await
        .text();
    assert!(
        metrics.contains("keypool_local_failures_total{resource=\"resources\"} 2"),
        "{metrics}"
    );
    assert!(!metrics.contains("connect_error"), "{metrics}");
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("keypool_account_cooldown_seconds"))
    {
        assert!(line.ends_with(" 0"), "no account cools: {line}");
    }
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("keypool_account_disabled"))
    {
        assert!(line.ends_with(" 0"), "no account disabled: {line}");
    }
    assert_eq!(
        h.sim().total_stats().requests,
        0,
        "no attempt reached the upstream"
    );
    assert!(k.logs().contains("keypool's own resources ran out"));
    k.assert_logs_clean(&h, &["a", "b"], &[ADMIN_TOKEN]);
    h.finish().await;
}

/// The process's open descriptors once two readings 100 ms apart agree (at most 10 s).
async fn settled_fds(k: &KeypoolProcess) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut last = k.open_fds();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = k.open_fds();
        if now == last {
            return now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "open fds keep changing: {now}"
        );
        last = now;
    }
}
