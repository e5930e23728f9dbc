//! GitHub webhook handling (SPEC §3).
//!
//! This module is pure: it has no I/O. The HTTP layer calls into it.

pub mod signature;

pub use signature::{SignatureError, WebhookSecrets};
