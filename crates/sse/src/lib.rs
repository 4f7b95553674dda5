//! Incremental Server-Sent Events decoder and encoder over `bytes`, with no async runtime.
//!
//! keypool reads every upstream streaming answer frame by frame: it must see the first
//! valid frame before it commits the response head, watch later frames for usage and
//! in-band errors, and forward each frame's original bytes unchanged (SPEC 7). Upstream
//! bodies arrive in arbitrary chunks, so a frame (even a `\r\n` or a UTF-8 sequence) may
//! be split anywhere. This crate turns those chunks into complete [`Frame`]s, each
//! holding its original bytes without a copy, and writes the few frames keypool emits
//! itself ([`Event`], [`OVERLOADED_ERROR_FRAME`]).
//!
//! ```
//! use keypool_sse::{Decoder, SseError};
//!
//! let mut decoder = Decoder::new();
//! let mut names = Vec::new();
//! for chunk in [&b"event: ping\nda"[..], b"ta: {}\n\nevent: message_st", b"op\ndata: {}\r\n\r\n"] {
//!     decoder.push(chunk);
//!     while let Some(frame) = decoder.next_frame()? {
//!         names.push(frame.event().unwrap().into_owned());
//!     }
//! }
//! assert_eq!(names, ["ping", "message_stop"]);
//!
//! // The end of the stream: nothing left, so no truncated frame to report.
//! assert_eq!(decoder.finish()?, None);
//! # Ok::<(), SseError>(())
//! ```
//!
//! # Layout
//! - [`decode`]: [`Decoder`], the incremental framer (buffering, line
//!   ends, BOM, size bound, end of stream), and [`decode_all`].
//! - [`frame`]: [`Frame`], its original bytes and its lazily parsed fields.
//! - [`encode`]: [`Event`] and the generic error frame of SPEC 3.8.
//! - [`error`]: [`SseError`], the crate's one error type.

pub mod decode;
pub mod encode;
pub mod error;
pub mod frame;

pub use decode::{DEFAULT_MAX_FRAME_BYTES, Decoder, decode_all};
pub use encode::{Event, OVERLOADED_ERROR_FRAME, overloaded_error_frame};
pub use error::SseError;
pub use frame::{Frame, Line, Lines};
