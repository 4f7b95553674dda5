//! `keypool demo`: one process, no config file, no Redis, nothing beyond 127.0.0.1.
//!
//! It starts `keypool-sim` with six accounts of distinct characters ([`pool`]), serves
//! the proxy on an embedded configuration (memory state only), drives mixed streaming
//! and non-streaming traffic ([`traffic`]) while a table shows what happens, and prints
//! a summary built from keypool's own books (metrics, cooldowns, disabled accounts,
//! windows) and the simulator's counters.

mod pool;
mod traffic;

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use keypool_core::{AccountId, Strategy, UnixMs};
use keypool_ledger::{DEFAULT_PRICES_DATE, Day, Dimension, NanoUsd, Period, Totals};
use keypool_proxy::{App, run};
use keypool_sim::{Sim, SimHandle};
use keypool_store::config::Config;
use keypool_store::{Store, now_ms};
use rand::SeedableRng;
use serde_json::json;

use self::pool::{ACCOUNTS, CALLERS, ORG, URL};
use self::traffic::{Traffic, quantile};

/// What `keypool demo` was asked to do.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// How long traffic runs.
    pub duration: Duration,
    /// Requests per second.
    pub rps: u32,
    /// The pool's strategy.
    pub strategy: Strategy,
    /// Print the summary as JSON on stdout (the human summary goes to stderr).
    pub json: bool,
    /// Keep serving after the summary until Ctrl-C (to look at `/admin/ui`).
    pub keep_running: bool,
}

/// Parses `20`, `20s`, `1500ms`, `2m` into a duration.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = match t.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: write e.g. 20s, 1500ms or 2m"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("{text:?}: the unit must be ms, s or m")),
    };
    if !(secs > 0.0 && secs <= 24.0 * 3600.0) {
        return Err(format!(
            "{text:?}: the duration must be above 0 and at most 24 h"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Runs the demo; the summary goes to stdout, the live table to stderr.
pub fn execute(options: &DemoOptions) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(demo(options))
}

/// Everything the demo started.
struct Running {
    sim: SimHandle,
    app: App,
    base_url: String,
    /// Each of [`CALLERS`]' LB key, in order.
    keys: Vec<String>,
    admin_token: String,
}

async fn start(
    options: &DemoOptions,
) -> anyhow::Result<(
    Running,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), keypool_proxy::ProxyError>>,
)> {
    let now_s = now_ms() / 1000;
    let sim = Sim::start(pool::sim_config(now_s))
        .await
        .context("cannot start the simulated upstream on 127.0.0.1")?;
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let keys = CALLERS.map(|_| keypool_store::keys::generate_lb_key(&mut rng));
    let admin_token = keypool_store::keys::generate_lb_key(&mut rng)
        .key
        .replacen("sk-lb-", "admin-", 1);
    let toml = pool::config_toml(
        &sim.base_url(),
        options.strategy,
        &keys.each_ref().map(|k| k.config_line()),
        &admin_token,
    );
    let config = Config::from_toml_str(&toml, None, &|_| None)
        .map_err(|e| anyhow::anyhow!("the demo's embedded configuration is invalid: {e}"))?;
    let store = Store::open(config)
        .await
        .context("cannot open the in-memory state")?;
    let app = App::new(store);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot listen on 127.0.0.1")?;
    let addr = listener
        .local_addr()
        .context("cannot read the listen address")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(run(listener, app.clone(), async move {
        let _ = stopped.await;
    }));
    Ok((
        Running {
            sim,
            app,
            base_url: format!("http://{addr}"),
            keys: keys.into_iter().map(|k| k.key).collect(),
            admin_token,
        },
        stop,
        server,
    ))
}

async fn demo(options: &DemoOptions) -> anyhow::Result<()> {
    let (running, stop, server) = start(options).await?;
    let traffic = Arc::new(Traffic::default());
    let started = Instant::now();
    let deadline = started + options.duration;
    let url = format!("{}/{ORG}/{URL}/v1/messages", running.base_url);
    let driver = tokio::spawn(traffic::drive(
        url,
        running.keys.clone(),
        options.rps,
        deadline,
        traffic.clone(),
    ));
    let tty = std::io::stderr().is_terminal();
    let mut stderr = std::io::stderr();
    let _ = writeln!(
        stderr,
        "keypool demo: {} simulated accounts, {} requests/s for {:.0?}, strategy {}\n",
        ACCOUNTS.len(),
        options.rps,
        options.duration,
        options.strategy.as_str()
    );
    let mut drawn_lines = 0usize;
    let refresh = if tty {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(2)
    };
    let mut tick = tokio::time::interval(refresh);
    tick.tick().await;
    let mut driver = driver;
    let mut finished = false;
    while !finished {
        tokio::select! {
            _ = tick.tick() => {}
            result = &mut driver => {
                result.context("the traffic driver failed")?;
                // One last frame with the final counts.
                finished = true;
            }
        }
        let elapsed = started.elapsed().min(options.duration);
        if tty {
            let table = live_table(&running, &traffic, elapsed, options.duration);
            if drawn_lines > 0 {
                let _ = write!(stderr, "\x1b[{drawn_lines}A\x1b[J");
            }
            drawn_lines = table.lines().count();
            let _ = write!(stderr, "{table}");
        } else {
            let _ = writeln!(stderr, "{}", progress_line(&running, &traffic, elapsed));
        }
        let _ = stderr.flush();
    }
    let callers = running
        .app
        .store()
        .usage_rows(Period::Day(Day::of(now_ms())), Dimension::Caller)
        .await
        .rows;
    let report = Report::gather(&running, &traffic, started.elapsed(), options, callers);
    if options.json {
        let _ = writeln!(stderr, "\n{}", report.human());
        println!("{}", report.json());
    } else {
        println!("\n{}", report.human());
    }
    if options.keep_running {
        eprintln!(
            "\nkeypool keeps serving at {} (status page: {}/admin/ui#token={}); Ctrl-C stops it.\n{}",
            running.base_url,
            running.base_url,
            running.admin_token,
            try_it(&running.base_url, &running.keys[0])
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    let _ = stop.send(());
    let _ = server.await;
    running.sim.shutdown().await;
    Ok(())
}

/// The `curl` command that sends one message to the running demo (`--keep-running`).
fn try_it(base_url: &str, key: &str) -> String {
    format!(
        "Try it (another terminal):\n  curl {base_url}/{}/{}/v1/messages -H 'x-api-key: {key}' \\\n    -H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' \\\n    -d '{{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":64,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}]}}'",
        pool::ORG,
        pool::URL
    )
}

/// An account's state in keypool's books at `now`, with the reason.
fn account_state(store: &Store, id: &AccountId, now: UnixMs) -> (&'static str, String) {
    let health = store.health();
    if let Some(d) = health.disabled.get(id) {
        return ("disabled", d.reason);
    }
    if let Some(out) = store.out_of_window(id, now) {
        return (
            "out_of_window",
            format!(
                "{} window, back in {}",
                out.limit.as_str(),
                human_duration(out.until.saturating_sub(now))
            ),
        );
    }
    if let Some(e) = health.cooldowns.entry(id).filter(|e| e.until > now) {
        return (
            "cooling",
            format!(
                "{} more ({})",
                human_duration(e.until - now),
                e.trigger.as_str()
            ),
        );
    }
    ("active", String::new())
}

/// `$0.0123`: nano-USD to four decimals, for the summary.
fn dollars(nano: NanoUsd) -> String {
    format!("${:.4}", nano as f64 / 1e9)
}

fn human_duration(ms: u64) -> String {
    let s = ms.div_ceil(1000);
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn progress_line(running: &Running, traffic: &Traffic, elapsed: Duration) -> String {
    let metrics = running.app.metrics();
    let (_, attempts) = metrics.attempt_totals();
    let failovers: u64 = metrics.failover_counts().iter().map(|(_, n)| n).sum();
    let mut line = format!(
        "[{:>5.1}s] requests {} ok {} failovers {} attempts {} |",
        elapsed.as_secs_f64(),
        traffic.sent.load(Ordering::Relaxed),
        traffic.ok.load(Ordering::Relaxed),
        failovers,
        attempts
    );
    let now = now_ms();
    for a in &ACCOUNTS {
        let id = AccountId::from(a.id);
        let (state, _) = account_state(running.app.store(), &id, now);
        let _ = write!(line, " {}={}({})", a.id, metrics.served(&id), state);
    }
    line
}

fn live_table(running: &Running, traffic: &Traffic, elapsed: Duration, total: Duration) -> String {
    let metrics = running.app.metrics();
    let sent = traffic.sent.load(Ordering::Relaxed);
    let ok = traffic.ok.load(Ordering::Relaxed);
    let done = traffic.done.load(Ordering::Relaxed);
    let failovers: u64 = metrics.failover_counts().iter().map(|(_, n)| n).sum();
    let width = 30usize;
    let filled = ((elapsed.as_secs_f64() / total.as_secs_f64()) * width as f64) as usize;
    let mut t = format!(
        "[{}{}] {:>5.1}s / {:.0}s   requests {sent}   ok {ok} ({:.1} %)   failovers {failovers}   in flight {}\n\n",
        "#".repeat(filled.min(width)),
        "-".repeat(width - filled.min(width)),
        elapsed.as_secs_f64(),
        total.as_secs_f64(),
        if done == 0 {
            100.0
        } else {
            ok as f64 * 100.0 / done as f64
        },
        traffic.in_flight(),
    );
    t.push_str(&account_table(&account_facts(running), true));
    t
}

/// Every demo account's facts now: keypool's books and the simulator's counters.
fn account_facts(running: &Running) -> Vec<AccountFacts> {
    let metrics = running.app.metrics();
    let now = now_ms();
    ACCOUNTS
        .iter()
        .map(|a| {
            let id = AccountId::from(a.id);
            let stats = running.sim.stats(a.id).unwrap_or_default();
            let (state, why) = account_state(running.app.store(), &id, now);
            AccountFacts {
                id: a.id,
                character: a.character,
                served: metrics.served(&id),
                calls: stats.requests,
                calls_after_first_answer: stats.requests.saturating_sub(stats.peak_in_flight),
                state,
                why,
            }
        })
        .collect()
}

/// The per-account table of the live view and the summary: who served what, its share,
/// upstream calls and state (coloured on a terminal).
fn account_table(rows: &[AccountFacts], colour: bool) -> String {
    let total: u64 = rows.iter().map(|a| a.served).sum();
    let mut t = format!(
        "  {:<10} {:<38} {:>6} {:>6} {:>6}  state\n",
        "account", "character", "served", "share", "calls"
    );
    for a in rows {
        let (on, off) = match (colour, a.state) {
            (false, _) => ("", ""),
            (true, "active") => ("\x1b[32m", "\x1b[0m"),
            (true, "cooling") => ("\x1b[33m", "\x1b[0m"),
            (true, "out_of_window") => ("\x1b[35m", "\x1b[0m"),
            (true, _) => ("\x1b[31m", "\x1b[0m"),
        };
        let share = if total == 0 {
            0.0
        } else {
            a.served as f64 * 100.0 / total as f64
        };
        let why = if a.why.is_empty() {
            String::new()
        } else {
            format!(": {}", a.why)
        };
        let _ = writeln!(
            t,
            "  {:<10} {:<38} {:>6} {:>5.1}% {:>6}  {on}{}{off}{why}",
            a.id, a.character, a.served, share, a.calls, a.state
        );
    }
    t
}

/// The facts of the summary.
struct Report {
    elapsed: Duration,
    traffic: Duration,
    rps: u32,
    requests: u64,
    succeeded: u64,
    statuses: Vec<(u16, u64)>,
    streamed: u64,
    attempts: u64,
    failovers: Vec<((&'static str, &'static str), u64)>,
    ttft_p50: Option<Duration>,
    ttft_p99: Option<Duration>,
    accounts: Vec<AccountFacts>,
    /// Today's usage per caller, from keypool's ledger.
    callers: Vec<(Arc<str>, Totals)>,
    base_url: String,
    key: String,
    admin_url: String,
}

struct AccountFacts {
    id: &'static str,
    character: &'static str,
    served: u64,
    calls: u64,
    /// Upstream calls that started after another call of the account had been answered:
    /// `requests - peak_in_flight` (zero exactly when every call overlapped the first).
    calls_after_first_answer: u64,
    state: &'static str,
    why: String,
}

impl Report {
    fn gather(
        running: &Running,
        traffic: &Traffic,
        elapsed: Duration,
        options: &DemoOptions,
        callers: Vec<(Arc<str>, Arc<str>, Totals)>,
    ) -> Self {
        let metrics = running.app.metrics();
        let outcomes = traffic.outcomes();
        let mut statuses = std::collections::BTreeMap::new();
        for o in &outcomes {
            *statuses.entry(o.status).or_insert(0u64) += 1;
        }
        let mut ttfts: Vec<Duration> = outcomes.iter().filter_map(|o| o.ttft).collect();
        let accounts = account_facts(running);
        Self {
            elapsed,
            traffic: options.duration,
            rps: options.rps,
            requests: outcomes.len() as u64,
            succeeded: outcomes
                .iter()
                .filter(|o| (200..300).contains(&o.status))
                .count() as u64,
            statuses: statuses.into_iter().collect(),
            streamed: outcomes.iter().filter(|o| o.stream).count() as u64,
            attempts: metrics.attempt_totals().1,
            failovers: metrics.failover_counts(),
            ttft_p50: quantile(&mut ttfts, 0.5),
            ttft_p99: quantile(&mut ttfts, 0.99),
            accounts,
            callers: callers.into_iter().map(|(_, id, t)| (id, t)).collect(),
            base_url: format!("{}/{ORG}/{URL}", running.base_url),
            key: running.keys[0].clone(),
            admin_url: format!(
                "{}/admin/ui#token={}",
                running.base_url, running.admin_token
            ),
        }
    }

    fn success_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.succeeded as f64 * 100.0 / self.requests as f64
        }
    }

    fn attempts_per_request(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.attempts as f64 / self.requests as f64
        }
    }

    fn human(&self) -> String {
        let ms =
            |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{} ms", d.as_millis()));
        let mut t = String::new();
        let _ = writeln!(
            t,
            "Summary: {} requests over {:.1} s of traffic ({} per second asked; the last answer \
             came after {:.1} s), {} streamed",
            self.requests,
            self.traffic.as_secs_f64(),
            self.rps,
            self.elapsed.as_secs_f64(),
            self.streamed
        );
        let others: Vec<String> = self
            .statuses
            .iter()
            .filter(|(s, _)| !(200..300).contains(s))
            .map(|(s, n)| {
                if *s == 0 {
                    format!("{n} without answer")
                } else {
                    format!("{n} answered {s}")
                }
            })
            .collect();
        let _ = writeln!(
            t,
            "  success rate        {:.1} % ({} of {}{})",
            self.success_rate(),
            self.succeeded,
            self.requests,
            if others.is_empty() {
                String::new()
            } else {
                format!("; {}", others.join(", "))
            }
        );
        let failovers: Vec<String> = self
            .failovers
            .iter()
            .map(|((class, trigger), n)| format!("{n} {trigger} ({class})"))
            .collect();
        let _ = writeln!(
            t,
            "  attempts/request    {:.2} ({} upstream attempts; failed over on {})",
            self.attempts_per_request(),
            self.attempts,
            if failovers.is_empty() {
                "nothing".to_owned()
            } else {
                failovers.join(", ")
            }
        );
        let _ = writeln!(
            t,
            "  TTFT of streams     p50 {}, p99 {}",
            ms(self.ttft_p50),
            ms(self.ttft_p99)
        );
        t.push('\n');
        t.push_str(&account_table(&self.accounts, false));
        self.why_out_of_rotation(&mut t);
        self.usage_by_caller(&mut t);
        let _ = writeln!(
            t,
            "\nPoint Claude Code or an Anthropic SDK at keypool with these two variables (this\n\
             demo's values, alive with --keep-running; for your own keypool use its address,\n\
             /{{org}}/{{custom_url}} and a key from `keypool keygen`):\n\n  \
             ANTHROPIC_BASE_URL={}\n  ANTHROPIC_API_KEY={}",
            self.base_url, self.key
        );
        t
    }

    /// Today's tokens and cost per caller, from keypool's ledger (`GET /admin/usage`).
    fn usage_by_caller(&self, t: &mut String) {
        let _ = writeln!(
            t,
            "\n  Usage by caller today (GET /admin/usage; list prices of {DEFAULT_PRICES_DATE}):\n  \
             {:<8} {:>8} {:>8} {:>8} {:>11} {:>10} {:>12}",
            "caller", "requests", "input", "output", "cache read", "cost", "of which sub."
        );
        for (id, u) in &self.callers {
            let _ = writeln!(
                t,
                "  {:<8} {:>8} {:>8} {:>8} {:>11} {:>10} {:>12}",
                id,
                u.requests,
                u.input_tokens,
                u.output_tokens,
                u.cache_read_input_tokens,
                dollars(u.cost_nano_usd),
                dollars(u.list_price_equivalent_nano_usd),
            );
        }
        let _ = writeln!(
            t,
            "  (\"of which sub.\": the list-price equivalent of what OAuth subscription accounts served)"
        );
    }

    /// One line per account that is not active, saying why.
    fn why_out_of_rotation(&self, t: &mut String) {
        let _ = writeln!(t, "\n  Why accounts are out of rotation:");
        for a in self.accounts.iter().filter(|a| a.state != "active") {
            let line = match a.state {
                "disabled" => format!(
                    "{} is disabled until an operator re-enables it ({})",
                    a.id, a.why
                ),
                "out_of_window" => format!(
                    "{} is out of its usage window ({}); called {} time(s), {} after its first answer",
                    a.id, a.why, a.calls, a.calls_after_first_answer
                ),
                _ => format!("{} is cooling down: {}", a.id, a.why),
            };
            let _ = writeln!(t, "    - {line}");
        }
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "requests": self.requests,
            "succeeded": self.succeeded,
            "success_rate": self.success_rate(),
            "statuses": self.statuses.iter().map(|(s, n)| json!({"status": s, "count": n})).collect::<Vec<_>>(),
            "streamed": self.streamed,
            "attempts": self.attempts,
            "attempts_per_request": self.attempts_per_request(),
            "failovers": self.failovers.iter().map(|((c, t), n)| json!({"class": c, "trigger": t, "count": n})).collect::<Vec<_>>(),
            "ttft_p50_ms": self.ttft_p50.map(|d| d.as_millis() as u64),
            "ttft_p99_ms": self.ttft_p99.map(|d| d.as_millis() as u64),
            "accounts": self.accounts.iter().map(|a| json!({
                "id": a.id,
                "character": a.character,
                "served": a.served,
                "upstream_calls": a.calls,
                "calls_after_first_answer": a.calls_after_first_answer,
                "state": a.state,
                "reason": a.why,
            })).collect::<Vec<_>>(),
            "callers": self.callers.iter().map(|(id, u)| json!({
                "id": id,
                "requests": u.requests,
                "errors": u.errors,
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "cache_creation_input_tokens": u.cache_creation_input_tokens,
                "cache_read_input_tokens": u.cache_read_input_tokens,
                "cost_nano_usd": u.cost_nano_usd,
                "list_price_equivalent_nano_usd": u.list_price_equivalent_nano_usd,
            })).collect::<Vec<_>>(),
            "anthropic_base_url": self.base_url,
            "admin_ui": self.admin_url,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5h").is_err());
        assert_eq!(human_duration(59_001), "1m 00s");
        assert_eq!(human_duration(3 * 3_600_000 + 17 * 60_000), "3h 17m");
    }
}
