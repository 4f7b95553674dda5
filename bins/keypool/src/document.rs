//! `keypool config push|pull`: moves a config document between a file and Redis
//! (`config_store = "redis"`, SPEC 13), and the Redis document at `serve`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use keypool_store::config::{Config, ConfigStore};
use keypool_store::document::DocumentBoot;
use keypool_store::{Store, StoreError};

use crate::cli::{EXIT_CONFIG, EXIT_OK};

/// `keypool config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Validate FILE as `check-config` does and save it as the config document in
    /// Redis (the previous one is kept as `previous` in the same hash). Every replica
    /// with `config_store = "redis"` installs it within a second; each keeps the
    /// `[server]` table of its own local file.
    Push {
        /// The document (TOML).
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The Redis URL; else `REDIS_URL`, else FILE's `server.redis_url`.
        #[arg(long, value_name = "URL")]
        redis: Option<String>,
    },
    /// Print the config document in Redis as it was written (comments kept), or write
    /// it to `--out`.
    Pull {
        /// A config file whose `server.redis_url` names Redis.
        #[arg(long, short = 'c', value_name = "FILE")]
        config: Option<PathBuf>,
        /// The Redis URL; else `REDIS_URL`, else `--config`'s `server.redis_url`.
        #[arg(long, value_name = "URL")]
        redis: Option<String>,
        /// Write the document here (atomically) instead of stdout.
        #[arg(long, short = 'o', value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

/// The Redis URL: `--redis`, `REDIS_URL`, or the config's `redis_url`.
fn redis_url(flag: Option<String>, config: Option<&Config>) -> anyhow::Result<String> {
    if let Some(url) = flag.or_else(|| std::env::var("REDIS_URL").ok()) {
        return Ok(url);
    }
    config
        .and_then(|c| c.server().redis_url.as_ref())
        .map(|u| u.expose().to_owned())
        .context("no Redis named: pass --redis URL, set REDIS_URL, or give a config file with server.redis_url")
}

/// Runs `keypool config …`.
pub fn execute(action: ConfigAction) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    match action {
        ConfigAction::Push { file, redis } => {
            let config = match crate::cli::load(&file) {
                Ok(config) => config,
                Err(code) => return Ok(code),
            };
            let url = redis_url(redis, Some(&config))?;
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let route = format!("keypool config push {}", file.display());
            let version = runtime
                .block_on(keypool_store::document::push_document(&url, &text, &route))
                .map_err(plain)
                .context("the document was not pushed")?;
            println!(
                "{}: pushed as version {version}; every replica with config_store = \"redis\" installs it within a second",
                file.display()
            );
            Ok(ExitCode::from(EXIT_OK))
        }
        ConfigAction::Pull { config, redis, out } => {
            let config = match config.as_deref().map(crate::cli::load).transpose() {
                Ok(config) => config,
                Err(code) => return Ok(code),
            };
            let url = redis_url(redis, config.as_ref())?;
            let Some(stored) = runtime
                .block_on(keypool_store::document::pull_document(&url))
                .map_err(plain)
                .context("the document was not pulled")?
            else {
                eprintln!(
                    "there is no config document in Redis: push one with `keypool config push FILE`"
                );
                return Ok(ExitCode::from(EXIT_CONFIG));
            };
            match out {
                Some(path) => {
                    write_file(&path, &stored.text)?;
                    eprintln!("version {} written to {}", stored.version, path.display());
                }
                None => print!("{}", stored.text),
            }
            Ok(ExitCode::from(EXIT_OK))
        }
    }
}

/// A store error for a command: a Redis failure without the server's "keeps serving
/// from memory" (there is nothing to serve here).
fn plain(e: StoreError) -> anyhow::Error {
    match e {
        StoreError::Redis(message) => anyhow::anyhow!("redis: {message}"),
        other => other.into(),
    }
}

/// Writes `text` over `path` through a temporary file beside it, readable by the owner
/// only (the document may hold literal secrets).
fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot restrict {}", tmp.display()))?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// At `serve` with `config_store = "redis"`: installs Redis's document (see
/// [`Store::attach_redis_document`]). `Err(code)`: the document is invalid here.
pub async fn attach(store: &Store, path: &Path) -> Result<(), ExitCode> {
    if store.config().server().config_store != ConfigStore::Redis {
        return Ok(());
    }
    match store.attach_redis_document(path).await {
        Ok(DocumentBoot::Served { version }) => {
            tracing::info!(version, "serving the config document in redis");
        }
        Ok(DocumentBoot::Seeded { from }) => tracing::warn!(
            from = %from.display(),
            "redis had no config document: saved this one as version 1"
        ),
        Ok(DocumentBoot::Unreachable { reason }) => tracing::error!(
            %reason,
            "redis did not answer for the config document: serving the local copy until it does"
        ),
        Err(StoreError::InvalidDocument { local, errors }) => {
            eprintln!(
                "the config document in Redis is invalid with the [server] table of {}: {} problem(s):",
                local.display(),
                errors.issues().len()
            );
            for issue in errors.issues() {
                eprintln!("  {issue}");
            }
            return Err(ExitCode::from(EXIT_CONFIG));
        }
        Err(e) => {
            eprintln!("{e}");
            return Err(ExitCode::from(EXIT_CONFIG));
        }
    }
    Ok(())
}
