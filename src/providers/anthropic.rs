//! The Anthropic Messages API (`POST {ANTHROPIC_BASE_URL}/v1/messages`): tool use, stop
//! reasons, and prompt caching on the system prompt and the growing conversation so that
//! repeated context is billed at the cache-read price.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};

use super::retry::{send_with_retry, RetryPolicy};
use secrecy::{ExposeSecret, SecretString};

use super::{http_client, join_url, redact_key};
use crate::model::{
    Block, Message, ModelStop, Provider, ProviderError, Request, Response, Role, Usage,
};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const API_VERSION: &str = "2023-06-01";
const NAME: &str = "anthropic";

#[derive(Debug, Clone)]
pub struct AnthropicClient {
    base_url: String,
    key: SecretString,
    retry: RetryPolicy,
}

impl AnthropicClient {
    pub fn new(base_url: impl Into<String>, key: impl Into<SecretString>) -> Self {
        AnthropicClient {
            base_url: base_url.into(),
            key: key.into(),
            retry: RetryPolicy::default(),
        }
    }

    /// From `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL` (default the public API).
    pub fn from_env() -> Result<Self, String> {
        let key = std::env::var("ANTHROPIC_API_KEY")
            .ok()
            .filter(|k| !k.trim().is_empty())
            .ok_or_else(|| {
                "ANTHROPIC_API_KEY is not set: export your Anthropic API key \
                 (https://console.anthropic.com/settings/keys), or choose an OpenAI-compatible model"
                    .to_string()
            })?;
        let base = std::env::var("ANTHROPIC_BASE_URL")
            .ok()
            .filter(|b| !b.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        Ok(Self::new(base, key.trim()))
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }
}

/// The request body, with cache breakpoints on the system prompt (which caches the tools
/// too: they come first in the prefix) and on the last block of the conversation.
///
/// A request asking only for the summary (`answer_only`, the run's last call) has no
/// breakpoint on its messages: no later call would read them, and without one they are
/// billed at most at the input price, never as cache writes (docs/cost.md, *The summary
/// reserve*, plans them so).
pub fn request_body(req: &Request) -> Value {
    let messages: Vec<Value> = req.messages.iter().map(message_json).collect();
    let mut messages = messages;
    if let Some(last) = messages
        .last_mut()
        .and_then(|m| m["content"].as_array_mut())
        .and_then(|c| c.last_mut())
        .filter(|_| !req.answer_only)
    {
        last["cache_control"] = json!({"type": "ephemeral"});
    }
    let mut body = json!({
        "model": req.model,
        "max_tokens": req.max_tokens,
        "messages": messages,
    });
    if !req.system.is_empty() {
        body["system"] = json!([{
            "type": "text",
            "text": req.system,
            "cache_control": {"type": "ephemeral"},
        }]);
    }
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
    }
    if req.answer_only && !req.tools.is_empty() {
        body["tool_choice"] = json!({"type": "none"});
    }
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    body
}

fn message_json(m: &Message) -> Value {
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    let content: Vec<Value> = m
        .content
        .iter()
        .map(|b| match b {
            Block::Text { text } => json!({"type": "text", "text": text}),
            Block::ToolUse { id, name, input } => {
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            }
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => json!({
                "type": "tool_result",
                "tool_use_id": tool_use_id,
                "content": content,
                "is_error": is_error,
            }),
            Block::Image { image } => match image.base64() {
                Some(data) => json!({
                    "type": "image",
                    "source": {"type": "base64", "media_type": image.kind.media_type(), "data": data},
                }),
                None => json!({"type": "text", "text": image.not_sent_note()}),
            },
        })
        .collect();
    json!({"role": role, "content": content})
}

#[derive(Deserialize)]
struct WireResponse {
    content: Vec<WireBlock>,
    model: String,
    stop_reason: Option<String>,
    usage: WireUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireUsage {
    input_tokens: u64,
    output_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

/// The body of `POST /v1/messages/count_tokens` for `req`: the request's own body without
/// the fields that endpoint does not take (`max_tokens`, `temperature`), so the count is
/// of exactly what [`request_body`] sends.
pub fn count_body(req: &Request) -> Value {
    let mut body = request_body(req);
    if let Some(obj) = body.as_object_mut() {
        obj.remove("max_tokens");
        obj.remove("temperature");
    }
    body
}

#[derive(Deserialize)]
struct WireCount {
    input_tokens: u64,
}

/// Reads a Messages API answer into kodx's types.
pub fn parse_response(body: &[u8]) -> Result<Response, ProviderError> {
    let wire: WireResponse =
        serde_json::from_slice(body).map_err(|e| ProviderError::Malformed {
            provider: NAME,
            detail: e.to_string(),
        })?;
    let content = wire
        .content
        .into_iter()
        .filter_map(|b| match b {
            WireBlock::Text { text } => Some(Block::Text { text }),
            WireBlock::ToolUse { id, name, input } => Some(Block::ToolUse { id, name, input }),
            WireBlock::Other => None,
        })
        .collect();
    let stop = match wire.stop_reason.as_deref() {
        Some("end_turn") | Some("stop_sequence") => ModelStop::EndTurn,
        Some("tool_use") => ModelStop::ToolUse,
        Some("max_tokens") => ModelStop::MaxTokens,
        Some(other) => ModelStop::Other(other.to_string()),
        None => ModelStop::Other("none".to_string()),
    };
    Ok(Response {
        content,
        stop,
        usage: Usage {
            input_tokens: wire.usage.input_tokens,
            output_tokens: wire.usage.output_tokens,
            cache_write_tokens: wire.usage.cache_creation_input_tokens.unwrap_or(0),
            cache_read_tokens: wire.usage.cache_read_input_tokens.unwrap_or(0),
        },
        model: wire.model,
    })
}

/// The `error.message` of an error body, else the body itself (shortened).
fn error_message(body: &[u8]) -> String {
    let parsed: Option<String> = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
        let e = &v["error"];
        let msg = e["message"].as_str()?;
        Some(match e["type"].as_str() {
            Some(kind) => format!("{kind}: {msg}"),
            None => msg.to_string(),
        })
    });
    parsed.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        text.chars().take(500).collect()
    })
}

#[async_trait]
impl Provider for AnthropicClient {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn complete(&self, request: &Request) -> Result<Response, ProviderError> {
        let url = join_url(&self.base_url, "v1/messages");
        let body = request_body(request);
        let bytes = send_with_retry(
            NAME,
            &self.retry,
            || {
                http_client()
                    .post(&url)
                    .header("x-api-key", self.key.expose_secret())
                    .header("anthropic-version", API_VERSION)
                    .json(&body)
            },
            error_message,
            |text| redact_key(&self.key, text),
        )
        .await?;
        parse_response(&bytes)
    }

    async fn count_tokens(&self, request: &Request) -> Option<u64> {
        let url = join_url(&self.base_url, "v1/messages/count_tokens");
        let body = count_body(request);
        // A count only tightens a bound: one quick retry, then the byte bound stands.
        let retry = RetryPolicy {
            max_attempts: 2,
            base_delay: std::time::Duration::from_millis(500),
            max_delay: std::time::Duration::from_secs(2),
            max_total: std::time::Duration::from_secs(10),
        };
        let sent = send_with_retry(
            NAME,
            &retry,
            || {
                http_client()
                    .post(&url)
                    .header("x-api-key", self.key.expose_secret())
                    .header("anthropic-version", API_VERSION)
                    .json(&body)
            },
            error_message,
            |text| redact_key(&self.key, text),
        )
        .await;
        match sent.map(|b| serde_json::from_slice::<WireCount>(&b)) {
            Ok(Ok(c)) => Some(c.input_tokens),
            Ok(Err(e)) => {
                tracing::warn!(
                    "the token count answer was not readable ({e}); using the byte bound"
                );
                None
            }
            Err(e) => {
                tracing::warn!("counting tokens failed ({e}); using the byte bound");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolSpec;

    fn request() -> Request {
        Request {
            model: "claude-sonnet-4-5".into(),
            system: "be brief".into(),
            messages: vec![
                Message::user_text("list files"),
                Message {
                    role: Role::Assistant,
                    content: vec![Block::ToolUse {
                        id: "tu_1".into(),
                        name: "feed_chars".into(),
                        input: json!({"chars": "ls"}),
                    }],
                },
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult {
                        tool_use_id: "tu_1".into(),
                        content: "a.txt\n[exit status: 0]".into(),
                        is_error: false,
                    }],
                },
            ],
            tools: vec![ToolSpec {
                name: "feed_chars".into(),
                description: "type".into(),
                input_schema: json!({"type": "object", "properties": {}}),
            }],
            max_tokens: 1000,
            temperature: Some(0.2),
            answer_only: false,
        }
    }

    #[test]
    fn body_has_the_documented_shape_and_cache_breakpoints() {
        let b = request_body(&request());
        assert_eq!(b["model"], "claude-sonnet-4-5");
        assert_eq!(b["max_tokens"], 1000);
        assert_eq!(b["system"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(b["messages"][1]["content"][0]["type"], "tool_use");
        let last = &b["messages"][2]["content"][0];
        assert_eq!(last["type"], "tool_result");
        assert_eq!(last["tool_use_id"], "tu_1");
        assert_eq!(last["cache_control"]["type"], "ephemeral");
        assert!(b["messages"][0]["content"][0]
            .get("cache_control")
            .is_none());
        assert_eq!(b["tools"][0]["input_schema"]["type"], "object");
        assert!((b["temperature"].as_f64().unwrap() - 0.2).abs() < 1e-6);
    }

    #[test]
    fn the_summary_call_keeps_the_frame_breakpoint_and_writes_no_messages() {
        let mut req = request();
        req.answer_only = true;
        let b = request_body(&req);
        assert_eq!(b["tool_choice"]["type"], "none");
        assert_eq!(b["system"][0]["cache_control"]["type"], "ephemeral");
        let text = b["messages"].to_string();
        assert!(!text.contains("cache_control"), "{text}");
    }

    #[test]
    fn response_with_cache_usage_and_tool_use() {
        let body = br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929",
            "content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"tu_9","name":"feed_chars","input":{"chars":"ls"}}],
            "stop_reason":"tool_use","stop_sequence":null,
            "usage":{"input_tokens":12,"output_tokens":30,"cache_creation_input_tokens":2000,"cache_read_input_tokens":5000}}"#;
        let r = parse_response(body).unwrap();
        assert_eq!(r.stop, ModelStop::ToolUse);
        assert_eq!(r.content.len(), 2);
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 12,
                output_tokens: 30,
                cache_write_tokens: 2000,
                cache_read_tokens: 5000
            }
        );
        assert!(matches!(
            parse_response(b"{}"),
            Err(ProviderError::Malformed { .. })
        ));
    }

    #[test]
    fn error_bodies_are_read() {
        let b = br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too large"}}"#;
        assert_eq!(
            error_message(b),
            "invalid_request_error: max_tokens: too large"
        );
        assert_eq!(
            error_message(b"<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
    }
}
