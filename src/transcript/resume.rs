//! Going on with an earlier run: its stored transcript replayed into the conversation
//! ([`Resumer`]), the interrupted tool calls answered and the resumed run told so
//! ([`resumed_conversation`]). `kodx run --resume` and `/kodx continue` both use it; the
//! agent loop only sees the messages it returns.

use super::Conversation;
use crate::model::{Block, Message, Role};

/// The most of a transcript a resumed run reads (its tool outputs are capped; a run of a
/// thousand steps stays far below this).
pub const MAX_RESUME_BYTES: u64 = 512 << 20;

/// Why a stored transcript cannot be resumed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResumeError {
    #[error("it is more than a transcript kodx reads ({} MiB)", MAX_RESUME_BYTES >> 20)]
    TooLarge,
    #[error("record {record}: {problem}")]
    Record { record: usize, problem: String },
    #[error("it holds no model request")]
    NoRequest,
}

/// Replays a stored transcript, record by record (a `.jsonl` file's lines or the database's
/// rows), into the conversation a resumed run goes on with: [`Resumer::push`] each record,
/// then [`Resumer::finish`]. Reads at most [`MAX_RESUME_BYTES`]. `kodx run --resume` and
/// `/kodx continue` both use it.
#[derive(Debug, Default)]
pub struct Resumer {
    conversation: Conversation,
    records: usize,
    requests: usize,
    bytes: u64,
}

impl Resumer {
    /// Replays one record (blank lines are skipped).
    pub fn push(&mut self, json: &str) -> Result<(), ResumeError> {
        self.records += 1;
        self.bytes += json.len() as u64 + 1;
        if self.bytes > MAX_RESUME_BYTES {
            return Err(ResumeError::TooLarge);
        }
        if json.trim().is_empty() {
            return Ok(());
        }
        match self.conversation.apply_json(json) {
            Ok(Some(_)) => self.requests += 1,
            Ok(None) => {}
            Err(problem) => {
                return Err(ResumeError::Record {
                    record: self.records,
                    problem,
                })
            }
        }
        Ok(())
    }

    /// The conversation, ready to go on: interrupted tool calls answered, and
    /// [`RESUMED_NOTE`] told (followed by `extra`, when not blank) in its
    /// newest user message.
    pub fn finish(self, extra: &str) -> Result<Vec<Message>, ResumeError> {
        if self.requests == 0 {
            return Err(ResumeError::NoRequest);
        }
        let note = if extra.trim().is_empty() {
            RESUMED_NOTE.to_string()
        } else {
            format!("{}\n\n{}", RESUMED_NOTE, extra.trim())
        };
        Ok(resumed_conversation(self.conversation.messages(), &note))
    }
}

/// Told to a resumed run (`kodx run --resume`) before it goes on.
pub const RESUMED_NOTE: &str = "[kodx: this run was resumed in a new environment: the files are \
as the earlier run left them, but its shells, running processes and anything installed outside \
the repository are gone (the setup script ran again). Continue the task.]";

/// The conversation of an earlier run, ready to go on: tool calls it made but never got
/// results for are answered as interrupted, and `note` (with what the user adds) is told
/// in the newest user message.
pub fn resumed_conversation(mut messages: Vec<Message>, note: &str) -> Vec<Message> {
    // A transcript keeps no image's bytes: the model is told what was there instead.
    for block in messages.iter_mut().flat_map(|m| m.content.iter_mut()) {
        if let Block::Image { image } = block {
            if image.bytes.is_none() {
                *block = Block::Text {
                    text: image.not_sent_note(),
                };
            }
        }
    }
    // Results already given, by the tool call they answer.
    let answered: std::collections::HashSet<String> = messages
        .iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            Block::ToolResult { tool_use_id, .. } => Some(tool_use_id.clone()),
            _ => None,
        })
        .collect();
    let pending: Vec<Block> = messages
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant)
        .into_iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            Block::ToolUse { id, .. } if !answered.contains(id) => Some(Block::ToolResult {
                tool_use_id: id.clone(),
                content: "[the run stopped before this call returned]".into(),
                is_error: true,
            }),
            _ => None,
        })
        .collect();
    if !pending.is_empty() {
        match messages.last_mut() {
            Some(last) if last.role == Role::User => last.content.extend(pending),
            _ => messages.push(Message {
                role: Role::User,
                content: pending,
            }),
        }
    }
    if !append_note(&mut messages, note) {
        messages.push(Message::user_text(note));
    }
    messages
}

/// Appends `note` to the newest message when it is the user's (after its last tool result
/// or text); false when there is none to append to. The agent loop tells its own notes
/// (the limits drawing near, the last call) the same way.
pub(crate) fn append_note(messages: &mut [Message], note: &str) -> bool {
    let Some(last) = messages.last_mut() else {
        return false;
    };
    if last.role != Role::User {
        return false;
    }
    match last.content.last_mut() {
        Some(Block::ToolResult { content, .. }) => {
            content.push_str("\n\n");
            content.push_str(note);
            true
        }
        Some(Block::Text { text }) => {
            text.push_str("\n\n");
            text.push_str(note);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_resumed_conversation_answers_interrupted_calls_and_ends_with_the_note() {
        let call = |id: &str| Block::ToolUse {
            id: id.into(),
            name: "feed_chars".into(),
            input: json!({"chars": "sleep 99"}),
        };
        let result = |id: &str| Block::ToolResult {
            tool_use_id: id.into(),
            content: "ok".into(),
            is_error: false,
        };
        // Two calls, one answered before the run stopped.
        let messages = vec![
            Message::user_text("go"),
            Message {
                role: Role::Assistant,
                content: vec![call("a"), call("b")],
            },
            Message {
                role: Role::User,
                content: vec![result("a")],
            },
        ];
        let m = resumed_conversation(messages, "NOTE");
        assert_eq!(m.len(), 3);
        let Block::ToolResult {
            tool_use_id,
            content,
            is_error,
        } = &m[2].content[1]
        else {
            panic!("{m:?}")
        };
        assert_eq!(tool_use_id, "b");
        assert!(content.starts_with("[the run stopped before this call returned]"));
        assert!(content.ends_with("NOTE") && *is_error);
        // A conversation that ended with the model's answer gets a new user turn.
        let m = resumed_conversation(
            vec![
                Message::user_text("go"),
                Message {
                    role: Role::Assistant,
                    content: vec![Block::Text {
                        text: "done".into(),
                    }],
                },
            ],
            "NOTE",
        );
        assert_eq!(m.last().unwrap().role, Role::User);
        assert_eq!(m.last().unwrap().text(), "NOTE");
    }
}
