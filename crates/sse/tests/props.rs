//! Property tests of the decoder and encoder (issue 4): any chunking decodes like the
//! whole stream, encode→decode round-trips, arbitrary bytes never panic.

use keypool_sse::{Decoder, Event, Frame, Line, SseError, decode_all};
use proptest::prelude::*;

mod support;

/// Everything the decoder yields for `stream` cut at `cuts`, up to and including the
/// first error.
fn decode_chunked(stream: &[u8], cuts: &[usize], max: usize) -> (Vec<Frame>, Option<SseError>) {
    let mut decoder = Decoder::with_max_frame_bytes(max);
    let mut frames = Vec::new();
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    cuts.sort_unstable();
    let mut start = 0;
    for end in cuts.into_iter().chain([stream.len()]) {
        decoder.push(&stream[start..end]);
        start = end;
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(err) => return (frames, Some(err)),
            }
        }
    }
    loop {
        match decoder.finish() {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => return (frames, None),
            Err(err) => return (frames, Some(err)),
        }
    }
}

fn line_end() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("\n"), Just("\r\n"), Just("\r")]
}

/// One line of an event stream: a field, a comment, or text with UTF-8 and colons.
fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,6}",
        "(event|data|id|retry): ?[a-zé☕{}\":, 0-9]{0,24}",
        ":[ -~]{0,10}",
        "data:[\u{0}-\u{7f}&&[^\r\n]]{0,8}",
    ]
}

/// A stream of frames with mixed line ends, stray blank lines, an optional BOM and an
/// optional unfinished tail.
fn stream() -> impl Strategy<Value = Vec<u8>> {
    let frame = (
        prop::collection::vec((line(), line_end()), 1..5),
        line_end(),
        0..3usize,
    );
    (
        any::<bool>(),
        prop::collection::vec(frame, 0..8),
        prop::option::of(line()),
    )
        .prop_map(|(bom, frames, tail)| {
            let mut s = String::new();
            if bom {
                s.push('\u{feff}');
            }
            for (lines, blank, stray_blank_lines) in frames {
                for (text, end) in lines {
                    s.push_str(&text);
                    s.push_str(end);
                }
                s.push_str(blank);
                for _ in 0..stray_blank_lines {
                    s.push('\n');
                }
            }
            if let Some(tail) = tail {
                s.push_str(&tail);
            }
            s.into_bytes()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_chunking_decodes_like_the_whole_stream(
        stream in stream(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
        max in prop_oneof![Just(usize::MAX), 8..64usize],
    ) {
        let whole = decode_chunked(&stream, &[], max);
        let chunked = decode_chunked(&stream, &cuts, max);
        prop_assert_eq!(&chunked, &whole);
    }

    #[test]
    fn one_byte_chunks_decode_like_the_whole_stream(stream in stream()) {
        let cuts: Vec<usize> = (1..stream.len()).collect();
        prop_assert_eq!(decode_chunked(&stream, &cuts, usize::MAX), decode_chunked(&stream, &[], usize::MAX));
    }

    #[test]
    fn the_located_event_is_the_last_event_field_however_the_stream_is_cut(
        stream in stream(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let (frames, _) = decode_chunked(&stream, &cuts, usize::MAX);
        for frame in &frames {
            // The event-stream grammar's reading, line by line.
            let walked = frame
                .lines()
                .filter_map(|line| match line {
                    Line::Field { name: b"event", value } => Some(value),
                    _ => None,
                })
                .last();
            prop_assert_eq!(frame.event().map(|e| e.into_owned().into_bytes()), walked.map(<[u8]>::to_vec));
            if let Some(name) = walked.and_then(|n| std::str::from_utf8(n).ok()) {
                prop_assert!(frame.is_event(name));
                let other = format!("{name}x");
                prop_assert!(!frame.is_event(&other));
            }
        }
    }

    #[test]
    fn frames_concatenate_back_to_the_stream(stream in stream()) {
        let (frames, _) = decode_chunked(&stream, &[], usize::MAX);
        let joined: Vec<u8> = frames.iter().flat_map(|f| f.raw().to_vec()).collect();
        // Re-decoding the forwarded bytes gives the same frames (byte-exact forwarding).
        prop_assert_eq!(decode_all(&joined).unwrap(), frames.clone());
        // Every frame's bytes appear in the stream in order, nothing rewritten.
        let mut at = 0;
        for frame in &frames {
            let raw = &frame.raw()[..];
            let found = stream[at..].windows(raw.len()).position(|w| w == raw);
            prop_assert!(found.is_some(), "frame {:?} not in the stream", frame);
            at += found.unwrap() + raw.len();
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
        max in 1..256usize,
    ) {
        let (frames, _) = decode_chunked(&bytes, &cuts, max);
        for frame in frames {
            let _ = (frame.event(), frame.data(), frame.id(), frame.retry(), frame.is_comment_only());
            prop_assert!(frame.len() <= max);
        }
    }

    #[test]
    fn encode_then_decode_round_trips(
        comment in prop::option::of("[^\r\n]{0,12}"),
        event in prop::option::of("[^\r\n]{0,12}"),
        id in prop::option::of("[^\r\n\u{0}]{0,12}"),
        retry in prop::option::of(any::<u64>()),
        data in prop::option::of("(\\PC|\r|\n){0,40}"),
    ) {
        let ev = Event { comment: comment.as_deref(), event: event.as_deref(), id: id.as_deref(), retry, data: data.as_deref() };
        prop_assume!(ev != Event::default());
        let encoded = ev.encode().unwrap();
        let frames = decode_all(&encoded).unwrap();
        prop_assert_eq!(frames.len(), 1);
        let frame = &frames[0];
        prop_assert_eq!(&frame.raw()[..], &encoded[..]);
        prop_assert_eq!(frame.event().map(|e| e.into_owned()), event.clone());
        prop_assert_eq!(frame.id().map(|i| i.into_owned()), id.clone());
        prop_assert_eq!(frame.retry(), retry);
        let normalised = data.map(|d| d.replace("\r\n", "\n").replace('\r', "\n"));
        prop_assert_eq!(frame.data_str(), normalised);
        let comments: Vec<&[u8]> = frame.lines().filter_map(|l| match l { Line::Comment(c) => Some(c), _ => None }).collect();
        let expected: Vec<&[u8]> = comment.iter().map(|c| c.as_bytes()).collect();
        prop_assert_eq!(comments, expected);
    }
}

#[test]
fn the_realistic_stream_decodes_in_every_chunk_size() {
    let stream = support::anthropic_stream::anthropic_stream(300);
    let (whole, err) = decode_chunked(&stream, &[], usize::MAX);
    assert_eq!(err, None);
    assert_eq!(whole.len(), 306);
    assert!(whole[0].is_event("message_start"));
    assert!(whole[2].is_event("ping"));
    assert!(whole[305].is_event("message_stop"));
    for chunk in [1, 7, 64, 16 * 1024] {
        let cuts: Vec<usize> = (chunk..stream.len()).step_by(chunk).collect();
        assert_eq!(
            decode_chunked(&stream, &cuts, usize::MAX),
            (whole.clone(), None)
        );
    }
    let joined: Vec<u8> = whole.iter().flat_map(|f| f.raw().to_vec()).collect();
    assert_eq!(joined, stream);
}
