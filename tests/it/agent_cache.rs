//! The cost cap with a prompt cache (issue 41, item 4): the real agent loop against
//! [`common::billing::CapModel`], which bills from the Anthropic request body kodx sends —
//! with a cache that keeps prefixes (`Cached`), and with one that keeps nothing, so every
//! token up to the last breakpoint is written again at the cache-write price (`Evicted`,
//! the dearest a provider can bill). The figures: `bash bench/cap.sh`.

use crate::common::billing::{run, Billing, Setting};

fn settings(caps: &[f64]) -> Vec<Setting> {
    let mut all = Vec::new();
    for &cap in caps {
        for billing in [Billing::Plain, Billing::Cached, Billing::Evicted] {
            for counts in [false, true] {
                for max_out in [false, true] {
                    all.push(Setting {
                        cap,
                        billing,
                        counts,
                        max_out,
                    });
                }
            }
        }
    }
    all
}

#[tokio::test]
async fn the_cap_holds_whether_the_cache_keeps_the_prefix_or_writes_it_again() {
    let caps = [0.005, 0.02, 0.05, 0.0837, 0.1, 0.2, 0.5, 1.0, 2.0];
    for setting in settings(&caps) {
        let (o, calls) = run(setting, 10_000).await;
        let billed: f64 = calls.iter().map(|c| c.cost).sum();
        assert!((billed - o.usd_cost).abs() < 1e-12, "{setting:?}");
        assert!(
            o.usd_cost <= setting.cap,
            "{setting:?}: spent ${} of ${}",
            o.usd_cost,
            setting.cap
        );
        // A cap that pays for a call with tools and the summary beside it ends with the
        // summary, however the cache billed.
        if setting.cap >= 0.1 {
            let last = calls.last().expect("calls were made");
            assert!(last.answer_only, "{setting:?}: no summary call last");
            assert!(o.last_message.starts_with("Summary:"), "{setting:?}: {o:?}");
            assert!(calls.iter().filter(|c| c.answer_only).count() == 1);
        }
    }
}

#[tokio::test]
async fn the_summary_call_writes_nothing_to_the_cache_past_the_tools_and_system_prompt() {
    let setting = Setting {
        cap: 0.5,
        billing: Billing::Evicted,
        counts: true,
        max_out: false,
    };
    let (_, calls) = run(setting, 10_000).await;
    let first = &calls[0];
    let summary = calls.last().unwrap();
    assert!(summary.answer_only);
    // The first call wrote the frame (tools, system prompt) and the user's request; the
    // summary writes at most the frame again, and its messages are billed as input.
    assert!(first.usage.cache_write_tokens > 1_000, "{first:?}");
    assert!(
        summary.usage.cache_write_tokens < first.usage.cache_write_tokens,
        "{summary:?}"
    );
    assert!(summary.usage.input_tokens > 0, "{summary:?}");
    // A call with tools, evicted, writes everything it sends.
    let tools = &calls[1];
    assert_eq!(tools.usage.input_tokens, 0, "{tools:?}");
    assert_eq!(tools.usage.cache_read_tokens, 0, "{tools:?}");
}

/// Lower bounds only, well under the figures `bench/cap.sh` prints (deterministic: no
/// timing), so that a change that wastes the cap shows.
#[tokio::test]
async fn most_of_a_cap_is_used() {
    let at_least = [
        // (cap, billing, counts, share)
        (0.5, Billing::Cached, true, 0.90),
        (0.5, Billing::Plain, true, 0.90),
        (0.5, Billing::Evicted, true, 0.90),
        (0.5, Billing::Plain, false, 0.88),
        (0.5, Billing::Cached, false, 0.85),
        (2.0, Billing::Cached, true, 0.95),
        (2.0, Billing::Cached, false, 0.93),
        (2.0, Billing::Plain, false, 0.95),
        // One call with tools and the summary (docs/cost.md: why not two).
        (0.05, Billing::Cached, true, 0.35),
        (0.05, Billing::Plain, true, 0.40),
    ];
    for (cap, billing, counts, share) in at_least {
        let setting = Setting {
            cap,
            billing,
            counts,
            max_out: false,
        };
        let (o, _) = run(setting, 10_000).await;
        assert!(
            o.usd_cost >= share * cap,
            "{setting:?}: spent ${:.4}, {:.1} % of the cap, below {} %",
            o.usd_cost,
            100.0 * o.usd_cost / cap,
            100.0 * share
        );
    }
}
