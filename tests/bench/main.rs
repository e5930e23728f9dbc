//! The benchmarks and stress figures, one test binary (each test `#[ignore]`d: they run
//! only when asked, by `bench/*.sh`). A module per benchmark, so a figure's name is
//! `<module>::<function>`, e.g. `cargo test --release --test bench -- --ignored
//! --nocapture --test-threads 1 checks::`. `common` is the integration tests' (the fakes,
//! the git server, the served `kodx serve`); `stats` holds what the figures share.

#[path = "../it/common/mod.rs"]
mod common;
mod stats;

mod cap;
mod checks;
mod estimate;
mod follow_up;
mod postgres;
mod pr;
mod push;
mod stress_egress;
mod stress_egress_inject;
mod stress_proxy;
mod stress_repo_cache;
mod stress_sandbox_network;
mod stress_snapshot_flood;
mod stress_tar;
mod stress_term;
mod stress_transcripts;
mod stress_webhook;
mod usage;
mod verifier;
