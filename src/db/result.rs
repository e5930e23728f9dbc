//! The run's stored result (the `result` column of its row): one typed record, written once
//! when the run ends and read back by whoever needs it (`/kodx continue` finds the branch a
//! stopped run pushed to and what its parts cost, a CI repair reads what the run that made
//! a commit said it did). Every field has a default, so rows an earlier version wrote stay
//! readable; fields with nothing to say are left out of the row.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a run ended, as its row keeps it. A run the agent worked in fills the first group; a
/// run refused or dismissed before it started fills `refused` (or `dismissed`) and what
/// the refusal names; a run kodx failed says its `error`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RunResult {
    /// The agent's last message (the answer, or the summary of the change), redacted.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_message: String,
    /// What failed after the agent ended, or why it stopped, redacted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// How long each phase took, in milliseconds (read by `bench/pr-latency.sh`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub timings_ms: BTreeMap<String, u64>,
    /// The admission the run ran under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionRecord>,
    /// Whether the setup cache served the container's setup (`hit`, `miss`, `off`…).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setup_cache: Option<String>,
    /// The branch a code run pushed its change to (what `/kodx continue` goes on from).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// For `/kodx continue`: the run it went on with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continues: Option<Continues>,
    /// The Docker engine the run's container was on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// The run's container was a warm sandbox.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub warm_start: bool,
    /// The warm sandbox held the repository's checkout: how the copy-in used it
    /// (`same_tip`, `difference`, `whole`, `packed_over`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preloaded: Option<String>,

    /// Why the run was refused (its end reason: `not_permitted`, `budget_exceeded`…), or
    /// what a control job answered (`help`, `cancel`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Why a follow-up kodx started itself was dismissed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dismissed: Option<String>,
    /// The error behind a refusal, or kodx's own failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Not permitted: the permission needed, and the one the author has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needed: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub has: Option<String>,
    /// The monthly budget, and what was spent of it, when it was spent (USD).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spent: Option<f64>,
    /// A base branch asked for that does not exist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

/// The admission a run ran under: who asked, and the limits it got.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AdmissionRecord {
    /// The author's permission on the repository (`None`: not asked).
    pub permission: Option<String>,
    pub cost_limit: f64,
    pub max_iterations: u32,
    /// What was left of the monthly budget (`None`: no budget).
    pub budget_left: Option<f64>,
}

/// The stopped run a `/kodx continue` went on with.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Continues {
    /// Its id.
    pub run: String,
    /// The request of the first `/kodx code` of the chain.
    pub request: String,
    /// What the parts before this one cost, USD.
    pub cost_usd: f64,
}

impl RunResult {
    /// The record stored as `text` (a row's `result`); a row without one, or one that does
    /// not read as a result, reads as nothing said.
    pub fn parse(text: Option<&str>) -> RunResult {
        text.and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default()
    }

    /// The JSON text stored in the row.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("a run result serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows as kodx wrote them before the result was typed (`json!` with every key, `null`
    /// where there was nothing), and an older row without the later keys, read as before.
    #[test]
    fn rows_written_before_read_the_same() {
        let row = include_str!("../../tests/data/run_result_row.json");
        let rows: Vec<serde_json::Value> = row
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let work = RunResult::parse(Some(&rows[0].to_string()));
        assert_eq!(work.last_message, "Added the `--verbose` flag.");
        assert_eq!(work.detail, None);
        assert_eq!(work.model, "claude-sonnet-4-5");
        assert_eq!(work.timings_ms["clone"], 412);
        assert_eq!(work.timings_ms["push"], 903);
        assert_eq!(
            work.admission,
            Some(AdmissionRecord {
                permission: Some("write".into()),
                cost_limit: 2.0,
                max_iterations: 40,
                budget_left: None,
            })
        );
        assert_eq!(work.setup_cache.as_deref(), Some("hit"));
        assert_eq!(work.branch.as_deref(), Some("kodx/issue-7-1a2b3c"));
        assert_eq!(
            work.continues,
            Some(Continues {
                run: "01HXRUN0001".into(),
                request: "add a verbose flag".into(),
                cost_usd: 0.25,
            })
        );
        assert_eq!(work.engine.as_deref(), Some("local"));
        assert!(work.warm_start);
        assert_eq!(work.refused, None);
        // Written again, it says the same (the `null`s left out).
        let again: serde_json::Value = serde_json::from_str(&work.to_text()).unwrap();
        let mut expected = rows[0].clone();
        expected
            .as_object_mut()
            .unwrap()
            .retain(|_, v| !v.is_null());
        assert_eq!(again, expected);

        let stopped = RunResult::parse(Some(&rows[1].to_string()));
        assert_eq!(
            stopped.detail.as_deref(),
            Some("the step limit (40) was reached")
        );
        assert_eq!(stopped.branch, None);
        assert_eq!(stopped.continues, None);
        assert_eq!(stopped.admission.unwrap().budget_left, Some(7.5));
        assert!(!stopped.warm_start);

        let old = RunResult::parse(Some(&rows[2].to_string()));
        assert_eq!(old.branch.as_deref(), Some("kodx/7-abc"));
        assert_eq!(old.last_message, "done");
        assert_eq!(
            (old.engine, old.warm_start, old.admission),
            (None, false, None)
        );

        let refused = RunResult::parse(Some(&rows[3].to_string()));
        assert_eq!(refused.refused.as_deref(), Some("not_permitted"));
        assert_eq!(refused.needed.as_deref(), Some("write"));
        assert_eq!(refused.has.as_deref(), Some("read"));
        let again: serde_json::Value = serde_json::from_str(&refused.to_text()).unwrap();
        assert_eq!(again, rows[3]);

        assert_eq!(RunResult::parse(None), RunResult::default());
        assert_eq!(RunResult::parse(Some("not json")), RunResult::default());
        assert_eq!(RunResult::default().to_text(), "{}");
    }
}
