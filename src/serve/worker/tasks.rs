//! The workers' tasks, each tied to the run it works on, so that a task that panics is not
//! dropped unnoticed: [`Tasks::reap`] and [`Tasks::join_next`] hand it back, and the worker
//! fails its run as an internal error.

use crate::serve::pipeline::ending::Panicked;
use std::any::Any;
use std::collections::HashMap;
use std::future::Future;

use tokio::task::{Id, JoinError, JoinSet};

/// Spawned tasks and the run each works on.
#[derive(Default)]
pub(super) struct Tasks {
    set: JoinSet<()>,
    runs: HashMap<Id, String>,
}

impl Tasks {
    pub fn spawn<F>(&mut self, run_id: &str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = self.set.spawn(task);
        self.runs.insert(handle.id(), run_id.to_string());
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The tasks that panicked among those that have ended, without waiting.
    pub fn reap(&mut self) -> Vec<Panicked> {
        let mut panicked = Vec::new();
        while let Some(ended) = self.set.try_join_next_with_id() {
            panicked.extend(self.ended(ended));
        }
        panicked
    }

    /// Waits for the next task to end: `None` when there is none left, `Some(Some(_))`
    /// when it panicked.
    pub async fn join_next(&mut self) -> Option<Option<Panicked>> {
        let ended = self.set.join_next_with_id().await?;
        Some(self.ended(ended))
    }

    fn ended(&mut self, ended: Result<(Id, ()), JoinError>) -> Option<Panicked> {
        match ended {
            Ok((id, ())) => {
                self.runs.remove(&id);
                None
            }
            Err(e) => {
                let run_id = self.runs.remove(&e.id()).unwrap_or_default();
                // Not a panic: the task was aborted, which the workers never do.
                e.is_panic().then(|| Panicked {
                    run_id,
                    message: panic_message(e.into_panic()),
                })
            }
        }
    }
}

/// The text a panic was raised with.
fn panic_message(payload: Box<dyn Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_task_is_handed_back_with_its_run() {
        let mut tasks = Tasks::default();
        tasks.spawn("r-ok", async {});
        tasks.spawn("r-panics", async {
            let n = 3;
            panic!("index {n} out of range");
        });
        tasks.spawn("r-static", async { panic!("boom") });
        let mut panicked = Vec::new();
        let mut ended = 0;
        while let Some(p) = tasks.join_next().await {
            ended += 1;
            panicked.extend(p);
        }
        assert_eq!(ended, 3);
        panicked.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        assert_eq!(
            panicked,
            [
                Panicked {
                    run_id: "r-panics".into(),
                    message: "index 3 out of range".into()
                },
                Panicked {
                    run_id: "r-static".into(),
                    message: "boom".into()
                },
            ]
        );
        assert!(tasks.runs.is_empty());
        assert!(tasks.is_empty());
    }

    #[tokio::test]
    async fn reap_collects_without_waiting() {
        let mut tasks = Tasks::default();
        tasks.spawn("r1", async { panic!("first") });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("r2", async move {
            let _ = rx.await;
        });
        // The first ends at once; the second waits for `tx`.
        let mut panicked = Vec::new();
        for _ in 0..100 {
            panicked.extend(tasks.reap());
            if !panicked.is_empty() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(panicked.len(), 1);
        assert_eq!(panicked[0].run_id, "r1");
        assert_eq!(tasks.len(), 1);
        drop(tx);
        assert_eq!(tasks.join_next().await, Some(None));
        assert_eq!(tasks.join_next().await, None);
    }
}
