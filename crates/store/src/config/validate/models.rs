//! `[[models]]` (issue 24): model aliases with a chain and optional canary weights, and
//! fallback chains of plain models, validated with located errors.

use std::collections::HashMap;
use std::sync::Arc;

use keypool_ledger::{ModelGlob, PriceTable};
use keypool_selector::ModelChain;

use super::Issues;
use crate::config::ModelRoutes;
use crate::config::raw::RawModel;

/// Validates the rules: an alias (`alias` + `chain`, optional `weights`) or a plain
/// model glob with a `fallback`. A chain names models, not aliases (so no cycle can
/// form), each known to the price table or an account's `model`; a fallback target
/// may not have a fallback of its own (chains are one level: list them in one chain).
pub(super) fn validate(
    rules: &[(usize, RawModel)],
    prices: &PriceTable,
    account_models: &[&str],
    issues: &mut Issues,
) -> ModelRoutes {
    let known = |m: &str| prices.prices_for(m).is_some() || account_models.contains(&m);
    let aliases: Vec<&str> = rules
        .iter()
        .filter_map(|(_, r)| r.alias.as_deref())
        .collect();
    let globs: Vec<(usize, ModelGlob)> = rules
        .iter()
        .filter_map(|(i, r)| Some((*i, ModelGlob::try_new(r.model.as_deref()?).ok()?)))
        .collect();
    let mut out = ModelRoutes::default();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, r) in rules {
        let before = issues.0.len();
        let loc = |field: &str| format!("models[{i}].{field}");
        let (models, field) = match (&r.alias, &r.model) {
            (Some(_), None) => (r.chain.as_deref().unwrap_or(&[]), "chain"),
            (None, Some(_)) => (r.fallback.as_deref().unwrap_or(&[]), "fallback"),
            _ => {
                issues.push(
                    loc("alias"),
                    "set exactly one of `alias` (with `chain`) or `model` (with `fallback`)"
                        .to_owned(),
                );
                continue;
            }
        };
        if models.is_empty() {
            issues.push(
                loc(field),
                format!("{field} is empty: list the models to try, first choice first"),
            );
        }
        for (j, m) in models.iter().enumerate() {
            if aliases.contains(&m.as_str()) {
                issues.push(format!("models[{i}].{field}[{j}]"), format!("{m:?} is an alias: a chain names models (aliases in chains could form a cycle); list its models here"));
            } else if !known(m) {
                issues.push(format!("models[{i}].{field}[{j}]"), format!("unknown model {m:?}: no [[prices]] rule or account `model` names it (a typo?); add a [[prices]] entry for a new model"));
            } else if field == "fallback"
                && let Some((k, _)) = globs.iter().find(|(k, g)| k != i && g.matches(m))
            {
                issues.push(format!("models[{i}].fallback[{j}]"), format!("{m:?} has a fallback of its own (models[{k}]): chains are one level, list every model in this one"));
            }
        }
        if let Some(alias) = &r.alias {
            if known(alias) || alias.starts_with("claude-") {
                issues.push(loc("alias"), format!("alias {alias:?} shadows a real model id: pick a name no model has, e.g. auto:high"));
            }
            if let Some(j) = seen.insert(alias, *i) {
                issues.push(
                    loc("alias"),
                    format!("alias {alias:?} is defined twice (first at models[{j}])"),
                );
            }
        }
        let glob = r.model.as_deref().map(|m| {
            ModelGlob::try_new(m)
                .map_err(|e| issues.push(loc("model"), e.to_string()))
                .ok()
        });
        if let Some(w) = &r.weights {
            if r.alias.is_none() {
                issues.push(loc("weights"), "weights split an alias's traffic: a plain model is always tried first, then its fallback".to_owned());
            } else if w.len() != models.len() {
                issues.push(
                    loc("weights"),
                    format!(
                        "{} weights for {} models: give one weight per model of the {field}",
                        w.len(),
                        models.len()
                    ),
                );
            } else if w.iter().all(|&x| x == 0) {
                issues.push(
                    loc("weights"),
                    "the weights sum to 0: give the first choice a weight above 0".to_owned(),
                );
            }
        }
        if issues.0.len() != before {
            continue;
        }
        let models: Vec<Arc<str>> = models.iter().map(|m| Arc::from(m.as_str())).collect();
        match (r.alias.as_deref(), glob.flatten()) {
            (Some(alias), _) => {
                let chain = ModelChain::new(Some(Arc::from(alias)), models, r.weights.clone());
                out.aliases.insert(Arc::from(alias), Arc::new(chain));
            }
            (None, Some(glob)) => out.fallbacks.push((glob, models)),
            (None, None) => {}
        }
    }
    out
}
