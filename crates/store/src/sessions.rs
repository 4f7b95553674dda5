//! Session affinity bindings: session → the account that last served it, with a TTL
//! refreshed on every use.
//!
//! Keys are scoped by the caller (`{org}/{custom_url}/{session}`), so one session id
//! used on two URL configs has two bindings. With Redis the binding lives in
//! `keypool:session:{key}` (`PX` TTL) so that replicas agree; this in-memory book is the
//! fallback while Redis does not answer, and the whole store without Redis.

use dashmap::DashMap;
use keypool_core::{AccountId, UnixMs};

/// In-memory session bindings with absolute expiries.
#[derive(Debug, Default)]
pub struct SessionBook {
    bindings: DashMap<String, (AccountId, UnixMs)>,
}

impl SessionBook {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// The account bound to `key`, unless the binding expired at `now`.
    pub fn get(&self, key: &str, now: UnixMs) -> Option<AccountId> {
        self.bindings
            .get(key)
            .filter(|b| b.1 > now)
            .map(|b| b.0.clone())
    }

    /// Binds `key` to `account` until `now + ttl_ms`.
    pub fn bind(&self, key: &str, account: &AccountId, ttl_ms: u64, now: UnixMs) {
        self.bindings.insert(
            key.to_owned(),
            (account.clone(), now.saturating_add(ttl_ms)),
        );
    }

    /// Drops the bindings expired at `now`.
    pub fn purge(&self, now: UnixMs) {
        self.bindings.retain(|_, b| b.1 > now);
    }

    /// How many bindings are held (expired ones included until purged).
    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    /// Whether no binding is held.
    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_lasts_its_ttl_and_rebinding_refreshes_it() {
        let book = SessionBook::new();
        let (a, b) = (AccountId::from("a"), AccountId::from("b"));
        book.bind("acme/team/s1", &a, 1_000, 10_000);
        assert_eq!(book.get("acme/team/s1", 10_999), Some(a.clone()));
        assert_eq!(book.get("acme/team/s1", 11_000), None);
        assert_eq!(book.get("acme/other/s1", 10_000), None);
        book.bind("acme/team/s1", &b, 1_000, 10_900);
        assert_eq!(book.get("acme/team/s1", 11_500), Some(b));
        book.purge(11_900);
        assert!(book.is_empty());
    }
}
