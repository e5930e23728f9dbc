//! `/kodx continue [$N | N steps]`: the code run on this issue or pull request that a limit
//! stopped goes on — its conversation from its stored transcript, its work tree from the
//! branch it pushed to, with more budget or steps — and delivers to the same branch and
//! pull request.
//!
//! [`choose`] picks the run to continue from the issue's finished code runs, [`limits`]
//! works out the extra budget, [`resumption`] reads the transcript; [`run`] checks all that
//! before anything shows, then goes on as a code run
//! ([`execute_and_deliver`](crate::serve::pipeline::work::execute_and_deliver)).

use crate::agent::StopReason;
use crate::command::More;
use crate::db::{Continues, Db, EndReason, Run, RunResult};
use crate::git::Checkout;
use crate::model::Message;
use crate::repo_config::{RunKind, ServerMaxima};
use crate::serve::pipeline::deliver::Target;
use crate::serve::pipeline::gate::{Admission, CannotContinue, Refusal};
use crate::serve::pipeline::plan::RunPlan;
use crate::serve::pipeline::work::{execute_and_deliver, Delivery, Earlier};
use crate::serve::pipeline::{Ending, RunCtx, RunFailure};
use crate::transcript::{ResumeError, Resumer};

/// How many of the issue's latest finished code runs are looked at.
const LOOK_BACK: i64 = 20;

/// Picks the run to continue from the issue's finished `code` and `continue` runs, newest
/// first: the newest one the agent ran in (runs refused before they started are skipped)
/// must have been stopped by its cost, step or time limit and have pushed its work.
pub(in crate::serve) fn choose(runs: &[Run]) -> Result<Earlier, CannotContinue> {
    let Some(last) = runs
        .iter()
        .find(|r| matches!(r.stop_reason, Some(EndReason::Agent(_))))
    else {
        return Err(CannotContinue::Nothing);
    };
    let Some(EndReason::Agent(reason)) = last.stop_reason.clone() else {
        unreachable!("found by its agent stop reason")
    };
    let result = RunResult::parse(last.result.as_deref());
    match reason {
        StopReason::CostLimitExceeded | StopReason::MaxIterations | StopReason::Timeout => {}
        StopReason::EndTurn => {
            return Err(CannotContinue::Finished {
                id: last.id.clone(),
            })
        }
        other => {
            return Err(CannotContinue::NotStopped {
                id: last.id.clone(),
                reason: other.as_str().to_string(),
            })
        }
    }
    let Some(branch) = result.branch.filter(|b| !b.is_empty()) else {
        return Err(CannotContinue::NothingPushed {
            id: last.id.clone(),
        });
    };
    let (request, before) = match result.continues {
        Some(c) => (c.request, c.cost_usd),
        None => (last.request.job.argument().into_owned(), 0.0),
    };
    Ok(Earlier {
        id: last.id.clone(),
        request,
        branch,
        cost: before + last.cost_usd.unwrap_or(0.0),
        status_comment_id: last.status_comment_id,
    })
}

/// The cost limit and step limit of the continuation. By default the repository's limits
/// for a code run (within the server's maxima and what is left of the monthly budget, as
/// the admission computed them); `$N` sets the cost limit and `N steps` the step limit,
/// refused above the server's maximum and never above what is left of the budget.
pub(in crate::serve) fn limits(
    more: More,
    admission: &Admission,
    maxima: &ServerMaxima,
) -> Result<(f64, u32), CannotContinue> {
    let cost = admission.cost_limit(RunKind::Code, maxima);
    let steps = admission.max_iterations(maxima);
    match more {
        More::Default => Ok((cost, steps)),
        More::Usd(usd) if usd > maxima.cost_limit => Err(CannotContinue::AboveMaximum {
            asked: more.as_argument(),
            most: crate::cost::format_usd(maxima.cost_limit),
        }),
        More::Usd(usd) => {
            let left = admission.budget.map_or(f64::INFINITY, |b| b.left());
            Ok((usd.min(left), steps))
        }
        More::Steps(n) if n > maxima.max_iterations => Err(CannotContinue::AboveMaximum {
            asked: more.as_argument(),
            most: format!("{} steps", maxima.max_iterations),
        }),
        More::Steps(n) => Ok((cost, n)),
    }
}

/// The plan [`super::plan::prepare`] made for a continue run, turned into the
/// continuation of `earlier`: the given limits, a clone of the branch it pushed to, and
/// its change delivered to that branch (so to the same pull request).
pub(in crate::serve) fn resume_plan(plan: &mut RunPlan, earlier: &Earlier, cost: f64, steps: u32) {
    plan.plan.agent.cost_limit = cost;
    plan.plan.agent.max_iterations = steps;
    plan.checkout = Checkout::Branch(earlier.branch.clone());
    plan.depth = None;
    match &mut plan.target {
        Some(Target::NewPull { branch, .. })
        | Some(Target::PullBranch { branch })
        | Some(Target::Merge { branch, .. }) => *branch = earlier.branch.clone(),
        None => {}
    }
}

/// What a continuation starts from.
pub(in crate::serve) struct Resumption {
    pub earlier: Earlier,
    /// The stopped run's conversation with the resume note told last.
    pub messages: Vec<Message>,
}

/// Runs `/kodx continue`: the stopped run and the limits are checked before anything
/// shows; then the stopped run's conversation goes on as a code run on its branch.
pub(in crate::serve) async fn run(cx: &RunCtx<'_>, more: More) -> Result<Ending, RunFailure> {
    use anyhow::Context as _;
    let maxima = cx.svc.settings.maxima();
    let (cost, steps) = limits(more, &cx.admission, &maxima).map_err(Refusal::CannotContinue)?;
    let resumption = resumption(&cx.svc.db, cx.run)
        .await
        .context("reading the stopped run from the database failed")?
        .map_err(Refusal::CannotContinue)?;
    let Resumption { earlier, messages } = resumption;
    *cx.log.branch.lock() = Some(earlier.branch.clone());
    *cx.log.continues.lock() = Some(Continues {
        run: earlier.id.clone(),
        request: earlier.request.clone(),
        cost_usd: earlier.cost,
    });
    let mut plan = cx.plan().await?;
    resume_plan(&mut plan, &earlier, cost, steps);
    // Its commit and pull request say the request it continues.
    let delivery = Delivery {
        continues: Some(earlier.clone()),
        ..Delivery::of(earlier.request)
    };
    execute_and_deliver(cx, &plan, messages, delivery).await
}

/// The status comment of the stopped run `run` (a `/kodx continue`) would go on with,
/// when there is one it can go on with (so a refusal never replaces it).
pub(in crate::serve) async fn continued_status_comment(db: &Db, run: &Run) -> Option<u64> {
    let runs = db
        .finished_code_runs(&run.request.repo, run.request.issue_number, LOOK_BACK)
        .await
        .ok()?;
    let earlier = choose(&runs).ok()?;
    if db.transcript_pruned_at(&earlier.id).await.ok()?.is_some() {
        return None;
    }
    earlier.status_comment_id.map(|id| id as u64)
}

/// The run `run` (a `/kodx continue`) goes on with, and its conversation.
pub(in crate::serve) async fn resumption(
    db: &Db,
    run: &Run,
) -> Result<Result<Resumption, CannotContinue>, crate::db::DbError> {
    let runs = db
        .finished_code_runs(&run.request.repo, run.request.issue_number, LOOK_BACK)
        .await?;
    let earlier = match choose(&runs) {
        Ok(e) => e,
        Err(e) => return Ok(Err(e)),
    };
    if db.transcript_pruned_at(&earlier.id).await?.is_some() {
        return Ok(Err(CannotContinue::Pruned { id: earlier.id }));
    }
    let mut resumer = Resumer::default();
    let read = db
        .each_transcript_record(&earlier.id, |record| resumer.push(record))
        .await?;
    let messages = read.and_then(|()| resumer.finish(""));
    Ok(match messages {
        Ok(messages) => Ok(Resumption { earlier, messages }),
        Err(e) => Err(CannotContinue::Transcript {
            id: earlier.id,
            problem: match e {
                ResumeError::NoRequest => "it holds no model request".into(),
                e => e.to_string(),
            },
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::RunStatus;
    use crate::github::Permission;
    use crate::job::{Job, RunRequest, Trigger};
    use crate::repo_config::RepoConfig;
    use crate::serve::pipeline::gate::Budget;

    fn run(id: &str, stop: EndReason, result: serde_json::Value, cost: f64) -> Run {
        Run {
            id: id.into(),
            delivery_id: "d".into(),
            request: RunRequest {
                installation_id: 1,
                repo: "acme/widgets".into(),
                issue_number: 7,
                is_pull_request: false,
                author: "alice".into(),
                author_id: 1005,
                clone_url: "https://github.com/acme/widgets.git".into(),
                default_branch: "main".into(),
                job: Job::Code {
                    request: "add a flag".into(),
                    base: None,
                },
                trigger: Trigger::IssueComment(11),
            },
            status: RunStatus::Failed,
            phase: None,
            attempts: 1,
            worker: None,
            recovered: false,
            status_comment_id: None,
            stop_reason: Some(stop),
            cost_usd: Some(cost),
            input_tokens: 0,
            output_tokens: 0,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            api_calls: 1,
            result: Some(result.to_string()),
            pr_url: None,
            cancelled_by: None,
            created_at: 0,
            started_at: None,
            finished_at: None,
            held_until: None,
            confirmed_by: None,
            confirmed_cap_usd: None,
            estimate: None,
            mergeable_state: None,
            egress_blocked: None,
        }
    }

    fn stopped(id: &str) -> Run {
        run(
            id,
            EndReason::Agent(StopReason::MaxIterations),
            serde_json::json!({"branch": "kodx/7-abc"}),
            0.25,
        )
    }

    #[test]
    fn the_newest_run_the_agent_ran_in_is_continued() {
        let refused = run("r", EndReason::NotPermitted, serde_json::json!({}), 0.0);
        let e = choose(&[refused, stopped("s"), stopped("older")]).unwrap();
        assert_eq!(
            e,
            Earlier {
                id: "s".into(),
                request: "add a flag".into(),
                branch: "kodx/7-abc".into(),
                cost: 0.25,
                status_comment_id: None,
            }
        );
    }

    #[test]
    fn a_continued_continuation_keeps_the_first_request_and_adds_the_costs() {
        let mut c = run(
            "c",
            EndReason::Agent(StopReason::CostLimitExceeded),
            serde_json::json!({"branch": "kodx/7-abc",
                "continues": {"run": "s", "request": "add a flag", "cost_usd": 0.25}}),
            0.5,
        );
        c.request.job = Job::Continue {
            more: More::Default,
        };
        let e = choose(&[c]).unwrap();
        assert_eq!(e.request, "add a flag");
        assert!((e.cost - 0.75).abs() < 1e-9, "{}", e.cost);
    }

    #[test]
    fn only_a_stopped_run_that_pushed_can_be_continued() {
        assert_eq!(choose(&[]), Err(CannotContinue::Nothing));
        let refused = run("r", EndReason::BudgetExceeded, serde_json::json!({}), 0.0);
        assert_eq!(choose(&[refused]), Err(CannotContinue::Nothing));
        let done = run(
            "d",
            EndReason::Agent(StopReason::EndTurn),
            serde_json::json!({"branch": "b"}),
            0.1,
        );
        // The newest decides, even with a stopped one before it.
        assert_eq!(
            choose(&[done, stopped("s")]),
            Err(CannotContinue::Finished { id: "d".into() })
        );
        for reason in [
            StopReason::Cancelled,
            StopReason::Error,
            StopReason::SetupFailed,
        ] {
            let r = run("x", EndReason::Agent(reason), serde_json::json!({}), 0.0);
            assert!(
                matches!(choose(&[r]), Err(CannotContinue::NotStopped { .. })),
                "{reason:?}"
            );
        }
        let discarded = run(
            "z",
            EndReason::Agent(StopReason::Timeout),
            serde_json::json!({"branch": null}),
            0.3,
        );
        assert_eq!(
            choose(&[discarded]),
            Err(CannotContinue::NothingPushed { id: "z".into() })
        );
    }

    fn admission(budget: Option<Budget>) -> Admission {
        let config = RepoConfig::parse("cost_limit:\n  code: 3\nmax_iterations: 40\n").unwrap();
        Admission::new(
            crate::serve::pipeline::gate::Base::main(),
            config,
            Some(Permission::Write),
            budget,
        )
    }

    #[test]
    fn extra_budget_defaults_to_the_repositorys_and_stays_within_maxima_and_budget() {
        let maxima = ServerMaxima {
            cost_limit: 5.0,
            max_iterations: 100,
        };
        let free = admission(None);
        assert_eq!(limits(More::Default, &free, &maxima), Ok((3.0, 40)));
        assert_eq!(limits(More::Usd(4.5), &free, &maxima), Ok((4.5, 40)));
        assert_eq!(limits(More::Steps(80), &free, &maxima), Ok((3.0, 80)));
        assert_eq!(
            limits(More::Usd(6.0), &free, &maxima),
            Err(CannotContinue::AboveMaximum {
                asked: "$6".into(),
                most: crate::cost::format_usd(5.0),
            })
        );
        assert!(matches!(
            limits(More::Steps(101), &free, &maxima),
            Err(CannotContinue::AboveMaximum { .. })
        ));
        // What is left of the monthly budget bounds the default and `$N` alike.
        let tight = admission(Some(Budget {
            budget: 10.0,
            spent: 9.0,
        }));
        let (cost, _) = limits(More::Default, &tight, &maxima).unwrap();
        assert!((cost - 1.0).abs() < 1e-9, "{cost}");
        let (cost, _) = limits(More::Usd(4.0), &tight, &maxima).unwrap();
        assert!((cost - 1.0).abs() < 1e-9, "{cost}");
    }
}
