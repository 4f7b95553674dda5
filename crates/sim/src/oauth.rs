//! The OAuth side of a subscription account: a token endpoint and access tokens that
//! expire, as Anthropic's do (SPEC 14).
//!
//! - [`SimHandle::issue_tokens`](crate::SimHandle::issue_tokens) logs an account in: an
//!   access token valid for the token lifetime and a refresh token.
//! - `POST …/v1/oauth/token` with `{"grant_type": "refresh_token", "refresh_token": …}`
//!   answers a new pair (`access_token`, `refresh_token`, `expires_in`). Refresh tokens
//!   rotate: each works once; a second use answers `400 invalid_grant` and is counted
//!   ([`OAuthStats::reused`]), as is every grant.
//! - [`SimHandle::authorize`](crate::SimHandle::authorize) is a person logging in at
//!   the authorize page: a code bound to a PKCE challenge, exchanged once with
//!   `{"grant_type": "authorization_code", "code", "code_verifier"}`.
//! - A request with an expired access token gets the `401 authentication_error` the
//!   real API sends ("OAuth token has expired…"); one with a revoked refresh token gets
//!   `invalid_grant`.
//!
//! Times are `tokio::time::Instant`s, so paused time moves expiry too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use keypool_core::AccountId;
use tokio::time::Instant;

/// The message of the real API's `401` for an expired OAuth access token.
pub const EXPIRED_MESSAGE: &str =
    "OAuth token has expired. Please obtain a new token or refresh your existing token.";

/// Tokens handed out by a login or a refresh.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedTokens {
    /// The access token (`Authorization: Bearer`).
    pub access_token: String,
    /// The refresh token (works once).
    pub refresh_token: String,
    /// Seconds until the access token expires.
    pub expires_in: u64,
}

impl std::fmt::Debug for IssuedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedTokens")
            .field("expires_in", &self.expires_in)
            .finish_non_exhaustive()
    }
}

/// Counters of the token endpoint, per account.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OAuthStats {
    /// Refresh grants answered with new tokens.
    pub refreshed: u64,
    /// Refresh tokens presented a second time (refused).
    pub reused: u64,
    /// Refresh grants refused for another reason (unknown or revoked token).
    pub refused: u64,
}

struct Access {
    account: AccountId,
    expires: Instant,
}

struct Refresh {
    account: AccountId,
    used: bool,
}

#[derive(Default)]
struct State {
    access: HashMap<String, Access>,
    refresh: HashMap<String, Refresh>,
    revoked: std::collections::HashSet<AccountId>,
    stats: HashMap<AccountId, OAuthStats>,
    /// Answer every grant with this status (and an error body) while set.
    failing: Option<u16>,
    /// Authorization codes not exchanged yet: the account and the PKCE challenge.
    codes: HashMap<String, (AccountId, String)>,
}

/// What a token request gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Grant {
    /// `200` with new tokens.
    Issued(IssuedTokens),
    /// An OAuth error (`400 invalid_grant`, `400 invalid_request`, or a scripted status).
    Refused {
        status: u16,
        error: &'static str,
        description: String,
    },
}

/// The issuer: every token it gave out and its counters.
pub(crate) struct Issuer {
    lifetime: Mutex<Duration>,
    state: Mutex<State>,
    next: AtomicU64,
}

impl Default for Issuer {
    fn default() -> Self {
        Self {
            lifetime: Mutex::new(Duration::from_secs(8 * 3600)),
            state: Mutex::default(),
            next: AtomicU64::new(1),
        }
    }
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer").finish_non_exhaustive()
    }
}

impl Issuer {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_lifetime(&self, lifetime: Duration) {
        *self.lifetime.lock().unwrap_or_else(PoisonError::into_inner) = lifetime;
    }

    pub(crate) fn set_failing(&self, status: Option<u16>) {
        self.state().failing = status;
    }

    /// New tokens for `account` (a login).
    pub(crate) fn issue(&self, account: &AccountId) -> IssuedTokens {
        let lifetime = *self.lifetime.lock().unwrap_or_else(PoisonError::into_inner);
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let tokens = IssuedTokens {
            access_token: format!("sk-ant-oat01-sim-{}-{n}", account.as_str()),
            refresh_token: format!("sk-ant-ort01-sim-{}-{n}", account.as_str()),
            expires_in: lifetime.as_secs(),
        };
        let mut state = self.state();
        state.access.insert(
            tokens.access_token.clone(),
            Access {
                account: account.clone(),
                expires: Instant::now() + lifetime,
            },
        );
        state.refresh.insert(
            tokens.refresh_token.clone(),
            Refresh {
                account: account.clone(),
                used: false,
            },
        );
        tokens
    }

    /// A login at the authorize page: a code for `account`, bound to the PKCE
    /// `challenge` (S256).
    pub(crate) fn authorize(&self, account: &AccountId, challenge: &str) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let code = format!("sim-code-{}-{n}", account.as_str());
        self.state()
            .codes
            .insert(code.clone(), (account.clone(), challenge.to_owned()));
        code
    }

    /// The `authorization_code` grant: the code once, with the verifier of its challenge.
    fn exchange(&self, request: &serde_json::Value) -> Grant {
        let refused = |error, description: &str| Grant::Refused {
            status: 400,
            error,
            description: description.to_owned(),
        };
        let (Some(code), Some(verifier)) =
            (request["code"].as_str(), request["code_verifier"].as_str())
        else {
            return refused("invalid_request", "code and code_verifier are required");
        };
        let Some((account, challenge)) = self.state().codes.remove(code) else {
            return refused("invalid_grant", "Invalid or used authorization code");
        };
        use sha2::Digest as _;
        let expected = keypool_core::base64url(&sha2::Sha256::digest(verifier.as_bytes()));
        if expected != challenge {
            return refused(
                "invalid_grant",
                "code_verifier does not match the code_challenge",
            );
        }
        Grant::Issued(self.issue(&account))
    }

    /// Every refresh token of `account` stops working.
    pub(crate) fn revoke(&self, account: &AccountId) {
        self.state().revoked.insert(account.clone());
    }

    /// The account an issued access token belongs to, and whether it expired.
    pub(crate) fn account_of(&self, token: &str) -> Option<(AccountId, bool)> {
        let state = self.state();
        let a = state.access.get(token)?;
        Some((a.account.clone(), Instant::now() >= a.expires))
    }

    pub(crate) fn stats(&self, account: &AccountId) -> OAuthStats {
        self.state().stats.get(account).copied().unwrap_or_default()
    }

    /// Answers a token request's JSON body.
    pub(crate) fn grant(&self, body: &[u8]) -> Grant {
        let refused = |status, error, description: &str| Grant::Refused {
            status,
            error,
            description: description.to_owned(),
        };
        let request: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        if request["grant_type"] == "authorization_code" {
            return self.exchange(&request);
        }
        if request["grant_type"] != "refresh_token" {
            return refused(
                400,
                "unsupported_grant_type",
                "grant_type must be refresh_token or authorization_code",
            );
        }
        let Some(token) = request["refresh_token"].as_str() else {
            return refused(400, "invalid_request", "refresh_token is missing");
        };
        let mut state = self.state();
        if let Some(status) = state.failing {
            return refused(
                status,
                "server_error",
                "the token endpoint is failing (scripted)",
            );
        }
        let Some(entry) = state.refresh.get_mut(token) else {
            return refused(400, "invalid_grant", "Invalid refresh token");
        };
        let account = entry.account.clone();
        let reused = std::mem::replace(&mut entry.used, true);
        let revoked = state.revoked.contains(&account);
        let stats = state.stats.entry(account.clone()).or_default();
        if reused {
            stats.reused += 1;
            return refused(400, "invalid_grant", "Refresh token has already been used");
        }
        if revoked {
            stats.refused += 1;
            return refused(400, "invalid_grant", "Refresh token has been revoked");
        }
        stats.refreshed += 1;
        drop(state);
        Grant::Issued(self.issue(&account))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refresh(issuer: &Issuer, token: &str) -> Grant {
        issuer.grant(
            serde_json::json!({"grant_type": "refresh_token", "refresh_token": token})
                .to_string()
                .as_bytes(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn refresh_tokens_rotate_and_access_tokens_expire() {
        let issuer = Issuer::default();
        issuer.set_lifetime(Duration::from_secs(60));
        let a = AccountId::from("a");
        let first = issuer.issue(&a);
        assert_eq!(
            issuer.account_of(&first.access_token),
            Some((a.clone(), false))
        );
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            issuer.account_of(&first.access_token),
            Some((a.clone(), true))
        );
        let Grant::Issued(second) = refresh(&issuer, &first.refresh_token) else {
            panic!("the first use works")
        };
        assert_eq!(second.expires_in, 60);
        assert_eq!(
            issuer.account_of(&second.access_token),
            Some((a.clone(), false))
        );
        let again = refresh(&issuer, &first.refresh_token);
        assert!(matches!(
            again,
            Grant::Refused {
                status: 400,
                error: "invalid_grant",
                ..
            }
        ));
        assert_eq!(
            issuer.stats(&a),
            OAuthStats {
                refreshed: 1,
                reused: 1,
                refused: 0
            }
        );
        issuer.revoke(&a);
        let revoked = refresh(&issuer, &second.refresh_token);
        assert!(matches!(
            revoked,
            Grant::Refused {
                error: "invalid_grant",
                ..
            }
        ));
        assert_eq!(issuer.stats(&a).refused, 1);
        assert!(!format!("{second:?}").contains("sk-ant"));
    }
}
