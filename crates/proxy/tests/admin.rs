//! The admin API's gate as a property: whatever the method, path under `/admin` and
//! `Authorization` header, keypool answers well-formed, and nothing but the status page
//! (which holds no data) is ever answered `2xx` without the exact token.

#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;

const TOKEN: &str = "admin-prop-token-5f1c";

const TOML: &str = "[server]\nstate_file = \"\"\n[admin]\ntoken = \"admin-prop-token-5f1c\"\n\
    [[orgs]]\nslug = \"acme\"\n[[accounts]]\nid = \"a\"\norg = \"acme\"\nprovider = \"anthropic\"\n\
    auth = \"api_key\"\nsecret = \"s\"\nbase_url = \"http://127.0.0.1:9\"\n[[urls]]\n\
    custom_url = \"team\"\norg = \"acme\"\n";

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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn no_data_without_the_token(
        method in prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "HEAD"]),
        segments in prop_oneof![
            3 => prop::sample::select(vec![
                vec!["accounts"], vec!["accounts", "a"], vec!["accounts", "a", "enable"],
                vec!["accounts", "a", "clear-cooldown"], vec!["reload"], vec!["ui"],
                vec!["accounts", "nobody"],
            ]).prop_map(|v| v.into_iter().map(str::to_owned).collect::<Vec<_>>()),
            1 => prop::collection::vec(segment(), 0..4),
        ],
        auth in prop_oneof![
            1 => Just(None),
            3 => Just(Some(format!("Bearer {TOKEN}"))),
            1 => Just(Some(TOKEN.to_owned())),
            1 => Just(Some(format!("Basic {TOKEN}"))),
            1 => Just(Some(format!("Bearer {TOKEN}x"))),
            1 => "[ -~]{0,40}".prop_map(Some),
        ],
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let config = keypool_store::config::Config::from_toml_str(TOML, None, &|_| None).unwrap();
            let app = keypool_proxy::App::new(keypool_store::Store::open(config).await.unwrap());
            let path = format!("/admin/{}", segments.join("/"));
            let mut builder = Request::builder().method(method).uri(&path);
            if let Some(value) = &auth {
                if http::HeaderValue::from_str(value).is_err() {
                    return;
                }
                builder = builder.header("authorization", value.as_str());
            }
            let response = app.handle(builder.body(Full::new(Bytes::new())).unwrap()).await;
            let status = response.status().as_u16();
            assert!(response.headers().contains_key("x-request-id"));
            let content_type = response
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned());
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let authorized = auth.as_deref() == Some(&format!("Bearer {TOKEN}"));
            let page = method == "GET"
                && segments.iter().filter(|s| !s.is_empty()).collect::<Vec<_>>() == ["ui"];
            if method == "HEAD" {
                // HEAD answers 200 with no body before any lookup (SPEC 2).
                assert_eq!(status, 200);
                assert!(body.is_empty());
                return;
            }
            if page {
                assert_eq!(status, 200);
                assert_eq!(content_type.as_deref(), Some("text/html; charset=utf-8"));
                return;
            }
            assert_eq!(content_type.as_deref(), Some("application/json"), "{status} {path}");
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            if (200..300).contains(&status) {
                assert!(authorized, "{status} for {path} with {auth:?}");
            } else {
                assert_eq!(json["type"], "error");
                assert!(json["request_id"].is_string());
            }
            if !authorized {
                assert!([401, 404, 405].contains(&status), "{status} {path} {auth:?}");
                assert!(!body.windows(b"\"accounts\"".len()).any(|w| w == b"\"accounts\""));
            } else {
                assert!([200, 404, 405, 409].contains(&status), "{status} {path}");
            }
        });
    }
}
