//! One delivery waiting for the group-commit writer of `Db::accept` (the writer is in
//! `intake.rs`; the `Db` handle holds the sending end of its queue).

use super::error::DbError;
use super::models::{Accepted, NewDelivery, NewRun};

/// One delivery waiting for the writer, and where its answer goes.
pub(super) struct AcceptJob {
    pub delivery: NewDelivery,
    pub run: Option<NewRun>,
    pub reply: tokio::sync::oneshot::Sender<Result<Accepted, DbError>>,
}
