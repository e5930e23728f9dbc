//! kodx: an LLM agent working in real shells inside a hardened Docker container.
//!
//! The library's face is what the `kodx` binary and the integration tests use: the sandbox
//! engine ([`sandbox`], the `kodx-sandbox` crate), the agent and its model clients ([`agent`], [`model`],
//! [`providers`], [`cost`], [`program`], [`transcript`]), git and GitHub ([`git`],
//! [`github`], [`repo_cache`]), the queue ([`db`], [`job`]) and the App ([`serve`]), with
//! the types their signatures name ([`command`], [`repo_config`], [`webhook`], [`comment`],
//! [`redact`]). Markdown reading, the neutralizer of outside text and the backoff formula
//! are private to it, and so are `serve`'s commands, pipeline and texts.

pub mod agent;
mod backoff;
pub mod checks;
pub mod ci_log;
pub mod command;
pub mod cost;
pub mod db;
pub mod egress;
pub mod git;
pub mod github;
pub mod image;
pub mod job;
mod markdown;
pub mod model;
mod neutral;
pub mod program;
pub mod providers;
pub mod repo_cache;
pub mod repo_config;
pub mod secrets;
pub mod serve;
pub mod transcript;
pub mod webhook;

/// The sandbox engine, its own crate (`crates/kodx-sandbox`): it names nothing of the App.
pub use kodx_sandbox as sandbox;
/// Redaction of token shapes, kept with the sandbox (which redacts a repository's git
/// configuration) and shown by everything else.
pub use kodx_sandbox::redact;
