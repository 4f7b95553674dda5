//! How fast the simulator answers over loopback HTTP/1.1 keep-alive: one request at a
//! time (latency), and 64 requests spread over 8 connections (throughput). Both figures
//! include the hyper client, so they bound the simulator's own cost from above.
#![allow(clippy::unwrap_used, missing_docs)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use keypool_sim::{OkSpec, Script, Sim, SimConfig};

const JSON_BODY: &str =
    r#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;
const STREAM_BODY: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn one(client: &HttpClient, url: &str, body: &'static str) {
    let req = Request::post(url)
        .header("x-api-key", "sk-ant-api03-bench")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert!(resp.status().is_success());
    resp.into_body().collect().await.unwrap();
}

fn roundtrip(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let spec = OkSpec::default().chunks(10);
    let sim = rt
        .block_on(Sim::start(
            SimConfig::new()
                .any_credential(Script::new(spec))
                .record_limit(0),
        ))
        .unwrap();
    let url = format!("{}/v1/messages", sim.base_url());
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http();

    let mut g = c.benchmark_group("sim");
    g.throughput(Throughput::Elements(1));
    g.bench_function("json_sequential", |b| {
        b.to_async(&rt).iter(|| one(&client, &url, JSON_BODY))
    });
    g.bench_function("stream_10_chunks_sequential", |b| {
        b.to_async(&rt).iter(|| one(&client, &url, STREAM_BODY))
    });

    const BATCH: u64 = 64;
    g.throughput(Throughput::Elements(BATCH));
    for (name, body) in [
        ("json_64_over_8_connections", JSON_BODY),
        ("stream_64_over_8_connections", STREAM_BODY),
    ] {
        g.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let client = client.clone();
                let url = url.clone();
                async move {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let mut lanes = tokio::task::JoinSet::new();
                        for _ in 0..8 {
                            let (client, url) = (client.clone(), url.clone());
                            lanes.spawn(async move {
                                for _ in 0..BATCH / 8 {
                                    one(&client, &url, body).await;
                                }
                            });
                        }
                        while lanes.join_next().await.is_some() {}
                    }
                    start.elapsed()
                }
            })
        });
    }
    g.finish();
    drop(sim);
    rt.shutdown_timeout(Duration::from_secs(1));
}

criterion_group!(benches, roundtrip);
criterion_main!(benches);
