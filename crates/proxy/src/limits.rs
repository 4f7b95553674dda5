//! SPEC 12 on the request path: a caller's limits, checked after the body was parsed
//! and before any account is chosen. A refused request never reaches an upstream; its
//! answer names the limit, its value and when it resets ([`refusal`]).
//!
//! The check itself (rate, requests in flight, budgets; shared through Redis when
//! configured) is the store's [`Store::check_limits`](keypool_store::Store::check_limits);
//! this module builds what it needs (the request's worst case at the most expensive
//! model it may be sent as) and turns a refusal into the response.

use std::borrow::Cow;

use http::StatusCode;
use keypool_core::{UnixMs, Usage};
use keypool_ledger::{
    LimitKind, Limits, NANO_PER_USD, NanoUsd, PriceTable, Prices, Refusal, Spend,
};
use keypool_providers::{Endpoint, ErrorType, RequestInfo};
use keypool_store::config::{LbKey, Org};
use keypool_store::limits::{LimitCheck, LimitDenial, LimitGuard};
use keypool_store::now_ms;

use crate::App;
use crate::reject::{Reject, format_utc};

/// A key without limits of its own in an org with a team budget.
static NO_LIMITS: std::sync::LazyLock<Limits> = std::sync::LazyLock::new(Limits::default);

/// Why a request was refused before it was sent: the rejection, and the limit named in
/// its usage record and `keypool_limit_rejections_total` (`None`: Redis unreachable
/// with `limits_fail_mode = "closed"`).
pub(crate) struct Refused {
    pub reject: Reject,
    pub limit: Option<LimitKind>,
}

/// An admitted request: what its limits hold, and the prices of the model it asked
/// for when the check looked them up (the usage record reuses them). The default:
/// nothing held, nothing looked up (a key without limits).
#[derive(Default)]
pub(crate) struct Admitted {
    pub guard: Option<LimitGuard>,
    pub asked_prices: Option<Option<Prices>>,
}

/// Whether a request with `key` has limits to check: the key's own or its org's team
/// budget (without either, [`admit`] admits it with the default [`Admitted`]).
pub(crate) fn any(org: &Org, key: &LbKey) -> bool {
    key.limits().is_some() || org.team_usd_per_month().is_some()
}

/// [`admit`] for a key with limits, boxed (its future is large: it holds the Redis
/// round trip), so that the request's future neither holds it nor copies it twice (5.6
/// KB each time) on every request; a key without any is admitted at once (without
/// reading the clock).
pub(crate) async fn admit_boxed(
    app: &App,
    org: &Org,
    key: &LbKey,
    info: &RequestInfo,
    len: usize,
    endpoint: Endpoint,
) -> Result<Admitted, Refused> {
    if !any(org, key) {
        return Ok(Admitted::default());
    }
    Box::pin(admit(app, org, key, info, len, endpoint, now_ms())).await
}

/// Checks `key`'s limits for a request: no guard when the key has none (nothing to
/// hold), the guard when admitted, the rejection when not.
pub(crate) async fn admit(
    app: &App,
    org: &Org,
    key: &LbKey,
    info: &RequestInfo,
    body_len: usize,
    endpoint: Endpoint,
    now: UnixMs,
) -> Result<Admitted, Refused> {
    let team = org.team_usd_per_month();
    let limits = match key.limits() {
        Some(limits) => limits.as_ref(),
        None if team.is_some() => &NO_LIMITS,
        None => {
            return Ok(Admitted {
                guard: None,
                asked_prices: None,
            });
        }
    };
    if let Err(kind) = limits.check_model(&info.model) {
        return Err(Refused {
            reject: model_refused(kind, &info.model, limits),
            limit: Some(kind),
        });
    }
    let rate_only = endpoint == Endpoint::CountTokens;
    let needs_price = !rate_only
        && (team.is_some() || limits.usd_per_day.is_some() || limits.usd_per_month.is_some());
    let config = app.store().config();
    let asked_prices = needs_price.then(|| config.prices().prices_for(&info.model).copied());
    let worst = worst_case(
        body_len,
        info.max_tokens.unwrap_or(0),
        asked_prices.flatten(),
        org,
        needs_price.then(|| config.prices()),
    );
    let who = key.who();
    let check = LimitCheck {
        who: &who,
        limits,
        team_usd_per_month: team,
        worst,
        rate_only,
    };
    match app.store().check_limits(&check, now).await {
        Ok(guard) => Ok(Admitted {
            guard: Some(guard),
            asked_prices,
        }),
        Err(LimitDenial::Refused(r)) => Err(Refused {
            reject: refusal(&r, worst, org.slug(), now),
            limit: Some(r.kind),
        }),
        Err(LimitDenial::Unavailable) => Err(Refused {
            reject: Reject::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorType::Overloaded,
                "This key's limits are shared through Redis, which cannot be reached now, and limits_fail_mode is \"closed\"; retry shortly",
            )
            .with_retry_after(1),
            limit: None,
        }),
    }
}

/// Puts what the check of a request took into its log line (settled with the
/// record): `None`; or counts its refusal (metric, log line, usage record) and gives
/// its answer.
pub(crate) fn into_log(
    app: &App,
    ctx: &mut crate::context::RequestContext<'_>,
    org: &Org,
    key: &LbKey,
    checked: Result<Admitted, Refused>,
) -> Option<http::Response<crate::body::ProxyBody>> {
    match checked {
        Ok(admitted) => {
            if let Some(log) = ctx.log_mut() {
                log.limit_guard = admitted.guard;
                log.asked_prices = admitted.asked_prices;
            }
            None
        }
        Err(refused) => {
            let name = refused.limit.map_or("redis_unavailable", LimitKind::as_str);
            app.metrics()
                .limit_rejected(org.slug_shared(), key.id_shared(), name);
            if let Some(log) = ctx.log_mut() {
                log.limit = refused.limit;
            }
            Some(refused.reject.respond(&ctx.id))
        }
    }
}

/// The request's worst case (SPEC 12): body bytes / 3 input tokens and `max_tokens`
/// output, priced at the dearest of the model asked (`asked`, its prices) and the
/// org's `model` overrides (it may be sent as any of them); no price table → 0 USD.
fn worst_case(
    body_len: usize,
    max_tokens: u64,
    asked: Option<Prices>,
    org: &Org,
    prices: Option<&PriceTable>,
) -> Spend {
    let usage = Usage {
        input_tokens: (body_len as u64).div_ceil(3),
        output_tokens: max_tokens,
        ..Usage::default()
    };
    let nano_usd = prices.map_or(0, |table| {
        let overrides = org
            .override_models()
            .iter()
            .filter_map(|m| table.cost(m, &usage));
        asked
            .map(|p| p.cost(&usage))
            .into_iter()
            .chain(overrides)
            .max()
            .unwrap_or(0)
    });
    Spend::of(&usage, nano_usd)
}

/// `403 permission_error` naming the model and what the key may use.
fn model_refused(kind: LimitKind, model: &str, limits: &Limits) -> Reject {
    let list = |globs: &[keypool_ledger::ModelGlob]| {
        globs
            .iter()
            .map(|g| g.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let message = if kind == LimitKind::DenyModels {
        format!(
            "This key may not use model {model:?} (deny_models: {}){}",
            list(&limits.deny_models),
            if limits.models.is_empty() {
                String::new()
            } else {
                format!("; it may use: {}", list(&limits.models))
            }
        )
    } else {
        format!(
            "This key may not use model {model:?}; it may use: {}",
            list(&limits.models)
        )
    };
    Reject::new(StatusCode::FORBIDDEN, ErrorType::Permission, message)
}

/// `$12.40` (cents; a fraction of a cent shows more digits, so nothing reads `$0.00`).
pub(crate) fn dollars(nano: NanoUsd) -> String {
    let cents = nano / (NANO_PER_USD / 100);
    if nano > 0 && cents == 0 {
        let micro = nano / 1000;
        return format!("${}.{:06}", micro / 1_000_000, micro % 1_000_000);
    }
    format!("${}.{:02}", cents / 100, cents % 100)
}

/// A budget's amount in its unit: `$20.00` or `1000000 tokens`.
pub(crate) fn amount(kind: LimitKind, value: u64) -> String {
    if kind.is_usd() {
        dollars(value)
    } else {
        format!("{value} tokens")
    }
}

/// The `429` of a refused request: the limit, its value, what was used and when it
/// resets; `Retry-After` is the wait in whole seconds (at least 1).
fn refusal(r: &Refusal, worst: Spend, org: &str, now: UnixMs) -> Reject {
    let wait_secs = r.retry_after_ms.unwrap_or(1000).div_ceil(1000).max(1);
    let message: Cow<'static, str> = match r.kind {
        LimitKind::RequestsPerMinute => format!(
            "This key is over its request rate: requests_per_minute = {}; the next request is admitted in {wait_secs} s",
            r.limit
        )
        .into(),
        LimitKind::MaxConcurrent => format!(
            "This key already has {} requests in flight (max_concurrent = {}); retry when one ends",
            r.used, r.limit
        )
        .into(),
        kind => {
            let whose = if kind == LimitKind::TeamUsdPerMonth {
                format!("The team budget of org {org:?} (usd_per_month")
            } else {
                format!("This key's budget ({}", kind.as_str())
            };
            let this = if kind.is_usd() { worst.nano_usd } else { worst.tokens };
            format!(
                "{whose} = {}) is used: {} spent or reserved, and this request may take up to {}; it resets at {}",
                amount(kind, r.limit),
                amount(kind, r.used),
                amount(kind, this),
                format_utc(r.resets_at.unwrap_or(now)),
            )
            .into()
        }
    };
    Reject::new(StatusCode::TOO_MANY_REQUESTS, ErrorType::RateLimit, message)
        .with_retry_after(wait_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_show_cents_and_never_round_a_spend_to_nothing() {
        assert_eq!(dollars(12_400_000_000), "$12.40");
        assert_eq!(dollars(0), "$0.00");
        assert_eq!(dollars(20 * NANO_PER_USD), "$20.00");
        assert_eq!(dollars(3_000), "$0.000003");
    }

    #[test]
    fn a_budget_refusal_names_the_limit_its_value_the_use_and_the_reset() {
        let r = Refusal {
            kind: LimitKind::UsdPerDay,
            limit: 20 * NANO_PER_USD,
            used: 19_870_000_000,
            resets_at: Some(1_796_169_600_000),
            retry_after_ms: Some(3_600_000),
        };
        let worst = Spend {
            tokens: 0,
            nano_usd: 420_000_000,
        };
        let reject = refusal(&r, worst, "acme", 0);
        assert_eq!(reject.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reject.retry_after_secs, Some(3600));
        assert_eq!(
            reject.message,
            "This key's budget (usd_per_day = $20.00) is used: $19.87 spent or reserved, and this request may take up to $0.42; it resets at 2026-12-02T00:00:00Z"
        );
    }
}
