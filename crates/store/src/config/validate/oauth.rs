//! `[oauth]` (SPEC 14): the token endpoint, client id and timing of OAuth refreshes.

use super::Issues;
use crate::config::OAuthSettings;
use crate::config::raw::RawOAuth;

/// Longest `refresh_lead_secs`: an access token lives hours; a lead of a day would
/// refresh at every tick.
const MAX_LEAD_SECS: i64 = 6 * 3600;

/// `[oauth]` against its defaults; every problem located.
pub(super) fn validate(o: &RawOAuth, issues: &mut Issues) -> OAuthSettings {
    let d = OAuthSettings::default();
    let url =
        |value: Option<&str>, name: &str, what: &str, default: String, issues: &mut Issues| {
            match value {
                None => default,
                Some(u) if u.starts_with("https://") || u.starts_with("http://") => u.to_owned(),
                Some(_) => {
                    issues.push(
                        format!("oauth.{name}"),
                        format!("{name} must be an http:// or https:// URL ({what})"),
                    );
                    default
                }
            }
        };
    let token_url = url(
        o.token_url.as_deref(),
        "token_url",
        "the provider's OAuth token endpoint",
        d.token_url,
        issues,
    );
    let authorize_url = url(
        o.authorize_url.as_deref(),
        "authorize_url",
        "the page where a person logs an account in",
        d.authorize_url,
        issues,
    );
    let redirect_uri = url(
        o.redirect_uri.as_deref(),
        "redirect_uri",
        "the page that shows the code to paste",
        d.redirect_uri,
        issues,
    );
    let scopes = o
        .scopes
        .clone()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or(d.scopes);
    let client_id = match o.client_id.as_deref() {
        None => d.client_id,
        Some(c) if !c.trim().is_empty() => c.to_owned(),
        Some(_) => {
            issues.push(
                "oauth.client_id",
                "client_id is empty; omit it for the default",
            );
            d.client_id
        }
    };
    let (refresh_lead_ms, refresh_timeout_ms) = timing(o, issues);
    OAuthSettings {
        token_url,
        client_id,
        refresh_lead_ms,
        refresh_timeout_ms,
        authorize_url,
        redirect_uri,
        scopes,
    }
}

/// `refresh_lead_secs` (as ms) and `refresh_timeout_ms`, against their defaults.
fn timing(o: &RawOAuth, issues: &mut Issues) -> (u64, u64) {
    let d = OAuthSettings::default();
    let refresh_lead_ms = match o.refresh_lead_secs {
        None => d.refresh_lead_ms,
        Some(n @ 0..=MAX_LEAD_SECS) => u64::try_from(n).unwrap_or(0) * 1000,
        Some(n) => {
            issues.push(
                "oauth.refresh_lead_secs",
                format!("refresh_lead_secs must be between 0 and {MAX_LEAD_SECS} (got {n})"),
            );
            d.refresh_lead_ms
        }
    };
    let refresh_timeout_ms = match o.refresh_timeout_ms {
        None => d.refresh_timeout_ms,
        Some(n @ 100..=120_000) => u64::try_from(n).unwrap_or(d.refresh_timeout_ms),
        Some(n) => {
            issues.push(
                "oauth.refresh_timeout_ms",
                format!("refresh_timeout_ms must be between 100 and 120000 (got {n})"),
            );
            d.refresh_timeout_ms
        }
    };
    (refresh_lead_ms, refresh_timeout_ms)
}
