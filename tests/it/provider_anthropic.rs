//! The Anthropic client against a fake Messages API that checks what it is sent.

use std::time::{Duration, Instant};

use crate::common::fake_anthropic::{FakeAnthropic, Scripted};
use kodx::model::{
    Block, Message, ModelStop, Provider, ProviderError, Request, Role, ToolSpec, Usage,
};
use kodx::providers::{AnthropicClient, RetryPolicy};
use serde_json::json;

const KEY: &str = "sk-ant-test-0123456789abcdef";

fn request(messages: Vec<Message>) -> Request {
    Request {
        model: "claude-sonnet-4-5".into(),
        system: "You work in a container.".into(),
        messages,
        tools: vec![ToolSpec {
            name: "feed_chars".into(),
            description: "Type into a shell.".into(),
            input_schema: json!({"type": "object", "properties": {"chars": {"type": "string"}}, "required": ["chars"]}),
        }],
        max_tokens: 1024,
        temperature: Some(0.2),
        answer_only: false,
    }
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_secs(5),
        max_total: Duration::from_secs(30),
    }
}

#[tokio::test]
async fn a_tool_conversation_round_trips_with_cache_breakpoints_and_usage() {
    let fake = FakeAnthropic::start(KEY).await;
    fake.reply(
        vec![json!({"type": "text", "text": "Looking."}), json!({"type": "tool_use", "id": "toolu_1", "name": "feed_chars", "input": {"chars": "ls"}})],
        "tool_use",
        json!({"input_tokens": 20, "output_tokens": 15, "cache_creation_input_tokens": 900, "cache_read_input_tokens": 0}),
    );
    fake.reply(
        vec![json!({"type": "text", "text": "There is a.txt."})],
        "end_turn",
        json!({"input_tokens": 30, "output_tokens": 8, "cache_creation_input_tokens": 40, "cache_read_input_tokens": 900}),
    );
    let client = AnthropicClient::new(&fake.url, KEY).with_retry(fast_retry());
    let mut messages = vec![Message::user_text("What files are there?")];
    let first = client.complete(&request(messages.clone())).await.unwrap();
    assert_eq!(first.stop, ModelStop::ToolUse);
    assert_eq!(
        first.usage,
        Usage {
            input_tokens: 20,
            output_tokens: 15,
            cache_write_tokens: 900,
            cache_read_tokens: 0
        }
    );
    let Block::ToolUse { id, .. } = &first.content[1] else {
        panic!("{first:?}")
    };
    messages.push(Message {
        role: Role::Assistant,
        content: first.content.clone(),
    });
    messages.push(Message {
        role: Role::User,
        content: vec![Block::ToolResult {
            tool_use_id: id.clone(),
            content: "a.txt\n[exit status: 0]".into(),
            is_error: false,
        }],
    });
    let second = client.complete(&request(messages)).await.unwrap();
    assert_eq!(second.stop, ModelStop::EndTurn);
    assert_eq!(second.usage.cache_read_tokens, 900);
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    for r in &reqs {
        assert_eq!(r.headers["anthropic-version"], "2023-06-01");
        assert_eq!(r.headers["x-api-key"], KEY);
        assert!(
            !r.body.to_string().contains(KEY),
            "the key is only in its header"
        );
    }
    // The system prompt and the newest block carry the cache breakpoints.
    let body = &reqs[1].body;
    assert_eq!(body["system"][0]["cache_control"]["type"], "ephemeral");
    let last = body["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(last["content"][0]["type"], "tool_result");
    assert_eq!(last["content"][0]["cache_control"]["type"], "ephemeral");
}

#[tokio::test]
async fn overloaded_529_is_retried_after_retry_after() {
    let fake = FakeAnthropic::start(KEY).await;
    fake.push(Scripted::Error {
        status: 529,
        retry_after: Some(1),
    });
    fake.push(Scripted::Error {
        status: 429,
        retry_after: None,
    });
    fake.reply(
        vec![json!({"type": "text", "text": "ok"})],
        "end_turn",
        json!({"input_tokens": 5, "output_tokens": 1}),
    );
    let client = AnthropicClient::new(&fake.url, KEY).with_retry(fast_retry());
    let t = Instant::now();
    let r = client
        .complete(&request(vec![Message::user_text("hi")]))
        .await
        .unwrap();
    assert_eq!(r.content, vec![Block::Text { text: "ok".into() }]);
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "honoured retry-after: {:?}",
        t.elapsed()
    );
    assert_eq!(fake.requests().len(), 3);
}

#[tokio::test]
async fn retries_are_bounded() {
    let fake = FakeAnthropic::start(KEY).await;
    for _ in 0..10 {
        fake.push(Scripted::Error {
            status: 529,
            retry_after: None,
        });
    }
    let client = AnthropicClient::new(&fake.url, KEY).with_retry(fast_retry());
    let err = client
        .complete(&request(vec![Message::user_text("hi")]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProviderError::Exhausted { attempts: 4, .. }),
        "{err:?}"
    );
    crate::common::serve::redactions(&[], &[])
        .bind(|| insta::assert_snapshot!(err.to_string(), @"anthropic API unavailable after 4 attempts: HTTP 529: overloaded_error: Overloaded"));
    assert_eq!(fake.requests().len(), 4);
}

#[tokio::test]
async fn a_bad_key_is_a_clear_error_without_retries_and_without_the_key() {
    let fake = FakeAnthropic::start(KEY).await;
    let wrong = "sk-ant-wrong-key-9999999999";
    let client = AnthropicClient::new(&fake.url, wrong).with_retry(fast_retry());
    let err = client
        .complete(&request(vec![Message::user_text("hi")]))
        .await
        .unwrap_err();
    match &err {
        ProviderError::Api {
            status, message, ..
        } => {
            assert_eq!(*status, 401);
            insta::assert_snapshot!(message, @"authentication_error: invalid x-api-key");
        }
        other => panic!("{other:?}"),
    }
    assert!(!err.to_string().contains(wrong));
}

#[tokio::test]
async fn an_invalid_request_is_refused_by_the_fake() {
    // The fake is not a yes-machine: a dangling tool_result is a 400, as from the real API.
    let fake = FakeAnthropic::start(KEY).await;
    let client = AnthropicClient::new(&fake.url, KEY).with_retry(fast_retry());
    let bad = vec![Message {
        role: Role::User,
        content: vec![Block::ToolResult {
            tool_use_id: "nope".into(),
            content: "x".into(),
            is_error: false,
        }],
    }];
    let err = client.complete(&request(bad)).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Api { status: 400, .. }),
        "{err:?}"
    );
    crate::common::serve::redactions(&[], &[])
        .bind(|| insta::assert_snapshot!(err.to_string(), @"anthropic API error 400: invalid_request_error: messages.0.content.0: unexpected tool_use_id nope"));
    assert_eq!(fake.rejected().len(), 1);
}

#[tokio::test]
async fn count_tokens_sends_the_prompt_of_the_request_and_reads_the_count() {
    let fake = FakeAnthropic::start(KEY).await;
    let client = AnthropicClient::new(&fake.url, KEY).with_retry(fast_retry());
    let mut req = request(vec![Message::user_text("How many files are there?")]);
    req.answer_only = true;
    let n = client.count_tokens(&req).await;
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    let counts = fake.counts();
    assert_eq!(counts.len(), 1);
    // Exactly what `complete` would send, without max_tokens and temperature (which the
    // endpoint refuses), tool_choice and cache breakpoints included.
    let mut expected = kodx::providers::anthropic::request_body(&req);
    expected.as_object_mut().unwrap().remove("max_tokens");
    expected.as_object_mut().unwrap().remove("temperature");
    assert_eq!(counts[0], expected);
    assert_eq!(counts[0]["tool_choice"]["type"], "none");
    let sent_len = serde_json::to_vec(&counts[0]).unwrap().len();
    assert_eq!(n, Some(sent_len.div_ceil(4) as u64));
    assert!(fake.requests().is_empty(), "counting is not a model call");
}

#[tokio::test]
async fn a_count_that_fails_is_none_and_quick() {
    let fake = FakeAnthropic::start(KEY).await;
    let client = AnthropicClient::new(&fake.url, "sk-ant-wrong-key").with_retry(fast_retry());
    let started = Instant::now();
    assert_eq!(
        client
            .count_tokens(&request(vec![Message::user_text("hi")]))
            .await,
        None
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let down = AnthropicClient::new("http://127.0.0.1:9", KEY);
    assert_eq!(
        down.count_tokens(&request(vec![Message::user_text("hi")]))
            .await,
        None
    );
}

/// A server whose every answer is `len` bytes of `{` streamed without a length.
async fn endless_answer(len: usize) -> String {
    use axum::body::Body;
    let app = axum::Router::new().fallback(move || async move {
        let chunks = futures_util::stream::iter(
            (0..len.div_ceil(1 << 20))
                .map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'{'; 1 << 20]))),
        );
        axum::response::Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from_stream(chunks))
            .unwrap()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test]
async fn an_answer_over_16_mib_is_refused_not_buffered() {
    let url = endless_answer(64 << 20).await;
    let client = AnthropicClient::new(&url, KEY).with_retry(fast_retry());
    let err = client
        .complete(&request(vec![Message::user_text("hi")]))
        .await
        .unwrap_err();
    let text = err.to_string();
    crate::common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(text, @"anthropic API answered something kodx cannot read: the answer (HTTP 200) is over 16 MiB; kodx reads no more of it"));
    // Refused at once, not retried.
    assert!(matches!(err, ProviderError::Malformed { .. }), "{err:?}");
    // An answer under the bound is read whole (and then found not to be a Messages answer).
    let url = endless_answer(2 << 20).await;
    let client = AnthropicClient::new(&url, KEY).with_retry(fast_retry());
    let err = client
        .complete(&request(vec![Message::user_text("hi")]))
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("MiB"), "{err}");
}

/// An image of the first message reaches the Messages API as an `image` block with a
/// base64 source after the text (the cache breakpoint on the last block, the image); the
/// fake checks the block as the API does, and refuses a bad one.
#[tokio::test]
async fn images_go_as_base64_image_blocks_after_the_text() {
    let fake = FakeAnthropic::start(KEY).await;
    fake.reply(
        vec![json!({"type": "text", "text": "A red square."})],
        "end_turn",
        json!({"input_tokens": 1300, "output_tokens": 5}),
    );
    let client = AnthropicClient::new(&fake.url, KEY).with_retry(fast_retry());
    let bytes = crate::common::images::png(16, 8, 0);
    let image = kodx::model::Image::from_bytes(bytes.clone()).unwrap();
    let message = Message::user_with_images("What is in the picture?", &[image]);
    client.complete(&request(vec![message])).await.unwrap();
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    let content = &fake.requests()[0].body["messages"][0]["content"];
    use base64::Engine as _;
    let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
    assert_eq!(content[0]["text"], "What is in the picture?");
    assert_eq!(
        content[1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data},
               "cache_control": {"type": "ephemeral"}})
    );

    for source in [
        json!({"type": "base64", "media_type": "image/png", "data": "%%%"}),
        json!({"type": "base64", "media_type": "image/tiff", "data": data}),
        json!({"type": "base64", "media_type": "image/gif", "data": data}),
        json!({"type": "url", "url": "https://example.com/a.png"}),
    ] {
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user",
            "content": [{"type": "image", "source": source}]}]});
        let status = reqwest::Client::new()
            .post(format!("{}/v1/messages", fake.url))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 400, "{source}");
    }
    assert_eq!(fake.rejected().len(), 4, "{:?}", fake.rejected());
}
