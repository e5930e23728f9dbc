//! The two shell tools the model is offered (SPEC §6), and running one call in the sandbox.

use std::time::Duration;

use serde_json::{json, Value};

use super::Agent;
use crate::model::ToolSpec;
use crate::sandbox::DEFAULT_SHELL;

/// The two tools, named and shaped as in the original kodx (SPEC §6).
pub fn tools(command_timeout: Duration) -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "feed_chars".into(),
            description: format!(
                "Type characters into a shell and return what it printed since the last read. \
                 A newline is added unless `chars` is empty or already ends with one; empty `chars` \
                 just reads new output. Returns as soon as the shell is back at its prompt (with \
                 '[exit status: N]'), when a program waits at its own prompt ('[waiting for input]'), \
                 or after `yield_time_ms` with the partial output and '[still running …]': the command \
                 is NOT stopped. Send \"\\x03\" to interrupt (also \"\\x04\", \"\\x1b\" at the start \
                 of `chars`). Output past about 20,000 bytes is cut in the middle. Default and most \
                 yield: {} ms.",
                command_timeout.as_millis()
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "chars": {"type": "string", "description": "What to type. A command, a line for a running program, control escapes, or \"\" to read new output."},
                    "shell_name": {"type": "string", "description": "Which shell (default \"default\")."},
                    "yield_time_ms": {"type": "integer", "minimum": 0, "description": "How long to wait for the prompt before returning partial output."}
                },
                "required": ["chars"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "create_new_shell".into(),
            description: "Start a fresh shell in the workspace directory. \"default\" replaces the main \
                          shell (its jobs are hung up); a new name adds a parallel shell, e.g. a server in \
                          one and a client in another."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "shell_name": {"type": "string", "description": "Name of the shell (default \"default\")."}
                },
                "additionalProperties": false
            }),
        },
    ]
}

impl Agent<'_> {
    /// Runs one tool call; `Err` carries the message the model gets back as an error.
    pub(super) async fn call_tool(&self, name: &str, input: &Value) -> Result<String, String> {
        let obj = input.as_object().ok_or_else(|| {
            format!(
                "the arguments of {name} must be a JSON object, got: {}",
                shorten(&input.to_string())
            )
        })?;
        let shell = match obj.get("shell_name") {
            None | Some(Value::Null) => DEFAULT_SHELL.to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => return Err(format!("shell_name must be a string, got {other}")),
        };
        match name {
            "create_new_shell" => {
                if let Some(k) = obj.keys().find(|k| *k != "shell_name") {
                    return Err(format!("create_new_shell takes only shell_name, not {k:?}"));
                }
                self.sandbox
                    .create_new_shell(&shell)
                    .await
                    .map_err(|e| e.to_string())
            }
            "feed_chars" => {
                if let Some(k) = obj
                    .keys()
                    .find(|k| !["chars", "shell_name", "yield_time_ms"].contains(&k.as_str()))
                {
                    return Err(format!(
                        "feed_chars takes chars, shell_name and yield_time_ms, not {k:?}"
                    ));
                }
                let chars = match obj.get("chars") {
                    Some(Value::String(s)) => s.as_str(),
                    Some(other) => return Err(format!("chars must be a string, got {other}")),
                    None => {
                        return Err("feed_chars needs chars (use \"\" to read new output)".into())
                    }
                };
                let max = self.config.command_timeout;
                let yield_time = match obj.get("yield_time_ms") {
                    None | Some(Value::Null) => max,
                    Some(v) => match v.as_u64() {
                        Some(ms) => Duration::from_millis(ms).min(max),
                        None => {
                            return Err(format!(
                                "yield_time_ms must be a non-negative integer, got {v}"
                            ))
                        }
                    },
                };
                self.sandbox
                    .feed_chars(&shell, chars, yield_time)
                    .await
                    .map(|out| out.render())
                    .map_err(|e| e.to_string())
            }
            other => Err(format!(
                "unknown tool {other:?}: the tools are feed_chars and create_new_shell"
            )),
        }
    }
}

fn shorten(s: &str) -> String {
    if s.chars().count() <= 200 {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(200).collect::<String>())
    }
}

/// `feed_chars(default): cargo test` — for progress lines.
pub(super) fn describe_call(name: &str, input: &Value) -> String {
    let shell = input["shell_name"].as_str().unwrap_or(DEFAULT_SHELL);
    match input["chars"].as_str() {
        Some(chars) => {
            let first = chars.lines().next().unwrap_or("");
            format!(
                "{name}({shell}): {}",
                shorten(first).chars().take(60).collect::<String>()
            )
        }
        None => format!("{name}({shell})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_tools_with_object_schemas() {
        let t = tools(Duration::from_secs(30));
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["feed_chars", "create_new_shell"]);
        for tool in &t {
            assert_eq!(tool.input_schema["type"], "object");
        }
        assert_eq!(t[0].input_schema["required"], json!(["chars"]));
        assert!(t[0].description.contains("30000 ms"));
    }

    #[test]
    fn calls_are_described_briefly() {
        assert_eq!(
            describe_call("feed_chars", &json!({"chars": "cargo test\nmore"})),
            "feed_chars(default): cargo test"
        );
        assert_eq!(
            describe_call("create_new_shell", &json!({"shell_name": "srv"})),
            "create_new_shell(srv)"
        );
    }
}
