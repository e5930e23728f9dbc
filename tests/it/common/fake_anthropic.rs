//! A fake Anthropic Messages API on loopback: checks what kodx sends the way the real API
//! does (headers, required fields, tool schema shape, tool_use/tool_result pairing, cache
//! breakpoints) and answers from a script. An invalid request gets the API's 400 shape.
//!
//! `GET /v1/models` (free; `kodx doctor` uses it to check the key) answers the API's list
//! shape after the same header checks; `model_listings()` counts the accepted ones.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

pub enum Scripted {
    /// 200 with this Messages API body.
    Reply(Value),
    /// 200 with the body this function makes from the request (e.g. an answer quoting the
    /// last tool result, which only the container could have produced).
    Dynamic(Box<dyn Fn(&Value) -> Value + Send>),
    /// This reply, sent once the test releases it ([`FakeAnthropic::reply_held`]).
    Held {
        reply: Value,
        release: tokio::sync::watch::Receiver<bool>,
    },
    /// An error status with an optional `retry-after` (seconds).
    Error {
        status: u16,
        retry_after: Option<u32>,
    },
}

#[derive(Clone, Debug)]
pub struct Recorded {
    pub headers: HeaderMap,
    pub body: Value,
    /// When the request arrived.
    pub at: std::time::Instant,
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Scripted>,
    requests: Vec<Recorded>,
    rejected: Vec<String>,
    model_listings: usize,
    counts: Vec<Value>,
}

#[derive(Clone)]
pub struct FakeAnthropic {
    pub url: String,
    key: String,
    inner: Arc<Mutex<Inner>>,
}

impl FakeAnthropic {
    pub async fn start(key: &str) -> FakeAnthropic {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let fake = FakeAnthropic {
            url: String::new(),
            key: key.to_string(),
            inner,
        };
        let app = Router::new()
            .route("/v1/messages", post(handle))
            .route("/v1/models", get(list_models))
            .route("/v1/messages/count_tokens", post(count_tokens))
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeAnthropic { url, ..fake }
    }

    pub fn push(&self, s: Scripted) {
        self.inner.lock().unwrap().script.push_back(s);
    }

    /// A reply with text and/or tool calls, and the usage to bill.
    pub fn reply(&self, content: Vec<Value>, stop_reason: &str, usage: Value) {
        self.push(Scripted::Reply(message(content, stop_reason, usage)));
    }

    /// [`reply`](Self::reply), held when its request arrives until the returned sender
    /// sends `true`: the run is then in the middle of a model call for as long as the test
    /// needs, with no fixed wait.
    pub fn reply_held(
        &self,
        content: Vec<Value>,
        stop_reason: &str,
        usage: Value,
    ) -> tokio::sync::watch::Sender<bool> {
        let (release, held) = tokio::sync::watch::channel(false);
        self.push(Scripted::Held {
            reply: message(content, stop_reason, usage),
            release: held,
        });
        release
    }

    /// An `end_turn` reply whose text is `make(text of the last tool_result)`.
    pub fn answer_from_last_tool_result(&self, make: impl Fn(&str) -> String + Send + 'static) {
        self.push(Scripted::Dynamic(Box::new(move |req: &Value| {
            let last = req["messages"]
                .as_array()
                .and_then(|m| m.last())
                .and_then(|m| m["content"].as_array())
                .and_then(|blocks| blocks.iter().rev().find(|b| b["type"] == "tool_result"))
                .map(|b| match &b["content"] {
                    Value::String(s) => s.clone(),
                    Value::Array(parts) => parts
                        .iter()
                        .filter_map(|p| p["text"].as_str())
                        .collect::<Vec<_>>()
                        .join(""),
                    _ => String::new(),
                })
                .unwrap_or_default();
            json!({
                "id": format!("msg_{}", rand::random::<u32>()),
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5-20250929",
                "content": [{"type": "text", "text": make(&last)}],
                "stop_reason": "end_turn",
                "stop_sequence": null,
                "usage": {"input_tokens": 1200, "output_tokens": 40,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
            })
        })));
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// Accepted `GET /v1/models` requests.
    pub fn model_listings(&self) -> usize {
        self.inner.lock().unwrap().model_listings
    }

    /// Requests refused as invalid, with the reason; a test expects none.
    /// The bodies of the `count_tokens` requests accepted so far.
    pub fn counts(&self) -> Vec<Value> {
        self.inner.lock().unwrap().counts.clone()
    }

    pub fn rejected(&self) -> Vec<String> {
        self.inner.lock().unwrap().rejected.clone()
    }
}

fn api_error(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        [("content-type", "application/json")],
        json!({"type": "error", "error": {"type": kind, "message": message}}).to_string(),
    )
        .into_response()
}

/// A `tool_use` block of the `feed_chars` tool with this `input`.
pub fn tool_use(id: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": "feed_chars", "input": input})
}

/// A `tool_use` block that types `chars` into the shell.
pub fn feed_chars(id: &str, chars: &str) -> Value {
    tool_use(id, json!({"chars": chars}))
}

/// A Messages API reply with `content`, `stop_reason` and `usage`.
fn message(content: Vec<Value>, stop_reason: &str, usage: Value) -> Value {
    json!({
        "id": format!("msg_{}", rand::random::<u32>()),
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": null,
        "usage": usage,
    })
}

async fn handle(State(fake): State<FakeAnthropic>, headers: HeaderMap, body: Bytes) -> Response {
    if headers.get("x-api-key").and_then(|v| v.to_str().ok()) != Some(fake.key.as_str()) {
        return api_error(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid x-api-key",
        );
    }
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return reject(&fake, format!("body is not JSON: {e}")),
    };
    if let Err(reason) = validate(&headers, &body, false) {
        return reject(&fake, reason);
    }
    let next = {
        let mut inner = fake.inner.lock().unwrap();
        inner.requests.push(Recorded {
            headers: headers.clone(),
            body: body.clone(),
            at: std::time::Instant::now(),
        });
        inner.script.pop_front()
    };
    match next {
        Some(Scripted::Dynamic(make)) => (
            StatusCode::OK,
            [("content-type", "application/json")],
            make(&body).to_string(),
        )
            .into_response(),
        Some(Scripted::Held { reply, mut release }) => {
            let _ = release.wait_for(|r| *r).await;
            (
                StatusCode::OK,
                [("content-type", "application/json")],
                reply.to_string(),
            )
                .into_response()
        }
        Some(Scripted::Reply(v)) => (
            StatusCode::OK,
            [("content-type", "application/json")],
            v.to_string(),
        )
            .into_response(),
        Some(Scripted::Error {
            status,
            retry_after,
        }) => {
            let status = StatusCode::from_u16(status).unwrap();
            let mut resp = api_error(status, "overloaded_error", "Overloaded");
            if let Some(secs) = retry_after {
                resp.headers_mut()
                    .insert("retry-after", secs.to_string().parse().unwrap());
            }
            resp
        }
        None => api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            "the fake's script is empty",
        ),
    }
}

/// `POST /v1/messages/count_tokens`: the Messages body without `max_tokens` and the
/// sampling fields (the real API refuses them as extra inputs); answers
/// `{"input_tokens": N}` with N the body's JSON bytes / 4, rounded up (a deterministic
/// stand-in for the tokenizer).
async fn count_tokens(
    State(fake): State<FakeAnthropic>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if headers.get("x-api-key").and_then(|v| v.to_str().ok()) != Some(fake.key.as_str()) {
        return api_error(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid x-api-key",
        );
    }
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return reject(&fake, format!("body is not JSON: {e}")),
    };
    if let Err(reason) = validate(&headers, &value, true) {
        return reject(&fake, reason);
    }
    fake.inner.lock().unwrap().counts.push(value);
    let n = body.len().div_ceil(4);
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        json!({ "input_tokens": n }).to_string(),
    )
        .into_response()
}

/// `GET /v1/models`: the key, then `anthropic-version`, as the real API checks them; the
/// list shape of the Models API (`data`, `first_id`, `last_id`, `has_more`).
async fn list_models(State(fake): State<FakeAnthropic>, headers: HeaderMap) -> Response {
    if headers.get("x-api-key").and_then(|v| v.to_str().ok()) != Some(fake.key.as_str()) {
        return api_error(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid x-api-key",
        );
    }
    let version = headers
        .get("anthropic-version")
        .and_then(|v| v.to_str().ok());
    if version != Some("2023-06-01") {
        return reject(&fake, format!("anthropic-version header: {version:?}"));
    }
    fake.inner.lock().unwrap().model_listings += 1;
    let id = "claude-sonnet-4-5-20250929";
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        json!({
            "data": [{
                "type": "model",
                "id": id,
                "display_name": "Claude Sonnet 4.5",
                "created_at": "2025-09-29T00:00:00Z",
            }],
            "has_more": false,
            "first_id": id,
            "last_id": id,
        })
        .to_string(),
    )
        .into_response()
}

fn reject(fake: &FakeAnthropic, reason: String) -> Response {
    fake.inner.lock().unwrap().rejected.push(reason.clone());
    api_error(StatusCode::BAD_REQUEST, "invalid_request_error", &reason)
}

/// Checks a Messages body (`counting`: a `count_tokens` body, which takes the prompt fields
/// only) as the real API does.
fn validate(headers: &HeaderMap, b: &Value, counting: bool) -> Result<(), String> {
    let version = headers
        .get("anthropic-version")
        .and_then(|v| v.to_str().ok());
    if version != Some("2023-06-01") {
        return Err(format!("anthropic-version header: {version:?}"));
    }
    if !headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
    {
        return Err("content-type must be application/json".into());
    }
    let obj = b.as_object().ok_or("body must be an object")?;
    for key in obj.keys() {
        let known = [
            "model",
            "max_tokens",
            "messages",
            "system",
            "tools",
            "temperature",
            "top_p",
            "top_k",
            "stop_sequences",
            "tool_choice",
            "metadata",
            "stream",
        ];
        let prompt_only = ["model", "messages", "system", "tools", "tool_choice"];
        if !known.contains(&key.as_str()) || (counting && !prompt_only.contains(&key.as_str())) {
            return Err(format!("{key}: Extra inputs are not permitted"));
        }
    }
    if b["model"].as_str().is_none_or(|m| m.is_empty()) {
        return Err("model: Field required".into());
    }
    if !counting && b["max_tokens"].as_u64().is_none_or(|n| n < 1) {
        return Err("max_tokens: must be an integer >= 1".into());
    }
    if let Some(t) = b.get("temperature") {
        if !t.as_f64().is_some_and(|t| (0.0..=1.0).contains(&t)) {
            return Err("temperature: must be between 0 and 1".into());
        }
    }
    let mut breakpoints = 0;
    let mut count_cache = |v: &Value, at: &str| -> Result<(), String> {
        if let Some(cc) = v.get("cache_control") {
            if cc != &json!({"type": "ephemeral"}) {
                return Err(format!(
                    "{at}.cache_control: must be {{\"type\": \"ephemeral\"}}"
                ));
            }
            breakpoints += 1;
        }
        Ok(())
    };
    match &b["system"] {
        Value::Null | Value::String(_) => {}
        Value::Array(blocks) => {
            for (i, blk) in blocks.iter().enumerate() {
                if blk["type"] != "text" || !blk["text"].is_string() {
                    return Err(format!("system.{i}: must be a text block"));
                }
                count_cache(blk, &format!("system.{i}"))?;
            }
        }
        _ => return Err("system: must be a string or a list of text blocks".into()),
    }
    if let Some(tools) = b.get("tools") {
        for (i, t) in tools
            .as_array()
            .ok_or("tools: must be a list")?
            .iter()
            .enumerate()
        {
            let name = t["name"].as_str().unwrap_or("");
            if name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!("tools.{i}.name: invalid"));
            }
            if t["input_schema"]["type"] != "object" {
                return Err(format!("tools.{i}.input_schema.type: must be object"));
            }
            count_cache(t, &format!("tools.{i}"))?;
        }
    }
    if let Some(choice) = b.get("tool_choice") {
        match choice["type"].as_str() {
            Some("auto" | "any" | "none") => {}
            Some("tool") if choice["name"].is_string() => {}
            _ => {
                return Err(
                    "tool_choice: must be {\"type\": auto|any|none} or {\"type\": \"tool\", \"name\": …}"
                        .into(),
                )
            }
        }
        if b.get("tools").is_none() {
            return Err("tool_choice: may only be specified while providing tools".into());
        }
    }
    let messages = b["messages"].as_array().ok_or("messages: Field required")?;
    if messages.is_empty() {
        return Err("messages: at least one message is required".into());
    }
    if messages[0]["role"] != "user" {
        return Err("messages.0.role: the first message must use the user role".into());
    }
    let mut open_tool_uses: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"]
            .as_str()
            .ok_or(format!("messages.{i}.role: required"))?;
        if role != "user" && role != "assistant" {
            return Err(format!("messages.{i}.role: must be user or assistant"));
        }
        let blocks: Vec<Value> = match &m["content"] {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(a) if !a.is_empty() => a.clone(),
            _ => {
                return Err(format!(
                    "messages.{i}.content: must be a string or non-empty list"
                ))
            }
        };
        let mut answered = Vec::new();
        let mut new_uses = Vec::new();
        for (j, blk) in blocks.iter().enumerate() {
            let at = format!("messages.{i}.content.{j}");
            count_cache(blk, &at)?;
            match blk["type"].as_str() {
                Some("text") if blk["text"].is_string() => {}
                Some("tool_use") if role == "assistant" => {
                    let id = blk["id"].as_str().ok_or(format!("{at}.id: required"))?;
                    if !blk["name"].is_string() || !blk["input"].is_object() {
                        return Err(format!("{at}: tool_use needs name and an object input"));
                    }
                    new_uses.push(id.to_string());
                }
                Some("tool_result") if role == "user" => {
                    let id = blk["tool_use_id"]
                        .as_str()
                        .ok_or(format!("{at}.tool_use_id: required"))?;
                    if !open_tool_uses.iter().any(|u| u == id) {
                        return Err(format!("{at}: unexpected tool_use_id {id}"));
                    }
                    answered.push(id.to_string());
                }
                Some("image") if role == "user" => image_block(blk, &at)?,
                other => return Err(format!("{at}.type: {other:?} not allowed here")),
            }
        }
        if role == "user" {
            if let Some(missing) = open_tool_uses.iter().find(|u| !answered.contains(u)) {
                return Err(format!(
                    "messages.{i}: tool_use {missing} has no tool_result"
                ));
            }
            open_tool_uses.clear();
        } else {
            if !open_tool_uses.is_empty() {
                return Err(format!("messages.{i}: tool_use ids were not answered"));
            }
            open_tool_uses = new_uses;
        }
    }
    if breakpoints > 4 {
        return Err(format!(
            "A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
        ));
    }
    Ok(())
}

/// An `image` block as the API takes it: a base64 source of an allowed media type, whose
/// data is valid base64 of at most 5 MB and is the kind of image the media type says.
fn image_block(blk: &Value, at: &str) -> Result<(), String> {
    let source = &blk["source"];
    if source["type"] != "base64" {
        return Err(format!("{at}.source.type: must be base64"));
    }
    let media_type = source["media_type"].as_str().unwrap_or("");
    let data = source["data"]
        .as_str()
        .ok_or(format!("{at}.source.data: required"))?;
    let bytes =
        super::images::decode_image_data(data).map_err(|e| format!("{at}.source.data: {e}"))?;
    super::images::check_image_kind(media_type, &bytes).map_err(|e| format!("{at}.source: {e}"))?;
    let extra: Vec<&String> = blk
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| !["type", "source", "cache_control"].contains(&k.as_str()))
        .collect();
    if !extra.is_empty() {
        return Err(format!("{at}.{}: Extra inputs are not permitted", extra[0]));
    }
    Ok(())
}
