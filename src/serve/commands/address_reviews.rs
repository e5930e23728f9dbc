//! `/kodx address-reviews [words]` (SPEC §11): every unresolved review thread of the pull
//! request goes to ONE code run; after its delivery kodx replies in each thread the model
//! listed, naming the pushed commit, and resolves the fixed ones when the repository says
//! `reviews.resolve: fixed`.

use crate::job::Job;
use crate::serve::pipeline::threads;
use crate::serve::pipeline::work::{execute_and_deliver, Delivery};
use crate::serve::pipeline::{Ending, RunCtx, RunFailure};
use crate::serve::texts;

/// Runs `/kodx address-reviews`: the threads read, one run, then the replies.
pub(in crate::serve) async fn run(cx: &RunCtx<'_>) -> Result<Ending, RunFailure> {
    let pull = cx.run.request.issue_number as u64;
    let found = cx
        .gh
        .unresolved_review_threads(&cx.repo, pull)
        .await
        .map_err(|e| RunFailure::User(texts::threads_unreadable(&e.to_string())))?;
    if found.threads.is_empty() {
        return Err(RunFailure::User(texts::NO_UNRESOLVED_THREADS.to_string()));
    }
    let bot = match cx.svc.app.bot_identity(&cx.gh).await {
        Ok(bot) => bot.login,
        Err(e) => {
            tracing::warn!("kodx's own login is unknown; its earlier replies are not marked: {e}");
            String::new()
        }
    };
    let plan = cx.plan_with(Some(threads::follow_up(&found, &bot))).await?;
    let messages = vec![plan.first_message()];
    // The list is for kodx (the status comment's text keeps it for the replies); the
    // commit, the pull request and the stored result get the summary without it.
    let delivery = Delivery {
        summary: threads::without_list,
        ..Delivery::of(request(&cx.run.request.job))
    };
    let ending = execute_and_deliver(cx, &plan, messages, delivery).await?;
    let Ending::Work { status, mut done } = ending else {
        return Ok(ending);
    };
    let known: Vec<&str> = found.threads.iter().map(|t| t.id.as_str()).collect();
    let message = std::mem::take(&mut done.text);
    done.text = threads::without_list(&message);
    // Replies go out whether or not anything was pushed, naming the commit when one was.
    let commit = done.commit.clone();
    match threads::read_answers(&message, &known) {
        Ok(answers) if answers.answers.is_empty() && answers.ignored.is_empty() => {
            done.notes.push(texts::NO_THREADS_LISTED.to_string());
        }
        Ok(answers) => {
            // Replies only while this process holds the run (else it ends here, silently;
            // each reply asks the lease again, through the client).
            if !cx.lease.holds().await {
                return Ok(Ending::Work { status, done });
            }
            // A run can outlive its first token: the replies take a fresh one.
            let gh = match cx.installation().await {
                Ok(gh) => gh,
                Err(_) => cx.gh.clone(),
            };
            let posted = threads::post(
                &gh,
                &found,
                &answers.answers,
                commit.as_deref(),
                cx.admission.config.resolve_threads,
                &cx.run.id,
            )
            .await;
            done.notes.push(threads::note(&posted, &answers.ignored));
        }
        Err(why) => done.notes.push(texts::threads_list_unreadable(&why)),
    }
    Ok(Ending::Work { status, done })
}

/// What the commit and the pull request say was asked: what the run does, with the
/// maintainer's words.
fn request(job: &Job) -> String {
    match job {
        Job::AddressReviews { words } if words.trim().is_empty() => {
            "Address the review threads".to_string()
        }
        Job::AddressReviews { words } => format!("Address the review threads: {words}"),
        other => other.argument().into_owned(),
    }
}
