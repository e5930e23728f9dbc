//! The integration tests, one test binary: `common` (the fakes, the git server, the served
//! `kodx serve`) is compiled once for all of them. A module per former test file, so a test's
//! name is `<module>::<function>`, e.g. `cargo nextest run -E 'test(/^serve_code::/)'` or
//! `cargo test --test it serve_code::`.
//!
//! Kept apart as their own binaries: the benchmarks and stress figures (`tests/bench/`, one
//! binary of ignored tests, run by `bench/*.sh`) and `tests/tar_memory.rs`, whose counting global allocator
//! must count its one test and nothing else.

mod common;

mod agent;
mod agent_budget;
mod agent_cache;
mod browser;
mod cli_network;
mod cli_run;
mod cli_secret;
mod db_queue;
mod doctor;
mod egress_inject;
mod egress_proxy;
mod engine_pool;
mod engine_unreachable;
mod git_clone;
mod git_commit;
mod git_push_direct;
mod github_app;
mod github_ci;
mod hostfs;
mod image_pull;
mod process_interrupt;
mod provider_anthropic;
mod provider_openai;
mod repo_cache;
mod repo_cache_commit;
mod sandbox_checks;
mod sandbox_disk;
mod sandbox_egress;
mod sandbox_export;
mod sandbox_fencer;
mod sandbox_floods;
mod sandbox_image;
mod sandbox_lifecycle;
mod sandbox_network;
mod sandbox_ready;
mod sandbox_setup;
mod sandbox_setup_cache;
mod sandbox_shells;
mod sandbox_snapshot;
mod sandbox_verify;
mod serve_annotations;
mod serve_ask;
mod serve_cache;
mod serve_cache_rebase;
mod serve_checks;
mod serve_code;
mod serve_confirm;
mod serve_context;
mod serve_continue;
mod serve_egress;
mod serve_estimate;
mod serve_follow_up;
mod serve_images;
mod serve_lifecycle;
mod serve_merge;
mod serve_network;
mod serve_neutral;
mod serve_operator;
mod serve_postgres;
mod serve_postgres_fencing;
mod serve_preload;
mod serve_proxy;
mod serve_rerun;
mod serve_runpage;
mod serve_runpage_limits;
mod serve_runs;
mod serve_secrets;
mod serve_setup;
mod serve_steer;
mod serve_update;
mod serve_usage;
mod serve_verify;
mod serve_warm;
mod serve_webhook;
mod serve_webhook_limits;
