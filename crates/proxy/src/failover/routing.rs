//! `[[models]]` routing (issue 24): a request whose `model` is an alias, or a model with
//! a `fallback`, is planned for the first model of its chain (as ordered for the caller
//! by the canary weights) that has an available account; if none, the next. The body's
//! `model` is rewritten to the model chosen; the answer's own `model` field is the
//! truth, and `x-keypool-fallback: true` marks an answer served past the first choice.

use keypool_ledger::ModelRouting;
use keypool_providers::override_model;
use keypool_selector::SelectError;
use keypool_store::resolve::Route;

use super::planning::{PlannedRequest, plan_request};
use crate::attempt::Call;
use crate::context::RequestContext;

/// The header that marks an answer served by a fallback model (Floopy's).
pub(crate) const X_KEYPOOL_FALLBACK: &str = "x-keypool-fallback";

/// Plans `call`, through its `[[models]]` chain when one names its model. Returns the
/// plan and whether it is a fallback (not the caller's first choice).
pub(super) async fn plan_routed<'c>(
    call: &mut Call<'c>,
    route: &Route,
    ctx: &mut RequestContext<'_>,
) -> (Result<PlannedRequest, SelectError>, bool) {
    let routes = call.config.model_routes();
    if routes.is_empty() {
        return (plan_request(call, route).await, false);
    }
    let caller = call.user_id.unwrap_or(call.key.id());
    let Some((alias, order)) = routes.order_for(call.model, caller) else {
        return (plan_request(call, route).await, false);
    };
    let asked = call.model;
    // Metric labels come from the config only (an alias and its chain, or a rule's
    // pattern), never from the caller's text.
    let (rule, first_choice) = match alias {
        Some(alias) => (alias, order[0]),
        None => {
            let pattern = routes.fallback_pattern(asked).unwrap_or("fallback");
            (pattern, pattern)
        }
    };
    let labels = Labels { rule, first_choice };
    let body = call.body.clone();
    let mut first = None;
    for (position, model) in order.iter().enumerate() {
        use_model(call, &body, asked, model);
        match plan_request(call, route).await {
            Ok(planned) if !planned.plan.last_resort => {
                return (
                    Ok(planned),
                    chosen(call, ctx, alias, &labels, &order, position),
                );
            }
            other if first.is_none() => first = Some((position, other)),
            _ => {}
        }
    }
    // No model has an account free now: the first choice's last resort or refusal.
    let Some((position, result)) = first else {
        return (plan_request(call, route).await, false);
    };
    use_model(call, &body, asked, order[position]);
    let fallback = result.is_ok() && chosen(call, ctx, alias, &labels, &order, position);
    (result, fallback)
}

/// Sends `model` (the request's own body when it is the one asked).
fn use_model<'c>(call: &mut Call<'c>, body: &bytes::Bytes, asked: &'c str, model: &'c str) {
    call.model = model;
    call.body = if model == asked {
        body.clone()
    } else {
        override_model(body, model).unwrap_or_else(|_| body.clone())
    };
}

/// The fallback metric's labels of one rule.
struct Labels<'a> {
    rule: &'a str,
    first_choice: &'a str,
}

/// Records the choice on the request's log line and metrics; `true` for a fallback.
fn chosen(
    call: &Call<'_>,
    ctx: &mut RequestContext<'_>,
    alias: Option<&str>,
    labels: &Labels<'_>,
    order: &[&str],
    position: usize,
) -> bool {
    if let Some(log) = ctx.log_mut() {
        log.routing = Some(ModelRouting {
            alias: alias.map(std::sync::Arc::from),
            position: u32::try_from(position).unwrap_or(u32::MAX),
        });
    }
    let fallback = position > 0;
    if fallback {
        call.app
            .metrics()
            .model_fallback(labels.rule, labels.first_choice, order[position]);
    }
    fallback
}
