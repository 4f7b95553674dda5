//! The config document in Redis (`config_store = "redis"`, SPEC 13).
//!
//! Every replica serves the one document in Redis ([`crate::state::redis_document`]),
//! with the `[server]` table of its own local file ([`merge_server`]): listen
//! addresses, TLS files and `redis_url` are per replica, the pool is shared.
//!
//! - At boot ([`Store::attach_redis_document`]) the replica installs Redis's
//!   document; when Redis has none yet it saves its own (the last document it served
//!   from Redis, `<file>.redis.toml`, or else the local file); when Redis does not
//!   answer it keeps serving the local copy and follows once Redis answers.
//! - A change ([`Store::change_config`]) edits Redis's text, is validated like a load,
//!   saved only if no other replica saved since it read (else made again on the newer
//!   text), installed, and published on `keypool:config`.
//! - Every replica installs a newer version when told (pub/sub, within a second), and
//!   checks the version every [`CHECK_MS`] in case a message was lost.
//! - A reload on one replica ([`Store::reload_config`]) is published too: every replica
//!   re-reads its local file (`[server]`, `file:` secrets) and the document.
//! - After installing a document a replica keeps a copy, `<file>.redis.toml`, so that
//!   a Redis that lost its data is given back the newest document, not an old file
//!   (mode 0600: the document may hold literal secrets).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::{ChangeError, ConfigDiff, Edit, Env, audit, audit_line, io, write_replacing};
use crate::config::{Config, ConfigStore};
use crate::state::redis::RedisMirror;
use crate::state::redis_document::{StoredDocument, digest};
use crate::{Store, StoreError};

/// How often a replica compares its document's version with Redis's (pub/sub tells it
/// sooner; this catches a lost message).
pub const CHECK_MS: u64 = 5_000;

/// Attempts of one change when other replicas keep saving first.
const SAVE_ATTEMPTS: usize = 5;

/// The Redis document of this process: its local file and the version it serves.
#[derive(Debug)]
pub(crate) struct SharedDocument {
    path: PathBuf,
    version: AtomicU64,
    /// The digest of the text served ([`StoredDocument::digest`]).
    digest: std::sync::Mutex<String>,
    last_checked: AtomicU64,
}

/// What [`Store::attach_redis_document`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocumentBoot {
    /// Redis's document, at this version, is served.
    Served {
        /// Its version.
        version: u64,
    },
    /// Redis had no document: this replica saved `from` as version 1.
    Seeded {
        /// The file saved.
        from: PathBuf,
    },
    /// Redis did not answer: the local copy serves until it does.
    Unreachable {
        /// Why.
        reason: String,
    },
}

/// Where the document lives, for the admin API and the status page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DocumentStatus {
    /// `file` or `redis`.
    pub store: &'static str,
    /// With Redis: the version served (`None` until one was read).
    pub version: Option<u64>,
}

/// `<file>.redis.toml`: the last document this replica installed from Redis.
pub fn redis_copy_path(config: &Path) -> PathBuf {
    let mut name = config.file_name().unwrap_or_default().to_os_string();
    name.push(".redis.toml");
    config.with_file_name(name)
}

/// The text a replica serves: `document` with its `[server]` table replaced by the
/// local file's. When either does not parse, `document` as it is (validation then
/// reports the problem where it is).
pub fn merge_server(local: &str, document: &str) -> String {
    let (Ok(local), Ok(mut doc)) = (
        local.parse::<toml_edit::DocumentMut>(),
        document.parse::<toml_edit::DocumentMut>(),
    ) else {
        return document.to_owned();
    };
    doc.remove("server");
    if let Some(server) = local.get("server") {
        doc.insert("server", server.clone());
    }
    doc.to_string()
}

impl SharedDocument {
    fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    /// Records the version and digest now served.
    fn served(&self, version: u64, digest: String) {
        self.version.store(version, Ordering::Relaxed);
        *self
            .digest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = digest;
    }

    fn serves(&self, other: Option<&str>) -> bool {
        let mine = self
            .digest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        other.is_some_and(|d| d == mine.as_str())
    }
}

impl Store {
    fn shared_mirror(&self) -> Result<&std::sync::Arc<RedisMirror>, StoreError> {
        self.redis()
            .ok_or_else(|| StoreError::Redis("config_store = \"redis\" needs redis_url".to_owned()))
    }

    /// Makes Redis's document this replica's config (`config_store = "redis"`), `path`
    /// being the local file (its `[server]` table, and the copy used when Redis has no
    /// document or does not answer). From now on changes go to Redis and the replica
    /// follows the document's changes.
    ///
    /// # Errors
    /// Redis's document is invalid with this replica's `[server]` table and
    /// environment ([`StoreError::InvalidDocument`]): the replica must not start.
    pub async fn attach_redis_document(&self, path: &Path) -> Result<DocumentBoot, StoreError> {
        let mirror = self.shared_mirror()?.clone();
        let shared = SharedDocument {
            path: path.to_path_buf(),
            version: AtomicU64::new(0),
            digest: std::sync::Mutex::default(),
            last_checked: AtomicU64::new(crate::now_ms()),
        };
        if self.document().shared.set(shared).is_err() {
            return Err(StoreError::Config(
                "the Redis document is attached already".to_owned(),
            ));
        }
        let stored = match mirror.load_document().await {
            Ok(stored) => stored,
            Err(e) => return Ok(self.serve_copy(path, &e)),
        };
        let Some(stored) = stored else {
            return self.seed(&mirror, path).await;
        };
        let env = |name: &str| std::env::var(name).ok();
        self.install_stored(&stored, &env)?;
        // the runtime state of the document's accounts, not only the local file's, at
        // once: until a reconciliation is done, state changes are not mirrored
        if let Err(e) = self.reconcile_now().await {
            tracing::debug!(error = %e, "redis reconciliation after the document failed; retried");
        }
        Ok(DocumentBoot::Served {
            version: stored.version,
        })
    }

    /// Redis does not answer at boot: the copy of the last document from Redis serves
    /// when there is one (the local file otherwise, installed already).
    fn serve_copy(&self, path: &Path, e: &StoreError) -> DocumentBoot {
        let copy = redis_copy_path(path);
        if let Ok(text) = std::fs::read_to_string(&copy) {
            let env = |name: &str| std::env::var(name).ok();
            let stored = StoredDocument::new(text, 0);
            if let Err(problem) = self.install_stored(&stored, &env) {
                tracing::error!(copy = %copy.display(), error = %problem, "the copy of the Redis document is invalid; serving the local file");
            }
        }
        DocumentBoot::Unreachable {
            reason: e.to_string(),
        }
    }

    /// Redis has no document: saves the copy of the last one from Redis, or the local
    /// file, as version 1 (when two replicas race, one saves and the other follows).
    async fn seed(&self, mirror: &RedisMirror, path: &Path) -> Result<DocumentBoot, StoreError> {
        let copy = redis_copy_path(path);
        let from = if copy.exists() {
            copy
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&from).map_err(|source| StoreError::ReadConfig {
            path: from.clone(),
            source,
        })?;
        let env = |name: &str| std::env::var(name).ok();
        let line = audit_line(
            &format!("seeded from {}", from.display()),
            &ConfigDiff::default(),
        );
        match mirror
            .save_document(0, &text, &line, crate::now_ms())
            .await?
        {
            Some(version) => {
                self.install_stored(&StoredDocument::new(text, version), &env)?;
                Ok(DocumentBoot::Seeded { from })
            }
            // another replica seeded first: serve its document
            None => match mirror.load_document().await? {
                Some(stored) => {
                    self.install_stored(&stored, &env)?;
                    Ok(DocumentBoot::Served {
                        version: stored.version,
                    })
                }
                None => Err(StoreError::Redis(
                    "the config document vanished while this replica seeded it".to_owned(),
                )),
            },
        }
    }

    /// Validates `stored` with this replica's `[server]` table and `env`, installs it,
    /// keeps the copy and the version, and logs what changed.
    fn install_stored(
        &self,
        stored: &StoredDocument,
        env: Env<'_>,
    ) -> Result<ConfigDiff, StoreError> {
        let Some(shared) = self.document().shared() else {
            return Err(StoreError::Config(
                "no Redis document is attached".to_owned(),
            ));
        };
        let path = &shared.path;
        let local = std::fs::read_to_string(path).map_err(|source| StoreError::ReadConfig {
            path: path.clone(),
            source,
        })?;
        let text = merge_server(&local, &stored.text);
        let config = Config::from_toml_str(&text, path.parent(), env).map_err(|errors| {
            StoreError::InvalidDocument {
                local: path.clone(),
                errors,
            }
        })?;
        let diff = ConfigDiff::between(&self.config(), &config);
        // the copy and the version first: whoever sees the new config sees them too
        if stored.version > 0 {
            if let Err(e) = write_replacing(&redis_copy_path(path), &stored.text, true) {
                tracing::warn!(error = %e, "the copy of the Redis document could not be written");
            }
            shared.served(stored.version, stored.digest());
        }
        self.install(config);
        if !diff.is_empty() {
            tracing::info!(
                version = stored.version,
                changed = %serde_json::to_string(&diff).unwrap_or_default(),
                "config document installed from redis"
            );
        }
        Ok(diff)
    }

    /// Installs Redis's document when its text is not the one served (by digest: a
    /// version alone is not enough, a Redis that lost its data was seeded again from
    /// 1), or always, for a `reload`. `Ok(true)` when one was installed.
    pub(crate) async fn follow_document(&self, reload: bool) -> Result<bool, StoreError> {
        let Some(shared) = self.document().shared() else {
            return Ok(false);
        };
        let mirror = self.shared_mirror()?;
        let _one_at_a_time = self.document().lock.lock().await;
        shared
            .last_checked
            .store(crate::now_ms(), Ordering::Relaxed);
        if !reload && shared.serves(mirror.document_digest().await?.as_deref()) {
            return Ok(false);
        }
        let Some(stored) = mirror.load_document().await? else {
            return Ok(false);
        };
        let env = |name: &str| std::env::var(name).ok();
        let outcome = self.install_stored(&stored, &env);
        match &outcome {
            Ok(_) => self.count_reload(true),
            Err(e) => self.reload_rejected(e),
        }
        outcome.map(|_| true)
    }

    /// Follows the document after a message of another replica; problems are logged
    /// (the previous config keeps serving).
    pub(crate) async fn follow_logged(&self, reload: bool) {
        if let Err(e) = self.follow_document(reload).await {
            tracing::error!(error = %e, "the config document in redis was not installed; the previous configuration keeps serving");
        }
    }

    /// The periodic check: every [`CHECK_MS`], whether Redis's version moved.
    pub(crate) async fn maintain_document(&self, now: u64) {
        let Some(shared) = self.document().shared() else {
            return;
        };
        let ready = self.redis().is_some_and(|m| m.ready());
        if ready && now.saturating_sub(shared.last_checked.load(Ordering::Relaxed)) >= CHECK_MS {
            self.follow_logged(false).await;
        }
    }

    /// Reloads the configuration (`SIGHUP`, `POST /admin/reload`): the config file at
    /// `path`, or with the Redis document this replica's local file and Redis's
    /// document, and then every other replica too (published).
    ///
    /// # Errors
    /// The file or the document is invalid, or Redis does not answer: the old
    /// configuration keeps serving.
    pub async fn reload_config(&self, path: &Path) -> Result<(), StoreError> {
        if self.document().shared().is_none() {
            return self.reload(path);
        }
        self.follow_document(true).await?;
        let version = self.document().shared().map_or(0, SharedDocument::version);
        self.shared_mirror()?.publish_config(version, true).await
    }

    /// Where the document lives and, with Redis, the version served.
    pub fn document_status(&self) -> DocumentStatus {
        match self.document().shared() {
            Some(shared) => DocumentStatus {
                store: ConfigStore::Redis.as_str(),
                version: Some(shared.version()).filter(|&v| v > 0),
            },
            None => DocumentStatus {
                store: ConfigStore::File.as_str(),
                version: None,
            },
        }
    }

    /// A change of the Redis document (see [`Store::change_config`]); the caller holds
    /// the change lock.
    pub(super) async fn change_shared<T>(
        &self,
        path: &Path,
        route: &str,
        env: Env<'_>,
        edit: &mut impl Edit<T>,
    ) -> Result<(T, ConfigDiff), ChangeError> {
        let unavailable = |e: StoreError| {
            ChangeError::Unavailable(format!(
                "the config document lives in Redis (config_store = \"redis\"), which did not answer ({e}); nothing was changed: try again once Redis answers"
            ))
        };
        let mirror = self.shared_mirror().map_err(unavailable)?;
        let local = std::fs::read_to_string(path).map_err(|e| io("read", path, &e))?;
        for _ in 0..SAVE_ATTEMPTS {
            let Some(stored) = mirror.load_document().await.map_err(unavailable)? else {
                return Err(ChangeError::Unavailable(
                    "there is no config document in Redis: push one with `keypool config push FILE`".to_owned(),
                ));
            };
            let mut doc = crate::config::edit::parse(&stored.text)?;
            let value = edit(&mut doc)?;
            let new_text = doc.to_string();
            let merged = merge_server(&local, &new_text);
            let config =
                Config::from_toml_str(&merged, path.parent(), env).map_err(ChangeError::Invalid)?;
            let diff = ConfigDiff::between(&self.config(), &config);
            let line = audit_line(route, &diff);
            let saved = mirror
                .save_document(stored.version, &new_text, &line, crate::now_ms())
                .await
                .map_err(unavailable)?;
            let Some(version) = saved else { continue };
            self.install(config);
            if let Some(shared) = self.document().shared() {
                shared.served(version, digest(&new_text));
            }
            if let Err(e) = write_replacing(&redis_copy_path(path), &new_text, true) {
                tracing::warn!(error = %e, "the copy of the Redis document could not be written");
            }
            audit(path, &line);
            if let Err(e) = mirror.publish_config(version, false).await {
                tracing::warn!(error = %e, "the change is saved but could not be published; other replicas see it within 5 s");
            }
            return Ok((value, diff));
        }
        Err(ChangeError::Unavailable(format!(
            "other replicas changed the config document {SAVE_ATTEMPTS} times while this change was made; nothing was changed: try again"
        )))
    }
}

/// `keypool config push`: saves `text` (validated by the caller) as Redis's document,
/// whatever version is there, and tells the replicas. Returns the new version.
///
/// # Errors
/// Redis does not answer or refuses.
pub async fn push_document(url: &str, text: &str, route: &str) -> Result<u64, StoreError> {
    let mirror = connect(url).await?;
    let outcome = async {
        for _ in 0..SAVE_ATTEMPTS {
            let current = mirror.document_version().await?;
            let line = audit_line(route, &ConfigDiff::default());
            if let Some(version) = mirror
                .save_document(current, text, &line, crate::now_ms())
                .await?
            {
                mirror.publish_config(version, false).await?;
                return Ok(version);
            }
        }
        Err(StoreError::Redis(
            "the document kept changing while it was pushed; try again".to_owned(),
        ))
    }
    .await;
    mirror.close();
    outcome
}

/// `keypool config pull`: Redis's document, `None` when there is none.
///
/// # Errors
/// Redis does not answer.
pub async fn pull_document(url: &str) -> Result<Option<StoredDocument>, StoreError> {
    let mirror = connect(url).await?;
    let outcome = mirror.load_document().await;
    mirror.close();
    outcome
}

async fn connect(url: &str) -> Result<RedisMirror, StoreError> {
    let timeout = std::time::Duration::from_secs(5);
    let connected = RedisMirror::connect(url, timeout, timeout).await?;
    if !connected.connected {
        return Err(StoreError::Redis(
            "no connection within 5 s; check redis_url and that Redis runs".to_owned(),
        ));
    }
    Ok(connected.mirror)
}
