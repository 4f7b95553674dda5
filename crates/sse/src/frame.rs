//! One decoded frame: its original bytes, and its fields parsed on demand.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use memchr::memchr2;

/// One complete SSE frame: every line up to and including the blank line that ends it.
///
/// The frame keeps its original bytes ([`raw`](Self::raw)) so a proxy can forward it
/// unchanged. The event name is located by the decoder as it frames the bytes, so
/// [`event`](Self::event) and [`is_event`](Self::is_event) cost no walk: a proxy asks
/// for it several times per frame. Other fields are parsed when an accessor is called
/// (each call walks the frame's few lines again, so keep the result if you need it
/// twice).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    raw: Bytes,
    /// Where the value of the last `event` field is in `raw`, if the frame has one.
    event: Option<(usize, usize)>,
}

/// One line of a frame, without its line terminator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line<'a> {
    /// A comment (`:` first), with the text after the colon (one leading space removed).
    Comment(&'a [u8]),
    /// A field: `name: value` (one space after the colon removed), or a bare `name`
    /// whose value is empty.
    Field {
        /// The field name, such as `event` or `data`.
        name: &'a [u8],
        /// The field value.
        value: &'a [u8],
    },
}

impl Frame {
    /// Wraps bytes the decoder has already framed; `event` is where the value of their
    /// last `event` field is (the decoder saw every line: see [`event_value_at`]).
    pub(crate) fn from_raw_unchecked(raw: Bytes, event: Option<(usize, usize)>) -> Self {
        debug_assert!(event.is_none_or(|(start, end)| start <= end && end <= raw.len()));
        Self { raw, event }
    }

    /// The frame's original bytes, blank line included: forward these unchanged.
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// The frame's original bytes, by value.
    pub fn into_raw(self) -> Bytes {
        self.raw
    }

    /// The frame's size in bytes, blank line included.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Always false: a frame holds at least its ending blank line.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The frame's lines in order, the ending blank line left out.
    pub fn lines(&self) -> Lines<'_> {
        Lines { rest: &self.raw }
    }

    /// The event name: the value of the last `event` field, if any.
    ///
    /// An event name that is not valid UTF-8 is returned with replacement characters.
    pub fn event(&self) -> Option<Cow<'_, str>> {
        self.event_bytes().map(String::from_utf8_lossy)
    }

    /// Whether the frame's event name is exactly `name`, without allocating or walking
    /// the frame.
    pub fn is_event(&self, name: &str) -> bool {
        self.event_bytes() == Some(name.as_bytes())
    }

    fn event_bytes(&self) -> Option<&[u8]> {
        self.event.map(|(start, end)| &self.raw[start..end])
    }

    /// The data: every `data` field's value joined with `\n`, `None` when the frame has
    /// no `data` field. Borrowed from the frame when there is exactly one `data` line.
    pub fn data(&self) -> Option<Cow<'_, [u8]>> {
        let mut data: Option<Cow<'_, [u8]>> = None;
        for line in self.lines() {
            if let Line::Field {
                name: b"data",
                value,
            } = line
            {
                data = Some(match data {
                    None => Cow::Borrowed(value),
                    Some(previous) => {
                        let mut joined = previous.into_owned();
                        joined.push(b'\n');
                        joined.extend_from_slice(value);
                        Cow::Owned(joined)
                    }
                });
            }
        }
        data
    }

    /// [`data`](Self::data) as text, invalid UTF-8 replaced.
    pub fn data_str(&self) -> Option<String> {
        self.data()
            .map(|data| String::from_utf8_lossy(&data).into_owned())
    }

    /// The last `id` field whose value has no NUL byte, as the event-stream grammar says.
    pub fn id(&self) -> Option<Cow<'_, str>> {
        self.lines()
            .filter_map(|line| match line {
                Line::Field { name: b"id", value } if !value.contains(&0) => Some(value),
                _ => None,
            })
            .last()
            .map(String::from_utf8_lossy)
    }

    /// The last `retry` field made only of ASCII digits, in milliseconds.
    pub fn retry(&self) -> Option<u64> {
        self.lines()
            .filter_map(|line| match line {
                Line::Field {
                    name: b"retry",
                    value,
                } if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                    std::str::from_utf8(value).ok()?.parse().ok()
                }
                _ => None,
            })
            .last()
    }

    /// Whether the frame has no field at all, only comments (a keep-alive).
    pub fn is_comment_only(&self) -> bool {
        self.lines().all(|line| matches!(line, Line::Comment(_)))
    }
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame")
            .field("raw", &String::from_utf8_lossy(&self.raw))
            .finish()
    }
}

/// Iterator over a frame's lines, from [`Frame::lines`].
#[derive(Debug, Clone)]
pub struct Lines<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Lines<'a> {
    type Item = Line<'a>;

    fn next(&mut self) -> Option<Line<'a>> {
        let (line, after) = match memchr2(b'\n', b'\r', self.rest) {
            Some(at) => {
                let terminator = if self.rest[at] == b'\r' && self.rest.get(at + 1) == Some(&b'\n')
                {
                    2
                } else {
                    1
                };
                (&self.rest[..at], &self.rest[at + terminator..])
            }
            None => (self.rest, &self.rest[self.rest.len()..]),
        };
        if line.is_empty() {
            // The blank line that ends the frame.
            self.rest = &[];
            return None;
        }
        self.rest = after;
        Some(parse_line(line))
    }
}

/// Where the value of an `event` field starts in `line` (a complete line, without its
/// terminator), `None` when the line is not an `event` field: [`parse_line`]'s reading
/// of the name and value, for the one field the decoder locates.
pub(crate) fn event_value_at(line: &[u8]) -> Option<usize> {
    let rest = line.strip_prefix(b"event")?;
    match rest {
        [] => Some(line.len()),
        [b':', b' ', ..] => Some(7),
        [b':', ..] => Some(6),
        _ => None,
    }
}

fn parse_line(line: &[u8]) -> Line<'_> {
    let (name, value) = match memchr::memchr(b':', line) {
        Some(colon) => {
            let value = &line[colon + 1..];
            (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
        }
        None => (line, &line[line.len()..]),
    };
    if name.is_empty() {
        Line::Comment(value)
    } else {
        Line::Field { name, value }
    }
}

#[cfg(test)]
mod tests {
    use crate::decode_all;

    #[test]
    fn fields_follow_the_event_stream_grammar() {
        let frames = decode_all(
            b": comment\nevent: first\nevent:second\ndata\ndata:  two spaces\nid: 1\nid: a\0b\n\
              retry: 10x\nretry: 250\nunknown: x\n\n",
        )
        .unwrap();
        let frame = &frames[0];
        assert_eq!(frame.event().as_deref(), Some("second"));
        assert!(frame.is_event("second"));
        assert!(!frame.is_event("first"));
        // A bare `data` is an empty value; only one space after the colon is removed.
        assert_eq!(frame.data_str().as_deref(), Some("\n two spaces"));
        assert_eq!(frame.id().as_deref(), Some("1"));
        assert_eq!(frame.retry(), Some(250));
        assert!(!frame.is_comment_only());
        assert_eq!(frame.lines().next(), Some(super::Line::Comment(b"comment")));
    }

    #[test]
    fn the_event_name_is_the_last_event_field_even_when_split() {
        let frames = decode_all(
            b"event\ndata: 1\n\nevent:x\n\neventx: y\n\nevent x\n\nevent: a\ndata: {}\nevent: b\n\n",
        )
        .unwrap();
        let names: Vec<_> = frames.iter().map(|f| f.event()).collect();
        assert_eq!(
            names,
            [
                Some("".into()),
                Some("x".into()),
                None,
                None,
                Some("b".into())
            ]
        );
        assert!(frames[4].is_event("b") && !frames[4].is_event("a"));
        // Cut inside the name, and a lone `\r` line end that waits for the next byte.
        let mut decoder = crate::Decoder::new();
        decoder.push(b"data: 1\reve");
        assert_eq!(decoder.next_frame(), Ok(None));
        decoder.push(b"nt: message_stop\r");
        assert_eq!(decoder.next_frame(), Ok(None));
        decoder.push(b"\n\n");
        let frame = decoder.next_frame().unwrap().unwrap();
        assert!(frame.is_event("message_stop"), "{frame:?}");
        assert_eq!(frame.data_str().as_deref(), Some("1"));
    }

    #[test]
    fn one_data_line_is_borrowed_and_absent_data_is_none() {
        let frames = decode_all(b"data: {}\n\nevent: ping\n\n").unwrap();
        assert!(matches!(
            frames[0].data(),
            Some(std::borrow::Cow::Borrowed(b"{}"))
        ));
        assert_eq!(frames[1].data(), None);
        assert_eq!(frames[1].id(), None);
        assert_eq!(frames[1].retry(), None);
        assert_eq!(frames[1].len(), 13);
        assert!(!frames[1].is_empty());
        assert!(format!("{:?}", frames[1]).contains("event: ping"));
    }
}
