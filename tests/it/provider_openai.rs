//! The OpenAI-compatible client against a fake Chat Completions API that checks what it is sent.

use std::time::Duration;

use crate::common::fake_openai::FakeOpenAi;
use kodx::model::{
    Block, Message, ModelStop, Provider, ProviderError, Request, Role, ToolSpec, Usage,
};
use kodx::providers::{OpenAiClient, RetryPolicy};
use serde_json::json;

fn request(messages: Vec<Message>) -> Request {
    Request {
        model: "gpt-4.1".into(),
        system: "You work in a container.".into(),
        messages,
        tools: vec![ToolSpec {
            name: "feed_chars".into(),
            description: "Type into a shell.".into(),
            input_schema: json!({"type": "object", "properties": {"chars": {"type": "string"}}}),
        }],
        max_tokens: 512,
        temperature: Some(0.1),
        answer_only: false,
    }
}

fn fast() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(10),
        ..Default::default()
    }
}

#[tokio::test]
async fn tool_calls_round_trip_with_cached_tokens() {
    let fake = FakeOpenAi::start(Some("sk-test-openai-123456")).await;
    fake.reply(
        None,
        &[("call_1", "feed_chars", r#"{"chars":"ls"}"#)],
        (900, 12, 0),
    );
    fake.reply(Some("There is a.txt."), &[], (950, 6, 896));
    let client =
        OpenAiClient::new(&fake.url, Some("sk-test-openai-123456".into())).with_retry(fast());
    let mut messages = vec![Message::user_text("What is here?")];
    let first = client.complete(&request(messages.clone())).await.unwrap();
    assert_eq!(first.stop, ModelStop::ToolUse);
    assert_eq!(
        first.content,
        vec![Block::ToolUse {
            id: "call_1".into(),
            name: "feed_chars".into(),
            input: json!({"chars": "ls"})
        }]
    );
    messages.push(Message {
        role: Role::Assistant,
        content: first.content,
    });
    messages.push(Message {
        role: Role::User,
        content: vec![Block::ToolResult {
            tool_use_id: "call_1".into(),
            content: "a.txt".into(),
            is_error: false,
        }],
    });
    let second = client.complete(&request(messages)).await.unwrap();
    assert_eq!(second.stop, ModelStop::EndTurn);
    assert_eq!(
        second.usage,
        Usage {
            input_tokens: 54,
            output_tokens: 6,
            cache_write_tokens: 0,
            cache_read_tokens: 896
        }
    );
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    let sent = &fake.requests()[1];
    assert_eq!(sent["messages"][3]["role"], "tool");
    assert_eq!(sent["max_tokens"], 512, "a non-OpenAI base gets max_tokens");
}

#[tokio::test]
async fn a_local_server_without_a_key_works() {
    let fake = FakeOpenAi::start(None).await;
    fake.reply(Some("hi"), &[], (10, 1, 0));
    let client = OpenAiClient::new(&fake.url, None).with_retry(fast());
    let r = client
        .complete(&request(vec![Message::user_text("hi")]))
        .await
        .unwrap();
    assert_eq!(r.content, vec![Block::Text { text: "hi".into() }]);
}

#[tokio::test]
async fn rate_limits_are_retried_and_auth_errors_are_not() {
    let fake = FakeOpenAi::start(Some("sk-right-key-000000")).await;
    fake.error(429);
    fake.reply(Some("ok"), &[], (10, 1, 0));
    let client =
        OpenAiClient::new(&fake.url, Some("sk-right-key-000000".into())).with_retry(fast());
    client
        .complete(&request(vec![Message::user_text("hi")]))
        .await
        .unwrap();
    assert_eq!(fake.requests().len(), 2);

    let wrong = OpenAiClient::new(&fake.url, Some("sk-wrong-key-111111".into())).with_retry(fast());
    let err = wrong
        .complete(&request(vec![Message::user_text("hi")]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProviderError::Api { status: 401, .. }),
        "{err:?}"
    );
    assert!(!err.to_string().contains("sk-wrong-key-111111"));
}

/// An image of the first message reaches Chat Completions as an `image_url` part with a
/// base64 data URL, after the text, in one user message; one read back from a transcript
/// (no bytes) is told as text instead. The fake checks the data URL's base64 and type.
#[tokio::test]
async fn images_go_as_data_url_parts_after_the_text() {
    let fake = FakeOpenAi::start(Some("sk-test-openai-123456")).await;
    fake.reply(Some("A red square."), &[], (1200, 5, 0));
    let client =
        OpenAiClient::new(&fake.url, Some("sk-test-openai-123456".into())).with_retry(fast());
    let bytes = crate::common::images::png(16, 8, 0);
    let image = kodx::model::Image::from_bytes(bytes.clone()).unwrap();
    let mut earlier = image.clone();
    earlier.bytes = None;
    let message = Message::user_with_images("What is in the picture?", &[image, earlier]);
    let answer = client.complete(&request(vec![message])).await.unwrap();
    assert_eq!(answer.stop, ModelStop::EndTurn);
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    let sent = &fake.requests()[0]["messages"][1];
    assert_eq!(sent["role"], "user");
    let parts = sent["content"].as_array().unwrap();
    assert_eq!(parts.len(), 3, "{sent}");
    assert_eq!(
        parts[0],
        json!({"type": "text", "text": "What is in the picture?"})
    );
    use base64::Engine as _;
    let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
    assert_eq!(
        parts[1],
        json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}})
    );
    insta::assert_snapshot!(parts[2]["text"].as_str().unwrap(), @"[kodx: an image (PNG, 16×8, 1 KB) was shown here to an earlier run; it is not sent again]");

    // The fake refuses what the API refuses: bad base64, a type it does not take, bytes
    // that are not the type said.
    for url in [
        "data:image/png;base64,not base64!".to_string(),
        format!("data:image/bmp;base64,{data}"),
        format!("data:image/jpeg;base64,{data}"),
    ] {
        let body = json!({"model": "gpt-4.1", "max_tokens": 5, "messages": [{"role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}]}]});
        let status = reqwest::Client::new()
            .post(format!("{}/chat/completions", fake.url))
            .bearer_auth("sk-test-openai-123456")
            .json(&body)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 400, "{url:.40}");
    }
    assert_eq!(fake.rejected().len(), 3, "{:?}", fake.rejected());
}
