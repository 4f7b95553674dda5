//! The encoder for the frames keypool writes itself.

use bytes::{BufMut, Bytes, BytesMut};

use crate::SseError;

/// The one generic error frame keypool emits when an upstream fails after the SSE head
/// was written (SPEC 3.8). Upstream error frames are never forwarded verbatim.
pub const OVERLOADED_ERROR_FRAME: &[u8] = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";

/// [`OVERLOADED_ERROR_FRAME`] as [`Bytes`], without copying.
pub fn overloaded_error_frame() -> Bytes {
    Bytes::from_static(OVERLOADED_ERROR_FRAME)
}

/// An event to encode. Every field is optional, but at least one must be set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Event<'a> {
    /// A comment line written first (`: text`), e.g. a keep-alive.
    pub comment: Option<&'a str>,
    /// The `event` field (the event name).
    pub event: Option<&'a str>,
    /// The `id` field.
    pub id: Option<&'a str>,
    /// The `retry` field, in milliseconds.
    pub retry: Option<u64>,
    /// The data; each of its lines (split at `\n`, `\r\n` or `\r`) becomes one `data` field.
    pub data: Option<&'a str>,
}

impl<'a> Event<'a> {
    /// An event with a name and data, the usual shape of an Anthropic stream frame.
    pub fn named(event: &'a str, data: &'a str) -> Self {
        Self {
            event: Some(event),
            data: Some(data),
            ..Self::default()
        }
    }

    /// Encodes the event as one frame, blank line included.
    ///
    /// # Errors
    /// [`SseError::InvalidField`] when `comment`, `event` or `id` holds a line break (or
    /// `id` a NUL byte); [`SseError::EmptyEvent`] when no field is set.
    pub fn encode(&self) -> Result<Bytes, SseError> {
        let mut out = BytesMut::new();
        self.encode_into(&mut out)?;
        Ok(out.freeze())
    }

    /// Appends the encoded frame to `out`; on error nothing is appended.
    ///
    /// # Errors
    /// As [`encode`](Self::encode).
    pub fn encode_into(&self, out: &mut BytesMut) -> Result<(), SseError> {
        if self.comment.is_none()
            && self.event.is_none()
            && self.id.is_none()
            && self.retry.is_none()
            && self.data.is_none()
        {
            return Err(SseError::EmptyEvent);
        }
        let single_line = |field: &'static str, value: Option<&str>| match value {
            Some(v) if v.contains(['\n', '\r']) || (field == "id" && v.contains('\0')) => {
                Err(SseError::InvalidField { field })
            }
            _ => Ok(()),
        };
        single_line("comment", self.comment)?;
        single_line("event", self.event)?;
        single_line("id", self.id)?;

        if let Some(comment) = self.comment {
            put_line(out, "", comment);
        }
        if let Some(event) = self.event {
            put_line(out, "event", event);
        }
        if let Some(id) = self.id {
            put_line(out, "id", id);
        }
        if let Some(retry) = self.retry {
            put_line(out, "retry", &retry.to_string());
        }
        if let Some(data) = self.data {
            for line in data_lines(data) {
                put_line(out, "data", line);
            }
        }
        out.put_u8(b'\n');
        Ok(())
    }
}

fn put_line(out: &mut BytesMut, name: &str, value: &str) {
    out.reserve(name.len() + value.len() + 3);
    out.put_slice(name.as_bytes());
    out.put_slice(b": ");
    out.put_slice(value.as_bytes());
    out.put_u8(b'\n');
}

/// Splits at `\n`, `\r\n` and `\r`; an empty string is one empty line.
fn data_lines(data: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(data);
    std::iter::from_fn(move || {
        let current = rest?;
        match current.find(['\n', '\r']) {
            Some(at) => {
                let skip = if current[at..].starts_with("\r\n") {
                    2
                } else {
                    1
                };
                rest = Some(&current[at + skip..]);
                Some(&current[..at])
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generic_error_frame_is_the_encoded_spec_frame() {
        let encoded = Event::named(
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        )
        .encode()
        .unwrap();
        assert_eq!(&encoded[..], OVERLOADED_ERROR_FRAME);
        assert_eq!(overloaded_error_frame(), encoded);
    }

    #[test]
    fn multi_line_data_becomes_one_field_per_line() {
        let encoded = Event {
            data: Some("a\r\nb\rc\n"),
            ..Event::default()
        }
        .encode()
        .unwrap();
        assert_eq!(&encoded[..], b"data: a\ndata: b\ndata: c\ndata: \n\n");
    }

    #[test]
    fn all_fields_in_a_fixed_order() {
        let encoded = Event {
            comment: Some("keep-alive"),
            event: Some("ping"),
            id: Some("7"),
            retry: Some(1500),
            data: Some("{}"),
        }
        .encode()
        .unwrap();
        assert_eq!(
            &encoded[..],
            b": keep-alive\nevent: ping\nid: 7\nretry: 1500\ndata: {}\n\n"
        );
    }

    #[test]
    fn line_breaks_in_single_line_fields_are_rejected() {
        let err = Event::named("a\nb", "x").encode().unwrap_err();
        assert_eq!(err, SseError::InvalidField { field: "event" });
        let err = Event {
            id: Some("1\x00b"),
            ..Event::default()
        }
        .encode()
        .unwrap_err();
        assert_eq!(err, SseError::InvalidField { field: "id" });
        assert!(err.to_string().contains("NUL"), "{err}");
        assert_eq!(Event::default().encode(), Err(SseError::EmptyEvent));
    }
}
