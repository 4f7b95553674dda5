//! The config document in Redis (`config_store = "redis"`, SPEC 13): one TOML text
//! that every replica serves, a version that orders its changes, and a channel that
//! tells the replicas within a second.
//!
//! | key | type | content |
//! | --- | --- | --- |
//! | `keypool:{config}:document` | hash | `text` (the TOML as written, comments kept), `version` (1, 2, …), `digest` (SHA-256 of `text`, hex), `previous` (the text before the last change), `updated_at` (unix ms) |
//! | `keypool:{config}:audit` | list | the newest [`AUDIT_KEEP`] audit lines (JSON: time, route, what changed by id; never a secret) |
//! | channel `keypool:config` | pub/sub | JSON [`ConfigMessage`] after every change, and to ask every replica to reload |
//!
//! Both keys share the `{config}` hash tag, so the save script runs on one node of a
//! Cluster. A save names the version it started from; when another replica saved
//! first the script refuses and the change is made again on the newer text.

use fred::prelude::{HashesInterface, PubsubInterface};
use serde::{Deserialize, Serialize};

use super::redis::RedisMirror;
use crate::StoreError;

/// The document hash.
pub(crate) const DOCUMENT_KEY: &str = "keypool:{config}:document";
/// The audit list.
pub(crate) const AUDIT_KEY: &str = "keypool:{config}:audit";
/// The channel of document changes and reload requests.
pub const CONFIG_CHANNEL: &str = "keypool:config";
/// Audit lines kept in Redis.
pub const AUDIT_KEEP: usize = 1000;

/// Saves a new text when the stored version is still the one the change started
/// from. KEYS = document, audit; ARGV = expected version (0: none yet), text, audit
/// line, now, audit lines kept, the text's digest. Returns the new version, or -1 when
/// another save came first.
const SAVE: &str = "local v = tonumber(redis.call('HGET', KEYS[1], 'version') or '0') \
if v ~= tonumber(ARGV[1]) then return -1 end \
local old = redis.call('HGET', KEYS[1], 'text') \
if old then redis.call('HSET', KEYS[1], 'previous', old) end \
redis.call('HSET', KEYS[1], 'text', ARGV[2], 'version', v + 1, 'updated_at', ARGV[4], 'digest', ARGV[6]) \
redis.call('LPUSH', KEYS[2], ARGV[3]) \
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1) \
return v + 1";

/// The SHA-256 of a document's text, hex.
pub(crate) fn digest(text: &str) -> String {
    use sha2::{Digest as _, Sha256};
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What is published on [`CONFIG_CHANNEL`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigMessage {
    /// The publishing replica's random id (replicas ignore their own messages).
    pub origin: String,
    /// The document's version after a change.
    pub version: u64,
    /// A reload on one replica: every replica re-reads its local file (`[server]`,
    /// `file:` secrets) and the document, even when the version did not move.
    #[serde(default)]
    pub reload: bool,
}

/// The stored document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDocument {
    /// The TOML text as written.
    pub text: String,
    /// Its version (1 for the first).
    pub version: u64,
    /// The digest Redis holds for it (`None`: compute it from `text`). A text edited
    /// in Redis by hand keeps the old digest, so that replicas install it only at a
    /// reload, and do not install it again and again after.
    pub digest: Option<String>,
}

impl StoredDocument {
    /// A text not read from Redis.
    pub fn new(text: String, version: u64) -> Self {
        Self {
            text,
            version,
            digest: None,
        }
    }

    /// The digest replicas compare.
    pub fn digest(&self) -> String {
        self.digest.clone().unwrap_or_else(|| digest(&self.text))
    }
}

impl RedisMirror {
    /// The document and its version, `None` when there is none yet.
    pub(crate) async fn load_document(&self) -> Result<Option<StoredDocument>, StoreError> {
        let (text, version, digest): (Option<String>, Option<u64>, Option<String>) = self
            .bounded(
                self.client
                    .hmget(DOCUMENT_KEY, vec!["text", "version", "digest"]),
            )
            .await?;
        Ok(text.map(|text| StoredDocument {
            text,
            version: version.unwrap_or(0),
            digest,
        }))
    }

    /// Only the version (0 when there is no document).
    pub(crate) async fn document_version(&self) -> Result<u64, StoreError> {
        let v: Option<u64> = self
            .bounded(self.client.hget(DOCUMENT_KEY, "version"))
            .await?;
        Ok(v.unwrap_or(0))
    }

    /// Only the digest of the saved text: what a replica compares with the one it
    /// serves (a version alone is not enough: a Redis that lost its data counts from 1
    /// again).
    pub(crate) async fn document_digest(&self) -> Result<Option<String>, StoreError> {
        self.bounded(self.client.hget(DOCUMENT_KEY, "digest")).await
    }

    /// Saves `text` if the stored version is `expected`, with `audit` appended to the
    /// audit list. `Ok(None)`: another save came first (nothing written).
    pub(crate) async fn save_document(
        &self,
        expected: u64,
        text: &str,
        audit: &str,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        let keys = vec![DOCUMENT_KEY.to_owned(), AUDIT_KEY.to_owned()];
        let args = vec![
            expected.to_string(),
            text.to_owned(),
            audit.to_owned(),
            now.to_string(),
            AUDIT_KEEP.to_string(),
            digest(text),
        ];
        let v: i64 = self.eval(SAVE, DOCUMENT_KEY, keys, args).await?;
        Ok(u64::try_from(v).ok())
    }

    /// Tells every replica that the document is at `version` (`reload`: re-read
    /// everything).
    pub(crate) async fn publish_config(
        &self,
        version: u64,
        reload: bool,
    ) -> Result<(), StoreError> {
        let message = ConfigMessage {
            origin: self.origin().to_owned(),
            version,
            reload,
        };
        let json = serde_json::to_string(&message)
            .map_err(|e| StoreError::Redis(format!("cannot encode a config message: {e}")))?;
        let _: i64 = self
            .bounded(self.client.publish(CONFIG_CHANNEL, json))
            .await?;
        Ok(())
    }

    /// A message of [`CONFIG_CHANNEL`] from another replica.
    pub(crate) fn parse_config(&self, message: &fred::types::Message) -> Option<ConfigMessage> {
        if &*message.channel != CONFIG_CHANNEL {
            return None;
        }
        let text = message.value.as_str()?;
        let m: ConfigMessage = serde_json::from_str(&text).ok()?;
        (m.origin != self.origin()).then_some(m)
    }
}
