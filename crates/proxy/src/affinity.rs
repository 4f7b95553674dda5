//! Session affinity: which session a request belongs to (pure), so that a multi-turn
//! agent stays on one account and keeps its prompt cache warm.
//!
//! The session key is the first present of: the `X-Claude-Code-Session-Id` header, the
//! `x-session-id` header, the session part of the body's `metadata.user_id`. Claude Code
//! writes `user_id` either as `user_{hash}_account_{uuid}_session_{uuid}` (the account
//! part may be empty) or, in newer versions, as a JSON object in a string with a
//! `session_id` field; both are read. Nothing is ever derived from message content
//! (it changes every turn). Session headers are never forwarded upstream (the upstream
//! head builder's allowlist drops them).
//!
//! The binding itself (session → account, with its TTL) lives in the store; the
//! failover walker asks the planner to try the bound account first
//! (`PlanInput::with_prefer`) and re-binds the session to whichever account served.

use keypool_providers::HeaderLines;
use serde::Deserialize;

/// The Claude Code session header.
pub const CLAUDE_CODE_SESSION_HEADER: &str = "x-claude-code-session-id";

/// The generic session header.
pub const SESSION_HEADER: &str = "x-session-id";

/// Longest session id accepted (longer ones are ignored: no affinity).
pub const MAX_SESSION_ID_LEN: usize = 128;

/// The session key of a request, if it carries one.
pub fn session_id<H: HeaderLines + ?Sized>(headers: &H, body: &[u8]) -> Option<String> {
    session_id_of(headers, || metadata_user_id(body))
}

/// [`session_id`] for a body already read: `user_id` is its `metadata.user_id`
/// (`RequestInfo::user_id`), so the body is not parsed again.
pub fn session_id_with<H: HeaderLines + ?Sized>(
    headers: &H,
    user_id: Option<&str>,
) -> Option<String> {
    session_id_of(headers, || user_id.and_then(normalise_user_id))
}

fn session_id_of<H: HeaderLines + ?Sized>(
    headers: &H,
    user_id: impl FnOnce() -> Option<String>,
) -> Option<String> {
    for name in [CLAUDE_CODE_SESSION_HEADER, SESSION_HEADER] {
        if let Some(id) = headers.first_text(name).and_then(valid) {
            return Some(id.to_owned());
        }
    }
    let user_id = user_id()?;
    session_from_user_id(&user_id).map(str::to_owned)
}

/// The session part of a `metadata.user_id` value, in either Claude Code format.
pub fn session_from_user_id(user_id: &str) -> Option<&str> {
    if user_id.trim_start().starts_with('{') {
        // Newer Claude Code: a JSON object in the string.
        return None;
    }
    let (_, session) = user_id.rsplit_once("_session_")?;
    valid(session)
}

/// The binding key of a session on one URL config: bindings are per URL config.
pub fn binding_key(org: &str, custom_url: &str, session: &str) -> String {
    format!("{org}/{custom_url}/{session}")
}

fn valid(id: &str) -> Option<&str> {
    let id = id.trim();
    (!id.is_empty()
        && id.len() <= MAX_SESSION_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':')))
    .then_some(id)
}

/// Reads only `metadata.user_id` (every other field is skipped without being built).
fn metadata_user_id(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Body {
        metadata: Option<Metadata>,
    }
    #[derive(Deserialize)]
    struct Metadata {
        user_id: Option<String>,
    }
    let user_id = serde_json::from_slice::<Body>(body)
        .ok()?
        .metadata?
        .user_id?;
    normalise_user_id(&user_id)
}

/// A `metadata.user_id` in the legacy string form (kept as is), or the session of the
/// newer JSON-object-in-a-string form (as `_session_{id}`, the legacy form's tail).
fn normalise_user_id(user_id: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct JsonUserId {
        session_id: Option<String>,
    }
    if user_id.trim_start().starts_with('{') {
        let inner: JsonUserId = serde_json::from_str(user_id).ok()?;
        return inner
            .session_id
            .as_deref()
            .and_then(valid)
            .map(|s| format!("_session_{s}"));
    }
    Some(user_id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    const LEGACY: &str = "user_5dd07c33da27e6d2968d94ea20bf47a7b090b6b158b82328d54da2909a108e84_account__session_d2e70091-3007-41a3-a916-cb8b0d3098de";

    fn body(user_id: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "model": "m",
            "messages": [{"role": "user", "content": "the content _session_ never counts"}],
            "metadata": {"user_id": user_id}
        }))
        .unwrap()
    }

    #[test]
    fn headers_win_in_order_then_the_body() {
        let mut headers = HeaderMap::new();
        let b = body(LEGACY);
        assert_eq!(
            session_id(&headers, &b).as_deref(),
            Some("d2e70091-3007-41a3-a916-cb8b0d3098de")
        );
        headers.insert(SESSION_HEADER, HeaderValue::from_static("generic-1"));
        assert_eq!(session_id(&headers, &b).as_deref(), Some("generic-1"));
        headers.insert(CLAUDE_CODE_SESSION_HEADER, HeaderValue::from_static("cc-1"));
        assert_eq!(session_id(&headers, &b).as_deref(), Some("cc-1"));
    }

    #[test]
    fn both_user_id_formats_are_read() {
        let with_account =
            "user_abc_account_0b6e9f5a-1111-2222-3333-444455556666_session_7d0e2f61-4b5c";
        assert_eq!(session_from_user_id(with_account), Some("7d0e2f61-4b5c"));
        let json = r#"{"device_id":"3f4a","account_uuid":"","session_id":"2c4e1cf0-7a67"}"#;
        assert_eq!(
            session_id(&HeaderMap::new(), &body(json)).as_deref(),
            Some("2c4e1cf0-7a67")
        );
    }

    #[test]
    fn no_session_without_a_usable_key_and_never_from_content() {
        let none = HeaderMap::new();
        // Content mentions a session; metadata has none.
        let content_only = br#"{"model":"m","messages":[{"role":"user","content":"user_x_account__session_abc"}]}"#;
        assert_eq!(session_id(&none, content_only), None);
        assert_eq!(session_id(&none, &body("same-user-across-chats")), None);
        assert_eq!(session_id(&none, &body("user_x_account__session_")), None);
        assert_eq!(session_id(&none, b"not json"), None);
        let mut headers = HeaderMap::new();
        headers.insert(SESSION_HEADER, HeaderValue::from_static("has space"));
        assert_eq!(session_id(&headers, b"{}"), None);
        let long = "a".repeat(MAX_SESSION_ID_LEN + 1);
        headers.insert(SESSION_HEADER, HeaderValue::from_str(&long).unwrap());
        assert_eq!(session_id(&headers, b"{}"), None);
    }

    #[test]
    fn the_request_path_reading_agrees_with_the_body_reading() {
        let json_form = r#"{"device_id":"d","session_id":"s-42"}"#;
        let none = HeaderMap::new();
        for user_id in [LEGACY, json_form, "same-user-across-chats", "u_session_"] {
            let b = body(user_id);
            let info = keypool_providers::inspect_request(&b).unwrap();
            assert_eq!(
                session_id_with(&none, info.user_id.as_deref()),
                session_id(&none, &b),
                "{user_id}"
            );
        }
        assert_eq!(
            session_id_with(&none, Some(json_form)).as_deref(),
            Some("s-42")
        );
        let mut headers = HeaderMap::new();
        headers.insert(SESSION_HEADER, HeaderValue::from_static("h-1"));
        assert_eq!(
            session_id_with(&headers, Some(LEGACY)).as_deref(),
            Some("h-1")
        );
    }

    #[test]
    fn bindings_are_per_url_config() {
        assert_ne!(
            binding_key("acme", "team", "s1"),
            binding_key("acme", "other", "s1")
        );
    }
}
