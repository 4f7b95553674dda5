//! The environment overrides of SPEC 9, as a pure function of an env lookup.

use super::ConfigIssue;
use super::raw::RawConfig;

/// The environment variables that override the file, and what each sets.
pub const ENV_OVERRIDES: &[(&str, &str)] = &[
    (
        "UPSTREAM_TIMEOUT",
        "server.upstream_timeout_secs (whole seconds)",
    ),
    (
        "AUTO_DISABLE_ON_ERROR",
        "server.auto_disable_on_error (true/false, 1/0, yes/no, on/off)",
    ),
    ("REDIS_URL", "server.redis_url (taken literally)"),
    ("KEYPOOL_LISTEN", "server.listen (host:port)"),
    ("KEYPOOL_ADMIN_LISTEN", "server.admin_listen (host:port)"),
    ("KEYPOOL_ADMIN_TOKEN", "admin.token (taken literally)"),
];

/// Applies the overrides that `env` reports as set (an empty value counts as unset) to
/// the raw file, and returns a problem for each value that cannot be used. The values
/// themselves are checked afterwards like the file's own (e.g. a bad `KEYPOOL_LISTEN` is
/// reported at `server.listen`).
pub(crate) fn apply_env_overrides(
    raw: &mut RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<ConfigIssue> {
    let mut issues = Vec::new();
    let get = |name: &str| env(name).filter(|v| !v.trim().is_empty());

    if let Some(v) = get("UPSTREAM_TIMEOUT") {
        match v.trim().parse::<i64>() {
            Ok(secs) => raw.server.upstream_timeout_secs = Some(secs),
            Err(_) => issues.push(ConfigIssue {
                location: "env UPSTREAM_TIMEOUT".into(),
                message: format!(
                    "{v:?} is not a whole number of seconds; set e.g. UPSTREAM_TIMEOUT=180"
                ),
            }),
        }
    }
    if let Some(v) = get("AUTO_DISABLE_ON_ERROR") {
        match parse_bool(&v) {
            Some(b) => raw.server.auto_disable_on_error = Some(b),
            None => issues.push(ConfigIssue {
                location: "env AUTO_DISABLE_ON_ERROR".into(),
                message: format!("{v:?} is not a boolean; use true or false"),
            }),
        }
    }
    if let Some(v) = get("REDIS_URL") {
        raw.server.redis_url = Some(v);
        raw.server.redis_url_from_env = true;
    }
    if let Some(v) = get("KEYPOOL_LISTEN") {
        raw.server.listen = Some(v);
    }
    if let Some(v) = get("KEYPOOL_ADMIN_LISTEN") {
        raw.server.admin_listen = Some(v);
    }
    if let Some(v) = get("KEYPOOL_ADMIN_TOKEN") {
        raw.admin.token = Some(v);
        raw.admin.token_from_env = true;
    }
    issues
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn every_override_lands_in_its_field() {
        let mut raw = RawConfig::default();
        let env = env_of(&[
            ("UPSTREAM_TIMEOUT", "42"),
            ("AUTO_DISABLE_ON_ERROR", "off"),
            ("REDIS_URL", "redis://127.0.0.1:1/"),
            ("KEYPOOL_LISTEN", "0.0.0.0:9000"),
            ("KEYPOOL_ADMIN_TOKEN", "$NOT_A_VAR"),
        ]);
        assert!(apply_env_overrides(&mut raw, &env).is_empty());
        assert_eq!(raw.server.upstream_timeout_secs, Some(42));
        assert_eq!(raw.server.auto_disable_on_error, Some(false));
        assert_eq!(
            raw.server.redis_url.as_deref(),
            Some("redis://127.0.0.1:1/")
        );
        assert!(raw.server.redis_url_from_env);
        assert_eq!(raw.server.listen.as_deref(), Some("0.0.0.0:9000"));
        assert_eq!(raw.admin.token.as_deref(), Some("$NOT_A_VAR"));
        assert!(raw.admin.token_from_env);
    }

    #[test]
    fn unusable_values_are_reported_with_the_variable_name() {
        let mut raw = RawConfig::default();
        let env = env_of(&[
            ("UPSTREAM_TIMEOUT", "3m"),
            ("AUTO_DISABLE_ON_ERROR", "maybe"),
        ]);
        let issues = apply_env_overrides(&mut raw, &env);
        let locs: Vec<_> = issues.iter().map(|i| i.location.as_str()).collect();
        assert_eq!(locs, ["env UPSTREAM_TIMEOUT", "env AUTO_DISABLE_ON_ERROR"]);
        assert_eq!(raw.server.upstream_timeout_secs, None);
    }

    #[test]
    fn empty_values_count_as_unset() {
        let mut raw = RawConfig::default();
        let env = env_of(&[("REDIS_URL", ""), ("KEYPOOL_LISTEN", "  ")]);
        assert!(apply_env_overrides(&mut raw, &env).is_empty());
        assert_eq!(raw.server.redis_url, None);
        assert_eq!(raw.server.listen, None);
    }
}
