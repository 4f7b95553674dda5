//! SPEC 13, the config document in Redis (`config_store = "redis"`): two real `keypool`
//! processes on one real `redis-server`, each with its own local file (its `[server]`
//! table), serving the one document that `keypool config push` put there. A key
//! created on one replica authenticates on the other within a second, an account
//! disabled on one stops serving on the other, a restart serves the newest document, a
//! reload on one replica reloads both, and `keypool config pull` gives back the
//! document as written.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keypool_store::testing::RedisServer;
use keypool_tests::process::{KeypoolProcess, binary_config, free_port, keypool_command};
use keypool_tests::{AccountSpec, Harness, MODEL, Reply, message_body};
use serde_json::{Value, json};

const ADMIN_TOKEN: &str = "document-admin-token-0123456789";

/// The simulator and keys: two accounts, `one` first.
async fn pool() -> Harness {
    Harness::builder()
        .account(AccountSpec::new("one", keypool_sim::Script::ok()).priority(0))
        .account(AccountSpec::new("two", keypool_sim::Script::ok()).priority(1))
        .strategy("priority")
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
        .start()
        .await
}

/// A replica's local file: the harness's document listening on its own port, with the
/// document in Redis.
fn replica_file(h: &Harness, dir: &Path, name: &str, port: u16, redis: &str) -> PathBuf {
    let text = binary_config(h, port, &[]).replacen(
        "[server]\n",
        &format!("[server]\nredis_url = {redis:?}\nconfig_store = \"redis\"\n"),
        1,
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

struct Replicas {
    a: KeypoolProcess,
    b: KeypoolProcess,
    files: [PathBuf; 2],
    _dir: keypool_store::testing::TempDir,
}

/// Pushes replica A's file to Redis with the CLI and starts both replicas.
async fn replicas(h: &Harness, redis: &RedisServer) -> Replicas {
    let dir = keypool_store::testing::TempDir::new("document").unwrap();
    let (pa, pb) = (free_port(), free_port());
    let fa = replica_file(h, dir.path(), "a", pa, &redis.url());
    let fb = replica_file(h, dir.path(), "b", pb, &redis.url());
    let (code, out, err) = keypool_command(&["config", "push", fa.to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("pushed as version 1"), "{out}");
    let a = KeypoolProcess::start(&fa, pa).await;
    let b = KeypoolProcess::start(&fb, pb).await;
    Replicas {
        a,
        b,
        files: [fa, fb],
        _dir: dir,
    }
}

async fn admin(
    h: &Harness,
    k: &KeypoolProcess,
    method: http::Method,
    path: &str,
    body: Option<Value>,
) -> Reply {
    let mut r = h.client().request(method, k.url(path)).bearer(ADMIN_TOKEN);
    if let Some(body) = body {
        r = r.json(&body);
    }
    r.send().await
}

async fn send(h: &Harness, k: &KeypoolProcess, key: &str) -> Reply {
    h.client()
        .post(k.url("/acme/team/v1/messages"))
        .api_key(key)
        .json(&message_body(MODEL, false))
        .send()
        .await
}

/// Polls `check` every 20 ms until it holds; panics after `within`. Returns how long
/// it took.
async fn within<F, Fut>(within: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn document_version(overview: &Value) -> u64 {
    assert_eq!(overview["document"]["store"], "redis", "{overview}");
    overview["document"]["version"].as_u64().unwrap()
}

#[tokio::test]
async fn a_key_created_on_one_replica_authenticates_on_the_other_within_a_second() {
    let Some(redis) = RedisServer::start_or_skip("document_key") else {
        return;
    };
    let h = pool().await;
    let mut r = replicas(&h, &redis).await;
    let on_b = admin(&h, &r.b, http::Method::GET, "/admin/accounts", None).await;
    assert_eq!(document_version(&on_b.json()), 1);
    let created = admin(
        &h,
        &r.a,
        http::Method::POST,
        "/admin/keys",
        Some(json!({"id": "carol", "org": "acme", "urls": ["team"]})),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text());
    let key = created.json()["key"].as_str().unwrap().to_owned();
    assert_eq!(send(&h, &r.a, &key).await.status, 200);
    let took = within(
        Duration::from_secs(1),
        "the key authenticates on B",
        || async { send(&h, &r.b, &key).await.status == 200 },
    )
    .await;
    eprintln!("the key created on A served on B after {took:?}");
    let on_b = admin(&h, &r.b, http::Method::GET, "/admin/accounts", None).await;
    assert_eq!(document_version(&on_b.json()), 2);
    let metrics = h
        .client()
        .request(http::Method::GET, r.b.url("/metrics"))
        .send()
        .await
        .text();
    assert!(
        metrics.contains("keypool_config_document_version 2"),
        "{metrics}"
    );
    // The key lives in Redis's document, never in a file as a key (only its hash).
    let stored = redis
        .command("HGET keypool:{config}:document text")
        .unwrap();
    assert!(stored.contains("id = \"carol\"") && !stored.contains(&key));
    for file in &r.files {
        assert!(!std::fs::read_to_string(file).unwrap().contains("carol"));
    }
    // Each replica keeps a private copy of the document it serves (for a Redis that
    // lost its data, or does not answer at start).
    {
        use std::os::unix::fs::PermissionsExt as _;
        let copy = keypool_store::document::redis_copy_path(&r.files[1]);
        assert!(
            std::fs::read_to_string(&copy)
                .unwrap()
                .contains("id = \"carol\"")
        );
        let mode = std::fs::metadata(&copy).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // A restart of B serves the newest document (the key), not its local file.
    let _ = r.b.child.kill();
    let _ = r.b.child.wait();
    let port = r.b.port;
    r.b = KeypoolProcess::start(&r.files[1], port).await;
    assert_eq!(send(&h, &r.b, &key).await.status, 200);
    // Redis loses its data: the next replica to start gives it back the newest
    // document (its copy), not its older local file.
    assert!(redis.command("FLUSHALL").unwrap().starts_with("+OK"));
    let _ = r.b.child.kill();
    let _ = r.b.child.wait();
    r.b = KeypoolProcess::start(&r.files[1], port).await;
    assert_eq!(send(&h, &r.b, &key).await.status, 200);
    let stored = redis
        .command("HGET keypool:{config}:document text")
        .unwrap();
    assert!(stored.contains("id = \"carol\""), "{stored}");
    // Revoked on B: refused on A within a second.
    let revoked = admin(
        &h,
        &r.b,
        http::Method::POST,
        "/admin/keys/carol/revoke",
        None,
    )
    .await;
    assert_eq!(revoked.status, 200, "{}", revoked.text());
    within(
        Duration::from_secs(1),
        "the revoked key is refused on A",
        || async { send(&h, &r.a, &key).await.status == 401 },
    )
    .await;
    for k in [&r.a, &r.b] {
        assert!(!k.logs().contains(&key), "the key is in a log");
    }
}

#[tokio::test]
async fn an_account_disabled_on_one_replica_stops_serving_on_the_other() {
    let Some(redis) = RedisServer::start_or_skip("document_disable") else {
        return;
    };
    let h = pool().await;
    let r = replicas(&h, &redis).await;
    let key = h.key(keypool_tests::KEY);
    assert_eq!(send(&h, &r.a, &key).await.status, 200);
    assert_eq!(h.requests_per_account(&["one", "two"]), [1, 0]);
    // At runtime (state, shared through Redis's events).
    let off = admin(
        &h,
        &r.b,
        http::Method::POST,
        "/admin/accounts/one/disable",
        None,
    )
    .await;
    assert_eq!(off.status, 200, "{}", off.text());
    within(Duration::from_secs(1), "A sees `one` disabled", || async {
        let view = admin(&h, &r.a, http::Method::GET, "/admin/accounts/one", None).await;
        view.json()["state"] == "disabled"
    })
    .await;
    for _ in 0..3 {
        assert_eq!(send(&h, &r.a, &key).await.status, 200);
    }
    assert_eq!(h.requests_per_account(&["one", "two"]), [1, 3]);
    // In the document: `active = false` on B; A stops using `two` too.
    let on = admin(
        &h,
        &r.b,
        http::Method::POST,
        "/admin/accounts/one/enable",
        None,
    )
    .await;
    assert_eq!(on.status, 200, "{}", on.text());
    let patch = admin(
        &h,
        &r.b,
        http::Method::PATCH,
        "/admin/accounts/two",
        Some(json!({"active": false})),
    )
    .await;
    assert_eq!(patch.status, 200, "{}", patch.text());
    within(
        Duration::from_secs(1),
        "A serves the document without `two`",
        || async {
            let view = admin(&h, &r.a, http::Method::GET, "/admin/accounts/two", None).await;
            view.json()["active_in_config"] == false
        },
    )
    .await;
    within(
        Duration::from_secs(1),
        "A serves from `one` again",
        || async {
            send(&h, &r.a, &key).await.status == 200
                && h.requests_per_account(&["one", "two"])[0] > 1
        },
    )
    .await;
    assert_eq!(h.requests_per_account(&["one", "two"])[1], 3);
}

#[tokio::test]
async fn a_reload_on_one_replica_reloads_every_replica() {
    let Some(redis) = RedisServer::start_or_skip("document_reload") else {
        return;
    };
    let h = pool().await;
    let r = replicas(&h, &redis).await;
    // An operator writes the document by hand, without a new version (so that the
    // replicas' periodic version check does not see it): only a reload brings it.
    let pulled = keypool_command(
        &["config", "pull", "--config", r.files[0].to_str().unwrap()],
        &[],
    );
    assert_eq!(pulled.0, Some(0), "{}", pulled.2);
    let edited = pulled.1.replace(
        "[[accounts]]\nid = \"two\"",
        "[[accounts]]\nid = \"two\"\nactive = false",
    );
    assert_ne!(edited, pulled.1);
    let reply = redis
        .command_args(&["HSET", "keypool:{config}:document", "text", &edited])
        .unwrap();
    assert!(reply.starts_with(':'), "{reply}");
    let reload = admin(&h, &r.a, http::Method::POST, "/admin/reload", None).await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    assert_eq!(reload.json()["document"]["store"], "redis");
    within(Duration::from_secs(1), "B reloads too", || async {
        let view = admin(&h, &r.b, http::Method::GET, "/admin/accounts/two", None).await;
        view.json()["active_in_config"] == false
    })
    .await;
    // An invalid document is refused on reload with its located problems; both keep
    // serving the previous one.
    let broken = edited.replace("priority = 1", "priority = \"high\"");
    redis
        .command_args(&["HSET", "keypool:{config}:document", "text", &broken])
        .unwrap();
    let refused = admin(&h, &r.a, http::Method::POST, "/admin/reload", None).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    let problems = refused.json()["problems"].to_string();
    assert!(problems.contains("accounts[1].priority"), "{problems}");
    assert_eq!(send(&h, &r.b, &h.key(keypool_tests::KEY)).await.status, 200);
}

#[tokio::test]
async fn push_validates_and_pull_gives_the_document_back_as_written() {
    let Some(redis) = RedisServer::start_or_skip("document_push_pull") else {
        return;
    };
    let dir = keypool_store::testing::TempDir::new("document-cli").unwrap();
    let example = keypool_tests::workspace_root().join("examples/keypool.toml");
    let text = std::fs::read_to_string(&example).unwrap();
    let url = redis.url();
    let env = [
        ("KEYPOOL_ADMIN_TOKEN", "document-cli-admin-token"),
        ("ACME_OAUTH_1", "sk-ant-oat01-x"),
        ("ACME_API_1", "sk-ant-api03-y"),
    ];
    let (code, out, err) = keypool_command(
        &["config", "push", example.to_str().unwrap(), "--redis", &url],
        &env,
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let out_file = dir.path().join("pulled.toml");
    let (code, _, err) = keypool_command(
        &[
            "config",
            "pull",
            "--redis",
            &url,
            "--out",
            out_file.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        std::fs::read_to_string(&out_file).unwrap(),
        text,
        "byte-identical"
    );
    // An invalid file is refused with its located problems; Redis keeps version 1.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, text.replacen("\nweight = 3", "\nweight = -3", 1)).unwrap();
    let (code, _, err) = keypool_command(
        &["config", "push", bad.to_str().unwrap(), "--redis", &url],
        &env,
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("accounts[1].weight"), "{err}");
    let version = redis
        .command("HGET keypool:{config}:document version")
        .unwrap();
    assert!(version.contains("\r\n1\r\n"), "{version}");
    // Nothing there: pull says so.
    let empty = RedisServer::start_or_skip("document_empty").unwrap();
    let (code, _, err) = keypool_command(&["config", "pull", "--redis", &empty.url()], &[]);
    assert_eq!(code, Some(1));
    assert!(err.contains("keypool config push"), "{err}");
}
