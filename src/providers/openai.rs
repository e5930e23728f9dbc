//! OpenAI-compatible Chat Completions (`POST {OPENAI_BASE_URL}/chat/completions`): tools as
//! functions. Works with OpenAI and with vLLM, Ollama and llama.cpp servers.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};

use super::retry::{send_with_retry, RetryPolicy};
use secrecy::{ExposeSecret, SecretString};

use super::{http_client, join_url, redact_key};
use crate::model::{Block, ModelStop, Provider, ProviderError, Request, Response, Role, Usage};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
const NAME: &str = "openai";

#[derive(Debug, Clone)]
pub struct OpenAiClient {
    base_url: String,
    key: Option<SecretString>,
    retry: RetryPolicy,
}

impl OpenAiClient {
    /// `key` may be `None` for a local server that wants none (vLLM, Ollama, llama.cpp).
    pub fn new(base_url: impl Into<String>, key: Option<SecretString>) -> Self {
        OpenAiClient {
            base_url: base_url.into(),
            key,
            retry: RetryPolicy::default(),
        }
    }

    /// From `OPENAI_API_KEY` and `OPENAI_BASE_URL` (default the public API, which needs a key).
    pub fn from_env() -> Result<Self, String> {
        let base = std::env::var("OPENAI_BASE_URL")
            .ok()
            .filter(|b| !b.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let key = std::env::var("OPENAI_API_KEY")
            .ok()
            .filter(|k| !k.trim().is_empty())
            .map(|k| SecretString::from(k.trim()));
        if key.is_none() && is_openai(&base) {
            return Err("OPENAI_API_KEY is not set: export your OpenAI API key, or set \
                        OPENAI_BASE_URL to a local OpenAI-compatible server (vLLM, Ollama, llama.cpp)"
                .to_string());
        }
        Ok(Self::new(base, key))
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    fn redact(&self, text: &str) -> String {
        match &self.key {
            Some(k) => redact_key(k, text),
            None => text.to_string(),
        }
    }
}

fn is_openai(base: &str) -> bool {
    base.contains("://api.openai.com")
}

/// The request body. OpenAI's own API takes `max_completion_tokens` (its newer models
/// refuse `max_tokens`); other servers get `max_tokens`, which they all understand.
pub fn request_body(req: &Request, official: bool) -> Value {
    let mut messages = Vec::new();
    if !req.system.is_empty() {
        messages.push(json!({"role": "system", "content": req.system}));
    }
    for m in &req.messages {
        match m.role {
            Role::Assistant => {
                let text = m.text();
                let calls: Vec<Value> = m
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        Block::ToolUse { id, name, input } => Some(json!({
                            "id": id,
                            "type": "function",
                            "function": {"name": name, "arguments": arguments_text(input)},
                        })),
                        _ => None,
                    })
                    .collect();
                let mut msg = json!({
                    "role": "assistant",
                    "content": if text.is_empty() { Value::Null } else { json!(text) },
                });
                if !calls.is_empty() {
                    msg["tool_calls"] = json!(calls);
                }
                messages.push(msg);
            }
            Role::User => {
                // Tool results are messages of their own, right after the assistant's calls.
                for b in &m.content {
                    if let Block::ToolResult {
                        tool_use_id,
                        content,
                        is_error,
                    } = b
                    {
                        let content = if *is_error {
                            format!("Error: {content}")
                        } else {
                            content.clone()
                        };
                        messages.push(json!({"role": "tool", "tool_call_id": tool_use_id, "content": content}));
                    }
                }
                let text = m.text();
                let images: Vec<Value> = m
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        Block::Image { image } => Some(match image.base64() {
                            Some(data) => json!({"type": "image_url", "image_url": {
                                "url": format!("data:{};base64,{data}", image.kind.media_type()),
                            }}),
                            None => json!({"type": "text", "text": image.not_sent_note()}),
                        }),
                        _ => None,
                    })
                    .collect();
                if !images.is_empty() {
                    // Text first, then the images, in one content array.
                    let mut parts = Vec::with_capacity(images.len() + 1);
                    if !text.is_empty() {
                        parts.push(json!({"type": "text", "text": text}));
                    }
                    parts.extend(images);
                    messages.push(json!({"role": "user", "content": parts}));
                } else if !text.is_empty() {
                    messages.push(json!({"role": "user", "content": text}));
                }
            }
        }
    }
    let mut body = json!({"model": req.model, "messages": messages});
    body[if official {
        "max_completion_tokens"
    } else {
        "max_tokens"
    }] = json!(req.max_tokens);
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.input_schema,
                }})
            })
            .collect();
        if req.answer_only {
            body["tool_choice"] = json!("none");
        }
    }
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    body
}

/// The arguments as the model wrote them: a JSON object is sent back re-serialised; a
/// string that was not valid JSON is sent back as it was.
fn arguments_text(input: &Value) -> String {
    match input {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    }
}

#[derive(Deserialize)]
struct WireResponse {
    model: String,
    choices: Vec<WireChoice>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireMessage,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<WireToolCall>,
}

#[derive(Deserialize)]
struct WireToolCall {
    id: String,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    arguments: String,
}

#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    prompt_tokens_details: Option<WireDetails>,
}

#[derive(Deserialize)]
struct WireDetails {
    cached_tokens: Option<u64>,
}

/// Reads a Chat Completions answer. Arguments that are not valid JSON stay a JSON string,
/// so the agent can tell the model what was wrong with them.
pub fn parse_response(body: &[u8]) -> Result<Response, ProviderError> {
    let malformed = |detail: String| ProviderError::Malformed {
        provider: NAME,
        detail,
    };
    let wire: WireResponse = serde_json::from_slice(body).map_err(|e| malformed(e.to_string()))?;
    let choice = wire
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| malformed("no choices in the answer".into()))?;
    let mut content = Vec::new();
    if let Some(text) = choice.message.content.filter(|t| !t.is_empty()) {
        content.push(Block::Text { text });
    }
    for call in choice.message.tool_calls {
        let input = serde_json::from_str(&call.function.arguments)
            .unwrap_or(Value::String(call.function.arguments));
        content.push(Block::ToolUse {
            id: call.id,
            name: call.function.name,
            input,
        });
    }
    let has_calls = content.iter().any(|b| matches!(b, Block::ToolUse { .. }));
    let stop = match choice.finish_reason.as_deref() {
        _ if has_calls => ModelStop::ToolUse,
        Some("stop") | None => ModelStop::EndTurn,
        Some("length") => ModelStop::MaxTokens,
        Some(other) => ModelStop::Other(other.to_string()),
    };
    let usage = wire.usage.map_or(Usage::default(), |u| {
        let cached = u
            .prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0)
            .min(u.prompt_tokens);
        Usage {
            input_tokens: u.prompt_tokens - cached,
            output_tokens: u.completion_tokens,
            cache_write_tokens: 0,
            cache_read_tokens: cached,
        }
    });
    Ok(Response {
        content,
        stop,
        usage,
        model: wire.model,
    })
}

fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(500).collect())
}

#[async_trait]
impl Provider for OpenAiClient {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn complete(&self, request: &Request) -> Result<Response, ProviderError> {
        let url = join_url(&self.base_url, "chat/completions");
        let body = request_body(request, is_openai(&self.base_url));
        let bytes = send_with_retry(
            NAME,
            &self.retry,
            || {
                let req = http_client().post(&url).json(&body);
                match &self.key {
                    Some(key) => req.bearer_auth(key.expose_secret()),
                    None => req,
                }
            },
            error_message,
            |text| self.redact(text),
        )
        .await?;
        parse_response(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Message, ToolSpec};

    #[test]
    fn tool_calls_and_results_map_to_functions_and_tool_messages() {
        let req = Request {
            model: "gpt-4.1".into(),
            system: "sys".into(),
            messages: vec![
                Message::user_text("go"),
                Message {
                    role: Role::Assistant,
                    content: vec![Block::ToolUse {
                        id: "call_1".into(),
                        name: "feed_chars".into(),
                        input: json!({"chars": "ls"}),
                    }],
                },
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult {
                        tool_use_id: "call_1".into(),
                        content: "boom".into(),
                        is_error: true,
                    }],
                },
            ],
            tools: vec![ToolSpec {
                name: "feed_chars".into(),
                description: "d".into(),
                input_schema: json!({"type": "object"}),
            }],
            max_tokens: 500,
            temperature: None,
            answer_only: false,
        };
        let b = request_body(&req, true);
        assert_eq!(b["messages"][0]["role"], "system");
        assert_eq!(
            b["messages"][2]["tool_calls"][0]["function"]["arguments"],
            r#"{"chars":"ls"}"#
        );
        assert_eq!(b["messages"][2]["content"], Value::Null);
        assert_eq!(b["messages"][3]["role"], "tool");
        assert_eq!(b["messages"][3]["content"], "Error: boom");
        assert_eq!(b["max_completion_tokens"], 500);
        assert!(b.get("max_tokens").is_none());
        assert_eq!(request_body(&req, false)["max_tokens"], 500);
        assert_eq!(b["tools"][0]["function"]["parameters"]["type"], "object");
    }

    #[test]
    fn response_with_cached_tokens_and_bad_arguments() {
        let body = br#"{"id":"c","object":"chat.completion","model":"gpt-4.1-2025-04-14",
          "choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,
            "tool_calls":[{"id":"call_9","type":"function","function":{"name":"feed_chars","arguments":"{not json"}}]}}],
          "usage":{"prompt_tokens":1000,"completion_tokens":20,"total_tokens":1020,"prompt_tokens_details":{"cached_tokens":800}}}"#;
        let r = parse_response(body).unwrap();
        assert_eq!(r.stop, ModelStop::ToolUse);
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 200,
                output_tokens: 20,
                cache_write_tokens: 0,
                cache_read_tokens: 800
            }
        );
        assert_eq!(
            r.content,
            vec![Block::ToolUse {
                id: "call_9".into(),
                name: "feed_chars".into(),
                input: json!("{not json")
            }]
        );
        // Sent back as the model wrote it.
        assert_eq!(arguments_text(&json!("{not json")), "{not json");
    }
}
