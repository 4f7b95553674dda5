//! Tool calls: when the simulator answers a request with a call of one of its tools.
//!
//! The rule is the same on both wire formats, so a client's tool round trip works with
//! any script: a request that offers tools (and does not forbid them with
//! `tool_choice` `none`) and whose last message is the user's own (not the result of a
//! tool) is answered, by an `Ok` behaviour, with a call of the tool `tool_choice` names,
//! else of the first tool. The arguments fill every property of the tool's schema with a
//! value of its type (`"sim"`, `1`, `true`, `[]`, `{}`). The next request, which carries
//! the tool's result, gets the scripted text answer.

use serde_json::{Map, Value};

/// The call the simulator makes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCall {
    /// `toolu_sim…` (Messages API) or `call_sim…` (Chat Completions).
    pub(crate) id: String,
    /// The tool's name.
    pub(crate) name: String,
    /// The arguments, a JSON object as text.
    pub(crate) arguments: String,
}

/// Whether `body` may name tools at all (skips parsing the many requests that do not).
fn mentions_tools(body: &[u8]) -> bool {
    body.windows(7).any(|w| w == b"\"tools\"")
}

/// The call a Messages API request gets, if any.
pub(crate) fn messages_tool_call(body: &[u8], n: u64) -> Option<ToolCall> {
    if !mentions_tools(body) {
        return None;
    }
    let request: Value = serde_json::from_slice(body).ok()?;
    let tools = request.get("tools")?.as_array()?;
    let choice = request.get("tool_choice");
    if choice.and_then(|c| c.get("type")).and_then(Value::as_str) == Some("none") {
        return None;
    }
    let last = request.get("messages")?.as_array()?.last()?;
    let from_tool = last
        .get("content")
        .and_then(Value::as_array)
        .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"));
    if last.get("role")?.as_str()? != "user" || from_tool {
        return None;
    }
    let named = choice
        .filter(|c| c["type"] == "tool")
        .and_then(|c| c.get("name"))
        .and_then(Value::as_str);
    let tool = pick(tools, named, |tool| tool.get("name"))?;
    Some(ToolCall {
        id: format!("toolu_sim{n:020}"),
        name: tool.get("name")?.as_str()?.to_owned(),
        arguments: arguments(tool.get("input_schema")),
    })
}

/// The call a Chat Completions request gets, if any.
pub(crate) fn chat_tool_call(body: &[u8], n: u64) -> Option<ToolCall> {
    if !mentions_tools(body) {
        return None;
    }
    let request: Value = serde_json::from_slice(body).ok()?;
    let tools = request.get("tools")?.as_array()?;
    let choice = request.get("tool_choice");
    if choice.and_then(Value::as_str) == Some("none") {
        return None;
    }
    let last = request.get("messages")?.as_array()?.last()?;
    if last.get("role")?.as_str()? != "user" {
        return None;
    }
    let named = choice
        .and_then(|c| c.get("function"))
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str);
    let tool = pick(tools, named, |tool| tool.get("function")?.get("name"))?;
    let function = tool.get("function")?;
    Some(ToolCall {
        id: format!("call_sim{n:020}"),
        name: function.get("name")?.as_str()?.to_owned(),
        arguments: arguments(function.get("parameters")),
    })
}

/// The tool called `named` when there is one, else the first.
fn pick<'a>(
    tools: &'a [Value],
    named: Option<&str>,
    name_of: impl Fn(&Value) -> Option<&Value>,
) -> Option<&'a Value> {
    named
        .and_then(|wanted| {
            tools
                .iter()
                .find(|t| name_of(t).and_then(Value::as_str) == Some(wanted))
        })
        .or_else(|| tools.first())
}

/// Arguments for a JSON Schema: every property with a value of its type.
fn arguments(schema: Option<&Value>) -> String {
    let mut out = Map::new();
    if let Some(properties) = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
    {
        for (name, property) in properties {
            let value = match property.get("type").and_then(Value::as_str) {
                Some("integer" | "number") => Value::from(1),
                Some("boolean") => Value::Bool(true),
                Some("array") => Value::Array(Vec::new()),
                Some("object") => Value::Object(Map::new()),
                _ => Value::from("sim"),
            };
            out.insert(name.clone(), value);
        }
    }
    Value::Object(out).to_string()
}

/// `text` cut into `pieces` parts of about equal length, at character boundaries (at
/// least one part, none empty unless `text` is).
pub(crate) fn fragments(text: &str, pieces: usize) -> Vec<&str> {
    let chars: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let pieces = pieces.clamp(1, chars.len().max(1));
    let mut out = Vec::with_capacity(pieces);
    let mut start = 0;
    for k in 1..=pieces {
        let end = if k == pieces {
            text.len()
        } else {
            chars[chars.len() * k / pieces]
        };
        out.push(&text[start..end]);
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_user_turn_with_tools_gets_a_call_and_a_tool_result_does_not() {
        let weather = json!({"name":"get_weather","input_schema":{"type":"object","properties":{
            "city":{"type":"string"},"days":{"type":"integer"},"hourly":{"type":"boolean"}}}});
        let ask =
            json!({"model":"m","tools":[weather],"messages":[{"role":"user","content":"Paris?"}]});
        let call = messages_tool_call(ask.to_string().as_bytes(), 3).unwrap();
        assert_eq!(call.name, "get_weather");
        assert_eq!(call.id, "toolu_sim00000000000000000003");
        let args: Value = serde_json::from_str(&call.arguments).unwrap();
        assert_eq!(args, json!({"city":"sim","days":1,"hourly":true}));

        let answered = json!({"model":"m","tools":[{"name":"t"}],"messages":[
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"x","content":"18 C"}]}]});
        assert_eq!(messages_tool_call(answered.to_string().as_bytes(), 1), None);
        let none = json!({"model":"m","tools":[{"name":"t"}],"tool_choice":{"type":"none"},
            "messages":[{"role":"user","content":"hi"}]});
        assert_eq!(messages_tool_call(none.to_string().as_bytes(), 1), None);
        assert_eq!(
            messages_tool_call(br#"{"model":"m","messages":[]}"#, 1),
            None
        );
    }

    #[test]
    fn chat_requests_follow_the_same_rule_and_tool_choice_names_the_tool() {
        let tools = json!([
            {"type":"function","function":{"name":"first"}},
            {"type":"function","function":{"name":"second","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}]);
        let ask = json!({"model":"m","tools":tools,"tool_choice":{"type":"function","function":{"name":"second"}},
            "messages":[{"role":"user","content":"go"}]});
        let call = chat_tool_call(ask.to_string().as_bytes(), 7).unwrap();
        assert_eq!(
            (call.name.as_str(), call.arguments.as_str()),
            ("second", r#"{"q":"sim"}"#)
        );
        assert!(call.id.starts_with("call_sim"));
        let first = json!({"model":"m","tools":tools,"messages":[{"role":"user","content":"go"}]});
        assert_eq!(
            chat_tool_call(first.to_string().as_bytes(), 7)
                .unwrap()
                .arguments,
            "{}"
        );
        let after = json!({"model":"m","tools":tools,"messages":[{"role":"user","content":"go"},
            {"role":"tool","tool_call_id":"c","content":"done"}]});
        assert_eq!(chat_tool_call(after.to_string().as_bytes(), 7), None);
        let none = json!({"model":"m","tools":tools,"tool_choice":"none","messages":[{"role":"user","content":"go"}]});
        assert_eq!(chat_tool_call(none.to_string().as_bytes(), 7), None);
    }

    #[test]
    fn fragments_cover_the_text_at_character_boundaries() {
        assert_eq!(
            fragments(r#"{"q":"sim"}"#, 3),
            [r#"{"q"#, r#"":"s"#, r#"im"}"#]
        );
        assert_eq!(fragments("{}", 4), ["{", "}"]);
        assert_eq!(fragments("", 4), [""]);
        assert_eq!(fragments("héé", 2).concat(), "héé");
        assert_eq!(fragments("abc", 0), ["abc"]);
    }
}
