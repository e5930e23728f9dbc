//! A long run's transcript written straight into the server's database, as the agent
//! writes it (a request, the model's answer with one command, the command's result per
//! step): for the run page's bounds, without running 300 model calls.

use kodx::model::{Block, ModelStop, Response, Usage};
use kodx::transcript::Record;

/// What one of the issue's hostile outputs looks like: `len` characters of `"<`, which
/// HTML escapes to about five times as many bytes.
pub fn escaping_output(len: usize) -> String {
    "\"<".repeat(len / 2)
}

/// Appends `steps` steps to run `run_id`'s transcript, step `n` typing `echo step-n`
/// and printing `output`; each answer costs $0.001. The run must be the oldest queued
/// one (a server without workers): it is claimed here, as a worker would, since only the
/// claim running a run may write its transcript; it stays running (live).
pub async fn write_steps(db: &kodx::db::Db, run_id: &str, steps: u32, output: &str) {
    let claimed = db
        .claim_run("long-run-writer")
        .await
        .unwrap()
        .expect("a queued run to claim");
    assert_eq!(claimed.id, run_id, "the run claimed is the one to write");
    let lease = claimed.lease().expect("a claimed run has a lease");
    let mut seq = db.next_transcript_seq(run_id).await.unwrap();
    for step in 1..=steps {
        let id = format!("call-{step}");
        let records = [
            Record::ModelResponse {
                step,
                response: Response {
                    content: vec![Block::ToolUse {
                        id: id.clone(),
                        name: "feed_chars".into(),
                        input: serde_json::json!({ "chars": format!("echo step-{step}\n") }),
                    }],
                    stop: ModelStop::ToolUse,
                    usage: Usage {
                        input_tokens: 1000,
                        output_tokens: 10,
                        ..Usage::default()
                    },
                    model: "fake".into(),
                },
                cost_usd: 0.001,
            },
            Record::ToolCall {
                step,
                id: id.clone(),
                name: "feed_chars".into(),
            },
            Record::ToolResult {
                step,
                id,
                output: output.to_string(),
                is_error: false,
            },
        ];
        for record in records {
            let json = serde_json::to_string(&record).unwrap();
            db.append_transcript(run_id, &lease, seq, &json)
                .await
                .unwrap();
            seq += 1;
        }
    }
}
