/// A Messages answer with about `text_bytes` of text (with escapes) and a tool call.
/// Shared by the `answer_body` bench and the tests of `answer_scan` (through
/// `include!`).
fn big_message(text_bytes: usize) -> Vec<u8> {
    let line = "The quick brown fox said \\\"hi\\\" \\u00e9 and jumped over the lazy dog.\\n";
    let text = line.repeat(text_bytes / line.len() + 1);
    format!(
        r#"{{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{{"type":"text","text":"{text}"}},{{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{{"location":"Paris","days":[1,2,3],"units":null}}}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":18240,"output_tokens":503,"service_tier":"standard"}}}}"#
    )
    .into_bytes()
}
