//! A fake OpenAI-compatible Chat Completions API on loopback: checks what kodx sends as the
//! real API does (auth, fields, tool-call/tool-message pairing, function schema shape) and
//! answers from a script.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

#[derive(Default)]
struct Inner {
    script: VecDeque<(u16, Value)>,
    requests: Vec<Value>,
    rejected: Vec<String>,
}

#[derive(Clone)]
pub struct FakeOpenAi {
    pub url: String,
    key: Option<String>,
    inner: Arc<Mutex<Inner>>,
}

impl FakeOpenAi {
    /// `key`: the bearer token required, or `None` for a local server that wants none.
    pub async fn start(key: Option<&str>) -> FakeOpenAi {
        let mut fake = FakeOpenAi {
            url: String::new(),
            key: key.map(str::to_string),
            inner: Arc::default(),
        };
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        fake.url = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        fake
    }

    /// A reply: text, tool calls `(id, name, arguments)`, usage `(prompt, completion, cached)`.
    pub fn reply(&self, text: Option<&str>, calls: &[(&str, &str, &str)], usage: (u64, u64, u64)) {
        let tool_calls: Vec<Value> = calls
            .iter()
            .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
            .collect();
        let mut message = json!({"role": "assistant", "content": text});
        if !tool_calls.is_empty() {
            message["tool_calls"] = json!(tool_calls);
        }
        let body = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-4.1-2025-04-14",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}],
            "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1, "total_tokens": usage.0 + usage.1,
                      "prompt_tokens_details": {"cached_tokens": usage.2}},
        });
        self.inner.lock().unwrap().script.push_back((200, body));
    }

    pub fn error(&self, status: u16) {
        let body = json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}});
        self.inner.lock().unwrap().script.push_back((status, body));
    }

    pub fn requests(&self) -> Vec<Value> {
        self.inner.lock().unwrap().requests.clone()
    }

    pub fn rejected(&self) -> Vec<String> {
        self.inner.lock().unwrap().rejected.clone()
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    let body =
        json!({"error": {"message": message, "type": "invalid_request_error", "code": null}});
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn handle(State(fake): State<FakeOpenAi>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(key) = &fake.key {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
        if auth != Some(format!("Bearer {key}").as_str()) {
            return error(StatusCode::UNAUTHORIZED, "Incorrect API key provided.");
        }
    }
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("not JSON: {e}")),
    };
    if let Err(reason) = validate(&body) {
        fake.inner.lock().unwrap().rejected.push(reason.clone());
        return error(StatusCode::BAD_REQUEST, &reason);
    }
    let next = {
        let mut inner = fake.inner.lock().unwrap();
        inner.requests.push(body);
        inner.script.pop_front()
    };
    match next {
        Some((status, v)) => (
            StatusCode::from_u16(status).unwrap(),
            [("content-type", "application/json")],
            v.to_string(),
        )
            .into_response(),
        None => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the fake's script is empty",
        ),
    }
}

fn validate(b: &Value) -> Result<(), String> {
    if b["model"].as_str().is_none_or(str::is_empty) {
        return Err("you must provide a model parameter".into());
    }
    let has_max = b.get("max_tokens").or(b.get("max_completion_tokens"));
    if has_max.and_then(Value::as_u64).is_none_or(|n| n < 1) {
        return Err("max_tokens or max_completion_tokens must be an integer >= 1".into());
    }
    if let Some(tools) = b.get("tools") {
        for (i, t) in tools
            .as_array()
            .ok_or("tools must be an array")?
            .iter()
            .enumerate()
        {
            if t["type"] != "function" || !t["function"]["name"].is_string() {
                return Err(format!("tools[{i}]: must be a function with a name"));
            }
            if t["function"]["parameters"]["type"] != "object" {
                return Err(format!(
                    "tools[{i}].function.parameters: must be an object schema"
                ));
            }
        }
    }
    if let Some(choice) = b.get("tool_choice") {
        let named = choice["type"] == "function" && choice["function"]["name"].is_string();
        if !(matches!(choice.as_str(), Some("none" | "auto" | "required")) || named) {
            return Err("tool_choice: must be none, auto, required or a named function".into());
        }
        if b.get("tools").is_none() {
            return Err("tool_choice is only allowed when tools are specified".into());
        }
    }
    let messages = b["messages"].as_array().ok_or("messages is required")?;
    if messages.is_empty() {
        return Err("messages must not be empty".into());
    }
    let mut open: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        match m["role"].as_str() {
            Some("system") | Some("user") => {
                if !open.is_empty() {
                    return Err(format!(
                        "messages[{i}]: tool_calls {open:?} were not answered"
                    ));
                }
                match &m["content"] {
                    Value::String(_) => {}
                    // A user's content parts: text and images (data URLs here).
                    Value::Array(parts) if m["role"] == "user" && !parts.is_empty() => {
                        for (j, part) in parts.iter().enumerate() {
                            content_part(part)
                                .map_err(|e| format!("messages[{i}].content[{j}]: {e}"))?;
                        }
                    }
                    _ => return Err(format!("messages[{i}].content must be a string")),
                }
            }
            Some("assistant") => {
                if !open.is_empty() {
                    return Err(format!(
                        "messages[{i}]: tool_calls {open:?} were not answered"
                    ));
                }
                let calls = m["tool_calls"].as_array().cloned().unwrap_or_default();
                if calls.is_empty() && !m["content"].is_string() {
                    return Err(format!(
                        "messages[{i}]: assistant needs content or tool_calls"
                    ));
                }
                for c in calls {
                    if c["type"] != "function" || !c["function"]["arguments"].is_string() {
                        return Err(format!(
                            "messages[{i}]: tool_calls need function arguments as a string"
                        ));
                    }
                    open.push(c["id"].as_str().ok_or("tool_call id required")?.to_string());
                }
            }
            Some("tool") => {
                let id = m["tool_call_id"]
                    .as_str()
                    .ok_or(format!("messages[{i}].tool_call_id required"))?;
                let pos = open.iter().position(|o| o == id).ok_or(format!(
                    "messages[{i}]: messages with role 'tool' must be a response to a preceding message with 'tool_calls' ({id})"
                ))?;
                open.remove(pos);
            }
            other => return Err(format!("messages[{i}].role: {other:?} is not valid")),
        }
    }
    Ok(())
}

/// One part of a user message's content: `text`, or `image_url` with a base64 data URL of
/// an allowed image type whose bytes are that type.
fn content_part(part: &Value) -> Result<(), String> {
    match part["type"].as_str() {
        Some("text") if part["text"].is_string() => Ok(()),
        Some("image_url") => {
            let url = part["image_url"]["url"]
                .as_str()
                .ok_or("image_url.url is required")?;
            if let Some(detail) = part["image_url"].get("detail") {
                if !matches!(detail.as_str(), Some("auto" | "low" | "high")) {
                    return Err("image_url.detail must be auto, low or high".into());
                }
            }
            let rest = url
                .strip_prefix("data:")
                .ok_or("image_url.url: only data URLs are accepted here")?;
            let (media_type, data) = rest
                .split_once(";base64,")
                .ok_or("image_url.url: a data URL must be base64")?;
            let bytes = super::images::decode_image_data(data)?;
            super::images::check_image_kind(media_type, &bytes)
        }
        other => Err(format!("type {other:?} is not a valid content part")),
    }
}
