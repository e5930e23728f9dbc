//! Wake-ups between processes sharing a PostgreSQL queue: `NOTIFY kodx` when a run is
//! queued, a running run is asked to stop or steered, `LISTEN kodx` in every process, so idle
//! workers start at once instead of at their next poll. Polling stays as the fallback
//! (a notification sent while a listener reconnects is lost).

use super::{Db, DbError, Pool};

/// What a notification says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeup {
    /// A run was queued.
    Queued,
    /// A running run was asked to stop (`/kodx cancel`, maybe received by another process).
    Cancel,
    /// A running run was steered (`/kodx steer`, maybe received by another process).
    Steer,
}

/// A listening connection ([`Db::listen`]).
pub struct Notifications(sqlx::postgres::PgListener);

impl Db {
    /// Listens for [`Wakeup`]s; `None` on SQLite (one process: nobody else to hear from).
    pub async fn listen(&self) -> Result<Option<Notifications>, DbError> {
        let Pool::Postgres(pool) = &self.pool else {
            return Ok(None);
        };
        let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
        listener.listen("kodx").await?;
        Ok(Some(Notifications(listener)))
    }
}

impl Notifications {
    /// The next wake-up. After a lost connection it reconnects (and listens again) before
    /// it waits; an error means it could not.
    pub async fn next(&mut self) -> Result<Wakeup, DbError> {
        loop {
            let n = self.0.recv().await?;
            match n.payload() {
                "queued" => return Ok(Wakeup::Queued),
                "cancel" => return Ok(Wakeup::Cancel),
                "steer" => return Ok(Wakeup::Steer),
                _ => continue,
            }
        }
    }
}
