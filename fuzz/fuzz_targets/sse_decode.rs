//! Fuzzes the SSE decoder: arbitrary bytes, cut into arbitrary chunks, must never panic,
//! must decode exactly like the whole input, and every frame must respect the size bound.
#![no_main]

use keypool_sse::{Decoder, Frame, SseError};
use libfuzzer_sys::fuzz_target;

fn decode(data: &[u8], chunk_lens: &[u8], max: usize) -> (Vec<Frame>, Option<SseError>) {
    let mut decoder = Decoder::with_max_frame_bytes(max);
    let mut frames = Vec::new();
    let mut rest = data;
    let mut lens = chunk_lens.iter().cycle();
    while !rest.is_empty() {
        let len = if chunk_lens.is_empty() {
            rest.len()
        } else {
            (usize::from(*lens.next().unwrap_or(&1)) + 1).min(rest.len())
        };
        decoder.push(&rest[..len]);
        rest = &rest[len..];
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

fuzz_target!(|input: &[u8]| {
    // First byte: the size bound; next up to 8 bytes: the chunk lengths; rest: the stream.
    let Some((&bound, rest)) = input.split_first() else {
        return;
    };
    let max = if bound == 0 {
        usize::MAX
    } else {
        usize::from(bound) * 4
    };
    let (chunk_lens, stream) = rest.split_at(rest.len().min(8));
    let whole = decode(stream, &[], max);
    let chunked = decode(stream, chunk_lens, max);
    assert_eq!(whole, chunked);
    for frame in &whole.0 {
        assert!(frame.len() <= max);
        let _ = (frame.event(), frame.data(), frame.id(), frame.retry());
    }
});
