//! Admin API refusal (SPEC 10, `docs/ADMIN.md`): every `/admin` route, with every
//! method and path spelling, refuses a missing or wrong token with `401
//! authentication_error`, and a refused call changes nothing (a disabled account stays
//! disabled, a cooldown keeps running, an account out of its window stays out, the
//! configuration is not reloaded). The status
//! page is the one exception: it answers without a token and holds no data. As a
//! property: whatever the method, path under `/admin` and `Authorization` header,
//! keypool answers well-formed, and nothing but the status page is ever answered `2xx`
//! without the exact token.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use http_body_util::Full;
use keypool_core::AccountId;
use keypool_sim::{Behaviour, ErrorReply, Script, UnifiedHeaders};
use keypool_tests::{AccountSpec, Harness, KEY, check_property};
use proptest::prelude::*;

const TOKEN: &str = "admin-refusal-token-9f8e7d6c5b4a";
const DISABLED: &str = "acct-disabled-zeta";
const COOLING: &str = "acct-cooling-eta";
const OUT: &str = "acct-out-of-window-iota";
const HEALTHY: &str = "acct-healthy-theta";

#[tokio::test]
async fn every_admin_route_refuses_a_missing_or_wrong_token_and_changes_nothing() {
    let h = Harness::builder()
        .extra_toml(&format!("[admin]\ntoken = \"{TOKEN}\""))
        .account(AccountSpec::new(DISABLED, Script::new(Behaviour::status(401))).priority(0))
        .account(
            AccountSpec::new(
                COOLING,
                Script::new(ErrorReply::rate_limited().retry_after_secs(600)),
            )
            .priority(1),
        )
        .account(
            AccountSpec::new(
                OUT,
                Script::new(
                    ErrorReply::rate_limited().unified(&UnifiedHeaders::rejected(
                        keypool_store::now_ms() / 1000 + 7200,
                    )),
                ),
            )
            .priority(2),
        )
        .account(AccountSpec::new(HEALTHY, Script::ok()).priority(3))
        .start()
        .await;
    assert_eq!(h.send_message().await.status, 200);
    let disabled = AccountId::from(DISABLED);
    assert!(h.store().health().disabled.is_disabled(&disabled));
    let cooling = h.cooldown(COOLING).expect("cooling after its 429");
    let out = AccountId::from(OUT);
    let out_until = h
        .store()
        .out_of_window(&out, keypool_store::now_ms())
        .expect("out of its window after its rejected 429");

    // A reload would drop the healthy account: a refused reload must not happen.
    let dir = std::env::temp_dir().join(format!("keypool-admin-refusal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keypool.toml");
    std::fs::write(
        &file,
        h.toml()
            .replace("priority = 3", "priority = 3\nactive = false"),
    )
    .unwrap();
    let _ = h.app().clone().with_config_path(&file);

    let ids = [DISABLED, COOLING, OUT, HEALTHY, "no-such-account"];
    let mut paths = vec![
        "/admin".to_owned(),
        "/admin/".to_owned(),
        "/admin/accounts".to_owned(),
        "/admin/accounts/".to_owned(),
        "/admin//accounts".to_owned(),
        "/admin/./accounts".to_owned(),
        "/admin/accounts?token=".to_owned() + TOKEN,
        "/admin/reload".to_owned(),
        "/admin/reload/".to_owned(),
        "/admin/alerts".to_owned(),
        "/admin/ui/../reload".to_owned(),
        "/admin/accounts/../reload".to_owned(),
        "/admin/nothing".to_owned(),
        "/admin/ui/x".to_owned(),
    ];
    for id in ids {
        paths.push(format!("/admin/accounts/{id}"));
        paths.push(format!("/admin/accounts/{id}/enable"));
        paths.push(format!("/admin/accounts/{id}/clear-cooldown"));
        paths.push(format!("/admin/accounts/{id}/clear-windows"));
        paths.push(format!("/admin/accounts/{id}/enable?token={TOKEN}"));
    }
    let lb_key = h.key(KEY);
    let wrong: Vec<(&str, Option<(&str, String)>)> = vec![
        ("no header", None),
        (
            "empty bearer",
            Some(("authorization", "Bearer ".to_owned())),
        ),
        (
            "wrong bearer",
            Some(("authorization", "Bearer wrong".to_owned())),
        ),
        (
            "token prefix",
            Some((
                "authorization",
                format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]),
            )),
        ),
        (
            "token and more",
            Some(("authorization", format!("Bearer {TOKEN}0"))),
        ),
        (
            "token twice",
            Some(("authorization", format!("Bearer {TOKEN}{TOKEN}"))),
        ),
        (
            "basic scheme",
            Some(("authorization", format!("Basic {TOKEN}"))),
        ),
        ("no scheme", Some(("authorization", TOKEN.to_owned()))),
        ("as x-api-key", Some(("x-api-key", TOKEN.to_owned()))),
        (
            "LB key",
            Some(("authorization", format!("Bearer {lb_key}"))),
        ),
        ("LB key as x-api-key", Some(("x-api-key", lb_key.clone()))),
    ];
    let mut checked = 0;
    for path in &paths {
        for method in [
            http::Method::GET,
            http::Method::POST,
            http::Method::PUT,
            http::Method::DELETE,
        ] {
            for (what, header) in &wrong {
                let mut request = h.client().request(method.clone(), h.url(path));
                if let Some((name, value)) = header {
                    request = request.header(name, value);
                }
                let r = request.send().await;
                let message = r.assert_keypool_error(401, "authentication_error");
                assert!(
                    message.contains("admin token"),
                    "{method} {path} ({what}): {message}"
                );
                assert!(!r.text().contains(HEALTHY), "{method} {path} ({what})");
                checked += 1;
            }
        }
    }
    // Nothing changed.
    assert!(
        h.store().health().disabled.is_disabled(&disabled),
        "still disabled"
    );
    assert_eq!(
        h.cooldown(COOLING),
        Some(cooling),
        "still cooling, same entry"
    );
    assert_eq!(
        h.store().out_of_window(&out, keypool_store::now_ms()),
        Some(out_until),
        "still out of its window"
    );
    assert!(
        h.store().config().account(HEALTHY).unwrap().active(),
        "the configuration was not reloaded"
    );
    // The status page answers without a token and holds no data.
    let page = h.get("/admin/ui").send().await;
    assert_eq!(page.status, 200);
    for id in [DISABLED, COOLING, OUT, HEALTHY] {
        assert!(!page.text().contains(id), "the page names {id}");
    }
    // And the right token works (the refusals were not for another reason).
    let r = h.get("/admin/accounts").bearer(TOKEN).send().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains(HEALTHY));
    eprintln!("admin refusal: {checked} refused calls");
    std::fs::remove_dir_all(&dir).unwrap();
    h.finish().await;
}

const PROP_TOKEN: &str = "admin-prop-token-5f1c";

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("accounts".to_owned()),
        Just("a".to_owned()),
        Just("enable".to_owned()),
        Just("clear-cooldown".to_owned()),
        Just("reload".to_owned()),
        Just("ui".to_owned()),
        "[a-z0-9_%.-]{0,6}",
    ]
}

#[test]
fn no_data_without_the_token() {
    let inputs = (
        prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "HEAD"]),
        prop_oneof![
            3 => prop::sample::select(vec![
                vec!["accounts"], vec!["accounts", "a"], vec!["accounts", "a", "enable"],
                vec!["accounts", "a", "clear-cooldown"], vec!["reload"], vec!["ui"],
                vec!["accounts", "nobody"],
            ]).prop_map(|v| v.into_iter().map(str::to_owned).collect::<Vec<_>>()),
            1 => prop::collection::vec(segment(), 0..4),
        ],
        prop_oneof![
            1 => Just(None),
            3 => Just(Some(format!("Bearer {PROP_TOKEN}"))),
            1 => Just(Some(PROP_TOKEN.to_owned())),
            1 => Just(Some(format!("Basic {PROP_TOKEN}"))),
            1 => Just(Some(format!("Bearer {PROP_TOKEN}x"))),
            1 => "[ -~]{0,40}".prop_map(Some),
        ],
    );
    let builder = Harness::builder()
        .extra_toml(&format!("[admin]\ntoken = \"{PROP_TOKEN}\""))
        .account(AccountSpec::new("a", Script::ok()));
    check_property(
        builder,
        256,
        file!(),
        inputs,
        async |h, (method, segments, auth)| {
            let path = format!("/admin/{}", segments.join("/"));
            let mut builder = http::Request::builder().method(method).uri(&path);
            if let Some(value) = &auth {
                if http::HeaderValue::from_str(value).is_err() {
                    return;
                }
                builder = builder.header("authorization", value.as_str());
            }
            let r = h
                .handle(builder.body(Full::new(Bytes::new())).unwrap())
                .await;
            let status = r.status.as_u16();
            assert!(r.header("x-request-id").is_some());
            let authorized = auth.as_deref() == Some(&format!("Bearer {PROP_TOKEN}"));
            let page = method == "GET"
                && segments
                    .iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    == ["ui"];
            if method == "HEAD" {
                // HEAD answers 200 with no body before any lookup (SPEC 2).
                assert_eq!(status, 200);
                assert!(r.body.is_empty());
                return;
            }
            if page {
                assert_eq!(status, 200);
                assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
                return;
            }
            assert_eq!(
                r.header("content-type"),
                Some("application/json"),
                "{status} {path}"
            );
            let json = r.json();
            if (200..300).contains(&status) {
                assert!(authorized, "{status} for {path} with {auth:?}");
            } else {
                assert_eq!(json["type"], "error");
                assert!(json["request_id"].is_string());
            }
            if !authorized {
                assert!(
                    [401, 404, 405].contains(&status),
                    "{status} {path} {auth:?}"
                );
                assert!(!r.text().contains("\"accounts\""));
            } else {
                // 400: a change route (SPEC 13) wants a JSON object and these bodies are
                // empty; nothing can change here (the harness serves no config file: 409).
                assert!(
                    [200, 400, 404, 405, 409].contains(&status),
                    "{status} {path}"
                );
            }
        },
    );
}
