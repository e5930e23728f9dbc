//! `kodx run`'s steering (SPEC §12, "Steering and pictures"): while the run works, a line
//! typed on standard input, when it is a terminal, is given to the model at its next step
//! as the local user's words. Standard input that is not a terminal is never read.

use std::io::{BufRead, IsTerminal};

use kodx::agent::{Steer, Steering};
use tokio::sync::mpsc;

/// The longest line taken, in characters; the rest is cut with a note.
const MAX_LINE_CHARS: usize = 4_000;

/// Lines typed on the terminal, read by a thread of their own.
pub struct TerminalSteering {
    lines: parking_lot::Mutex<mpsc::UnboundedReceiver<String>>,
    author: String,
}

impl TerminalSteering {
    /// Reads the terminal, when standard input is one; `None` otherwise.
    pub fn start() -> Option<TerminalSteering> {
        if !std::io::stdin().is_terminal() {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        // A blocking read: the thread ends with the process (or when input closes).
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { return };
                if !line.trim().is_empty() && tx.send(line).is_err() {
                    return;
                }
            }
        });
        let author = std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "you".to_string());
        Some(TerminalSteering {
            lines: parking_lot::Mutex::new(rx),
            author,
        })
    }
}

#[async_trait::async_trait]
impl Steering for TerminalSteering {
    async fn take(&self) -> Vec<Steer> {
        let mut out = Vec::new();
        let mut lines = self.lines.lock();
        while let Ok(line) = lines.try_recv() {
            out.push(Steer {
                author: self.author.clone(),
                standing: "the local user".to_string(),
                words: bounded(line.trim()),
            });
        }
        out
    }
}

/// `text` cut to [`MAX_LINE_CHARS`], saying so.
fn bounded(text: &str) -> String {
    let total = text.chars().count();
    if total <= MAX_LINE_CHARS {
        return text.to_string();
    }
    let kept: String = text.chars().take(MAX_LINE_CHARS).collect();
    format!(
        "{kept}\n[… {} more characters not given]",
        total - MAX_LINE_CHARS
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn typed_lines_are_taken_once_each() {
        let (tx, rx) = mpsc::unbounded_channel();
        let steering = TerminalSteering {
            lines: parking_lot::Mutex::new(rx),
            author: "dev".into(),
        };
        assert!(steering.take().await.is_empty());
        tx.send("  use the v2 API ".into()).unwrap();
        tx.send("x".repeat(MAX_LINE_CHARS + 3)).unwrap();
        let taken = steering.take().await;
        assert_eq!(taken.len(), 2);
        assert_eq!(taken[0].words, "use the v2 API");
        assert_eq!(
            (taken[0].author.as_str(), taken[0].standing.as_str()),
            ("dev", "the local user")
        );
        assert!(taken[1]
            .words
            .ends_with("\n[… 3 more characters not given]"));
        assert!(steering.take().await.is_empty());
    }
}
