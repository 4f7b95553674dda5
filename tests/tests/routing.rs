//! `[[models]]` routing end to end (issue 24, seeds 003 and 004): with every account out
//! of its Opus weekly window, an alias whose chain starts with Opus, and an Opus model
//! with a fallback, are served by Sonnet and marked `x-keypool-fallback: true`; without a
//! rule the same request is the immediate 429.

#![allow(clippy::unwrap_used)]

use keypool_core::ModelFamily;
use keypool_sim::{ErrorReply, Script, UnifiedHeaders};
use keypool_store::now_ms;
use keypool_tests::{Harness, HarnessBuilder, message_body};

const ADMIN_TOKEN: &str = "routing-admin-token-1f2e3d4c5b6a";
const RULES: &str = r#"
[[models]]
alias = "auto:high"
chain = ["claude-opus-4-5", "claude-sonnet-4-5"]

[[models]]
model = "claude-opus-*"
fallback = ["claude-sonnet-4-5"]
"#;

fn opus_exhausted(reset: u64) -> Script {
    Script::family_exhausted(ModelFamily::Opus, reset)
}

/// Two round-robin accounts, both Opus-exhausted; two Sonnet requests let keypool read
/// both accounts' headers.
async fn pool(rules: bool) -> Harness {
    let reset = now_ms() / 1000 + 48 * 3600;
    let mut b: HarnessBuilder = Harness::builder()
        .strategy("round_robin")
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
        .accounts([("a", opus_exhausted(reset)), ("b", opus_exhausted(reset))]);
    if rules {
        b = b.extra_toml(RULES);
    }
    let h = b.start().await;
    for _ in 0..2 {
        let r = h
            .messages(&message_body("claude-sonnet-4-5", false))
            .send()
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.header("x-keypool-fallback").is_none());
    }
    h
}

#[tokio::test]
async fn an_alias_and_an_opus_fallback_are_served_by_sonnet_when_opus_is_out_everywhere() {
    let h = pool(true).await;
    let upstream = h.sim().total_stats().requests;
    for model in ["auto:high", "claude-opus-4-5"] {
        let r = h.messages(&message_body(model, false)).send().await;
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        assert_eq!(r.header("x-keypool-fallback"), Some("true"), "{model}");
        // the answer's own model is the truth: the one that served, not rewritten back
        assert_eq!(r.json()["model"], "claude-sonnet-4-5", "{model}");
        let id = r.header("x-request-id").unwrap().to_owned();
        let record = h
            .get(&format!("/admin/requests/{id}"))
            .bearer(ADMIN_TOKEN)
            .send()
            .await
            .json();
        assert_eq!(record["model"], model, "{record}");
        assert_eq!(record["model_sent"], "claude-sonnet-4-5", "{record}");
        assert_eq!(record["routing"]["position"], 1, "{record}");
        let alias = if model == "auto:high" {
            serde_json::json!("auto:high")
        } else {
            serde_json::Value::Null
        };
        assert_eq!(record["routing"]["alias"], alias, "{record}");
    }
    // no Opus attempt was made: both plans went straight to Sonnet
    assert_eq!(h.sim().total_stats().requests, upstream + 2);
    let m = h.metrics().await;
    for line in [
        "keypool_model_fallbacks_total{alias=\"auto:high\",from=\"claude-opus-4-5\",to=\"claude-sonnet-4-5\"} 1",
        "keypool_model_fallbacks_total{alias=\"claude-opus-*\",from=\"claude-opus-*\",to=\"claude-sonnet-4-5\"} 1",
    ] {
        assert!(m.contains(line), "{line} in\n{m}");
    }
    // a Sonnet request is the first choice of nothing: no header
    let r = h
        .messages(&message_body("claude-sonnet-4-5", false))
        .send()
        .await;
    assert!(r.header("x-keypool-fallback").is_none());
    h.finish().await;
}

#[tokio::test]
async fn without_a_rule_the_same_request_is_the_immediate_429() {
    let h = pool(false).await;
    let upstream = h.sim().total_stats().requests;
    let r = h
        .messages(&message_body("claude-opus-4-5", false))
        .send()
        .await;
    let message = r.assert_keypool_error(429, "rate_limit_error");
    assert!(message.contains("weekly (opus)"), "{message}");
    assert_eq!(h.sim().total_stats().requests, upstream);
    h.finish().await;
}

/// Issue 24: `x-keypool-route` picks one of the key's URL configs for this request, so one
/// `ANTHROPIC_BASE_URL` serves several pools; a URL config the key may not use (or none
/// of that name) is 401.
#[tokio::test]
async fn x_keypool_route_picks_one_of_the_keys_pools() {
    let h = Harness::builder()
        .accounts([("a", Script::ok()), ("b", Script::ok())])
        .extra_toml(
            "[[groups]]\nid = \"solo\"\norg = \"acme\"\naccounts = [\"b\"]\n\n[[urls]]\ncustom_url = \"solo\"\norg = \"acme\"\ngroup = \"solo\"",
        )
        .key("narrow", "acme", "urls = [\"team\"]")
        .start()
        .await;
    let body = message_body("claude-sonnet-4-5", false);
    assert_eq!(h.messages(&body).send().await.status, 200);
    for _ in 0..2 {
        let r = h
            .messages(&body)
            .header("x-keypool-route", "solo")
            .send()
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(
        h.upstream_order(),
        ["a", "b", "b"],
        "the header's pool served"
    );
    let narrow = h.key("narrow");
    let mine = h
        .client()
        .post(h.messages_url())
        .api_key(&narrow)
        .json(&body)
        .send()
        .await;
    assert_eq!(mine.status, 200);
    for route in ["solo", "nowhere"] {
        let r = h
            .client()
            .post(h.messages_url())
            .api_key(&narrow)
            .header("x-keypool-route", route)
            .json(&body)
            .send()
            .await;
        let message = r.assert_keypool_error(401, "authentication_error");
        assert!(message.contains("x-keypool-route"), "{message}");
    }
    assert_eq!(h.sim().total_stats().requests, 4);
    h.assert_no_lb_key_upstream();
    h.finish().await;
}

/// Issue 24: route explain names each account's filter (inactive, disabled, cooling, out
/// of window and which, model locked, kept), the strategy's order and the gate, without
/// calling any upstream; the next real request does what it says. `keypool route explain`
/// prints the same from a config file (here with no runtime state: every active account
/// kept) and refuses an unknown key.
#[tokio::test]
async fn route_explain_names_every_filter_and_matches_the_next_request() {
    use keypool_core::Window;
    use keypool_sim::Behaviour;
    use keypool_tests::AccountSpec;
    const M: &str = "claude-sonnet-4-5";
    let reset = now_ms() / 1000 + 3 * 3600;
    let exhausted = Script::new(ErrorReply::rate_limited().unified(
        &UnifiedHeaders::rejected(reset).window(Window::FiveHour, 1.0, reset, "rejected"),
    ));
    let h = Harness::builder()
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
        .account(
            AccountSpec::new("off", Script::ok())
                .toml("active = false")
                .priority(0),
        )
        .account(AccountSpec::new("revoked", Script::new(Behaviour::status(401))).priority(1))
        .account(
            AccountSpec::new(
                "limited",
                Script::new(ErrorReply::rate_limited().retry_after_secs(600)),
            )
            .priority(2),
        )
        .account(AccountSpec::new("exhausted", exhausted).priority(3))
        .account(
            AccountSpec::new("locked", Script::ok().for_model(M, Behaviour::status(404)))
                .priority(4),
        )
        .account(AccountSpec::new("healthy", Script::ok()).priority(5))
        .start()
        .await;
    assert_eq!(h.messages(&message_body(M, false)).send().await.status, 200);
    let upstream = h.sim().total_stats().requests;
    let r = h
        .get(&format!(
            "/admin/explain?org=acme&url=team&key=alice&model={M}"
        ))
        .bearer(ADMIN_TOKEN)
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let e = r.json();
    assert_eq!(
        h.sim().total_stats().requests,
        upstream,
        "explain calls no upstream"
    );
    let accounts = e["models"][0]["accounts"].as_array().unwrap();
    let filter = |id: &str| {
        let a = accounts
            .iter()
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {e}"));
        (
            a["filter"].as_str().unwrap().to_owned(),
            a["window"].clone(),
        )
    };
    assert_eq!(filter("off").0, "inactive");
    assert_eq!(filter("revoked").0, "disabled");
    assert_eq!(filter("limited").0, "cooling");
    assert_eq!(
        filter("exhausted"),
        ("out_of_window".to_owned(), serde_json::json!("5h"))
    );
    assert_eq!(filter("locked").0, "model_locked");
    assert_eq!(filter("healthy").0, "kept");
    assert_eq!(e["models"][0]["plan"], serde_json::json!(["healthy"]));
    assert_eq!(e["models"][0]["fan_out"]["kind"], "single");
    assert_eq!(e["chosen"], M);
    // the next real request does what explain said
    assert_eq!(h.messages(&message_body(M, false)).send().await.status, 200);
    assert_eq!(h.upstream_order().last().unwrap(), "healthy");
    assert_eq!(h.sim().total_stats().requests, upstream + 1);

    // the CLI, from a config file
    let (dir, file) = keypool_tests::process::config_file(
        "route-explain",
        &keypool_tests::process::binary_config(&h, keypool_tests::process::free_port(), &[]),
    );
    let file = file.to_str().unwrap();
    let args = [
        "route", "explain", "--config", file, "--org", "acme", "--url", "team", "--key-id",
        "alice", "--model", M,
    ];
    let (code, out, err) = keypool_tests::process::keypool_command(&args, &[]);
    assert_eq!(code, Some(0), "{err}");
    let cli: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(cli["strategy"], "priority");
    assert_eq!(
        cli["models"][0]["plan"][0], "revoked",
        "no runtime state: priority order"
    );
    let mut unknown = args;
    unknown[9] = "mallory";
    let (code, _, err) = keypool_tests::process::keypool_command(&unknown, &[]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no LB key with id \"mallory\""), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
    h.finish().await;
}
