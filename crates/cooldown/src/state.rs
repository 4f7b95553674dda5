//! [`PoolHealth`]: every book together, one config reload, one export/import.
//!
//! This is what the store mirrors to Redis and snapshots to the local state file. All
//! times in a [`HealthExport`] are absolute unix ms, so a reload at a later `now` keeps
//! exactly the remaining time of every entry (SPEC 6: a 4-hour window cooldown with 3
//! hours left comes back with 3 hours left).
//!
//! ```
//! use keypool_cooldown::{Classification, FailureClass, PoolHealth, Trigger};
//! use keypool_core::AccountId;
//!
//! let health = PoolHealth::default();
//! let a = AccountId::from("a");
//! let window = Classification {
//!     class: FailureClass::RateLimit,
//!     trigger: Trigger::WindowExhausted { reset: 4 * 3_600_000 },
//! };
//! health.cooldowns.record_failure(&a, &window, 0, 10, 1);
//! let json = serde_json::to_string(&health.export(3_600_000)).unwrap();
//!
//! let restored = PoolHealth::default();
//! restored.import(serde_json::from_str(&json).unwrap(), 3_600_000);
//! assert_eq!(restored.cooldowns.cooldown_until(&a, 3_600_000), Some(4 * 3_600_000));
//! ```

use keypool_core::UnixMs;
use serde::{Deserialize, Serialize};

use crate::breaker::CircuitBreakers;
use crate::config::CooldownConfig;
use crate::cooldown::{CooldownBook, CooldownRecord};
use crate::disabled::{DisabledBook, DisabledRecord};
use crate::window::{WindowBook, WindowRecord};

/// The serialisable state of a [`PoolHealth`]. The circuit breakers are not part of it:
/// their state is per replica and lives at most `open_ms`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthExport {
    /// When the export was taken, unix ms (informational; import uses its own `now`).
    pub exported_at: UnixMs,
    /// Cooldown entries.
    pub cooldowns: Vec<CooldownRecord>,
    /// Disabled accounts.
    pub disabled: Vec<DisabledRecord>,
    /// Usage-window states.
    pub windows: Vec<WindowRecord>,
}

/// What [`PoolHealth::import`] took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportCounts {
    /// Cooldown entries kept.
    pub cooldowns: usize,
    /// Disabled accounts kept.
    pub disabled: usize,
    /// Window states kept.
    pub windows: usize,
}

/// The health of a pool's accounts: cooldowns, disabled accounts, usage windows and the
/// per-`base_url` circuit breakers. Thread-safe; share it in an `Arc`.
#[derive(Debug, Default)]
pub struct PoolHealth {
    /// Cooldowns and backoff.
    pub cooldowns: CooldownBook,
    /// Disabled accounts.
    pub disabled: DisabledBook,
    /// Usage windows.
    pub windows: WindowBook,
    /// Circuit breakers.
    pub breakers: CircuitBreakers,
}

impl PoolHealth {
    /// Empty books with `config`.
    pub fn new(config: CooldownConfig) -> Self {
        Self {
            disabled: DisabledBook::new(&config),
            windows: WindowBook::new(&config),
            breakers: CircuitBreakers::new(&config),
            cooldowns: CooldownBook::new(config),
        }
    }

    /// Hands a reloaded config to every book. State is kept.
    pub fn set_config(&self, config: CooldownConfig) {
        self.disabled.set_config(&config);
        self.windows.set_config(&config);
        self.breakers.set_config(&config);
        self.cooldowns.set_config(config);
    }

    /// Every book's state with absolute times.
    pub fn export(&self, now: UnixMs) -> HealthExport {
        HealthExport {
            exported_at: now,
            cooldowns: self.cooldowns.export(),
            disabled: self.disabled.export(),
            windows: self.windows.export(),
        }
    }

    /// Loads an export at `now`: unexpired cooldowns and windows keep their absolute
    /// expiry, expired ones are dropped, disabled accounts are all kept.
    pub fn import(&self, export: HealthExport, now: UnixMs) -> ImportCounts {
        ImportCounts {
            cooldowns: self.cooldowns.import(export.cooldowns, now),
            disabled: self.disabled.import(export.disabled),
            windows: self.windows.import(export.windows, now),
        }
    }
}
