//! The JSON log format (`--log-format json`): one object per line, the keys of
//! `tracing-subscriber`'s flattened JSON format (`timestamp`, `level`, the event's
//! fields with `message` first, `target`, and `span`/`spans` inside spans), except that
//! the request line's [`keypool_proxy::log::JSON_FIELDS`] (`attempts`,
//! `upstream_statuses`) are written as the JSON arrays their text holds instead of
//! as strings, so a log pipeline can filter on an attempt's account or status without
//! parsing a joined string.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON event format.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonFormat;

impl<S, N> FormatEvent<S, N> for JsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut timestamp = String::with_capacity(27);
        crate::logfmt::write_now(&mut timestamp)?;
        // keys in the order they are written (serde_json's Map would sort them)
        let mut object: Vec<(String, Value)> = vec![
            ("timestamp".into(), Value::String(timestamp)),
            (
                "level".into(),
                Value::String(event.metadata().level().to_string()),
            ),
        ];
        let mut fields = JsonVisitor {
            fields: &mut object,
            arrays: event.metadata().target() == "keypool::request",
        };
        event.record(&mut fields);
        object.push((
            "target".into(),
            Value::String(event.metadata().target().to_owned()),
        ));
        if let Some(scope) = ctx.event_scope() {
            let spans: Vec<Value> = scope.from_root().map(|span| span_object(&span)).collect();
            if let Some(current) = spans.last() {
                object.push(("span".into(), current.clone()));
            }
            object.push(("spans".into(), Value::Array(spans)));
        }
        writer.write_char('{')?;
        for (i, (key, value)) in object.iter().enumerate() {
            if i > 0 {
                writer.write_char(',')?;
            }
            let key = serde_json::to_string(key).map_err(|_| fmt::Error)?;
            let value = serde_json::to_string(value).map_err(|_| fmt::Error)?;
            write!(writer, "{key}:{value}")?;
        }
        writer.write_str("}\n")
    }
}

/// A span as `{"name": …, its fields…}` (the fields `JsonFields` recorded for it).
fn span_object<S>(span: &tracing_subscriber::registry::SpanRef<'_, S>) -> Value
where
    S: for<'a> LookupSpan<'a>,
{
    let mut object = span
        .extensions()
        .get::<FormattedFields<JsonFields>>()
        .and_then(|f| serde_json::from_str::<Map<String, Value>>(f).ok())
        .unwrap_or_default();
    object.insert("name".into(), Value::String(span.name().to_owned()));
    Value::Object(object)
}

/// Collects an event's fields; with `arrays`, a [`keypool_proxy::log::JSON_FIELDS`]
/// field whose text is valid JSON goes in as that JSON.
struct JsonVisitor<'a> {
    fields: &'a mut Vec<(String, Value)>,
    arrays: bool,
}

impl JsonVisitor<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        let name = field.name();
        if name.starts_with("log.") {
            return;
        }
        self.fields
            .push((name.strip_prefix("r#").unwrap_or(name).to_owned(), value));
    }

    fn text(&mut self, field: &Field, text: String) {
        if self.arrays
            && keypool_proxy::log::JSON_FIELDS.contains(&field.name())
            && let Ok(value) = serde_json::from_str::<Value>(&text)
        {
            return self.put(field, value);
        }
        self.put(field, Value::String(text));
    }
}

impl Visit for JsonVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, value.to_owned());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.text(field, format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logfmt::tests::Capture;

    /// What `emit` logs through the JSON format.
    fn text(emit: impl Fn()) -> String {
        let capture = Capture::default();
        let writer = {
            let c = capture.clone();
            move || c.clone()
        };
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .fmt_fields(JsonFields::new())
            .event_format(JsonFormat)
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        capture.text()
    }

    fn lines(emit: impl Fn()) -> Vec<Value> {
        text(emit)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn the_request_line_has_arrays_and_typed_fields() {
        let lines = lines(|| {
            tracing::info!(
                target: "keypool::request",
                request_id = %"req_kp_1",
                user_api_key_id = Some("alice"),
                client_api_key_id = None::<&str>,
                attempts = %r#"[{"account":"a","outcome":"rate_limited","status":429},{"account":"b","outcome":"ok","status":200}]"#,
                upstream_statuses = %"[429,200]",
                status = 200u16,
                ttft_ms = Some(12u64),
                stream = false,
                "request"
            );
            tracing::info!(attempts = %"[1]", "other targets keep strings");
        });
        let line = &lines[0];
        assert_eq!(line["message"], "request");
        assert_eq!(line["target"], "keypool::request");
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["user_api_key_id"], "alice");
        assert!(line.get("client_api_key_id").is_none());
        assert_eq!(line["attempts"][0]["account"], "a");
        assert_eq!(line["attempts"][0]["status"], 429);
        assert_eq!(line["attempts"][1]["outcome"], "ok");
        assert_eq!(line["upstream_statuses"], serde_json::json!([429, 200]));
        assert_eq!(line["status"], 200);
        assert_eq!(line["ttft_ms"], 12);
        assert_eq!(line["stream"], false);
        assert_eq!(line["timestamp"].as_str().unwrap().len(), 27);
        assert_eq!(lines[1]["attempts"], "[1]");
    }

    #[test]
    fn keys_keep_their_order() {
        let text = text(|| {
            tracing::info!(zeta = 1u64, alpha = "a", "hello");
        });
        let rest = text.split_once(r#""level":"INFO","#).unwrap().1;
        assert_eq!(
            rest,
            "\"message\":\"hello\",\"zeta\":1,\"alpha\":\"a\",\"target\":\"keypool::logjson::tests\"}\n"
        );
    }

    #[test]
    fn spans_are_listed() {
        let lines = lines(|| {
            let span = tracing::warn_span!("reload", file = "keypool.toml");
            let _e = span.enter();
            tracing::warn!(error = %"bad value", "config reload refused");
        });
        assert_eq!(lines[0]["span"]["name"], "reload");
        assert_eq!(lines[0]["span"]["file"], "keypool.toml");
        assert_eq!(lines[0]["spans"][0]["name"], "reload");
        assert_eq!(lines[0]["error"], "bad value");
    }
}
