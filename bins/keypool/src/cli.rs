//! The commands: `serve`, `check-config`, `probe`, `keygen`, `keys`, `accounts`, `demo`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use keypool_proxy::{App, Listeners, TlsCertificates, run_workers, signals};
use keypool_store::config::Config;
use keypool_store::{BootState, Store, StoreError};
use rand::SeedableRng;

/// `--version`: the crate version and the git commit it was built from (`unknown`
/// outside a git checkout without `KEYPOOL_GIT_COMMIT`; see `build.rs`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KEYPOOL_GIT_COMMIT"),
    ")"
);

/// Success.
pub const EXIT_OK: u8 = 0;
/// The configuration is invalid or unreadable (every problem is printed), or the state
/// file it names could not be written at shutdown.
pub const EXIT_CONFIG: u8 = 1;
/// The server could not start or failed while running (e.g. the address is in use).
pub const EXIT_RUNTIME: u8 = 3;

const EXIT_CODES: &str = "\
Exit codes:
  0  success (serve: stopped by SIGTERM/SIGINT after draining; check-config: valid)
  1  the configuration file is invalid or unreadable; every problem is printed
     (serve: or the state file it names could not be written at shutdown)
  2  command-line usage error
  3  the server could not start or failed (address in use, signal handlers, ...)";

/// keypool: a load balancer for LLM provider credentials.
///
/// Clients send their own `sk-lb-…` key to keypool instead of the provider; keypool
/// picks an upstream account out of the organisation's pool, fails over when one is
/// rate-limited, exhausted or broken, and streams the answer back untouched.
#[derive(Debug, Parser)]
#[command(name = "keypool", version = VERSION, after_help = EXIT_CODES)]
pub struct Cli {
    /// Log format on stderr: `human` (one readable line per event) or `json` (one JSON
    /// object per line). The level comes from `RUST_LOG` (default `info`; `warn` for `demo`).
    #[arg(long, value_enum, default_value_t = LogFormat::Human, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy: load and validate the config, restore runtime state (state file or
    /// Redis), listen on `server.listen` (`KEYPOOL_LISTEN` overrides).
    ///
    /// SIGHUP reloads the config file (an invalid file is rejected, its problems logged,
    /// and the old config keeps serving). SIGTERM or SIGINT stop accepting, let requests
    /// and streams in flight finish for up to `server.shutdown_grace_secs`, save the
    /// runtime state and exit 0 (1 when the state file cannot be written).
    #[command(after_help = EXIT_CODES)]
    Serve {
        /// The configuration file (TOML).
        #[arg(long, short = 'c', value_name = "FILE", default_value = "keypool.toml")]
        config: PathBuf,
    },
    /// Validate a configuration file without starting anything: prints every problem
    /// with its location (`accounts[2].weight: …`) and exits 1, or prints a summary and
    /// exits 0. Secrets written as `$NAME` are read from the environment, as `serve`
    /// would; their values are never printed.
    #[command(name = "check-config", after_help = EXIT_CODES)]
    CheckConfig {
        /// The configuration file (TOML).
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Ask a running keypool whether it is ready: `GET /readyz` over plain HTTP, exit 0
    /// on 200 and 1 otherwise, the answer on stdout. The container image's health check.
    /// The address comes from the URL, else from the config file (the admin listener
    /// when it has one, else `listen`; 0.0.0.0 becomes 127.0.0.1), else
    /// http://127.0.0.1:8080/readyz.
    Probe {
        /// The configuration file whose listener to ask (`KEYPOOL_LISTEN` and
        /// `KEYPOOL_ADMIN_LISTEN` apply; secrets are not needed).
        #[arg(long, short = 'c', value_name = "FILE")]
        config: Option<PathBuf>,
        /// Probe `/healthz` (the process serves) instead of `/readyz`.
        #[arg(long)]
        live: bool,
        /// The URL to ask instead (`http://host:port/path`).
        #[arg(value_name = "URL")]
        url: Option<String>,
    },
    /// Generate a new LB key for a caller. Prints two lines on stdout: the key
    /// (`sk-lb-…`, give it to the caller once; keypool never stores it) and the
    /// `sha256 = "…"` line to paste into a `[[keys]]` table of the config.
    Keygen,
    /// Create, list or revoke LB keys of a running keypool through its admin API
    /// (`KEYPOOL_ADMIN_TOKEN`); `create` prints the new key once.
    Keys {
        #[command(subcommand)]
        action: crate::remote::KeysAction,
        #[command(flatten)]
        target: crate::remote::Target,
    },
    /// Add, disable or enable accounts of a running keypool through its admin API
    /// (`KEYPOOL_ADMIN_TOKEN`).
    Accounts {
        #[command(subcommand)]
        action: crate::remote::AccountsAction,
        #[command(flatten)]
        target: crate::remote::Target,
    },
    /// Log a subscription (OAuth) account in through a running keypool's admin API
    /// (`KEYPOOL_ADMIN_TOKEN`): `login ID [--org ORG]`.
    Oauth {
        #[command(subcommand)]
        action: crate::remote::OAuthAction,
        #[command(flatten)]
        target: crate::remote::Target,
    },
    /// Move the config document between a file and Redis (`config_store = "redis"`):
    /// `push FILE` validates and saves it, `pull` prints it.
    Config {
        #[command(subcommand)]
        action: crate::document::ConfigAction,
    },
    /// Explain a route without calling any upstream (issue 24): `explain --org O --url U
    /// --key-id K --model M` prints (JSON) the `[[models]]` resolution, every account of
    /// the pool with the filter that kept or dropped it, the strategy's order and the
    /// hedge/race gate's decision, from the state a running keypool left (its state file
    /// or Redis). For a running keypool's live memory use `GET /admin/explain`.
    Route {
        #[command(subcommand)]
        action: RouteAction,
    },
    /// A self-contained demo: six simulated accounts (fast, slow, flaky with 529s,
    /// rate-limited with retry-after, one with an exhausted 5-hour window, one revoked),
    /// keypool in front of them on 127.0.0.1 with an embedded config (memory state, no
    /// file written), and traffic through it. Shows a live table on stderr, then a
    /// summary: success rate, attempts per request, who served what, which accounts are
    /// out of rotation and why, TTFT p50/p99.
    Demo {
        /// How long traffic runs (`20s`, `1500ms`, `2m`).
        #[arg(long, default_value = "20s", value_parser = crate::demo::parse_duration)]
        duration: std::time::Duration,
        /// Requests per second (half of them streamed).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=2000))]
        rps: u32,
        /// The pool's strategy (round_robin, priority, weighted, rated, hedge, race,
        /// reset_aware).
        #[arg(long, default_value = "round_robin")]
        strategy: keypool_core::Strategy,
        /// Print the summary as JSON on stdout (the readable summary goes to stderr).
        #[arg(long)]
        json: bool,
        /// Keep serving after the summary, until Ctrl-C, to look at the status page.
        #[arg(long)]
        keep_running: bool,
    },
}

/// `keypool route …`.
#[derive(Debug, Subcommand)]
pub enum RouteAction {
    /// What the next request of key `--key-id` for `--model` on `--org`/`--url` would do.
    Explain {
        /// The configuration file (TOML).
        #[arg(long, short = 'c', value_name = "FILE", default_value = "keypool.toml")]
        config: PathBuf,
        /// The org's slug.
        #[arg(long)]
        org: String,
        /// The URL config (`custom_url`).
        #[arg(long)]
        url: String,
        /// The caller's LB key id.
        #[arg(long = "key-id")]
        key_id: String,
        /// The request's `model` (an alias, a model with a fallback, or a plain model).
        #[arg(long)]
        model: String,
    },
}

impl Command {
    /// The log level when `RUST_LOG` is not set: `warn` for the demo (its table is the
    /// output; one line per request would bury it), `info` otherwise.
    pub fn default_log_level(&self) -> &'static str {
        match self {
            Command::Demo { .. }
            | Command::Keys { .. }
            | Command::Accounts { .. }
            | Command::Config { .. }
            | Command::Route { .. }
            | Command::Oauth { .. } => "warn",
            _ => "info",
        }
    }
}

/// Installs the `tracing` subscriber on stderr; `default_level` applies when `RUST_LOG`
/// is not set. Request lines are written in batches ([`crate::logbuf`]): keep the
/// returned guard until the end of `main`, it writes out what is pending.
pub fn init_logging(format: LogFormat, default_level: &str) -> crate::logbuf::FlushGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let (writer, guard) = crate::logbuf::BatchedStderr::start();
    let on_panic = writer.clone();
    let lines = writer.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        on_panic.flush();
        previous(info);
    }));
    // Colours only on a terminal: a journal or a log file gets plain text, written by
    // the lean formatter (the same line, at a fraction of the cost per request).
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(terminal)
        .with_writer(writer);
    match format {
        LogFormat::Human if terminal => builder.init(),
        LogFormat::Human => {
            // Request lines skip `tracing`'s dispatch: their fields come written as
            // this format writes them, straight into the batch.
            keypool_proxy::log::write_request_lines_to(Box::new(move |fields| {
                lines.write_request_line(fields);
            }));
            builder.event_format(crate::logfmt::PlainFormat).init();
        }
        LogFormat::Json => builder
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(crate::logjson::JsonFormat)
            .init(),
    }
    guard
}

/// The exit code of a failed command: [`EXIT_CONFIG`] when the state file could not be
/// written at shutdown (the configured path is not writable), else [`EXIT_RUNTIME`].
pub fn exit_code_of(error: &anyhow::Error) -> u8 {
    match error.downcast_ref::<keypool_proxy::ProxyError>() {
        Some(keypool_proxy::ProxyError::StateNotSaved(_)) => EXIT_CONFIG,
        _ => EXIT_RUNTIME,
    }
}

/// Runs a command; `Err` is a failure ([`exit_code_of`] says which exit code).
pub fn execute(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::CheckConfig { file } => Ok(check_config(&file)),
        Command::Keygen => {
            let key = keypool_store::keys::generate_lb_key(&mut rand::rngs::StdRng::from_os_rng());
            println!("{}", key.key);
            println!("{}", key.config_line());
            eprintln!(
                "Give the first line to the caller (it is shown only now); paste the second \
                 into a [[keys]] table of keypool.toml."
            );
            Ok(ExitCode::from(EXIT_OK))
        }
        Command::Serve { config } => serve(&config),
        Command::Keys { action, target } => crate::remote::keys(&target, action),
        Command::Accounts { action, target } => crate::remote::accounts(&target, action),
        Command::Probe { config, live, url } => probe(config.as_deref(), live, url),
        Command::Config { action } => crate::document::execute(action),
        Command::Oauth { action, target } => crate::remote::oauth(&target, action),
        Command::Route { action } => route(action),
        Command::Demo {
            duration,
            rps,
            strategy,
            json,
            keep_running,
        } => {
            crate::demo::execute(&crate::demo::DemoOptions {
                duration,
                rps,
                strategy,
                json,
                keep_running,
            })?;
            Ok(ExitCode::from(EXIT_OK))
        }
    }
}

/// Loads `path`, printing every problem on stderr.
pub(crate) fn load(path: &Path) -> Result<Config, ExitCode> {
    match Config::load(path) {
        Ok(config) => Ok(config),
        Err(StoreError::InvalidConfig { path, errors }) => {
            eprintln!("{}: {} problem(s):", path.display(), errors.issues().len());
            for issue in errors.issues() {
                eprintln!("  {issue}");
            }
            Err(ExitCode::from(EXIT_CONFIG))
        }
        Err(e) => {
            eprintln!("{e}");
            Err(ExitCode::from(EXIT_CONFIG))
        }
    }
}

fn check_config(path: &Path) -> ExitCode {
    match load(path) {
        Ok(config) => {
            println!(
                "{}: OK ({} org(s), {} account(s), {} key(s))",
                path.display(),
                config.orgs().count(),
                config.accounts().count(),
                config.keys().count()
            );
            for w in config.warnings() {
                println!("warning: {w}");
            }
            ExitCode::from(EXIT_OK)
        }
        Err(code) => code,
    }
}

fn probe(config: Option<&Path>, live: bool, url: Option<String>) -> anyhow::Result<ExitCode> {
    let path = if live { "/healthz" } else { "/readyz" };
    let url = match (url, config) {
        (Some(url), _) => url,
        (None, Some(file)) => {
            let (listen, admin) =
                keypool_store::config::listen_addresses(file).with_context(|| {
                    format!("cannot read the listen addresses of {}", file.display())
                })?;
            crate::probe::url_for(listen, admin, path)
        }
        (None, None) => format!("http://127.0.0.1:8080{path}"),
    };
    match crate::probe::get(&url) {
        Ok((status, body)) => {
            print!("{body}");
            Ok(ExitCode::from(if status == 200 {
                EXIT_OK
            } else {
                EXIT_CONFIG
            }))
        }
        Err(e) => {
            eprintln!("keypool probe: {url}: {e:#}");
            Ok(ExitCode::from(EXIT_CONFIG))
        }
    }
}

/// `keypool route explain`: the store opened on the config's state (file or Redis),
/// then [`keypool_proxy::explain::explain`]; exit 1 with the reason for an unknown org,
/// URL config or key.
fn route(action: RouteAction) -> anyhow::Result<ExitCode> {
    let RouteAction::Explain {
        config,
        org,
        url,
        key_id,
        model,
    } = action;
    let config = match load(&config) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    current_thread()?.block_on(async {
        let store = Store::open(config)
            .await
            .context("cannot open the runtime state")?;
        let query = keypool_proxy::explain::ExplainQuery {
            org,
            url,
            key: key_id,
            model,
        };
        let config = store.config();
        match keypool_proxy::explain::explain(&store, &config, &query, keypool_store::now_ms()) {
            Ok(v) => {
                println!("{}", serde_json::to_string_pretty(&v)?);
                Ok(ExitCode::from(EXIT_OK))
            }
            Err(message) => {
                eprintln!("keypool route explain: {message}");
                Ok(ExitCode::from(1))
            }
        }
    })
}

/// A single-threaded tokio runtime with every driver (the store's tasks run on it).
fn current_thread() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

fn serve(path: &Path) -> anyhow::Result<ExitCode> {
    let config = match load(path) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    for w in config.warnings() {
        tracing::warn!(location = %w.location, "{}", w.message);
    }
    // This thread's runtime hosts the store's background tasks and the signal handlers,
    // and serves as the first worker; run_workers starts the others.
    let workers = match config.server().workers {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => usize::try_from(n).unwrap_or(1),
    };
    current_thread()?.block_on(async {
        // Caught before the port is bound: from the moment keypool accepts connections,
        // a SIGHUP reloads (its default action would end the process) and a SIGTERM
        // drains. One that comes during the start (the store's open may wait for Redis)
        // takes effect once serving starts: a SIGHUP reloads, a SIGTERM or SIGINT binds
        // and then drains at once.
        let shutdown = signals::terminate_signal()?;
        let hup = signals::hangup_signal()?;
        let store = Store::open(config)
            .await
            .context("cannot open the runtime state")?;
        match store.take_boot_state() {
            Some(BootState::Redis { loaded: false }) => {
                tracing::warn!("redis unreachable at boot; serving from memory until it answers")
            }
            Some(state) => tracing::debug!(?state, "runtime state restored"),
            None => {}
        }
        if let Err(code) = crate::document::attach(&store, path).await {
            return Ok(code);
        }
        let listeners = bind(&store.config()).await?;
        let tls = listeners.1.clone();
        let _reload =
            signals::spawn_reload_with_tls_on_sighup(hup, store.clone(), path.to_path_buf(), tls);
        let app = App::new(store).with_config_path(path);
        app.metrics()
            .set_build_info(keypool_proxy::metrics::BuildInfo {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                commit: env!("KEYPOOL_GIT_COMMIT").to_owned(),
            });
        run_workers(listeners.0, app, workers, shutdown).await?;
        Ok(ExitCode::from(EXIT_OK))
    })
}

/// Binds `listen` (with its TLS certificate, when configured) and `admin_listen`.
async fn bind(config: &Config) -> anyhow::Result<(Listeners, Option<TlsCertificates>)> {
    let settings = config.server();
    let listen = settings.listen;
    let public = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let mut listeners = Listeners::new(public);
    if let Some(admin) = settings.admin_listen {
        let listener = tokio::net::TcpListener::bind(admin)
            .await
            .with_context(|| format!("cannot listen on {admin} (server.admin_listen)"))?;
        listeners = listeners.with_admin(listener);
    }
    let tls = match &settings.tls {
        Some(files) => Some(TlsCertificates::load(&files.cert, &files.key)?),
        None => None,
    };
    if let Some(tls) = &tls {
        listeners = listeners.with_tls(tls.clone());
    }
    Ok((listeners, tls))
}
