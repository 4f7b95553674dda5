//! What the Redis reply guard costs: the scanner alone over typical reply streams, and
//! one `INCR` (the round-robin counter, once per request) through `fred` straight to a
//! local `redis-server` and through the guard's loopback relay, in wall time and in CPU
//! time of keypool's side (`fred`, the relay and the scanner all run on the bench
//! thread's single-threaded runtime; `redis-server` is another process).
//!
//! `cargo bench -p keypool-store --bench redis_guard` (needs `redis-server` on `PATH`
//! for the `INCR` part; without it only the scanner is measured).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fred::prelude::{ClientLike, Config as FredConfig, KeysInterface};
use fred::types::Builder;
use keypool_store::state::resp_guard::{RespGuard, RespScanner};
use keypool_store::testing::RedisServer;

/// CPU time this thread has run so far (`/proc/thread-self/schedstat`, nanoseconds).
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = stat
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

fn scanner(c: &mut Criterion) {
    let integers = b":1234567\r\n".repeat(10_000);
    let mut rating = format!("*{}\r\n", 2 * 1000).into_bytes();
    for i in 0..1000 {
        let value = format!(
            "{{\"id\":\"acct-{i:04}\",\"ttft_ms\":812.5,\"total_ms\":2400.0,\"errors\":0.01,\"samples\":[800,810,790,805]}}"
        );
        rating.extend(format!("$9\r\nacct-{i:04}\r\n${}\r\n{value}\r\n", value.len()).into_bytes());
    }
    let message = b"*3\r\n$7\r\nmessage\r\n$14\r\nkeypool:events\r\n$120\r\n";
    let mut pubsub = Vec::new();
    for _ in 0..5_000 {
        pubsub.extend_from_slice(message);
        pubsub.extend(std::iter::repeat_n(b'x', 120));
        pubsub.extend_from_slice(b"\r\n");
    }
    let mut group = c.benchmark_group("resp_scanner");
    for (name, stream) in [
        ("integers_10000", &integers),
        ("hgetall_rating_1000_accounts", &rating),
        ("pubsub_messages_5000", &pubsub),
    ] {
        group.throughput(Throughput::Bytes(stream.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut scanner = RespScanner::default();
                // as the relay reads: 64 KiB at a time
                for chunk in stream.chunks(64 * 1024) {
                    black_box(scanner.scan(black_box(chunk))).expect("valid replies");
                }
            })
        });
    }
    group.finish();
}

fn incr(c: &mut Criterion) {
    let Ok(redis) = RedisServer::start() else {
        eprintln!("redis_guard: no redis-server on PATH; the INCR benchmarks are skipped");
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let guard = rt
        .block_on(RespGuard::start(
            format!("127.0.0.1:{}", redis.port()),
            Duration::from_secs(1),
        ))
        .expect("the guard starts");
    let connect = |port: u16| {
        let config = FredConfig::from_url(&format!("redis://127.0.0.1:{port}/")).expect("url");
        let client = Builder::from_config(config).build().expect("client");
        rt.block_on(async {
            client.init().await.expect("connects");
        });
        client
    };
    let direct = connect(redis.port());
    let guarded = connect(guard.port());
    let mut group = c.benchmark_group("redis_incr");
    group.measurement_time(Duration::from_secs(5));
    for (name, client) in [("direct", &direct), ("guarded", &guarded)] {
        group.bench_function(format!("{name}/wall"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    let n: i64 = client.incr("bench:counter").await.expect("INCR");
                    black_box(n)
                })
            })
        });
        group.bench_function(format!("{name}/cpu"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = thread_cpu();
                    for _ in 0..iters {
                        let n: i64 = client.incr("bench:counter").await.expect("INCR");
                        black_box(n);
                    }
                    thread_cpu() - start
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, scanner, incr);
criterion_main!(benches);
