//! What the benchmarks' figures share: medians and percentiles, a verdict against a
//! target, sizes from the environment, a process's peak memory.

use std::time::Duration;

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// [`median`] of durations.
pub fn median_duration(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The 95th percentile of `v` (nearest rank).
pub fn p95(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 * 0.95).ceil() as usize).saturating_sub(1)]
}

/// "ok" when `ms` is within `target`, else "MISSED".
pub fn verdict(ms: f64, target: f64) -> &'static str {
    if ms <= target {
        "ok"
    } else {
        "MISSED"
    }
}

/// The number in environment variable `name`, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The peak resident memory (VmHWM) of process `pid` in kB, while it exists.
pub fn vm_hwm_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The resident memory (VmRSS) of process `pid` (`None`: this process) in kB; 0 when it
/// cannot be read.
pub fn vm_rss_kb(pid: Option<u32>) -> u64 {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}
