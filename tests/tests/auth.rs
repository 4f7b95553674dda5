//! SPEC 2 and 3.1–3.4 end to end: routes, resolution, the LB key status table, key
//! stripping, body checks. Every rejection is answered by keypool itself: the simulated
//! upstream receives nothing.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use keypool_sim::Script;
use keypool_tests::{AccountSpec, Harness, MODEL, Reply, message_body, secret_of};
use serde_json::json;

/// acme (the pool, key `alice`), another org `globex` with key `bob`, a suspended org
/// `initech` with key `carol`, acme's key `ci-bot` that only sees URL `other`, and
/// acme's revoked key `old`.
async fn harness() -> Harness {
    Harness::builder()
        .account(AccountSpec::new("a1", Script::ok()))
        .extra_toml(
            r#"
[[orgs]]
slug = "globex"
[[orgs]]
slug = "initech"
suspended = true

[[accounts]]
id = "g1"
org = "globex"
provider = "anthropic"
auth = "api_key"
secret = "sk-ant-api03-sim-g1"
base_url = "{sim}"
[[accounts]]
id = "i1"
org = "initech"
provider = "anthropic"
auth = "api_key"
secret = "sk-ant-api03-sim-i1"
base_url = "{sim}"

[[urls]]
custom_url = "other"
org = "acme"
[[urls]]
custom_url = "tools"
org = "globex"
[[urls]]
custom_url = "ops"
org = "initech"
[[urls]]
custom_url = "shared"
org = "acme"
[[urls]]
custom_url = "shared"
org = "globex"
[[urls]]
custom_url = "orphan"
"#,
        )
        .key("bob", "globex", "urls = [\"*\"]")
        .key("carol", "initech", "urls = [\"*\"]")
        .key("ci-bot", "acme", "urls = [\"other\"]")
        .key("old", "acme", "urls = [\"*\"]\nrevoked = true")
        .start()
        .await
}

/// The default pool's Messages path.
const TEAM: &str = "/acme/team/v1/messages";

/// Sends the default message to `path` with LB key `key` (a key id of [`harness`]).
async fn post_with(h: &Harness, path: &str, key: &str) -> Reply {
    h.post_message(path).api_key(&h.key(key)).send().await
}

fn body() -> serde_json::Value {
    message_body(MODEL, false)
}

/// Asserts a `401 authentication_error` and that nothing reached the upstream.
fn assert_401(h: &Harness, reply: &Reply, case: &str) {
    let message = reply.assert_keypool_error(401, "authentication_error");
    assert!(
        !message.contains("sk-lb-"),
        "{case}: the key is echoed: {message}"
    );
    assert_eq!(h.sim().total_stats().requests, 0, "{case}: upstream called");
}

#[tokio::test]
async fn missing_key_is_401() {
    let h = harness().await;
    let r = h.post_message(TEAM).send().await;
    assert_401(&h, &r, "no key");
    h.finish().await;
}

#[tokio::test]
async fn unknown_key_is_401() {
    let h = harness().await;
    let unknown = "sk-lb-0000000000000000000000000000000000000000";
    for r in [
        h.post_message(TEAM).api_key(unknown).send().await,
        h.post_message(TEAM).bearer(unknown).send().await,
        h.post_message(TEAM).api_key("not-a-key").send().await,
    ] {
        assert_401(&h, &r, "unknown key");
    }
    h.finish().await;
}

#[tokio::test]
async fn revoked_key_is_401() {
    let h = harness().await;
    let r = post_with(&h, TEAM, "old").await;
    assert_401(&h, &r, "revoked key");
    h.finish().await;
}

#[tokio::test]
async fn key_of_another_org_is_401() {
    let h = harness().await;
    let r = post_with(&h, TEAM, "bob").await;
    assert_401(&h, &r, "globex key on acme");
    // and the other way round: acme's key on globex's URL
    let r = post_with(&h, "/globex/tools/v1/messages", "alice").await;
    assert_401(&h, &r, "acme key on globex");
    h.finish().await;
}

#[tokio::test]
async fn url_not_in_the_keys_list_is_401_and_a_listed_one_works() {
    let h = harness().await;
    let r = post_with(&h, TEAM, "ci-bot").await;
    assert_401(&h, &r, "ci-bot on team");
    // control: the URL it lists is served
    let r = post_with(&h, "/acme/other/v1/messages", "ci-bot").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.requests_per_account(&["a1"]), [1]);
    h.finish().await;
}

#[tokio::test]
async fn suspended_org_is_403_org_suspended_only_after_a_valid_key() {
    let h = harness().await;
    let url = "/initech/ops/v1/messages";
    let r = post_with(&h, url, "carol").await;
    let message = r.assert_keypool_error(403, "permission_error");
    assert!(message.contains("ORG_SUSPENDED"), "message: {message}");
    // without a valid key for it, the suspension is not revealed
    let r = h.post_message(url).send().await;
    assert_401(&h, &r, "no key on a suspended org");
    let r = post_with(&h, url, "alice").await;
    assert_401(&h, &r, "another org's key on a suspended org");
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

#[tokio::test]
async fn client_oauth_bearer_is_ignored_and_never_forwarded() {
    let h = harness().await;
    let own = "sk-ant-oat01-the-clients-own-token";
    // the LB key in x-api-key, the client's own OAuth token as bearer: served
    let r = h
        .post_message(TEAM)
        .api_key(&h.key("alice"))
        .bearer(own)
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // the LB key as bearer works too
    let r = h.post_message(TEAM).bearer(&h.key("alice")).send().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.requests_per_account(&["a1"]), [2]);
    // the OAuth bearer alone is no LB key
    let r = h.post_message(TEAM).bearer(own).send().await;
    r.assert_keypool_error(401, "authentication_error");
    assert_eq!(h.sim().total_stats().requests, 2);
    assert!(
        h.sim().requests_containing(own.as_bytes()).is_empty(),
        "the client's own token reached the upstream"
    );
    h.finish().await;
}

#[tokio::test]
async fn every_401_is_byte_identical_except_the_request_id() {
    let h = harness().await;
    let replies = [
        h.post_message(TEAM).send().await,
        h.post_message(TEAM)
            .api_key("sk-lb-unknownunknownunknownunknownunknown00")
            .send()
            .await,
        post_with(&h, TEAM, "old").await,
        post_with(&h, TEAM, "bob").await,
        post_with(&h, TEAM, "ci-bot").await,
    ];
    let first = replies[0].without_request_id();
    assert_eq!(first.status, 401);
    for r in &replies[1..] {
        assert_eq!(r.without_request_id(), first, "401 answers differ");
    }
    let ids: std::collections::BTreeSet<_> = replies
        .iter()
        .map(|r| r.header("x-request-id").unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), replies.len(), "request ids are per request");
    h.finish().await;
}

#[tokio::test]
async fn unknown_org_and_unknown_url_are_byte_identical_404s() {
    let h = harness().await;
    let unknown_org = post_with(&h, "/nosuchorg/team/v1/messages", "alice").await;
    let unknown_url = post_with(&h, "/acme/nosuchurl/v1/messages", "alice").await;
    let message = unknown_org.assert_keypool_error(404, "not_found_error");
    assert_eq!(message, "Custom URL config not found");
    assert_eq!(
        unknown_org.without_request_id(),
        unknown_url.without_request_id()
    );
    assert_ne!(
        unknown_org.header("x-request-id"),
        unknown_url.header("x-request-id")
    );
    // without any key the answer is the same too: resolution comes first
    let no_key = h.post_message("/nosuchorg/team/v1/messages").send().await;
    assert_eq!(
        no_key.without_request_id(),
        unknown_org.without_request_id()
    );
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

#[tokio::test]
async fn head_is_200_and_empty_for_anything() {
    let h = harness().await;
    for path in [
        "/api/hello",
        "/acme/team/v1/messages",
        "/acme/team/v1/messages/count_tokens",
        "/nosuchorg/nosuchurl/v1/messages",
        "/team/v1/messages",
        "/",
        "/initech/ops/v1/messages",
    ] {
        let r = h
            .client()
            .request(http::Method::HEAD, h.url(path))
            .send()
            .await;
        assert_eq!(r.status, 200, "HEAD {path}");
        assert!(r.body.is_empty(), "HEAD {path} has a body");
    }
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

#[tokio::test]
async fn body_that_is_not_json_or_lacks_model_is_400_without_upstream_call() {
    let h = harness().await;
    let key = h.key("alice");
    let r = h
        .client()
        .post(h.messages_url())
        .api_key(&key)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await;
    r.assert_keypool_error(400, "invalid_request_error");
    let r = h
        .client()
        .post(h.messages_url())
        .api_key(&key)
        .json(&json!({"max_tokens": 5, "messages": []}))
        .send()
        .await;
    r.assert_keypool_error(400, "invalid_request_error");
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

/// SPEC 3.4 (issue 14.5): a `stream` that is present but not a boolean is `400
/// invalid_request_error` from keypool itself (before the fix it was "not streaming",
/// and an upstream that coerced it streamed past every streaming safeguard).
#[tokio::test]
async fn a_stream_that_is_not_a_boolean_is_400_without_upstream_call() {
    let h = harness().await;
    for stream in [json!("true"), json!(1), json!("yes"), json!([true])] {
        let r = h
            .messages(&json!({"model": MODEL, "max_tokens": 5, "stream": stream, "messages": []}))
            .send()
            .await;
        let message = r.assert_keypool_error(400, "invalid_request_error");
        assert!(
            message.starts_with("stream: Input should be a valid boolean"),
            "{message}"
        );
    }
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

/// SPEC 3.4 (issue 14.9): an LB key in the query string never reaches the upstream;
/// the other parameters are forwarded unchanged (before the fix `?key=sk-lb-…` was
/// forwarded, and the harness's global check failed).
#[tokio::test]
async fn an_lb_key_in_the_query_string_never_reaches_the_upstream() {
    let h = harness().await;
    let key = h.key("alice");
    for query in [
        format!("beta=true&key={key}"),
        format!("key={}&beta=true", key.replace("sk-lb-", "sk%2Dlb%2D")),
    ] {
        let r = h
            .client()
            .post(format!("{}?{query}", h.messages_url()))
            .api_key(&key)
            .json(&body())
            .send()
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let forwarded: Vec<String> = h
        .sim()
        .requests()
        .iter()
        .map(|r| r.path_and_query.clone())
        .collect();
    assert_eq!(
        forwarded,
        ["/v1/messages?beta=true", "/v1/messages?beta=true"]
    );
    h.finish().await;
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let h = Harness::builder()
        .account(AccountSpec::new("a1", Script::ok()))
        .server("max_body_bytes", "2048")
        .start()
        .await;
    let big = json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x".repeat(4096)}]});
    let r = h.messages(&big).send().await;
    r.assert_keypool_error(413, "request_too_large");
    assert_eq!(h.sim().total_stats().requests, 0);
    h.finish().await;
}

#[tokio::test]
async fn upstream_headers_come_from_the_allowlist() {
    let h = harness().await;
    let r = h
        .messages(&body())
        .header("anthropic-version", "2026-10-21")
        .header("anthropic-beta", "prompt-caching-2024-07-31")
        .header("x-session-id", "session-123")
        .header("x-custom-leak", "Bearer sk-lb-smuggled-in-another-header")
        .header("accept-encoding", "gzip, br")
        .header("user-agent", "e2e-test/1.0")
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let requests = h.sim().requests();
    assert_eq!(requests.len(), 1);
    let up = &requests[0];
    assert_eq!(up.header("x-api-key"), Some(secret_of("a1").as_str()));
    assert_eq!(up.header("anthropic-version"), Some("2026-10-21"));
    assert_eq!(
        up.header("anthropic-beta"),
        Some("prompt-caching-2024-07-31")
    );
    assert_eq!(up.header("user-agent"), Some("e2e-test/1.0"));
    assert_eq!(up.header("x-session-id"), None);
    assert_eq!(up.header("x-custom-leak"), None);
    assert_eq!(up.header("authorization"), None);
    assert!(
        up.header("accept-encoding").is_none_or(|v| v == "identity"),
        "accept-encoding upstream: {:?}",
        up.header("accept-encoding")
    );
    // without anthropic-version the default is sent
    let r = h.send_message().await;
    assert_eq!(r.status, 200);
    let requests = h.sim().requests();
    assert_eq!(requests[1].header("anthropic-version"), Some("2023-06-01"));
    h.finish().await;
}

#[tokio::test]
async fn successful_answers_carry_only_safe_headers_and_a_request_id() {
    let h = harness().await;
    let r = h.send_message().await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.header("x-request-id").is_some_and(|id| !id.is_empty()));
    assert_eq!(r.header("request-id"), None, "upstream request-id leaked");
    let body = r.json();
    assert_eq!(body["type"], "message");
    assert_eq!(body["content"][0]["text"], "HelloHelloHelloHello");
    h.finish().await;
}

#[tokio::test]
async fn legacy_route_serves_a_unique_url_with_deprecation_headers() {
    let h = harness().await;
    let r = post_with(&h, "/team/v1/messages", "alice").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("deprecation"), Some("true"));
    assert_eq!(r.header("sunset"), Some("Thu, 31 Dec 2026 23:59:59 GMT"));
    assert_eq!(h.requests_per_account(&["a1"]), [1]);
    // ambiguous (acme and globex): 409, with the deprecation headers too
    let r = post_with(&h, "/shared/v1/messages", "alice").await;
    r.assert_keypool_error(409, "invalid_request_error");
    assert_eq!(r.header("deprecation"), Some("true"));
    // a URL config of no org: 403, there is no global pool
    let r = post_with(&h, "/orphan/v1/messages", "alice").await;
    r.assert_keypool_error(403, "permission_error");
    // unknown: the same 404 as the org-scoped routes
    let r = post_with(&h, "/nosuchurl/v1/messages", "alice").await;
    let message = r.assert_keypool_error(404, "not_found_error");
    assert_eq!(message, "Custom URL config not found");
    assert_eq!(h.sim().total_stats().requests, 1);
    h.finish().await;
}

#[tokio::test]
async fn legacy_route_after_its_removal_date_is_410_naming_the_new_form() {
    let h = Harness::builder()
        .account(AccountSpec::new("a1", Script::ok()))
        .server("legacy_routes_until", "2020-01-01")
        .start()
        .await;
    let r = post_with(&h, "/team/v1/messages", "alice").await;
    let message = r.assert_keypool_error(410, "invalid_request_error");
    assert!(message.contains("/{org}/team/v1/messages"), "{message}");
    assert_eq!(r.header("deprecation"), Some("true"));
    assert_eq!(r.header("sunset"), Some("Wed, 01 Jan 2020 23:59:59 GMT"));
    // the org-scoped route keeps working
    assert_eq!(h.send_message().await.status, 200);
    assert_eq!(h.sim().total_stats().requests, 1);
    h.finish().await;
}

#[tokio::test]
async fn health_and_readiness() {
    let h = harness().await;
    for path in ["/healthz", "/readyz"] {
        let r = h.get(path).send().await;
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());
    }
    // one answered request and one unknown route, then what the scraper sees
    assert_eq!(h.send_message().await.status, 200);
    let r = post_with(&h, "/nosuchorg/team/v1/messages", "alice").await;
    assert_eq!(r.status, 404);
    let r = h.get("/metrics").send().await;
    assert_eq!(r.status, 200);
    let metrics = r.text();
    for series in [
        r#"keypool_requests_total{org="acme",url="team",status="200"} 1"#,
        r#"keypool_requests_total{org="-",url="-",status="404"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }
    assert!(
        !metrics.contains("sk-lb-") && !metrics.contains("sk-ant-"),
        "{metrics}"
    );
    h.finish().await;
}

#[tokio::test]
async fn oauth_and_compatible_accounts_get_their_own_credentials_upstream() {
    let h = Harness::builder()
        .account(
            AccountSpec::new("oauth", Script::new(keypool_sim::Behaviour::status(529)))
                .provider("anthropic", "oauth")
                .priority(0),
        )
        .account(
            AccountSpec::new("compat", Script::ok())
                .provider("anthropic_compatible", "bearer")
                .url_label("api/anthropic")
                .priority(1),
        )
        .start()
        .await;
    let r = h
        .messages(&body())
        .header(
            "anthropic-beta",
            "prompt-caching-2024-07-31,oauth-2025-04-20",
        )
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let requests = h.sim().requests();
    assert_eq!(h.upstream_order(), ["oauth", "compat"]);
    let oauth = &requests[0];
    assert_eq!(
        oauth.header("authorization"),
        Some(format!("Bearer {}", secret_of("oauth")).as_str())
    );
    assert_eq!(oauth.header("x-api-key"), None);
    let betas: Vec<&str> = oauth
        .header("anthropic-beta")
        .unwrap()
        .split(',')
        .map(str::trim)
        .collect();
    assert_eq!(
        betas.iter().filter(|b| **b == "oauth-2025-04-20").count(),
        1,
        "{betas:?}"
    );
    assert!(betas.contains(&"prompt-caching-2024-07-31"), "{betas:?}");
    let compat = &requests[1];
    assert_eq!(compat.path_and_query, "/api/anthropic/v1/messages");
    assert_eq!(
        compat.header("authorization"),
        Some(format!("Bearer {}", secret_of("compat")).as_str())
    );
    assert_eq!(compat.header("x-api-key"), None);
    h.finish().await;
}
