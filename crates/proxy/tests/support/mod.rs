//! Test support: keypool-sim accounts, a config pointing at them, keypool on loopback.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use keypool_proxy::{App, run};
use keypool_sim::{Script, Sim, SimConfig, SimHandle};
use keypool_store::Store;
use keypool_store::config::Config;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The LB key every test uses (its hash is in the generated config).
pub const KEY: &str = "sk-lb-proxytest0123456789abcdefghijklmnopqrstuvwxyz";

/// One upstream account of a test.
pub struct TestAccount {
    pub id: &'static str,
    pub script: Script,
    /// Extra TOML lines for the `[[accounts]]` table (e.g. `model = "x"`).
    pub extra: &'static str,
    /// `base_url` variant: 0 = the sim's URL, 1 = the same with a trailing `/` (a
    /// different string, so hedge/race may pair them), 2 = `localhost`.
    pub url_variant: u8,
}

impl TestAccount {
    pub fn new(id: &'static str, script: Script) -> Self {
        Self {
            id,
            script,
            extra: "",
            url_variant: 0,
        }
    }
    pub fn extra(mut self, extra: &'static str) -> Self {
        self.extra = extra;
        self
    }
    pub fn url_variant(mut self, v: u8) -> Self {
        self.url_variant = v;
        self
    }
}

pub fn secret(id: &str) -> String {
    format!("sk-ant-api03-{id}-secret")
}

pub struct Harness {
    pub sim: SimHandle,
    pub addr: SocketAddr,
    pub store: Store,
    pub app: App,
    client: Client<HttpConnector, Full<Bytes>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), keypool_proxy::ProxyError>>>,
}

/// Starts the sim with `accounts`, writes a config with one org `acme`, one group
/// `pool` (strategy `strategy`) of those accounts behind URL config `team`, the test
/// key, and `[server]` lines `server`, then starts keypool.
pub async fn start(accounts: Vec<TestAccount>, strategy: &str, server: &str) -> Harness {
    let mut sim_config = SimConfig::new();
    for a in &accounts {
        sim_config = sim_config.account(a.id, secret(a.id), a.script.clone());
    }
    let sim = Sim::start(sim_config).await.unwrap();
    let base = sim.base_url();
    let mut toml = format!(
        "[server]\nstate_file = \"\"\nsnapshot_ttl_secs = 0\n{server}\n\n[[orgs]]\nslug = \"acme\"\n\n[[orgs]]\nslug = \"other\"\n\n"
    );
    let mut ids = Vec::new();
    for a in &accounts {
        let url = match a.url_variant {
            0 => base.clone(),
            1 => format!("{base}/"),
            _ => base.replace("127.0.0.1", "localhost"),
        };
        toml.push_str(&format!(
            "[[accounts]]\nid = \"{}\"\norg = \"acme\"\nprovider = \"anthropic\"\nauth = \"api_key\"\nsecret = \"{}\"\nbase_url = \"{url}\"\n{}\n\n",
            a.id,
            secret(a.id),
            a.extra
        ));
        ids.push(format!("\"{}\"", a.id));
    }
    toml.push_str(&format!(
        "[[groups]]\nid = \"pool\"\norg = \"acme\"\nstrategy = \"{strategy}\"\naccounts = [{}]\n\n",
        ids.join(", ")
    ));
    toml.push_str("[[urls]]\ncustom_url = \"team\"\norg = \"acme\"\ngroup = \"pool\"\n\n");
    // `shared` exists in two orgs: its legacy route is ambiguous.
    toml.push_str("[[urls]]\ncustom_url = \"shared\"\norg = \"acme\"\n\n[[urls]]\ncustom_url = \"shared\"\norg = \"other\"\n\n");
    let hash = keypool_store::keys::hash_key(KEY).to_hex();
    toml.push_str(&format!(
        "[[keys]]\nid = \"tester\"\norg = \"acme\"\nkind = \"user\"\nsha256 = \"{hash}\"\nurls = [\"*\"]\n"
    ));
    let config = Config::from_toml_str(&toml, None, &|_| None)
        .unwrap_or_else(|e| panic!("test config invalid: {e}\n{toml}"));
    let store = Store::open(config).await.unwrap();
    let app = App::new(store.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(run(listener, app.clone(), async {
        let _ = stopped.await;
    }));
    let client = Client::builder(TokioExecutor::new()).build_http();
    Harness {
        sim,
        addr,
        store,
        app,
        client,
        stop: Some(stop),
        task: Some(task),
    }
}

pub fn body(model: &str, stream: bool) -> String {
    format!(
        r#"{{"model":"{model}","max_tokens":64,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Harness {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn request(&self, method: &str, path: &str, body: &str) -> Request<Full<Bytes>> {
        Request::builder()
            .method(method)
            .uri(self.url(path))
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap()
    }

    pub async fn send_raw(&self, request: Request<Full<Bytes>>) -> Response<Incoming> {
        self.client.request(request).await.unwrap()
    }

    pub async fn send(&self, request: Request<Full<Bytes>>) -> Answer {
        let response = self.send_raw(request).await;
        let (parts, body) = response.into_parts();
        let body = tokio::time::timeout(Duration::from_secs(20), body.collect())
            .await
            .expect("body within 20 s")
            .unwrap()
            .to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub async fn post(&self, path: &str, body: &str) -> Answer {
        self.send(self.request("POST", path, body)).await
    }

    pub async fn messages(&self, stream: bool) -> Answer {
        self.post("/acme/team/v1/messages", &body("claude-test", stream))
            .await
    }

    pub fn requests(&self, id: &str) -> u64 {
        self.sim.stats(id).unwrap().requests
    }

    /// Signals keypool to shut down (graceful drain); [`Harness::finish`] waits for it.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Stops keypool (graceful) and checks the global invariant: no `sk-lb-` value ever
    /// reached the upstream.
    pub async fn finish(mut self) {
        assert!(
            self.sim.requests_containing(b"sk-lb-").is_empty(),
            "an LB key reached the upstream"
        );
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("keypool stops within 10 s")
                .unwrap()
                .unwrap();
        }
    }
}

/// The SSE frames of a stream body, as (event, raw) pairs.
pub fn frames(body: &[u8]) -> Vec<(String, Bytes)> {
    keypool_sse::decode_all(body)
        .unwrap()
        .into_iter()
        .map(|f| {
            (
                f.event().map(|e| e.into_owned()).unwrap_or_default(),
                f.raw().clone(),
            )
        })
        .collect()
}
