//! `[[restate]]` (SPEC 16): status restatement rules for third-party upstreams.

use keypool_cooldown::RestateRule;

use super::Issues;

/// Validates the rules in order (the first that applies wins at run time); every
/// problem is located at its rule's field. Markers are kept in lower case.
pub(super) fn validate(rules: &[(usize, RestateRule)], issues: &mut Issues) -> Vec<RestateRule> {
    let mut out = Vec::with_capacity(rules.len());
    for (i, rule) in rules {
        let before = issues.0.len();
        let loc = |field: &str| format!("restate[{i}].{field}");
        if rule.account.is_none() && rule.base_url.is_none() {
            issues.push(
                loc("base_url"),
                "a rule names the upstreams it is for: set `base_url` or `account` (a glob), \
                 so that a rule meant for one gateway never rewrites Anthropic's own answers"
                    .to_owned(),
            );
        }
        for (field, glob) in [("account", &rule.account), ("base_url", &rule.base_url)] {
            if let Some(g) = glob
                && (g.is_empty() || g.chars().any(|c| c.is_whitespace() || c.is_control()))
            {
                issues.push(
                    loc(field),
                    format!("{g:?} is not a glob: write it without spaces, `*` for any run of characters"),
                );
            }
        }
        if rule.from_statuses.is_empty() {
            issues.push(
                loc("from_statuses"),
                "list the upstream statuses the rule rewrites, e.g. [403]".to_owned(),
            );
        }
        for s in &rule.from_statuses {
            if !(400..=599).contains(s) {
                issues.push(
                    loc("from_statuses"),
                    format!("{s} is not an error status: only 400 to 599 can be restated"),
                );
            }
        }
        if !(400..=599).contains(&rule.to_status) {
            issues.push(
                loc("to_status"),
                format!(
                    "{} is not an error status: set the status keypool classifies instead, 400 to 599 (e.g. 429)",
                    rule.to_status
                ),
            );
        }
        if rule.retry_after_ms == Some(0) {
            issues.push(
                loc("retry_after_ms"),
                "must be greater than 0 (leave it out to keep the answer's own wait)".to_owned(),
            );
        }
        for (field, markers) in [
            ("markers", &rule.markers),
            ("exclude_markers", &rule.exclude_markers),
        ] {
            if markers.iter().any(|m| m.trim().is_empty()) {
                issues.push(loc(field), "must not hold an empty text".to_owned());
            }
        }
        if issues.0.len() == before {
            out.push(rule.clone().normalized());
        }
    }
    out
}
