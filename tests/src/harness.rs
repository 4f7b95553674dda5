//! [`Harness`]: `keypool-sim` with N scripted accounts, a keypool configuration built
//! from TOML text that points every account at the simulator, and the proxy serving it
//! on `127.0.0.1:0`.
//!
//! Every harness checks on [`Harness::finish`] (and, as a backstop, when dropped) that
//! the simulated upstream never received any `sk-lb-` value, nor the random part of any
//! LB key of the test: SPEC 3.4, asserted for every test for free.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use keypool_core::AccountId;
use keypool_proxy::{App, ProxyError};
use keypool_sim::{Script, Sim, SimConfig, SimHandle};
use keypool_store::config::Config;
use keypool_store::keys::{LB_KEY_PREFIX, generate_lb_key};
use keypool_store::{Store, now_ms};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::client::{Client, Reply, RequestBuilder, message_body};

/// The org every harness declares.
pub const ORG: &str = "acme";
/// The URL config every harness declares (the pool of its accounts).
pub const URL: &str = "team";
/// The LB key every harness declares: user key of [`ORG`], all URLs.
pub const KEY: &str = "alice";
/// The model tests ask for.
pub const MODEL: &str = "claude-sonnet-4-5";

/// The upstream secret the harness gives account `id` (the simulator identifies the
/// account by it).
pub fn secret_of(id: &str) -> String {
    format!("sk-ant-api03-sim-{id}")
}

/// One account of the pool.
#[derive(Debug, Clone)]
pub struct AccountSpec {
    id: String,
    script: Script,
    priority: i32,
    url_label: Option<String>,
    base_url: Option<String>,
    in_pool: bool,
    provider: &'static str,
    auth: &'static str,
    extra: Vec<String>,
}

impl AccountSpec {
    /// An account `id` following `script`, at priority 0, on the simulator's base URL.
    pub fn new(id: &str, script: Script) -> Self {
        Self {
            id: id.to_owned(),
            script,
            priority: 0,
            url_label: None,
            base_url: None,
            in_pool: true,
            provider: "anthropic",
            auth: "api_key",
            extra: Vec::new(),
        }
    }

    /// Sets `provider` and `auth` (default `anthropic` / `api_key`), e.g.
    /// `("anthropic", "oauth")` or `("anthropic_compatible", "bearer")`.
    pub fn provider(mut self, provider: &'static str, auth: &'static str) -> Self {
        self.provider = provider;
        self.auth = auth;
        self
    }

    /// Sets `priority` (lower goes first).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Gives the account the base URL `<sim>/<label>`: a different `base_url` string
    /// (a hedge/race partner) served by the same simulator.
    pub fn url_label(mut self, label: &str) -> Self {
        self.url_label = Some(label.to_owned());
        self
    }

    /// Points the account at another upstream than the simulator (e.g. a
    /// [`FakeUpstream`](crate::fake_upstream::FakeUpstream)); `{sim_port}` in `url` is
    /// replaced by the simulator's port (a host name only a test proxy resolves).
    pub fn base_url(mut self, url: &str) -> Self {
        self.base_url = Some(url.to_owned());
        self
    }

    /// Keeps the account out of the harness's `pool` group: it is declared (and
    /// simulated) for a group of the test's own, written with `extra_toml`.
    pub fn outside_pool(mut self) -> Self {
        self.in_pool = false;
        self
    }

    /// Sets the account's `model` override.
    pub fn model(self, model: &str) -> Self {
        self.toml(&format!("model = {}", toml_str(model)))
    }

    /// Adds one raw TOML line to the account's table.
    pub fn toml(mut self, line: &str) -> Self {
        self.extra.push(line.to_owned());
        self
    }
}

/// Builds a [`Harness`].
#[derive(Debug, Clone)]
pub struct HarnessBuilder {
    accounts: Vec<AccountSpec>,
    server: BTreeMap<String, String>,
    cooldown: Vec<String>,
    strategy: Option<String>,
    extra: String,
    extra_keys: Vec<(String, String, String)>,
    org_lines: Vec<String>,
    /// Serve from a config file (so that the admin API can change it).
    config_file: bool,
    seed: u64,
    workers: Option<usize>,
    listeners: ListenerSpec,
}

/// How the harness listens beyond its plain public listener (issue 21).
#[derive(Debug, Clone, Default)]
struct ListenerSpec {
    tls: Option<keypool_proxy::TlsCertificates>,
    admin: bool,
}

impl Default for HarnessBuilder {
    fn default() -> Self {
        let server = [
            // memory only: tests never write a state file
            ("state_file", "\"\""),
            // the snapshot follows every change at once (plan order is deterministic)
            ("snapshot_ttl_secs", "0"),
            ("shutdown_grace_secs", "1"),
            // bounded waits: a hanging attempt fails the test quickly
            ("upstream_timeout_secs", "10"),
            ("first_frame_timeout_ms", "5000"),
            ("stream_idle_timeout_secs", "10"),
            // hedge/race are never refused for budget in tests that want them
            ("hedge_budget", "1.0"),
        ];
        Self {
            accounts: Vec::new(),
            server: server
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            cooldown: Vec::new(),
            strategy: Some("priority".to_owned()),
            extra: String::new(),
            extra_keys: Vec::new(),
            org_lines: Vec::new(),
            config_file: false,
            seed: 0x6b65_7970_6f6f_6c00,
            workers: None,
            listeners: ListenerSpec::default(),
        }
    }
}

impl HarnessBuilder {
    /// Adds an account.
    pub fn account(mut self, spec: AccountSpec) -> Self {
        self.accounts.push(spec);
        self
    }

    /// Adds a healthy account (`Script::ok()`) for each of `ids`, all at priority 0
    /// (their order is the strategy's).
    pub fn healthy_accounts(mut self, ids: &[&str]) -> Self {
        for id in ids {
            self = self.account(AccountSpec::new(id, Script::ok()));
        }
        self
    }

    /// Adds `accounts` in plan order: priorities 0, 1, 2, … in the order given (with
    /// the default `priority` strategy each is tried after the one before).
    pub fn accounts<'a>(mut self, accounts: impl IntoIterator<Item = (&'a str, Script)>) -> Self {
        for (i, (id, script)) in accounts.into_iter().enumerate() {
            let priority = i32::try_from(i).expect("fewer than 2^31 accounts");
            self = self.account(AccountSpec::new(id, script).priority(priority));
        }
        self
    }

    /// Sets a `[server]` option (raw TOML value), replacing the harness default.
    pub fn server(mut self, option: &str, value: &str) -> Self {
        self.server.insert(option.to_owned(), value.to_owned());
        self
    }

    /// Adds one raw line to a `[cooldown]` table.
    pub fn cooldown(mut self, line: &str) -> Self {
        self.cooldown.push(line.to_owned());
        self
    }

    /// The pool's strategy (default `priority`, so that the plan follows priorities).
    pub fn strategy(mut self, strategy: &str) -> Self {
        self.strategy = Some(strategy.to_owned());
        self
    }

    /// No group: the URL config uses the org's whole pool (default strategy).
    pub fn no_group(mut self) -> Self {
        self.strategy = None;
        self
    }

    /// Appends raw TOML (more orgs, URL configs, …). `{sim}` is replaced by the
    /// simulator's base URL.
    pub fn extra_toml(mut self, toml: &str) -> Self {
        self.extra.push_str(toml);
        self.extra.push('\n');
        self
    }

    /// Serves from a config file in a fresh folder ([`Harness::config_path`]), as
    /// `keypool serve --config` does: the admin API's changes rewrite it.
    pub fn config_file(mut self) -> Self {
        self.config_file = true;
        self
    }

    /// Adds one raw line to the harness org's `[[orgs]]` table (e.g. its `limits`).
    pub fn org_line(mut self, line: &str) -> Self {
        self.org_lines.push(line.to_owned());
        self
    }

    /// Declares another LB key `id` of `org` seeing `urls` (a TOML array), with extra
    /// TOML lines (e.g. `revoked = true`). Its plaintext is [`Harness::key`]`(id)`.
    pub fn key(mut self, id: &str, org: &str, lines: &str) -> Self {
        self.extra_keys
            .push((id.to_owned(), org.to_owned(), lines.to_owned()));
        self
    }

    /// Serves with [`keypool_proxy::run_workers`] on `n` worker threads (as `keypool
    /// serve` does) instead of [`keypool_proxy::run`] on the test's runtime.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n);
        self
    }

    /// Terminates TLS on the public listener with `tls` ([`Harness::base_url`] is
    /// then `https://localhost:<port>`).
    pub fn tls(mut self, tls: keypool_proxy::TlsCertificates) -> Self {
        self.listeners.tls = Some(tls);
        self
    }

    /// Also listens on an admin listener ([`Harness::admin_url`]), with `admin_listen`
    /// in the configuration, so that `/admin` and `/metrics` are served only there.
    pub fn admin_listener(mut self) -> Self {
        self.listeners.admin = true;
        // a placeholder address: the harness binds its own port; the configuration
        // only has to say that an admin listener exists
        self.server
            .insert("admin_listen".to_owned(), "\"127.0.0.1:1\"".to_owned());
        self
    }

    /// The seed of the LB keys' generation.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Starts the simulator, builds and validates the configuration, opens the store and
    /// serves the proxy on `127.0.0.1:0`.
    ///
    /// # Panics
    /// If anything fails to start or the configuration is refused (with its errors).
    pub async fn start(self) -> Harness {
        let mut sim_config = SimConfig::new().seed(self.seed);
        for a in &self.accounts {
            sim_config = sim_config.account(a.id.as_str(), secret_of(&a.id), a.script.clone());
        }
        let sim = Sim::start(sim_config).await.expect("simulator starts");
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut keys = BTreeMap::new();
        let toml = self.render(&sim.base_url(), &mut rng, &mut keys);
        let config = Config::from_toml_str(&toml, None, &|_| None)
            .unwrap_or_else(|e| panic!("harness config refused: {e}\n{toml}"));
        let store = Store::open(config).await.expect("store opens");
        let mut app = App::new(store.clone());
        let mut config_dir = None;
        if self.config_file {
            let dir = keypool_store::testing::TempDir::new("harness-config").expect("a temp dir");
            let path = dir.path().join("keypool.toml");
            std::fs::write(&path, &toml).expect("the config file is written");
            app = app.with_config_path(path);
            config_dir = Some(dir);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let mut listeners = keypool_proxy::Listeners::new(listener);
        let mut admin_addr = None;
        if self.listeners.admin {
            let admin = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind the admin listener");
            admin_addr = Some(admin.local_addr().expect("admin addr"));
            listeners = listeners.with_admin(admin);
        }
        if let Some(tls) = &self.listeners.tls {
            listeners = listeners.with_tls(tls.clone());
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let stopped = async move {
            let _ = stopped.await;
        };
        let server = match self.workers {
            None => tokio::spawn(keypool_proxy::run(listeners, app.clone(), stopped)),
            Some(n) => tokio::spawn(keypool_proxy::run_workers(
                listeners,
                app.clone(),
                n,
                stopped,
            )),
        };
        Harness {
            sim: Some(sim),
            store,
            app,
            addr,
            stop: Some(stop),
            server: Some(server),
            keys: Arc::new(keys),
            client: Client::new(),
            toml,
            admin_addr,
            tls: self.listeners.tls.is_some(),
            config_dir,
        }
    }

    fn render(
        &self,
        sim_url: &str,
        rng: &mut StdRng,
        keys: &mut BTreeMap<String, String>,
    ) -> String {
        use std::fmt::Write as _;
        let mut t = String::from("[server]\n");
        for (k, v) in &self.server {
            let _ = writeln!(t, "{k} = {v}");
        }
        if !self.cooldown.is_empty() {
            t.push_str("\n[cooldown]\n");
            for line in &self.cooldown {
                let _ = writeln!(t, "{line}");
            }
        }
        let _ = writeln!(t, "\n[[orgs]]\nslug = \"{ORG}\"");
        for line in &self.org_lines {
            let _ = writeln!(t, "{line}");
        }
        for a in &self.accounts {
            let base = match (&a.base_url, &a.url_label) {
                (Some(url), _) => {
                    url.replace("{sim_port}", sim_url.rsplit(':').next().unwrap_or(""))
                }
                (None, Some(label)) => format!("{sim_url}/{label}"),
                (None, None) => sim_url.to_owned(),
            };
            let _ = writeln!(
                t,
                "\n[[accounts]]\nid = {}\norg = \"{ORG}\"\nprovider = {}\n\
                 auth = {}\nsecret = {}\nbase_url = {}\npriority = {}",
                toml_str(&a.id),
                toml_str(a.provider),
                toml_str(a.auth),
                toml_str(&secret_of(&a.id)),
                toml_str(&base),
                a.priority
            );
            for line in &a.extra {
                let _ = writeln!(t, "{line}");
            }
        }
        match &self.strategy {
            Some(strategy) => {
                let ids: Vec<String> = self
                    .accounts
                    .iter()
                    .filter(|a| a.in_pool)
                    .map(|a| toml_str(&a.id))
                    .collect();
                let _ = writeln!(
                    t,
                    "\n[[groups]]\nid = \"pool\"\norg = \"{ORG}\"\nstrategy = {}\naccounts = [{}]\n\
                     \n[[urls]]\ncustom_url = \"{URL}\"\norg = \"{ORG}\"\ngroup = \"pool\"",
                    toml_str(strategy),
                    ids.join(", ")
                );
            }
            None => {
                let _ = writeln!(t, "\n[[urls]]\ncustom_url = \"{URL}\"\norg = \"{ORG}\"");
            }
        }
        let mut declare = |t: &mut String, id: &str, org: &str, lines: &str| {
            let generated = generate_lb_key(rng);
            // A user key unless the lines say otherwise.
            let kind = if lines.contains("kind =") {
                ""
            } else {
                "kind = \"user\"\n"
            };
            let _ = writeln!(
                t,
                "\n[[keys]]\nid = {}\norg = {}\n{kind}{}\n{lines}",
                toml_str(id),
                toml_str(org),
                generated.config_line()
            );
            keys.insert(id.to_owned(), generated.key);
        };
        declare(&mut t, KEY, ORG, "urls = [\"*\"]");
        for (id, org, lines) in &self.extra_keys {
            declare(&mut t, id, org, lines);
        }
        t.push('\n');
        t.push_str(&self.extra.replace("{sim}", sim_url));
        t
    }
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    format!("{s:?}")
}

/// keypool in front of `keypool-sim`, started by [`Harness::builder`].
pub struct Harness {
    sim: Option<SimHandle>,
    store: Store,
    app: App,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), ProxyError>>>,
    keys: Arc<BTreeMap<String, String>>,
    client: Client,
    toml: String,
    admin_addr: Option<SocketAddr>,
    tls: bool,
    /// The folder of the config file, with [`HarnessBuilder::config_file`].
    config_dir: Option<keypool_store::testing::TempDir>,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Harness {
    /// A builder with the harness defaults (one org `acme`, URL config `team`, key
    /// `alice`, `priority` strategy, memory-only state, short timeouts).
    pub fn builder() -> HarnessBuilder {
        HarnessBuilder::default()
    }

    /// A harness with `accounts` (priorities in the given order: 0, 1, 2, …).
    pub async fn with_accounts(accounts: impl IntoIterator<Item = (&str, Script)>) -> Self {
        Self::builder().accounts(accounts).start().await
    }

    /// The config file, with [`HarnessBuilder::config_file`].
    pub fn config_path(&self) -> Option<std::path::PathBuf> {
        self.config_dir
            .as_ref()
            .map(|d| d.path().join("keypool.toml"))
    }

    /// The simulator.
    pub fn sim(&self) -> &SimHandle {
        self.sim.as_ref().expect("simulator running")
    }

    /// The store the proxy serves (configuration and runtime state).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The proxy application (metrics).
    pub fn app(&self) -> &App {
        &self.app
    }

    /// The configuration text the harness built (for failure messages).
    pub fn toml(&self) -> &str {
        &self.toml
    }

    /// `http://127.0.0.1:<port>`, keypool's base URL (`https://localhost:<port>` with
    /// [`HarnessBuilder::tls`]).
    pub fn base_url(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.addr.port())
        } else {
            format!("http://{}", self.addr)
        }
    }

    /// The public listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener's URL for `path`.
    ///
    /// # Panics
    /// Without [`HarnessBuilder::admin_listener`].
    pub fn admin_url(&self, path: &str) -> String {
        let addr = self.admin_addr.expect("the harness has no admin listener");
        format!("http://{addr}{path}")
    }

    /// keypool's URL for `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// The org-scoped base URL of the default pool: `http://…/acme/team` (an SDK's
    /// `base_url`).
    pub fn pool_base_url(&self) -> String {
        self.url(&format!("/{ORG}/{URL}"))
    }

    /// The Messages URL of the default pool.
    pub fn messages_url(&self) -> String {
        format!("{}/v1/messages", self.pool_base_url())
    }

    /// The plaintext of LB key `id`.
    ///
    /// # Panics
    /// If no such key was declared.
    pub fn key(&self, id: &str) -> String {
        self.keys
            .get(id)
            .unwrap_or_else(|| panic!("no LB key {id:?} in this harness"))
            .clone()
    }

    /// The HTTP client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// `GET path` (which starts with `/`), not yet sent (add `.bearer(…)` for the admin
    /// API).
    pub fn get(&self, path: &str) -> RequestBuilder {
        self.client.request(http::Method::GET, self.url(path))
    }

    /// The text of `GET /metrics` (on the admin listener when there is one).
    pub async fn metrics(&self) -> String {
        let url = match self.admin_addr {
            Some(_) => self.admin_url("/metrics"),
            None => self.url("/metrics"),
        };
        self.client
            .request(http::Method::GET, url)
            .send()
            .await
            .text()
    }

    /// `POST /acme/team/v1/messages` with key `alice` and `body`, not yet sent.
    pub fn messages(&self, body: &Value) -> RequestBuilder {
        self.client
            .post(self.messages_url())
            .api_key(&self.key(KEY))
            .json(body)
    }

    /// `POST path` (which starts with `/`) with the default non-streaming message body
    /// and no key, not yet sent: for other routes and keys than [`Harness::messages`]'
    /// (add `.api_key(…)` or `.bearer(…)`).
    pub fn post_message(&self, path: &str) -> RequestBuilder {
        self.client
            .post(self.url(path))
            .json(&message_body(MODEL, false))
    }

    /// Sends a default non-streaming message through the pool.
    pub async fn send_message(&self) -> Reply {
        self.messages(&message_body(MODEL, false)).send().await
    }

    /// Sends a default streaming message through the pool and reads it to the end.
    pub async fn send_stream(&self) -> Reply {
        self.messages(&message_body(MODEL, true)).send().await
    }

    /// Answers `request` in process with [`App::handle`] (no socket, no HTTP client):
    /// for property tests that send many inputs, some of which an HTTP client would
    /// refuse to write. `request`'s URI is a path (`/acme/team/v1/messages`).
    pub async fn handle(&self, request: http::Request<Full<Bytes>>) -> Reply {
        let (parts, body) = self.app.handle(request).await.into_parts();
        let Ok(body) = body.collect().await;
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.to_bytes(),
        }
    }

    /// How many requests the simulator received, per account id, in the order given.
    pub fn requests_per_account(&self, ids: &[&str]) -> Vec<u64> {
        ids.iter()
            .map(|id| self.sim().stats(id).expect("known sim account").requests)
            .collect()
    }

    /// The ids of the accounts the simulator saw, in arrival order.
    pub fn upstream_order(&self) -> Vec<String> {
        self.sim()
            .requests()
            .iter()
            .map(|r| {
                r.account
                    .as_ref()
                    .map_or_else(|| "<unknown>".to_owned(), |a| a.as_str().to_owned())
            })
            .collect()
    }

    /// Waits (at most `within`) until `condition` holds on the simulator.
    ///
    /// # Panics
    /// If it does not hold in time.
    pub async fn wait_until(
        &self,
        what: &str,
        within: Duration,
        condition: impl FnMut(&SimHandle) -> bool,
    ) {
        tokio::time::timeout(within, self.sim().wait_until(condition))
            .await
            .unwrap_or_else(|_| panic!("{what}: not within {within:?}"));
    }

    /// The cooldown entry of `account`, when it has one that is still running.
    pub fn cooldown(&self, account: &str) -> Option<keypool_cooldown::CooldownEntry> {
        let id = AccountId::from(account);
        let now = now_ms();
        self.store
            .health()
            .cooldowns
            .cooldown_until(&id, now)
            .and_then(|_| self.store.health().cooldowns.entry(&id))
    }

    /// Asserts SPEC 3.4 on everything the simulator received: no `sk-lb-` anywhere (path,
    /// headers, body), nor the random part of any LB key of this harness.
    ///
    /// # Panics
    /// When something of an LB key reached the upstream.
    pub fn assert_no_lb_key_upstream(&self) {
        let Some(sim) = self.sim.as_ref() else { return };
        let leaked = sim.requests_containing(LB_KEY_PREFIX.as_bytes());
        assert!(
            leaked.is_empty(),
            "the upstream received an sk-lb- value in {} request(s), first: {:?}",
            leaked.len(),
            leaked
                .first()
                .map(|r| (&r.path_and_query, r.account.clone()))
        );
        for (id, key) in self.keys.iter() {
            let random = &key[LB_KEY_PREFIX.len()..];
            assert!(
                sim.requests_containing(random.as_bytes()).is_empty(),
                "the upstream received the random part of LB key {id}"
            );
        }
    }

    /// Tells the proxy to shut down (stop accepting, drain what is in flight) without
    /// waiting; [`Harness::finish`] waits for it.
    pub fn begin_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Waits (at most 10 s) until the proxy's server task returned after
    /// [`Harness::begin_shutdown`].
    ///
    /// # Panics
    /// When it does not return in time, panicked, or returned an error.
    pub async fn wait_proxy_stopped(&mut self) {
        if let Some(server) = self.server.take() {
            let result = tokio::time::timeout(Duration::from_secs(10), server)
                .await
                .expect("keypool drains within 10 s");
            result
                .expect("keypool's server task did not panic")
                .expect("keypool's server ended cleanly");
        }
    }

    /// Stops the proxy (graceful drain) and the simulator, after checking that no LB key
    /// reached the upstream.
    ///
    /// # Panics
    /// When an LB key leaked, or the proxy's server task failed.
    pub async fn finish(mut self) {
        self.assert_no_lb_key_upstream();
        self.begin_shutdown();
        self.wait_proxy_stopped().await;
        if let Some(sim) = self.sim.take() {
            sim.shutdown().await;
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.assert_no_lb_key_upstream();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
