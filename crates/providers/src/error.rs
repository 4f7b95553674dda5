//! The crate's one error type.

use keypool_core::{AuthType, Provider};

/// What can go wrong in a provider adapter.
///
/// The request-body variants ([`InvalidJson`](Self::InvalidJson),
/// [`BodyNotObject`](Self::BodyNotObject), [`MissingModel`](Self::MissingModel),
/// [`ModelNotString`](Self::ModelNotString), [`StreamNotBoolean`](Self::StreamNotBoolean))
/// are the client's fault: the proxy answers
/// them with `400 invalid_request_error` and the error's text, without any upstream call
/// ([`ProvidersError::is_client_error`]). The others are configuration problems of an
/// account. No variant ever carries a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvidersError {
    /// The request body is not valid JSON.
    #[error("request body is not valid JSON ({reason}): send a JSON Messages API request")]
    InvalidJson {
        /// Where and why parsing stopped (from the JSON parser; holds no body content).
        reason: String,
    },
    /// The request body is JSON but not an object.
    #[error("request body must be a JSON object: send a Messages API request object")]
    BodyNotObject,
    /// The request body has no top-level `model`.
    #[error("model: Field required: add a top-level \"model\" to the request body")]
    MissingModel,
    /// The top-level `model` is not a string.
    #[error("model: Input should be a valid string: set \"model\" to a model name")]
    ModelNotString,
    /// The top-level `stream` is present but not a boolean (`"true"`, `1`, …): keypool
    /// would not know whether the answer streams, and an upstream that coerces it would
    /// stream past every streaming safeguard.
    #[error("stream: Input should be a valid boolean: send \"stream\": true or false")]
    StreamNotBoolean,
    /// The provider and auth type combination has no adapter.
    #[error(
        "provider `{provider}` does not support auth type `{auth}`: use api_key or oauth for \
         anthropic, api_key or bearer for anthropic_compatible"
    )]
    UnsupportedAuth {
        /// The account's provider.
        provider: Provider,
        /// The account's auth type.
        auth: AuthType,
    },
    /// An `anthropic_compatible` or `openai` account has no `base_url`.
    #[error("providers other than anthropic need a base_url: set the account's base_url")]
    MissingBaseUrl,
    /// The account's `base_url` is not an absolute `http`/`https` URL without query.
    #[error(
        "base_url {base_url:?} is not usable ({reason}): give an absolute http(s) URL such as \
         https://api.example.com or https://api.example.com/anthropic"
    )]
    InvalidBaseUrl {
        /// The configured value (a URL, not a secret).
        base_url: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The account's secret cannot be sent as an HTTP header value.
    #[error(
        "the account's secret contains characters not allowed in an HTTP header (control \
         characters or line breaks): check the secret or the environment variable it comes from"
    )]
    InvalidSecret,
    /// An OpenAI Chat Completions request that cannot be translated to the Messages API:
    /// a field has the wrong type, or asks for something Anthropic cannot do (`n` > 1,
    /// audio, a JSON response format, …). The client's fault: the proxy answers `400` in
    /// the OpenAI error shape with [`param`](Self::param)
    /// ([`openai::invalid_request_body`](crate::openai::invalid_request_body)).
    #[error("{param}: {reason}")]
    ChatRequest {
        /// The offending field, as a path into the request (`messages[2].content[0].type`).
        param: String,
        /// What is wrong and what to send instead (holds no content of the request
        /// beyond type names).
        reason: String,
    },
    /// An Anthropic answer that cannot be turned into an OpenAI one (not JSON, not a
    /// message object). The upstream's fault, like any invalid answer.
    #[error("upstream answer cannot be translated to a chat completion: {reason}")]
    UntranslatableAnswer {
        /// Why (from the JSON parser or the missing field; no body content).
        reason: String,
    },
}

impl ProvidersError {
    /// True for the errors that are the client's fault (answer `400`), false for account
    /// configuration errors.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            Self::InvalidJson { .. }
                | Self::BodyNotObject
                | Self::MissingModel
                | Self::ModelNotString
                | Self::StreamNotBoolean
                | Self::ChatRequest { .. }
        )
    }

    /// The request field an OpenAI-shaped `400` names in `error.param`: the offending
    /// field of a [`ChatRequest`](Self::ChatRequest), `model` for the model errors,
    /// `stream` for [`StreamNotBoolean`](Self::StreamNotBoolean), else none.
    pub fn param(&self) -> Option<&str> {
        match self {
            Self::ChatRequest { param, .. } => Some(param),
            Self::MissingModel | Self::ModelNotString => Some("model"),
            Self::StreamNotBoolean => Some("stream"),
            _ => None,
        }
    }

    /// A [`ChatRequest`](Self::ChatRequest) error.
    pub(crate) fn chat(param: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::ChatRequest {
            param: param.into(),
            reason: reason.into(),
        }
    }
}
