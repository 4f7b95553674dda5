//! The incremental decoder: bytes in, complete [`Frame`]s out.

use bytes::{Buf, BytesMut};
use memchr::memchr2;

use crate::frame::event_value_at;
use crate::{Frame, SseError};

/// The default bound on one frame's size: 16 MiB (SPEC 7).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// The UTF-8 byte order mark an event stream may start with.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// An incremental SSE decoder.
///
/// Feed it chunks as they arrive with [`push`](Self::push), then pull frames with
/// [`next_frame`](Self::next_frame) until it returns `Ok(None)` (the rest is an
/// incomplete frame, kept buffered until more bytes come). When the body ends, call
/// [`finish`](Self::finish) the same way: it returns the frames the end of the stream
/// completed (a last line ended by a lone `\r`) and then reports an unfinished trailing
/// frame as [`SseError::TruncatedFrame`] instead of treating it as complete.
///
/// Framing follows the WHATWG event-stream grammar:
/// - lines end with `\n`, `\r\n` or `\r`; a `\r` that is the last buffered byte is not
///   taken as a line end until the next byte shows whether a `\n` follows;
/// - a frame is every line up to and including the first blank line;
/// - a UTF-8 BOM at the very start of the stream is dropped; blank lines between frames
///   (which carry no event) are dropped too. Every other byte belongs to exactly one
///   frame, so concatenating the frames' [`raw`](Frame::raw) bytes gives the stream back.
///
/// Each frame's bytes are split off the buffer without copying. Frames are only framed
/// here; their fields are parsed when asked ([`Frame::event`], [`Frame::data`], ...).
///
/// After an error the decoder is poisoned and returns the same error from then on: the
/// stream must be abandoned.
#[derive(Debug)]
pub struct Decoder {
    buf: BytesMut,
    /// `buf[..scanned]` has been searched without finding the end of the current frame.
    scanned: usize,
    /// Whether `scanned` is at the start of a line.
    line_start: bool,
    /// Where the line being scanned starts (when `line_start` is false).
    line_begin: usize,
    /// Where the value of the current frame's last `event` field is, so far.
    event: Option<(usize, usize)>,
    /// The stream start has not yet been checked for a BOM.
    bom_pending: bool,
    /// [`finish`](Self::finish) was called: no more bytes will come.
    eof: bool,
    max_frame_bytes: usize,
    failed: Option<SseError>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A decoder with the default frame-size bound ([`DEFAULT_MAX_FRAME_BYTES`]).
    pub fn new() -> Self {
        Self::with_max_frame_bytes(DEFAULT_MAX_FRAME_BYTES)
    }

    /// A decoder whose frames may be at most `max_frame_bytes` long, terminators included.
    pub fn with_max_frame_bytes(max_frame_bytes: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            scanned: 0,
            line_start: true,
            line_begin: 0,
            event: None,
            bom_pending: true,
            eof: false,
            max_frame_bytes,
            failed: None,
        }
    }

    /// The frame-size bound this decoder enforces.
    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    /// How many bytes are buffered and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Appends one chunk of the stream. Drain [`next_frame`](Self::next_frame) after each
    /// push: the size bound is checked there. Ignored once the decoder is poisoned, so a
    /// caller that keeps pushing after an error does not grow the buffer. Do not push
    /// after [`finish`](Self::finish).
    pub fn push(&mut self, chunk: &[u8]) {
        if self.failed.is_none() {
            self.buf.extend_from_slice(chunk);
        }
    }

    /// The next complete frame, `Ok(None)` when the buffered bytes do not hold one yet.
    ///
    /// # Errors
    /// [`SseError::FrameTooLarge`] when a frame (complete or not) is longer than the
    /// bound; after [`finish`](Self::finish), [`SseError::TruncatedFrame`] when only an
    /// unfinished frame is left.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, SseError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        if self.bom_pending {
            if !self.eof && self.buf.len() < BOM.len() && BOM.starts_with(&self.buf) {
                return Ok(None);
            }
            if self.buf.starts_with(BOM) {
                self.buf.advance(BOM.len());
            }
            self.bom_pending = false;
        }
        loop {
            match self.scan() {
                Some(end) if end > self.max_frame_bytes => {
                    return Err(self.fail(SseError::FrameTooLarge {
                        limit: self.max_frame_bytes,
                    }));
                }
                Some(end) => {
                    let blank_only = self.scanned == 0;
                    let raw = self.buf.split_to(end).freeze();
                    let event = self.event.take();
                    self.scanned = 0;
                    self.line_start = true;
                    if !blank_only {
                        return Ok(Some(Frame::from_raw_unchecked(raw, event)));
                    }
                }
                None if self.buf.len() > self.max_frame_bytes => {
                    return Err(self.fail(SseError::FrameTooLarge {
                        limit: self.max_frame_bytes,
                    }));
                }
                None if self.eof && !self.buf.is_empty() => {
                    let buffered = self.buf.len();
                    return Err(self.fail(SseError::TruncatedFrame { buffered }));
                }
                None => return Ok(None),
            }
        }
    }

    /// Marks the end of the stream and returns the next frame, like
    /// [`next_frame`](Self::next_frame). Call it until it returns `Ok(None)`.
    ///
    /// # Errors
    /// [`SseError::TruncatedFrame`] when the stream ended inside a frame, and the errors
    /// of [`next_frame`](Self::next_frame).
    pub fn finish(&mut self) -> Result<Option<Frame>, SseError> {
        self.eof = true;
        self.next_frame()
    }

    fn fail(&mut self, err: SseError) -> SseError {
        self.buf = BytesMut::new();
        self.failed = Some(err.clone());
        err
    }

    /// Searches for the blank line that ends the current frame, from where the last
    /// search stopped. Returns the frame's length including that blank line; on return
    /// `self.scanned` is the position where the blank line starts (0: the frame is only
    /// a blank line) or where the search stopped.
    fn scan(&mut self) -> Option<usize> {
        let buf = &self.buf[..];
        let mut pos = self.scanned;
        let mut line_start = self.line_start;
        let end = loop {
            if line_start {
                match buf.get(pos) {
                    None => break None,
                    Some(b'\n') => break Some(pos + 1),
                    Some(b'\r') => match buf.get(pos + 1) {
                        Some(b'\n') => break Some(pos + 2),
                        Some(_) => break Some(pos + 1),
                        None if self.eof => break Some(pos + 1),
                        None => break None,
                    },
                    Some(_) => {
                        line_start = false;
                        self.line_begin = pos;
                    }
                }
            }
            let Some(offset) = memchr2(b'\n', b'\r', &buf[pos..]) else {
                pos = buf.len();
                break None;
            };
            let at = pos + offset;
            // The line `line_begin..at` is complete (a `\r` that ends the buffer comes
            // back here with the same line: noting it again changes nothing).
            if let Some(value) = event_value_at(&buf[self.line_begin..at]) {
                self.event = Some((self.line_begin + value, at));
            }
            pos = if buf[at] == b'\n' {
                at + 1
            } else {
                match buf.get(at + 1) {
                    Some(b'\n') => at + 2,
                    Some(_) => at + 1,
                    None if self.eof => at + 1,
                    // A `\r` as the last byte: wait for the next one.
                    None => {
                        pos = at;
                        break None;
                    }
                }
            };
            line_start = true;
        };
        self.scanned = pos;
        self.line_start = line_start;
        end
    }
}

/// Decodes a whole stream at once: every frame, or the first error (including a
/// truncated last frame).
///
/// # Errors
/// The errors of [`Decoder::next_frame`] and [`Decoder::finish`].
pub fn decode_all(stream: &[u8]) -> Result<Vec<Frame>, SseError> {
    let mut decoder = Decoder::new();
    decoder.push(stream);
    let mut frames = Vec::new();
    while let Some(frame) = decoder.finish()? {
        frames.push(frame);
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames_of(chunks: &[&[u8]]) -> Result<Vec<Frame>, SseError> {
        let mut decoder = Decoder::new();
        let mut frames = Vec::new();
        for chunk in chunks {
            decoder.push(chunk);
            while let Some(frame) = decoder.next_frame()? {
                frames.push(frame);
            }
        }
        while let Some(frame) = decoder.finish()? {
            frames.push(frame);
        }
        Ok(frames)
    }

    fn raws(frames: &[Frame]) -> Vec<&[u8]> {
        frames.iter().map(|f| &f.raw()[..]).collect()
    }

    #[test]
    fn lf_crlf_and_cr_line_ends_each_end_frames() {
        let frames = frames_of(&[b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\n\r\n"]).unwrap();
        assert_eq!(
            raws(&frames),
            [
                &b"data: a\n\n"[..],
                b"data: b\r\n\r\n",
                b"data: c\r\r",
                b"data: d\n\r\n"
            ]
        );
        let data: Vec<_> = frames.iter().map(|f| f.data_str().unwrap()).collect();
        assert_eq!(data, ["a", "b", "c", "d"]);
    }

    #[test]
    fn a_cr_at_the_end_of_a_chunk_waits_for_the_next_byte() {
        let mut decoder = Decoder::new();
        decoder.push(b"data: x\r\n\r");
        // `\r\n\r` might be followed by `\n`: the frame is not complete yet.
        assert_eq!(decoder.next_frame(), Ok(None));
        decoder.push(b"\nevent: next");
        let frame = decoder.next_frame().unwrap().unwrap();
        assert_eq!(&frame.raw()[..], b"data: x\r\n\r\n");
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.buffered(), b"event: next".len());
    }

    #[test]
    fn a_lone_cr_then_another_byte_is_a_line_end() {
        let mut decoder = Decoder::new();
        decoder.push(b"data: x\r");
        assert_eq!(decoder.next_frame(), Ok(None));
        decoder.push(b"\r");
        assert_eq!(decoder.next_frame(), Ok(None));
        decoder.push(b"d");
        assert_eq!(
            &decoder.next_frame().unwrap().unwrap().raw()[..],
            b"data: x\r\r"
        );
    }

    #[test]
    fn the_end_of_the_stream_completes_a_trailing_cr() {
        let mut decoder = Decoder::new();
        decoder.push(b"data: x\r\r");
        assert_eq!(decoder.next_frame(), Ok(None));
        let frame = decoder.finish().unwrap().unwrap();
        assert_eq!(frame.data_str().as_deref(), Some("x"));
        assert_eq!(decoder.finish(), Ok(None));
    }

    #[test]
    fn a_truncated_last_frame_is_reported() {
        let err = frames_of(&[b"data: a\n\nevent: message_delta\ndata: {\"usage\""]).unwrap_err();
        assert_eq!(err, SseError::TruncatedFrame { buffered: 35 });
        // One line end is not enough: a frame ends with a blank line.
        let err = frames_of(&[b"data: a\n"]).unwrap_err();
        assert_eq!(err, SseError::TruncatedFrame { buffered: 8 });
    }

    #[test]
    fn a_leading_bom_is_dropped_even_when_split() {
        let frames = frames_of(&[b"\xEF", b"\xBB", b"\xBFdata: a\n\n"]).unwrap();
        assert_eq!(raws(&frames), [&b"data: a\n\n"[..]]);
        // Only at the very start: later it is data.
        let frames = frames_of(&[b"data: a\n\n\xEF\xBB\xBFdata: b\n\n"]).unwrap();
        assert_eq!(frames[1].lines().count(), 1);
        assert_eq!(frames[1].data(), None);
    }

    #[test]
    fn blank_lines_between_frames_are_dropped() {
        let frames = frames_of(&[b"\n\r\n\rdata: a\n\n\n\ndata: b\n\n"]).unwrap();
        assert_eq!(raws(&frames), [&b"data: a\n\n"[..], b"data: b\n\n"]);
    }

    #[test]
    fn the_frame_size_bound_gives_a_clear_error_and_poisons_the_decoder() {
        let mut decoder = Decoder::with_max_frame_bytes(16);
        decoder.push(b"data: 0123456\n\n"); // 15 bytes: fits
        assert!(decoder.next_frame().unwrap().is_some());
        decoder.push(b"data: 01234567\n\n"); // 16 bytes: fits exactly
        assert!(decoder.next_frame().unwrap().is_some());
        decoder.push(b"data: 012345678"); // 15 bytes, incomplete: keeps buffering
        assert_eq!(decoder.next_frame(), Ok(None));
        decoder.push(b"9\n"); // 17 bytes and still no blank line
        let err = decoder.next_frame().unwrap_err();
        assert_eq!(err, SseError::FrameTooLarge { limit: 16 });
        assert!(err.to_string().contains("larger than 16 bytes"), "{err}");
        assert_eq!(decoder.buffered(), 0);
        decoder.push(b"data: a\n\n");
        assert_eq!(decoder.buffered(), 0, "a poisoned decoder buffers nothing");
        assert_eq!(decoder.next_frame(), Err(err.clone()));
        assert_eq!(decoder.finish(), Err(err));
    }

    #[test]
    fn a_complete_frame_over_the_bound_is_rejected_too() {
        let mut decoder = Decoder::with_max_frame_bytes(8);
        decoder.push(b"data: abc\n\n");
        assert_eq!(
            decoder.next_frame(),
            Err(SseError::FrameTooLarge { limit: 8 })
        );
        assert_eq!(DEFAULT_MAX_FRAME_BYTES, 16 * 1024 * 1024);
        assert_eq!(Decoder::new().max_frame_bytes(), DEFAULT_MAX_FRAME_BYTES);
    }

    #[test]
    fn frames_split_inside_utf8_keep_their_text() {
        let whole = "event: content_block_delta\ndata: {\"text\":\"café ☕\"}\n\n".as_bytes();
        let cut = whole.iter().position(|&b| b == 0xE2).unwrap() + 1; // inside '☕'
        let frames = frames_of(&[&whole[..cut], &whole[cut..]]).unwrap();
        assert_eq!(frames[0].data_str().unwrap(), "{\"text\":\"café ☕\"}");
    }

    #[test]
    fn decode_all_matches_the_incremental_decoder() {
        let stream = b": hi\n\nevent: a\ndata: 1\ndata: 2\n\n";
        let frames = decode_all(stream).unwrap();
        assert_eq!(frames, frames_of(&[stream]).unwrap());
        assert!(frames[0].is_comment_only());
        assert_eq!(frames[1].data_str().unwrap(), "1\n2");
    }
}
