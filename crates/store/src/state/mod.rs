//! Runtime state: the in-memory books the request path reads synchronously, and the
//! persistence layered around them (a local state file, or a Redis mirror).
//!
//! The books themselves belong to the policy crates: `keypool-cooldown`'s
//! [`PoolHealth`] (cooldowns, disabled accounts, usage windows, breakers) and
//! `keypool-selector`'s [`RatingEngine`] and [`MemoryCounter`] (the local rotation
//! counters). This module adds what only the store needs: the `last_used` time of each
//! account, and the serialisable [`StateExport`] of everything with absolute times.

pub(crate) mod file;
pub(crate) mod redis;
pub(crate) mod redis_document;
pub(crate) mod redis_limits;
pub(crate) mod redis_oauth;
pub mod relays;
pub mod resp_guard;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use keypool_cooldown::{HealthExport, ImportCounts, PoolHealth};
use keypool_core::{AccountId, UnixMs};
use keypool_ledger::{AggregateKey, Totals, UsageRecord};
use keypool_selector::{MemoryCounter, RatingEngine, RatingState};

use crate::usage::UsageBook;
use serde::{Deserialize, Serialize};

pub use file::StateFileLoad;

/// The version written into state files; a file of another version is set aside.
pub const STATE_FILE_VERSION: u32 = 1;

/// Everything persisted, with absolute unix-ms times: a state file's content.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateExport {
    /// Always [`STATE_FILE_VERSION`].
    pub version: u32,
    /// When it was taken (informational).
    pub exported_at: UnixMs,
    /// Cooldowns, disabled accounts, usage windows.
    pub health: HealthExport,
    /// Rating averages and recent TTFT samples.
    pub rating: RatingState,
    /// Rotation counters by pool key (`org/group`).
    pub counters: BTreeMap<String, u64>,
    /// When each account last served, unix ms.
    pub last_used: BTreeMap<AccountId, UnixMs>,
    /// The usage ledger: totals and recent records (absent in files of older versions).
    #[serde(default)]
    pub usage: UsageExport,
    /// The caller limits' request-rate cells still ahead: `(org, key id, theoretical
    /// arrival time in µs)`. The budgets need nothing here: they start from the usage
    /// totals above.
    #[serde(default)]
    pub limit_cells: Vec<(Arc<str>, Arc<str>, u64)>,
    /// The tokens of OAuth accounts that renewed themselves (SPEC 14), sealed with
    /// `KEYPOOL_SECRETS_KEY` when it is set.
    #[serde(default)]
    pub oauth: Vec<crate::oauth::TokenRecord>,
}

/// `KEYPOOL_SECRETS_KEY`, which seals the OAuth tokens persisted.
fn secrets_key() -> Option<String> {
    std::env::var(crate::config::sealed::SECRETS_KEY_ENV).ok()
}

/// The usage ledger's persisted part.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageExport {
    /// Totals per period, dimension, org and key.
    pub aggregates: Vec<(AggregateKey, Totals)>,
    /// The recent records, oldest first.
    pub recent: Vec<Arc<UsageRecord>>,
}

/// The in-memory runtime state: the request path's source of truth.
#[derive(Debug)]
pub struct RuntimeState {
    /// Cooldowns, disabled accounts, usage windows, circuit breakers.
    pub health: PoolHealth,
    /// The rating engine.
    pub rating: RatingEngine,
    /// Local rotation counters by pool key (the fallback when Redis is configured).
    pub counters: MemoryCounter,
    /// The usage ledger's books.
    pub usage: UsageBook,
    /// The caller limits of this process (SPEC 12).
    pub limits: keypool_ledger::LimitBook,
    /// The tokens of OAuth accounts that renew themselves (SPEC 14).
    pub oauth: crate::oauth::TokenBook,
    /// When each account last served (hashed with `foldhash`: written on every request,
    /// and the keys are the configuration's account ids).
    last_used: DashMap<AccountId, AtomicU64, foldhash::fast::RandomState>,
}

impl RuntimeState {
    /// Empty state with the given books.
    pub fn new(health: PoolHealth, rating: RatingEngine, usage: UsageBook) -> Self {
        Self {
            health,
            rating,
            counters: MemoryCounter::new(),
            usage,
            limits: keypool_ledger::LimitBook::new(),
            oauth: crate::oauth::TokenBook::default(),
            last_used: DashMap::default(),
        }
    }

    /// When `id` last served (0 = never).
    pub fn last_used(&self, id: &AccountId) -> UnixMs {
        self.last_used
            .get(id)
            .map_or(0, |v| v.load(Ordering::Relaxed))
    }

    /// Records that `id` served at `now` (never moves backwards). An account that
    /// already served in this millisecond (a busy one, many times over) is only read:
    /// no write to the line every serving thread shares.
    pub fn mark_used(&self, id: &AccountId, now: UnixMs) {
        if let Some(v) = self.last_used.get(id) {
            if v.load(Ordering::Relaxed) < now {
                v.fetch_max(now, Ordering::Relaxed);
            }
            return;
        }
        self.last_used
            .entry(id.clone())
            .or_default()
            .fetch_max(now, Ordering::Relaxed);
    }

    /// Everything, with absolute times.
    pub fn export(&self, now: UnixMs) -> StateExport {
        StateExport {
            version: STATE_FILE_VERSION,
            exported_at: now,
            health: self.health.export(now),
            rating: self.rating.export(now),
            counters: self.counters.export(),
            last_used: self
                .last_used
                .iter()
                .map(|e| (e.key().clone(), e.value().load(Ordering::Relaxed)))
                .collect(),
            usage: UsageExport {
                aggregates: self.usage.aggregates.export(),
                recent: self.usage.recent.export(),
            },
            limit_cells: self.limits.export_cells(now),
            oauth: self.oauth.export(secrets_key().as_deref()),
        }
    }

    /// Merges an export in at `now`: unexpired entries keep their absolute expiry
    /// (expired ones are dropped, times beyond their bound are bounded and reported),
    /// counters and `last_used` only move forward.
    pub fn import(&self, export: StateExport, now: UnixMs) -> ImportCounts {
        self.rating.import(&export.rating);
        for (pool, value) in &export.counters {
            self.counters.raise_to(pool, *value);
        }
        for (id, at) in &export.last_used {
            self.mark_used(id, *at);
        }
        self.usage.aggregates.import(export.usage.aggregates);
        self.limits.import_cells(export.limit_cells);
        let skipped = self.oauth.import(export.oauth, secrets_key().as_deref());
        if skipped > 0 {
            tracing::warn!(
                skipped,
                "OAuth tokens in the state were sealed with another KEYPOOL_SECRETS_KEY: those accounts start from their config tokens"
            );
        }
        for record in export.usage.recent {
            self.usage.recent.push(&record);
        }
        self.health.import(export.health, now)
    }
}
