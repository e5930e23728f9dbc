//! Git over HTTP(S) with git2: clone, fetch and push as `x-access-token:<installation token>`.
//!
//! The token reaches libgit2 only through the credential callback: it is never part of a
//! URL, never written to `.git/config` or any other file, and never part of an error
//! message. The callback answers once per connection; a second request means the server
//! refused the token, and the operation ends with [`GitError::Auth`] instead of libgit2
//! asking again and again. The one push libgit2 does not make, a run's new branch in one
//! request ([`push_new_branch`]), sends the token in a basic `Authorization` header to the
//! URL's origin only (no redirect followed, no proxy), and never in a URL or a message.
//!
//! All functions block: callers run them in `spawn_blocking`.

mod clone;
mod commit;
mod direct;
mod error;
mod local;
mod merge;
mod mirror;
mod push;
mod resolve;
mod session;

pub use clone::{clone, fetch, Checkout, Cloned};
pub use commit::{
    commit_all, commit_change_set, CommitRequest, Committed, Identity, MAX_SUBJECT_CHARS,
};
pub use direct::{push_new_branch, Direct};
pub use error::{explain_rejection, GitError};
pub use local::{blob_head, commit_tree, LocalEntry};
pub use merge::{merge_base_into, MergeRequest, Merged};
pub use mirror::{
    clone_from_mirror, fetch_mirror, fetch_mirror_for, link_objects, FetchProgress, History,
    Linked, MirrorTip,
};
pub use push::{push, push_checked, push_rebasing, push_rebasing_checked, BeforeSend, PushOutcome};
pub use resolve::{
    commit_merge, has_marker, prepare_conflicted_merge, Conflict, ConflictKind, PrepareMerge,
    PreparedMerge, MAX_CONFLICTED_FILES,
};
pub use session::init;
