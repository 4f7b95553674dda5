//! The client's request body: what keypool reads from it (`model`, `stream`), and the
//! per-account model override that rewrites only the `model` value.

use std::ops::Range;

use bytes::Bytes;
use serde::{Deserialize, Deserializer};

use crate::ProvidersError;

/// What keypool needs to know about a request body before choosing an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// The top-level `model`.
    pub model: String,
    /// Whether the body says `"stream": true` (`false`, `null` or no `stream`: not
    /// streaming; any other value is refused). This, not the `Accept` header, decides
    /// streaming (SPEC 3.4).
    pub stream: bool,
    /// `metadata.user_id` when it is a string (any other shape, or none: `None`): read
    /// in the same pass for session affinity, so the body is parsed once.
    pub user_id: Option<String>,
    /// `max_tokens` when it is a whole number (anything else: `None`, for the upstream
    /// to refuse): the output a budget reserves for (SPEC 12).
    pub max_tokens: Option<u64>,
}

/// A field that is either absent (`None`) or present with any JSON value, `null`
/// included (`Some(Value::Null)`).
#[derive(Default)]
struct Present(Option<serde_json::Value>);

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(deserializer).map(|value| Self(Some(value)))
    }
}

#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    model: Present,
    #[serde(default)]
    stream: Present,
    #[serde(default)]
    metadata: Present,
    #[serde(default)]
    max_tokens: Present,
}

/// Reads `model`, `stream`, `metadata.user_id` and `max_tokens` from a Messages API
/// request body, checking that it is a JSON object with a string `model` (SPEC 3.4).
/// Other fields are skipped, not built.
///
/// Done for every request, on bodies of up to hundreds of KB: the body is read by a
/// single-pass scanner (the private `request_scan` module), which gives what serde_json
/// gives and leaves every error and its rare corners to serde_json.
///
/// # Errors
/// [`ProvidersError::InvalidJson`], [`ProvidersError::BodyNotObject`],
/// [`ProvidersError::MissingModel`], [`ProvidersError::ModelNotString`] or
/// [`ProvidersError::StreamNotBoolean`]: all answered
/// `400 invalid_request_error` by the proxy, with no upstream call.
pub fn inspect_request(body: &[u8]) -> Result<RequestInfo, ProvidersError> {
    crate::request_scan::scan_request(body).or_else(|_| inspect_request_serde(body))
}

/// [`inspect_request`] through serde_json alone: the fallback of the scanner for errors
/// and the corners it leaves, and its reference in tests.
pub(crate) fn inspect_request_serde(body: &[u8]) -> Result<RequestInfo, ProvidersError> {
    let invalid = |err: serde_json::Error| ProvidersError::InvalidJson {
        reason: json_error_reason(&err),
    };
    if body.trim_ascii_start().first() != Some(&b'{') {
        // Tell "not JSON" from "JSON, but not an object".
        serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(invalid)?;
        return Err(ProvidersError::BodyNotObject);
    }
    let probe: Probe = serde_json::from_slice(body).map_err(invalid)?;
    let model = match probe.model.0 {
        None => return Err(ProvidersError::MissingModel),
        Some(serde_json::Value::String(model)) => model,
        Some(_) => return Err(ProvidersError::ModelNotString),
    };
    let user_id = match probe.metadata.0 {
        Some(serde_json::Value::Object(mut metadata)) => match metadata.remove("user_id") {
            Some(serde_json::Value::String(user_id)) => Some(user_id),
            _ => None,
        },
        _ => None,
    };
    let stream = match probe.stream.0 {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Bool(stream)) => stream,
        Some(_) => return Err(ProvidersError::StreamNotBoolean),
    };
    let max_tokens = probe
        .max_tokens
        .0
        .as_ref()
        .and_then(serde_json::Value::as_u64);
    Ok(RequestInfo {
        model,
        stream,
        user_id,
        max_tokens,
    })
}

/// The parser's position and category, never its quoted input.
fn json_error_reason(err: &serde_json::Error) -> String {
    let what = match err.classify() {
        serde_json::error::Category::Io => "read error",
        serde_json::error::Category::Syntax => "syntax error",
        serde_json::error::Category::Data => "unexpected value",
        serde_json::error::Category::Eof => "unexpected end of input",
    };
    if err.line() == 0 {
        what.to_owned()
    } else {
        format!("{what} at line {} column {}", err.line(), err.column())
    }
}

/// Returns `body` with the value of every top-level `model` key replaced by `model`
/// (JSON-escaped), every other byte unchanged: the body is spliced, not re-serialised,
/// so key order, whitespace, number spellings and nested `model` keys stay as the client
/// sent them (SPEC 3.6).
///
/// Call it on a body that passed [`inspect_request`].
///
/// # Errors
/// [`ProvidersError::InvalidJson`] when the body is not a well-formed JSON object,
/// [`ProvidersError::MissingModel`] when it has no top-level `model`.
pub fn override_model(body: &[u8], model: &str) -> Result<Bytes, ProvidersError> {
    let spans = top_level_value_spans(body, "model")?;
    if spans.is_empty() {
        return Err(ProvidersError::MissingModel);
    }
    let replacement = serde_json::Value::String(model.to_owned()).to_string();
    let removed: usize = spans.iter().map(Range::len).sum();
    let mut out = Vec::with_capacity(body.len() - removed + spans.len() * replacement.len());
    let mut at = 0;
    for span in spans {
        out.extend_from_slice(&body[at..span.start]);
        out.extend_from_slice(replacement.as_bytes());
        at = span.end;
    }
    out.extend_from_slice(&body[at..]);
    Ok(Bytes::from(out))
}

/// The byte ranges of the values of every top-level `wanted` key of a JSON object
/// (keys compared after unescaping, so `"mod\u0065l"` is `model`).
pub(crate) fn top_level_value_spans(
    body: &[u8],
    wanted: &str,
) -> Result<Vec<Range<usize>>, ProvidersError> {
    let mut scanner = Scanner { bytes: body, at: 0 };
    let mut spans = Vec::new();
    scanner.skip_ws();
    scanner.expect(b'{')?;
    scanner.skip_ws();
    if scanner.peek() == Some(b'}') {
        scanner.at += 1;
    } else {
        loop {
            scanner.skip_ws();
            let key = scanner.string()?;
            scanner.skip_ws();
            scanner.expect(b':')?;
            scanner.skip_ws();
            let start = scanner.at;
            scanner.value()?;
            if key_equals(&body[key], wanted)? {
                spans.push(start..scanner.at);
            }
            scanner.skip_ws();
            match scanner.next() {
                Some(b',') => {}
                Some(b'}') => break,
                _ => return Err(scanner.error("expected `,` or `}` after an object member")),
            }
        }
    }
    scanner.skip_ws();
    if scanner.at != body.len() {
        return Err(scanner.error("trailing characters after the object"));
    }
    Ok(spans)
}

/// Compares a raw JSON string token (quotes included) with `wanted`.
fn key_equals(raw: &[u8], wanted: &str) -> Result<bool, ProvidersError> {
    if !raw.contains(&b'\\') {
        return Ok(&raw[1..raw.len() - 1] == wanted.as_bytes());
    }
    let key: String = serde_json::from_slice(raw).map_err(|err| ProvidersError::InvalidJson {
        reason: json_error_reason(&err),
    })?;
    Ok(key == wanted)
}

/// A minimal structural JSON scanner: finds where values start and end, without
/// building them.
struct Scanner<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn error(&self, what: &str) -> ProvidersError {
        ProvidersError::InvalidJson {
            reason: format!("{what} at byte {}", self.at),
        }
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), ProvidersError> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.error(&format!("expected `{}`", char::from(byte))))
        }
    }

    /// A string token; returns its range, quotes included.
    fn string(&mut self) -> Result<Range<usize>, ProvidersError> {
        let start = self.at;
        self.expect(b'"')?;
        loop {
            let Some(offset) = memchr::memchr2(b'"', b'\\', &self.bytes[self.at..]) else {
                self.at = self.bytes.len();
                return Err(self.error("unterminated string"));
            };
            self.at += offset + 1;
            if self.bytes[self.at - 1] == b'"' {
                return Ok(start..self.at);
            }
            // A backslash: the next byte is escaped (`\"`, `\\`, `\u…`).
            self.at = (self.at + 1).min(self.bytes.len());
        }
    }

    fn value(&mut self) -> Result<(), ProvidersError> {
        match self.peek() {
            Some(b'"') => self.string().map(drop),
            Some(b'{' | b'[') => {
                let mut depth = 0usize;
                loop {
                    match self.peek() {
                        Some(b'"') => {
                            self.string()?;
                            continue;
                        }
                        Some(b'{' | b'[') => depth += 1,
                        Some(b'}' | b']') => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                return Ok(());
                            }
                        }
                        Some(_) => {}
                        None => return Err(self.error("unterminated object or array")),
                    }
                    self.at += 1;
                }
            }
            Some(_) => {
                let start = self.at;
                while !matches!(
                    self.peek(),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t')
                ) {
                    self.at += 1;
                }
                if self.at == start {
                    Err(self.error("expected a value"))
                } else {
                    Ok(())
                }
            }
            None => Err(self.error("expected a value")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    #[test]
    fn inspect_reads_model_and_stream() {
        let info =
            inspect_request(br#"{"model":"claude-sonnet-4-5","stream":true,"max_tokens":1}"#)
                .unwrap();
        assert_eq!(
            info,
            RequestInfo {
                model: "claude-sonnet-4-5".into(),
                stream: true,
                user_id: None,
                max_tokens: Some(1),
            }
        );
        let info = inspect_request(br#" {"stream":false,"model":"m\u00e9"}"#).unwrap();
        assert_eq!(
            info,
            RequestInfo {
                model: "mé".into(),
                stream: false,
                user_id: None,
                max_tokens: None,
            }
        );
        assert!(!inspect_request(br#"{"model":"m"}"#).unwrap().stream);
        assert!(
            !inspect_request(br#"{"model":"m","stream":null}"#)
                .unwrap()
                .stream
        );
        // SPEC 3.4 (issue 14.5): a `stream` that is present but not a boolean is a 400,
        // never "not streaming" (an upstream that coerces it would stream anyway).
        for body in [
            &br#"{"model":"m","stream":"true"}"#[..],
            br#"{"model":"m","stream":1}"#,
            br#"{"model":"m","stream":"yes"}"#,
            br#"{"model":"m","stream":[true]}"#,
            br#"{"model":"m","stream":{}}"#,
        ] {
            assert_eq!(
                inspect_request(body),
                Err(ProvidersError::StreamNotBoolean),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn inspect_reads_a_string_metadata_user_id_and_ignores_other_shapes() {
        let user_id = |body: &[u8]| inspect_request(body).unwrap().user_id;
        assert_eq!(
            user_id(br#"{"model":"m","metadata":{"user_id":"u_session_1"}}"#).as_deref(),
            Some("u_session_1")
        );
        assert_eq!(user_id(br#"{"model":"m"}"#), None);
        assert_eq!(user_id(br#"{"model":"m","metadata":null}"#), None);
        assert_eq!(user_id(br#"{"model":"m","metadata":"x"}"#), None);
        assert_eq!(user_id(br#"{"model":"m","metadata":{"user_id":7}}"#), None);
    }

    #[test]
    fn inspect_rejects_what_the_proxy_answers_400() {
        use ProvidersError::*;
        assert!(matches!(
            inspect_request(b"{\"model\": "),
            Err(InvalidJson { .. })
        ));
        assert!(matches!(
            inspect_request(b"not json"),
            Err(InvalidJson { .. })
        ));
        assert!(matches!(inspect_request(b""), Err(InvalidJson { .. })));
        assert_eq!(inspect_request(b"[1]"), Err(BodyNotObject));
        assert_eq!(inspect_request(b"\"model\""), Err(BodyNotObject));
        assert_eq!(inspect_request(br#"{"messages":[]}"#), Err(MissingModel));
        assert_eq!(inspect_request(br#"{"model":null}"#), Err(ModelNotString));
        assert_eq!(inspect_request(br#"{"model":7}"#), Err(ModelNotString));
        let err = inspect_request(br#"{"model":"secret-ish", oops}"#).unwrap_err();
        assert!(err.is_client_error());
        assert!(!err.to_string().contains("secret-ish"), "{err}");
        assert!(err.to_string().contains("line 1 column"), "{err}");
    }

    #[test]
    fn override_splices_only_the_top_level_model_value() {
        let body = br#"{ "metadata": {"model": "nested"},
  "model" : "claude-3-5-haiku" , "messages":[{"role":"user","content":"say \"model\": x"}],
  "temperature": 1.0e0 }"#;
        let out = override_model(body, "claude-opus-4-1").unwrap();
        let expected =
            String::from_utf8_lossy(body).replace("\"claude-3-5-haiku\"", "\"claude-opus-4-1\"");
        assert_eq!(String::from_utf8_lossy(&out), expected);
    }

    #[test]
    fn override_handles_escaped_keys_and_escapes_the_new_model() {
        let out = override_model(br#"{"mod\u0065l":"a","x":"\\\"model\":"}"#, "q\"uote\n").unwrap();
        assert_eq!(
            &out[..],
            br#"{"mod\u0065l":"q\"uote\n","x":"\\\"model\":"}"#
        );
        assert_eq!(
            override_model(br#"{"x":{"model":"a"}}"#, "b"),
            Err(ProvidersError::MissingModel)
        );
        assert!(matches!(
            override_model(br#"{"model":"a""#, "b"),
            Err(ProvidersError::InvalidJson { .. })
        ));
        assert!(matches!(
            override_model(br#"{"model":"a"} x"#, "b"),
            Err(ProvidersError::InvalidJson { .. })
        ));
        // A non-string model is replaced as well: it is still the top-level value.
        assert_eq!(
            &override_model(br#"{"model":[1,{"a":"]"}]}"#, "b").unwrap()[..],
            br#"{"model":"b"}"#
        );
    }

    fn json_leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "(\\PC|[\"\\\\\n\t\u{1}]){0,12}".prop_map(Value::String),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        json_leaf().prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(
                    (prop_oneof!["[a-z]{1,6}", Just("model".to_string())], inner),
                    0..4
                )
                .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn override_changes_exactly_the_model_value(
            members in prop::collection::vec(("[a-z]{1,8}", json_value()), 0..6),
            old_model in json_value(),
            position in any::<prop::sample::Index>(),
            new_model in "\\PC{0,16}",
            pretty in any::<bool>(),
        ) {
            let mut object = serde_json::Map::new();
            let mut members: Vec<(String, Value)> =
                members.into_iter().filter(|(k, _)| k != "model").collect();
            members.insert(position.index(members.len() + 1), ("model".into(), old_model.clone()));
            object.extend(members);
            let value = Value::Object(object);
            let body = if pretty {
                serde_json::to_vec_pretty(&value).unwrap()
            } else {
                serde_json::to_vec(&value).unwrap()
            };
            let out = override_model(&body, &new_model).unwrap();

            let mut expected = value.clone();
            expected["model"] = json!(new_model);
            prop_assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), expected);

            // Byte-exact outside the model value.
            let spans = top_level_value_spans(&body, "model").unwrap();
            prop_assert_eq!(spans.len(), 1);
            let span = spans[0].clone();
            prop_assert_eq!(serde_json::from_slice::<Value>(&body[span.clone()]).unwrap(), old_model);
            prop_assert_eq!(&out[..span.start], &body[..span.start]);
            prop_assert_eq!(&out[out.len() - (body.len() - span.end)..], &body[span.end..]);
        }

        #[test]
        fn the_scanner_never_panics(body in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = override_model(&body, "m");
            let _ = inspect_request(&body);
        }
    }
}
