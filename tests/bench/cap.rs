//! Benchmark (ignored by default; `bash bench/cap.sh` runs it in a release build): how much
//! of its cost cap a run gets to spend (issue 41, item 4), and that it never spends more.
//!
//! The real agent loop, in process, against [`crate::common::billing::CapModel`]: a model
//! that always asks for another command (~3,000 new prompt tokens of tool output per call,
//! 400 output tokens; with `max out`, every call generates its whole `max_tokens`) until
//! the cap stops it, billed from the Anthropic request body kodx sends: `plain` (no cache),
//! `cached` (the prefix kept at a breakpoint read, the rest written), `evicted` (a cache
//! that keeps nothing: every token up to the last breakpoint written, the dearest case).
//! `count`: the model answers `count_tokens` exactly (Anthropic); without it kodx plans
//! with byte bounds (an OpenAI-compatible endpoint). Printed: spend / cap per run, and the
//! largest spend / cap of all runs (must be <= 1).

use crate::common::billing::{run, Billing, Setting, ANSWER_TOKENS, MODEL};

#[tokio::test]
#[ignore = "benchmark: bash bench/cap.sh"]
async fn utilisation() {
    println!(
        "\nloop workload: ~3,000 new prompt tokens a call, {ANSWER_TOKENS} output tokens \
         (max out: max_tokens), {MODEL} prices, the built-in code program"
    );
    println!(
        "{:>6} {:>8} {:>6} {:>8} {:>6} {:>9} {:>7}  summary",
        "cap", "usage", "count", "output", "calls", "spent", "share"
    );
    let detail = std::env::var("KODX_BENCH_DETAIL").is_ok();
    let mut worst: f64 = 0.0;
    let mut no_summary = 0;
    for cap in [0.05, 0.5, 2.0] {
        for max_out in [false, true] {
            for billing in [Billing::Plain, Billing::Cached, Billing::Evicted] {
                for counts in [false, true] {
                    let setting = Setting {
                        cap,
                        billing,
                        counts,
                        max_out,
                    };
                    let (o, calls) = run(setting, 10_000).await;
                    let share = o.usd_cost / cap;
                    worst = worst.max(share);
                    let summary = calls.last().is_some_and(|c| c.answer_only);
                    if !summary {
                        no_summary += 1;
                    }
                    println!(
                        "{:>6} {:>8} {:>6} {:>8} {:>6} {:>9} {:>6.1}%  {}",
                        format!("${cap:.2}"),
                        format!("{billing:?}").to_lowercase(),
                        if counts { "yes" } else { "no" },
                        if max_out { "max" } else { "400" },
                        o.api_calls,
                        format!("${:.4}", o.usd_cost),
                        share * 100.0,
                        if summary { "yes" } else { "NO" }
                    );
                    if detail {
                        let mut spent = 0.0;
                        for c in &calls {
                            spent += c.cost;
                            println!(
                                "         {} max_tokens {:>5} in {:>6} write {:>6} read {:>6} out {:>5} ${:.4} (spent ${:.4})",
                                if c.answer_only { "summary" } else { "tools  " },
                                c.max_tokens,
                                c.usage.input_tokens,
                                c.usage.cache_write_tokens,
                                c.usage.cache_read_tokens,
                                c.usage.output_tokens,
                                c.cost,
                                spent
                            );
                        }
                        println!("         stop: {}", o.detail.as_deref().unwrap_or(""));
                    }
                }
            }
        }
    }
    println!(
        "largest spend / cap of all runs: {:.4} (must be <= 1: {}); runs without a summary: {no_summary}",
        worst,
        if worst <= 1.0 { "ok" } else { "CROSSED" }
    );
    assert!(worst <= 1.0);
}
