//! When a streaming answer may be committed to the client (SPEC 3.8).
//!
//! The proxy holds the response head until the upstream's stream has proved itself,
//! then writes it (the point of no return). [`CommitGate`] is the pure state machine
//! that decides, frame by frame: hold, commit, or fail over. The proxy drives it with
//! every decoded frame, the end of the body, and the `first_frame_timeout`.

use keypool_core::StreamCommit;
use keypool_sse::Frame;
use serde::Deserialize;

use crate::response::{UpstreamError, stream_error};

/// Most frames held before the commit point in `first_content` mode.
pub const DEFAULT_MAX_HELD_FRAMES: usize = 64;
/// Most bytes held before the commit point in `first_content` mode: 256 KiB.
pub const DEFAULT_MAX_HELD_BYTES: usize = 256 * 1024;

/// Whether `frame` is a valid first frame of an Anthropic stream: `event: message_start`
/// whose data is a JSON object with `"type": "message_start"`.
pub fn is_valid_first_frame(frame: &Frame) -> bool {
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    if !frame.is_event("message_start") {
        return false;
    }
    let Some(data) = frame.data() else {
        return false;
    };
    // A struct target accepts JSON arrays too; require an object.
    if data.trim_ascii_start().first() != Some(&b'{') {
        return false;
    }
    serde_json::from_slice::<Typed<'_>>(&data)
        .is_ok_and(|typed| typed.kind.as_deref() == Some("message_start"))
}

/// Why a stream failed before its commit point: the attempt failed, fail over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartFailure {
    /// The first frame (comments aside) was not a valid `message_start`.
    InvalidFirstFrame {
        /// The event name of that frame, if it had one (for logs and metrics).
        event: Option<String>,
    },
    /// An `event: error` frame came before the commit point.
    ErrorFrame(UpstreamError),
    /// The body ended before the commit point.
    EndedBeforeCommit,
    /// `first_frame_timeout` passed without a valid first frame.
    Timeout,
}

/// What the proxy does after feeding the gate one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Keep the frame (and the head) in memory; wait for more.
    Hold,
    /// Write the head and every held frame, then forward the rest as it comes.
    Commit,
    /// The attempt failed: drop the held frames, fail over to the next account.
    Fail(StartFailure),
}

/// The commit-point state machine of one streaming attempt.
///
/// Rules, in `first_content` mode (the default):
/// 1. comment-only frames (keep-alives) are held and change nothing;
/// 2. the first other frame must be a valid `message_start`
///    ([`is_valid_first_frame`]), else `Fail(InvalidFirstFrame)` (an `event: error` first
///    frame is `Fail(ErrorFrame)`);
/// 3. after it, `ping` frames are held; an `error` frame is `Fail(ErrorFrame)`; any other
///    frame (`content_block_start`, `content_block_delta`, or a stream that goes straight
///    to `message_delta`/`message_stop`) is the commit point;
/// 4. holding stops at [`DEFAULT_MAX_HELD_FRAMES`] frames or [`DEFAULT_MAX_HELD_BYTES`]
///    bytes: past a valid `message_start` that commits, before one it fails;
/// 5. the end of the body before the commit point is `Fail(EndedBeforeCommit)`;
///    `first_frame_timeout` commits when a valid `message_start` was seen, else fails.
///
/// In `first_frame` mode rule 2's valid `message_start` is itself the commit point.
/// Once the gate has said `Commit` or `Fail`, it keeps saying it.
#[derive(Debug, Clone)]
pub struct CommitGate {
    mode: StreamCommit,
    max_frames: usize,
    max_bytes: usize,
    frames: usize,
    bytes: usize,
    started: bool,
    done: Option<Verdict>,
    wire: crate::StreamWire,
}

impl CommitGate {
    /// A gate with the default bounds (64 frames, 256 KiB).
    pub fn new(mode: StreamCommit) -> Self {
        Self::with_limits(mode, DEFAULT_MAX_HELD_FRAMES, DEFAULT_MAX_HELD_BYTES)
    }

    /// A gate with explicit bounds on what is held before the commit point.
    pub fn with_limits(mode: StreamCommit, max_frames: usize, max_bytes: usize) -> Self {
        Self {
            mode,
            max_frames,
            max_bytes,
            frames: 0,
            bytes: 0,
            started: false,
            done: None,
            wire: crate::StreamWire::Messages,
        }
    }

    /// The same gate for a stream in `wire` format. For an OpenAI stream the valid
    /// first frame is any `chat.completion.chunk`, and chunks without content or usage
    /// (the role chunk) are held as `ping` is; an error chunk fails the attempt.
    pub fn with_wire(mut self, wire: crate::StreamWire) -> Self {
        self.wire = wire;
        self
    }

    /// Whether a valid `message_start` has been seen.
    pub fn started(&self) -> bool {
        self.started
    }

    /// How many frames (and bytes) are held so far.
    pub fn held(&self) -> (usize, usize) {
        (self.frames, self.bytes)
    }

    /// Feeds one decoded frame.
    pub fn observe(&mut self, frame: &Frame) -> Verdict {
        if let Some(done) = &self.done {
            return done.clone();
        }
        self.frames += 1;
        self.bytes += frame.len();
        let verdict = self.decide(frame);
        let verdict = match verdict {
            Verdict::Hold if self.frames >= self.max_frames || self.bytes >= self.max_bytes => {
                if self.started {
                    Verdict::Commit
                } else {
                    Verdict::Fail(StartFailure::InvalidFirstFrame { event: None })
                }
            }
            other => other,
        };
        self.finish(verdict)
    }

    /// The body ended (cleanly or not).
    pub fn end_of_stream(&mut self) -> Verdict {
        let verdict = self
            .done
            .clone()
            .unwrap_or(Verdict::Fail(StartFailure::EndedBeforeCommit));
        self.finish(verdict)
    }

    /// `first_frame_timeout` passed.
    pub fn timeout(&mut self) -> Verdict {
        let verdict = self.done.clone().unwrap_or(if self.started {
            Verdict::Commit
        } else {
            Verdict::Fail(StartFailure::Timeout)
        });
        self.finish(verdict)
    }

    fn finish(&mut self, verdict: Verdict) -> Verdict {
        if verdict != Verdict::Hold {
            self.done = Some(verdict.clone());
        }
        verdict
    }

    fn decide(&mut self, frame: &Frame) -> Verdict {
        if frame.is_comment_only() {
            return Verdict::Hold;
        }
        if self.wire == crate::StreamWire::OpenAiChat {
            return self.decide_chat(frame);
        }
        if let Some(error) = stream_error(frame) {
            return Verdict::Fail(StartFailure::ErrorFrame(error));
        }
        if !self.started {
            if !is_valid_first_frame(frame) {
                return Verdict::Fail(StartFailure::InvalidFirstFrame {
                    event: frame
                        .event()
                        .map(|e| crate::response::truncate_at_char(e.into_owned(), 64)),
                });
            }
            self.started = true;
            return match self.mode {
                StreamCommit::FirstFrame => Verdict::Commit,
                StreamCommit::FirstContent => Verdict::Hold,
            };
        }
        if frame.is_event("ping") {
            Verdict::Hold
        } else {
            Verdict::Commit
        }
    }

    /// [`CommitGate::decide`] for an OpenAI chunk stream.
    fn decide_chat(&mut self, frame: &Frame) -> Verdict {
        use crate::openai::{ChatFrame, classify_chat_frame};
        let chunk = classify_chat_frame(frame);
        if let ChatFrame::Error(error) = chunk {
            return Verdict::Fail(StartFailure::ErrorFrame(error));
        }
        let ChatFrame::Chunk { content, usage } = chunk else {
            // `[DONE]` with nothing before it, or a frame that is no chunk.
            return if self.started && chunk == ChatFrame::Done {
                Verdict::Commit
            } else if self.started {
                Verdict::Hold
            } else {
                Verdict::Fail(StartFailure::InvalidFirstFrame { event: None })
            };
        };
        let first = !self.started;
        self.started = true;
        match (self.mode, content || usage.is_some()) {
            (StreamCommit::FirstFrame, _) if first => Verdict::Commit,
            (_, true) => Verdict::Commit,
            (_, false) => Verdict::Hold,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keypool_sse::{Event, decode_all};
    use proptest::prelude::*;

    const START: &str =
        r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":1}}}"#;
    const OVERLOADED: &str =
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;

    fn frame(event: &str, data: &str) -> Frame {
        decode_all(&Event::named(event, data).encode().unwrap())
            .unwrap()
            .remove(0)
    }

    fn keepalive() -> Frame {
        decode_all(b": keep-alive\n\n").unwrap().remove(0)
    }

    fn overloaded() -> StartFailure {
        StartFailure::ErrorFrame(UpstreamError {
            error_type: Some("overloaded_error".into()),
            message: Some("Overloaded".into()),
        })
    }

    #[test]
    fn valid_first_frames() {
        assert!(is_valid_first_frame(&frame("message_start", START)));
        assert!(!is_valid_first_frame(&frame(
            "message_start",
            r#"{"type":"message_stop"}"#
        )));
        assert!(!is_valid_first_frame(&frame(
            "message_start",
            r#"["message_start"]"#
        )));
        assert!(!is_valid_first_frame(&frame("message_start", "not json")));
        assert!(!is_valid_first_frame(&frame("ping", START)));
        assert!(!is_valid_first_frame(
            &decode_all(b"event: message_start\n\n").unwrap()[0]
        ));
    }

    #[test]
    fn first_content_holds_past_start_and_ping_and_fails_on_error() {
        let mut gate = CommitGate::new(StreamCommit::FirstContent);
        assert_eq!(gate.observe(&keepalive()), Verdict::Hold);
        assert_eq!(gate.observe(&frame("message_start", START)), Verdict::Hold);
        assert_eq!(
            gate.observe(&frame("ping", r#"{"type": "ping"}"#)),
            Verdict::Hold
        );
        assert_eq!(
            gate.observe(&frame("error", OVERLOADED)),
            Verdict::Fail(overloaded())
        );
        // Terminal: later frames do not revive it.
        assert_eq!(
            gate.observe(&frame("content_block_delta", "{}")),
            Verdict::Fail(overloaded())
        );
        assert_eq!(gate.end_of_stream(), Verdict::Fail(overloaded()));

        let mut gate = CommitGate::new(StreamCommit::FirstContent);
        gate.observe(&frame("message_start", START));
        assert_eq!(
            gate.observe(&frame("content_block_start", "{}")),
            Verdict::Commit
        );
        assert_eq!(gate.observe(&frame("error", OVERLOADED)), Verdict::Commit);
        assert_eq!(gate.held(), (2, gate.held().1));
    }

    #[test]
    fn first_frame_mode_commits_at_message_start() {
        let mut gate = CommitGate::new(StreamCommit::FirstFrame);
        assert_eq!(
            gate.observe(&frame("message_start", START)),
            Verdict::Commit
        );
        let mut gate = CommitGate::new(StreamCommit::FirstFrame);
        assert_eq!(
            gate.observe(&frame("error", OVERLOADED)),
            Verdict::Fail(overloaded())
        );
        let mut gate = CommitGate::new(StreamCommit::FirstFrame);
        assert_eq!(
            gate.observe(&frame("ping", "{}")),
            Verdict::Fail(StartFailure::InvalidFirstFrame {
                event: Some("ping".into())
            })
        );
    }

    #[test]
    fn bounds_end_of_stream_and_timeout() {
        let mut gate = CommitGate::new(StreamCommit::FirstContent);
        gate.observe(&frame("message_start", START));
        for _ in 1..63 {
            assert_eq!(gate.observe(&frame("ping", "{}")), Verdict::Hold);
        }
        assert_eq!(
            gate.observe(&frame("ping", "{}")),
            Verdict::Commit,
            "64th frame"
        );

        let mut gate = CommitGate::with_limits(StreamCommit::FirstContent, 64, 100);
        assert_eq!(
            gate.observe(&frame("message_start", START)),
            Verdict::Commit,
            "over 100 bytes"
        );

        let mut gate = CommitGate::new(StreamCommit::FirstContent);
        assert_eq!(gate.timeout(), Verdict::Fail(StartFailure::Timeout));
        let mut gate = CommitGate::new(StreamCommit::FirstContent);
        gate.observe(&frame("message_start", START));
        assert_eq!(gate.timeout(), Verdict::Commit);
        let mut gate = CommitGate::new(StreamCommit::FirstContent);
        gate.observe(&frame("message_start", START));
        assert_eq!(
            gate.end_of_stream(),
            Verdict::Fail(StartFailure::EndedBeforeCommit)
        );
        // Keep-alives alone never start a stream.
        let mut gate = CommitGate::with_limits(StreamCommit::FirstFrame, 3, usize::MAX);
        assert_eq!(gate.observe(&keepalive()), Verdict::Hold);
        assert_eq!(gate.observe(&keepalive()), Verdict::Hold);
        assert_eq!(
            gate.observe(&keepalive()),
            Verdict::Fail(StartFailure::InvalidFirstFrame { event: None })
        );
    }

    #[test]
    fn stream_commit_names() {
        assert_eq!(StreamCommit::default(), StreamCommit::FirstContent);
        for mode in [StreamCommit::FirstFrame, StreamCommit::FirstContent] {
            assert_eq!(mode.as_str().parse::<StreamCommit>().unwrap(), mode);
            assert_eq!(serde_json::to_string(&mode).unwrap(), format!("\"{mode}\""));
        }
        assert!(
            "first_byte"
                .parse::<StreamCommit>()
                .unwrap_err()
                .to_string()
                .contains("first_content")
        );
    }

    #[derive(Debug, Clone, Copy)]
    enum Kind {
        Start,
        BadStart,
        Ping,
        Keepalive,
        Content,
        Error,
        Other,
    }

    fn make(kind: Kind) -> Frame {
        match kind {
            Kind::Start => frame("message_start", START),
            Kind::BadStart => frame("message_start", "{}"),
            Kind::Ping => frame("ping", r#"{"type": "ping"}"#),
            Kind::Keepalive => keepalive(),
            Kind::Content => frame("content_block_delta", r#"{"type":"content_block_delta"}"#),
            Kind::Error => frame("error", OVERLOADED),
            Kind::Other => frame("message_stop", "{}"),
        }
    }

    fn kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            Just(Kind::Start),
            Just(Kind::BadStart),
            Just(Kind::Ping),
            Just(Kind::Keepalive),
            Just(Kind::Content),
            Just(Kind::Error),
            Just(Kind::Other),
        ]
    }

    fn chat(data: &str) -> Frame {
        decode_all(format!("data: {data}\n\n").as_bytes())
            .unwrap()
            .remove(0)
    }

    /// An OpenAI chunk stream: the role chunk is held, the first content commits; an
    /// error chunk fails; a stream that is not chunks fails at its first frame.
    #[test]
    fn chat_streams_commit_at_their_first_content() {
        let wire = crate::StreamWire::OpenAiChat;
        let role = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        let text = r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#;
        let mut gate = CommitGate::new(StreamCommit::FirstContent).with_wire(wire);
        assert_eq!(gate.observe(&keepalive()), Verdict::Hold);
        assert_eq!(gate.observe(&chat(role)), Verdict::Hold);
        assert!(gate.started());
        assert_eq!(gate.observe(&chat(text)), Verdict::Commit);

        let mut gate = CommitGate::new(StreamCommit::FirstContent).with_wire(wire);
        assert_eq!(gate.observe(&chat(role)), Verdict::Hold);
        let error = r#"{"error":{"type":"server_error","message":"boom"}}"#;
        assert!(matches!(
            gate.observe(&chat(error)),
            Verdict::Fail(StartFailure::ErrorFrame(_))
        ));

        let mut gate = CommitGate::new(StreamCommit::FirstContent).with_wire(wire);
        assert!(matches!(
            gate.observe(&chat("not json")),
            Verdict::Fail(StartFailure::InvalidFirstFrame { .. })
        ));
        let mut gate = CommitGate::new(StreamCommit::FirstContent).with_wire(wire);
        assert!(matches!(
            gate.observe(&chat("[DONE]")),
            Verdict::Fail(StartFailure::InvalidFirstFrame { .. })
        ));
        // `first_frame`: the first chunk commits; `[DONE]` after a start commits too.
        let mut gate = CommitGate::new(StreamCommit::FirstFrame).with_wire(wire);
        assert_eq!(gate.observe(&chat(role)), Verdict::Commit);
        let mut gate = CommitGate::new(StreamCommit::FirstContent).with_wire(wire);
        assert_eq!(gate.observe(&chat(role)), Verdict::Hold);
        assert_eq!(gate.observe(&chat("[DONE]")), Verdict::Commit);
    }

    proptest! {
        #[test]
        fn the_gate_follows_the_commit_rule(
            kinds in prop::collection::vec(kind(), 0..80),
            first_frame in any::<bool>(),
            max_frames in 1..70usize,
        ) {
            let mode = if first_frame { StreamCommit::FirstFrame } else { StreamCommit::FirstContent };
            let mut gate = CommitGate::with_limits(mode, max_frames, usize::MAX);
            let mut verdicts = Vec::new();
            for k in &kinds {
                verdicts.push(gate.observe(&make(*k)));
            }
            let end = gate.end_of_stream();
            let decided = verdicts.iter().position(|v| *v != Verdict::Hold);
            // Holding never goes past the frame bound.
            match decided {
                Some(i) => prop_assert!(i < max_frames),
                None => prop_assert!(kinds.len() < max_frames),
            }
            // Once decided, always the same verdict, including at the end of the body.
            if let Some(i) = decided {
                prop_assert!(verdicts[i..].iter().all(|v| *v == verdicts[i]));
                prop_assert_eq!(&end, &verdicts[i]);
            } else {
                prop_assert_eq!(&end, &Verdict::Fail(StartFailure::EndedBeforeCommit));
            }
            // Commit only after a valid message_start that was the first non-keep-alive
            // frame, and never on an error frame.
            let first_real = kinds.iter().position(|k| !matches!(k, Kind::Keepalive));
            if let Some(i) = decided.filter(|&i| verdicts[i] == Verdict::Commit) {
                let start = first_real.unwrap();
                prop_assert!(matches!(kinds[start], Kind::Start));
                prop_assert!(start <= i);
                prop_assert!(!matches!(kinds[i], Kind::Error));
                if mode == StreamCommit::FirstContent && i + 1 < max_frames {
                    prop_assert!(i > start);
                    prop_assert!(!matches!(kinds[i], Kind::Ping | Kind::Keepalive));
                    prop_assert!(kinds[start + 1..i].iter().all(|k| matches!(k, Kind::Ping | Kind::Keepalive)));
                }
                if mode == StreamCommit::FirstFrame {
                    prop_assert_eq!(i, start);
                }
            }
            // An error frame before the commit point is always a failover.
            if let Some(e) = kinds.iter().position(|k| matches!(k, Kind::Error))
                && decided.is_none_or(|i| i >= e)
            {
                prop_assert!(matches!(verdicts[e], Verdict::Fail(_)));
            }
        }
    }
}
