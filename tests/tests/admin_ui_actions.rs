//! SPEC 13's everyday actions on the status page, clicked and typed in headless
//! Chromium through WebDriver ([`keypool_tests::browser::WebDriver`]), on a keypool
//! serving from a config file. A key created on the page is shown once and
//! authenticates, is gone from the page after a reload, and once revoked gets 401; an
//! account disabled on the page stops serving; a weight typed into a row is saved; an
//! account added through the form appears in its org; refusals (a 422 with its located
//! problems, a literal secret without `KEYPOOL_SECRETS_KEY`) read inline.
//!
//! Every wait polls the page or the API with a bounded deadline.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use keypool_sim::Script;
use keypool_store::config::Config;
use keypool_tests::browser::{WAIT, WebDriver};
use keypool_tests::{AccountSpec, Harness, MODEL, Reply, message_body, secret_of};
use serde_json::Value;

const TOKEN: &str = "ui-actions-admin-token-5e6f7a8b9c";

/// Accounts `a` (tried first) and `b`, an admin token, served from a config file (the
/// change routes rewrite it).
async fn pool() -> Harness {
    Harness::builder()
        .account(AccountSpec::new("a", Script::ok()).priority(0))
        .account(AccountSpec::new("b", Script::ok()).priority(1))
        .extra_toml(&format!("[admin]\ntoken = \"{TOKEN}\""))
        .config_file()
        .start()
        .await
}

/// The status page open with the token (in the fragment, as a person's link has it),
/// once its rows are drawn.
async fn open_page(h: &Harness) -> WebDriver {
    let browser = WebDriver::start().await;
    browser
        .goto(&format!("{}#token={TOKEN}", h.url("/admin/ui")))
        .await;
    browser
        .wait_for("tr[data-account=\"a\"] button[data-action=\"disable\"]")
        .await;
    browser
}

async fn admin_get(h: &Harness, path: &str) -> Value {
    let r = h.get(path).bearer(TOKEN).send().await;
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()
}

/// Polls the admin API's `path` until `ok` holds for its answer (at most [`WAIT`]).
async fn until_api(h: &Harness, path: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = admin_get(h, path).await;
        if ok(&answer) {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {WAIT:?}: {answer}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn send_with_key(h: &Harness, key: &str) -> Reply {
    h.client()
        .post(h.messages_url())
        .api_key(key)
        .json(&message_body(MODEL, false))
        .send()
        .await
}

fn row(id: &str) -> String {
    format!("tr[data-account=\"{id}\"]")
}

fn key_row(id: &str) -> String {
    format!("tr[data-lb-key=\"{id}\"]")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_created_on_the_page_is_shown_once_works_and_revoked_gets_401() {
    let h = pool().await;
    let browser = open_page(&h).await;

    browser
        .type_into("#create-key input[name=\"id\"]", "carol")
        .await;
    browser.click("#create-key-submit").await;
    let key = browser
        .wait_text("#new-key-value", "a new key", |t| t.starts_with("sk-lb-"))
        .await;
    let note = browser.text("#new-key").await;
    assert!(note.contains("shown only this once"), "{note}");
    browser
        .wait_for(&format!("{}[data-revoked=\"false\"]", key_row("carol")))
        .await;
    let r = send_with_key(&h, &key).await;
    assert_eq!(r.status, 200, "the key from the page: {}", r.text());

    // Once: a reload shows the key in the list, never the key itself.
    browser.reload().await;
    browser.wait_for(&key_row("carol")).await;
    browser.wait_for(&row("a")).await;
    let dom = browser.source().await;
    assert!(
        !dom.contains(&key),
        "the key is still in the page after a reload"
    );
    assert!(!dom.contains(TOKEN), "the admin token is in the page");

    // Revoke, with its inline confirmation (no dialog).
    browser
        .click(&format!(
            "{} button[data-action=\"revoke\"]",
            key_row("carol")
        ))
        .await;
    browser
        .click(&format!(
            "{} button[data-action=\"revoke-confirm\"]",
            key_row("carol")
        ))
        .await;
    browser
        .wait_for(&format!("{}[data-revoked=\"true\"]", key_row("carol")))
        .await;
    let keys = admin_get(&h, "/admin/keys").await;
    let carol = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == "carol")
        .unwrap();
    assert_eq!(carol["revoked"], true, "{keys}");
    send_with_key(&h, &key)
        .await
        .assert_keypool_error(401, "authentication_error");
    assert_eq!(browser.text("#keys-msg").await, "key carol revoked");
    drop(browser);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_disabled_on_the_page_stops_serving_and_a_weight_typed_is_saved() {
    let h = pool().await;
    let browser = open_page(&h).await;

    browser
        .click(&format!("{} button[data-action=\"disable\"]", row("a")))
        .await;
    let a = until_api(&h, "/admin/accounts/a", "a disabled", |a| {
        a["state"] == "disabled"
    })
    .await;
    assert_eq!(
        a["disabled"]["reason"],
        "operator: disabled from the status page"
    );
    browser
        .wait_for(&format!(
            "{}[data-state=\"disabled\"] button[data-action=\"enable\"]",
            row("a")
        ))
        .await;
    assert_eq!(browser.text("#notice").await, "a: disabled");
    assert_eq!(h.send_message().await.status, 200);
    assert_eq!(
        h.upstream_order(),
        ["b"],
        "not served by the disabled account"
    );

    // A weight typed into b's row and saved: in the live configuration and the file.
    let weight = format!("{} input[data-field=\"weight\"]", row("b"));
    let save = format!("{} button[data-action=\"save\"]", row("b"));
    browser.type_into(&weight, "7").await;
    browser.click(&save).await;
    until_api(&h, "/admin/accounts/b", "b's weight 7", |b| {
        b["weight"] == 7
    })
    .await;
    let file = Config::load(&h.config_path().unwrap()).unwrap();
    assert_eq!(file.account("b").unwrap().weight().get(), 7);
    browser
        .wait_text("#notice", "saved", |t| t == "b: weight 7 saved")
        .await;

    // A weight out of range: the 422 and its located problem, inline; nothing changed.
    browser.type_into(&weight, "500").await;
    browser.click(&save).await;
    let refusal = browser
        .wait_text("#notice", "a refusal", |t| t.starts_with("422 "))
        .await;
    assert!(refusal.contains("nothing was changed"), "{refusal}");
    assert!(refusal.contains("weight"), "{refusal}");
    assert_eq!(admin_get(&h, "/admin/accounts/b").await["weight"], 7);
    drop(browser);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_added_on_the_page_appears_and_a_literal_secret_is_refused_inline() {
    let h = pool().await;
    let browser = open_page(&h).await;
    let fill = |field: &'static str| format!("#add-account [name=\"{field}\"]");

    // A literal secret without KEYPOOL_SECRETS_KEY: refused, said why, secret not shown.
    browser.type_into(&fill("id"), "c").await;
    browser
        .type_into(&fill("secret"), "sk-ant-api03-literal")
        .await;
    browser.click("#add-account-submit").await;
    let refusal = browser
        .wait_text("#add-account-msg", "a refusal", |t| t.starts_with("422 "))
        .await;
    assert!(
        refusal.contains("KEYPOOL_SECRETS_KEY is not set"),
        "{refusal}"
    );
    assert!(refusal.contains("file:/path"), "the hint: {refusal}");
    assert!(!browser.source().await.contains("sk-ant-api03-literal"));

    // A file: reference is stored as given.
    let secret = h.config_path().unwrap().with_file_name("c.secret");
    std::fs::write(&secret, format!("{}\n", secret_of("a"))).unwrap();
    browser.type_into(&fill("id"), "c").await;
    browser
        .type_into(&fill("secret"), &format!("file:{}", secret.display()))
        .await;
    browser
        .type_into(&fill("base_url"), &h.sim().base_url())
        .await;
    browser.type_into(&fill("priority"), "5").await;
    browser.click("#add-account-submit").await;
    browser
        .wait_text("#add-account-msg", "added", |t| t == "added account c")
        .await;
    browser
        .wait_for(&format!("{} button[data-action=\"disable\"]", row("c")))
        .await;
    let c = admin_get(&h, "/admin/accounts/c").await;
    assert_eq!(
        (c["org"].clone(), c["priority"].clone()),
        ("acme".into(), 5.into())
    );
    drop(browser);
    h.finish().await;
}
