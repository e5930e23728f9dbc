//! Writes made for work this process may lose (a run on a shared queue, which another
//! process takes over once this one's lease on it ran out). An [`Installation`] made
//! [`guarded`](super::Installation::guarded) asks its [`WriteGuard`] right before every
//! attempt of every request that is not a plain read — after the reads it depends on, and
//! after any wait of the retry policy — and sends nothing when the guard says no
//! ([`GitHubError::Withheld`](super::GitHubError::Withheld)). A GraphQL query is a `POST`
//! and is asked about like a mutation: a guarded client never guesses which `POST` writes.
//!
//! Each attempt is bounded by the policy's `request_timeout`, so a guard that allows a
//! write only while its hold outlasts that timeout (and a little more) knows that whatever
//! the attempt does, it does while the hold lasts.

use axum::http::Method;

/// Asked before each attempt of a write ([`Installation::guarded`](super::Installation::guarded)).
#[async_trait::async_trait]
pub trait WriteGuard: Send + Sync {
    /// Whether a write may be sent now: the work is still this process's, for longer than
    /// one attempt can take.
    async fn allows(&self) -> bool;
}

/// Whether a request of `method` changes anything (what a guard is asked about): any
/// method but `GET` and `HEAD`.
pub(crate) fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD)
}
