//! kodx: an LLM agent working in real shells inside a hardened Docker container.

pub mod agent;
pub mod backoff;
pub mod command;
pub mod comment;
pub mod cost;
pub mod db;
pub mod git;
pub mod github;
pub mod job;
pub mod markdown;
pub mod model;
pub mod program;
pub mod providers;
pub mod redact;
pub mod repo_cache;
pub mod repo_config;
pub mod sandbox;
pub mod serve;
pub mod transcript;
pub mod webhook;
