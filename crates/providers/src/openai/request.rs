//! An OpenAI Chat Completions request turned into an Anthropic Messages request.
//!
//! | OpenAI | Messages API |
//! | --- | --- |
//! | `system` / `developer` messages (anywhere) | `system` text blocks, in order |
//! | `user` content: string, `text` and `image_url` parts | `user` turn with `text` / `image` blocks (`data:` URL → `base64` source, `http(s)` → `url` source) |
//! | `assistant` content and `tool_calls` | `assistant` turn with `text` and `tool_use` blocks (`arguments` parsed as JSON) |
//! | `tool` messages | `tool_result` blocks in a `user` turn |
//! | consecutive messages of one Anthropic role | one turn, blocks concatenated (so consecutive tool results share a turn) |
//! | `tools` (function tools) | `tools` with `input_schema` (`parameters`, default an empty object schema) |
//! | `tool_choice` `auto` / `none` / `required` / named function | `auto` / `none` / `any` / `tool` |
//! | `parallel_tool_calls: false` | `tool_choice.disable_parallel_tool_use: true` |
//! | `max_completion_tokens`, else `max_tokens`, else [`DEFAULT_MAX_TOKENS`] | `max_tokens` |
//! | `stop` (string or array) | `stop_sequences` |
//! | `temperature` (clamped to Anthropic's 0–1), `top_p` | the same |
//! | `stream`, `stream_options.include_usage` | `stream`; usage is always streamed by Anthropic |
//! | `user` | `metadata.user_id` |
//!
//! The model id is kept as given. Refused with [`ProvidersError::ChatRequest`]: `n` other
//! than 1, `logprobs: true`, audio output, a `response_format` other than `text`, the
//! deprecated `function` role, non-function tools, content parts other than text and
//! images. Other fields without an Anthropic equivalent (`frequency_penalty`,
//! `presence_penalty`, `seed`, `logit_bias`, `store`, `metadata`, `service_tier`, …) are
//! ignored.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::ProvidersError;

/// `max_tokens` sent when the request names neither `max_completion_tokens` nor
/// `max_tokens` (Anthropic requires one; OpenAI does not).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The image media types the Messages API accepts in a `base64` source.
const IMAGE_MEDIA_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// A translated request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The Messages API request body (JSON).
    pub body: Bytes,
    /// The model id, as the client gave it.
    pub model: String,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// `stream_options.include_usage`: the stream ends with a usage chunk.
    pub include_usage: bool,
}

/// Translates an OpenAI Chat Completions request body into a Messages API body.
///
/// # Errors
/// [`ProvidersError::InvalidJson`] / [`BodyNotObject`](ProvidersError::BodyNotObject) /
/// [`MissingModel`](ProvidersError::MissingModel) /
/// [`ModelNotString`](ProvidersError::ModelNotString) /
/// [`StreamNotBoolean`](ProvidersError::StreamNotBoolean) as for Messages requests, and
/// [`ProvidersError::ChatRequest`] (with the offending field) for everything else that
/// cannot be translated. All are client errors: answer `400` with
/// [`invalid_request_body`](super::invalid_request_body).
pub fn chat_to_messages(body: &[u8]) -> Result<ChatRequest, ProvidersError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ProvidersError::InvalidJson {
        reason: e.to_string(),
    })?;
    let Value::Object(req) = value else {
        return Err(ProvidersError::BodyNotObject);
    };
    let model = match req.get("model") {
        None | Some(Value::Null) => return Err(ProvidersError::MissingModel),
        Some(Value::String(model)) => model.clone(),
        Some(_) => return Err(ProvidersError::ModelNotString),
    };
    let stream = match req.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(stream)) => *stream,
        Some(_) => return Err(ProvidersError::StreamNotBoolean),
    };
    refuse_unsupported(&req)?;
    let include_usage = include_usage(&req)?;

    let mut out = Map::new();
    out.insert("model".into(), Value::String(model.clone()));
    let (system, messages) = translate_messages(req.get("messages"))?;
    if !system.is_empty() {
        out.insert("system".into(), Value::Array(system));
    }
    out.insert("messages".into(), Value::Array(messages));
    out.insert("max_tokens".into(), json!(max_tokens(&req)?));
    sampling(&req, &mut out)?;
    tools(&req, &mut out)?;
    if stream {
        out.insert("stream".into(), Value::Bool(true));
    }
    if let Some(user) = optional_str(&req, "user")? {
        out.insert("metadata".into(), json!({ "user_id": user }));
    }
    let body =
        serde_json::to_vec(&Value::Object(out)).map_err(|e| ProvidersError::InvalidJson {
            reason: e.to_string(),
        })?;
    Ok(ChatRequest {
        body: Bytes::from(body),
        model,
        stream,
        include_usage,
    })
}

/// Refuses the fields that ask for what the Messages API cannot give.
fn refuse_unsupported(req: &Map<String, Value>) -> Result<(), ProvidersError> {
    match req.get("n") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(_) => return Err(ProvidersError::chat("n", "only n = 1 is supported")),
    }
    if req.get("logprobs") == Some(&Value::Bool(true)) {
        return Err(ProvidersError::chat(
            "logprobs",
            "logprobs are not supported",
        ));
    }
    if req.get("audio").is_some_and(|a| !a.is_null()) {
        return Err(ProvidersError::chat(
            "audio",
            "audio output is not supported",
        ));
    }
    if let Some(Value::Array(modalities)) = req.get("modalities")
        && modalities.iter().any(|m| m.as_str() != Some("text"))
    {
        return Err(ProvidersError::chat(
            "modalities",
            "only the text modality is supported",
        ));
    }
    match req.get("response_format") {
        None | Some(Value::Null) => Ok(()),
        Some(format) if format.get("type").and_then(Value::as_str) == Some("text") => Ok(()),
        Some(_) => Err(ProvidersError::chat(
            "response_format",
            "only the text response format is supported: describe the JSON you want in a \
             message, or use a tool",
        )),
    }
}

fn include_usage(req: &Map<String, Value>) -> Result<bool, ProvidersError> {
    match req.get("stream_options") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(options)) => match options.get("include_usage") {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(on)) => Ok(*on),
            Some(_) => Err(ProvidersError::chat(
                "stream_options.include_usage",
                "must be a boolean",
            )),
        },
        Some(_) => Err(ProvidersError::chat("stream_options", "must be an object")),
    }
}

fn max_tokens(req: &Map<String, Value>) -> Result<u64, ProvidersError> {
    for field in ["max_completion_tokens", "max_tokens"] {
        match req.get(field) {
            None | Some(Value::Null) => continue,
            Some(value) => {
                return value
                    .as_u64()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| ProvidersError::chat(field, "must be a positive integer"));
            }
        }
    }
    Ok(DEFAULT_MAX_TOKENS)
}

/// `temperature` (clamped to 0–1), `top_p` and `stop`.
fn sampling(req: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), ProvidersError> {
    if let Some(t) = optional_number(req, "temperature")? {
        out.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
    }
    if let Some(p) = optional_number(req, "top_p")? {
        out.insert("top_p".into(), json!(p));
    }
    let stops: Vec<Value> = match req.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(stop)) => vec![Value::String(stop.clone())],
        Some(Value::Array(stops)) if stops.iter().all(Value::is_string) => stops.clone(),
        Some(_) => {
            return Err(ProvidersError::chat(
                "stop",
                "must be a string or an array of strings",
            ));
        }
    };
    if !stops.is_empty() {
        out.insert("stop_sequences".into(), Value::Array(stops));
    }
    Ok(())
}

/// `tools`, `tool_choice` and `parallel_tool_calls`.
fn tools(req: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), ProvidersError> {
    match req.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            let tools = tools
                .iter()
                .enumerate()
                .map(|(i, tool)| translate_tool(i, tool))
                .collect::<Result<Vec<_>, _>>()?;
            if !tools.is_empty() {
                out.insert("tools".into(), Value::Array(tools));
            }
        }
        Some(_) => return Err(ProvidersError::chat("tools", "must be an array")),
    }
    let mut choice = match req.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(choice) => Some(translate_tool_choice(choice)?),
    };
    match req.get("parallel_tool_calls") {
        None | Some(Value::Null) | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => {
            let choice = choice.get_or_insert_with(|| json!({ "type": "auto" }));
            if choice["type"] != "none" {
                choice["disable_parallel_tool_use"] = Value::Bool(true);
            }
        }
        Some(_) => {
            return Err(ProvidersError::chat(
                "parallel_tool_calls",
                "must be a boolean",
            ));
        }
    }
    if let Some(choice) = choice
        && out.contains_key("tools")
    {
        out.insert("tool_choice".into(), choice);
    }
    Ok(())
}

fn translate_tool(i: usize, tool: &Value) -> Result<Value, ProvidersError> {
    let param = |field: &str| format!("tools[{i}]{field}");
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ProvidersError::chat(
            param(".type"),
            "only function tools are supported",
        ));
    }
    let Some(function) = tool.get("function").filter(|f| f.is_object()) else {
        return Err(ProvidersError::chat(
            param(".function"),
            "must be an object",
        ));
    };
    let Some(name) = function.get("name").and_then(Value::as_str) else {
        return Err(ProvidersError::chat(
            param(".function.name"),
            "must be a string",
        ));
    };
    let mut out = Map::new();
    out.insert("name".into(), Value::String(name.to_owned()));
    match function.get("description") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => {
            out.insert("description".into(), Value::String(text.clone()));
        }
        Some(_) => {
            return Err(ProvidersError::chat(
                param(".function.description"),
                "must be a string",
            ));
        }
    }
    let schema = match function.get("parameters") {
        None | Some(Value::Null) => json!({ "type": "object", "properties": {} }),
        Some(schema @ Value::Object(_)) => schema.clone(),
        Some(_) => {
            return Err(ProvidersError::chat(
                param(".function.parameters"),
                "must be a JSON Schema object",
            ));
        }
    };
    out.insert("input_schema".into(), schema);
    Ok(Value::Object(out))
}

fn translate_tool_choice(choice: &Value) -> Result<Value, ProvidersError> {
    let invalid = || {
        ProvidersError::chat(
            "tool_choice",
            "must be \"auto\", \"none\", \"required\" or {\"type\":\"function\",\"function\":{\"name\":…}}",
        )
    };
    match choice {
        Value::String(mode) => match mode.as_str() {
            "auto" => Ok(json!({ "type": "auto" })),
            "none" => Ok(json!({ "type": "none" })),
            "required" => Ok(json!({ "type": "any" })),
            _ => Err(invalid()),
        },
        Value::Object(named) if named.get("type").and_then(Value::as_str) == Some("function") => {
            let name = named
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(invalid)?;
            Ok(json!({ "type": "tool", "name": name }))
        }
        _ => Err(invalid()),
    }
}

/// The `system` blocks and the turns of `messages`.
fn translate_messages(
    messages: Option<&Value>,
) -> Result<(Vec<Value>, Vec<Value>), ProvidersError> {
    let Some(Value::Array(messages)) = messages else {
        return Err(ProvidersError::chat(
            "messages",
            "must be an array of messages",
        ));
    };
    let mut system = Vec::new();
    let mut turns = Turns::default();
    for (i, message) in messages.iter().enumerate() {
        let at = |field: &str| format!("messages[{i}]{field}");
        let Some(role) = message.get("role").and_then(Value::as_str) else {
            return Err(ProvidersError::chat(at(".role"), "must be a string"));
        };
        match role {
            "system" | "developer" => {
                // Anthropic refuses empty text blocks; an empty system prompt says nothing.
                let blocks = text_blocks(message.get("content"), &at(".content"))?;
                system.extend(blocks.into_iter().filter(|block| block["text"] != ""));
            }
            "user" => turns.push(
                "user",
                user_blocks(message.get("content"), &at(".content"))?,
            ),
            "assistant" => turns.push("assistant", assistant_blocks(message, &at(""))?),
            "tool" => turns.push("user", vec![tool_result(message, &at(""))?]),
            "function" => {
                return Err(ProvidersError::chat(
                    at(".role"),
                    "the deprecated function role is not supported: use tool_calls and tool messages",
                ));
            }
            _ => {
                return Err(ProvidersError::chat(
                    at(".role"),
                    "must be system, developer, user, assistant or tool",
                ));
            }
        }
    }
    Ok((system, turns.0))
}

/// Anthropic turns being built: a block list pushed for the role of the last turn joins
/// it.
#[derive(Default)]
struct Turns(Vec<Value>);

impl Turns {
    fn push(&mut self, role: &str, blocks: Vec<Value>) {
        if let Some(last) = self.0.last_mut()
            && last["role"] == role
            && let Some(Value::Array(content)) = last.get_mut("content")
        {
            content.extend(blocks);
            return;
        }
        self.0.push(json!({ "role": role, "content": blocks }));
    }
}

/// Content made only of text: a string, or an array of `text` (or `refusal`) parts.
fn text_blocks(content: Option<&Value>, param: &str) -> Result<Vec<Value>, ProvidersError> {
    match content {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) => Ok(vec![text_block(text)]),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| {
                let at = format!("{param}[{j}]");
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => part_text(part, "text", &at),
                    Some("refusal") => part_text(part, "refusal", &at),
                    _ => Err(ProvidersError::chat(
                        format!("{at}.type"),
                        "only text parts are supported here",
                    )),
                }
            })
            .collect(),
        Some(_) => Err(ProvidersError::chat(
            param,
            "must be a string or an array of content parts",
        )),
    }
}

fn part_text(part: &Value, field: &str, at: &str) -> Result<Value, ProvidersError> {
    part.get(field)
        .and_then(Value::as_str)
        .map(text_block)
        .ok_or_else(|| ProvidersError::chat(format!("{at}.{field}"), "must be a string"))
}

fn text_block(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

/// A user message's content: text and images.
fn user_blocks(content: Option<&Value>, param: &str) -> Result<Vec<Value>, ProvidersError> {
    let Some(Value::Array(parts)) = content else {
        return text_blocks(content, param);
    };
    parts
        .iter()
        .enumerate()
        .map(|(j, part)| {
            let at = format!("{param}[{j}]");
            match part.get("type").and_then(Value::as_str) {
                Some("text") => part_text(part, "text", &at),
                Some("image_url") => image_block(part.get("image_url"), &format!("{at}.image_url")),
                Some(other) => Err(ProvidersError::chat(
                    format!("{at}.type"),
                    format!(
                        "content parts of type {other:?} are not supported: use text or image_url"
                    ),
                )),
                None => Err(ProvidersError::chat(
                    format!("{at}.type"),
                    "must be a string",
                )),
            }
        })
        .collect()
}

/// An `image_url` part (`{"url": …}` or, in older clients, the URL itself).
fn image_block(image: Option<&Value>, param: &str) -> Result<Value, ProvidersError> {
    let url = match image {
        Some(Value::String(url)) => url.as_str(),
        Some(Value::Object(image)) => match image.get("url") {
            Some(Value::String(url)) => url.as_str(),
            _ => {
                return Err(ProvidersError::chat(
                    format!("{param}.url"),
                    "must be a string",
                ));
            }
        },
        _ => return Err(ProvidersError::chat(param, "must be an object with a url")),
    };
    if let Some(data_url) = url.strip_prefix("data:") {
        let (media_type, data) = parse_data_url(data_url).ok_or_else(|| {
            ProvidersError::chat(
                format!("{param}.url"),
                "must be a base64 data: URL (data:image/png;base64,…) or an http(s) URL",
            )
        })?;
        if !IMAGE_MEDIA_TYPES.contains(&media_type) {
            return Err(ProvidersError::chat(
                format!("{param}.url"),
                "images must be image/jpeg, image/png, image/gif or image/webp",
            ));
        }
        return Ok(json!({
            "type": "image",
            "source": { "type": "base64", "media_type": media_type, "data": data },
        }));
    }
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("https://") || lower.starts_with("http://") {
        return Ok(json!({ "type": "image", "source": { "type": "url", "url": url } }));
    }
    Err(ProvidersError::chat(
        format!("{param}.url"),
        "must be a base64 data: URL or an http(s) URL",
    ))
}

/// `image/png;base64,AAAA` → (`image/png`, `AAAA`), when the data is well-formed base64.
fn parse_data_url(rest: &str) -> Option<(&str, &str)> {
    let (meta, data) = rest.split_once(',')?;
    let media_type = meta.strip_suffix(";base64")?;
    is_base64(data).then_some((media_type, data))
}

/// Standard base64 with padding: what the Messages API accepts as image data.
pub(crate) fn is_base64(data: &str) -> bool {
    let bytes = data.as_bytes();
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return false;
    }
    let body = data.trim_end_matches('=');
    bytes.len() - body.len() <= 2
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

/// An assistant message: its text, then its tool calls as `tool_use` blocks.
fn assistant_blocks(message: &Value, at: &str) -> Result<Vec<Value>, ProvidersError> {
    let mut blocks = text_blocks(message.get("content"), &format!("{at}.content"))?;
    // Anthropic refuses empty text blocks; an assistant turn with only tool calls often
    // carries `"content": ""`.
    blocks.retain(|block| block["text"] != "");
    match message.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) => {
            for (j, call) in calls.iter().enumerate() {
                blocks.push(tool_use(call, &format!("{at}.tool_calls[{j}]"))?);
            }
        }
        Some(_) => {
            return Err(ProvidersError::chat(
                format!("{at}.tool_calls"),
                "must be an array",
            ));
        }
    }
    Ok(blocks)
}

fn tool_use(call: &Value, at: &str) -> Result<Value, ProvidersError> {
    let field = |name: &str| -> Result<&str, ProvidersError> {
        let value = match name.split_once('.') {
            Some((outer, inner)) => call.get(outer).and_then(|o| o.get(inner)),
            None => call.get(name),
        };
        value
            .and_then(Value::as_str)
            .ok_or_else(|| ProvidersError::chat(format!("{at}.{name}"), "must be a string"))
    };
    let id = field("id")?;
    let name = field("function.name")?;
    let arguments = field("function.arguments")?;
    let input: Value = if arguments.trim().is_empty() {
        json!({})
    } else {
        serde_json::from_str(arguments).map_err(|_| {
            ProvidersError::chat(
                format!("{at}.function.arguments"),
                "must be a JSON object encoded as a string",
            )
        })?
    };
    if !input.is_object() {
        return Err(ProvidersError::chat(
            format!("{at}.function.arguments"),
            "must be a JSON object encoded as a string",
        ));
    }
    Ok(json!({ "type": "tool_use", "id": id, "name": name, "input": input }))
}

fn tool_result(message: &Value, at: &str) -> Result<Value, ProvidersError> {
    let Some(id) = message.get("tool_call_id").and_then(Value::as_str) else {
        return Err(ProvidersError::chat(
            format!("{at}.tool_call_id"),
            "must be a string",
        ));
    };
    let content = match message.get("content") {
        Some(Value::String(text)) => Value::String(text.clone()),
        other => Value::Array(text_blocks(other, &format!("{at}.content"))?),
    };
    Ok(json!({ "type": "tool_result", "tool_use_id": id, "content": content }))
}

fn optional_str<'a>(
    req: &'a Map<String, Value>,
    field: &str,
) -> Result<Option<&'a str>, ProvidersError> {
    match req.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(ProvidersError::chat(field, "must be a string")),
    }
}

fn optional_number(req: &Map<String, Value>, field: &str) -> Result<Option<f64>, ProvidersError> {
    match req.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_f64()
            .filter(|n| n.is_finite() && *n >= 0.0)
            .map(Some)
            .ok_or_else(|| ProvidersError::chat(field, "must be a non-negative number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translate(request: Value) -> Result<Value, ProvidersError> {
        let out = chat_to_messages(request.to_string().as_bytes())?;
        Ok(serde_json::from_slice(&out.body).unwrap())
    }

    fn param_of(request: Value) -> String {
        match translate(request) {
            Err(ProvidersError::ChatRequest { param, .. }) => param,
            other => panic!("not a chat request error: {other:?}"),
        }
    }

    #[test]
    fn base64_check_wants_the_standard_padded_alphabet() {
        for ok in ["AAAA", "AA==", "AAA=", "ab+/", "QUJD"] {
            assert!(is_base64(ok), "{ok}");
        }
        for bad in ["", "A", "AAA", "A===", "AA=A", "AA-_", "AA AA", "===="] {
            assert!(!is_base64(bad), "{bad}");
        }
    }

    #[test]
    fn images_need_a_supported_type_and_scheme() {
        let image = |url: &str| {
            json!({"model":"m","messages":[{"role":"user","content":[
                {"type":"image_url","image_url":{"url":url}}]}]})
        };
        assert_eq!(
            param_of(image("data:image/tiff;base64,AAAA")),
            "messages[0].content[0].image_url.url"
        );
        assert_eq!(
            param_of(image("data:image/png,AAAA")),
            "messages[0].content[0].image_url.url"
        );
        assert_eq!(
            param_of(image("ftp://x/y.png")),
            "messages[0].content[0].image_url.url"
        );
        let out = translate(image("HTTPS://example.com/a.png")).unwrap();
        assert_eq!(out["messages"][0]["content"][0]["source"]["type"], "url");
        // Older clients send the URL itself.
        let old = json!({"model":"m","messages":[{"role":"user","content":[
            {"type":"image_url","image_url":"data:image/gif;base64,R0lG"}]}]});
        let out = translate(old).unwrap();
        assert_eq!(
            out["messages"][0]["content"][0]["source"]["media_type"],
            "image/gif"
        );
    }

    #[test]
    fn fields_of_the_wrong_type_name_their_param() {
        let base = |extra: Value| {
            let mut request = json!({"model":"m","messages":[{"role":"user","content":"hi"}]});
            for (key, value) in extra.as_object().unwrap() {
                request[key] = value.clone();
            }
            request
        };
        for (extra, param) in [
            (json!({"max_tokens": 0}), "max_tokens"),
            (
                json!({"max_completion_tokens": "10"}),
                "max_completion_tokens",
            ),
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"stop": [1]}), "stop"),
            (json!({"user": 5}), "user"),
            (json!({"tools": {}}), "tools"),
            (json!({"tools": [{"type":"retrieval"}]}), "tools[0].type"),
            (
                json!({"tools": [{"type":"function","function":{}}]}),
                "tools[0].function.name",
            ),
            (json!({"tool_choice": "sometimes"}), "tool_choice"),
            (
                json!({"stream_options": {"include_usage": "yes"}}),
                "stream_options.include_usage",
            ),
            (json!({"messages": "hi"}), "messages"),
            (json!({"messages": [{"content":"x"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role":"function","content":"x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role":"tool","content":"x"}]}),
                "messages[0].tool_call_id",
            ),
            (json!({"logprobs": true}), "logprobs"),
            (json!({"modalities": ["text","audio"]}), "modalities"),
        ] {
            assert_eq!(param_of(base(extra.clone())), param, "{extra}");
        }
        assert_eq!(
            chat_to_messages(br#"{"model":"m","stream":"yes","messages":[]}"#),
            Err(ProvidersError::StreamNotBoolean)
        );
        assert_eq!(chat_to_messages(b"[]"), Err(ProvidersError::BodyNotObject));
    }

    #[test]
    fn ignored_fields_and_defaults() {
        let out = translate(
            json!({"model":"m","messages":[{"role":"user","content":"hi"}],
            "n":1,"logprobs":false,"presence_penalty":1,"seed":3,"response_format":{"type":"text"},
            "tool_choice":"auto","parallel_tool_calls":false}),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"model":"m","max_tokens":DEFAULT_MAX_TOKENS,
                "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]})
        );
        // Without tools, tool_choice is not sent (Anthropic refuses it alone).
        assert!(out.get("tool_choice").is_none());
        let empty_system = translate(json!({"model":"m","messages":[
            {"role":"system","content":""},{"role":"user","content":"hi"}]}))
        .unwrap();
        assert!(empty_system.get("system").is_none());
    }
}
