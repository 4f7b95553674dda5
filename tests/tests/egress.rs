//! Issue 21, outbound proxies: an account's `proxy_url` (HTTP `CONNECT`, SOCKS5 with
//! `socks5h` and `socks5`, with credentials) and the process's `HTTP_PROXY` /
//! `NO_PROXY`, against the test proxy of `keypool_tests::egress_proxy` on loopback.
//! Upstreams are named `*.keypool.test`, which only the test proxy resolves: an answer
//! proves the call went through it.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use keypool_sim::Script;
use keypool_store::testing::TempDir;
use keypool_tests::egress_proxy::{EgressProxy, ProxyKind, Tunnel};
use keypool_tests::process::{KeypoolProcess, free_port};
use keypool_tests::{AccountSpec, Harness, KEY, MODEL, message_body};

fn tunnel(target: String, authorized: bool) -> Tunnel {
    Tunnel { target, authorized }
}

fn sim_port(h: &Harness) -> u16 {
    h.sim().addr().port()
}

#[tokio::test]
async fn account_proxy_urls_carry_the_calls_through_http_connect_and_socks5() {
    let connect = EgressProxy::start(ProxyKind::Connect, Some(("kp", "connect-pw"))).await;
    let socks_h = EgressProxy::start(ProxyKind::Socks5, Some(("kp", "socks-pw"))).await;
    let socks = EgressProxy::start(ProxyKind::Socks5, None).await;
    let line = |url: String| format!("proxy_url = {url:?}");
    let h = Harness::builder()
        .strategy("round_robin")
        .account(
            AccountSpec::new("via-connect", Script::ok())
                .base_url("http://connect.keypool.test:{sim_port}")
                .toml(&line(connect.url(false))),
        )
        .account(
            AccountSpec::new("via-socks5h", Script::ok())
                .base_url("http://socks.keypool.test:{sim_port}")
                .toml(&line(socks_h.url(false))),
        )
        // socks5 (not h): keypool resolves the name itself, so the proxy sees an address
        .account(
            AccountSpec::new("via-socks5", Script::ok())
                .base_url("http://127.0.0.1:{sim_port}")
                .toml(&line(socks.url(true))),
        )
        .start()
        .await;
    for _ in 0..3 {
        let r = h.send_message().await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = h.send_stream().await;
    assert_eq!(r.status, 200);
    assert_eq!(r.events().last().map(String::as_str), Some("message_stop"));
    assert_eq!(
        h.requests_per_account(&["via-connect", "via-socks5h", "via-socks5"]),
        vec![2, 1, 1]
    );
    let port = sim_port(&h);
    // one tunnel per pooled connection: the first request of each account opened it
    assert_eq!(
        connect.tunnels()[0],
        tunnel(format!("connect.keypool.test:{port}"), true)
    );
    assert_eq!(
        socks_h.tunnels(),
        vec![tunnel(format!("socks.keypool.test:{port}"), true)]
    );
    assert_eq!(
        socks.tunnels(),
        vec![tunnel(format!("127.0.0.1:{port}"), true)]
    );
    h.finish().await;
}

#[tokio::test]
async fn a_proxy_that_refuses_the_credentials_fails_the_attempt_over_to_the_next_account() {
    let proxy = EgressProxy::start(ProxyKind::Connect, Some(("kp", "right"))).await;
    let wrong = proxy.url(false).replace("kp:right@", "kp:wrong@");
    let socks = EgressProxy::start(ProxyKind::Socks5, Some(("kp", "right"))).await;
    let wrong_socks = socks.url(false).replace("kp:right@", "kp:wrong@");
    let h = Harness::builder()
        .account(
            AccountSpec::new("refused", Script::ok())
                .priority(0)
                .base_url("http://refused.keypool.test:{sim_port}")
                .toml(&format!("proxy_url = {wrong:?}")),
        )
        .account(
            AccountSpec::new("refused-socks", Script::ok())
                .priority(1)
                .base_url("http://refused.keypool.test:{sim_port}")
                .toml(&format!("proxy_url = {wrong_socks:?}")),
        )
        .account(AccountSpec::new("direct", Script::ok()).priority(2))
        .start()
        .await;
    let r = h.send_message().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        h.requests_per_account(&["refused", "refused-socks", "direct"]),
        vec![0, 0, 1]
    );
    let port = sim_port(&h);
    assert_eq!(
        proxy.tunnels(),
        vec![tunnel(format!("refused.keypool.test:{port}"), false)]
    );
    assert_eq!(socks.tunnels(), vec![tunnel(String::new(), false)]);
    let metrics = h.metrics().await;
    for account in ["refused", "refused-socks"] {
        assert!(
            metrics.contains(&format!(
                "keypool_account_upstream_failures_total{{account=\"{account}\",class=\"transient\"}} 1"
            )),
            "{metrics}"
        );
    }
    h.finish().await;
}

/// The process environment reaches the binary only: `HTTP_PROXY` routes an upstream
/// named `*.keypool.test` through the proxy; `NO_PROXY` sends another one direct
/// (where its name does not resolve: a connect error, failed over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_proxy_and_no_proxy_from_the_environment_route_the_binary_upstream_calls() {
    let proxy = EgressProxy::start(ProxyKind::Connect, None).await;
    let h = Harness::builder()
        .account(
            AccountSpec::new("bypass", Script::ok())
                .priority(0)
                .base_url("http://bypass.keypool.test:{sim_port}"),
        )
        .account(
            AccountSpec::new("proxied", Script::ok())
                .priority(1)
                .base_url("http://sim.keypool.test:{sim_port}"),
        )
        .start()
        .await;
    let dir = TempDir::new("egress-env").unwrap();
    let port = free_port();
    let text = h.toml().replacen(
        "[server]\n",
        &format!("[server]\nlisten = \"127.0.0.1:{port}\"\n"),
        1,
    );
    let config = dir.path().join("keypool.toml");
    std::fs::write(&config, text).unwrap();
    let proxy_url = proxy.url(false);
    let k = KeypoolProcess::start_with(
        &config,
        port,
        &[],
        &[
            ("HTTP_PROXY", &proxy_url),
            ("HTTPS_PROXY", &proxy_url),
            ("NO_PROXY", "bypass.keypool.test"),
        ],
    )
    .await;
    let r = h
        .client()
        .post(format!("http://127.0.0.1:{port}/acme/team/v1/messages"))
        .api_key(&h.key(KEY))
        .json(&message_body(MODEL, false))
        .send()
        .await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), k.logs());
    assert_eq!(h.requests_per_account(&["bypass", "proxied"]), vec![0, 1]);
    assert_eq!(
        proxy.tunnels(),
        vec![tunnel(format!("sim.keypool.test:{}", sim_port(&h)), true)]
    );
    // the request line (written within 50 ms) names the direct attempt's failure
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !k.logs().contains("keypool::request") {
        assert!(
            std::time::Instant::now() < deadline,
            "no request line: {}",
            k.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let logs = k.logs();
    assert!(
        logs.contains(r#"{"account":"bypass","outcome":"connect_error","status":null,"class":"transient","ms":"#),
        "{logs}"
    );
    drop(k);
    h.finish().await;
}
