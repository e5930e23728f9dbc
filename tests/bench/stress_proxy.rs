//! Stress figure of the webhook proxy channel (issue 26, item 3), for `bash bench/stress.sh
//! proxy`: the real `kodx serve` subscribed to a local channel that streams one `data:`
//! line without end at full speed for 30 s. Printed against the targets: kodx's peak RSS
//! (VmHWM) under 100 MB, `/healthz` within 2 s throughout; then the next delivery on the
//! same connection is taken. The case is `tests/it/serve_proxy.rs`'s, run longer.
//!
//!     cargo test --release --test bench -- --ignored --nocapture stress_proxy::

#[path = "../it/serve_proxy.rs"]
mod serve_proxy;
