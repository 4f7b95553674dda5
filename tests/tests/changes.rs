//! SPEC 13 end to end: the pool changed while it runs, through the admin API, on a
//! keypool serving from a config file. An account added serves the next request; a
//! rotated secret is used by the next upstream call; a revoked key gets 401; a key
//! created is shown once and authenticates; an account deleted while a request is in
//! flight lets it finish; an invalid change is 422 with located problems and changes
//! nothing; every change is in the file (so it survives a restart) and in the audit log.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use keypool_sim::{Delay, OkSpec, Script};
use keypool_store::config::Config;
use keypool_tests::{AccountSpec, Harness, HarnessBuilder, MODEL, Reply, message_body, secret_of};
use serde_json::{Value, json};

const ADMIN_TOKEN: &str = "changes-admin-token-0a1b2c3d4e5f";

fn builder() -> HarnessBuilder {
    Harness::builder()
        .account(AccountSpec::new("a", Script::ok()))
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
        .config_file()
}

async fn admin(h: &Harness, method: http::Method, path: &str, body: Option<Value>) -> Reply {
    let mut r = h.client().request(method, h.url(path)).bearer(ADMIN_TOKEN);
    if let Some(body) = body {
        r = r.json(&body);
    }
    r.send().await
}

/// Accounts `a` (answering with `a`, tried first) and `b`, served from a config file.
fn two_accounts(a: Script) -> HarnessBuilder {
    Harness::builder()
        .account(AccountSpec::new("a", a).priority(0))
        .account(AccountSpec::new("b", Script::ok()).priority(1))
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
        .config_file()
}

/// A secret file holding `value` (a `file:` reference the test controls).
fn secret_file(h: &Harness, name: &str, value: &str) -> String {
    let path = h.config_path().unwrap().with_file_name(name);
    std::fs::write(&path, format!("{value}\n")).unwrap();
    format!("file:{}", path.display())
}

/// The configuration a restart would load from the file.
fn reloaded(h: &Harness) -> Config {
    Config::load(&h.config_path().unwrap()).unwrap()
}

#[tokio::test]
async fn an_account_added_through_the_api_serves_the_next_request_and_survives_a_restart() {
    let h = builder().start().await;
    // The simulator knows the credentials of the harness's accounts: `b` presents
    // `a`'s, and keypool's own record says which account served.
    let secret = secret_file(&h, "b.secret", &secret_of("a"));
    let r = admin(
        &h,
        http::Method::POST,
        "/admin/accounts",
        Some(
            json!({"id": "b", "org": "acme", "provider": "anthropic", "auth": "api_key",
                    "secret": secret, "base_url": h.sim().base_url()}),
        ),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["diff"]["accounts_added"], json!(["b"]));
    // Put it alone in the pool.
    let r = admin(
        &h,
        http::Method::PATCH,
        "/admin/groups/acme/pool",
        Some(json!({"accounts": ["b"]})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = h.send_message().await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.header("x-request-id").unwrap().to_owned();
    let record = admin(
        &h,
        http::Method::GET,
        &format!("/admin/requests/{id}"),
        None,
    )
    .await;
    assert_eq!(record.json()["account"], "b", "served by the new account");
    // In the file: a restart serves the same.
    let config = reloaded(&h);
    assert!(config.account("b").is_some());
    let audit = std::fs::read_to_string(keypool_store::document::audit_log_path(
        &h.config_path().unwrap(),
    ))
    .unwrap();
    let lines: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["route"], "POST /admin/accounts");
    assert_eq!(lines[1]["changed"]["groups_changed"], json!(["acme/pool"]));
    assert!(
        !audit.contains(&secret_of("a")),
        "no secret in the audit log"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_rotated_secret_is_used_by_the_next_upstream_call() {
    // `b` only gives the simulator a second known credential.
    let h = builder()
        .account(AccountSpec::new("b", Script::ok()).outside_pool())
        .start()
        .await;
    assert_eq!(h.send_message().await.status, 200);
    // The simulator names an account by the credential it got: `a` now presents the
    // credential the simulator knows as `b`'s.
    let rotated = secret_file(&h, "a.secret", &secret_of("b"));
    let r = admin(
        &h,
        http::Method::PATCH,
        "/admin/accounts/a",
        Some(json!({"secret": rotated})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["diff"]["accounts_changed"], json!(["a"]));
    let r = h.send_message().await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Still account `a` for keypool, with the new credential upstream.
    assert_eq!(h.upstream_order(), ["a", "b"]);
    let last = h.sim().requests().pop().unwrap();
    assert_eq!(last.header("x-api-key"), Some(secret_of("b").as_str()));
    h.finish().await;
}

#[tokio::test]
async fn a_key_created_is_shown_once_and_a_revoked_key_gets_401() {
    let h = builder().start().await;
    let r = admin(
        &h,
        http::Method::POST,
        "/admin/keys",
        Some(json!({"id": "carol", "org": "acme"})),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let created = r.json();
    let key = created["key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("sk-lb-"));
    let file = std::fs::read_to_string(h.config_path().unwrap()).unwrap();
    assert!(!file.contains(&key), "only the hash is stored");
    let send = |key: String| {
        let h = &h;
        async move {
            h.client()
                .post(h.messages_url())
                .api_key(&key)
                .json(&message_body(MODEL, false))
                .send()
                .await
        }
    };
    assert_eq!(send(key.clone()).await.status, 200);
    // Listed without its hash.
    let listed = admin(&h, http::Method::GET, "/admin/keys", None)
        .await
        .text();
    assert!(listed.contains("\"carol\""), "{listed}");
    assert!(!listed.contains("sha256"), "{listed}");
    let r = admin(&h, http::Method::POST, "/admin/keys/carol/revoke", None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    send(key)
        .await
        .assert_keypool_error(401, "authentication_error");
    assert!(reloaded(&h).lb_key_by_id("carol").unwrap().revoked());
    h.finish().await;
}

/// A keep-alive connection remembers the hash of the key it presented last (issue 22):
/// only the hash, never the verdict. Another key on the same connection is served as
/// itself, a key revoked between two requests of one connection is refused on the
/// second, and an unknown key after a valid one is refused.
#[tokio::test]
async fn one_connection_presenting_keys_gets_each_keys_verdict_even_after_a_revocation() {
    use keypool_tests::raw::{read_answer, status_of};
    use tokio::io::AsyncWriteExt;
    let h = builder().start().await;
    let mut created = Vec::new();
    for id in ["carol", "dave"] {
        let r = admin(
            &h,
            http::Method::POST,
            "/admin/keys",
            Some(json!({"id": id, "org": "acme"})),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.text());
        created.push(r.json()["key"].as_str().unwrap().to_owned());
    }
    let (carol, dave) = (&created[0], &created[1]);
    let body = serde_json::to_vec(&message_body(MODEL, false)).unwrap();
    let path = h.messages_url().replacen(&h.base_url(), "", 1);
    let request = |key: &str| {
        let mut r = format!(
            "POST {path} HTTP/1.1\r\nhost: keypool\r\nx-api-key: {key}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(&body);
        r
    };
    let addr = h.base_url().trim_start_matches("http://").to_owned();
    let connect = || tokio::net::TcpStream::connect(&addr);
    let send = async |kept: &mut tokio::net::TcpStream, key: &str| {
        kept.write_all(&request(key)).await.unwrap();
        read_answer(kept, Duration::from_secs(10)).await
    };
    let mut kept = connect().await.unwrap();
    for key in [carol, carol, dave, carol] {
        let answer = send(&mut kept, key).await;
        assert_eq!(status_of(&answer), 200, "{answer}");
    }
    let r = admin(&h, http::Method::POST, "/admin/keys/carol/revoke", None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // the same connection, whose last key was carol's: refused (and closed, as every
    // refusal before the body is)
    let answer = send(&mut kept, carol).await;
    assert_eq!(status_of(&answer), 401, "{answer}");
    assert!(answer.contains("\"authentication_error\""), "{answer}");
    let mut kept = connect().await.unwrap();
    let answer = send(&mut kept, dave).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let answer = send(&mut kept, "sk-lb-not-a-key-of-this-config").await;
    assert_eq!(status_of(&answer), 401, "{answer}");
    h.finish().await;
}

#[tokio::test]
async fn an_invalid_change_is_422_with_located_problems_and_changes_nothing() {
    let h = builder().start().await;
    let path = h.config_path().unwrap();
    let before = std::fs::read_to_string(&path).unwrap();
    let account_before = (**h.store().config().account("a").unwrap()).clone();
    let r = admin(
        &h,
        http::Method::PATCH,
        "/admin/accounts/a",
        Some(json!({"weight": 500, "colour": "red"})),
    )
    .await;
    assert_eq!(r.status, 422, "{}", r.text());
    let body = r.json();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let problems: Vec<&str> = body["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("accounts[0].colour: unknown field")),
        "{problems:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        before,
        "the file is unchanged"
    );
    assert_eq!(**h.store().config().account("a").unwrap(), account_before);
    // Unknown elements and duplicates.
    let r = admin(&h, http::Method::DELETE, "/admin/accounts/nobody", None).await;
    r.assert_keypool_error(404, "not_found_error");
    let r = admin(
        &h,
        http::Method::POST,
        "/admin/accounts",
        Some(json!({"id": "a", "org": "acme"})),
    )
    .await;
    r.assert_keypool_error(409, "invalid_request_error");
    // A literal secret without KEYPOOL_SECRETS_KEY is refused, and says why.
    let r = admin(
        &h,
        http::Method::POST,
        "/admin/accounts",
        Some(json!({"id": "c", "org": "acme", "provider": "anthropic", "auth": "api_key", "secret": "sk-ant-api03-literal"})),
    )
    .await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(
        r.text().contains("KEYPOOL_SECRETS_KEY is not set"),
        "{}",
        r.text()
    );
    assert!(!r.text().contains("sk-ant-api03-literal"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    h.finish().await;
}

#[tokio::test]
async fn an_account_deleted_with_a_request_in_flight_lets_it_finish() {
    let slow = OkSpec::default().chunks(10).chunk_interval(Delay::ms(100));
    let h = two_accounts(Script::new(slow)).start().await;
    let mut stream = h
        .client()
        .post(h.messages_url())
        .api_key(&h.key("alice"))
        .json(&message_body(MODEL, true))
        .send_streaming()
        .await;
    assert_eq!(stream.status, 200);
    let r = admin(&h, http::Method::DELETE, "/admin/accounts/a", None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["diff"]["accounts_removed"], json!(["a"]));
    let mut last = None;
    while let Some(frame) = stream.next_frame().await {
        last = frame.event;
    }
    assert_eq!(
        last.as_deref(),
        Some("message_stop"),
        "the stream in flight finished"
    );
    // Gone after: the next request goes to b, the account is unknown to the API.
    assert_eq!(h.send_message().await.status, 200);
    assert_eq!(h.upstream_order(), ["a", "b"]);
    let r = admin(&h, http::Method::GET, "/admin/accounts/a", None).await;
    r.assert_keypool_error(404, "not_found_error");
    assert!(reloaded(&h).account("a").is_none());
    h.finish().await;
}

#[tokio::test]
async fn an_account_disabled_through_the_api_stops_serving_until_enabled() {
    let h = two_accounts(Script::ok()).start().await;
    let r = admin(
        &h,
        http::Method::POST,
        "/admin/accounts/a/disable",
        Some(json!({"reason": "rotating its key"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["reason"], "operator: rotating its key");
    assert_eq!(h.send_message().await.status, 200);
    assert_eq!(h.upstream_order(), ["b"]);
    let r = admin(&h, http::Method::POST, "/admin/accounts/a/enable", None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.send_message().await.status, 200);
    assert_eq!(h.upstream_order(), ["b", "a"]);
    h.finish().await;
}

/// `keypool keys …` and `keypool accounts …` talk to a running keypool's admin API:
/// the key is printed once and works; an account disabled from the shell stops serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_and_revokes_keys_and_disables_accounts_through_the_api() {
    use keypool_tests::process::keypool_command;
    let h = two_accounts(Script::ok()).start().await;
    let url = h.base_url();
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            keypool_command(&args, &[("KEYPOOL_ADMIN_TOKEN", ADMIN_TOKEN)])
        })
    };
    let args = |list: &[&str]| -> Vec<String> {
        list.iter()
            .map(|s| (*s).to_owned())
            .chain(["--url".to_owned(), url.clone()])
            .collect()
    };
    let (code, out, err) = run(args(&["keys", "create", "erin", "--org", "acme"]))
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{out}{err}");
    let created: Value = serde_json::from_str(&out).unwrap();
    let key = created["key"].as_str().unwrap().to_owned();
    let send = |key: &str| {
        h.client()
            .post(h.messages_url())
            .api_key(key)
            .json(&message_body(MODEL, false))
            .send()
    };
    assert_eq!(send(&key).await.status, 200);
    let (code, out, _) = run(args(&["keys", "list"])).await.unwrap();
    assert_eq!(code, Some(0));
    assert!(out.contains("\"erin\"") && !out.contains(&key), "{out}");
    let (code, _, _) = run(args(&["keys", "revoke", "erin"])).await.unwrap();
    assert_eq!(code, Some(0));
    send(&key)
        .await
        .assert_keypool_error(401, "authentication_error");
    let (code, out, err) = run(args(&["accounts", "disable", "a", "--reason", "cli test"]))
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(h.send_message().await.status, 200);
    assert_eq!(h.upstream_order(), ["a", "b"]);
    // A refused change exits 1 with the answer.
    let (code, out, _) = run(args(&["keys", "revoke", "nobody"])).await.unwrap();
    assert_eq!(code, Some(1), "{out}");
    h.finish().await;
}
