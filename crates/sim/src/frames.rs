//! The frames of one simulated stream, whatever its wire format: a few frames before
//! the content, the content deltas (paced), a few frames after, and the format's
//! in-band error frame. `wire` renders them for the Messages API, `openai` for Chat
//! Completions.

use bytes::Bytes;

/// The content frames of a stream.
#[derive(Debug, Clone)]
pub(crate) enum Deltas {
    /// One frame sent `times` times (a text answer: reference-count clones, no copies).
    Repeat {
        /// The frame.
        frame: Bytes,
        /// How often.
        times: usize,
    },
    /// Distinct frames (the fragments of a tool call's arguments).
    Each(Vec<Bytes>),
}

impl Deltas {
    fn len(&self) -> usize {
        match self {
            Deltas::Repeat { times, .. } => *times,
            Deltas::Each(frames) => frames.len(),
        }
    }

    fn get(&self, i: usize) -> Bytes {
        match self {
            Deltas::Repeat { frame, .. } => frame.clone(),
            Deltas::Each(frames) => frames.get(i).cloned().unwrap_or_default(),
        }
    }
}

/// Every frame of one complete stream, rendered once per response.
#[derive(Debug, Clone)]
pub(crate) struct StreamFrames {
    head: Vec<Bytes>,
    deltas: Deltas,
    tail: Vec<Bytes>,
    error_frame: Bytes,
    /// The first delta is paced too ([`crate::OkSpec::pace_first_delta`]).
    pace_first: bool,
}

impl StreamFrames {
    /// A stream of `head`, then `deltas`, then `tail`; `error_frame` is what an in-band
    /// error sends.
    pub(crate) fn from_parts(
        head: Vec<Bytes>,
        deltas: Deltas,
        tail: Vec<Bytes>,
        error_frame: Bytes,
    ) -> Self {
        Self {
            head,
            deltas,
            tail,
            error_frame,
            pace_first: false,
        }
    }

    /// Paces the first delta as well (`pace_first`).
    pub(crate) fn pacing_first(mut self, pace_first: bool) -> Self {
        self.pace_first = pace_first;
        self
    }

    /// Number of frames of the complete stream.
    pub(crate) fn len(&self) -> usize {
        self.head.len() + self.deltas.len() + self.tail.len()
    }

    /// Whether frame `i` is a delta other than the first (paced frames).
    pub(crate) fn is_paced(&self, i: usize) -> bool {
        let first = self.head.len();
        // a slow start waits after the stream's first frame (`message_start`)
        (self.pace_first && i == 1 && first > 1) || (i > first && i < first + self.deltas.len())
    }

    /// The in-band error frame of this stream's wire format.
    pub(crate) fn error_frame(&self) -> Bytes {
        self.error_frame.clone()
    }

    /// Frames `range` of the complete stream followed by `extra`, as one chunk (no copy
    /// when it is a single frame).
    pub(crate) fn join(&self, range: std::ops::Range<usize>, extra: Option<Bytes>) -> Bytes {
        if range.len() == 1 && extra.is_none() {
            return self.get(range.start);
        }
        let parts = || range.clone().map(|i| self.get(i)).chain(extra.clone());
        let mut out = Vec::with_capacity(parts().map(|b| b.len()).sum());
        for part in parts() {
            out.extend_from_slice(&part);
        }
        Bytes::from(out)
    }

    /// Frame `i` of the complete stream (empty past the end).
    pub(crate) fn get(&self, i: usize) -> Bytes {
        let (h, d) = (self.head.len(), self.deltas.len());
        if i < h {
            self.head[i].clone()
        } else if i < h + d {
            self.deltas.get(i - h)
        } else {
            self.tail.get(i - h - d).cloned().unwrap_or_default()
        }
    }
}
