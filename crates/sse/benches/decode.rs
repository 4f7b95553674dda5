//! Decoding throughput of a realistic Anthropic stream in 1-byte, 64-byte and 16 KiB
//! chunks (the goal: at least 1 GB/s for 16 KiB chunks).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use keypool_sse::Decoder;

#[path = "../tests/support/anthropic_stream.rs"]
mod anthropic_stream;

fn decode_in_chunks(stream: &[u8], chunk: usize) -> usize {
    let mut decoder = Decoder::new();
    let mut frames = 0;
    for piece in stream.chunks(chunk) {
        decoder.push(piece);
        while let Some(frame) = decoder.next_frame().expect("valid stream") {
            frames += std::hint::black_box(frame).len().min(1);
        }
    }
    assert!(decoder.finish().expect("complete stream").is_none());
    frames
}

fn bench_decode(c: &mut Criterion) {
    let stream = anthropic_stream::anthropic_stream(500);
    let expected_frames = 500 + 6;
    let mut group = c.benchmark_group("sse_decode_anthropic_stream");
    group.throughput(Throughput::Bytes(stream.len() as u64));
    for chunk in [1, 64, 16 * 1024] {
        group.bench_function(format!("chunk_{chunk}"), |b| {
            b.iter(|| assert_eq!(decode_in_chunks(&stream, chunk), expected_frames));
        });
    }
    // What the proxy does per frame after the commit point: frame it, look at its name.
    group.bench_function("chunk_16384_and_event_name", |b| {
        b.iter(|| {
            let mut decoder = Decoder::new();
            let mut deltas = 0;
            for piece in stream.chunks(16 * 1024) {
                decoder.push(piece);
                while let Some(frame) = decoder.next_frame().expect("valid stream") {
                    deltas += usize::from(frame.is_event("content_block_delta"));
                }
            }
            assert_eq!(deltas, 500);
        });
    });
    group.finish();
}

criterion_group!(benches, bench_decode);
criterion_main!(benches);
