//! The config document as the one source of truth (SPEC 13): a change made through the
//! admin API is an edit of the TOML document ([`crate::config::edit`]), validated
//! exactly like a file load, applied whole or not at all, and written back.
//!
//! Without Redis the document is the config file: the new text is written to a
//! temporary file beside it and renamed over it (a reader never sees half a file),
//! after the previous version was copied to `<file>.bak`. Every applied change is
//! appended to the audit log, `<file>.audit.log` (one JSON line: time, route, what
//! changed, by id; never a secret), and logged (`keypool::audit`).
//!
//! Changes are serialised: one at a time per process, each starting from the file as
//! it is on disk (an operator's own edit followed by a reload is not lost).
//!
//! With `config_store = "redis"` the document lives in Redis instead ([`shared`]):
//! every replica serves it (with its own `[server]` table from its local file), a
//! change is saved there by version and published, and every replica installs it
//! within a second.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use toml_edit::DocumentMut;

use crate::Store;
use crate::config::edit::EditError;
use crate::config::{Config, ConfigErrors};

mod shared;
pub use crate::state::redis_document::{AUDIT_KEEP, CONFIG_CHANNEL, ConfigMessage, StoredDocument};
pub use shared::{
    CHECK_MS, DocumentBoot, DocumentStatus, merge_server, pull_document, push_document,
    redis_copy_path,
};

/// Why a change was not applied (nothing changed then).
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The edit itself could not be made (unknown element, duplicate, bad body).
    #[error(transparent)]
    Edit(#[from] EditError),
    /// The changed document is not a valid configuration: the located problems, as a
    /// file load reports them.
    #[error("the change would make the configuration invalid")]
    Invalid(ConfigErrors),
    /// The document cannot be read or written.
    #[error("{0}")]
    Io(String),
    /// The document lives in Redis, which does not answer now.
    #[error("{0}")]
    Unavailable(String),
}

/// What one change did, by id: for the answer, the audit log and the reload log.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConfigDiff {
    /// Accounts added, removed, changed.
    pub accounts_added: Vec<String>,
    /// …
    pub accounts_removed: Vec<String>,
    /// …
    pub accounts_changed: Vec<String>,
    /// Keys added, removed, changed (by key id).
    pub keys_added: Vec<String>,
    /// …
    pub keys_removed: Vec<String>,
    /// …
    pub keys_changed: Vec<String>,
    /// Groups and URL configs added, removed or changed (`org/id`).
    pub groups_changed: Vec<String>,
    /// …
    pub urls_changed: Vec<String>,
}

impl ConfigDiff {
    /// The differences between two configurations.
    pub fn between(old: &Config, new: &Config) -> Self {
        let mut d = Self::default();
        for a in new.accounts() {
            match old.account(a.id().as_str()) {
                None => d.accounts_added.push(a.id().to_string()),
                Some(o) if **o != **a => d.accounts_changed.push(a.id().to_string()),
                Some(_) => {}
            }
        }
        for a in old.accounts() {
            if new.account(a.id().as_str()).is_none() {
                d.accounts_removed.push(a.id().to_string());
            }
        }
        for k in new.keys() {
            match old.lb_key_by_id(k.id()) {
                None => d.keys_added.push(k.id().to_owned()),
                Some(o) if **o != **k => d.keys_changed.push(k.id().to_owned()),
                Some(_) => {}
            }
        }
        for k in old.keys() {
            if new.lb_key_by_id(k.id()).is_none() {
                d.keys_removed.push(k.id().to_owned());
            }
        }
        // Groups and URL configs: `org/id` of each one added, removed or changed.
        let named = |c: &Config, urls: bool| -> std::collections::BTreeMap<String, String> {
            let mut m = std::collections::BTreeMap::new();
            for o in c.orgs() {
                if urls {
                    for u in o.urls() {
                        m.insert(format!("{}/{}", o.slug(), u.custom_url()), format!("{u:?}"));
                    }
                } else {
                    for g in o.groups() {
                        m.insert(format!("{}/{}", o.slug(), g.id()), format!("{g:?}"));
                    }
                }
            }
            m
        };
        let changed = |a: std::collections::BTreeMap<String, String>,
                       b: std::collections::BTreeMap<String, String>| {
            let names: std::collections::BTreeSet<&String> = a
                .keys()
                .chain(b.keys())
                .filter(|k| a.get(*k) != b.get(*k))
                .collect();
            names.into_iter().cloned().collect::<Vec<String>>()
        };
        d.groups_changed = changed(named(old, false), named(new, false));
        d.urls_changed = changed(named(old, true), named(new, true));
        for list in [
            &mut d.accounts_added,
            &mut d.accounts_removed,
            &mut d.accounts_changed,
            &mut d.keys_added,
            &mut d.keys_removed,
            &mut d.keys_changed,
        ] {
            list.sort();
        }
        d
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The config document's state in one process: changes one at a time, and where the
/// document lives.
#[derive(Debug, Default)]
pub struct DocumentState {
    lock: tokio::sync::Mutex<()>,
    shared: std::sync::OnceLock<shared::SharedDocument>,
}

impl DocumentState {
    /// The Redis document, once attached.
    pub(crate) fn shared(&self) -> Option<&shared::SharedDocument> {
        self.shared.get()
    }
}

/// The audit log beside the config file.
pub fn audit_log_path(config: &Path) -> PathBuf {
    let mut name = config.file_name().unwrap_or_default().to_os_string();
    name.push(".audit.log");
    config.with_file_name(name)
}

/// The backup of the previous version.
pub fn backup_path(config: &Path) -> PathBuf {
    let mut name = config.file_name().unwrap_or_default().to_os_string();
    name.push(".bak");
    config.with_file_name(name)
}

fn io(what: &str, path: &Path, e: &std::io::Error) -> ChangeError {
    ChangeError::Io(format!("cannot {what} {}: {e}", path.display()))
}

/// Writes `text` over `path` atomically, the previous version kept as `<path>.bak`.
fn write_atomically(path: &Path, text: &str) -> Result<(), ChangeError> {
    write_replacing(path, text, false)
}

/// [`write_atomically`]; `private`: readable by the owner only (mode 0600), whatever
/// the file's permissions were (a copy of a document that may hold literal secrets).
fn write_replacing(path: &Path, text: &str, private: bool) -> Result<(), ChangeError> {
    if path.exists() {
        std::fs::copy(path, backup_path(path)).map_err(|e| io("back up", path, &e))?;
    }
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        // Keep the file's permissions (a config with secrets may be 0600).
        if private {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
            }
        } else if let Ok(meta) = std::fs::metadata(path) {
            std::fs::set_permissions(&tmp, meta.permissions())?;
        }
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io("write", path, &e)
    })
}

/// A change's edit of the document: may run again on a newer text when another
/// replica saved first (the Redis document).
pub trait Edit<T>: FnMut(&mut DocumentMut) -> Result<T, EditError> + Send {}
impl<T, F: FnMut(&mut DocumentMut) -> Result<T, EditError> + Send> Edit<T> for F {}

/// `$ENV_NAME` look-ups for a change's validation.
pub type Env<'a> = &'a (dyn Fn(&str) -> Option<String> + Sync);

impl Store {
    /// Applies `edit` to the config document (SPEC 13), validated like a load (with
    /// `env` for `$ENV_NAME` and the secrets key) and installed; `route` and the
    /// change go to the audit log. Returns the edit's value and what changed.
    ///
    /// The document is the config file at `path` (rewritten atomically, the previous
    /// version kept as `<file>.bak`), or, with `config_store = "redis"` once
    /// [`Store::attach_redis_document`] ran, the document in Redis (every replica
    /// installs it within a second; `path`'s `[server]` table is this replica's).
    ///
    /// # Errors
    /// [`ChangeError`]: nothing was written or installed then.
    pub async fn change_config<T>(
        &self,
        path: &Path,
        route: &str,
        env: Env<'_>,
        mut edit: impl Edit<T>,
    ) -> Result<(T, ConfigDiff), ChangeError> {
        let _one_at_a_time = self.document().lock.lock().await;
        if self.document().shared().is_some() {
            return self.change_shared(path, route, env, &mut edit).await;
        }
        let text = std::fs::read_to_string(path).map_err(|e| io("read", path, &e))?;
        let mut doc = crate::config::edit::parse(&text)?;
        let value = edit(&mut doc)?;
        let new_text = doc.to_string();
        let config =
            Config::from_toml_str(&new_text, path.parent(), env).map_err(ChangeError::Invalid)?;
        let diff = ConfigDiff::between(&self.config(), &config);
        write_atomically(path, &new_text)?;
        self.install(config);
        audit(path, &audit_line(route, &diff));
        Ok((value, diff))
    }
}

/// One line of the audit log: time, route, what changed (by id; never a secret).
fn audit_line(route: &str, diff: &ConfigDiff) -> String {
    serde_json::json!({
        "at": crate::now_ms(),
        "route": route,
        "changed": diff,
    })
    .to_string()
}

/// Appends `line` to the audit log beside `path` (and logs the `keypool::audit` event).
fn audit(path: &Path, line: &str) {
    tracing::info!(target: "keypool::audit", changed = %line, "config changed");
    let log = audit_log_path(path);
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = appended {
        tracing::warn!(path = %log.display(), error = %e, "the audit log could not be written");
    }
}
