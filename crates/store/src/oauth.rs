//! The tokens of subscription (OAuth) accounts that renew themselves (SPEC 14).
//!
//! An `oauth` account with a `refresh_token` has a [`TokenState`] in the
//! [`TokenBook`]: the access token, refresh token and expiry in force. The config only
//! seeds it: once a refresh rotated the tokens, the rotated ones are used, persisted (the
//! state file, sealed with `KEYPOOL_SECRETS_KEY` when it is set) and restored after a
//! restart, as long as the config's `refresh_token` is the one they grew from (a new
//! login pasted into the config wins).
//!
//! The policy ([`TokenState::due`], [`TokenState::failed`]) takes `now` as an argument:
//! a token is due `refresh_lead` before it expires; a refresh that fails for transport
//! or a 5xx backs off 30 s × 2^n (at most 30 min); `invalid_grant`, or 3 failures in a
//! row, make the account `expired` (no more refreshes until the config gives it a new
//! refresh token). The HTTP call itself is `keypool-proxy`'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use keypool_core::{AccountId, UnixMs};
use serde::{Deserialize, Serialize};

use crate::config::{Config, Secret, sealed};

/// First backoff after a failed refresh.
pub const BACKOFF_BASE_MS: u64 = 30_000;
/// Longest backoff.
pub const BACKOFF_MAX_MS: u64 = 30 * 60_000;
/// Failures in a row that make an account `expired`.
pub const MAX_FAILURES: u32 = 3;

/// The tokens in force for one account.
#[derive(Clone, PartialEq, Eq)]
pub struct Tokens {
    /// The access token (`Authorization: Bearer`).
    pub access: Secret,
    /// The refresh token (rotates at every refresh).
    pub refresh: Secret,
    /// When the access token expires (unix ms); `None`: unknown.
    pub expires_at_ms: Option<UnixMs>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

/// Why a refresh failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshFailure {
    /// Transport error, timeout, or a 5xx/429: worth trying again later.
    Transient,
    /// `invalid_grant` (or any other 4xx): the refresh token is dead.
    InvalidGrant,
}

/// What a failure did to the account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Tried again at this time (unix ms).
    RetryAt(UnixMs),
    /// The account is `expired`: a person must log it in again.
    Expired,
}

/// One account's token lifecycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenState {
    /// The tokens in force.
    pub tokens: Arc<Tokens>,
    /// The config's `refresh_token` these tokens grew from.
    seed: Secret,
    /// Refreshes failed in a row.
    pub failures: u32,
    /// No refresh before this time (unix ms; 0: any time).
    pub retry_at_ms: UnixMs,
    /// The refresh token is dead (`invalid_grant`, or [`MAX_FAILURES`] failures).
    pub expired: bool,
    /// Bumped at every change of the tokens: a waiter tells a refresh made meanwhile.
    pub generation: u64,
}

impl TokenState {
    /// Whether a refresh is due at `now`: not expired, not backing off, and the access
    /// token expires within `lead_ms` (or its expiry is unknown).
    pub fn due(&self, now: UnixMs, lead_ms: u64) -> bool {
        !self.expired
            && self.retry_at_ms <= now
            && self
                .tokens
                .expires_at_ms
                .is_none_or(|at| at.saturating_sub(lead_ms) <= now)
    }

    /// A refresh gave `tokens`.
    pub fn refreshed(&mut self, tokens: Tokens) {
        self.tokens = Arc::new(tokens);
        self.failures = 0;
        self.retry_at_ms = 0;
        self.expired = false;
        self.generation += 1;
    }

    /// A refresh failed at `now`.
    pub fn failed(&mut self, failure: RefreshFailure, now: UnixMs) -> AfterFailure {
        self.failures = self.failures.saturating_add(1);
        if failure == RefreshFailure::InvalidGrant || self.failures >= MAX_FAILURES {
            self.expired = true;
            return AfterFailure::Expired;
        }
        let wait = BACKOFF_BASE_MS
            .saturating_mul(1 << (self.failures - 1).min(16))
            .min(BACKOFF_MAX_MS);
        self.retry_at_ms = now.saturating_add(wait);
        AfterFailure::RetryAt(self.retry_at_ms)
    }
}

/// One account's tokens as persisted: secrets sealed when `KEYPOOL_SECRETS_KEY` is set
/// (else as they are, in a state file only its owner can read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRecord {
    /// The account.
    pub account: AccountId,
    /// The access token.
    pub access: String,
    /// The refresh token.
    pub refresh: String,
    /// The config's refresh token the tokens grew from.
    pub seed: String,
    /// When the access token expires (unix ms).
    pub expires_at_ms: Option<UnixMs>,
    /// Failures in a row, and whether the account is expired.
    pub failures: u32,
    /// …
    pub expired: bool,
}

/// The tokens of every OAuth account with a refresh token, and the logins under way.
#[derive(Debug, Default)]
pub struct TokenBook {
    states: DashMap<AccountId, TokenState>,
    locks: DashMap<AccountId, Arc<tokio::sync::Mutex<()>>>,
    generations: AtomicU64,
    logins: DashMap<String, PendingLogin>,
}

/// How long a login started with `POST /admin/oauth/start` may be finished.
pub const LOGIN_TTL_MS: u64 = 600_000;

/// A PKCE login under way (SPEC 14): started, waiting for the code the person pastes.
#[derive(Clone)]
pub struct PendingLogin {
    /// The account it logs in (new or existing).
    pub account: AccountId,
    /// Its org (for a new account).
    pub org: Option<String>,
    /// The PKCE code verifier (a secret until the exchange).
    pub verifier: String,
    /// When it started (unix ms).
    pub started_at: UnixMs,
}

impl std::fmt::Debug for PendingLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingLogin")
            .field("account", &self.account)
            .field("started_at", &self.started_at)
            .finish_non_exhaustive()
    }
}

/// A PKCE pair (RFC 7636, S256): a random verifier and its challenge.
pub fn pkce_pair() -> (String, String) {
    use rand::{RngCore as _, SeedableRng as _};
    use sha2::Digest as _;
    let mut bytes = [0u8; 32];
    rand::rngs::StdRng::from_os_rng().fill_bytes(&mut bytes);
    let verifier = keypool_core::base64url(&bytes);
    let challenge = keypool_core::base64url(&sha2::Sha256::digest(verifier.as_bytes()));
    (verifier, challenge)
}

/// The challenge of a verifier.
pub fn pkce_challenge(verifier: &str) -> String {
    use sha2::Digest as _;
    keypool_core::base64url(&sha2::Sha256::digest(verifier.as_bytes()))
}

impl TokenBook {
    /// Starts a login of `account`: its `state` (the key of [`TokenBook::finish_login`])
    /// and PKCE challenge. Logins older than [`LOGIN_TTL_MS`] are dropped.
    pub fn start_login(
        &self,
        account: AccountId,
        org: Option<String>,
        now: UnixMs,
    ) -> (String, String) {
        self.logins
            .retain(|_, l| now.saturating_sub(l.started_at) < LOGIN_TTL_MS);
        let (verifier, challenge) = pkce_pair();
        let (state, _) = pkce_pair();
        self.logins.insert(
            state.clone(),
            PendingLogin {
                account,
                org,
                verifier,
                started_at: now,
            },
        );
        (state, challenge)
    }

    /// The login started as `state`, once (`None`: unknown, finished or too old).
    pub fn finish_login(&self, state: &str, now: UnixMs) -> Option<PendingLogin> {
        let (_, login) = self.logins.remove(state)?;
        (now.saturating_sub(login.started_at) < LOGIN_TTL_MS).then_some(login)
    }
}

impl TokenBook {
    /// Seeds the accounts of `config` (at boot and at every install): an account whose
    /// state grew from the config's `refresh_token` keeps it; a new account, or one
    /// whose `refresh_token` changed in the config, starts from the config.
    pub fn seed(&self, config: &Config) {
        for account in config.accounts() {
            let Some(seed) = account.oauth() else {
                continue;
            };
            if self
                .states
                .get(account.id())
                .is_some_and(|s| s.seed == seed.refresh_token)
            {
                continue;
            }
            let tokens = Tokens {
                access: account.secret().clone(),
                refresh: seed.refresh_token.clone(),
                expires_at_ms: seed.expires_at_ms,
            };
            self.states.insert(
                account.id().clone(),
                TokenState {
                    tokens: Arc::new(tokens),
                    seed: seed.refresh_token.clone(),
                    failures: 0,
                    retry_at_ms: 0,
                    expired: false,
                    generation: self.generations.fetch_add(1, Ordering::Relaxed),
                },
            );
        }
    }

    /// The tokens in force for `id` (`None`: not an account with a refresh token).
    pub fn current(&self, id: &AccountId) -> Option<Arc<Tokens>> {
        self.states.get(id).map(|s| s.tokens.clone())
    }

    /// A copy of `id`'s state.
    pub fn state(&self, id: &AccountId) -> Option<TokenState> {
        self.states.get(id).map(|s| s.clone())
    }

    /// The accounts due for a refresh at `now`.
    pub fn due(&self, now: UnixMs, lead_ms: u64) -> Vec<AccountId> {
        self.states
            .iter()
            .filter(|s| s.due(now, lead_ms))
            .map(|s| s.key().clone())
            .collect()
    }

    /// The lock one refresh of `id` holds: one at a time per account in this process.
    pub fn lock(&self, id: &AccountId) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.entry(id.clone()).or_default().clone()
    }

    /// Records new tokens for `id`.
    pub fn refreshed(&self, id: &AccountId, tokens: Tokens) {
        if let Some(mut s) = self.states.get_mut(id) {
            s.refreshed(tokens);
            s.generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        }
    }

    /// Records a failed refresh of `id` at `now`.
    pub fn failed(
        &self,
        id: &AccountId,
        failure: RefreshFailure,
        now: UnixMs,
    ) -> Option<AfterFailure> {
        self.states.get_mut(id).map(|mut s| s.failed(failure, now))
    }

    /// Every state, for persistence (`key`: `KEYPOOL_SECRETS_KEY`, sealing the tokens).
    pub fn export(&self, key: Option<&str>) -> Vec<TokenRecord> {
        // A key that cannot seal (malformed) keeps the value as it is rather than
        // losing it: the state file is its owner's only.
        let seal = |s: &Secret| match key {
            Some(_) => sealed::seal(key, s.expose()).unwrap_or_else(|_| s.expose().to_owned()),
            None => s.expose().to_owned(),
        };
        let mut out: Vec<TokenRecord> = self
            .states
            .iter()
            .map(|s| TokenRecord {
                account: s.key().clone(),
                access: seal(&s.tokens.access),
                refresh: seal(&s.tokens.refresh),
                seed: seal(&s.seed),
                expires_at_ms: s.tokens.expires_at_ms,
                failures: s.failures,
                expired: s.expired,
            })
            .collect();
        out.sort_by(|a, b| a.account.cmp(&b.account));
        out
    }

    /// `id`'s state as persisted and shared (see [`TokenBook::export`]).
    pub fn record_of(&self, id: &AccountId, key: Option<&str>) -> Option<TokenRecord> {
        self.export(key).into_iter().find(|r| &r.account == id)
    }

    /// Restores persisted states (before or after [`TokenBook::seed`]: a record whose
    /// seed is not the config's is replaced by the next seeding). A record that cannot
    /// be opened (sealed with another key) is skipped; the count is returned.
    pub fn import(&self, records: Vec<TokenRecord>, key: Option<&str>) -> usize {
        let mut skipped = 0;
        for r in records {
            if self.take(r, key, false).is_none() {
                skipped += 1;
            }
        }
        skipped
    }

    /// Takes tokens another replica shared, when they grew from the same config seed
    /// and expire later than the ones in force. Returns whether they were taken.
    pub fn adopt(&self, record: TokenRecord, key: Option<&str>) -> bool {
        self.take(record, key, true) == Some(true)
    }

    /// Installs `r` (`None`: it cannot be opened). `newer_only`: only when it expires
    /// later than the state in force (and grew from its seed).
    fn take(&self, r: TokenRecord, key: Option<&str>, newer_only: bool) -> Option<bool> {
        let open = |v: &str| {
            if sealed::is_sealed(v) {
                sealed::open(key, v).ok().map(Secret::new)
            } else {
                Some(Secret::new(v))
            }
        };
        let (access, refresh, seed) = (open(&r.access)?, open(&r.refresh)?, open(&r.seed)?);
        if let Some(current) = self.states.get(&r.account) {
            // the config names another login now: its seeding wins
            if current.seed != seed {
                return Some(false);
            }
            let later = match (r.expires_at_ms, current.tokens.expires_at_ms) {
                (Some(theirs), Some(ours)) => theirs > ours,
                (Some(_), None) => true,
                _ => false,
            };
            if newer_only && (!later || current.tokens.refresh == refresh) {
                return Some(false);
            }
        } else if newer_only {
            return Some(false);
        }
        self.states.insert(
            r.account,
            TokenState {
                tokens: Arc::new(Tokens {
                    access,
                    refresh,
                    expires_at_ms: r.expires_at_ms,
                }),
                seed,
                failures: r.failures,
                retry_at_ms: 0,
                expired: r.expired,
                generation: self.generations.fetch_add(1, Ordering::Relaxed) + 1,
            },
        );
        Some(true)
    }
}

/// Whose turn a refresh is, across replicas (with Redis).
#[derive(Debug)]
pub enum RefreshTurn {
    /// This replica refreshes, holding the shared lock as `holder`
    /// ([`crate::Store::end_refresh`] releases it).
    Mine {
        /// The lock's value.
        holder: String,
    },
    /// Another replica rotated the tokens: these are in force now.
    Adopted(Arc<Tokens>),
    /// Another replica holds the lock and did not share new tokens in time.
    Busy,
    /// No Redis (or it does not answer): this replica refreshes on its own.
    Alone,
}

/// How often a replica waiting for another one's refresh reads the shared tokens.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(100);

impl crate::Store {
    /// Before a refresh of `id`: takes the tokens another replica already shared, or
    /// the shared lock, or waits (at most `wait`) for the replica that holds it.
    pub async fn begin_refresh(&self, id: &AccountId, wait: std::time::Duration) -> RefreshTurn {
        let Some(mirror) = self.redis().filter(|m| m.ready()) else {
            return RefreshTurn::Alone;
        };
        let key = secrets_key();
        let book = self.oauth_tokens();
        let adopted = |r: Option<TokenRecord>| {
            r.filter(|r| book.adopt(r.clone(), key.as_deref()))
                .and_then(|_| book.current(id))
        };
        let Ok(shared) = mirror.shared_tokens(id.as_str()).await else {
            return RefreshTurn::Alone;
        };
        if let Some(tokens) = adopted(shared) {
            return RefreshTurn::Adopted(tokens);
        }
        let holder = format!("{}-{}", mirror.origin(), crate::now_ms());
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match mirror.lock_refresh(id.as_str(), &holder).await {
                Err(_) => return RefreshTurn::Alone,
                Ok(true) => {
                    // what the previous holder shared just before releasing
                    let shared = mirror.shared_tokens(id.as_str()).await.ok().flatten();
                    if let Some(tokens) = adopted(shared) {
                        let _ = mirror.unlock_refresh(id.as_str(), &holder).await;
                        return RefreshTurn::Adopted(tokens);
                    }
                    return RefreshTurn::Mine { holder };
                }
                Ok(false) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return RefreshTurn::Busy;
            }
            tokio::time::sleep(WAIT_POLL).await;
            let shared = mirror.shared_tokens(id.as_str()).await.ok().flatten();
            if let Some(tokens) = adopted(shared) {
                return RefreshTurn::Adopted(tokens);
            }
        }
    }

    /// After this replica's refresh of `id` ([`RefreshTurn::Mine`]): shares the new
    /// tokens (when `refreshed`) and releases the lock.
    pub async fn end_refresh(&self, id: &AccountId, holder: &str, refreshed: bool) {
        let Some(mirror) = self.redis() else {
            return;
        };
        if refreshed
            && let Some(record) = self.oauth_tokens().record_of(id, secrets_key().as_deref())
            && let Err(e) = mirror.save_tokens(&record).await
        {
            tracing::warn!(account = %id, error = %e, "the rotated OAuth tokens could not be shared through redis");
        }
        let _ = mirror.unlock_refresh(id.as_str(), holder).await;
    }
}

/// `KEYPOOL_SECRETS_KEY`, which seals the tokens shared and persisted.
fn secrets_key() -> Option<String> {
    std::env::var(sealed::SECRETS_KEY_ENV).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state(expires_at_ms: Option<u64>) -> TokenState {
        TokenState {
            tokens: Arc::new(Tokens {
                access: Secret::new("a"),
                refresh: Secret::new("r"),
                expires_at_ms,
            }),
            seed: Secret::new("r"),
            failures: 0,
            retry_at_ms: 0,
            expired: false,
            generation: 0,
        }
    }

    #[test]
    fn due_at_the_lead_before_expiry_and_backoff_doubles_then_expires() {
        let s = state(Some(1_000_000));
        assert!(!s.due(1_000_000 - 300_001, 300_000));
        assert!(s.due(1_000_000 - 300_000, 300_000));
        assert!(
            state(None).due(0, 300_000),
            "an unknown expiry is refreshed at once"
        );
        let mut s = state(Some(0));
        assert_eq!(
            s.failed(RefreshFailure::Transient, 10),
            AfterFailure::RetryAt(30_010)
        );
        assert!(!s.due(30_009, 0));
        assert!(s.due(30_010, 0));
        assert_eq!(
            s.failed(RefreshFailure::Transient, 100),
            AfterFailure::RetryAt(60_100)
        );
        assert_eq!(
            s.failed(RefreshFailure::Transient, 200),
            AfterFailure::Expired
        );
        assert!(!s.due(u64::MAX, 0), "an expired account is not refreshed");
        let mut s = state(Some(0));
        assert_eq!(
            s.failed(RefreshFailure::InvalidGrant, 0),
            AfterFailure::Expired
        );
    }

    proptest! {
        /// The state machine: a success always resets; failures never wait longer than
        /// the cap nor less than the base; at most MAX_FAILURES failures before expired;
        /// an expired state is never due until refreshed.
        #[test]
        fn the_refresh_state_machine_holds_its_bounds(
            steps in proptest::collection::vec((any::<bool>(), any::<bool>(), 0u64..10_000_000), 1..40)
        ) {
            let mut s = state(Some(5_000_000));
            let mut in_a_row = 0u32;
            let mut now = 0u64;
            for (success, invalid, dt) in steps {
                now += dt;
                if success {
                    s.refreshed(Tokens { access: Secret::new("x"), refresh: Secret::new("y"), expires_at_ms: Some(now + 3_600_000) });
                    in_a_row = 0;
                    prop_assert!(!s.expired && s.failures == 0 && s.retry_at_ms == 0);
                    continue;
                }
                if s.expired {
                    prop_assert!(!s.due(now, u64::MAX));
                    continue;
                }
                in_a_row += 1;
                let failure = if invalid { RefreshFailure::InvalidGrant } else { RefreshFailure::Transient };
                match s.failed(failure, now) {
                    AfterFailure::Expired => prop_assert!(invalid || in_a_row >= MAX_FAILURES),
                    AfterFailure::RetryAt(at) => {
                        prop_assert!(!invalid && in_a_row < MAX_FAILURES);
                        prop_assert!(at >= now + BACKOFF_BASE_MS && at <= now + BACKOFF_MAX_MS);
                        prop_assert!(!s.due(at - 1, u64::MAX) && s.due(at, u64::MAX));
                    }
                }
            }
        }
    }
}
