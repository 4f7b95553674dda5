//! The OpenAI-format front (issue 23): `POST …/v1/chat/completions` and
//! `GET …/v1/models` on the same pools as the Messages API.
//!
//! A chat completion is translated to a Messages request as soon as its body is read
//! ([`translate_request`]) and then takes the Messages path unchanged (limits, filters,
//! strategies, failover, hedge/race, usage, the log); each attempt sends the
//! translation to an account that speaks Messages and the original body to an `openai`
//! account ([`ChatCall`]); the answer is translated back in the attempt (JSON) or frame
//! by frame in the committed stream. Every error answer of these routes is re-shaped
//! once, at the end ([`reshape_error`]), from the Anthropic body keypool would send on
//! the Messages route.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};
use keypool_providers::openai::{
    CLAUDE_MODEL_IDS, chat_to_messages, error_from_anthropic, invalid_request_body, models_body,
};
use keypool_providers::{Endpoint, ProvidersError};
use keypool_store::config::Config;
use keypool_store::now_ms;
use keypool_store::resolve::Route;

use crate::body::ProxyBody;
use crate::reject::json_error;

/// What the attempts of a chat completion need besides its Messages translation.
#[derive(Debug, Clone)]
pub(crate) struct ChatCall {
    /// The client's own body, sent as is to `openai` accounts.
    pub original: Bytes,
    /// `stream_options.include_usage`: a translated stream ends with a usage chunk.
    pub include_usage: bool,
}

/// For a chat completion, replaces `body` by its Messages translation and returns the
/// original; other endpoints are left alone (`None`). A body that cannot be translated
/// is a client error: answer it with [`refused`].
pub(crate) fn translate_request(
    endpoint: Endpoint,
    body: &mut Bytes,
) -> Result<Option<ChatCall>, ProvidersError> {
    if endpoint != Endpoint::ChatCompletions {
        return Ok(None);
    }
    let chat = chat_to_messages(body)?;
    let original = std::mem::replace(body, chat.body);
    Ok(Some(ChatCall {
        original,
        include_usage: chat.include_usage,
    }))
}

/// The OpenAI-shaped `400` of a chat completion that cannot be translated (with the
/// offending `param`).
pub(crate) fn refused(error: &ProvidersError) -> Response<ProxyBody> {
    json_error(StatusCode::BAD_REQUEST, invalid_request_body(error), None)
}

/// An error answer of an OpenAI route in the OpenAI shape: a JSON body in the
/// Anthropic shape (`"type":"error"`, keypool's own or the bounded pass-through) is
/// re-shaped by [`error_from_anthropic`] (`529` becomes `503`); headers
/// (`Retry-After`, `x-should-retry`, …) stay. Successes and bodies already in the
/// OpenAI shape pass unchanged.
pub(crate) fn reshape_error(response: Response<ProxyBody>) -> Response<ProxyBody> {
    if response.status().is_success() {
        return response;
    }
    let Some(body) = response.body().full_bytes() else {
        return response;
    };
    if !is_anthropic_error(body) {
        return response;
    }
    let (status, reshaped) = error_from_anthropic(response.status(), body);
    let (mut parts, _) = response.into_parts();
    parts.status = status;
    parts.headers.remove(CONTENT_LENGTH);
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Response::from_parts(parts, ProxyBody::full(reshaped))
}

fn is_anthropic_error(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<&'a str>,
    }
    serde_json::from_slice::<Typed<'_>>(body).is_ok_and(|t| t.kind == Some("error"))
}

/// `GET …/v1/models`: [`CLAUDE_MODEL_IDS`], then the `model` overrides of the pool's
/// accounts (file order, each id once).
pub(crate) fn models(config: &Config, route: &Route) -> Response<ProxyBody> {
    let ids = match route.group() {
        Some(g) => g.accounts(),
        None => route.org().accounts(),
    };
    let overrides = ids
        .iter()
        .filter_map(|id| config.account(id.as_str()))
        .filter_map(|a| a.model());
    let body = models_body(
        CLAUDE_MODEL_IDS.into_iter().chain(overrides),
        now_ms() / 1000,
        "anthropic",
    );
    let mut response = Response::new(ProxyBody::full(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_anthropic_error_bodies_are_reshaped() {
        let anthropic = Bytes::from_static(
            br#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"},"request_id":"r"}"#,
        );
        let response = reshape_error(json_error(StatusCode::UNAUTHORIZED, anthropic, None));
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let body: serde_json::Value =
            serde_json::from_slice(response.body().full_bytes().unwrap()).unwrap();
        assert_eq!(body["error"]["type"], "authentication_error");
        assert_eq!(body["error"]["code"], "invalid_api_key");
        assert_eq!(body["error"]["message"], "invalid x-api-key");

        let overloaded = Bytes::from_static(
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        );
        let response = reshape_error(json_error(
            StatusCode::from_u16(529).unwrap(),
            overloaded,
            Some(3),
        ));
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], "3");

        let openai = invalid_request_body(&ProvidersError::MissingModel);
        let response = reshape_error(json_error(StatusCode::BAD_REQUEST, openai.clone(), None));
        assert_eq!(response.body().full_bytes(), Some(&openai));
    }

    #[test]
    fn a_chat_body_is_translated_and_kept() {
        let mut body = Bytes::from_static(
            br#"{"model":"claude-sonnet-4-5","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hi"}]}"#,
        );
        let original = body.clone();
        let chat = translate_request(Endpoint::ChatCompletions, &mut body)
            .unwrap()
            .unwrap();
        assert_eq!(chat.original, original);
        assert!(chat.include_usage);
        let translated: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(translated["messages"][0]["content"][0]["text"], "Hi");
        let mut messages = original.clone();
        assert!(
            translate_request(Endpoint::Messages, &mut messages)
                .unwrap()
                .is_none()
        );
        let mut bad = Bytes::from_static(br#"{"model":"m","n":2,"messages":[]}"#);
        let refused = refused(&translate_request(Endpoint::ChatCompletions, &mut bad).unwrap_err());
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        let body: serde_json::Value =
            serde_json::from_slice(refused.body().full_bytes().unwrap()).unwrap();
        assert_eq!(body["error"]["param"], "n");
    }
}
