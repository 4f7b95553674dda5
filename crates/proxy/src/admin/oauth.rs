//! The subscription login (SPEC 14): `POST /admin/oauth/start` and `/finish`, the PKCE
//! authorization-code flow `keypool oauth login` drives.
//!
//! - `start` `{"id", "org"}` (`org` for a new account): answers the `authorize_url` a
//!   person opens, and the login's `state`. The PKCE verifier stays in this process
//!   (for 10 minutes): finish on the same replica.
//! - `finish` `{"state", "code"}` (the code as the provider's page shows it, `code#state`
//!   taken too): exchanges it at `token_url` and stores the account as an edit of the
//!   config document (a new `oauth` account, or the existing one's `secret`,
//!   `refresh_token` and `expires_at`), its tokens sealed with `KEYPOOL_SECRETS_KEY`; an
//!   account that was `expired` is enabled again. No answer carries a token.

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use keypool_core::AccountId;
use keypool_providers::ErrorType;
use keypool_store::config::edit::{self, Entity, Target};
use keypool_store::config::sealed;
use keypool_store::now_ms;
use serde_json::{Map, Value, json};

use super::changes::{bad, object};
use super::json_response;
use crate::App;
use crate::body::ProxyBody;
use crate::reject::Reject;

/// Answers `/admin/oauth/…`, or `None` when `segments` is not one of its routes.
pub(super) async fn handle(
    app: &App,
    method: &Method,
    segments: &[&str],
    body: &Bytes,
    request_id: &str,
) -> Option<Response<ProxyBody>> {
    let answer = match (method, segments) {
        (&Method::POST, ["oauth", "start"]) => start(app, body),
        (&Method::POST, ["oauth", "finish"]) => finish(app, body, request_id).await,
        (_, ["oauth", ..]) => Err(Reject::new(
            StatusCode::NOT_FOUND,
            ErrorType::NotFound,
            "the login routes are POST /admin/oauth/start and POST /admin/oauth/finish",
        )),
        _ => return None,
    };
    Some(answer.unwrap_or_else(|reject| reject.respond(request_id)))
}

fn text<'a>(fields: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    fields
        .get(name)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `POST /admin/oauth/start`.
fn start(app: &App, body: &Bytes) -> Result<Response<ProxyBody>, Reject> {
    let f = object(body)?;
    let id = text(&f, "id").ok_or_else(|| bad("start a login with {\"id\": …, \"org\": …}"))?;
    if sealed::seal(std::env::var(sealed::SECRETS_KEY_ENV).ok().as_deref(), "x").is_err() {
        return Err(Reject::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorType::InvalidRequest,
            format!(
                "a login stores the account's tokens through the API, sealed with {}: set it (64 hex digits) in keypool's environment and restart",
                sealed::SECRETS_KEY_ENV
            ),
        ));
    }
    let config = app.store().config();
    let org = match config.account(id) {
        Some(a) if a.auth() != keypool_core::AuthType::OAuth => {
            return Err(bad(format!(
                "account {id:?} is not an oauth account: a login is for subscription accounts"
            )));
        }
        Some(_) => None,
        None => Some(
            text(&f, "org")
                .ok_or_else(|| bad(format!("a new account {id:?} needs \"org\"")))?
                .to_owned(),
        ),
    };
    let settings = config.oauth();
    let (state, challenge) =
        app.store()
            .oauth_tokens()
            .start_login(AccountId::from(id), org, now_ms());
    let url = format!(
        "{}?code=true&client_id={}&response_type=code&redirect_uri={}&scope={}&code_challenge={challenge}&code_challenge_method=S256&state={state}",
        settings.authorize_url,
        encode(&settings.client_id),
        encode(&settings.redirect_uri),
        encode(&settings.scopes),
    );
    tracing::info!(account = id, "admin: oauth login started");
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "authorize_url": url,
            "state": state,
            "expires_in": keypool_store::oauth::LOGIN_TTL_MS / 1000,
            "next": "open authorize_url, log in, and POST the code the page shows to /admin/oauth/finish with this state",
        }),
    ))
}

/// `POST /admin/oauth/finish`.
async fn finish(app: &App, body: &Bytes, request_id: &str) -> Result<Response<ProxyBody>, Reject> {
    let f = object(body)?;
    let pasted = text(&f, "code").ok_or_else(|| bad("finish with {\"state\": …, \"code\": …}"))?;
    let (code, pasted_state) = pasted.trim().split_once('#').unwrap_or((pasted.trim(), ""));
    let state = text(&f, "state").unwrap_or(pasted_state);
    let login = app
        .store()
        .oauth_tokens()
        .finish_login(state, now_ms())
        .ok_or_else(|| bad("no login under way with this state (finished, older than 10 minutes, or started on another replica): start again"))?;
    let config = app.store().config();
    let settings = config.oauth();
    let grant = json!({
        "grant_type": "authorization_code",
        "code": code,
        "state": state,
        "client_id": settings.client_id,
        "redirect_uri": settings.redirect_uri,
        "code_verifier": login.verifier,
    });
    let unreachable = |_| {
        Reject::new(
            StatusCode::BAD_GATEWAY,
            ErrorType::Api,
            "the token endpoint could not be reached: check [oauth] token_url and the network, then start again",
        )
    };
    let (status, bytes) = crate::oauth::post_token(app, None, &grant)
        .await
        .map_err(unreachable)?;
    if !status.is_success() {
        let error: Value = serde_json::from_slice(&bytes).unwrap_or_default();
        return Err(bad(format!(
            "the token endpoint refused the code ({status}, {}): start the login again",
            error["error"].as_str().unwrap_or("no reason given")
        )));
    }
    let tokens = crate::oauth::parse_grant(&bytes, now_ms()).ok_or_else(|| {
        Reject::new(
            StatusCode::BAD_GATEWAY,
            ErrorType::Api,
            "the token endpoint's answer has no tokens",
        )
    })?;
    store_login(app, &login, &tokens, request_id).await
}

/// Writes the login's tokens into the config document (sealed) and answers.
async fn store_login(
    app: &App,
    login: &keypool_store::oauth::PendingLogin,
    tokens: &keypool_store::oauth::Tokens,
    request_id: &str,
) -> Result<Response<ProxyBody>, Reject> {
    let id = login.account.as_str();
    let mut fields = Map::new();
    fields.insert(
        "secret".into(),
        Value::String(tokens.access.expose().to_owned()),
    );
    fields.insert(
        "refresh_token".into(),
        Value::String(tokens.refresh.expose().to_owned()),
    );
    if let Some(at) = tokens.expires_at_ms {
        fields.insert("expires_at".into(), json!(at / 1000));
    }
    let new = login.org.is_some() && app.store().config().account(id).is_none();
    if new {
        fields.insert("id".into(), json!(id));
        fields.insert("org".into(), json!(login.org));
        fields.insert("provider".into(), json!("anthropic"));
        fields.insert("auth".into(), json!("oauth"));
    }
    if let Err(problems) = super::changes::seal_secrets(&mut fields) {
        return Err(bad(problems.join("; ")));
    }
    let route = "POST /admin/oauth/finish";
    let target = Target {
        entity: Entity::Account,
        org: None,
        id: id.to_owned(),
    };
    let answer = super::changes::apply(app, route, request_id, StatusCode::OK, |doc| {
        let done = if new {
            edit::create(doc, Entity::Account, &fields).map(|_| "created")
        } else {
            edit::change(doc, &target, &fields).map(|()| "changed")
        };
        done.map(
            |what| json!({"logged_in": id, "account": what, "expires_at": tokens.expires_at_ms}),
        )
    })
    .await?;
    // A new login revives an account a dead refresh token had expired.
    if app
        .store()
        .health()
        .disabled
        .get(&login.account)
        .is_some_and(|d| d.state == keypool_cooldown::Terminal::Expired)
    {
        app.store().reenable(&login.account);
    }
    tracing::info!(account = id, "admin: oauth login finished");
    Ok(answer)
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_are_percent_encoded() {
        assert_eq!(
            super::encode("https://a.b/c d:e"),
            "https%3A%2F%2Fa.b%2Fc%20d%3Ae"
        );
    }
}
