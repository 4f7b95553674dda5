//! A single-pass, allocation-free reader of the top-level members a non-streaming answer
//! is checked by ([`crate::response::check_answer_body`]): `type`, `usage`,
//! `input_tokens` and `choices`.
//!
//! It gives the same verdict as `serde_json::from_slice` into the serde-derived answer
//! struct it replaces on the hot path (`Option<String>`, `Option<UsageUpdate>`,
//! `Option<u64>`, `Option<IgnoredAny>`), including *which* error serde_json meets first:
//! a syntax error (`not_json`) or a data error (`not_an_answer`). What serde_json
//! checks, and so what this reader checks:
//! - the body is one JSON object followed only by JSON whitespace;
//! - the keys of the top-level and `usage` objects and a string `type` are read as
//!   `str`s: no control characters, valid UTF-8;
//! - every other string is skipped as serde_json's `ignore_str` does: escapes must be
//!   well formed and control characters are refused, but neither UTF-8 nor `\u`
//!   surrogate pairing is checked;
//! - skipped values have no nesting limit (serde_json's `ignore_value` is iterative), and
//!   the two levels read here never reach serde_json's recursion limit of 128;
//! - data errors: a known member twice (found at its key, before its value is read), a
//!   known member of the wrong type (found once the first token of the value is read:
//!   an array or object is refused at its opening bracket), a `u64` member that is
//!   negative, fractional or out of range.
//!
//! Rare corners where matching serde_json would cost much code end in
//! [`Stop::Unsure`], and the caller asks serde_json: a backslash in a key of the
//! top-level or `usage` object or in a string value of a known member; any number that
//! is not a plain `u64` in a known member (a `-`, a fraction, an exponent, more than
//! `u64::MAX`: serde_json computes a float then, which may overflow, a syntax error); `usage`
//! as an array (serde_json reads a struct from a sequence); skipped values nested deeper
//! than [`MAX_SKIPPED_DEPTH`](crate::json_scan::MAX_SKIPPED_DEPTH).

use crate::json_scan::Cursor;
#[cfg(test)]
use crate::json_scan::MAX_SKIPPED_DEPTH;
pub(crate) use crate::json_scan::Stop;
use crate::response::UsageUpdate;

/// The top-level members of an answer that its check reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AnswerMembers {
    /// Whether `type` is the string `message`.
    pub(crate) is_message: bool,
    /// `usage`, when it is an object.
    pub(crate) usage: Option<UsageUpdate>,
    /// `input_tokens`, when it is a number.
    pub(crate) input_tokens: Option<u64>,
    /// Whether `choices` is there and not `null`.
    pub(crate) has_choices: bool,
}

/// Reads the members of `body` the answer check needs, validating the whole body.
///
/// # Errors
/// The [`Stop`] serde_json would meet first, or [`Stop::Unsure`].
pub(crate) fn scan_answer(body: &[u8]) -> Result<AnswerMembers, Stop> {
    let mut cursor = Cursor { bytes: body, at: 0 };
    if cursor.skip_ws() != Some(b'{') {
        return Err(Stop::Syntax);
    }
    cursor.at += 1;
    // One slot per known member, `Some` once seen, as serde's derive keeps them.
    let mut kind: Option<bool> = None;
    let mut usage: Option<Option<UsageUpdate>> = None;
    let mut input_tokens: Option<Option<u64>> = None;
    let mut choices: Option<bool> = None;
    // Keys are told apart by length first: one word compare each, not one per byte.
    cursor.members(|cursor, key| match key.len() {
        4 if key == b"type" => {
            cursor.member_once(&mut kind, |c| Ok(c.optional_str()? == Some(b"message")))
        }
        5 if key == b"usage" => cursor.member_once(&mut usage, Cursor::optional_usage),
        12 if key == b"input_tokens" => cursor.member_once(&mut input_tokens, Cursor::optional_u64),
        7 if key == b"choices" => cursor.member_once(&mut choices, Cursor::present),
        _ => cursor.skip_member_value(),
    })?;
    if cursor.skip_ws().is_some() {
        return Err(Stop::Syntax);
    }
    Ok(AnswerMembers {
        is_message: kind.unwrap_or(false),
        usage: usage.flatten(),
        input_tokens: input_tokens.flatten(),
        has_choices: choices.unwrap_or(false),
    })
}

/// The answer's own readers of a known member's value.
impl<'a> Cursor<'a> {
    /// An `Option<String>` value (borrowed: escapes are left to serde_json).
    fn optional_str(&mut self) -> Result<Option<&'a [u8]>, Stop> {
        match self.skip_ws() {
            Some(b'n') => self.literal(b"null").map(|()| None),
            Some(b'"') => {
                self.at += 1;
                self.plain_str().map(Some)
            }
            _ => Err(self.wrong_type()),
        }
    }

    /// An `Option<u64>` value.
    fn optional_u64(&mut self) -> Result<Option<u64>, Stop> {
        match self.skip_ws() {
            Some(b'n') => self.literal(b"null").map(|()| None),
            Some(b'0'..=b'9') => self.plain_u64().map(Some),
            _ => Err(self.wrong_type()),
        }
    }

    /// An `Option<IgnoredAny>` value: whether it is there and not `null`.
    fn present(&mut self) -> Result<bool, Stop> {
        if self.skip_ws() == Some(b'n') {
            self.literal(b"null").map(|()| false)
        } else {
            self.skip_value().map(|()| true)
        }
    }

    /// An `Option<UsageUpdate>` value.
    fn optional_usage(&mut self) -> Result<Option<UsageUpdate>, Stop> {
        match self.skip_ws() {
            Some(b'n') => return self.literal(b"null").map(|()| None),
            Some(b'{') => self.at += 1,
            Some(b'[') => return Err(Stop::Unsure),
            _ => return Err(self.wrong_type()),
        }
        let mut input: Option<Option<u64>> = None;
        let mut output: Option<Option<u64>> = None;
        let mut cache_creation: Option<Option<u64>> = None;
        let mut cache_read: Option<Option<u64>> = None;
        self.members(|cursor, key| {
            let slot = match key.len() {
                12 if key == b"input_tokens" => &mut input,
                13 if key == b"output_tokens" => &mut output,
                27 if key == b"cache_creation_input_tokens" => &mut cache_creation,
                23 if key == b"cache_read_input_tokens" => &mut cache_read,
                _ => return cursor.skip_member_value(),
            };
            cursor.member_once(slot, Cursor::optional_u64)
        })?;
        Ok(Some(UsageUpdate {
            input_tokens: input.flatten(),
            output_tokens: output.flatten(),
            cache_creation_input_tokens: cache_creation.flatten(),
            cache_read_input_tokens: cache_read.flatten(),
        }))
    }

    /// A known member's value of the wrong type, at the cursor: serde_json reads its
    /// first token (a literal, a string or a number; not an array's or object's
    /// contents) and then reports a data error, unless reading that token failed.
    fn wrong_type(&mut self) -> Stop {
        let token = match self.peek() {
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'"') => {
                self.at += 1;
                self.plain_str().map(drop)
            }
            Some(b'[' | b'{') => Ok(()),
            // A number: serde_json computes its value, and a float may overflow.
            Some(b'-' | b'0'..=b'9') => Err(Stop::Unsure),
            _ => Err(Stop::Syntax),
        };
        match token {
            Ok(()) => Stop::Data,
            Err(stop) => stop,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Endpoint;
    use crate::response::{
        AnswerProblem, Usage, answer_members_serde, check_answer_body, check_answer_body_serde,
    };
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    const ENDPOINTS: [Endpoint; 4] = [
        Endpoint::Messages,
        Endpoint::CountTokens,
        Endpoint::ChatCompletions,
        Endpoint::Models,
    ];

    /// A Messages answer as Anthropic writes it (341 bytes).
    const MESSAGE: &[u8] = br#"{"id":"msg_01XFDUDYJgAACzvnptvVo","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hi! How can I help?"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":18240,"output_tokens":503,"service_tier":"standard"}}"#;

    /// Realistic bodies the mutation test starts from.
    const BASES: [&[u8]; 6] = [
        MESSAGE,
        br#"{"input_tokens":2095}"#,
        br#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hi\nthere \"you\" \u00e9\ud83d\ude00"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0}}}"#,
        br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#,
        b"{\n  \"type\": \"message\",\n  \"content\": [\n    {\"type\": \"tool_use\", \"input\": {\"a\": [1, 2.5, -3e2, true, false, null]}}\n  ],\n  \"usage\": {\"input_tokens\": 1, \"output_tokens\": null}\n}\n",
        br#"{"type":"message","usage":{"input_tokens":18446744073709551615,"output_tokens":0},"choices":[],"input_tokens":0}"#,
    ];

    /// The scanner gives serde_json's verdict (or leaves the body to it), and the checks
    /// agree on every endpoint.
    fn agree(body: &[u8]) -> Result<(), TestCaseError> {
        let text = String::from_utf8_lossy(body);
        let scanned = scan_answer(body);
        let reference = answer_members_serde(body);
        match scanned {
            Ok(members) => prop_assert_eq!(reference, Ok(members), "{}", text),
            Err(Stop::Syntax) => {
                prop_assert_eq!(reference, Err(AnswerProblem::NotJson), "{}", text)
            }
            Err(Stop::Data) => {
                prop_assert_eq!(reference, Err(AnswerProblem::NotAnAnswer), "{}", text);
            }
            Err(Stop::Unsure) => {}
        }
        for endpoint in ENDPOINTS {
            prop_assert_eq!(
                check_answer_body(endpoint, body),
                check_answer_body_serde(endpoint, body),
                "{:?} {}",
                endpoint,
                text
            );
        }
        Ok(())
    }

    /// What the check returns.
    type Checked = Result<Option<Usage>, AnswerProblem>;

    fn usage(input: u64, output: u64, creation: u64, read: u64) -> Option<Usage> {
        Some(Usage {
            input_tokens: input,
            output_tokens: output,
            cache_creation_input_tokens: creation,
            cache_read_input_tokens: read,
        })
    }

    #[test]
    fn examples_give_serde_jsons_verdict() {
        use AnswerProblem::{NotAnAnswer, NotJson};
        use Endpoint::{ChatCompletions, CountTokens, Messages};
        let deep = |depth: usize| {
            let mut body = br#"{"type":"message","x":"#.to_vec();
            body.extend(std::iter::repeat_n(b'[', depth));
            body.extend(std::iter::repeat_n(b']', depth));
            body.push(b'}');
            body
        };
        let cases: Vec<(Endpoint, Vec<u8>, Checked)> = vec![
            (Messages, MESSAGE.to_vec(), Ok(usage(2095, 503, 0, 18240))),
            (CountTokens, MESSAGE.to_vec(), Err(NotAnAnswer)),
            (
                CountTokens,
                br#" {"input_tokens" : 7 } "#.to_vec(),
                Ok(usage(7, 0, 0, 0)),
            ),
            (
                CountTokens,
                br#"{"input_tokens":null}"#.to_vec(),
                Err(NotAnAnswer),
            ),
            (ChatCompletions, br#"{"choices":[]}"#.to_vec(), Ok(None)),
            (
                ChatCompletions,
                br#"{"choices":null}"#.to_vec(),
                Err(NotAnAnswer),
            ),
            (
                Messages,
                br#"{"type":"message","usage":null}"#.to_vec(),
                Ok(None),
            ),
            (
                Messages,
                br#"{"type":"message","usage":{}}"#.to_vec(),
                Ok(usage(0, 0, 0, 0)),
            ),
            // Keys are compared unescaped (left to serde_json).
            (Messages, br#"{"typ\u0065":"message"}"#.to_vec(), Ok(None)),
            (Messages, br#"{"type":"mess\u0061ge"}"#.to_vec(), Ok(None)),
            // A known member twice is a data error, found at the second key.
            (
                Messages,
                br#"{"type":"message","type":"message"}"#.to_vec(),
                Err(NotAnAnswer),
            ),
            (
                Messages,
                br#"{"type":null,"type":"#.to_vec(),
                Err(NotAnAnswer),
            ),
            (
                Messages,
                br#"{"type":"message","x":1,"x":2}"#.to_vec(),
                Ok(None),
            ),
            // u64 members: plain non-negative integers only.
            (
                CountTokens,
                br#"{"input_tokens":18446744073709551615}"#.to_vec(),
                Ok(usage(u64::MAX, 0, 0, 0)),
            ),
            (
                CountTokens,
                br#"{"input_tokens":18446744073709551616}"#.to_vec(),
                Err(NotAnAnswer),
            ),
            (
                CountTokens,
                br#"{"input_tokens":1e2}"#.to_vec(),
                Err(NotAnAnswer),
            ),
            (
                CountTokens,
                br#"{"input_tokens":1.0}"#.to_vec(),
                Err(NotAnAnswer),
            ),
            (
                CountTokens,
                br#"{"input_tokens":-0}"#.to_vec(),
                Err(NotAnAnswer),
            ),
            (
                CountTokens,
                br#"{"input_tokens":-1}"#.to_vec(),
                Err(NotAnAnswer),
            ),
            (
                CountTokens,
                br#"{"input_tokens":"1"}"#.to_vec(),
                Err(NotAnAnswer),
            ),
            // A float that overflows is a syntax error in serde_json; a leading zero too.
            (
                CountTokens,
                br#"{"input_tokens":1e400}"#.to_vec(),
                Err(NotJson),
            ),
            (
                CountTokens,
                br#"{"input_tokens":01}"#.to_vec(),
                Err(NotJson),
            ),
            // A data error met before a syntax error wins, and the other way round.
            (Messages, br#"{"type":5,"#.to_vec(), Err(NotAnAnswer)),
            (Messages, br#"{"input_tokens":["#.to_vec(), Err(NotAnAnswer)),
            (Messages, br#"{"input_tokens":tru"#.to_vec(), Err(NotJson)),
            (Messages, br#"{"x":[,"type":5}"#.to_vec(), Err(NotJson)),
            (Messages, br#"{"type":"message"} x"#.to_vec(), Err(NotJson)),
            (Messages, br#"{"type":"message"}{}"#.to_vec(), Err(NotJson)),
            (Messages, br#"{"type":"message",}"#.to_vec(), Err(NotJson)),
            (
                Messages,
                b"{\"type\":\"message\"}\x0c".to_vec(),
                Err(NotJson),
            ),
            (
                Messages,
                b"\x0c{\"type\":\"message\"}".to_vec(),
                Err(NotJson),
            ),
            // Skipped strings: escapes checked, UTF-8 and surrogates not.
            (
                Messages,
                b"{\"type\":\"message\",\"x\":\"\xff\\ud800\"}".to_vec(),
                Ok(None),
            ),
            (
                Messages,
                b"{\"type\":\"message\",\"x\":\"\\x\"}".to_vec(),
                Err(NotJson),
            ),
            (
                Messages,
                b"{\"type\":\"message\",\"x\":\"\x1f\"}".to_vec(),
                Err(NotJson),
            ),
            (Messages, b"{\"type\":\"\xff\"}".to_vec(), Err(NotJson)),
            // Skipped numbers are checked against the grammar only.
            (
                Messages,
                br#"{"type":"message","x":[1e400,-0.0e-0]}"#.to_vec(),
                Ok(None),
            ),
            (
                Messages,
                br#"{"type":"message","x":-01}"#.to_vec(),
                Err(NotJson),
            ),
            (
                Messages,
                br#"{"type":"message","x":1.}"#.to_vec(),
                Err(NotJson),
            ),
            (Messages, b"{\"type\":\"\\ud800\"}".to_vec(), Err(NotJson)),
            (
                Messages,
                b"{\"\xff\":1,\"type\":\"message\"}".to_vec(),
                Err(NotJson),
            ),
            // Skipped values have no nesting limit.
            (Messages, deep(200), Ok(None)),
            (Messages, deep(MAX_SKIPPED_DEPTH + 10), Ok(None)),
        ];
        for (endpoint, body, expected) in cases {
            let text = String::from_utf8_lossy(&body);
            assert_eq!(check_answer_body(endpoint, &body), expected, "{text}");
            assert_eq!(check_answer_body_serde(endpoint, &body), expected, "{text}");
        }
    }

    /// Every byte at each position where the grammar or serde_json's rules change:
    /// escapes, string contents, keys, the first byte of each known member's value, after
    /// a value, inside numbers, before and after the body.
    #[test]
    fn every_byte_at_every_decision_point_agrees() {
        const TEMPLATES: &[&str] = &[
            r#"{"type":"message","x":"a\?b"}"#,
            r#"{"type":"message","x":"a?b"}"#,
            r#"{"type":"message","x":"\u00?0"}"#,
            r#"{"type":"message","x":{"a?":1}}"#,
            r#"{"?":1,"type":"message"}"#,
            r#"{"type":"mess?ge"}"#,
            r#"{"type"?"message"}"#,
            r#"{"type":"message"?}"#,
            r#"{"type":"message",?}"#,
            r#"{?}"#,
            r#"?{"type":"message"}"#,
            r#"{"type":"message"}?"#,
            r#"{"type":?}"#,
            r#"{"type":?"message"}"#,
            r#"{"usage":?}"#,
            r#"{"usage":?1}"#,
            r#"{"usage":{"input_tokens":1?}}"#,
            r#"{"usage":{"?nput_tokens":1}}"#,
            r#"{"input_tokens":?}"#,
            r#"{"input_tokens":?1}"#,
            r#"{"input_tokens":1?}"#,
            r#"{"input_tokens":0?}"#,
            r#"{"choices":?}"#,
            r#"{"choices":[?]}"#,
            r#"{"x":?}"#,
            r#"{"x":-?}"#,
            r#"{"x":0?}"#,
            r#"{"x":1.?}"#,
            r#"{"x":1e?}"#,
            r#"{"x":1e+?}"#,
            r#"{"x":[1?]}"#,
            r#"{"x":[?]}"#,
            r#"{"x":{"a":1?}}"#,
            r#"{"x":{?}}"#,
            r#"{"x":n?ll}"#,
        ];
        for template in TEMPLATES {
            let (before, after) = template.split_once('?').expect("a placeholder");
            for byte in 0..=u8::MAX {
                let body: Vec<u8> = [before.as_bytes(), &[byte], after.as_bytes()].concat();
                if let Err(e) = agree(&body) {
                    panic!("{e}");
                }
            }
        }
    }

    #[test]
    fn common_answers_take_the_fast_path() {
        for body in BASES {
            assert!(
                scan_answer(body).is_ok(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let big = big_message(20_000);
        assert!(big.len() > 20_000);
        assert_eq!(
            scan_answer(&big).map(|m| (m.is_message, m.usage.is_some())),
            Ok((true, true))
        );
        assert_eq!(scan_answer(br#"{"type":true}"#), Err(Stop::Data));
        assert_eq!(scan_answer(br#"{"type":"message""#), Err(Stop::Syntax));
    }

    include!("../benches/support/big_message.rs");

    // ---- byte-level generators -------------------------------------------------------

    /// Bytes JSON is made of, plus a few that break it.
    const ALPHABET: &[u8] =
        b"{}[]\":,.-+0123456789eE \n\t\rtrueflsnabcdpgimo_\\/u\x00\x1f\x7f\xc3\xa9\xff\xed";

    pub(crate) fn jsonish_byte() -> impl Strategy<Value = u8> {
        prop_oneof![9 => prop::sample::select(ALPHABET), 1 => any::<u8>()]
    }

    /// Pieces of JSON text, so that random sequences often reach deep states.
    pub(crate) const TOKENS: &[&str] = &[
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        " ",
        "\"type\"",
        "\"usage\"",
        "\"input_tokens\"",
        "\"output_tokens\"",
        "\"choices\"",
        "\"message\"",
        "\"x\"",
        "\"",
        "\\",
        "\\u0065",
        "null",
        "true",
        "false",
        "0",
        "1",
        "-1",
        "1.5",
        "1e5",
        "01",
        "18446744073709551616",
        "\"\\ud800\"",
        "\"é\"",
    ];

    #[derive(Debug, Clone)]
    pub(crate) enum Mutation {
        Insert(prop::sample::Index, u8),
        Delete(prop::sample::Index),
        Replace(prop::sample::Index, u8),
        Truncate(prop::sample::Index),
        /// Copies a range of the body to another place (duplicate members, nesting).
        Splice(
            prop::sample::Index,
            prop::sample::Index,
            prop::sample::Index,
        ),
        /// Inserts a piece of JSON text.
        InsertToken(prop::sample::Index, &'static str),
        /// Replaces one of the body's brackets with one of any kind.
        Bracket(prop::sample::Index, u8),
    }

    pub(crate) fn mutation() -> impl Strategy<Value = Mutation> {
        let index = any::<prop::sample::Index>;
        prop_oneof![
            (index(), jsonish_byte()).prop_map(|(i, b)| Mutation::Insert(i, b)),
            index().prop_map(Mutation::Delete),
            (index(), jsonish_byte()).prop_map(|(i, b)| Mutation::Replace(i, b)),
            index().prop_map(Mutation::Truncate),
            (index(), index(), index()).prop_map(|(a, b, c)| Mutation::Splice(a, b, c)),
            (index(), prop::sample::select(TOKENS))
                .prop_map(|(i, token)| Mutation::InsertToken(i, token)),
            (index(), prop::sample::select(&b"{}[]"[..]))
                .prop_map(|(i, bracket)| Mutation::Bracket(i, bracket)),
        ]
    }

    pub(crate) fn mutate(body: &mut Vec<u8>, mutation: &Mutation) {
        let len = body.len();
        match mutation {
            Mutation::Insert(at, byte) => body.insert(at.index(len + 1), *byte),
            Mutation::Delete(at) if len > 0 => {
                body.remove(at.index(len));
            }
            Mutation::Replace(at, byte) if len > 0 => body[at.index(len)] = *byte,
            Mutation::Truncate(at) => body.truncate(at.index(len + 1)),
            Mutation::Splice(from, to, at) => {
                let (a, b) = (from.index(len + 1), to.index(len + 1));
                let piece = body[a.min(b)..a.max(b)].to_vec();
                let at = at.index(len + 1);
                body.splice(at..at, piece);
            }
            Mutation::InsertToken(at, token) => {
                let at = at.index(len + 1);
                body.splice(at..at, token.bytes());
            }
            Mutation::Bracket(which, bracket) => {
                let brackets: Vec<usize> = (0..len)
                    .filter(|&i| matches!(body[i], b'{' | b'}' | b'[' | b']'))
                    .collect();
                if !brackets.is_empty() {
                    body[brackets[which.index(brackets.len())]] = *bracket;
                }
            }
            Mutation::Delete(_) | Mutation::Replace(..) => {}
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn mutated_answers_agree(
            base in prop::sample::select(&BASES[..]),
            mutations in prop::collection::vec(mutation(), 1..5),
        ) {
            let mut body = base.to_vec();
            for mutation in &mutations {
                mutate(&mut body, mutation);
            }
            agree(&body)?;
        }

        #[test]
        fn token_soup_agrees(
            tokens in prop::collection::vec(prop::sample::select(TOKENS), 0..24),
        ) {
            let body: Vec<u8> = std::iter::once("{")
                .chain(tokens)
                .flat_map(str::bytes)
                .collect();
            agree(&body)?;
        }

        #[test]
        fn jsonish_bytes_agree(
            open in any::<bool>(),
            bytes in prop::collection::vec(jsonish_byte(), 0..48),
        ) {
            let body: Vec<u8> = open.then_some(b'{').into_iter().chain(bytes).collect();
            agree(&body)?;
        }

        #[test]
        fn structured_bodies_agree(body in structured_body()) {
            agree(&body)?;
        }
    }

    // ---- structured generator --------------------------------------------------------

    /// A JSON-ish value, written by hand so that it can hold what `serde_json::Value`
    /// cannot: duplicate keys, escapes in keys, numbers of every shape, invalid bytes.
    #[derive(Debug, Clone)]
    pub(crate) enum Json {
        /// A scalar token as written: a number, a literal or a quoted string.
        Token(Vec<u8>),
        Array(Vec<Json>),
        /// Members with their keys as written (quotes included).
        Object(Vec<(Vec<u8>, Json)>),
        /// `inner` inside `depth` arrays or single-member objects.
        Nested {
            depth: usize,
            objects: bool,
            inner: Box<Json>,
        },
    }

    impl Json {
        pub(crate) fn write(&self, ws: &[u8], out: &mut Vec<u8>) {
            match self {
                Json::Token(token) => out.extend_from_slice(token),
                Json::Array(items) => {
                    out.push(b'[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        out.extend_from_slice(ws);
                        item.write(ws, out);
                    }
                    out.extend_from_slice(ws);
                    out.push(b']');
                }
                Json::Object(members) => {
                    out.push(b'{');
                    for (i, (key, value)) in members.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        out.extend_from_slice(ws);
                        out.extend_from_slice(key);
                        out.extend_from_slice(ws);
                        out.push(b':');
                        out.extend_from_slice(ws);
                        value.write(ws, out);
                    }
                    out.extend_from_slice(ws);
                    out.push(b'}');
                }
                Json::Nested {
                    depth,
                    objects,
                    inner,
                } => {
                    let (open, close): (&[u8], &[u8]) = if *objects {
                        (b"{\"k\":", b"}")
                    } else {
                        (b"[", b"]")
                    };
                    for _ in 0..*depth {
                        out.extend_from_slice(open);
                    }
                    inner.write(ws, out);
                    for _ in 0..*depth {
                        out.extend_from_slice(close);
                    }
                }
            }
        }
    }

    /// Numbers of every shape: plain, at the edges of `u64`, negative, fractional,
    /// with exponents, overflowing `f64`, malformed.
    pub(crate) fn number() -> impl Strategy<Value = Vec<u8>> {
        const EDGES: &[&str] = &[
            "0",
            "-0",
            "00",
            "01",
            "-01",
            "1.0",
            "1e2",
            "1E+2",
            "1e-2",
            "0.5",
            "-1.5e3",
            "1e400",
            "-1e400",
            "1e",
            "1.",
            "-",
            "1.e1",
            "0e999999999999",
            "1e999999999999",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999999",
            "-9223372036854775808",
            "-9223372036854775809",
        ];
        prop_oneof![
            4 => (0u64..100_000).prop_map(|n| n.to_string()),
            2 => any::<u64>().prop_map(|n| n.to_string()),
            2 => prop::sample::select(EDGES).prop_map(str::to_owned),
            2 => "-?(0|[1-9][0-9]{0,21})(\\.[0-9]{0,3})?([eE][+-]?[0-9]{0,3})?",
            1 => "[1-9][0-9]{300,320}",
        ]
        .prop_map(String::into_bytes)
    }

    /// A quoted string made of plain text, escapes (valid or not), raw control
    /// characters and invalid UTF-8.
    pub(crate) fn string_token() -> impl Strategy<Value = Vec<u8>> {
        const ESCAPES: &[&str] = &[
            "\\n",
            "\\\"",
            "\\\\",
            "\\/",
            "\\u0065",
            "\\u00e9",
            "\\ud83d\\ude00",
            "\\ud800",
            "\\udc00",
            "\\ud800\\n",
            "\\ud800\\u0041",
            "\\ud800\\ud800",
            "\\x",
            "\\u12",
            "\\U0041",
            "\\",
        ];
        const ODD_BYTES: &[&[u8]] = &[
            b"\x01",
            b"\x1f",
            b"\t",
            b"\x7f",
            b"\xff",
            b"\xc3",
            b"\xed\xa0\x80",
            b"\xc3\xa9",
        ];
        let piece = prop_oneof![
            4 => "[a-zA-Z _]{0,10}".prop_map(String::into_bytes),
            2 => "\\PC{0,4}".prop_map(|s| {
                // Unicode text, with `"` and `\` escaped as a writer would.
                let quoted = serde_json::to_string(&s).unwrap_or_default();
                quoted.as_bytes()[1..quoted.len() - 1].to_vec()
            }),
            2 => prop::sample::select(ESCAPES).prop_map(|s| s.as_bytes().to_vec()),
            // A backslash before any printable character: mostly invalid escapes.
            1 => "\\\\[ -~]".prop_map(String::into_bytes),
            1 => prop::sample::select(ODD_BYTES).prop_map(<[u8]>::to_vec),
        ];
        prop_oneof![
            3 => Just(b"\"message\"".to_vec()),
            6 => prop::collection::vec(piece, 0..4).prop_map(|pieces| {
                let mut token = vec![b'"'];
                token.extend(pieces.concat());
                token.push(b'"');
                token
            }),
        ]
    }

    pub(crate) fn literal() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            9 => prop::sample::select(&["null", "true", "false"][..]),
            1 => prop::sample::select(&["nul", "tru", "nulll", "fals"][..]),
        ]
        .prop_map(|s| s.as_bytes().to_vec())
    }

    /// Keys: mostly the ones the check reads (so that duplicates are common), some
    /// escaped, some anything.
    pub(crate) fn key() -> impl Strategy<Value = Vec<u8>> {
        const KNOWN: &[&str] = &[
            "\"type\"",
            "\"usage\"",
            "\"input_tokens\"",
            "\"choices\"",
            "\"output_tokens\"",
            "\"cache_creation_input_tokens\"",
            "\"cache_read_input_tokens\"",
            "\"id\"",
        ];
        const ESCAPED: &[&str] = &[
            "\"typ\\u0065\"",
            "\"\\u0075sage\"",
            "\"input\\u005ftokens\"",
            "\"choices\\n\"",
            "\"\\ud800\"",
        ];
        prop_oneof![
            8 => prop::sample::select(KNOWN).prop_map(|s| s.as_bytes().to_vec()),
            1 => prop::sample::select(ESCAPED).prop_map(|s| s.as_bytes().to_vec()),
            2 => string_token(),
        ]
    }

    fn leaf() -> impl Strategy<Value = Json> {
        prop_oneof![
            4 => number(),
            4 => string_token(),
            2 => literal(),
        ]
        .prop_map(Json::Token)
    }

    pub(crate) fn value() -> impl Strategy<Value = Json> {
        leaf().prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                3 => prop::collection::vec(inner.clone(), 0..5).prop_map(Json::Array),
                4 => prop::collection::vec((key(), inner.clone()), 0..6).prop_map(Json::Object),
                1 => (
                    prop_oneof![1usize..5, 120usize..136, 505usize..520, 1000usize..1030],
                    any::<bool>(),
                    inner,
                )
                    .prop_map(|(depth, objects, inner)| Json::Nested {
                        depth,
                        objects,
                        inner: Box::new(inner),
                    }),
            ]
        })
    }

    /// A whole body: a top-level object (or, rarely, another value), with whitespace of
    /// some style, sometimes followed by something.
    pub(crate) fn structured_body() -> impl Strategy<Value = Vec<u8>> {
        let top = prop_oneof![
            12 => prop::collection::vec((key(), value()), 0..7).prop_map(Json::Object),
            1 => value(),
        ];
        let ws = prop_oneof![
            12 => prop::sample::select(&["", " ", "\n  ", "\t\r\n"][..]),
            // Not JSON whitespace.
            1 => Just("\x0c"),
        ];
        let suffix = prop_oneof![
            12 => prop::sample::select(&["", "\n"][..]),
            1 => prop::sample::select(&[" x", ",", "}", "{}"][..]),
        ];
        (ws, top, suffix).prop_map(|(ws, top, suffix)| {
            let mut body = ws.as_bytes().to_vec();
            top.write(ws.as_bytes(), &mut body);
            body.extend_from_slice(suffix.as_bytes());
            body
        })
    }

    #[test]
    fn the_structured_bodies_reach_every_verdict_mostly_without_serde() {
        let mut runner = TestRunner::deterministic();
        let strategy = structured_body();
        let (mut ok, mut syntax, mut data, mut unsure) = (0, 0, 0, 0);
        for _ in 0..1000 {
            let body = strategy.new_tree(&mut runner).expect("a body").current();
            match scan_answer(&body) {
                Ok(_) => ok += 1,
                Err(Stop::Syntax) => syntax += 1,
                Err(Stop::Data) => data += 1,
                Err(Stop::Unsure) => unsure += 1,
            }
        }
        eprintln!("ok {ok}, syntax {syntax}, data {data}, unsure {unsure}");
        assert!(ok >= 100 && syntax >= 100 && data >= 100 && unsure <= 400);
    }
}
