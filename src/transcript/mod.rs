//! A run's transcript: what the model was sent and answered, and every tool call and
//! result, each stored once.
//!
//! The agent sends the model the whole conversation on every request, so storing each
//! request as it was sent grows with the square of the run's length (6 steps made 438 KB).
//! Instead each record holds only what is new since the record before it:
//!
//! - `request`: the request's settings (`model`, `max_tokens`, `temperature`), `system` and
//!   `tools` only when they differ from the previous request's (so: on the first), and the
//!   messages as a change to the conversation so far: keep its first `keep` messages,
//!   `replace` some of them (`{"index": i, "message": …}`, e.g. an old tool result elided
//!   to fit the context window), then append `new_messages`;
//! - `response`: the model's answer (`content`, `stop`, `usage`, `model`) and its cost. Its
//!   content, when not empty, is the conversation's next (assistant) message;
//! - `tool_call`: which call is run (`id`, `name`); its input is in the response's
//!   `tool_use` block with that id;
//! - `tool_result`: the call's `output` and `is_error`. The results of one response become
//!   the conversation's next (user) message, in order, when the next request is made;
//! - `steer`: words someone gave the run while it worked (`author`, `words`) and the text
//!   the model got (`message`), the last block of the next (user) message;
//! - `stop`: how the run ended (the outcome `kodx run --json` reports).
//!
//! One JSON object per line (`kodx run --transcript F.jsonl`) or per database row (`kodx
//! serve`), e.g.:
//!
//! ```text
//! {"type":"request","step":1,"model":"claude-sonnet-4-5","max_tokens":8192,"system":"…","tools":[…],"keep":0,"new_messages":[{"role":"user","content":[{"type":"text","text":"…"}]}]}
//! {"type":"response","step":1,"response":{"content":[{"type":"tool_use","id":"t1","name":"feed_chars","input":{"chars":"ls"}}],"stop":"tool_use","usage":{…},"model":"…"},"cost_usd":0.0042}
//! {"type":"tool_call","step":1,"id":"t1","name":"feed_chars"}
//! {"type":"tool_result","step":1,"id":"t1","output":"README.md\n[exit status: 0]","is_error":false}
//! {"type":"request","step":2,"model":"claude-sonnet-4-5","max_tokens":8192,"keep":3,"new_messages":[]}
//! …
//! {"type":"stop","outcome":{"stop_reason":"end_turn",…}}
//! ```
//!
//! [`Conversation`] replays records into the full requests (to resume a run, or show it);
//! [`Recorder`] makes them, with the same replay, so the two cannot disagree. Transcripts
//! written before this format (a `"kind": "model_request"` record holding the whole
//! request) replay too.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{Block, Message, Request, Response, Role, ToolSpec};

pub mod context;
mod resume;

pub(crate) use resume::append_note;
pub use resume::{resumed_conversation, ResumeError, Resumer, MAX_RESUME_BYTES, RESUMED_NOTE};

/// One transcript record. Secrets are not in them: keys travel only in HTTP headers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// A model request, as the change to the conversation since the records before it.
    #[serde(rename = "request")]
    ModelRequest {
        step: u32,
        model: String,
        max_tokens: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        temperature: Option<f32>,
        /// The model could not call a tool (the run's last call, for the summary).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        answer_only: bool,
        /// Only when it differs from the previous request's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        system: Option<String>,
        /// Only when they differ from the previous request's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tools: Option<Vec<ToolSpec>>,
        /// How many messages of the conversation so far the request starts with.
        keep: usize,
        /// Kept messages that changed (an elided tool result).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        replace: Vec<Replaced>,
        new_messages: Vec<Message>,
    },
    #[serde(rename = "response")]
    ModelResponse {
        step: u32,
        response: Response,
        cost_usd: f64,
    },
    ToolCall {
        step: u32,
        id: String,
        name: String,
    },
    ToolResult {
        step: u32,
        id: String,
        output: String,
        is_error: bool,
    },
    Stop {
        outcome: Value,
    },
    /// What the run's first message carries from the repository (its instructions, nested
    /// `AGENTS.md` paths, pull request template, and what was left out), written before the
    /// first request.
    Context {
        context: context::RepoContext,
    },
    /// One check kodx ran after the model ended its turn.
    Check {
        step: u32,
        result: crate::checks::CheckResult,
    },
    /// Words someone gave the run while it worked (`/kodx steer`, a line typed to `kodx
    /// run`), taken before request `step`: `author` and their `words`, and the text block
    /// the model was given (`message`), the conversation's next user message's last block.
    Steer {
        step: u32,
        author: String,
        words: String,
        message: String,
    },
}

/// A message of the conversation replaced by a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Replaced {
    pub index: usize,
    pub message: Message,
}

/// A transcript that does not replay.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("transcript record {record}: {problem}")]
pub struct TranscriptError {
    /// 1-based position of the record (the line of a `.jsonl` file).
    pub record: usize,
    pub problem: String,
}

/// The conversation as the records so far have built it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    system: Option<String>,
    tools: Option<Vec<ToolSpec>>,
    messages: Vec<Message>,
    /// Tool results not yet sent: the next request's user message.
    results: Vec<Block>,
}

impl Conversation {
    /// Replays one record; for a request, returns it as it was sent.
    pub fn apply(&mut self, record: &Record) -> Result<Option<Request>, String> {
        match record {
            Record::ModelRequest {
                model,
                max_tokens,
                temperature,
                answer_only,
                system,
                tools,
                keep,
                replace,
                new_messages,
                ..
            } => {
                self.flush_results();
                if *keep > self.messages.len() {
                    return Err(format!(
                        "the request keeps {keep} messages of a conversation of {}",
                        self.messages.len()
                    ));
                }
                self.messages.truncate(*keep);
                for r in replace {
                    let Some(slot) = self.messages.get_mut(r.index) else {
                        return Err(format!(
                            "the request replaces message {} of {}",
                            r.index, keep
                        ));
                    };
                    *slot = r.message.clone();
                }
                self.messages.extend(new_messages.iter().cloned());
                if let Some(s) = system {
                    self.system = Some(s.clone());
                }
                if let Some(t) = tools {
                    self.tools = Some(t.clone());
                }
                Ok(Some(Request {
                    model: model.clone(),
                    system: self.system.clone().unwrap_or_default(),
                    messages: self.messages.clone(),
                    tools: self.tools.clone().unwrap_or_default(),
                    max_tokens: *max_tokens,
                    temperature: *temperature,
                    answer_only: *answer_only,
                }))
            }
            Record::ModelResponse { response, .. } => {
                self.flush_results();
                if !response.content.is_empty() {
                    self.messages.push(Message {
                        role: Role::Assistant,
                        content: response.content.clone(),
                    });
                }
                Ok(None)
            }
            Record::ToolResult {
                id,
                output,
                is_error,
                ..
            } => {
                self.results.push(Block::ToolResult {
                    tool_use_id: id.clone(),
                    content: output.clone(),
                    is_error: *is_error,
                });
                Ok(None)
            }
            Record::Steer { message, .. } => {
                // With the results not yet sent, or as the next user message of its own.
                self.results.push(Block::Text {
                    text: message.clone(),
                });
                Ok(None)
            }
            Record::ToolCall { .. }
            | Record::Stop { .. }
            | Record::Context { .. }
            | Record::Check { .. } => Ok(None),
        }
    }

    /// Replays one stored record (JSON text), in this format or the earlier one.
    pub fn apply_json(&mut self, json: &str) -> Result<Option<Request>, String> {
        let value: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
        if value.get("type").is_none() {
            return self.apply_legacy(value);
        }
        let record: Record =
            serde_json::from_value(value).map_err(|e| format!("not a transcript record: {e}"))?;
        self.apply(&record)
    }

    /// A record of the earlier format: only its whole requests matter.
    fn apply_legacy(&mut self, value: Value) -> Result<Option<Request>, String> {
        if value.get("kind").and_then(Value::as_str) != Some("model_request") {
            return Ok(None);
        }
        let request: Request = serde_json::from_value(value["request"].clone())
            .map_err(|e| format!("not a model request: {e}"))?;
        self.system = Some(request.system.clone());
        self.tools = Some(request.tools.clone());
        self.messages = request.messages.clone();
        self.results.clear();
        Ok(Some(request))
    }

    /// The conversation so far, with tool results not yet sent as its last message: what a
    /// resumed run would continue from.
    pub fn messages(&self) -> Vec<Message> {
        let mut all = self.messages.clone();
        if !self.results.is_empty() {
            all.push(Message {
                role: Role::User,
                content: self.results.clone(),
            });
        }
        all
    }

    fn flush_results(&mut self) {
        if !self.results.is_empty() {
            self.messages.push(Message {
                role: Role::User,
                content: std::mem::take(&mut self.results),
            });
        }
    }
}

/// Every request of a stored transcript (JSON records in order), rebuilt as it was sent.
pub fn requests<'a>(
    records: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<Request>, TranscriptError> {
    let mut conversation = Conversation::default();
    let mut out = Vec::new();
    for (i, json) in records.into_iter().enumerate() {
        let request = conversation
            .apply_json(json)
            .map_err(|problem| TranscriptError {
                record: i + 1,
                problem,
            })?;
        out.extend(request);
    }
    Ok(out)
}

/// Makes the records of one run: each request as its change to the conversation the
/// records before it built.
#[derive(Debug, Default)]
pub struct Recorder {
    replay: Conversation,
}

impl Recorder {
    /// The record of a request about to be sent.
    pub fn request(&mut self, step: u32, request: &Request) -> Record {
        self.replay.flush_results();
        let known = &self.replay.messages;
        let keep = known.len().min(request.messages.len());
        let replace = (0..keep)
            .filter(|&i| known[i] != request.messages[i])
            .map(|i| Replaced {
                index: i,
                message: request.messages[i].clone(),
            })
            .collect();
        let record = Record::ModelRequest {
            step,
            model: request.model.clone(),
            max_tokens: request.max_tokens,
            temperature: request.temperature,
            answer_only: request.answer_only,
            system: (self.replay.system.as_ref() != Some(&request.system))
                .then(|| request.system.clone()),
            tools: (self.replay.tools.as_ref() != Some(&request.tools))
                .then(|| request.tools.clone()),
            keep,
            replace,
            new_messages: request.messages[keep..].to_vec(),
        };
        self.note(record)
    }

    /// Any other record, passed through the replay so later requests are recorded against
    /// what a reader will have rebuilt.
    pub fn note(&mut self, record: Record) -> Record {
        let replayed = self.replay.apply(&record);
        debug_assert!(replayed.is_ok(), "{replayed:?}");
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelStop, Usage};
    use serde_json::json;

    fn request(messages: Vec<Message>) -> Request {
        Request {
            model: "m".into(),
            system: "sys".into(),
            messages,
            tools: vec![ToolSpec {
                name: "feed_chars".into(),
                description: "d".into(),
                input_schema: json!({"type": "object"}),
            }],
            max_tokens: 100,
            temperature: Some(0.5),
            answer_only: false,
        }
    }

    fn response(content: Vec<Block>) -> Record {
        Record::ModelResponse {
            step: 1,
            response: Response {
                content,
                stop: ModelStop::ToolUse,
                usage: Usage::default(),
                model: "m".into(),
            },
            cost_usd: 0.001,
        }
    }

    fn call(id: &str) -> Block {
        Block::ToolUse {
            id: id.into(),
            name: "feed_chars".into(),
            input: json!({"chars": "ls"}),
        }
    }

    fn result(id: &str, output: &str) -> Block {
        Block::ToolResult {
            tool_use_id: id.into(),
            content: output.into(),
            is_error: false,
        }
    }

    /// Records a conversation the way the agent does, and replays it from JSON.
    #[test]
    fn requests_replay_exactly_with_elision_and_nudges() {
        let mut rec = Recorder::default();
        let mut lines = Vec::new();
        let mut sent = Vec::new();
        fn emit(r: Record, lines: &mut Vec<String>) {
            lines.push(serde_json::to_string(&r).unwrap());
        }
        let mut messages = vec![Message::user_text("do it")];
        for step in 1..=4u32 {
            let req = request(messages.clone());
            emit(rec.request(step, &req), &mut lines);
            sent.push(req);
            let id = format!("t{step}");
            let content = vec![call(&id)];
            emit(rec.note(response(content.clone())), &mut lines);
            messages.push(Message {
                role: Role::Assistant,
                content,
            });
            emit(
                rec.note(Record::ToolCall {
                    step,
                    id: id.clone(),
                    name: "feed_chars".into(),
                }),
                &mut lines,
            );
            let output = "x".repeat(300 * step as usize);
            emit(
                rec.note(Record::ToolResult {
                    step,
                    id: id.clone(),
                    output: output.clone(),
                    is_error: false,
                }),
                &mut lines,
            );
            messages.push(Message {
                role: Role::User,
                content: vec![result(&id, &output)],
            });
            if step == 2 {
                // The agent elides an old result and nudges the model.
                messages[2].content[0] = result("t1", "[elided: 300 bytes]");
                messages.push(Message::user_text("continue"));
            }
        }
        let req = request(messages.clone());
        emit(rec.request(5, &req), &mut lines);
        sent.push(req);

        let rebuilt = requests(lines.iter().map(String::as_str)).unwrap();
        assert_eq!(rebuilt, sent);
        // System and tools once; each later request carries only what is new.
        assert_eq!(lines.iter().filter(|l| l.contains("\"system\"")).count(), 1);
        let last: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
        assert_eq!(last["keep"], 10);
        assert_eq!(last["new_messages"], json!([]));
        let third: Value = serde_json::from_str(&lines[8]).unwrap();
        assert_eq!(third["type"], "request");
        assert_eq!(third["replace"][0]["index"], 2);
        assert_eq!(third["new_messages"].as_array().unwrap().len(), 1);
        // Every tool output is stored once.
        let all = lines.join("\n");
        assert_eq!(all.matches(&"x".repeat(1200)).count(), 1);
    }

    /// An image of the first message is stored as its kind, size and hash; the requests
    /// after it keep it (no `replace`, though the replay has no bytes), and a resumed
    /// conversation tells the model what was there instead of sending it.
    #[test]
    fn images_are_recorded_without_their_bytes_and_resumed_as_words() {
        let image = crate::image::Image::from_bytes(crate::image::samples::png(800, 600)).unwrap();
        let first = Message::user_with_images("look", std::slice::from_ref(&image));
        let mut rec = Recorder::default();
        let mut lines =
            vec![serde_json::to_string(&rec.request(1, &request(vec![first.clone()]))).unwrap()];
        let answer = vec![Block::Text {
            text: "seen".into(),
        }];
        lines.push(serde_json::to_string(&rec.note(response(answer.clone()))).unwrap());
        let second = vec![
            first,
            Message {
                role: Role::Assistant,
                content: answer,
            },
            Message::user_text("more"),
        ];
        let record = rec.request(2, &request(second));
        let Record::ModelRequest { keep, replace, .. } = &record else {
            panic!("{record:?}")
        };
        assert_eq!((*keep, replace.len()), (2, 0));
        assert!(!lines[0].contains(&image.base64().unwrap()), "{}", lines[0]);
        assert!(lines[0].contains(&image.sha256), "{}", lines[0]);
        let mut resumer = Resumer::default();
        for l in &lines {
            resumer.push(l).unwrap();
        }
        let resumed = resumer.finish("").unwrap();
        let words = resumed[0].text();
        insta::assert_snapshot!(words, @"
        look
        [kodx: an image (PNG, 800×600, 1 KB) was shown here to an earlier run; it is not sent again]
        ");
    }

    #[test]
    fn the_earlier_format_replays_and_bad_records_are_named() {
        let req = request(vec![Message::user_text("hi")]);
        let legacy = json!({"kind": "model_request", "step": 1, "request": req}).to_string();
        let other = json!({"kind": "tool_call", "step": 1, "id": "t", "name": "n", "input": {}})
            .to_string();
        let rebuilt = requests([legacy.as_str(), other.as_str()]).unwrap();
        assert_eq!(rebuilt, vec![req]);

        let e = requests(["{}", "not json"]).unwrap_err();
        assert_eq!(e.record, 2);
        let bad = json!({"type": "request", "step": 1, "model": "m", "max_tokens": 1,
                         "keep": 3, "new_messages": []})
        .to_string();
        let e = requests([bad.as_str()]).unwrap_err();
        assert!(e.to_string().contains("keeps 3 messages"), "{e}");
    }

    #[test]
    fn messages_end_with_the_results_not_yet_sent() {
        let mut c = Conversation::default();
        c.apply(&Recorder::default().request(1, &request(vec![Message::user_text("go")])))
            .unwrap();
        c.apply(&response(vec![call("t1")])).unwrap();
        c.apply(&Record::ToolResult {
            step: 1,
            id: "t1".into(),
            output: "done".into(),
            is_error: false,
        })
        .unwrap();
        let m = c.messages();
        assert_eq!(m.len(), 3);
        assert_eq!(m[2].content, vec![result("t1", "done")]);
    }

    /// A steer joins the tool results about to be sent: recorded once, the next request
    /// replays exactly, and a run stopped before that request resumes with it.
    #[test]
    fn a_steer_is_recorded_once_and_replayed_with_the_results() {
        let mut rec = Recorder::default();
        let mut lines = Vec::new();
        let first = request(vec![Message::user_text("go")]);
        lines.push(serde_json::to_string(&rec.request(1, &first)).unwrap());
        lines.push(serde_json::to_string(&rec.note(response(vec![call("t1")]))).unwrap());
        let tool_result = Record::ToolResult {
            step: 1,
            id: "t1".into(),
            output: "done".into(),
            is_error: false,
        };
        lines.push(serde_json::to_string(&rec.note(tool_result)).unwrap());
        let steer = Record::Steer {
            step: 2,
            author: "alice".into(),
            words: "use v2".into(),
            message: "@alice steered: use v2".into(),
        };
        lines.push(serde_json::to_string(&rec.note(steer)).unwrap());
        // Stopped here: the resumed conversation holds the steer after the result.
        let mut resumed = Conversation::default();
        for l in &lines {
            resumed.apply_json(l).unwrap();
        }
        let steered = Message {
            role: Role::User,
            content: vec![
                result("t1", "done"),
                Block::Text {
                    text: "@alice steered: use v2".into(),
                },
            ],
        };
        assert_eq!(resumed.messages().last(), Some(&steered));
        // Or the next request, sent with it: the record adds nothing to the conversation.
        let mut messages = first.messages.clone();
        messages.push(Message {
            role: Role::Assistant,
            content: vec![call("t1")],
        });
        messages.push(steered);
        let second = request(messages);
        let record = rec.request(2, &second);
        let Record::ModelRequest {
            keep,
            ref replace,
            ref new_messages,
            ..
        } = record
        else {
            unreachable!()
        };
        assert_eq!((keep, replace.len(), new_messages.len()), (3, 0, 0));
        lines.push(serde_json::to_string(&record).unwrap());
        let sent = requests(lines.iter().map(String::as_str)).unwrap();
        assert_eq!(sent, vec![first, second]);
    }

    #[test]
    fn a_resumer_rebuilds_the_conversation_and_tells_the_note() {
        let lines = [
            serde_json::to_string(
                &Recorder::default().request(1, &request(vec![Message::user_text("go")])),
            )
            .unwrap(),
            String::new(),
            serde_json::to_string(&response(vec![call("t1")])).unwrap(),
        ];
        let mut r = Resumer::default();
        for l in &lines {
            r.push(l).unwrap();
        }
        let m = r.finish("and add tests").unwrap();
        // The prompt, the call, then its (interrupted) result with the note and the extra.
        assert_eq!(m.len(), 3);
        assert_eq!(m[0], Message::user_text("go"));
        let last = serde_json::to_string(&m[2]).unwrap();
        assert!(last.contains("stopped before this call returned"), "{last}");
        assert!(last.contains("resumed in a new environment"), "{last}");
        assert!(last.contains("and add tests"), "{last}");
    }

    #[test]
    fn a_resumer_refuses_empty_bad_and_oversized_transcripts() {
        assert_eq!(
            Resumer::default().finish("").unwrap_err(),
            ResumeError::NoRequest
        );
        let mut r = Resumer::default();
        r.push("").unwrap();
        assert!(matches!(
            r.push("not json"),
            Err(ResumeError::Record { record: 2, .. })
        ));
        // The bound counts what was read, so a stream of many records stops too.
        let big = " ".repeat(1 << 20);
        let mut r = Resumer::default();
        let mut refused = None;
        for i in 0..=(MAX_RESUME_BYTES >> 20) {
            if let Err(e) = r.push(&big) {
                refused = Some((i, e));
                break;
            }
        }
        assert_eq!(refused.map(|(_, e)| e), Some(ResumeError::TooLarge));
    }
}
