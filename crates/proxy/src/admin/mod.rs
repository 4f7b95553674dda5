//! The admin API and status page (`/admin/…`, SPEC 10). Routes and examples are in
//! `docs/ADMIN.md`.
//!
//! - Off entirely (the same `404` as any unknown path) when `admin.token` is not set.
//! - Every JSON route wants `Authorization: Bearer <admin.token>`, compared in constant
//!   time (both sides are hashed with SHA-256 first, so neither the length nor a prefix
//!   of the token leaks through timing); anything else gets an Anthropic-shaped `401`.
//! - `GET /admin/ui` is a self-contained HTML page (inline CSS and JS, no external
//!   asset). It holds no data and needs no token to load: it asks for the token, keeps
//!   it in the tab's `sessionStorage` and fetches `GET /admin/accounts` with it. A
//!   token in the URL fragment (`/admin/ui#token=…`) is taken too and removed from the
//!   address bar at once: a fragment is never sent to the server, so it never reaches a
//!   log (a `?token=` query would).
//!
//! | route | |
//! | --- | --- |
//! | `GET /admin/accounts` | every org, its groups and accounts with live state |
//! | `GET /admin/accounts/{id}` | one account |
//! | `POST /admin/accounts/{id}/enable` | re-enables a disabled account |
//! | `POST /admin/accounts/{id}/clear-cooldown` | ends an account's cooldown now |
//! | `POST /admin/accounts/{id}/clear-windows` | drops its usage-window state (and a window's cooldown) |
//! | `POST /admin/reload` | re-reads the config file (as `SIGHUP` does) |
//! | `GET /admin/alerts` | the webhooks (no URL) and the last alerts with each delivery's state ([`alerts`]) |
//! | `POST /admin/accounts`, `PATCH`/`DELETE /admin/accounts/{id}` | change the accounts (the config document, [`changes`]) |
//! | `POST /admin/accounts/{id}/disable` | disables an account at runtime |
//! | `POST /admin/groups`, `PATCH`/`DELETE /admin/groups/{org}/{id}` | change the groups |
//! | `POST /admin/urls`, `PATCH`/`DELETE /admin/urls/{org}/{custom_url}` | change the URL configs |
//! | `GET`/`POST /admin/keys`, `PATCH`/`DELETE /admin/keys/{id}`, `POST /admin/keys/{id}/revoke` | list, create (the key shown once), change, delete, revoke LB keys |
//! | `GET /admin/usage` | usage totals of a day or month by caller, account, model or org (JSON, CSV) |
//! | `GET /admin/usage/summary` | today's and this month's usage per caller and account, the last hour per minute |
//! | `GET /admin/requests` | the newest usage records (`caller`, `status`, `limit`) |
//! | `GET /admin/requests/{id}` | one request's usage record |
//! | `POST /admin/oauth/start`, `POST /admin/oauth/finish` | the PKCE login of a subscription account ([`oauth`]) |
//! | `GET /admin/ui` | the status page |

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderName, HeaderValue, Method, Response, StatusCode};
use keypool_cooldown::OutOfWindow;
use keypool_cooldown::facts::WindowUsage;
use keypool_core::{AccountId, Strategy, UnixMs};
use keypool_providers::{ErrorType, HeaderLines as _};
use keypool_selector::Candidate;
use keypool_store::config::{Account, Config, Org};
use keypool_store::keys::{constant_time_eq, hash_key};
use keypool_store::{Store, StoreError, now_ms};
use serde_json::{Value, json};

mod alerts;
mod changes;
mod limits;
mod oauth;
mod states;
mod usage;

use crate::App;
use crate::app::{RequestParts, early_reject};
use crate::body::ProxyBody;
use crate::reject::Reject;

/// The status page, served as is.
const UI_HTML: &str = include_str!("ui.html");

/// Answers an `/admin…` request; `rest` is the path after `/admin`.
///
/// The token is checked from the head alone: the body of an unauthenticated request is
/// never read (SPEC 3.1).
pub(crate) async fn handle<B>(
    app: &App,
    parts: &RequestParts,
    body: B,
    rest: &str,
    request_id: &str,
) -> Response<ProxyBody>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let config = app.store().config();
    let Some(token) = config.admin().token.as_ref() else {
        return Reject::unknown_path().respond(request_id);
    };
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let method = &parts.method;
    // The page itself carries no data; its fetches are authenticated.
    if segments == ["ui"] {
        return if method == Method::GET {
            page()
        } else {
            Reject::method_not_allowed().respond(request_id)
        };
    }
    if !authorized(parts, token.expose()) {
        return early_reject(
            parts,
            &Reject::new(
                StatusCode::UNAUTHORIZED,
                ErrorType::Authentication,
                "invalid admin token: send Authorization: Bearer <admin.token>",
            ),
            request_id,
        );
    }
    // Read within the request limits (also when a route takes none, so that the
    // connection stays usable).
    let body = match app.read_body(config.server(), parts, body).await {
        Ok(body) => body,
        Err(reject) => return reject.respond(request_id),
    };
    if let Some(answer) =
        changes_or_login(app, &parts.method, &segments, &body.bytes, request_id).await
    {
        return answer;
    }
    let now = now_ms();
    let get = method == Method::GET;
    let post = method == Method::POST;
    let account = |id: &str| config.account(id).ok_or_else(|| unknown_account(id));
    let answer = match segments.as_slice() {
        ["accounts"] if get => Ok(json_response(StatusCode::OK, &overview(app, &config, now))),
        ["accounts", id] if get => account(id).map(|account| {
            let view = AccountViews::new(app, &config, now);
            json_response(StatusCode::OK, &view.account(account, None))
        }),
        [
            "accounts",
            id,
            action @ ("enable" | "clear-cooldown" | "clear-windows"),
        ] if post => account(id).map(|account| account_action(app.store(), account, action, now)),
        ["accounts", id, "clear-lockouts"] if post => account(id)
            .map(|account| states::clear_lockouts(app.store(), account, parts.uri.query(), now)),
        ["lockouts"] if get => Ok(states::all_lockouts(app.store(), &config, now)),
        ["explain"] if get => Ok(explain_route(
            app.store(),
            &config,
            parts.uri.query(),
            now,
            request_id,
        )),
        ["reload"] if post => Ok(reload(app, app.store(), request_id).await),
        ["alerts"] if get => Ok(json_response(StatusCode::OK, &alerts::alerts(app.store()))),
        ["usage"] if get => usage::usage(app, &config, parts.uri.query(), now).await,
        ["usage", "summary"] if get => Ok(json_response(
            StatusCode::OK,
            &usage::summary(app, &config, now).await,
        )),
        ["requests"] if get => usage::requests(app, &config, parts.uri.query()).await,
        ["requests", id] if get => usage::request(app, id).await,
        ["accounts"]
        | ["accounts", _]
        | [
            "accounts",
            _,
            "enable" | "clear-cooldown" | "clear-windows" | "clear-lockouts",
        ]
        | ["lockouts"]
        | ["explain"]
        | ["reload"]
        | ["alerts"]
        | ["usage"]
        | ["usage", "summary"]
        | ["requests"]
        | ["requests", _] => Err(Reject::method_not_allowed()),
        _ => Err(Reject::unknown_path()),
    };
    answer.unwrap_or_else(|reject| reject.respond(request_id))
}

/// An operator action on one account (`enable`, `clear-cooldown`, `clear-windows`),
/// through the store's operator methods (mirrored like any other change); the answer
/// says what the action found.
fn account_action(
    store: &Store,
    account: &Account,
    action: &str,
    now: UnixMs,
) -> Response<ProxyBody> {
    let id = account.id();
    let answer = match action {
        "enable" => {
            let was = store.reenable(id);
            tracing::info!(account = %id, was_disabled = was.is_some(), "admin: account re-enabled");
            json!({
                "account": id.as_str(),
                "was_disabled": was.map(|d| json!({"reason": d.reason, "at": d.at, "state": d.state.as_str()})),
            })
        }
        "clear-cooldown" => {
            let entry = store.health().cooldowns.entry(id).filter(|e| e.until > now);
            store.clear_cooldown(id);
            tracing::info!(account = %id, had_cooldown = entry.is_some(), "admin: cooldown cleared");
            json!({
                "account": id.as_str(),
                "cleared": entry.map(|e| json!({"until": e.until, "trigger": e.trigger.as_str()})),
            })
        }
        _ => {
            let out = store.out_of_window(id, now);
            let cleared = store.clear_windows(id);
            tracing::info!(
                account = %id,
                was_out_of_window = out.is_some(),
                window_cooldown_cleared = cleared.cooldown.is_some(),
                "admin: windows cleared"
            );
            json!({
                "account": id.as_str(),
                "cleared": out.as_ref().map(out_of_window_json),
                "window_cooldown_cleared": cleared.cooldown.is_some(),
            })
        }
    };
    json_response(StatusCode::OK, &answer)
}

/// `GET /admin/explain?org=&url=&key=&model=` (issue 24): what the next request would do.
fn explain_route(
    store: &Store,
    config: &Config,
    query: Option<&str>,
    now: UnixMs,
    request_id: &str,
) -> Response<ProxyBody> {
    let params = usage::params(query);
    let get = |name: &str| params.get(name).cloned().unwrap_or_default();
    let q = crate::explain::ExplainQuery {
        org: get("org"),
        url: get("url"),
        key: get("key"),
        model: get("model"),
    };
    if q.org.is_empty() || q.url.is_empty() || q.key.is_empty() || q.model.is_empty() {
        return Reject::new(
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequest,
            "explain needs org, url, key (an LB key id) and model: /admin/explain?org=acme&url=team&key=alice&model=claude-sonnet-4-5",
        )
        .respond(request_id);
    }
    match crate::explain::explain(store, config, &q, now) {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(message) => {
            Reject::new(StatusCode::NOT_FOUND, ErrorType::NotFound, message).respond(request_id)
        }
    }
}

/// Whether the request carries `Authorization: Bearer <token>`, compared in constant
/// time over the SHA-256 of both sides.
fn authorized(parts: &RequestParts, token: &str) -> bool {
    let Some(presented) = parts.headers.first_text("authorization").and_then(|v| {
        v.strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("bearer "))
    }) else {
        return false;
    };
    constant_time_eq(
        hash_key(presented.trim()).as_bytes(),
        hash_key(token).as_bytes(),
    )
}

/// The routes that change the config document: the pool's elements ([`changes`]) and
/// the subscription login ([`oauth`]); `None` for any other route.
async fn changes_or_login(
    app: &App,
    method: &Method,
    segments: &[&str],
    body: &Bytes,
    request_id: &str,
) -> Option<Response<ProxyBody>> {
    match changes::handle(app, method, segments, body, request_id).await {
        Some(answer) => Some(answer),
        None => oauth::handle(app, method, segments, body, request_id).await,
    }
}

fn unknown_account(id: &str) -> Reject {
    Reject::new(
        StatusCode::NOT_FOUND,
        ErrorType::NotFound,
        format!("no account {id:?} in the configuration"),
    )
}

async fn reload(app: &App, store: &Store, request_id: &str) -> Response<ProxyBody> {
    let Some(path) = app.config_path() else {
        return Reject::new(
            StatusCode::CONFLICT,
            ErrorType::InvalidRequest,
            "this keypool was started without a config file (embedded config): nothing to reload",
        )
        .respond(request_id);
    };
    match store.reload_config(path).await {
        Ok(()) => {
            let config = store.config();
            tracing::info!(path = %path.display(), "admin: configuration reloaded");
            json_response(
                StatusCode::OK,
                &json!({
                    "reloaded": true,
                    "path": path.display().to_string(),
                    "orgs": config.orgs().count(),
                    "accounts": config.accounts().count(),
                    "keys": config.keys().count(),
                    "document": store.document_status(),
                }),
            )
        }
        Err(e) => {
            let problems: Vec<String> = match &e {
                StoreError::InvalidConfig { errors, .. }
                | StoreError::InvalidDocument { errors, .. } => {
                    errors.issues().iter().map(ToString::to_string).collect()
                }
                other => vec![other.to_string()],
            };
            tracing::warn!(path = %path.display(), problems = problems.len(), "admin: reload refused; the old configuration keeps serving");
            json_response(
                StatusCode::BAD_REQUEST,
                &json!({
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "message": "the config file is invalid; the old configuration keeps serving",
                    },
                    "problems": problems,
                    "request_id": request_id,
                }),
            )
        }
    }
}

/// An account that renews its token (SPEC 14): when the token in force expires,
/// refreshes failed in a row, the backoff, whether it is `expired`; `null` otherwise.
fn oauth_view(store: &Store, account: &Account) -> Value {
    let Some(state) = account
        .oauth()
        .and_then(|_| store.oauth_tokens().state(account.id()))
    else {
        return Value::Null;
    };
    json!({
        "expires_at": state.tokens.expires_at_ms,
        "failures": state.failures,
        "retry_at": Some(state.retry_at_ms).filter(|&t| t > 0),
        "expired": state.expired,
    })
}

/// `GET /admin/accounts`: every org with its groups (and the accounts of no group).
fn overview(app: &App, config: &Config, now: UnixMs) -> Value {
    let views = AccountViews::new(app, config, now);
    let backend = app.store().backend_status();
    let mut all: Vec<_> = config.orgs().collect();
    all.sort_by(|a, b| a.slug().cmp(b.slug()));
    let orgs: Vec<Value> = all
        .into_iter()
        .map(|org| {
            let mut grouped = BTreeSet::new();
            let mut groups: Vec<Value> = Vec::new();
            for id in org_groups(org) {
                if let Some(group) = org.group(&id) {
                    grouped.extend(group.accounts().iter().cloned());
                    groups.push(views.pool(Some(group.id()), group.strategy(), group.accounts()));
                }
            }
            let rest: Vec<AccountId> = org
                .accounts()
                .iter()
                .filter(|a| !grouped.contains(*a))
                .cloned()
                .collect();
            if !rest.is_empty() || groups.is_empty() {
                groups.push(views.pool(None, Strategy::default(), &rest));
            }
            json!({
                "slug": org.slug(),
                "suspended": org.suspended(),
                "groups": groups,
            })
        })
        .collect();
    json!({
        "now": now,
        "backend": match backend.kind {
            keypool_store::BackendKind::Memory => "memory",
            keypool_store::BackendKind::StateFile(_) => "state_file",
            keypool_store::BackendKind::Redis => "redis",
        },
        "redis_ready": backend.redis_ready,
        "state_file_error": backend.state_file_error,
        "document": app.store().document_status(),
        "orgs": orgs,
    })
}

/// The ids of `org`'s groups that a URL config serves, sorted (a group no URL config
/// names receives no traffic).
fn org_groups(org: &Org) -> Vec<String> {
    let ids: BTreeSet<String> = org
        .urls()
        .filter_map(|u| u.group().map(str::to_owned))
        .collect();
    ids.into_iter().collect()
}

/// Reads the live state of accounts at one instant.
struct AccountViews<'a> {
    app: &'a App,
    config: &'a Config,
    now: UnixMs,
    last_used: BTreeMap<AccountId, UnixMs>,
    samples: BTreeMap<AccountId, usize>,
}

impl<'a> AccountViews<'a> {
    fn new(app: &'a App, config: &'a Config, now: UnixMs) -> Self {
        let export = app.store().export_state(now);
        let samples = export
            .rating
            .accounts
            .iter()
            .map(|a| (a.id.clone(), a.recent_ttft.len()))
            .collect();
        Self {
            app,
            config,
            now,
            last_used: export.last_used,
            samples,
        }
    }

    /// One pool (a group, or the org's accounts of no group): rating scores are relative
    /// to the pool, as the `rated` strategy computes them.
    fn pool(&self, id: Option<&str>, strategy: Strategy, ids: &[AccountId]) -> Value {
        let accounts: Vec<&std::sync::Arc<Account>> = ids
            .iter()
            .filter_map(|id| self.config.account(id.as_str()))
            .collect();
        let candidates: Vec<Candidate> = accounts
            .iter()
            .map(|a| {
                let mut c = Candidate::new(a.id().clone(), a.provider(), a.auth());
                c.base_url = a.base_url().map(std::sync::Arc::from);
                c.priority = a.priority();
                c.weight = a.weight().get();
                c.last_used = self.last_used.get(a.id()).copied().unwrap_or(0);
                c
            })
            .collect();
        let scores = self.app.store().rating().scores(&candidates, self.now);
        let rows: Vec<Value> = accounts
            .iter()
            .enumerate()
            .map(|(i, a)| self.account(a, scores.get(i).copied()))
            .collect();
        json!({
            "id": id,
            "strategy": strategy.as_str(),
            "accounts": rows,
        })
    }

    /// One account's live state.
    fn account(&self, account: &Account, score: Option<f64>) -> Value {
        let store = self.app.store();
        let health = store.health();
        let id = account.id();
        let now = self.now;
        let disabled = health.disabled.get(id);
        let state = states::account_state(store, account, now);
        let windows = health.windows.state(id);
        let rating = store.rating().rating(id, now);
        let window = |w: &WindowUsage| {
            (!w.is_empty()).then(|| {
                json!({
                    "utilization": w.utilization,
                    "reset": w.reset,
                    "status": w.status.map(|s| s.as_str()),
                })
            })
        };
        json!({
            "id": id.as_str(),
            "org": account.org(),
            "provider": account.provider().as_str(),
            "auth": account.auth().as_str(),
            "priority": account.priority(),
            "weight": account.weight().get(),
            "state": state.name,
            "active_in_config": account.active(),
            "disabled": disabled.map(|d| json!({"reason": d.reason, "at": d.at, "state": d.state.as_str()})),
            "oauth": oauth_view(store, account),
            "cooldown": state.cooldown,
            "lockouts": states::lockouts_json(store, id, now),
            "windows": {
                "five_hour": windows.as_ref().and_then(|w| window(&w.info.five_hour)),
                "weekly": windows.as_ref().and_then(|w| window(&w.info.seven_day)),
                "unified_status": windows.as_ref().and_then(|w| w.info.unified_status.map(|s| s.as_str())),
                "unified_reset": windows.as_ref().and_then(|w| w.info.unified_reset),
                "requests_remaining": windows.as_ref().and_then(|w| w.info.requests_remaining),
                "updated_at": windows.as_ref().map(|w| w.updated_at),
                "out_of_window": state.out_of_window.as_ref().map(out_of_window_json),
                "families": states::families_json(store, id, now),
            },
            "rating": {
                "score": score.filter(|s| s.is_finite()),
                "samples": self.samples.get(id).copied().unwrap_or(0),
                "ttft_ms": rating.ttft_ms,
                "total_ms": rating.total_ms,
                "error_rate": rating.error_rate,
                "p90_ttft_ms": store.rating().p90_ttft_ms(id, now),
            },
            "in_flight": self.app.metrics().in_flight(id),
            "last_used": self.last_used.get(id).copied().filter(|&t| t > 0),
        })
    }
}

/// `{"limit": "5h" | "weekly" | "weekly_opus" | …, "until": unix ms}`.
fn out_of_window_json(out: &OutOfWindow) -> Value {
    json!({"limit": out.limit.as_str(), "until": out.until})
}

fn json_response(status: StatusCode, value: &Value) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(value.to_string()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The status page with headers that keep it self-contained and out of frames.
fn page() -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(UI_HTML));
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'",
        ),
    );
    headers.insert(
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        HeaderName::from_static("x-frame-options"),
        HeaderValue::from_static("DENY"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_comparison() {
        let a = hash_key("secret-token");
        let b = hash_key("secret-token");
        let c = hash_key("secret-tokem");
        assert!(constant_time_eq(a.as_bytes(), b.as_bytes()));
        assert!(!constant_time_eq(a.as_bytes(), c.as_bytes()));
    }

    #[test]
    fn the_page_is_self_contained() {
        assert!(UI_HTML.starts_with("<!doctype html>"));
        // No external asset: every URL the page fetches is its own API. (The SVG
        // namespace is a name, never fetched.)
        let page = UI_HTML.replace("\"http://www.w3.org/2000/svg\"", "");
        for needle in ["http://", "https://", "src=\"//", "<link"] {
            assert!(!page.contains(needle), "the page references {needle}");
        }
        assert!(UI_HTML.contains("/admin/accounts"));
        assert!(UI_HTML.contains("/admin/usage/summary"));
    }
}
