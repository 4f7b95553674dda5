//! The body of `GET /v1/models` in the OpenAI shape.

use bytes::Bytes;
use serde::Serialize;

/// The Claude model ids `GET /v1/models` lists for every pool (besides the accounts'
/// own `model` overrides): the current models and their aliases. A request may name
/// any other id; this list is what OpenAI clients are shown to choose from.
pub const CLAUDE_MODEL_IDS: [&str; 8] = [
    "claude-opus-4-5",
    "claude-sonnet-4-5",
    "claude-haiku-4-5",
    "claude-opus-4-1",
    "claude-opus-4-0",
    "claude-sonnet-4-0",
    "claude-3-7-sonnet-latest",
    "claude-3-5-haiku-latest",
];

#[derive(Serialize)]
struct ModelList<'a> {
    object: &'static str,
    data: Vec<Model<'a>>,
}

#[derive(Serialize)]
struct Model<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'a str,
}

/// `{"object":"list","data":[{"id":…,"object":"model","created":…,"owned_by":…},…]}`
/// for `ids` in the order given (duplicates dropped, first kept). `created` (unix
/// seconds) and `owned_by` (e.g. `anthropic`) are the same for every entry: keypool
/// knows the ids its URL config may serve, not when each model was published.
pub fn models_body<'a>(
    ids: impl IntoIterator<Item = &'a str>,
    created: u64,
    owned_by: &str,
) -> Bytes {
    let mut data: Vec<Model<'_>> = Vec::new();
    for id in ids {
        if data.iter().all(|m| m.id != id) {
            data.push(Model {
                id,
                object: "model",
                created,
                owned_by,
            });
        }
    }
    let list = ModelList {
        object: "list",
        data,
    };
    // Serialising strings and integers cannot fail.
    Bytes::from(serde_json::to_vec(&list).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_each_model_once_in_order() {
        let body = models_body(
            ["claude-sonnet-4-5", "claude-haiku-4-5", "claude-sonnet-4-5"],
            1_700_000_000,
            "anthropic",
        );
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"object":"list","data":[
                {"id":"claude-sonnet-4-5","object":"model","created":1_700_000_000,"owned_by":"anthropic"},
                {"id":"claude-haiku-4-5","object":"model","created":1_700_000_000,"owned_by":"anthropic"},
            ]})
        );
        let empty: serde_json::Value = serde_json::from_slice(&models_body([], 0, "x")).unwrap();
        assert_eq!(empty, serde_json::json!({"object":"list","data":[]}));
    }
}
