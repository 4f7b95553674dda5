//! Series about keypool itself rather than its traffic: `keypool_build_info`, config
//! reload outcomes, and the requests to its own routes (health checks, scrapes, the
//! admin API, `HEAD` preflights, unknown paths), which are kept out of
//! `keypool_requests_total` so that probes and scrapes do not inflate it.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use keypool_store::Store;

use super::{Metrics, escape, with_value};

/// What `keypool_build_info` says: the version and the git commit of the binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildInfo {
    /// The crate version (`0.1.0`).
    pub version: String,
    /// The git commit the binary was built from, or `unknown`.
    pub commit: String,
}

impl Default for BuildInfo {
    fn default() -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            commit: "unknown".to_owned(),
        }
    }
}

/// Which of keypool's own routes a request went to: the `route` label of
/// `keypool_internal_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InternalRoute {
    /// `GET /healthz`.
    Healthz,
    /// `GET /readyz`.
    Readyz,
    /// `GET /metrics`.
    Metrics,
    /// `/admin/…` (API and status page).
    Admin,
    /// `HEAD` on any path (the clients' preflight).
    Head,
    /// Any other path or method that is not a Messages route.
    Other,
}

impl InternalRoute {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthz => "healthz",
            Self::Readyz => "readyz",
            Self::Metrics => "metrics",
            Self::Admin => "admin",
            Self::Head => "head",
            Self::Other => "other",
        }
    }
}

impl Metrics {
    /// Sets what `keypool_build_info` reports (the binary calls it at start; without
    /// it the commit is `unknown`).
    pub fn set_build_info(&self, build: BuildInfo) {
        let _ = self.build.set(build);
    }

    /// One answered request to one of keypool's own routes.
    pub fn internal_request(&self, route: InternalRoute, status: u16) {
        let key = (route, status);
        with_value(&self.internal_requests, &key, || key, super::increment);
    }

    /// `keypool_build_info`, `keypool_config_reloads_total`,
    /// `keypool_config_last_reload_success_timestamp_seconds`,
    /// `keypool_config_document_version` (with the Redis document),
    /// `keypool_internal_requests_total` and the `process_*` series.
    pub(super) fn render_operations(&self, out: &mut String, store: &Store) {
        let default = BuildInfo::default();
        let build = self.build.get().unwrap_or(&default);
        let _ = writeln!(
            out,
            "# HELP keypool_build_info The running binary: version and git commit (always 1).\n# TYPE keypool_build_info gauge\nkeypool_build_info{{version=\"{}\",commit=\"{}\"}} 1",
            escape(&build.version),
            escape(&build.commit)
        );
        let reloads = store.reload_outcomes();
        super::counter_family(
            out,
            "keypool_config_reloads_total",
            "Config file reloads (SIGHUP, POST /admin/reload), by outcome: applied, or rejected (the old configuration kept serving).",
            "outcome",
            [("applied", reloads.applied), ("rejected", reloads.rejected)],
        );
        let _ = writeln!(
            out,
            "# HELP keypool_config_last_reload_success_timestamp_seconds When the configuration was last loaded successfully (unix seconds): at start, or the last applied reload.\n# TYPE keypool_config_last_reload_success_timestamp_seconds gauge\nkeypool_config_last_reload_success_timestamp_seconds {}",
            reloads
                .last_applied_at
                .map_or_else(super::process::start_time_secs, |ms| ms as f64 / 1000.0)
        );
        if let Some(version) = store.document_status().version {
            let _ = writeln!(
                out,
                "# HELP keypool_config_document_version The version of the config document in Redis this replica serves (config_store = \"redis\"); replicas that disagree for more than a few seconds are not following it.\n# TYPE keypool_config_document_version gauge\nkeypool_config_document_version {version}"
            );
        }
        out.push_str("# HELP keypool_internal_requests_total Requests to keypool's own routes (health checks, scrapes, admin API and status page, HEAD preflights, unknown paths), by route and status; not counted in keypool_requests_total.\n# TYPE keypool_internal_requests_total counter\n");
        let mut rows: Vec<_> = self
            .internal_requests
            .iter()
            .map(|e| (*e.key(), e.value().load(Ordering::Relaxed)))
            .collect();
        rows.sort();
        for ((route, status), n) in rows {
            let _ = writeln!(
                out,
                "keypool_internal_requests_total{{route=\"{}\",status=\"{status}\"}} {n}",
                route.as_str()
            );
        }
        super::process::render(out);
    }
}
