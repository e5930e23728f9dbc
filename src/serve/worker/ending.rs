//! How a run ended, typed: the reason stored in its row and counted in the metrics.

use crate::agent::StopReason;

/// Why a run (or a control job) ended. [`EndReason::as_str`] is the word stored in the
/// `stop_reason` column and used as the `outcome` label of `kodx_runs_total`; it is the
/// same word every earlier version wrote, so stored rows read back the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// The agent ran (or was meant to): its own stop reason.
    Agent(StopReason),
    /// Who asked may not run the command.
    NotPermitted,
    /// The command could not be read (empty or too long).
    Refused,
    /// `/kodx help` was answered.
    Help,
    /// `/kodx cancel` was done.
    Cancel,
    /// `.github/kodx.yml` is invalid.
    InvalidConfig,
    /// The installation's monthly budget is spent.
    BudgetSpent,
    /// kodx failed (GitHub unreachable, a panicked task, restarted too often).
    Internal,
}

const AGENT_REASONS: [StopReason; 8] = [
    StopReason::EndTurn,
    StopReason::CostLimitExceeded,
    StopReason::MaxIterations,
    StopReason::Timeout,
    StopReason::ToolError,
    StopReason::SetupFailed,
    StopReason::Cancelled,
    StopReason::Error,
];

impl EndReason {
    /// Every reason that is not the agent's.
    const OTHERS: [EndReason; 7] = [
        EndReason::NotPermitted,
        EndReason::Refused,
        EndReason::Help,
        EndReason::Cancel,
        EndReason::InvalidConfig,
        EndReason::BudgetSpent,
        EndReason::Internal,
    ];

    /// The stored word (see the type's documentation).
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Agent(reason) => reason.as_str(),
            EndReason::NotPermitted => "not_permitted",
            EndReason::Refused => "refused",
            EndReason::Help => "help",
            EndReason::Cancel => "cancel",
            EndReason::InvalidConfig => "invalid_config",
            EndReason::BudgetSpent => "budget_exceeded",
            EndReason::Internal => "internal_error",
        }
    }

    /// The reason a stored word names; `None` for a word no version wrote.
    pub fn parse(word: &str) -> Option<EndReason> {
        AGENT_REASONS
            .into_iter()
            .map(EndReason::Agent)
            .chain(EndReason::OTHERS)
            .find(|r| r.as_str() == word)
    }
}

impl From<StopReason> for EndReason {
    fn from(reason: StopReason) -> Self {
        EndReason::Agent(reason)
    }
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_words_are_todays_and_read_back() {
        let all: Vec<EndReason> = AGENT_REASONS
            .into_iter()
            .map(EndReason::Agent)
            .chain(EndReason::OTHERS)
            .collect();
        let words: Vec<&str> = all.iter().map(|r| r.as_str()).collect();
        // The words rows and metrics have always held: they must not move.
        assert_eq!(
            words,
            [
                "end_turn",
                "cost_limit_exceeded",
                "max_iterations",
                "timeout",
                "tool_error",
                "setup_failed",
                "cancelled",
                "error",
                "not_permitted",
                "refused",
                "help",
                "cancel",
                "invalid_config",
                "budget_exceeded",
                "internal_error",
            ]
        );
        for r in all {
            assert_eq!(EndReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(EndReason::parse("exploded"), None);
        assert_eq!(EndReason::parse(""), None);
    }
}
