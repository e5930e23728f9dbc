//! Reading a transcript for the page a few records at a time: a page (or a live update)
//! is the steps from one record on, cut at a step's start once it has
//! [`STEPS_PER_PAGE`] steps or [`PAGE_BYTES`] of HTML, so what one view holds is bounded
//! whatever the run (a 300-step run of 20,000-character outputs is about a dozen pages).

use serde::Deserialize;

use super::render::{render_step, starts_step, StepReader};
use crate::db::Db;
use crate::transcript::context::RepoContext;
use crate::transcript::Record;

/// Steps one page shows at most.
pub const STEPS_PER_PAGE: usize = 25;
/// HTML of steps one page holds: past it the page ends at the next step's start (one
/// step's card may go beyond it: at most a model answer's text and its commands, each
/// cut to 20,000 characters).
pub const PAGE_BYTES: usize = 1 << 20;
/// Records read from the database at once (each up to a command's stored output).
const BATCH: i64 = 8;

/// Steps read from one record on.
pub(super) struct Chunk {
    /// The steps' cards.
    pub html: String,
    pub steps: usize,
    /// Where the last step shown starts (it may still grow while the run works).
    pub last_step: Option<i64>,
    /// Where the next page starts, when this one was cut.
    pub next: Option<i64>,
    /// The last record taken in (`from - 1` when none was).
    pub read_to: i64,
    /// The cost and API calls of the model answers taken in after `count_after`.
    pub spent: (f64, u64),
}

/// The steps from record `from` on, one page's worth; the answers' cost after
/// `count_after` is added up on the way.
pub(super) async fn read_steps(
    db: &Db,
    run_id: &str,
    from: i64,
    count_after: i64,
) -> Result<Chunk, crate::db::DbError> {
    let mut chunk = Chunk {
        html: String::new(),
        steps: 0,
        last_step: None,
        next: None,
        read_to: from - 1,
        spent: (0.0, 0),
    };
    let mut reader = StepReader::default();
    let mut at = from;
    'read: loop {
        let records = db.transcript_records(run_id, at, BATCH).await?;
        let Some(last) = records.last().map(|r| r.0) else {
            break;
        };
        for (seq, line) in records {
            let Ok(record) = serde_json::from_str::<Record>(&line) else {
                chunk.read_to = seq;
                continue;
            };
            if starts_step(&record) {
                let full = chunk.steps >= STEPS_PER_PAGE || chunk.html.len() >= PAGE_BYTES;
                if full && chunk.last_step.is_some() {
                    chunk.next = Some(seq);
                    break 'read;
                }
                chunk.last_step = Some(seq);
                chunk.steps += 1;
            }
            if let (Record::ModelResponse { cost_usd, .. }, true) = (&record, seq > count_after) {
                chunk.spent.0 += cost_usd;
                chunk.spent.1 += 1;
            }
            if let Some(done) = reader.push(seq, record) {
                render_step(&done, &mut chunk.html);
            }
            chunk.read_to = seq;
        }
        at = last + 1;
    }
    if let Some(open) = reader.finish() {
        render_step(&open, &mut chunk.html);
    }
    Ok(chunk)
}

/// Only what [`costs`] needs of a record: the rest is skipped, not built.
#[derive(Deserialize)]
struct Costed {
    #[serde(rename = "type")]
    kind: String,
    cost_usd: Option<f64>,
}

/// The cost and number of the model answers among records `from..to`.
pub(super) async fn costs(
    db: &Db,
    run_id: &str,
    from: i64,
    to: i64,
) -> Result<(f64, u64), crate::db::DbError> {
    let mut spent = (0.0, 0);
    let mut at = from;
    while at < to {
        let records = db
            .transcript_records(run_id, at, BATCH.min(to - at))
            .await?;
        let Some(last) = records.last().map(|r| r.0) else {
            break;
        };
        for (seq, line) in records {
            if seq >= to {
                break;
            }
            if let Ok(Costed {
                kind,
                cost_usd: Some(c),
            }) = serde_json::from_str(&line)
            {
                if kind == "response" {
                    spent.0 += c;
                    spent.1 += 1;
                }
            }
        }
        at = last + 1;
    }
    Ok(spent)
}

/// What the run's first message carried from the repository (the transcript's `context`
/// record, written before the first request).
pub(super) async fn given_context(db: &Db, run_id: &str) -> Option<RepoContext> {
    let records = db.transcript_records(run_id, 0, 4).await.ok()?;
    records
        .iter()
        .find_map(|(_, line)| match serde_json::from_str(line) {
            Ok(Record::Context { context }) => Some(context),
            _ => None,
        })
}
