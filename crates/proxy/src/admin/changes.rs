//! The admin routes that change the pool while it runs (SPEC 13): accounts, groups,
//! URL configs and LB keys created, changed and deleted as edits of the config
//! document ([`keypool_store::document`]), each validated exactly like a file load
//! (`422` with the located problems, nothing changed), applied whole, written back and
//! audited; `POST /admin/keys` answers the new `sk-lb-` key once (only its SHA-256 is
//! stored); `POST /admin/accounts/{id}/disable` disables an account at runtime (state,
//! not the document: `enable` undoes it).
//!
//! A secret in a body (`secret`, `proxy_url`, `refresh_token`) is stored as given when it is a
//! reference (`$ENV_NAME`, `file:/path`), else sealed with `KEYPOOL_SECRETS_KEY`
//! ([`keypool_store::config::sealed`]); without that key the change is refused and says
//! why. No answer ever carries a secret or a key hash.

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use keypool_providers::ErrorType;
use keypool_store::config::edit::{self, EditError, Entity, Target};
use keypool_store::config::sealed;
use keypool_store::document::{ChangeError, ConfigDiff};
use keypool_store::now_ms;
use serde_json::{Map, Value, json};

use super::json_response;
use crate::App;
use crate::body::ProxyBody;
use crate::reject::Reject;

/// The fields of an account that hold secrets.
const SECRET_FIELDS: [&str; 3] = ["secret", "proxy_url", "refresh_token"];

pub(super) fn bad(message: impl Into<String>) -> Reject {
    Reject::new(
        StatusCode::BAD_REQUEST,
        ErrorType::InvalidRequest,
        message.into(),
    )
}

/// The body as a JSON object.
pub(super) fn object(body: &Bytes) -> Result<Map<String, Value>, Reject> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad("the body must be a JSON object of the fields to set")),
        Err(e) => Err(bad(format!("the body is not JSON: {e}"))),
    }
}

/// `422`: the located problems of a change that would make the configuration invalid.
fn invalid(problems: Vec<String>, request_id: &str) -> Response<ProxyBody> {
    json_response(
        StatusCode::UNPROCESSABLE_ENTITY,
        &json!({
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "the change would make the configuration invalid; nothing was changed",
            },
            "problems": problems,
            "request_id": request_id,
        }),
    )
}

/// Seals the secrets of an account's fields in place (references stay as given).
pub(super) fn seal_secrets(fields: &mut Map<String, Value>) -> Result<(), Vec<String>> {
    let key = std::env::var(sealed::SECRETS_KEY_ENV).ok();
    let mut problems = Vec::new();
    for name in SECRET_FIELDS {
        let Some(Value::String(value)) = fields.get_mut(name) else {
            continue;
        };
        let is_reference =
            value.starts_with('$') || value.starts_with("file:") || sealed::is_sealed(value);
        if is_reference || value.is_empty() {
            continue;
        }
        match sealed::seal(key.as_deref(), value) {
            Ok(s) => *value = s,
            Err(e) => problems.push(format!("{name}: {e}")),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// The entity of a route's first segment.
fn entity_of(segment: &str) -> Option<Entity> {
    Some(match segment {
        "accounts" => Entity::Account,
        "groups" => Entity::Group,
        "urls" => Entity::Url,
        "keys" => Entity::Key,
        _ => return None,
    })
}

/// The element a route names: `/accounts/{id}`, `/keys/{id}`, `/groups/{org}/{id}`,
/// `/urls/{org}/{custom_url}`.
fn target_of(entity: Entity, rest: &[&str]) -> Option<Target> {
    match (entity.per_org(), rest) {
        (false, [id]) => Some(Target {
            entity,
            org: None,
            id: (*id).to_owned(),
        }),
        (true, [org, id]) => Some(Target {
            entity,
            org: Some((*org).to_owned()),
            id: (*id).to_owned(),
        }),
        _ => None,
    }
}

/// Answers a change route, or `None` when `segments` is not one.
pub(super) async fn handle(
    app: &App,
    method: &Method,
    segments: &[&str],
    body: &Bytes,
    request_id: &str,
) -> Option<Response<ProxyBody>> {
    let (first, rest) = segments.split_first()?;
    let entity = entity_of(first)?;
    let route = format!("{method} /admin/{}", segments.join("/"));
    let answer = match (method, rest) {
        (&Method::GET, []) if entity == Entity::Key => Ok(list_keys(app)),
        (&Method::POST, []) => create(app, entity, body, &route, request_id).await,
        (&Method::POST, [id, "disable"]) if entity == Entity::Account => disable(app, id, body),
        (&Method::POST, [id, "revoke"]) if entity == Entity::Key => {
            let target = target_of(entity, &[id])?;
            let mut fields = Map::new();
            fields.insert("revoked".into(), Value::Bool(true));
            apply(app, &route, request_id, StatusCode::OK, |doc| {
                edit::change(doc, &target, &fields).map(|()| json!({"revoked": target.id}))
            })
            .await
        }
        (&Method::PATCH, rest) => match target_of(entity, rest) {
            Some(target) => change(app, &target, body, &route, request_id).await,
            None => return None,
        },
        (&Method::DELETE, rest) => match target_of(entity, rest) {
            Some(target) => {
                apply(app, &route, request_id, StatusCode::OK, |doc| {
                    edit::delete(doc, &target).map(|()| json!({"deleted": target.to_string()}))
                })
                .await
            }
            None => return None,
        },
        _ => return None,
    };
    Some(answer.unwrap_or_else(|reject| reject.respond(request_id)))
}

async fn create(
    app: &App,
    entity: Entity,
    body: &Bytes,
    route: &str,
    request_id: &str,
) -> Result<Response<ProxyBody>, Reject> {
    let mut fields = object(body)?;
    if entity == Entity::Account
        && let Err(problems) = seal_secrets(&mut fields)
    {
        return Ok(invalid(problems, request_id));
    }
    if entity == Entity::Key {
        if fields.contains_key("sha256") {
            return Err(bad(
                "a key's sha256 is made by keypool: leave it out, the answer carries the new key once",
            ));
        }
        let generated = keypool_store::keys::generate_lb_key(
            &mut <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng(),
        );
        fields.insert("sha256".into(), Value::String(generated.sha256_hex.clone()));
        fields
            .entry("kind")
            .or_insert_with(|| Value::String("user".into()));
        fields.entry("urls").or_insert_with(|| json!(["*"]));
        return apply(app, route, request_id, StatusCode::CREATED, |doc| {
            let target = edit::create(doc, entity, &fields)?;
            Ok(json!({
                "created": target.to_string(),
                "id": target.id,
                "key": generated.key,
                "note": "the key is shown only now: keypool stores only its SHA-256",
            }))
        })
        .await;
    }
    apply(app, route, request_id, StatusCode::CREATED, |doc| {
        edit::create(doc, entity, &fields).map(|t| json!({"created": t.to_string()}))
    })
    .await
}

async fn change(
    app: &App,
    target: &Target,
    body: &Bytes,
    route: &str,
    request_id: &str,
) -> Result<Response<ProxyBody>, Reject> {
    let mut fields = object(body)?;
    if target.entity == Entity::Account
        && let Err(problems) = seal_secrets(&mut fields)
    {
        return Ok(invalid(problems, request_id));
    }
    if target.entity == Entity::Key && fields.contains_key("sha256") {
        return Err(bad(
            "a key's sha256 cannot be set: revoke the key and create another",
        ));
    }
    apply(app, route, request_id, StatusCode::OK, |doc| {
        edit::change(doc, target, &fields).map(|()| json!({"changed": target.to_string()}))
    })
    .await
}

/// Runs one change of the document and answers it.
pub(super) async fn apply(
    app: &App,
    route: &str,
    request_id: &str,
    status: StatusCode,
    edit: impl keypool_store::document::Edit<Value>,
) -> Result<Response<ProxyBody>, Reject> {
    let Some(path) = app.config_path() else {
        return Err(Reject::new(
            StatusCode::CONFLICT,
            ErrorType::InvalidRequest,
            "this keypool was started without a config file (embedded config): there is no document to change",
        ));
    };
    let env = |name: &str| std::env::var(name).ok();
    match app.store().change_config(path, route, &env, edit).await {
        Ok((mut answer, diff)) => {
            answer["diff"] = diff_json(&diff);
            Ok(json_response(status, &answer))
        }
        Err(ChangeError::Invalid(errors)) => Ok(invalid(
            errors.issues().iter().map(ToString::to_string).collect(),
            request_id,
        )),
        Err(ChangeError::Edit(e)) => Err(match e {
            EditError::NotFound(what) => Reject::new(
                StatusCode::NOT_FOUND,
                ErrorType::NotFound,
                format!("no {what} in the configuration"),
            ),
            EditError::Exists(what) => Reject::new(
                StatusCode::CONFLICT,
                ErrorType::InvalidRequest,
                format!("{what} exists already: change it with PATCH, or pick another id"),
            ),
            EditError::Body(message) => bad(message),
            EditError::Parse(message) => {
                Reject::new(StatusCode::CONFLICT, ErrorType::InvalidRequest, message)
            }
        }),
        Err(ChangeError::Unavailable(message)) => {
            tracing::warn!(error = %message, "admin: the config document is unavailable");
            Err(Reject::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorType::Overloaded,
                message,
            ))
        }
        Err(ChangeError::Io(message)) => {
            tracing::error!(error = %message, "admin: the config document could not be written");
            Err(Reject::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorType::Api,
                format!("{message}; nothing was changed"),
            ))
        }
    }
}

fn diff_json(diff: &ConfigDiff) -> Value {
    serde_json::to_value(diff).unwrap_or(Value::Null)
}

/// `POST /admin/accounts/{id}/disable` (`{"reason": "…"}` optional).
fn disable(app: &App, id: &str, body: &Bytes) -> Result<Response<ProxyBody>, Reject> {
    let config = app.store().config();
    let Some(account) = config.account(id) else {
        return Err(super::unknown_account(id));
    };
    let reason = if body.is_empty() {
        None
    } else {
        object(body)?
            .get("reason")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let reason = format!(
        "operator: {}",
        reason
            .as_deref()
            .unwrap_or("disabled through the admin API")
    );
    let disabled = app.store().disable(account.id(), &reason, now_ms());
    tracing::info!(account = %id, "admin: account disabled");
    Ok(json_response(
        StatusCode::OK,
        &json!({"account": id, "disabled": disabled, "reason": reason}),
    ))
}

/// `GET /admin/keys`: every key, without its hash.
fn list_keys(app: &App) -> Response<ProxyBody> {
    let config = app.store().config();
    let mut keys: Vec<_> = config.keys().collect();
    keys.sort_by(|a, b| (a.org(), a.id()).cmp(&(b.org(), b.id())));
    let keys: Vec<Value> = keys
        .iter()
        .map(|k| {
            json!({
                "id": k.id(),
                "org": k.org(),
                "kind": k.kind().as_str(),
                "revoked": k.revoked(),
                "limits": k.limits().is_some(),
            })
        })
        .collect();
    json_response(StatusCode::OK, &json!({"keys": keys}))
}
