//! Fuzzes the configuration parser (`Config::from_toml_str`): any text must give a
//! configuration or a list of errors, never a panic; and no error may quote a secret
//! (SPEC 9: "secrets never appear in errors"), whatever else is wrong in the file.
#![no_main]

use keypool_store::config::Config;
use libfuzzer_sys::fuzz_target;

/// String values of secret-bearing keys (`secret`, `token`, `redis_url`) anywhere in
/// the document, when it is TOML at all.
fn secrets(text: &str) -> Vec<String> {
    fn walk(v: &toml::Value, key: Option<&str>, out: &mut Vec<String>) {
        match v {
            toml::Value::String(s) => {
                if matches!(key, Some("secret" | "token" | "redis_url")) && s.len() >= 8 {
                    out.push(s.clone());
                }
            }
            toml::Value::Array(items) => items.iter().for_each(|i| walk(i, key, out)),
            toml::Value::Table(t) => t.iter().for_each(|(k, v)| walk(v, Some(k), out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(doc) = text.parse::<toml::Table>() {
        doc.iter().for_each(|(k, v)| walk(v, Some(k), &mut out));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // `$ENV` secrets, `REDIS_URL` and `KEYPOOL_ADMIN_TOKEN` resolve to a value that must
    // not leak either; the non-secret overrides are unset (their errors may quote them)
    let env = |name: &str| match name {
        "UPSTREAM_TIMEOUT" | "AUTO_DISABLE_ON_ERROR" | "KEYPOOL_LISTEN" => None,
        _ => Some(format!("env-secret-value-of-{name}")),
    };
    match Config::from_toml_str(text, None, &env) {
        Ok(config) => {
            let shown = format!("{config:?}");
            for s in secrets(text) {
                assert!(!shown.contains(&s), "a secret in the config's Debug");
            }
            assert!(!shown.contains("env-secret-value-of-"), "an env secret in Debug");
        }
        Err(errors) => {
            let shown = format!("{errors}\n{errors:?}");
            for s in secrets(text) {
                // a secret that is also some other (non-secret) value may be quoted as that
                if text.matches(s.as_str()).count() == 1 {
                    assert!(!shown.contains(&s), "a secret quoted in an error: {shown}");
                }
            }
            assert!(!shown.contains("env-secret-value-of-"), "an env secret in an error: {shown}");
        }
    }
});
