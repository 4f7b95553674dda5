//! `keypool-sim`: the simulated Anthropic upstream as a standalone program, for
//! benchmarks. It accepts any credential and answers every request the same way.
//!
//! ```text
//! keypool-sim [--listen ADDR] [--delay-ms N] [--chunks N] [--chunk-interval-ms N]
//!             [--input-tokens N] [--threads N]
//!             [--rate-limited CREDENTIAL]... [--retry-after-ms N] [--think-time-in-id]
//! ```
//!
//! `--rate-limited` gives one credential its own account that answers every request
//! with `429 rate_limit_error` and `retry-after-ms` (the failover benchmark's first
//! account); every other credential is served normally.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use keypool_sim::{Delay, ErrorReply, OkSpec, Script, Sim, SimConfig, Usage};

const USAGE: &str = "usage: keypool-sim [--listen ADDR] [--delay-ms N] [--chunks N] [--chunk-interval-ms N] [--input-tokens N] [--threads N] [--rate-limited CREDENTIAL]... [--retry-after-ms N] [--think-time-in-id]

  --listen ADDR            address to listen on (default 127.0.0.1:8090)
  --delay-ms N             latency of JSON answers and time to first frame of streams (default 0)
  --chunks N               content_block_delta frames per stream (default 10)
  --chunk-interval-ms N    pause between deltas (default 0)
  --input-tokens N         reported input tokens (default 12)
  --threads N              tokio worker threads (default: one per core)
  --rate-limited CRED      this credential answers every request with 429 (repeatable)
  --retry-after-ms N       retry-after-ms of those 429 answers (default 1000)
  --think-time-in-id       streams: end the message id with _think<ns>, the time this
                           simulator held the request before its first frames

Every credential is accepted; streams when the body has \"stream\": true.";

#[derive(Debug)]
struct Args {
    listen: SocketAddr,
    delay_ms: u64,
    chunks: u32,
    chunk_interval_ms: u64,
    input_tokens: u64,
    threads: Option<usize>,
    rate_limited: Vec<String>,
    retry_after_ms: u64,
    think_time_in_id: bool,
}

fn parse(mut args: impl Iterator<Item = String>) -> anyhow::Result<Option<Args>> {
    let mut out = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 8090)),
        delay_ms: 0,
        chunks: 10,
        chunk_interval_ms: 0,
        input_tokens: 12,
        threads: None,
        rate_limited: Vec::new(),
        retry_after_ms: 1000,
        think_time_in_id: false,
    };
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        if flag == "--think-time-in-id" {
            out.think_time_in_id = true;
            continue;
        }
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value\n\n{USAGE}"))?;
        let bad = || format!("invalid value {value:?} for {flag}\n\n{USAGE}");
        match flag.as_str() {
            "--listen" => out.listen = value.parse().with_context(bad)?,
            "--delay-ms" => out.delay_ms = value.parse().with_context(bad)?,
            "--chunks" => out.chunks = value.parse().with_context(bad)?,
            "--chunk-interval-ms" => out.chunk_interval_ms = value.parse().with_context(bad)?,
            "--input-tokens" => out.input_tokens = value.parse().with_context(bad)?,
            "--threads" => out.threads = Some(value.parse().with_context(bad)?),
            "--rate-limited" => out.rate_limited.push(value),
            "--retry-after-ms" => out.retry_after_ms = value.parse().with_context(bad)?,
            _ => bail!("unknown flag {flag:?}\n\n{USAGE}"),
        }
    }
    Ok(Some(out))
}

fn main() -> anyhow::Result<()> {
    let Some(args) = parse(std::env::args().skip(1))? else {
        // A closed stdout (`keypool-sim --help | head -1`) is not an error worth a panic.
        let _ = writeln!(std::io::stdout(), "{USAGE}");
        return Ok(());
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.threads {
        runtime.worker_threads(n.max(1));
    }
    let runtime = runtime
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let delay = Delay::Fixed(Duration::from_millis(args.delay_ms));
    let spec = OkSpec::default()
        .latency(delay)
        .ttft(delay)
        .chunks(args.chunks)
        .chunk_interval(Delay::ms(args.chunk_interval_ms))
        .think_time_in_id(args.think_time_in_id)
        .usage(Usage {
            input_tokens: args.input_tokens,
            output_tokens: u64::from(args.chunks),
            ..Usage::default()
        });
    let mut config = SimConfig::new()
        .listen(args.listen)
        .any_credential(Script::new(spec))
        .record_limit(0);
    let limited = ErrorReply::rate_limited().retry_after_ms(args.retry_after_ms);
    for (i, credential) in args.rate_limited.into_iter().enumerate() {
        let script = Script::new(limited.clone());
        config = config.account(format!("rate-limited-{i}"), credential, script);
    }
    let sim = Sim::start(config).await?;
    println!("keypool-sim listening on {}", sim.base_url());
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for ctrl-c")?;
    sim.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> anyhow::Result<Option<Args>> {
        parse(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_every_flag() {
        let a = args(&[
            "--listen",
            "127.0.0.1:9999",
            "--delay-ms",
            "5",
            "--chunks",
            "3",
            "--chunk-interval-ms",
            "2",
            "--input-tokens",
            "7",
            "--threads",
            "2",
            "--rate-limited",
            "sk-a",
            "--rate-limited",
            "sk-b",
            "--think-time-in-id",
            "--retry-after-ms",
            "3",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(a.listen, "127.0.0.1:9999".parse().unwrap());
        assert_eq!(
            (
                a.delay_ms,
                a.chunks,
                a.chunk_interval_ms,
                a.input_tokens,
                a.threads
            ),
            (5, 3, 2, 7, Some(2))
        );
        assert_eq!(a.rate_limited, ["sk-a", "sk-b"]);
        assert_eq!(a.retry_after_ms, 3);
        assert!(a.think_time_in_id);
        assert!(!args(&[]).unwrap().unwrap().think_time_in_id);
    }

    #[test]
    fn rejects_unknown_flags_and_bad_values() {
        assert!(
            args(&["--nope", "1"])
                .unwrap_err()
                .to_string()
                .contains("unknown flag")
        );
        assert!(
            args(&["--chunks", "many"])
                .unwrap_err()
                .to_string()
                .contains("invalid value")
        );
        assert!(
            args(&["--chunks"])
                .unwrap_err()
                .to_string()
                .contains("needs a value")
        );
        assert!(args(&["--help"]).unwrap().is_none());
    }
}
