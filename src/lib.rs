//! kodx: an LLM agent working in real shells inside a hardened Docker container.

pub mod agent;
pub mod cost;
pub mod model;
pub mod program;
pub mod providers;
pub mod sandbox;
