//! The TOML file as written: one `serde` struct per table, every field optional where the
//! schema has a default. Nothing here is validated; [`super::validate`] turns these into
//! the checked types of [`super`].
//!
//! Every struct denies unknown fields. Validation deserialises each table element on its
//! own so that one bad element does not hide the problems of the others, and names every
//! unknown key with its location (see [`field_names`]).

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Visitor};

/// The whole file. Validation reads the array sections element by element, so their
/// fields here serve to name the sections (see [`field_names`]).
#[allow(dead_code)]
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub admin: RawAdmin,
    #[serde(default)]
    pub cooldown: keypool_cooldown::CooldownSettings,
    #[serde(default)]
    pub orgs: Vec<RawOrg>,
    #[serde(default)]
    pub accounts: Vec<RawAccount>,
    #[serde(default)]
    pub groups: Vec<RawGroup>,
    #[serde(default)]
    pub urls: Vec<RawUrl>,
    #[serde(default)]
    pub keys: Vec<RawKey>,
    #[serde(default)]
    pub prices: Vec<RawPrice>,
    #[serde(default)]
    pub restate: Vec<keypool_cooldown::RestateRule>,
    #[serde(default)]
    pub models: Vec<RawModel>,
    #[serde(default)]
    pub usage: RawUsage,
    #[serde(default)]
    pub oauth: RawOAuth,
    pub alerts: RawAlerts,
}

/// `[alerts]`; its `[[alerts.webhooks]]` are read element by element on their own.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAlerts {
    pub dedup_secs: Option<i64>,
    pub retry_initial_ms: Option<i64>,
    pub max_attempts: Option<i64>,
    pub pool_unavailable_secs: Option<i64>,
    #[serde(skip)]
    pub webhooks: Vec<(usize, RawWebhook)>,
}

/// One `[[alerts.webhooks]]` element.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWebhook {
    pub url: String,
    pub name: Option<String>,
    pub format: Option<String>,
    pub events: Option<Vec<String>>,
    pub timeout_ms: Option<i64>,
}

/// One `[[models]]` element (issue 24): an alias with its chain, or a plain model glob
/// with its fallback.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawModel {
    pub alias: Option<String>,
    pub chain: Option<Vec<String>>,
    pub weights: Option<Vec<u32>>,
    pub model: Option<String>,
    pub fallback: Option<Vec<String>>,
}

/// One `[[prices]]` element: a model glob and USD per million tokens of each kind.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrice {
    pub model: String,
    pub input: f64,
    pub output: f64,
    pub cache_write: Option<f64>,
    pub cache_read: Option<f64>,
}

/// `[oauth]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOAuth {
    pub token_url: Option<String>,
    pub client_id: Option<String>,
    pub refresh_lead_secs: Option<i64>,
    pub refresh_timeout_ms: Option<i64>,
    pub authorize_url: Option<String>,
    pub redirect_uri: Option<String>,
    pub scopes: Option<String>,
}

/// `[usage]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUsage {
    pub recent_requests: Option<i64>,
    pub retention_days: Option<i64>,
    pub default_prices: Option<bool>,
}

/// `[server]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub listen: Option<String>,
    pub max_body_bytes: Option<i64>,
    pub body_read_timeout_secs: Option<i64>,
    pub max_body_bytes_in_flight: Option<i64>,
    pub max_response_body_bytes: Option<i64>,
    pub header_read_timeout_secs: Option<i64>,
    pub upstream_timeout_secs: Option<i64>,
    pub first_frame_timeout_ms: Option<i64>,
    pub stream_idle_timeout_secs: Option<i64>,
    pub stream_commit: Option<String>,
    pub commit_hold_max_frames: Option<i64>,
    pub commit_hold_max_bytes: Option<i64>,
    pub max_frame_bytes: Option<i64>,
    pub passthrough_statuses: Option<Vec<i64>>,
    pub auto_disable_on_error: Option<bool>,
    pub legacy_routes_until: Option<toml::Value>,
    pub snapshot_ttl_secs: Option<i64>,
    pub state_file: Option<String>,
    pub state_snapshot_interval_secs: Option<i64>,
    pub redis_url: Option<String>,
    /// Set when `redis_url` came from `REDIS_URL`: taken literally, not as `$ENV_NAME`.
    #[serde(skip)]
    pub redis_url_from_env: bool,
    pub redis_timeout_ms: Option<i64>,
    pub limits_fail_mode: Option<String>,
    pub config_store: Option<String>,
    pub hedge_min_delay_ms: Option<i64>,
    pub stream_min_bytes_per_sec: Option<i64>,
    pub stream_watchdog_warmup_ms: Option<i64>,
    pub stream_watchdog_window_ms: Option<i64>,
    pub hedge_budget: Option<f64>,
    pub default_window_threshold: Option<f64>,
    pub circuit_breaker: Option<bool>,
    pub shutdown_grace_secs: Option<i64>,
    pub session_affinity_ttl_secs: Option<i64>,
    pub queue_max_wait_ms: Option<i64>,
    pub queue_max_depth: Option<i64>,
    pub workers: Option<i64>,
    pub admin_listen: Option<String>,
    pub tls_cert_file: Option<String>,
    pub tls_key_file: Option<String>,
    #[serde(default)]
    pub rating: RawRating,
}

/// `[server.rating]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRating {
    pub ttft_weight: Option<f64>,
    pub total_weight: Option<f64>,
    pub error_weight: Option<f64>,
    pub max_sample_age_secs: Option<i64>,
}

/// `[admin]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub token: Option<String>,
    /// Set when `token` came from `KEYPOOL_ADMIN_TOKEN`: taken literally.
    #[serde(skip)]
    pub token_from_env: bool,
}

/// One `[[orgs]]` element.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOrg {
    pub slug: String,
    #[serde(default)]
    pub suspended: bool,
    /// `[orgs.limits]`, read on its own (for its own locations) by the element reader.
    #[serde(skip)]
    pub limits: Option<RawLimits>,
}

/// `[keys.limits]` and `[orgs.limits]` (SPEC 12).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub models: Option<Vec<String>>,
    pub deny_models: Option<Vec<String>>,
    pub requests_per_minute: Option<i64>,
    pub burst: Option<i64>,
    pub max_concurrent: Option<i64>,
    pub tokens_per_day: Option<i64>,
    pub tokens_per_month: Option<i64>,
    pub usd_per_day: Option<f64>,
    pub usd_per_month: Option<f64>,
}

/// One `[[accounts]]` element.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAccount {
    pub id: String,
    pub org: String,
    pub provider: String,
    pub auth: String,
    pub secret: String,
    pub base_url: Option<String>,
    #[serde(default)]
    pub priority: i64,
    pub weight: Option<i64>,
    pub model: Option<String>,
    pub window_threshold: Option<f64>,
    pub max_concurrent: Option<i64>,
    pub active: Option<bool>,
    pub proxy_url: Option<String>,
    pub refresh_token: Option<String>,
    pub expires_at: Option<i64>,
}

/// One `[[groups]]` element.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGroup {
    pub id: String,
    pub org: String,
    pub strategy: Option<String>,
    pub accounts: Vec<String>,
}

/// One `[[urls]]` element.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUrl {
    pub custom_url: String,
    pub org: Option<String>,
    pub group: Option<String>,
}

/// One `[[keys]]` element.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKey {
    pub id: String,
    pub org: String,
    pub kind: String,
    pub sha256: String,
    pub urls: Vec<String>,
    #[serde(default)]
    pub revoked: bool,
    /// `[keys.limits]`, read on its own (for its own locations) by the element reader.
    #[serde(skip)]
    pub limits: Option<RawLimits>,
}

/// The field names a `#[derive(Deserialize)]` struct accepts, read from serde itself so
/// that the list can never drift from the struct: a deserializer that only records the
/// `fields` argument of `deserialize_struct`.
pub(crate) fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut recorder = FieldRecorder(&[]);
    let _ = T::deserialize(&mut recorder);
    recorder.0
}

struct FieldRecorder(&'static [&'static str]);

#[derive(Debug)]
struct Recorded;

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field names recorded")
    }
}

impl std::error::Error for Recorded {}

impl de::Error for Recorded {
    fn custom<T: std::fmt::Display>(_msg: T) -> Self {
        Recorded
    }
}

impl<'de> de::Deserializer<'de> for &mut FieldRecorder {
    type Error = Recorded;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Recorded> {
        Err(Recorded)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Recorded> {
        self.0 = fields;
        Err(Recorded)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_come_from_the_struct() {
        assert_eq!(field_names::<RawOrg>(), &["slug", "suspended"]);
        assert!(field_names::<RawAccount>().contains(&"window_threshold"));
        assert!(field_names::<RawConfig>().contains(&"keys"));
    }
}
