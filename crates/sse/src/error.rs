//! The crate's one error type.

/// What can go wrong while decoding or encoding SSE frames.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A frame (or the unfinished frame being buffered) grew past the size bound.
    #[error(
        "SSE frame larger than {limit} bytes without a blank line ending it: the upstream is \
         not sending an event stream, or raise the decoder's max_frame_bytes"
    )]
    FrameTooLarge {
        /// The configured bound, in bytes.
        limit: usize,
    },
    /// The stream ended inside a frame (no blank line after its last field).
    #[error(
        "SSE stream ended inside a frame ({buffered} bytes without the closing blank line): \
         the upstream cut the stream, treat the response as incomplete"
    )]
    TruncatedFrame {
        /// How many bytes of the unfinished frame were buffered.
        buffered: usize,
    },
    /// A value given to the encoder cannot be written as one SSE field.
    #[error(
        "cannot encode SSE field `{field}`: its value contains a line break{nul}; \
         remove it (only `data` may span lines)",
        nul = if *.field == "id" { " or a NUL byte" } else { "" }
    )]
    InvalidField {
        /// The field name (`event`, `id` or `comment`).
        field: &'static str,
    },
    /// The encoder was asked to write an event without any field.
    #[error(
        "cannot encode an SSE event without any field: it would be a bare blank line, set at least `data` or `comment`"
    )]
    EmptyEvent,
}
