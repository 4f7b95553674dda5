//! A realistic Anthropic Messages stream, shared by the tests and the bench.

/// Builds the byte stream of one `stream: true` answer with `deltas` text deltas, in the
/// event order and shapes the Anthropic API sends.
pub fn anthropic_stream(deltas: usize) -> Vec<u8> {
    let mut s = String::new();
    s.push_str(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5-20250929\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":2475,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":18240,\"output_tokens\":1}}}\n\n",
    );
    s.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
    s.push_str("event: ping\ndata: {\"type\": \"ping\"}\n\n");
    let words = [
        "The",
        " quick",
        " brown",
        " fox",
        " — jumps",
        " over",
        " the",
        " lazy",
        " dog.\\n",
        " «café»",
    ];
    for i in 0..deltas {
        let text = format!("{}{} and then some more words", words[i % words.len()], i);
        s.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"");
        s.push_str(&text);
        s.push_str("\"}}\n\n");
    }
    s.push_str(
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    );
    s.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":812}}\n\n");
    s.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    s.into_bytes()
}
