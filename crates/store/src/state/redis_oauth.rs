//! The OAuth tokens of every replica in Redis (SPEC 14): one refresh per account
//! across replicas, and the rotated tokens shared.
//!
//! | key | type | content |
//! | --- | --- | --- |
//! | `keypool:oauth:{account}` | string | JSON [`TokenRecord`] (tokens sealed with `KEYPOOL_SECRETS_KEY` when set) |
//! | `keypool:oauth-lock:{account}` | string, `PX` 30 s | the replica refreshing the account now |
//!
//! A replica that wants to refresh first reads the shared tokens (another replica may
//! have rotated them already), then takes the lock (`SET NX PX`); the others wait for
//! the shared tokens to change instead of spending the old refresh token.

use fred::prelude::{Expiration, KeysInterface, SetOptions};

use super::redis::{PREFIX, RedisMirror};
use crate::StoreError;
use crate::oauth::TokenRecord;

/// How long a refresh lock lives when its holder dies.
pub const LOCK_MS: i64 = 30_000;

/// Releases a lock only when it is still the holder's.
const UNLOCK: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
return redis.call('DEL', KEYS[1]) end return 0";

fn tokens_key(account: &str) -> String {
    format!("{PREFIX}oauth:{account}")
}

fn lock_key(account: &str) -> String {
    format!("{PREFIX}oauth-lock:{account}")
}

impl RedisMirror {
    /// The shared tokens of `account`.
    pub(crate) async fn shared_tokens(
        &self,
        account: &str,
    ) -> Result<Option<TokenRecord>, StoreError> {
        let v: Option<String> = self.bounded(self.client.get(tokens_key(account))).await?;
        Ok(v.and_then(|v| serde_json::from_str(&v).ok()))
    }

    /// Shares `record`.
    pub(crate) async fn save_tokens(&self, record: &TokenRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(record)
            .map_err(|e| StoreError::Redis(format!("cannot encode tokens: {e}")))?;
        let _: Option<String> = self
            .bounded(
                self.client
                    .set(tokens_key(record.account.as_str()), json, None, None, false),
            )
            .await?;
        Ok(())
    }

    /// Takes the refresh lock of `account` as `holder`; `false`: another replica has it.
    pub(crate) async fn lock_refresh(
        &self,
        account: &str,
        holder: &str,
    ) -> Result<bool, StoreError> {
        let set: Option<String> = self
            .bounded(self.client.set(
                lock_key(account),
                holder,
                Some(Expiration::PX(LOCK_MS)),
                Some(SetOptions::NX),
                false,
            ))
            .await?;
        Ok(set.is_some())
    }

    /// Releases the lock when `holder` still has it.
    pub(crate) async fn unlock_refresh(
        &self,
        account: &str,
        holder: &str,
    ) -> Result<(), StoreError> {
        let key = lock_key(account);
        let _: i64 = self
            .eval(UNLOCK, &key.clone(), vec![key], vec![holder.to_owned()])
            .await?;
        Ok(())
    }
}
