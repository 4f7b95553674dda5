//! `[server]` (with `[server.rating]`): raw values → [`ServerSettings`], every problem
//! located at `server.<field>`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::{Issues, parse_named, resolve_secret};
use crate::config::raw::{RawRating, RawServer};
use crate::config::{
    RatingSettings, ServerSettings, StreamCommit, Threshold, TlsFiles, secs_to_ms,
};

/// The most serving threads `[server] workers` accepts.
const MAX_WORKERS: i64 = 1024;

/// Validates `[server]`; `None` when any of its values was refused (every problem is in
/// `issues`).
pub(super) fn validate_server(
    s: &RawServer,
    base_dir: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> Option<ServerSettings> {
    let before = issues.0.len();
    let mut out = ServerSettings::default();
    let mut r = Reader { issues };
    r.choices(s, &mut out);
    out.state_file = state_file(s, base_dir);
    r.listeners(s, base_dir, &mut out);
    out.redis_url = redis_url(s, env, r.issues);
    if out.config_store == crate::config::ConfigStore::Redis && s.redis_url.is_none() {
        r.issues.push(
            "server.config_store",
            "config_store = \"redis\" keeps the document in Redis: set redis_url (or REDIS_URL) too, or write config_store = \"file\"",
        );
    }
    out.rating = r.rating(&s.rating);
    r.limits(s, &mut out);
    r.intervals(s, &mut out);
    out.auto_disable_on_error = s.auto_disable_on_error.unwrap_or(out.auto_disable_on_error);
    out.circuit_breaker = s.circuit_breaker.unwrap_or(out.circuit_breaker);
    (issues.0.len() == before).then_some(out)
}

/// Reads `[server]` values against their defaults, pushing a located problem for each
/// value out of its range (and keeping the default for it).
struct Reader<'a> {
    issues: &'a mut Issues,
}

impl Reader<'_> {
    /// `None` → `default`, else `value × scale` for a positive value.
    fn positive(&mut self, v: Option<i64>, name: &str, default: u64, scale: u64) -> u64 {
        match v {
            None => default,
            Some(n) if n > 0 => u64::try_from(n).unwrap_or(u64::MAX).saturating_mul(scale),
            Some(n) => {
                self.issues.push(
                    format!("server.{name}"),
                    format!("{name} must be a positive whole number (got {n})"),
                );
                default
            }
        }
    }

    /// A value that may be 0: `None` → `default`, else `value × scale`; a negative value
    /// is a problem (`zero` says what 0 means).
    fn non_negative(
        &mut self,
        value: Option<i64>,
        name: &str,
        default: u64,
        scale: u64,
        zero: &str,
    ) -> u64 {
        match value {
            None => default,
            Some(n) if n >= 0 => u64::try_from(n).unwrap_or(0).saturating_mul(scale),
            Some(n) => {
                self.issues.push(
                    format!("server.{name}"),
                    format!("{name} must be ≥ 0 (got {n}); {zero}"),
                );
                default
            }
        }
    }

    /// A fraction in 0–1.
    fn fraction(&mut self, v: Option<f64>, name: &str, default: f64) -> f64 {
        match v {
            None => default,
            Some(x) if (0.0..=1.0).contains(&x) => x,
            Some(x) => {
                self.issues.push(
                    format!("server.{name}"),
                    format!("{name} {x} is outside 0–1"),
                );
                default
            }
        }
    }

    /// A rating weight: finite and ≥ 0.
    fn weight(&mut self, v: Option<f64>, name: &str, default: f64) -> f64 {
        match v {
            None => default,
            Some(x) if x.is_finite() && x >= 0.0 => x,
            Some(x) => {
                self.issues.push(
                    format!("server.rating.{name}"),
                    format!("{name} {x} must be a finite number ≥ 0"),
                );
                default
            }
        }
    }

    /// `listen`, `stream_commit`, `passthrough_statuses`, `legacy_routes_until`,
    /// `hedge_budget`, `default_window_threshold`.
    fn choices(&mut self, s: &RawServer, out: &mut ServerSettings) {
        let d = ServerSettings::default();
        if let Some(l) = &s.listen {
            match SocketAddr::from_str(l) {
                Ok(addr) => out.listen = addr,
                Err(_) => self.issues.push("server.listen", format!("{l:?} is not a socket address; write host:port, e.g. 127.0.0.1:8080 or [::]:8080")),
            }
        }
        if let Some(v) = s.stream_commit.as_deref()
            && let Some(commit) =
                parse_named::<StreamCommit>(v, "server.stream_commit", self.issues)
        {
            out.stream_commit = commit;
        }
        if let Some(v) = s.limits_fail_mode.as_deref()
            && let Some(mode) = parse_named(v, "server.limits_fail_mode", self.issues)
        {
            out.limits_fail_mode = mode;
        }
        if let Some(v) = s.config_store.as_deref()
            && let Some(store) = parse_named(v, "server.config_store", self.issues)
        {
            out.config_store = store;
        }
        if let Some(list) = &s.passthrough_statuses {
            out.passthrough_statuses = self.passthrough_statuses(list);
        }
        if let Some(v) = &s.legacy_routes_until {
            match parse_date_end(v) {
                Some(secs) => out.legacy_routes_until_unix_secs = secs,
                None => self.issues.push(
                    "server.legacy_routes_until",
                    "expected a date like 2026-12-31 (the last day legacy routes work, UTC)",
                ),
            }
        }
        out.hedge_budget = self.fraction(s.hedge_budget, "hedge_budget", d.hedge_budget);
        let threshold = d.default_window_threshold.get();
        out.default_window_threshold = Threshold(self.fraction(
            s.default_window_threshold,
            "default_window_threshold",
            threshold,
        ));
    }

    /// `admin_listen`, `tls_cert_file` and `tls_key_file` (relative paths are anchored
    /// at the config file's folder, like `state_file`).
    fn listeners(&mut self, s: &RawServer, base_dir: Option<&Path>, out: &mut ServerSettings) {
        if let Some(l) = &s.admin_listen {
            match SocketAddr::from_str(l) {
                Ok(addr) if addr == out.listen => self.issues.push(
                    "server.admin_listen",
                    format!("{l:?} is the same address as server.listen; give the admin listener its own port"),
                ),
                Ok(addr) => out.admin_listen = Some(addr),
                Err(_) => self.issues.push(
                    "server.admin_listen",
                    format!("{l:?} is not a socket address; write host:port, e.g. 127.0.0.1:9090"),
                ),
            }
        }
        let file = |v: &Option<String>| {
            v.as_deref()
                .filter(|f| !f.is_empty())
                .map(|f| anchor(PathBuf::from(f), base_dir))
        };
        match (file(&s.tls_cert_file), file(&s.tls_key_file)) {
            (Some(cert), Some(key)) => out.tls = Some(TlsFiles { cert, key }),
            (None, None) => {}
            (Some(_), None) => self.issues.push(
                "server.tls_key_file",
                "tls_cert_file is set but tls_key_file is not; TLS needs both (PEM files)",
            ),
            (None, Some(_)) => self.issues.push(
                "server.tls_cert_file",
                "tls_key_file is set but tls_cert_file is not; TLS needs both (PEM files)",
            ),
        }
    }

    fn passthrough_statuses(&mut self, list: &[i64]) -> Vec<u16> {
        list.iter()
            .enumerate()
            .filter_map(|(k, st)| {
                match u16::try_from(*st).ok().filter(|c| (400..=599).contains(c)) {
                    Some(c) => Some(c),
                    None => {
                        self.issues.push(
                            format!("server.passthrough_statuses[{k}]"),
                            format!("{st} is not an HTTP error status (400–599)"),
                        );
                        None
                    }
                }
            })
            .collect()
    }

    /// `[server.rating]`.
    fn rating(&mut self, r: &RawRating) -> RatingSettings {
        let d = RatingSettings::default();
        RatingSettings {
            ttft_weight: self.weight(r.ttft_weight, "ttft_weight", d.ttft_weight),
            total_weight: self.weight(r.total_weight, "total_weight", d.total_weight),
            error_weight: self.weight(r.error_weight, "error_weight", d.error_weight),
            max_sample_age_ms: self.positive(
                r.max_sample_age_secs,
                "rating.max_sample_age_secs",
                d.max_sample_age_ms,
                1000,
            ),
        }
    }

    /// Sizes and the timeouts of a request and its attempts.
    fn limits(&mut self, s: &RawServer, out: &mut ServerSettings) {
        let d = ServerSettings::default();
        out.max_body_bytes = self.positive(s.max_body_bytes, "max_body_bytes", d.max_body_bytes, 1);
        let in_flight_default = d.max_body_bytes_in_flight.max(out.max_body_bytes);
        out.max_body_bytes_in_flight = self.positive(
            s.max_body_bytes_in_flight,
            "max_body_bytes_in_flight",
            in_flight_default,
            1,
        );
        if out.max_body_bytes_in_flight < out.max_body_bytes {
            self.issues.push(
                "server.max_body_bytes_in_flight",
                format!(
                    "max_body_bytes_in_flight ({}) is smaller than max_body_bytes ({}): no body of the largest size could ever be accepted; raise it or lower max_body_bytes",
                    out.max_body_bytes_in_flight, out.max_body_bytes
                ),
            );
        }
        let frames = u64::from(d.commit_hold_max_frames);
        let frames = self.positive(
            s.commit_hold_max_frames,
            "commit_hold_max_frames",
            frames,
            1,
        );
        out.commit_hold_max_frames = u32::try_from(frames).unwrap_or(u32::MAX);
        out.body_read_timeout_ms = self.positive(
            s.body_read_timeout_secs,
            "body_read_timeout_secs",
            d.body_read_timeout_ms,
            1000,
        );
        out.max_response_body_bytes = self.positive(
            s.max_response_body_bytes,
            "max_response_body_bytes",
            d.max_response_body_bytes,
            1,
        );
        out.header_read_timeout_ms = self.positive(
            s.header_read_timeout_secs,
            "header_read_timeout_secs",
            d.header_read_timeout_ms,
            1000,
        );
        out.upstream_timeout_ms = self.positive(
            s.upstream_timeout_secs,
            "upstream_timeout_secs",
            d.upstream_timeout_ms,
            1000,
        );
        out.first_frame_timeout_ms = self.positive(
            s.first_frame_timeout_ms,
            "first_frame_timeout_ms",
            d.first_frame_timeout_ms,
            1,
        );
        out.stream_idle_timeout_ms = self.positive(
            s.stream_idle_timeout_secs,
            "stream_idle_timeout_secs",
            d.stream_idle_timeout_ms,
            1000,
        );
        out.stream_min_bytes_per_sec = self.non_negative(
            s.stream_min_bytes_per_sec,
            "stream_min_bytes_per_sec",
            d.stream_min_bytes_per_sec,
            1,
            "0 turns the slow-stream watchdog off",
        );
        out.stream_watchdog_warmup_ms = self.non_negative(
            s.stream_watchdog_warmup_ms,
            "stream_watchdog_warmup_ms",
            d.stream_watchdog_warmup_ms,
            1,
            "0 watches from the first byte",
        );
        out.stream_watchdog_window_ms = self.positive(
            s.stream_watchdog_window_ms,
            "stream_watchdog_window_ms",
            d.stream_watchdog_window_ms,
            1,
        );
        out.commit_hold_max_bytes = self.positive(
            s.commit_hold_max_bytes,
            "commit_hold_max_bytes",
            d.commit_hold_max_bytes,
            1,
        );
        out.max_frame_bytes =
            self.positive(s.max_frame_bytes, "max_frame_bytes", d.max_frame_bytes, 1);
    }

    /// Caching, persistence, Redis, hedging, draining, affinity, queue and threads.
    fn intervals(&mut self, s: &RawServer, out: &mut ServerSettings) {
        let d = ServerSettings::default();
        out.snapshot_ttl_ms = match s.snapshot_ttl_secs {
            None => d.snapshot_ttl_ms,
            Some(n) if n >= 0 => secs_to_ms(u64::try_from(n).unwrap_or(0)),
            Some(n) => {
                self.issues.push("server.snapshot_ttl_secs", format!("snapshot_ttl_secs must be ≥ 0 (got {n}); 0 rebuilds the snapshot on every request"));
                d.snapshot_ttl_ms
            }
        };
        out.state_snapshot_interval_ms = self.positive(
            s.state_snapshot_interval_secs,
            "state_snapshot_interval_secs",
            d.state_snapshot_interval_ms,
            1000,
        );
        out.redis_timeout_ms = self.positive(
            s.redis_timeout_ms,
            "redis_timeout_ms",
            d.redis_timeout_ms,
            1,
        );
        out.hedge_min_delay_ms = match s.hedge_min_delay_ms {
            None => d.hedge_min_delay_ms,
            Some(n) if n >= 0 => u64::try_from(n).unwrap_or(0),
            Some(n) => {
                self.issues.push(
                    "server.hedge_min_delay_ms",
                    format!("hedge_min_delay_ms must be ≥ 0 (got {n})"),
                );
                d.hedge_min_delay_ms
            }
        };
        out.shutdown_grace_ms = self.positive(
            s.shutdown_grace_secs,
            "shutdown_grace_secs",
            d.shutdown_grace_ms,
            1000,
        );
        out.session_affinity_ttl_ms = self.non_negative(
            s.session_affinity_ttl_secs,
            "session_affinity_ttl_secs",
            d.session_affinity_ttl_ms,
            1000,
            "0 turns session affinity off",
        );
        out.queue_max_wait_ms = self.non_negative(
            s.queue_max_wait_ms,
            "queue_max_wait_ms",
            d.queue_max_wait_ms,
            1,
            "0 answers 429 at once when every account is at its max_concurrent",
        );
        let depth = self.non_negative(
            s.queue_max_depth,
            "queue_max_depth",
            u64::from(d.queue_max_depth),
            1,
            "0 means unbounded",
        );
        out.queue_max_depth = u32::try_from(depth).unwrap_or(u32::MAX);
        out.workers = match s.workers {
            None => d.workers,
            Some(n @ 0..=MAX_WORKERS) => u32::try_from(n).unwrap_or(0),
            Some(n) => {
                self.issues.push(
                    "server.workers",
                    format!(
                        "workers must be between 0 and {MAX_WORKERS} (got {n}); 0 starts one per CPU"
                    ),
                );
                d.workers
            }
        };
    }
}

/// `state_file`: relative to the config file's folder; the default sits next to the
/// config file, and a config given as text (tests, embedders) has no folder and so no
/// default state file; `""` keeps state in memory only.
fn state_file(s: &RawServer, base_dir: Option<&Path>) -> Option<PathBuf> {
    match s.state_file.as_deref() {
        None => base_dir
            .and(ServerSettings::default().state_file)
            .map(|f| anchor(f, base_dir)),
        Some("") => None,
        Some(f) => Some(anchor(PathBuf::from(f), base_dir)),
    }
}

/// `redis_url`, a secret (`$ENV_NAME`, or literal when it came from `REDIS_URL`).
fn redis_url(
    s: &RawServer,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> Option<crate::config::Secret> {
    let u = s.redis_url.as_deref()?;
    let secret = resolve_secret(u, s.redis_url_from_env, "server.redis_url", env, issues)?;
    match crate::state::redis::redis_target(secret.expose()).map(drop) {
        Ok(_) => Some(secret),
        Err(problem) => {
            issues.push("server.redis_url", problem);
            None
        }
    }
}

fn anchor(path: PathBuf, base_dir: Option<&Path>) -> PathBuf {
    match base_dir {
        Some(dir) if path.is_relative() && !dir.as_os_str().is_empty() => dir.join(path),
        _ => path,
    }
}

/// `2026-12-31` (TOML date or string) → unix seconds of `2026-12-31T23:59:59Z`.
fn parse_date_end(v: &toml::Value) -> Option<u64> {
    let text = match v {
        toml::Value::Datetime(d) if d.time.is_none() && d.offset.is_none() => d.to_string(),
        toml::Value::String(s) => s.clone(),
        _ => return None,
    };
    let mut parts = text.splitn(3, '-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: u32 = parts.next()?.parse().ok()?;
    let d: u32 = parts.next()?.parse().ok()?;
    let days_in_month = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => return None,
    };
    if !(1970..=9999).contains(&y) || d == 0 || d > days_in_month {
        return None;
    }
    u64::try_from(keypool_core::UtcDateTime::days_from_civil(y, m, d) * 86_400 + 86_399).ok()
}
