//! [`GuardedResolver`]: how every connection `fred` makes reaches Redis through the
//! reply guard, whatever the topology.
//!
//! A single server, a Sentinel deployment (the sentinels, then the primary they
//! name, again after a failover) and a Cluster (the seed nodes, then every node
//! `CLUSTER SLOTS` names, and any node a `MOVED`/`ASK` redirection names) all make
//! `fred` open TCP connections to addresses it learns at run time. `fred` resolves
//! each `host:port` through its `Resolve` hook before it connects, for every kind of
//! connection; keypool installs this resolver on both of its clients, so that the
//! address `fred` connects to is always a [`RespGuard`] on loopback: the first time a
//! `host:port` is asked for, a relay to it is started and its loopback address is
//! returned; later asks get the same relay. `fred` never receives any other address,
//! so no reply reaches its decoder unchecked.
//!
//! The number of relays is bounded ([`MAX_RELAYS`]): a topology naming more distinct
//! nodes than that is refused (the connection fails, keypool serves from memory).

use std::collections::HashMap;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::error::{Error as FredError, ErrorKind as FredErrorKind};
use fred::types::Resolve;

use super::resp_guard::RespGuard;

/// Most distinct Redis nodes one store relays to (sentinels, primaries, replicas and
/// cluster nodes together): far above any topology keypool would meet, and a bound
/// on the listeners and tasks a hostile topology could make it start.
pub const MAX_RELAYS: usize = 128;

/// The resolver `fred` uses: every `host:port` becomes the loopback address of a
/// reply guard relaying to it. Cheap to clone; the relays stop when the last clone is
/// dropped.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    connect_timeout: Duration,
    relays: tokio::sync::Mutex<HashMap<String, RespGuard>>,
    /// The targets relayed so far, readable without awaiting (for status and tests).
    targets: Mutex<Vec<String>>,
}

impl GuardedResolver {
    /// A resolver whose relays bound each connection to Redis by `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                connect_timeout,
                relays: tokio::sync::Mutex::new(HashMap::new()),
                targets: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The loopback address of the relay to `host:port`, started on first use.
    ///
    /// # Errors
    /// When no loopback port can be listened on, or [`MAX_RELAYS`] relays exist.
    pub async fn relay_for(&self, host: &str, port: u16) -> Result<SocketAddr, String> {
        let target = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let mut relays = self.inner.relays.lock().await;
        if let Some(relay) = relays.get(&target) {
            return Ok(loopback(relay.port()));
        }
        if relays.len() >= MAX_RELAYS {
            return Err(format!(
                "the Redis topology names more than {MAX_RELAYS} nodes; refusing to relay to another"
            ));
        }
        let relay = RespGuard::start(target.clone(), self.inner.connect_timeout)
            .await
            .map_err(|e| e.to_string())?;
        let addr = loopback(relay.port());
        relays.insert(target.clone(), relay);
        self.inner
            .targets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(target);
        Ok(addr)
    }

    /// Every `host:port` relayed to so far, in the order they were first asked for.
    pub fn targets(&self) -> Vec<String> {
        self.inner
            .targets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

impl Resolve for GuardedResolver {
    // what `#[async_trait]` (fred's declaration of the trait) expands to, written out
    // so that keypool needs no macro crate for it
    fn resolve<'life0, 'async_trait>(
        &'life0 self,
        host: Str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<SocketAddr>, FredError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            self.relay_for(&host, port)
                .await
                .map(|addr| vec![addr])
                .map_err(|e| FredError::new(FredErrorKind::IO, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_address_becomes_one_loopback_relay() {
        let resolver = GuardedResolver::new(Duration::from_millis(100));
        let a = resolver.relay_for("10.1.2.3", 7000).await.unwrap();
        let b = resolver.relay_for("redis.internal", 6379).await.unwrap();
        let v6 = resolver.relay_for("::1", 6380).await.unwrap();
        assert!(a.ip().is_loopback() && b.ip().is_loopback() && v6.ip().is_loopback());
        assert_ne!(a, b);
        assert_eq!(resolver.relay_for("10.1.2.3", 7000).await.unwrap(), a);
        let resolved = resolver
            .resolve(Str::from("redis.internal"), 6379)
            .await
            .unwrap();
        assert_eq!(resolved, vec![b]);
        assert_eq!(
            resolver.targets(),
            ["10.1.2.3:7000", "redis.internal:6379", "[::1]:6380"]
        );
    }

    #[tokio::test]
    async fn the_number_of_relays_is_bounded() {
        let resolver = GuardedResolver::new(Duration::from_millis(100));
        for port in 0..MAX_RELAYS {
            resolver
                .relay_for("127.0.0.1", 10_000 + port as u16)
                .await
                .unwrap();
        }
        // a known one still resolves; a new one is refused
        assert!(resolver.relay_for("127.0.0.1", 10_000).await.is_ok());
        assert!(resolver.relay_for("127.0.0.1", 9_999).await.is_err());
    }
}
