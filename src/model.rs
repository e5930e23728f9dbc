//! What kodx says to a model and hears back, independent of the provider: the seam between
//! the agent loop and the Anthropic / OpenAI clients (SPEC §7).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::image::{Image, ImageKind};

/// Who speaks in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    /// The model asks for a tool call. `input` is whatever JSON the model produced.
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    /// kodx answers a tool call.
    ToolResult {
        tool_use_id: String,
        content: String,
        is_error: bool,
    },
    /// An image the user gave (only in a user message, after its text). A transcript keeps
    /// its kind, size and SHA-256, not its bytes.
    Image {
        image: Image,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Block>,
}

impl Message {
    pub fn user_text(text: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }

    /// A user message of `text` followed by `images`.
    pub fn user_with_images(text: impl Into<String>, images: &[Image]) -> Self {
        let mut m = Message::user_text(text);
        m.content
            .extend(images.iter().map(|i| Block::Image { image: i.clone() }));
        m
    }

    /// The text blocks of the message, joined.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A tool offered to the model: name, description, JSON schema of its input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// One model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub model: String,
    pub system: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub max_tokens: u32,
    pub temperature: Option<f32>,
    /// The model may not call a tool in this call (`tool_choice: none`; the tools stay
    /// described, as the conversation holds tool calls): the run's last call, which asks
    /// for the summary.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub answer_only: bool,
}

/// Tokens of one call, each kind counted once (SPEC §7): `input_tokens` excludes the
/// cached ones, which are in `cache_write_tokens` and `cache_read_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_write_tokens: u64,
    pub cache_read_tokens: u64,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
    }

    /// Every token the model read for this call, cached or not.
    pub fn prompt_tokens(&self) -> u64 {
        self.input_tokens + self.cache_write_tokens + self.cache_read_tokens
    }
}

/// Why the model stopped (the provider's own words mapped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelStop {
    EndTurn,
    ToolUse,
    MaxTokens,
    Other(String),
}

/// One model answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub content: Vec<Block>,
    pub stop: ModelStop,
    pub usage: Usage,
    /// The model that answered, as the provider names it.
    pub model: String,
}

/// A failed model call, in words a user can act on. Secrets are never in it.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// Not worth retrying: bad key, bad request, unknown model…
    #[error("{provider} API error {status}: {message}")]
    Api {
        provider: &'static str,
        status: u16,
        message: String,
    },
    /// Retried until the retry budget ran out.
    #[error("{provider} API unavailable after {attempts} attempts: {last}")]
    Exhausted {
        provider: &'static str,
        attempts: u32,
        last: String,
    },
    /// The answer did not have the documented shape.
    #[error("{provider} API answered something kodx cannot read: {detail}")]
    Malformed {
        provider: &'static str,
        detail: String,
    },
}

/// A model provider (Anthropic Messages, OpenAI-compatible Chat Completions).
#[async_trait]
pub trait Provider: Send + Sync {
    /// `anthropic` or `openai`.
    fn name(&self) -> &'static str;

    async fn complete(&self, request: &Request) -> Result<Response, ProviderError>;

    /// The prompt tokens `request` would be billed for, as the provider itself counts them
    /// without running the model (Anthropic's `POST /v1/messages/count_tokens`, free of
    /// charge). `None` when the provider cannot count or the count failed: the caller then
    /// keeps its byte bound. Asked only when that bound would shorten a call.
    async fn count_tokens(&self, _request: &Request) -> Option<u64> {
        None
    }
}
