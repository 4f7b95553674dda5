//! Subscription accounts that renew their access token (SPEC 14): the token
//! endpoint's calls, the refresh-ahead loop, and the retry of an expired-token `401`.
//!
//! - The tokens in force are the store's ([`keypool_store::oauth::TokenBook`]); an
//!   attempt sends the current access token ([`access_token`]).
//! - [`spawn_refresher`]: every second, each account whose token expires within
//!   `[oauth] refresh_lead_secs` is refreshed (disabled accounts too: only `expired`
//!   stops it).
//! - [`attempt_with_refresh`]: an attempt answered `401` because the token expired
//!   refreshes and tries the same account once more; that `401` is neither a key
//!   error nor a failover.
//! - One refresh per account at a time in this process: the others wait for it and
//!   use its tokens (a refresh token works once; a second use of the old one fails).
//!   With Redis, one at a time across replicas too
//!   ([`keypool_store::Store::begin_refresh`]): a replica first takes the tokens
//!   another one shared, else the shared lock, else waits for the holder's tokens.
//! - A transport failure, timeout, 429 or 5xx backs off; `invalid_grant` (any other
//!   4xx), or three failures in a row, make the account `expired`: it is disabled with
//!   that reason (SPEC 14; a person logs it in again and puts the new tokens in the
//!   config).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use keypool_core::AccountId;
use keypool_store::alerts::{AlertEvent, AlertKind};
use keypool_store::config::Account;
use keypool_store::now_ms;
use keypool_store::oauth::{AfterFailure, RefreshFailure, RefreshTurn, Tokens};

use crate::App;
use crate::attempt::{Call, Failure, Ready, attempt};

/// How often the refresh-ahead loop looks for tokens due.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The access token in force for `account` when it renews itself (`None`: its
/// configured secret).
pub(crate) fn access_token(app: &App, account: &Account) -> Option<Arc<Tokens>> {
    account.oauth()?;
    app.store().oauth_tokens().current(account.id())
}

/// Why a refresh gave no token.
#[derive(Debug)]
pub(crate) enum RefreshError {
    /// The account does not renew itself, or is `expired`.
    NotRenewable,
    /// The endpoint refused or could not be reached (recorded: backoff or expired).
    Failed,
}

/// Refreshes `account`'s access token unless another refresh made a newer one since
/// `seen` (the generation the caller used): then that one is returned.
pub(crate) async fn refresh(
    app: &App,
    account: &Account,
    seen: Option<u64>,
) -> Result<Arc<Tokens>, RefreshError> {
    let book = app.store().oauth_tokens();
    let lock = book.lock(account.id());
    let _one_at_a_time = lock.lock().await;
    let state = book.state(account.id()).ok_or(RefreshError::NotRenewable)?;
    if seen.is_some_and(|g| state.generation != g) {
        return Ok(state.tokens);
    }
    if state.expired {
        return Err(RefreshError::NotRenewable);
    }
    // Across replicas: another one may have rotated the tokens, or be doing it now.
    let wait = Duration::from_millis(app.store().config().oauth().refresh_timeout_ms + 2_000);
    let holder = match app.store().begin_refresh(account.id(), wait).await {
        RefreshTurn::Adopted(tokens) => return Ok(tokens),
        RefreshTurn::Busy => return Err(RefreshError::Failed),
        RefreshTurn::Mine { holder } => Some(holder),
        RefreshTurn::Alone => None,
    };
    let tokens = book.current(account.id()).unwrap_or(state.tokens);
    let now = now_ms();
    let outcome = call_token_endpoint(app, account, &tokens).await;
    if let Ok(tokens) = &outcome {
        book.refreshed(account.id(), tokens.clone());
    }
    if let Some(holder) = &holder {
        app.store()
            .end_refresh(account.id(), holder, outcome.is_ok())
            .await;
    }
    let answer = match outcome {
        Ok(_) => {
            app.metrics().oauth_refresh(account.id(), "refreshed");
            tracing::info!(account = %account.id(), "oauth access token refreshed");
            book.current(account.id()).ok_or(RefreshError::NotRenewable)
        }
        Err(failure) => {
            record_failure(app, account, failure, now);
            Err(RefreshError::Failed)
        }
    };
    app.store().persist_tokens().await;
    answer
}

/// A refresh that failed: backing off, or the account is `expired` (disabled).
fn record_failure(app: &App, account: &Account, failure: RefreshFailure, now: u64) {
    let book = app.store().oauth_tokens();
    match book.failed(account.id(), failure, now) {
        Some(AfterFailure::RetryAt(at)) => {
            app.metrics().oauth_refresh(account.id(), "failed");
            tracing::warn!(account = %account.id(), retry_in_ms = at.saturating_sub(now), "oauth refresh failed; backing off");
            alert(
                app,
                account,
                AlertKind::OauthRefreshFailed,
                format!(
                    "the token endpoint could not refresh the access token; retried in {} s",
                    at.saturating_sub(now).div_ceil(1000)
                ),
                now,
            );
        }
        Some(AfterFailure::Expired) | None => {
            app.metrics().oauth_refresh(account.id(), "expired");
            tracing::error!(account = %account.id(), "oauth refresh token refused: the account is expired; log it in again");
            let reason = "expired: the OAuth refresh was refused; log the account in again";
            app.store().disable_as(
                account.id(),
                keypool_cooldown::Terminal::Expired,
                reason,
                now,
            );
            let why = match failure {
                RefreshFailure::InvalidGrant => "the refresh token was refused (invalid_grant)",
                RefreshFailure::Transient => "the refresh failed 3 times in a row",
            };
            alert(
                app,
                account,
                AlertKind::AccountExpired,
                format!("{why}: log the account in again (keypool oauth login)"),
                now,
            );
        }
    }
}

/// One refresh grant: `POST token_url` with the refresh token and client id.
async fn call_token_endpoint(
    app: &App,
    account: &Account,
    tokens: &Tokens,
) -> Result<Tokens, RefreshFailure> {
    let body = serde_json::json!({
        "grant_type": "refresh_token",
        "refresh_token": tokens.refresh.expose(),
        "client_id": app.store().config().oauth().client_id,
    });
    let (status, bytes) = post_token(app, Some(account), &body).await?;
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        return Err(RefreshFailure::Transient);
    }
    if !status.is_success() {
        return Err(RefreshFailure::InvalidGrant);
    }
    parse_grant(&bytes, now_ms()).ok_or(RefreshFailure::Transient)
}

/// `POST token_url` with `body` (through `account`'s egress, else the shared client),
/// bounded by `refresh_timeout_ms`: the answer's status and body.
pub(crate) async fn post_token(
    app: &App,
    account: Option<&Account>,
    body: &serde_json::Value,
) -> Result<(StatusCode, Bytes), RefreshFailure> {
    let config = app.store().config();
    let settings = config.oauth();
    let request = http::Request::post(&settings.token_url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|_| RefreshFailure::InvalidGrant)?;
    let timeout = Duration::from_millis(settings.refresh_timeout_ms);
    let exchange = async {
        let response = app
            .client_of(account)
            .request(request)
            .await
            .map_err(|_| RefreshFailure::Transient)?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|_| RefreshFailure::Transient)?
            .to_bytes();
        Ok::<_, RefreshFailure>((status, bytes))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| RefreshFailure::Transient)?
}

fn alert(app: &App, account: &Account, kind: AlertKind, reason: String, now: u64) {
    let subject = app.store().account_subject(account.id());
    app.store()
        .alert(AlertEvent::new(kind, subject, reason, now));
}

/// The tokens of a `200` grant: `access_token`, `refresh_token` (the old one when the
/// endpoint sends none), `expires_in` seconds from `now`.
pub(crate) fn parse_grant(bytes: &[u8], now: u64) -> Option<Tokens> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let access = v["access_token"].as_str().filter(|s| !s.is_empty())?;
    let refresh = v["refresh_token"].as_str().filter(|s| !s.is_empty())?;
    let expires_at_ms = v["expires_in"]
        .as_u64()
        .map(|s| now.saturating_add(s.saturating_mul(1000)));
    Some(Tokens {
        access: keypool_store::config::Secret::new(access),
        refresh: keypool_store::config::Secret::new(refresh),
        expires_at_ms,
    })
}

/// Whether a `401` body says the access token expired.
fn says_expired(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    text.contains("expired")
}

/// [`attempt`], and once more with a refreshed token when the account renews itself
/// and the first answer was an expired-token `401`.
pub(crate) async fn attempt_with_refresh(
    call: &Call<'_>,
    account: Arc<Account>,
    first_chunk: &AtomicBool,
) -> Result<Ready, Failure> {
    let seen = account
        .oauth()
        .and_then(|_| call.app.store().oauth_tokens().state(account.id()))
        .map(|s| s.generation);
    let outcome = attempt(call, account.clone(), first_chunk).await;
    let Err(Failure::Status { status, body, .. }) = &outcome else {
        return outcome;
    };
    if *status != StatusCode::UNAUTHORIZED || seen.is_none() || !says_expired(body) {
        return outcome;
    }
    tracing::info!(account = %account.id(), "access token expired; refreshing and trying the account again");
    // Boxed: the refresh (a store round trip) would make every attempt's future, which
    // the walk boxes once per attempt, ten times larger (11.5 against 1.4 KB), and the
    // walk's boxing copies it whole (`docs/BENCHMARKS.md`, issue 22).
    match Box::pin(refresh(call.app, &account, seen)).await {
        Ok(_) => attempt(call, account, first_chunk).await,
        // Not the account's key being wrong: a refresh that could not be made now.
        Err(_) => Err(Failure::Transport(
            keypool_cooldown::TransportFailure::Connect,
        )),
    }
}

/// Refreshes the tokens due, every second, while `app` lives.
pub fn spawn_refresher(app: App) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            refresh_due(&app).await;
        }
    })
}

/// One pass of the refresh-ahead loop.
async fn refresh_due(app: &App) {
    let config = app.store().config();
    let lead = config.oauth().refresh_lead_ms;
    let due: Vec<AccountId> = app.store().oauth_tokens().due(now_ms(), lead);
    for id in due {
        let Some(account) = config.account(id.as_str()) else {
            continue;
        };
        let seen = app.store().oauth_tokens().state(&id).map(|s| s.generation);
        let _ = refresh(app, account, seen).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_gives_tokens_and_an_expiry_from_now() {
        let t = parse_grant(
            br#"{"access_token":"a","refresh_token":"r","expires_in":60,"token_type":"Bearer"}"#,
            1_000,
        )
        .unwrap();
        assert_eq!(
            (t.access.expose(), t.refresh.expose(), t.expires_at_ms),
            ("a", "r", Some(61_000))
        );
        assert!(parse_grant(br#"{"access_token":"","refresh_token":"r"}"#, 0).is_none());
        assert!(parse_grant(b"not json", 0).is_none());
        assert!(says_expired(
            br#"{"error":{"message":"OAuth token has expired."}}"#
        ));
        assert!(!says_expired(
            br#"{"error":{"message":"invalid x-api-key"}}"#
        ));
    }
}
