//! A single-pass reader of what [`crate::inspect_request`] needs from a request body
//! (`model`, `stream`, `metadata.user_id`, `max_tokens`), allocating only the two
//! strings it returns. Claude Code sends bodies of 50 to 500 KB (long conversations,
//! tool definitions) and everything but these four members is skipped.
//!
//! When it answers, it answers what the serde path (`inspect_request_serde`) answers:
//! `serde_json::from_slice` into a struct of the four members, each an
//! `Option<serde_json::Value>`, every other member an `IgnoredAny`. What serde_json
//! checks, and so what this reader checks:
//! - the body is one JSON object followed only by JSON whitespace;
//! - top-level keys are read as `str`s (no control characters, valid UTF-8), every other
//!   member's value is skipped (escapes well formed, control characters refused, but
//!   neither UTF-8 nor `\u` surrogate pairing checked, numbers checked against the
//!   grammar only, no nesting limit);
//! - the four members are built as whole `Value`s: every string in them, keys included,
//!   is a `str` (UTF-8, surrogates paired), every number is computed, and nesting counts
//!   against serde_json's recursion limit;
//! - a member given twice is an error (serde's derive checks at the key), and so are a
//!   `model` that is missing or not a string and a `stream` that is not a boolean or
//!   `null`; within `metadata` a key given twice keeps its last value (the `Value`'s
//!   map).
//!
//! Any error, and any corner where matching serde_json would cost much code, ends in a
//! [`Stop`] and the caller runs the serde path, which writes the error (its text has
//! serde_json's line and column). The corners left to serde_json: a body that does not
//! start with `{`; a backslash in a top-level key, in `metadata`'s keys, in `model` or
//! in `metadata.user_id`; a number in the four members with an exponent, or with more
//! than 19 integer digits and not a `u64`; a key starting with `$` in the four members'
//! objects; those members nested deeper than [`MAX_VALUE_DEPTH`]; skipped values nested
//! deeper than [`MAX_SKIPPED_DEPTH`](crate::json_scan::MAX_SKIPPED_DEPTH).

use crate::json_scan::{Cursor, MAX_VALUE_DEPTH, Stop};
use crate::request_body::RequestInfo;

/// Reads the members of `body` [`crate::inspect_request`] returns, validating the whole
/// body as the serde path does.
///
/// # Errors
/// [`Stop::Syntax`] or [`Stop::Data`] when the serde path returns an error (which one
/// is its to say), [`Stop::Unsure`] for a corner left to it.
pub(crate) fn scan_request(body: &[u8]) -> Result<RequestInfo, Stop> {
    let mut cursor = Cursor { bytes: body, at: 0 };
    if cursor.skip_ws() != Some(b'{') {
        // Not JSON, or JSON but not an object: the serde path tells which.
        return Err(Stop::Syntax);
    }
    cursor.at += 1;
    // One slot per member, `Some` once seen, as serde's derive keeps them.
    let mut model: Option<&[u8]> = None;
    let mut stream: Option<bool> = None;
    let mut user_id: Option<Option<&[u8]>> = None;
    let mut max_tokens: Option<Option<u64>> = None;
    // Keys are told apart by length first: one word compare each, not one per byte.
    cursor.members(|cursor, key| match key.len() {
        5 if key == b"model" => cursor.member_once(&mut model, Cursor::model),
        6 if key == b"stream" => cursor.member_once(&mut stream, Cursor::stream),
        8 if key == b"metadata" => cursor.member_once(&mut user_id, Cursor::metadata_user_id),
        10 if key == b"max_tokens" => {
            cursor.member_once(&mut max_tokens, |c| c.value_as_u64(MAX_VALUE_DEPTH))
        }
        _ => cursor.skip_member_value(),
    })?;
    if cursor.skip_ws().is_some() {
        return Err(Stop::Syntax);
    }
    Ok(RequestInfo {
        model: text(model.ok_or(Stop::Data)?)?,
        stream: stream.unwrap_or(false),
        user_id: user_id.flatten().map(text).transpose()?,
        max_tokens: max_tokens.flatten(),
    })
}

/// An owned copy of a string the scan checked as UTF-8.
fn text(bytes: &[u8]) -> Result<String, Stop> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| Stop::Syntax)
}

/// The request's own readers of a member's value, each built by serde_json as a whole
/// `serde_json::Value`.
impl<'a> Cursor<'a> {
    /// `model`: a string (without escapes, else [`Stop::Unsure`]); any other value is
    /// an error.
    fn model(&mut self) -> Result<&'a [u8], Stop> {
        if self.skip_ws() != Some(b'"') {
            return Err(Stop::Data);
        }
        self.at += 1;
        self.plain_str()
    }

    /// `stream`: a boolean, `null` for `false`; any other value is an error.
    fn stream(&mut self) -> Result<bool, Stop> {
        match self.skip_ws() {
            Some(b'n') => self.literal(b"null").map(|()| false),
            Some(b't') => self.literal(b"true").map(|()| true),
            Some(b'f') => self.literal(b"false").map(|()| false),
            _ => Err(Stop::Data),
        }
    }

    /// `metadata`, any value: its `user_id` when it is an object whose (last) `user_id`
    /// is a string (without escapes, else [`Stop::Unsure`]).
    fn metadata_user_id(&mut self) -> Result<Option<&'a [u8]>, Stop> {
        if self.skip_ws() != Some(b'{') {
            return self.value_as_u64(MAX_VALUE_DEPTH).map(|_| None);
        }
        self.at += 1;
        let mut user_id = None;
        self.members(|cursor, key| {
            if key.first() == Some(&b'$') {
                // serde_json's private map keys (see `json_scan`).
                return Err(Stop::Unsure);
            }
            cursor.colon()?;
            let is_user_id = key == b"user_id";
            if is_user_id && cursor.skip_ws() == Some(b'"') {
                cursor.at += 1;
                user_id = Some(cursor.plain_str()?);
            } else {
                // The map keeps the last value of a key given twice.
                if is_user_id {
                    user_id = None;
                }
                // Inside `metadata`, one level down.
                cursor.value_as_u64(MAX_VALUE_DEPTH - 1)?;
            }
            Ok(())
        })?;
        Ok(user_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer_scan::tests::{
        Json, Mutation, TOKENS, jsonish_byte, key, literal, mutate, mutation, number, string_token,
        structured_body, value,
    };
    use crate::json_scan::{MAX_SKIPPED_DEPTH, MAX_VALUE_DEPTH};
    use crate::request_body::{inspect_request, inspect_request_serde};
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    include!("../benches/support/claude_code_request.rs");

    /// The request of the proxy's benchmark.
    const SMALL: &[u8] = br#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Say hello."}]}"#;

    /// A request with every kind of value in the members the scan reads.
    const METADATA: &str = r#"{"model":"claude-opus-4-1","metadata":{"user_id":"user_1f2e_account_5e3c_session_8a7b","tags":["a",{"b":null,"c":[true,false]}],"n":-1.5,"z":0,"s":"caf\u00e9 \ud83d\ude00 \"q\" é"},"max_tokens":1024,"stream":false,"temperature":0.7,"top_p":1e-3,"messages":[]}"#;

    /// The same, pretty-printed.
    const PRETTY: &[u8] = b"{\n  \"model\": \"claude-haiku-4-5\",\n  \"stream\": true,\n  \"metadata\": {\n    \"user_id\": \"u\"\n  },\n  \"max_tokens\": 8,\n  \"messages\": [\n    {\"role\": \"user\", \"content\": \"hi\\n\"}\n  ]\n}\n";

    /// What the scan reads, for the examples.
    fn info(
        model: &str,
        stream: bool,
        user_id: Option<&str>,
        max_tokens: Option<u64>,
    ) -> RequestInfo {
        RequestInfo {
            model: model.to_owned(),
            stream,
            user_id: user_id.map(str::to_owned),
            max_tokens,
        }
    }

    /// The scan answers what the serde path answers (or leaves the body to it), and
    /// `inspect_request` returns exactly the serde path's result.
    fn agree(body: &[u8]) -> Result<(), TestCaseError> {
        let text = String::from_utf8_lossy(body);
        let reference = inspect_request_serde(body);
        match scan_request(body) {
            Ok(info) => prop_assert_eq!(Ok(info), reference.clone(), "{}", text),
            Err(Stop::Syntax | Stop::Data) => {
                prop_assert!(reference.is_err(), "{:?} {}", reference, text);
            }
            Err(Stop::Unsure) => {}
        }
        prop_assert_eq!(inspect_request(body), reference, "{}", text);
        Ok(())
    }

    /// A body `depth` arrays deep inside `member`'s object.
    fn nested(member: &str, depth: usize) -> Vec<u8> {
        let mut body = format!(r#"{{"model":"m","{member}":{{"a":"#).into_bytes();
        body.extend(std::iter::repeat_n(b'[', depth));
        body.extend(std::iter::repeat_n(b']', depth));
        body.extend_from_slice(b"}}");
        body
    }

    #[test]
    fn examples_agree_with_serde() {
        use Expected::{Fails, Reads};
        /// What `inspect_request` returns, and whether the scan answers alone.
        enum Expected {
            Reads(RequestInfo, bool),
            /// The error's variant (its text is serde_json's).
            Fails(&'static str),
        }
        let m = |max_tokens| Reads(info("m", false, None, max_tokens), true);
        let user = |user_id: Option<&str>, fast| Reads(info("m", false, user_id, None), fast);
        let cases: Vec<(Vec<u8>, Expected)> = vec![
            (
                SMALL.to_vec(),
                Reads(info("claude-sonnet-4-5", false, None, Some(64)), true),
            ),
            (
                METADATA.as_bytes().to_vec(),
                Reads(
                    info(
                        "claude-opus-4-1",
                        false,
                        Some("user_1f2e_account_5e3c_session_8a7b"),
                        Some(1024),
                    ),
                    true,
                ),
            ),
            (
                PRETTY.to_vec(),
                Reads(info("claude-haiku-4-5", true, Some("u"), Some(8)), true),
            ),
            // `stream`: a boolean or null.
            (br#"{"model":"m","stream":null}"#.to_vec(), m(None)),
            (
                br#"{"stream":true,"model":"m"}"#.to_vec(),
                Reads(info("m", true, None, None), true),
            ),
            (
                br#"{"model":"m","stream":"true"}"#.to_vec(),
                Fails("StreamNotBoolean"),
            ),
            (
                br#"{"model":"m","stream":0}"#.to_vec(),
                Fails("StreamNotBoolean"),
            ),
            // `model`: a string; escapes are left to serde_json.
            (
                "{\"model\":\"mé\"}".as_bytes().to_vec(),
                Reads(info("mé", false, None, None), true),
            ),
            (
                br#"{"model":"m\u00e9"}"#.to_vec(),
                Reads(info("mé", false, None, None), false),
            ),
            (b"{\"model\":\"m\xff\"}".to_vec(), Fails("InvalidJson")),
            (br#"{"model":null}"#.to_vec(), Fails("ModelNotString")),
            (br#"{"model":["m"]}"#.to_vec(), Fails("ModelNotString")),
            (br#"{"stream":true}"#.to_vec(), Fails("MissingModel")),
            // A member twice is an error, escaped or not; other keys may repeat.
            (
                br#"{"model":"m","model":"m"}"#.to_vec(),
                Fails("InvalidJson"),
            ),
            (
                br#"{"model":"m","mod\u0065l":"n"}"#.to_vec(),
                Fails("InvalidJson"),
            ),
            (
                br#"{"max_tokens":1,"model":"m","max_tokens":1}"#.to_vec(),
                Fails("InvalidJson"),
            ),
            (br#"{"model":"m","x":1,"x":[2]}"#.to_vec(), m(None)),
            (
                br#"{"mod\u0065l":"n"}"#.to_vec(),
                Reads(info("n", false, None, None), false),
            ),
            // `metadata` is a whole `Value`: the last `user_id` wins.
            (
                br#"{"model":"m","metadata":{"user_id":"a","user_id":7}}"#.to_vec(),
                user(None, true),
            ),
            (
                br#"{"model":"m","metadata":{"user_id":7,"user_id":"b"}}"#.to_vec(),
                user(Some("b"), true),
            ),
            (
                br#"{"model":"m","metadata":{"user_id":"a\nb"}}"#.to_vec(),
                user(Some("a\nb"), false),
            ),
            (
                br#"{"model":"m","metadata":{"user\u005fid":"a"}}"#.to_vec(),
                user(Some("a"), false),
            ),
            (
                br#"{"model":"m","metadata":[{"user_id":"a"}]}"#.to_vec(),
                user(None, true),
            ),
            (
                br#"{"model":"m","metadata":"user_id"}"#.to_vec(),
                user(None, true),
            ),
            (
                br#"{"model":"m","metadata":{"$k":1}}"#.to_vec(),
                user(None, false),
            ),
            // Its strings are `str`s: surrogates paired, valid UTF-8.
            (
                br#"{"model":"m","metadata":{"a":"\ud83d\ude00\u0000"}}"#.to_vec(),
                user(None, true),
            ),
            (
                br#"{"model":"m","metadata":{"a":"\ud83d"}}"#.to_vec(),
                Fails("InvalidJson"),
            ),
            (
                br#"{"model":"m","metadata":{"a":"\ud83d\u0041"}}"#.to_vec(),
                Fails("InvalidJson"),
            ),
            (
                br#"{"model":"m","metadata":{"a":"\ude00"}}"#.to_vec(),
                Fails("InvalidJson"),
            ),
            (
                b"{\"model\":\"m\",\"metadata\":{\"a\":\"\xed\xa0\x80\"}}".to_vec(),
                Fails("InvalidJson"),
            ),
            (
                b"{\"model\":\"m\",\"metadata\":[\"\xff\"]}".to_vec(),
                Fails("InvalidJson"),
            ),
            (
                b"{\"model\":\"m\",\"metadata\":{\"\xff\":1}}".to_vec(),
                Fails("InvalidJson"),
            ),
            // Its numbers are computed: a float that overflows is an error.
            (
                br#"{"model":"m","metadata":{"a":[-1,0.5,-0]}}"#.to_vec(),
                user(None, true),
            ),
            (
                br#"{"model":"m","metadata":{"a":1e400}}"#.to_vec(),
                Fails("InvalidJson"),
            ),
            (
                br#"{"model":"m","metadata":{"a":1e300}}"#.to_vec(),
                user(None, false),
            ),
            // Skipped values are not: no UTF-8 or surrogate check, numbers by grammar.
            (
                b"{\"model\":\"m\",\"x\":[\"\xff\\ud800\",1e400,-0.0e-0]}".to_vec(),
                m(None),
            ),
            (br#"{"model":"m","x":"\x"}"#.to_vec(), Fails("InvalidJson")),
            (
                b"{\"model\":\"m\",\"x\":\"\t\"}".to_vec(),
                Fails("InvalidJson"),
            ),
            (br#"{"model":"m","x":-01}"#.to_vec(), Fails("InvalidJson")),
            (br#"{"model":"m","x":1.}"#.to_vec(), Fails("InvalidJson")),
            // `max_tokens`: `Value::as_u64`.
            (br#"{"model":"m","max_tokens":0}"#.to_vec(), m(Some(0))),
            (
                br#"{"model":"m","max_tokens":18446744073709551615}"#.to_vec(),
                m(Some(u64::MAX)),
            ),
            (
                br#"{"model":"m","max_tokens":18446744073709551616}"#.to_vec(),
                Reads(info("m", false, None, None), false),
            ),
            (br#"{"model":"m","max_tokens":-1}"#.to_vec(), m(None)),
            (br#"{"model":"m","max_tokens":-0}"#.to_vec(), m(None)),
            (br#"{"model":"m","max_tokens":64.0}"#.to_vec(), m(None)),
            (br#"{"model":"m","max_tokens":"64"}"#.to_vec(), m(None)),
            (br#"{"model":"m","max_tokens":[64]}"#.to_vec(), m(None)),
            (br#"{"model":"m","max_tokens":null}"#.to_vec(), m(None)),
            (
                br#"{"model":"m","max_tokens":6.4e1}"#.to_vec(),
                Reads(info("m", false, None, None), false),
            ),
            (
                br#"{"model":"m","max_tokens":1e400}"#.to_vec(),
                Fails("InvalidJson"),
            ),
            (
                br#"{"model":"m","max_tokens":064}"#.to_vec(),
                Fails("InvalidJson"),
            ),
            // One object, JSON whitespace only around it.
            (b" \n\t\r{ \"model\" : \"m\" } \n".to_vec(), m(None)),
            (br#"{"model":"m"} x"#.to_vec(), Fails("InvalidJson")),
            (br#"{"model":"m"}{}"#.to_vec(), Fails("InvalidJson")),
            (br#"{"model":"m",}"#.to_vec(), Fails("InvalidJson")),
            (b"\x0c{\"model\":\"m\"}".to_vec(), Fails("InvalidJson")),
            (b"{\"model\":\"m\"}\x0c".to_vec(), Fails("InvalidJson")),
            (br#"{"model":"m""#.to_vec(), Fails("InvalidJson")),
            (b"".to_vec(), Fails("InvalidJson")),
            (b"[1]".to_vec(), Fails("BodyNotObject")),
            (b" \"model\"".to_vec(), Fails("BodyNotObject")),
            // Nesting: a `Value` up to serde_json's recursion limit, skipped values
            // without one.
            (nested("metadata", 90), user(None, true)),
            (nested("metadata", 125), user(None, false)),
            (nested("metadata", 126), Fails("InvalidJson")),
            (nested("max_tokens", 90), m(None)),
            (
                nested("max_tokens", 125),
                Reads(info("m", false, None, None), false),
            ),
            (nested("x", 300), m(None)),
            (
                nested("x", MAX_SKIPPED_DEPTH + 10),
                Reads(info("m", false, None, None), false),
            ),
        ];
        for (body, expected) in cases {
            let text = String::from_utf8_lossy(&body);
            let result = inspect_request(&body);
            assert_eq!(result, inspect_request_serde(&body), "{text}");
            match expected {
                Reads(info, fast) => {
                    assert_eq!(result, Ok(info), "{text}");
                    assert_eq!(scan_request(&body).is_ok(), fast, "{text}");
                }
                Fails(variant) => {
                    let err = result.expect_err(&text);
                    assert!(format!("{err:?}").starts_with(variant), "{err:?} {text}");
                    assert!(scan_request(&body).is_err(), "{text}");
                }
            }
        }
    }

    /// Every byte at each position where the grammar or serde_json's rules change: the
    /// value and string contents of each member read, escapes and surrogates in a
    /// `Value`, UTF-8 sequences, keys, numbers, skipped strings, around the body.
    #[test]
    fn every_byte_at_every_decision_point_agrees() {
        const TEMPLATES: &[&[u8]] = &[
            br#"?{"model":"m"}"#,
            br#"{"model":"m"}?"#,
            br#"{?"model":"m"}"#,
            br#"{"?odel":"m"}"#,
            br#"{"model"?"m"}"#,
            br#"{"model":?}"#,
            br#"{"model":"m?"}"#,
            br#"{"model":"m\?"}"#,
            b"{\"model\":\"\xc3?\"}",
            b"{\"model\":\"\xe2\x82?\"}",
            br#"{"model":"m"?}"#,
            br#"{"model":"m",?}"#,
            br#"{"model":"m","stream":?}"#,
            br#"{"model":"m","stream":t?ue}"#,
            br#"{"model":"m","max_tokens":?}"#,
            br#"{"model":"m","max_tokens":6?}"#,
            br#"{"model":"m","max_tokens":0?}"#,
            br#"{"model":"m","max_tokens":-?}"#,
            br#"{"model":"m","max_tokens":1.?}"#,
            br#"{"model":"m","max_tokens":1e?}"#,
            br#"{"model":"m","max_tokens":18446744073709551615?}"#,
            br#"{"model":"m","metadata":?}"#,
            br#"{"model":"m","metadata":{?}}"#,
            br#"{"model":"m","metadata":{"?":1}}"#,
            br#"{"model":"m","metadata":{"user_id"?"u"}}"#,
            br#"{"model":"m","metadata":{"user_id":?}}"#,
            br#"{"model":"m","metadata":{"user_id":"u?"}}"#,
            br#"{"model":"m","metadata":{"user_id":"u"?}}"#,
            br#"{"model":"m","metadata":{"a":"?"}}"#,
            br#"{"model":"m","metadata":{"a":"\?"}}"#,
            br#"{"model":"m","metadata":{"a":"\u00?0"}}"#,
            br#"{"model":"m","metadata":{"a":"\ud83d?"}}"#,
            br#"{"model":"m","metadata":{"a":"\ud83d\?de00"}}"#,
            br#"{"model":"m","metadata":{"a":"\ud83d\ud?00"}}"#,
            br#"{"model":"m","metadata":{"a":"\?de00"}}"#,
            b"{\"model\":\"m\",\"metadata\":{\"a\":\"\xc3?\"}}",
            b"{\"model\":\"m\",\"metadata\":{\"a\":\"\xed?\x80\"}}",
            b"{\"model\":\"m\",\"metadata\":{\"a\":\"\xf0\x9f?\x80\"}}",
            br#"{"model":"m","metadata":{"a":[1,?]}}"#,
            br#"{"model":"m","metadata":{"a":[?]}}"#,
            br#"{"model":"m","metadata":{"a":{"?":1}}}"#,
            br#"{"model":"m","metadata":{"a":-1.5e?}}"#,
            br#"{"model":"m","x":?}"#,
            br#"{"model":"m","x":"a?b"}"#,
            br#"{"model":"m","x":"\?"}"#,
            br#"{"model":"m","x":"\u00?0"}"#,
            br#"{"model":"m","x":[?]}"#,
            br#"{"model":"m","x":{"a":1?}}"#,
            br#"{"model":"m","x":0?}"#,
        ];
        for template in TEMPLATES {
            let at = template
                .iter()
                .position(|&b| b == b'?')
                .expect("a placeholder");
            for byte in 0..=u8::MAX {
                let mut body = template.to_vec();
                body[at] = byte;
                if let Err(e) = agree(&body) {
                    panic!("{e}");
                }
            }
        }
    }

    /// Around serde_json's recursion limit inside the members read as a `Value`, and
    /// the scan's own limits.
    #[test]
    fn nesting_agrees_at_every_depth_near_the_limits() {
        for depth in
            (MAX_VALUE_DEPTH - 5..=130).chain(MAX_SKIPPED_DEPTH - 5..=MAX_SKIPPED_DEPTH + 5)
        {
            for member in ["metadata", "max_tokens", "x"] {
                if let Err(e) = agree(&nested(member, depth)) {
                    panic!("{member} {depth}: {e}");
                }
            }
        }
    }

    #[test]
    fn realistic_requests_take_the_fast_path() {
        let bodies = [
            SMALL.to_vec(),
            METADATA.as_bytes().to_vec(),
            PRETTY.to_vec(),
            claude_code_request(0),
            claude_code_request(500_000),
        ];
        for body in bodies {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
            let scanned = scan_request(&body);
            assert!(scanned.is_ok(), "{text}");
            assert_eq!(scanned.ok(), inspect_request_serde(&body).ok(), "{text}");
        }
        let big = scan_request(&claude_code_request(100_000)).expect("the fast path");
        assert_eq!(big.model, "claude-sonnet-4-5-20250929");
        assert!(big.stream);
        assert_eq!(big.max_tokens, Some(32_000));
        assert!(
            big.user_id
                .is_some_and(|id| id.starts_with("user_") && id.contains("_session_"))
        );
    }

    // ---- generators: the answer scanner's, renamed --------------------------------

    /// Bodies written for the answer scanner's tests, with the answer's keys renamed to
    /// the request's (`type` to `model`, `usage` to `metadata`, `output_tokens` to
    /// `user_id`, ...): the same shapes, duplicates, escapes, numbers and nesting, now
    /// meeting the members a request is read for.
    fn as_request(body: &[u8]) -> Vec<u8> {
        const RENAMES: &[(&[u8], &[u8])] = &[
            (b"\"type\"", b"\"model\""),
            (b"\"usage\"", b"\"metadata\""),
            (b"\"input_tokens\"", b"\"max_tokens\""),
            (b"\"choices\"", b"\"stream\""),
            (b"\"output_tokens\"", b"\"user_id\""),
            (b"\"id\"", b"\"$id\""),
            (br#""typ\u0065""#, br#""mod\u0065l""#),
            (br#""\u0075sage""#, br#""\u006detadata""#),
            (br#""input\u005ftokens""#, br#""max\u005ftokens""#),
        ];
        let mut out = Vec::with_capacity(body.len() + body.len() / 4);
        let mut rest = body;
        'bytes: while let Some((&byte, after)) = rest.split_first() {
            for (from, to) in RENAMES {
                if let Some(after) = rest.strip_prefix(*from) {
                    out.extend_from_slice(to);
                    rest = after;
                    continue 'bytes;
                }
            }
            out.push(byte);
            rest = after;
        }
        out
    }

    /// A member of a request: one of the four the scan reads, its value mostly of the
    /// type expected but of any other too, or any other member (the answer's keys,
    /// escaped keys, any string).
    fn request_member() -> impl Strategy<Value = (Vec<u8>, Json)> {
        fn member(
            key: &'static str,
            expected: impl Strategy<Value = Json> + 'static,
        ) -> impl Strategy<Value = (Vec<u8>, Json)> {
            prop_oneof![4 => expected, 1 => value()]
                .prop_map(move |value| (key.as_bytes().to_vec(), value))
        }
        prop_oneof![
            3 => member("\"model\"", string_token().prop_map(Json::Token)),
            2 => member("\"stream\"", literal().prop_map(Json::Token)),
            2 => member("\"metadata\"", metadata()),
            2 => member("\"max_tokens\"", number().prop_map(Json::Token)),
            3 => (key(), value()),
        ]
    }

    /// A `metadata` object: `user_id`s (plain, escaped) and other members.
    fn metadata() -> impl Strategy<Value = Json> {
        let key = prop_oneof![
            3 => Just(b"\"user_id\"".to_vec()),
            1 => Just(br#""user\u005fid""#.to_vec()),
            1 => Just(b"\"$k\"".to_vec()),
            3 => key(),
        ];
        let value = prop_oneof![3 => string_token().prop_map(Json::Token), 2 => value()];
        prop::collection::vec((key, value), 0..4).prop_map(Json::Object)
    }

    /// A request object of such members, nearly always with one more `model` string
    /// somewhere, compact or spaced.
    fn request_body() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::sample::select(&["", " ", "\n  "][..]),
            prop::collection::vec(request_member(), 0..5),
            prop::option::weighted(0.9, (any::<prop::sample::Index>(), string_token())),
        )
            .prop_map(|(ws, mut members, model)| {
                if let Some((at, model)) = model {
                    let at = at.index(members.len() + 1);
                    members.insert(at, (b"\"model\"".to_vec(), Json::Token(model)));
                }
                let mut body = Vec::new();
                Json::Object(members).write(ws.as_bytes(), &mut body);
                body
            })
    }

    /// Pieces of JSON text the request's members meet, for mutations.
    const REQUEST_TOKENS: &[&str] = &[
        "\"model\"",
        "\"stream\"",
        "\"metadata\"",
        "\"max_tokens\"",
        "\"user_id\"",
        "\"$k\"",
        "{\"user_id\":\"u\"}",
        "\"\\ud83d\\ude00\"",
        "\"\\ud83d\"",
        "\"\\u00e9\"",
        "\"\u{e9}\"",
        "-0",
        "0.5",
        "1e400",
        "18446744073709551616",
    ];

    /// The answer scanner's mutations, and insertions of the request's tokens.
    fn request_mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            3 => mutation(),
            1 => (any::<prop::sample::Index>(), prop::sample::select(REQUEST_TOKENS))
                .prop_map(|(at, token)| Mutation::InsertToken(at, token)),
        ]
    }

    /// `base` with `mutations` applied in turn.
    fn mutated(base: &[u8], mutations: &[Mutation]) -> Vec<u8> {
        let mut body = base.to_vec();
        for mutation in mutations {
            mutate(&mut body, mutation);
        }
        body
    }

    /// The requests the mutation test starts from.
    const BASES: &[&[u8]] = &[SMALL, METADATA.as_bytes(), PRETTY];

    /// Starts of bodies that random bytes then continue.
    const OPENINGS: &[&str] = &[
        "",
        "{",
        "{\"model\":\"m\",",
        "{\"model\":\"m\",\"metadata\":",
        "{\"model\":\"m\",\"metadata\":{\"user_id\":",
        "{\"model\":\"m\",\"max_tokens\":",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn mutated_requests_agree(
            base in prop::sample::select(BASES),
            mutations in prop::collection::vec(request_mutation(), 1..5),
        ) {
            agree(&mutated(base, &mutations))?;
        }

        #[test]
        fn structured_requests_agree(body in request_body()) {
            agree(&body)?;
        }

        #[test]
        fn renamed_structured_answers_agree(body in structured_body()) {
            agree(&as_request(&body))?;
        }

        #[test]
        fn token_soups_agree(
            tokens in prop::collection::vec(
                prop_oneof![prop::sample::select(TOKENS), prop::sample::select(REQUEST_TOKENS)],
                0..24,
            ),
        ) {
            let body: Vec<u8> =
                std::iter::once("{").chain(tokens).flat_map(str::bytes).collect();
            agree(&as_request(&body))?;
        }

        #[test]
        fn random_bytes_agree(
            opening in prop::sample::select(OPENINGS),
            bytes in prop::collection::vec(
                prop_oneof![3 => jsonish_byte(), 1 => any::<u8>()],
                0..48,
            ),
        ) {
            let body: Vec<u8> = opening.bytes().chain(bytes).collect();
            agree(&body)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]

        /// A realistic request, mutated: one turn of a conversation (about 6 KB).
        #[test]
        fn mutated_claude_code_requests_agree(
            mutations in prop::collection::vec(request_mutation(), 1..4),
        ) {
            agree(&mutated(&claude_code_request(0), &mutations))?;
        }
    }

    #[test]
    fn the_structured_requests_reach_every_verdict_mostly_without_serde() {
        let mut runner = TestRunner::deterministic();
        let strategy = request_body();
        let (mut ok, mut errors, mut unsure) = (0, 0, 0);
        for _ in 0..1000 {
            let body = strategy.new_tree(&mut runner).expect("a body").current();
            match scan_request(&body) {
                Ok(_) => ok += 1,
                Err(Stop::Syntax | Stop::Data) => errors += 1,
                Err(Stop::Unsure) => unsure += 1,
            }
        }
        eprintln!("ok {ok}, errors {errors}, unsure {unsure}");
        assert!(ok >= 150 && errors >= 300 && unsure <= 400);
    }
}
