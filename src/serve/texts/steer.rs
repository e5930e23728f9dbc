//! What kodx says about `/kodx steer` (SPEC §12, "Steering and pictures"): the status
//! comment's line naming who steered, the refusals, and the steers that came too late.

use crate::redact::redact;

/// The status comment's line naming who steered the run, each once.
pub fn steered_line(authors: &[String]) -> Option<String> {
    if authors.is_empty() {
        return None;
    }
    let names: Vec<String> = authors.iter().map(|a| format!("@{}", redact(a))).collect();
    Some(format!("🧭 steered by {}", names.join(", ")))
}

/// `body` (a status comment) with `line` put above its footer (`<sub>kodx run …`), so the
/// line stays in every phase, the final one included.
pub fn with_line_above_footer(body: String, line: &str) -> String {
    match body.rfind("<sub>kodx run ") {
        Some(at) => format!("{}{line}\n\n{}", &body[..at], &body[at..]),
        None => format!("{body}\n{line}\n"),
    }
}

/// The status comment's heading right after a steer, until the run's next edit.
pub fn heading(author: &str) -> String {
    format!(
        "🛠️ working — steered by @{}: the run takes it at its next step",
        redact(author)
    )
}

/// A steer with no run of the issue running or queued.
pub fn no_run(author: &str) -> String {
    format!(
        "@{} there is no kodx run working here to steer. `/kodx steer` gives words to a run \
         while it runs; to start one, use `/kodx code` or `/kodx ask`.",
        redact(author)
    )
}

/// A steer while the issue's run is queued (`awaiting`: it waits for `/kodx go`).
pub fn not_started(author: &str, awaiting: bool) -> String {
    let why = if awaiting {
        "the run here is waiting for `/kodx go` and has not started"
    } else {
        "the run here is queued and has not started yet"
    };
    format!(
        "@{} {why}, so there is nothing to steer yet. Say it again with `/kodx steer` once \
         the run is working.",
        redact(author)
    )
}

/// A steer whose run ended between finding it and storing the steer.
pub fn ended_meanwhile(author: &str) -> String {
    format!(
        "@{} the run here ended before it could take your steer; the model did not see it.",
        redact(author)
    )
}

/// The final status comment's note about steers that came after the run's last step (a
/// paragraph of its own, like the delivery's other notes).
pub fn too_late(authors: &[String]) -> String {
    let mut names: Vec<String> = Vec::new();
    for a in authors {
        let name = format!("@{}", redact(a));
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let (what, was) = match authors.len() {
        1 => ("The steer", "was"),
        _ => ("The steers", "were"),
    };
    format!(
        "🧭 {what} of {} arrived after the run's last step and {was} not given to the model.\n\n",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentences() {
        let two = ["alice".to_string(), "bob".to_string()];
        insta::assert_snapshot!(steered_line(&two).unwrap(), @"🧭 steered by @alice, @bob");
        assert_eq!(steered_line(&[]), None);
        insta::assert_snapshot!(no_run("carol"), @"@carol there is no kodx run working here to steer. `/kodx steer` gives words to a run while it runs; to start one, use `/kodx code` or `/kodx ask`.");
        insta::assert_snapshot!(not_started("carol", true), @"@carol the run here is waiting for `/kodx go` and has not started, so there is nothing to steer yet. Say it again with `/kodx steer` once the run is working.");
        insta::assert_snapshot!(not_started("carol", false), @"@carol the run here is queued and has not started yet, so there is nothing to steer yet. Say it again with `/kodx steer` once the run is working.");
        assert_eq!(too_late(&["bob".into(), "bob".into()]), "🧭 The steers of @bob arrived after the run's last step and were not given to the model.\n\n");
        assert_eq!(too_late(&["bob".into()]), "🧭 The steer of @bob arrived after the run's last step and was not given to the model.\n\n");
        let body = "### head\n\n> cmd\n\n<sub>kodx run <code>r1</code></sub>\n".to_string();
        insta::assert_snapshot!(with_line_above_footer(body, "🧭 steered by @alice"), @r"
        ### head

        > cmd

        🧭 steered by @alice

        <sub>kodx run <code>r1</code></sub>
        ");
    }
}
