//! Redaction (SPEC 10, "no secret or LB key ever appears in a log, a metric or an
//! error"): end-to-end flows of every kind — successes, failovers through each failure
//! class, streams broken before and after their commit point, the generic 503, the 429
//! pass-through, refused keys, admin calls with right and wrong tokens, a valid and an
//! invalid reload — run with every log line of the process captured at `TRACE`. No
//! account secret, admin token, client OAuth token, LB key (nor its random part) and no
//! `sk-lb-` at all may appear in any log line, in `/metrics`, in any answer (headers and
//! body), in a reload error, or in the `Debug` of the configuration.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use keypool_sim::{Behaviour, Cut, ErrorReply, Script};
use keypool_store::keys::{LB_KEY_PREFIX, generate_lb_key};
use keypool_tests::{AccountSpec, Harness, KEY, LogLines, MODEL, Reply, message_body, secret_of};
use rand::SeedableRng;

const ADMIN_TOKEN: &str = "admin-token-redaction-5f1d0c9a7b3e";
const CLIENT_OAUTH: &str = "sk-ant-oat01-client-own-token-3c9e1f";

/// Everything a client, a scraper or an operator could see.
#[derive(Default)]
struct Seen(Vec<(String, String)>);

impl Seen {
    fn reply(&mut self, what: &str, r: &Reply) {
        let mut text = format!("{}\n", r.status);
        for (n, v) in &r.headers {
            text.push_str(&format!("{n}: {}\n", String::from_utf8_lossy(v.as_bytes())));
        }
        text.push_str(&String::from_utf8_lossy(&r.body));
        self.0.push((what.to_owned(), text));
    }

    fn text(&mut self, what: &str, text: String) {
        self.0.push((what.to_owned(), text));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_any_log_line_metric_error_body_or_debug() {
    let capture = LogLines::default();
    let writer = capture.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let h = Harness::builder()
        .server("first_frame_timeout_ms", "500")
        .server("upstream_timeout_secs", "1")
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
        .account(
            AccountSpec::new(
                "a",
                Script::ok()
                    .then(ErrorReply::rate_limited().retry_after_secs(1))
                    .then(Behaviour::status(529))
                    .then(Behaviour::in_band_error())
                    .then(Behaviour::Reset)
                    .then(Behaviour::StallBeforeHeaders(Duration::from_secs(3)))
                    .then(Behaviour::cut_after(1, Cut::Reset))
                    .then(Behaviour::status(401)),
            )
            .priority(0),
        )
        .account(
            AccountSpec::new(
                "b",
                Script::ok()
                    .then(Behaviour::StallBeforeFirstFrame(Duration::from_secs(2)))
                    .then(Behaviour::InBandError {
                        after_frames: 5,
                        spec: Default::default(),
                    })
                    .then(Behaviour::cut_after(5, Cut::Close)),
            )
            .provider("anthropic", "oauth")
            .priority(1),
        )
        .account(
            AccountSpec::new("c", Script::ok().then(Behaviour::status(402)))
                .provider("anthropic_compatible", "bearer")
                .url_label("compat")
                .priority(2),
        )
        .start()
        .await;
    let key = h.key(KEY);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let unknown_key = generate_lb_key(&mut rng).key;
    let mut seen = Seen::default();

    // Successes and failovers, streaming and not, with the key in each place it may be.
    for i in 0..16 {
        let stream = i % 2 == 1;
        let mut request = h
            .client()
            .post(h.messages_url())
            .json(&message_body(MODEL, stream));
        request = match i % 4 {
            0 => request.api_key(&key),
            1 => request.bearer(&key),
            2 => request.api_key(&key).header("x-forwarded-key", &key),
            _ => request
                .api_key(&key)
                .header("authorization", &format!("Bearer {CLIENT_OAUTH}")),
        };
        let r = request.send().await;
        seen.reply(&format!("request {i}"), &r);
    }
    // Refused keys.
    for (what, request) in [
        (
            "unknown key",
            h.client().post(h.messages_url()).api_key(&unknown_key),
        ),
        (
            "unknown bearer",
            h.client().post(h.messages_url()).bearer(&unknown_key),
        ),
        ("no key", h.client().post(h.messages_url())),
        (
            "client oauth only",
            h.client().post(h.messages_url()).bearer(CLIENT_OAUTH),
        ),
        (
            "key of another url",
            h.client()
                .post(h.url("/acme/nope/v1/messages"))
                .api_key(&key),
        ),
        (
            "unknown org",
            h.client()
                .post(h.url("/nope/team/v1/messages"))
                .api_key(&key),
        ),
    ] {
        let r = request.json(&message_body(MODEL, false)).send().await;
        assert!(
            (400..500).contains(&r.status.as_u16()),
            "{what}: {}",
            r.text()
        );
        seen.reply(what, &r);
    }
    // Bad bodies.
    let r = h.messages(&serde_json::json!({"no": "model"})).send().await;
    seen.reply("missing model", &r);
    // Every account failing: the generic 503, then the 429 and 402 pass-through.
    for id in ["a", "b", "c"] {
        h.store().clear_cooldown(&id.into());
        h.sim()
            .set_script(id, Script::new(Behaviour::status(529)))
            .unwrap();
    }
    h.store().reenable(&"a".into());
    let r = h.send_message().await;
    assert_eq!(r.status, 503, "{}", r.text());
    seen.reply("503", &r);
    for (id, status) in [("a", 429), ("b", 429), ("c", 402)] {
        h.store().clear_cooldown(&id.into());
        h.store().reenable(&id.into());
        h.sim()
            .set_script(id, Script::new(Behaviour::status(status)))
            .unwrap();
    }
    let r = h.send_stream().await;
    seen.reply("pass-through", &r);

    // Admin, with the right token, wrong ones and an LB key.
    for (what, token) in [
        ("admin", Some(ADMIN_TOKEN.to_owned())),
        ("admin wrong", Some(format!("{ADMIN_TOKEN}x"))),
        ("admin lb key", Some(key.clone())),
        ("admin none", None),
    ] {
        for (method, path) in [
            (http::Method::GET, "/admin/accounts"),
            (http::Method::GET, "/admin/accounts/a"),
            (http::Method::POST, "/admin/accounts/a/clear-cooldown"),
            (http::Method::POST, "/admin/accounts/a/enable"),
            (http::Method::POST, "/admin/reload"),
        ] {
            let mut request = h.client().request(method, h.url(path));
            if let Some(t) = &token {
                request = request.bearer(t);
            }
            let r = request.send().await;
            seen.reply(&format!("{what} {path}"), &r);
        }
    }
    let ui = h.get("/admin/ui").send().await;
    seen.reply("admin ui", &ui);

    // Reloads: an invalid file (errors are shown and logged), then a valid one.
    let dir = std::env::temp_dir().join(format!("keypool-redaction-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keypool.toml");
    let broken = h
        .toml()
        .replacen("priority = 0", "priority = \"zero\"", 1)
        .replacen("provider = \"anthropic\"", "provider = \"nope\"", 1);
    std::fs::write(&file, &broken).unwrap();
    let error = h.store().reload(&file).unwrap_err();
    tracing::error!(error = %error, "reload refused (as the binary logs it)");
    seen.text("reload error", format!("{error}\n{error:?}"));
    let _ = h.app().clone().with_config_path(&file);
    let r = h
        .client()
        .post(h.url("/admin/reload"))
        .bearer(ADMIN_TOKEN)
        .send()
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    seen.reply("admin reload invalid", &r);
    std::fs::write(&file, h.toml()).unwrap();
    h.store().reload(&file).unwrap();

    // What a scraper and a probe see, and the configuration's Debug.
    for path in ["/metrics", "/readyz", "/healthz"] {
        let r = h.get(path).send().await;
        assert_eq!(r.status, 200, "{path}");
        seen.reply(path, &r);
    }
    seen.text("config debug", format!("{:?}", h.store().config()));
    seen.text("store debug", format!("{:?}", h.store()));
    let request_id = r.header("x-request-id").unwrap_or_default().to_owned();
    std::fs::remove_dir_all(&dir).unwrap();
    h.finish().await;

    let logs = capture.text();
    seen.text("logs", logs.clone());
    // The capture works: every request logged its line, debug-level lines included.
    let first_request = seen.0[0].1.clone();
    let first_id = first_request
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .unwrap()
        .to_owned();
    assert!(
        logs.contains(&first_id),
        "the first request's log line was captured"
    );
    assert!(
        logs.lines().count() > 40,
        "{} log lines",
        logs.lines().count()
    );
    assert!(!request_id.is_empty());

    let mut forbidden: Vec<(String, String)> = ["a", "b", "c"]
        .iter()
        .map(|id| (format!("secret of {id}"), secret_of(id)))
        .collect();
    forbidden.push(("admin token".into(), ADMIN_TOKEN.into()));
    forbidden.push(("client OAuth token".into(), CLIENT_OAUTH.into()));
    forbidden.push(("LB key prefix".into(), LB_KEY_PREFIX.into()));
    for k in [&key, &unknown_key] {
        forbidden.push((
            "LB key random part".into(),
            k[LB_KEY_PREFIX.len()..].to_owned(),
        ));
    }
    for (what, text) in &seen.0 {
        for (name, secret) in &forbidden {
            if let Some(at) = text.find(secret.as_str()) {
                let start = text[..at].rfind('\n').map_or(0, |n| n + 1);
                let end = text[at..].find('\n').map_or(text.len(), |n| at + n);
                panic!("{name} appears in {what}: {}", &text[start..end]);
            }
        }
    }
    eprintln!(
        "redaction: {} log lines, {} answers and texts checked",
        logs.lines().count(),
        seen.0.len()
    );
}
