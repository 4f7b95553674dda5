//! The usage routes of the admin API (SPEC 11): the totals of a day or a month by
//! caller, account, model or org (JSON or CSV), the recent requests, and one request's
//! record. Costs are integers of nano-USD, with a decimal USD string beside them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};
use keypool_core::{AuthType, UnixMs};
use keypool_ledger::{
    DEFAULT_PRICES_DATE, DEFAULT_PRICES_SOURCE, Day, Dimension, Month, NanoUsd, Period,
    RecordFilter, StatusFilter, Totals, UsageRecord, Usd,
};
use keypool_providers::ErrorType;
use keypool_providers::upstream::percent_decode;
use keypool_store::config::Config;
use keypool_store::usage::UsageSource;
use serde_json::{Value, json};

use super::json_response;
use crate::App;
use crate::body::ProxyBody;
use crate::reject::Reject;

/// How many records `GET /admin/requests` lists when `limit` is not given.
const DEFAULT_LIMIT: usize = 100;

/// The query's `name=value` pairs, decoded.
pub(super) fn params(query: Option<&str>) -> BTreeMap<String, String> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (
                percent_decode(k).into_owned(),
                percent_decode(v).into_owned(),
            )
        })
        .collect()
}

fn bad(message: String) -> Reject {
    Reject::new(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, message)
}

/// `12.345678901`: nano-USD as a decimal USD string.
fn usd(nano: NanoUsd) -> String {
    Usd(nano).to_string()
}

/// One answer row: the org, the key of the dimension (none for `by=org`), the totals.
type Row = (Arc<str>, Option<Arc<str>>, Totals);

/// What `by` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum By {
    Dimension(Dimension),
    Org,
}

impl By {
    fn column(self) -> &'static str {
        match self {
            Self::Dimension(d) => d.as_str(),
            Self::Org => "org",
        }
    }
}

/// The period a request asks for: `period` (`day` or `month`, default `day`) and
/// `date` (`YYYY-MM-DD` or `YYYY-MM`, default the current one, UTC).
fn period(params: &BTreeMap<String, String>, now: UnixMs) -> Result<Period, Reject> {
    let date = params.get("date").filter(|d| !d.is_empty());
    match params.get("period").map(String::as_str).unwrap_or("day") {
        "day" => Ok(Period::Day(match date {
            None => Day::of(now),
            Some(d) => d
                .parse()
                .map_err(|e: keypool_ledger::LedgerError| bad(format!("date: {e}")))?,
        })),
        "month" => Ok(Period::Month(match date {
            None => Month::of(now),
            Some(d) => d
                .parse()
                .map_err(|e: keypool_ledger::LedgerError| bad(format!("date: {e}")))?,
        })),
        other => Err(bad(format!("period {other:?} is not one of: day, month"))),
    }
}

/// `GET /admin/usage?by=caller|account|model|org&period=day|month&date=…&format=json|csv`.
pub(super) async fn usage(
    app: &App,
    config: &Config,
    query: Option<&str>,
    now: UnixMs,
) -> Result<Response<ProxyBody>, Reject> {
    let params = params(query);
    let by = match params.get("by").map(String::as_str).unwrap_or("caller") {
        "caller" => By::Dimension(Dimension::Caller),
        "account" => By::Dimension(Dimension::Account),
        "model" => By::Dimension(Dimension::Model),
        "org" => By::Org,
        other => {
            return Err(bad(format!(
                "by {other:?} is not one of: caller, account, model, org"
            )));
        }
    };
    let period = period(&params, now)?;
    let csv = match params.get("format").map(String::as_str).unwrap_or("json") {
        "json" => false,
        "csv" => true,
        other => return Err(bad(format!("format {other:?} is not one of: json, csv"))),
    };
    let (rows, source) = usage_rows(app, by, period).await;
    if csv {
        return Ok(csv_response(by, &rows));
    }
    let (rows, total) = rows_json(config, by, &rows);
    let mut answer = json!({
        "by": by.column(),
        "period": period.kind(),
        "date": period.to_string(),
        "resets_at": period.end(),
        "source": source.as_str(),
        "prices": {"default_source": DEFAULT_PRICES_SOURCE, "default_date": DEFAULT_PRICES_DATE},
        "rows": rows,
        "total": totals_json(&total),
    });
    if by == By::Dimension(Dimension::Caller) {
        // Each caller's use against its limits, now (whatever period was asked).
        answer["limits"] = super::limits::limits_json(app.store(), config, now).await;
    }
    Ok(json_response(StatusCode::OK, &answer))
}

/// The rows of `period` by `by` (for `by=org`, the callers' rows added up per org).
async fn usage_rows(app: &App, by: By, period: Period) -> (Vec<Row>, UsageSource) {
    let dimension = match by {
        By::Dimension(d) => d,
        By::Org => Dimension::Caller,
    };
    let answer = app.store().usage_rows(period, dimension).await;
    let rows = match by {
        By::Dimension(_) => answer
            .rows
            .into_iter()
            .map(|(org, key, t)| (org, Some(key), t))
            .collect(),
        By::Org => {
            let mut orgs: BTreeMap<Arc<str>, Totals> = BTreeMap::new();
            for (org, _, t) in answer.rows {
                orgs.entry(org).or_default().add(&t);
            }
            orgs.into_iter().map(|(org, t)| (org, None, t)).collect()
        }
    };
    (rows, answer.source)
}

/// The rows as JSON, and their sum.
fn rows_json(config: &Config, by: By, rows: &[Row]) -> (Vec<Value>, Totals) {
    let mut total = Totals::default();
    let rows = rows
        .iter()
        .map(|(org, key, t)| {
            total.add(t);
            let mut row = totals_json(t);
            row["org"] = json!(org);
            if let (Some(key), By::Dimension(dimension)) = (key, by) {
                row[by.column()] = json!(key);
                describe_key(config, dimension, key, &mut row);
            }
            row
        })
        .collect();
    (rows, total)
}

/// `GET /admin/usage/summary`: what the status page shows at a glance: today's and this
/// month's totals per caller and per account, and requests, errors and tokens per
/// minute over the last hour (this process's history).
pub(super) async fn summary(app: &App, config: &Config, now: UnixMs) -> Value {
    let mut periods = serde_json::Map::new();
    for (name, period) in [
        ("today", Period::Day(Day::of(now))),
        ("month", Period::Month(Month::of(now))),
    ] {
        let mut view = json!({"date": period.to_string(), "resets_at": period.end()});
        for by in [Dimension::Caller, Dimension::Account] {
            let by = By::Dimension(by);
            let (rows, source) = usage_rows(app, by, period).await;
            let (rows, total) = rows_json(config, by, &rows);
            view[format!("by_{}", by.column())] = json!(rows);
            view["source"] = json!(source.as_str());
            // Every request has a caller; not every one reached an account.
            if by == By::Dimension(Dimension::Caller) {
                view["total"] = totals_json(&total);
            }
        }
        periods.insert(name.to_owned(), view);
    }
    json!({
        "now": now,
        "limits": super::limits::limits_json(app.store(), config, now).await,
        "today": periods.remove("today"),
        "month": periods.remove("month"),
        "minutes": app.store().usage_history(now),
    })
}

/// A caller's kind, or an account's cost basis (subscription accounts are priced at
/// the API list-price equivalent).
fn describe_key(config: &Config, dimension: Dimension, key: &str, row: &mut Value) {
    match dimension {
        Dimension::Caller => {
            if let Some(k) = config.lb_key_by_id(key) {
                row["kind"] = json!(k.kind().as_str());
            }
        }
        Dimension::Account => {
            if let Some(a) = config.account(key) {
                let basis = if a.auth() == AuthType::OAuth {
                    "list_price_equivalent"
                } else {
                    "api"
                };
                row["cost_basis"] = json!(basis);
            }
        }
        Dimension::Model => {}
    }
}

/// Totals as the API writes them.
pub(crate) fn totals_json(t: &Totals) -> Value {
    json!({
        "requests": t.requests,
        "errors": t.errors,
        "input_tokens": t.input_tokens,
        "output_tokens": t.output_tokens,
        "cache_creation_input_tokens": t.cache_creation_input_tokens,
        "cache_read_input_tokens": t.cache_read_input_tokens,
        "tokens": t.tokens(),
        "cost_nano_usd": t.cost_nano_usd,
        "cost_usd": usd(t.cost_nano_usd),
        "list_price_equivalent_nano_usd": t.list_price_equivalent_nano_usd,
        "list_price_equivalent_usd": usd(t.list_price_equivalent_nano_usd),
        "unpriced": t.unpriced,
    })
}

fn csv_field(value: &str) -> String {
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_owned()
    }
}

fn csv_response(by: By, rows: &[Row]) -> Response<ProxyBody> {
    let mut out = String::from("org");
    if by != By::Org {
        let _ = write!(out, ",{}", by.column());
    }
    out.push_str(",requests,errors,input_tokens,output_tokens,cache_creation_input_tokens,cache_read_input_tokens,cost_usd,list_price_equivalent_usd,unpriced\n");
    for (org, key, t) in rows {
        out.push_str(&csv_field(org));
        if let Some(key) = key {
            let _ = write!(out, ",{}", csv_field(key));
        }
        let _ = writeln!(
            out,
            ",{},{},{},{},{},{},{},{},{}",
            t.requests,
            t.errors,
            t.input_tokens,
            t.output_tokens,
            t.cache_creation_input_tokens,
            t.cache_read_input_tokens,
            usd(t.cost_nano_usd),
            usd(t.list_price_equivalent_nano_usd),
            t.unpriced
        );
    }
    let mut response = Response::new(ProxyBody::full(Bytes::from(out)));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    response
}

/// A record as the API writes it: its fields, and its cost as a USD string.
pub(crate) fn record_json(record: &UsageRecord) -> Value {
    let mut value = serde_json::to_value(record).unwrap_or(Value::Null);
    value["cost_usd"] = json!(usd(record.cost_nano_usd));
    value
}

/// `GET /admin/requests?caller=&status=&limit=`: the newest records, newest first.
pub(super) async fn requests(
    app: &App,
    config: &Config,
    query: Option<&str>,
) -> Result<Response<ProxyBody>, Reject> {
    let params = params(query);
    let keep = config.usage().recent_requests;
    let limit = match params.get("limit") {
        None => DEFAULT_LIMIT.min(keep),
        Some(l) => match l.parse::<usize>() {
            Ok(n @ 1..) if n <= keep.max(1) => n,
            _ => {
                return Err(bad(format!(
                    "limit {l:?} must be a whole number from 1 to {} ([usage] recent_requests)",
                    keep.max(1)
                )));
            }
        },
    };
    let status = match params.get("status") {
        None => None,
        Some(s) => Some(StatusFilter::parse(s).ok_or_else(|| {
            bad(format!(
                "status {s:?} is not a status (429), a class (5xx) or `error`"
            ))
        })?),
    };
    let filter = RecordFilter {
        caller: params.get("caller").cloned(),
        status,
    };
    let (records, source) = app.store().recent_requests(&filter, limit).await;
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "source": source.as_str(),
            "requests": records.iter().map(|r| record_json(r)).collect::<Vec<_>>(),
        }),
    ))
}

/// `GET /admin/requests/{id}`: one request's record, from any replica with Redis.
pub(super) async fn request(app: &App, id: &str) -> Result<Response<ProxyBody>, Reject> {
    match app.store().request_record(id).await {
        Some(record) => Ok(json_response(StatusCode::OK, &record_json(&record))),
        None => Err(Reject::new(
            StatusCode::NOT_FOUND,
            ErrorType::NotFound,
            format!(
                "no record of request {id:?}: only the most recent ones are kept ([usage] recent_requests; with Redis, 7 days by id)"
            ),
        )),
    }
}
