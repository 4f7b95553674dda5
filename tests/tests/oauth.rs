//! SPEC 14 end to end against the simulator's token endpoint: a subscription account
//! whose access tokens live 3 s serves for many lifetimes without one failed request;
//! an expired-token `401` is refreshed and retried on the same account; a revoked
//! refresh token makes the account `expired` (disabled with that reason) and the request
//! fails over; a token endpoint answering 500 backs off without disabling anything.
//!
//! Real time: the simulator's tokens expire by its clock and keypool's by the wall
//! clock; every wait is bounded.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use keypool_sim::{IssuedTokens, Script};
use keypool_tests::{AccountSpec, Harness, secret_of};

const ADMIN: &str = "oauth-admin-token-0123456789";

/// `max` (oauth, first) and `b` (api key, second) in a priority pool, with a config file.
async fn pool() -> Harness {
    builder(None, None).start().await
}

/// [`pool`]'s builder; `redis`: its URL; `upstream`: another harness's simulator, for a
/// second replica of the same accounts.
fn builder(redis: Option<&str>, upstream: Option<&str>) -> keypool_tests::HarnessBuilder {
    let spec = |id: &str| {
        let spec = AccountSpec::new(id, Script::ok());
        match upstream {
            Some(url) => spec.base_url(url),
            None => spec,
        }
    };
    let mut b = Harness::builder()
        .account(spec("max").provider("anthropic", "oauth").priority(0))
        .account(spec("b").priority(1))
        .strategy("priority")
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN}\""))
        .config_file();
    if let Some(url) = redis {
        b = b.server("redis_url", &format!("{url:?}"));
    }
    b
}

/// Makes `max` renew itself with `tokens` (its access token in force, its expiry in
/// `expires_in` seconds from now as keypool believes), `[oauth]` on the simulator, and
/// reloads.
fn renew_with(h: &Harness, tokens: &IssuedTokens, expires_in: u64, lead_secs: u64) {
    renew_on(h, &h.sim().base_url(), tokens, expires_in, lead_secs);
}

/// [`renew_with`] with the token endpoint of the simulator at `sim`.
fn renew_on(h: &Harness, sim: &str, tokens: &IssuedTokens, expires_in: u64, lead_secs: u64) {
    let path = h.config_path().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        with_refresh(&text, sim, tokens, expires_in, lead_secs),
    )
    .unwrap();
    h.store().reload(&path).unwrap();
}

/// `text` with `max` renewing itself with `tokens` at the simulator at `sim`.
fn with_refresh(
    text: &str,
    sim: &str,
    tokens: &IssuedTokens,
    expires_in: u64,
    lead_secs: u64,
) -> String {
    let expires_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + expires_in;
    text.replacen(
        &format!("secret = \"{}\"", secret_of("max")),
        &format!(
            "secret = \"{}\"\nrefresh_token = \"{}\"\nexpires_at = {expires_at}",
            tokens.access_token, tokens.refresh_token
        ),
        1,
    ) + &format!(
        "\n[oauth]\ntoken_url = \"{sim}/v1/oauth/token\"\nrefresh_lead_secs = {lead_secs}\n"
    )
}

/// The accounts of the Messages requests the simulator saw (not the token grants).
fn served_by(h: &Harness) -> Vec<String> {
    h.sim()
        .requests()
        .iter()
        .filter(|r| r.path_and_query.contains("/v1/messages"))
        .map(|r| {
            r.account
                .as_ref()
                .map_or("<unknown>", |a| a.as_str())
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn an_account_serves_for_many_token_lifetimes_without_a_failed_request() {
    let h = pool().await;
    h.sim().set_token_lifetime(Duration::from_secs(3));
    let first = h.sim().issue_tokens("max").unwrap();
    renew_with(&h, &first, 3, 2);
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < Duration::from_secs(10) {
        let r = h.send_message().await;
        assert_eq!(r.status, 200, "request {sent}: {}", r.text());
        sent += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = h.sim().oauth_stats("max").unwrap();
    assert!(stats.refreshed >= 3, "{stats:?} in 10 s of 3 s tokens");
    assert_eq!(
        (stats.reused, stats.refused),
        (0, 0),
        "no refresh token used twice"
    );
    assert!(
        served_by(&h).iter().all(|a| a == "max"),
        "every request on max, none failed over"
    );
    let metrics = h.metrics().await;
    // The simulator may count a grant whose answer keypool is still reading.
    let counted: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("keypool_oauth_refreshes_total{account=\"max\",outcome=\"refreshed\"} ")
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(
        counted == stats.refreshed || counted + 1 == stats.refreshed,
        "{counted} refreshes counted, {} granted",
        stats.refreshed
    );
    assert!(!metrics.contains("outcome=\"failed\"") && !metrics.contains("outcome=\"expired\""));
    assert!(metrics.contains("keypool_oauth_token_expiry_timestamp_seconds{account=\"max\"}"));
    // The tokens sent upstream are the rotated ones, never the first after it expired.
    let last = h.sim().requests_for("max").pop().unwrap();
    // Compared whole: the simulator numbers its tokens, so the first (`…-max-1`) is a
    // prefix of the tenth (`…-max-10`).
    let auth = last.headers["authorization"].to_str().unwrap().to_owned();
    assert_ne!(auth, format!("Bearer {}", first.access_token));
    assert!(auth.starts_with("Bearer sk-ant-oat01-sim-max-"), "{auth}");
}

#[tokio::test]
async fn an_expired_token_401_is_refreshed_and_the_same_account_tried_again() {
    let h = pool().await;
    // Issued already expired, while keypool believes it lives an hour (no refresh ahead).
    h.sim().set_token_lifetime(Duration::ZERO);
    let tokens = h.sim().issue_tokens("max").unwrap();
    h.sim().set_token_lifetime(Duration::from_secs(3600));
    renew_with(&h, &tokens, 3600, 0);
    let r = h.send_message().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        served_by(&h),
        ["max", "max"],
        "the 401, then the retry on the same account"
    );
    assert_eq!(h.sim().oauth_stats("max").unwrap().refreshed, 1);
    let view = h.store().config();
    assert!(
        !h.store()
            .health()
            .disabled
            .is_disabled(view.account("max").unwrap().id())
    );
    // The next request uses the new token at once.
    assert_eq!(h.send_message().await.status, 200);
    assert_eq!(served_by(&h).len(), 3);
    // The admin API and the status page show when the token in force expires.
    let view = h
        .client()
        .request(http::Method::GET, h.url("/admin/accounts/max"))
        .bearer(ADMIN)
        .send()
        .await
        .json();
    let expires_at = view["oauth"]["expires_at"].as_u64().unwrap();
    assert!(expires_at > keypool_store::now_ms() + 3_500_000, "{view}");
    assert_eq!(view["oauth"]["failures"], 0);
    assert_eq!(view["oauth"]["expired"], false);
    let browser = keypool_tests::browser::WebDriver::start().await;
    browser
        .goto(&format!("{}#token={ADMIN}", h.url("/admin/ui")))
        .await;
    browser
        .wait_text("[data-oauth=\"max\"]", "the token's expiry", |t| {
            t.contains("renews, expires in 59m") || t.contains("renews, expires in 1h")
        })
        .await;
}

#[tokio::test]
async fn a_revoked_refresh_token_makes_the_account_expired_and_the_request_fails_over() {
    let h = pool().await;
    let receiver = keypool_tests::webhook::Receiver::start().await;
    let path = h.config_path().unwrap();
    let with_webhook = std::fs::read_to_string(&path).unwrap()
        + &format!(
            "\n[alerts]\n\n[[alerts.webhooks]]\nurl = \"{}\"\nevents = [\"account_expired\", \"oauth_refresh_failed\"]\n",
            receiver.url("/hook")
        );
    std::fs::write(&path, with_webhook).unwrap();
    h.sim().set_token_lifetime(Duration::ZERO);
    let tokens = h.sim().issue_tokens("max").unwrap();
    h.sim().revoke_refresh_tokens("max").unwrap();
    renew_with(&h, &tokens, 3600, 0);
    let r = h.send_message().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&h), ["max", "b"]);
    let id = keypool_core::AccountId::from("max");
    let disabled = h
        .store()
        .health()
        .disabled
        .get(&id)
        .expect("max is disabled");
    assert!(
        disabled.reason.starts_with("expired"),
        "{}",
        disabled.reason
    );
    let state = h.store().oauth_tokens().state(&id).unwrap();
    assert!(state.expired);
    assert!(
        h.metrics()
            .await
            .contains("keypool_oauth_refreshes_total{account=\"max\",outcome=\"expired\"} 1")
    );
    // Expired: no more grants are spent on it.
    assert_eq!(h.send_message().await.status, 200);
    assert_eq!(h.sim().oauth_stats("max").unwrap().refused, 1);
    // SPEC 15: a person is told, once.
    let bodies = receiver
        .wait_for(Duration::from_secs(5), |b| !b.is_empty())
        .await;
    assert_eq!(bodies.len(), 1, "{bodies:#?}");
    assert_eq!(bodies[0]["event"], "account_expired");
    assert_eq!(bodies[0]["subject"]["account"], "max");
    assert!(
        bodies[0]["reason"]
            .as_str()
            .unwrap()
            .contains("invalid_grant"),
        "{bodies:#?}"
    );
    assert!(
        !bodies[0].to_string().contains("sk-ant-o"),
        "no token in an alert"
    );
}

#[tokio::test]
async fn a_failing_token_endpoint_backs_off_without_disabling_the_account() {
    let h = pool().await;
    h.sim().set_token_lifetime(Duration::ZERO);
    let tokens = h.sim().issue_tokens("max").unwrap();
    h.sim().fail_token_endpoint(Some(500));
    renew_with(&h, &tokens, 3600, 0);
    let r = h.send_message().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&h), ["max", "b"], "this request fails over");
    let id = keypool_core::AccountId::from("max");
    assert!(!h.store().health().disabled.is_disabled(&id));
    let state = h.store().oauth_tokens().state(&id).unwrap();
    assert_eq!(state.failures, 1);
    assert!(!state.expired);
    assert!(
        state.retry_at_ms >= keypool_store::now_ms() + 25_000,
        "backs off 30 s"
    );
    assert!(
        h.metrics()
            .await
            .contains("keypool_oauth_refreshes_total{account=\"max\",outcome=\"failed\"} 1")
    );
}

/// SPEC 14 across replicas: two replicas on one real `redis-server` share an OAuth
/// account whose tokens live 3 s. Every refresh token is used exactly once (the
/// simulator refuses and counts a second use), and no client request fails.
#[tokio::test]
async fn two_replicas_on_one_redis_refresh_each_token_once() {
    let Some(redis) = keypool_store::testing::RedisServer::start_or_skip("oauth_replicas") else {
        return;
    };
    let a = builder(Some(&redis.url()), None).start().await;
    let sim = a.sim().base_url();
    let b = builder(Some(&redis.url()), Some(&sim)).start().await;
    a.sim().set_token_lifetime(Duration::from_secs(3));
    let first = a.sim().issue_tokens("max").unwrap();
    renew_on(&a, &sim, &first, 3, 2);
    renew_on(&b, &sim, &first, 3, 2);
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < Duration::from_secs(10) {
        for h in [&a, &b] {
            let r = h.send_message().await;
            assert_eq!(r.status, 200, "request {sent}: {}", r.text());
            sent += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = a.sim().oauth_stats("max").unwrap();
    assert_eq!(
        (stats.reused, stats.refused),
        (0, 0),
        "{stats:?}: a refresh token was used twice"
    );
    assert!(stats.refreshed >= 3, "{stats:?}");
    assert!(
        served_by(&a).iter().all(|id| id == "max"),
        "no request failed over"
    );
    // Both replicas took part: each refreshed or adopted the other's tokens.
    let on = |h: &Harness| {
        h.store()
            .oauth_tokens()
            .current(&keypool_core::AccountId::from("max"))
            .unwrap()
            .refresh
            .expose()
            .to_owned()
    };
    assert_ne!(on(&a), first.refresh_token);
    assert_ne!(on(&b), first.refresh_token);
}

/// SPEC 14: the real binary restarted in the middle keeps the tokens it rotated (the
/// state file): after the restart it goes on with them, and no refresh token is ever
/// presented twice.
#[tokio::test]
async fn a_restart_keeps_the_rotated_tokens() {
    use keypool_tests::process::{KeypoolProcess, binary_config, free_port};
    let h = pool().await;
    h.sim().set_token_lifetime(Duration::from_secs(3));
    let first = h.sim().issue_tokens("max").unwrap();
    let dir = keypool_store::testing::TempDir::new("oauth-restart").unwrap();
    let port = free_port();
    let state = dir.path().join("state.json");
    let state_file = format!("{:?}", state.display().to_string());
    let text = binary_config(&h, port, &[("state_file", &state_file)]);
    let file = dir.path().join("keypool.toml");
    std::fs::write(
        &file,
        with_refresh(&text, &h.sim().base_url(), &first, 3, 2),
    )
    .unwrap();
    let mut k = KeypoolProcess::start(&file, port).await;
    serve_for_4_seconds(&h, &k).await;
    let before = h.sim().oauth_stats("max").unwrap();
    assert!(before.refreshed >= 1, "{before:?}");
    k.signal("TERM");
    assert_eq!(k.wait_exit(Duration::from_secs(10)).await, Some(0));
    let saved = std::fs::read_to_string(&state).unwrap();
    assert!(
        saved.contains("\"oauth\""),
        "the rotated tokens are in the state file"
    );
    let mut k = KeypoolProcess::start(&file, port).await;
    serve_for_4_seconds(&h, &k).await;
    let after = h.sim().oauth_stats("max").unwrap();
    assert_eq!(
        (after.reused, after.refused),
        (0, 0),
        "{after:?}: the config's old refresh token was spent again"
    );
    assert!(
        after.refreshed > before.refreshed,
        "it went on refreshing after the restart"
    );
    assert!(served_by(&h).iter().all(|id| id == "max"));
    k.signal("TERM");
    let _ = k.wait_exit(Duration::from_secs(10)).await;
}

/// Requests through the binary for 4 s, every one answered 200.
async fn serve_for_4_seconds(h: &Harness, k: &keypool_tests::process::KeypoolProcess) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        let r = k.send_message(h, false).await;
        assert_eq!(r.status, 200, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `code_challenge` and `state` of an authorize URL.
fn challenge_and_state(url: &str) -> (String, String) {
    let query = url.split_once('?').unwrap().1;
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(&format!("{name}=")))
            .unwrap()
            .to_owned()
    };
    assert_eq!(param("code_challenge_method"), "S256");
    (param("code_challenge"), param("state"))
}

/// SPEC 14's login: `keypool oauth login` (the real CLI, the code typed on stdin) and
/// `POST /admin/oauth/start` + `/finish` against the simulator's authorization-code
/// grant; the tokens land in the config file sealed, and serve the next requests.
#[tokio::test]
async fn a_login_from_the_cli_and_from_the_admin_api_stores_the_tokens_sealed() {
    use keypool_tests::process::{KeypoolProcess, binary_config, free_port, keypool_binary};
    use std::io::{BufRead as _, Write as _};
    let h = pool().await;
    // Without KEYPOOL_SECRETS_KEY (this in-process keypool) a login is refused at once.
    let refused = h
        .client()
        .post(h.url("/admin/oauth/start"))
        .bearer(ADMIN)
        .json(&serde_json::json!({"id": "max"}))
        .send()
        .await;
    assert_eq!(refused.status, 422, "{}", refused.text());
    assert!(refused.text().contains("KEYPOOL_SECRETS_KEY"));
    let dir = keypool_store::testing::TempDir::new("oauth-login").unwrap();
    let port = free_port();
    let text = binary_config(&h, port, &[])
        + &format!(
            "\n[oauth]\ntoken_url = \"{}/v1/oauth/token\"\n",
            h.sim().base_url()
        );
    let file = dir.path().join("keypool.toml");
    std::fs::write(&file, text).unwrap();
    let key = "0f".repeat(32);
    let k = KeypoolProcess::start_with(&file, port, &[], &[("KEYPOOL_SECRETS_KEY", &key)]).await;
    // The CLI: prints the URL, reads the code (as the provider's page shows it).
    let mut cli = std::process::Command::new(keypool_binary())
        .args(["oauth", "login", "max", "--url", &k.url("")])
        .env("KEYPOOL_ADMIN_TOKEN", ADMIN)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // stderr read to its end (the URL line handed over), so that the CLI can write on.
    let stderr = cli.stderr.take().unwrap();
    let (url_tx, url_rx) = tokio::sync::oneshot::channel();
    let stderr_text = tokio::task::spawn_blocking(move || {
        let mut url_tx = Some(url_tx);
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.starts_with("http")
                && let Some(tx) = url_tx.take()
            {
                let _ = tx.send(line.clone());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let url = url_rx.await.unwrap();
    let (challenge, state) = challenge_and_state(&url);
    let code = h.sim().authorize("max", &challenge).unwrap();
    writeln!(cli.stdin.take().unwrap(), "{code}#{state}").unwrap();
    let out = tokio::task::spawn_blocking(move || cli.wait_with_output().unwrap())
        .await
        .unwrap();
    let stderr_text = stderr_text.await.unwrap();
    assert!(
        out.status.success(),
        "{}{stderr_text}",
        String::from_utf8_lossy(&out.stdout)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["logged_in"], "max");
    // Sealed in the file, never in the answer or the logs.
    let saved = std::fs::read_to_string(&file).unwrap();
    assert!(saved.contains("refresh_token = \"enc:v1:"), "{saved}");
    assert!(!saved.contains("sk-ant-ort01-sim") && !saved.contains("sk-ant-oat01-sim"));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("sk-ant-o"));
    let r = k.send_message(&h, false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let last = h.sim().requests_for("max").pop().unwrap();
    assert!(
        last.headers["authorization"]
            .to_str()
            .unwrap()
            .contains("sk-ant-oat01-sim-max")
    );
    // The admin API directly, once more (a re-login replaces the tokens).
    let start = h
        .client()
        .post(k.url("/admin/oauth/start"))
        .bearer(ADMIN)
        .json(&serde_json::json!({"id": "max"}))
        .send()
        .await;
    assert_eq!(start.status, 200, "{}", start.text());
    let (challenge, state) = challenge_and_state(start.json()["authorize_url"].as_str().unwrap());
    let code = h.sim().authorize("max", &challenge).unwrap();
    let finish = |state: String, code: String| {
        let (h, k) = (&h, &k);
        async move {
            h.client()
                .post(k.url("/admin/oauth/finish"))
                .bearer(ADMIN)
                .json(&serde_json::json!({"state": state, "code": code}))
                .send()
                .await
        }
    };
    let done = finish(state.clone(), code.clone()).await;
    assert_eq!(done.status, 200, "{}", done.text());
    assert_eq!(done.json()["account"], "changed");
    assert_eq!(
        finish(state, code).await.status,
        400,
        "a login finishes once"
    );
    assert_eq!(k.send_message(&h, false).await.status, 200);
    let stats = h.sim().oauth_stats("max").unwrap();
    assert_eq!((stats.reused, stats.refused), (0, 0));
    for secret in ["sk-ant-oat01-sim", "sk-ant-ort01-sim"] {
        assert!(!k.logs().contains(secret), "a token is in the log");
    }
}
