//! `GET /metrics` (SPEC §10): Prometheus text of webhooks, runs by outcome, active runs,
//! spend, model latency and run duration, warm starts, and the time from a webhook to its
//! run's first model call.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    event: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    kind: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EngineLabels {
    engine: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WarmLabels {
    engine: String,
    /// `hit`: the run took a warm sandbox; `miss`: it started its own.
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuantileLabels {
    quantile: &'static str,
}

/// First model calls kept for the quantile gauges (the newest ones).
const RECENT_FIRST_CALLS: usize = 512;

/// The server's metrics; cheap to update from any task.
pub struct Metrics {
    registry: Registry,
    webhooks: Family<WebhookLabels, Counter>,
    runs: Family<RunLabels, Counter>,
    active: Gauge,
    queued: Gauge,
    spend: Counter<f64, AtomicU64>,
    model_latency: Family<ModelLabels, Histogram>,
    run_duration: Histogram,
    engine_up: Family<EngineLabels, Gauge>,
    engine_runs: Family<EngineLabels, Gauge>,
    engine_capacity: Family<EngineLabels, Gauge>,
    engine_warm: Family<EngineLabels, Gauge>,
    engine_warm_in_use: Family<EngineLabels, Gauge>,
    engine_warm_preloaded: Family<EngineLabels, Gauge>,
    warm_starts: Family<WarmLabels, Counter>,
    warm_hit_ratio: Family<EngineLabels, Gauge<f64, AtomicU64>>,
    first_call: Histogram,
    first_call_quantiles: Family<QuantileLabels, Gauge<f64, AtomicU64>>,
    /// The newest first-call latencies, in seconds, for the quantile gauges.
    first_calls: parking_lot::Mutex<std::collections::VecDeque<f64>>,
    /// HTTP connections (see `listen`).
    pub connections: crate::serve::intake::listen::ConnectionMetrics,
    /// Bytes of webhook bodies held before their signature is verified.
    pub unverified_bytes: Gauge,
}

/// Events GitHub sends; anything else is counted as `other`, so a sender cannot grow the
/// label set without bound.
const KNOWN_EVENTS: &[&str] = &[
    "issue_comment",
    "issues",
    "pull_request_review_comment",
    "pull_request_review",
    "check_suite",
    "workflow_run",
    "pull_request",
    "push",
    "installation",
    "installation_repositories",
    "ping",
];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kodx");
        let webhooks = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "webhooks",
            "Webhook deliveries received, by event and what kodx answered",
            webhooks.clone(),
        );
        let runs = Family::<RunLabels, Counter>::default();
        registry.register(
            "runs",
            "Finished runs, by command and outcome",
            runs.clone(),
        );
        let active = Gauge::default();
        registry.register("runs_active", "Runs working right now", active.clone());
        let queued = Gauge::default();
        registry.register("runs_queued", "Runs waiting for a worker", queued.clone());
        let spend = Counter::<f64, AtomicU64>::default();
        registry.register("spend_usd", "Model spend in USD", spend.clone());
        let model_latency = Family::<ModelLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.05, 2.0, 12))
        });
        registry.register(
            "model_request_duration_seconds",
            "Latency of model API calls",
            model_latency.clone(),
        );
        let run_duration = Histogram::new(exponential_buckets(1.0, 2.0, 13));
        registry.register(
            "run_duration_seconds",
            "Wall-clock duration of finished runs",
            run_duration.clone(),
        );
        let engine_up = Family::<EngineLabels, Gauge>::default();
        registry.register(
            "engine_up",
            "Whether the Docker engine answers (1) or is out of placement (0)",
            engine_up.clone(),
        );
        let engine_runs = Family::<EngineLabels, Gauge>::default();
        registry.register(
            "engine_runs",
            "Runs this server has placed on the Docker engine",
            engine_runs.clone(),
        );
        let engine_capacity = Family::<EngineLabels, Gauge>::default();
        registry.register(
            "engine_capacity",
            "Sandboxes the Docker engine takes at once (max_runs)",
            engine_capacity.clone(),
        );
        let engine_warm = Family::<EngineLabels, Gauge>::default();
        registry.register(
            "engine_warm_sandboxes",
            "Warm sandboxes (started and fenced; empty, or preloaded with a repository) waiting on the Docker engine for a run",
            engine_warm.clone(),
        );
        let warm_starts = Family::<WarmLabels, Counter>::default();
        registry.register(
            "warm_starts",
            "Runs that started their sandbox on an engine keeping warm sandboxes, by whether they took one (hit) or started their own (miss)",
            warm_starts.clone(),
        );
        let warm_hit_ratio = Family::<EngineLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "warm_hit_ratio",
            "Share of the runs started on the engine since kodx started that took a warm sandbox",
            warm_hit_ratio.clone(),
        );
        let first_call = Histogram::new(exponential_buckets(0.025, 2.0, 14));
        registry.register(
            "first_model_call_seconds",
            "Time from a webhook taken in to its run's first model call (first attempts, not held for /kodx go)",
            first_call.clone(),
        );
        let first_call_quantiles = Family::<QuantileLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "first_model_call_recent_seconds",
            "Quantiles (0.5, 0.95) of the time from a webhook to its run's first model call, over the newest 512 runs",
            first_call_quantiles.clone(),
        );
        let engine_warm_preloaded = Family::<EngineLabels, Gauge>::default();
        registry.register(
            "engine_warm_preloaded",
            "Warm sandboxes waiting on the Docker engine that already hold a repository's checkout (warm_repositories), among engine_warm_sandboxes",
            engine_warm_preloaded.clone(),
        );
        let engine_warm_in_use = Family::<EngineLabels, Gauge>::default();
        registry.register(
            "engine_warm_sandboxes_in_use",
            "Runs going on in a container that was a warm sandbox",
            engine_warm_in_use.clone(),
        );
        let connections = crate::serve::intake::listen::ConnectionMetrics::default();
        registry.register(
            "http_connections",
            "HTTP connections open",
            connections.open.clone(),
        );
        registry.register(
            "http_connections_displaced",
            "HTTP connections closed to make room for a new one (max_connections)",
            connections.displaced.clone(),
        );
        registry.register(
            "http_connections_refused",
            "New HTTP connections closed at once because every open one was busy",
            connections.refused.clone(),
        );
        registry.register(
            "http_accept_errors",
            "Failed accepts (e.g. out of file descriptors)",
            connections.accept_errors.clone(),
        );
        let unverified_bytes = Gauge::default();
        registry.register(
            "webhook_unverified_bytes",
            "Bytes of webhook bodies held before their signature is verified",
            unverified_bytes.clone(),
        );
        Metrics {
            registry,
            connections,
            unverified_bytes,
            webhooks,
            runs,
            active,
            queued,
            spend,
            model_latency,
            run_duration,
            engine_up,
            engine_runs,
            engine_capacity,
            engine_warm,
            engine_warm_in_use,
            engine_warm_preloaded,
            warm_starts,
            warm_hit_ratio,
            first_call,
            first_call_quantiles,
            first_calls: Default::default(),
        }
    }

    /// One engine's gauges (set when `/metrics` is read).
    pub fn engine(&self, e: &crate::serve::pipeline::engines::EngineStatus) {
        let (name, up, runs, capacity) = (&e.name, e.up, e.runs, e.max_runs);
        let labels = EngineLabels {
            engine: name.to_string(),
        };
        self.engine_warm.get_or_create(&labels).set(e.warm as i64);
        self.engine_warm_in_use
            .get_or_create(&labels)
            .set(e.warm_in_use as i64);
        self.engine_warm_preloaded
            .get_or_create(&labels)
            .set(e.warm_preloaded as i64);
        self.engine_up.get_or_create(&labels).set(i64::from(up));
        self.engine_runs.get_or_create(&labels).set(runs as i64);
        self.engine_capacity
            .get_or_create(&labels)
            .set(capacity as i64);
    }

    pub fn webhook(&self, event: &str, result: &'static str) {
        let event = if KNOWN_EVENTS.contains(&event) {
            event
        } else {
            "other"
        };
        self.webhooks
            .get_or_create(&WebhookLabels {
                event: event.to_string(),
                result,
            })
            .inc();
    }

    pub fn run_finished(&self, kind: &str, outcome: &str, cost: f64, duration: Duration) {
        self.runs
            .get_or_create(&RunLabels {
                kind: kind.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
        if cost.is_finite() && cost > 0.0 {
            self.spend.inc_by(cost);
        }
        self.run_duration.observe(duration.as_secs_f64());
    }

    pub fn run_started(&self) {
        self.active.inc();
    }

    pub fn run_ended(&self) {
        self.active.dec();
    }

    pub fn set_queued(&self, n: i64) {
        self.queued.set(n);
    }

    pub fn model_call(&self, model: &str, took: Duration) {
        self.model_latency
            .get_or_create(&ModelLabels {
                model: model.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// A run started its sandbox on `engine`, whose pool keeps warm sandboxes: `hit` when
    /// it took one.
    pub fn warm_start(&self, engine: &str, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.warm_starts
            .get_or_create(&WarmLabels {
                engine: engine.to_string(),
                result,
            })
            .inc();
        let count = |result| {
            self.warm_starts
                .get_or_create(&WarmLabels {
                    engine: engine.to_string(),
                    result,
                })
                .get() as f64
        };
        let (hits, misses) = (count("hit"), count("miss"));
        self.warm_hit_ratio
            .get_or_create(&EngineLabels {
                engine: engine.to_string(),
            })
            .set(hits / (hits + misses));
    }

    /// A run's first model call began `since_webhook` after the webhook that asked for it
    /// was taken in.
    pub fn first_model_call(&self, since_webhook: Duration) {
        let secs = since_webhook.as_secs_f64();
        self.first_call.observe(secs);
        let mut recent = self.first_calls.lock();
        if recent.len() == RECENT_FIRST_CALLS {
            recent.pop_front();
        }
        recent.push_back(secs);
    }

    /// The quantile gauges of the newest first calls (nearest rank), set as `/metrics` is
    /// read.
    fn update_quantiles(&self) {
        let mut recent: Vec<f64> = self.first_calls.lock().iter().copied().collect();
        if recent.is_empty() {
            return;
        }
        recent.sort_by(f64::total_cmp);
        for (label, p) in [("0.5", 50), ("0.95", 95)] {
            let rank = (p * recent.len()).div_ceil(100).max(1);
            self.first_call_quantiles
                .get_or_create(&QuantileLabels { quantile: label })
                .set(recent[rank - 1]);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        self.update_quantiles();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_what_was_counted() {
        let m = Metrics::new();
        m.webhook("issue_comment", "queued");
        m.webhook("issue_comment", "queued");
        m.webhook("weird\"event", "ignored");
        m.run_started();
        m.run_finished("ask", "end_turn", 0.25, Duration::from_secs(3));
        m.model_call("claude-sonnet-4-5", Duration::from_millis(120));
        let text = m.render();
        assert!(
            text.contains("kodx_webhooks_total{event=\"issue_comment\",result=\"queued\"} 2"),
            "{text}"
        );
        assert!(text.contains("kodx_webhooks_total{event=\"other\",result=\"ignored\"} 1"));
        assert!(text.contains("kodx_runs_total{kind=\"ask\",outcome=\"end_turn\"} 1"));
        assert!(text.contains("kodx_runs_active 1"));
        assert!(text.contains("kodx_spend_usd_total 0.25"));
        assert!(text
            .contains("kodx_model_request_duration_seconds_count{model=\"claude-sonnet-4-5\"} 1"));
        assert!(text.contains("kodx_run_duration_seconds_count 1"));
    }

    #[test]
    fn warm_hits_and_the_first_call_quantiles() {
        let m = Metrics::new();
        for hit in [true, true, true, false] {
            m.warm_start("local", hit);
        }
        for ms in 1..=100 {
            m.first_model_call(Duration::from_millis(10 * ms));
        }
        let text = m.render();
        for line in [
            "kodx_warm_starts_total{engine=\"local\",result=\"hit\"} 3",
            "kodx_warm_starts_total{engine=\"local\",result=\"miss\"} 1",
            "kodx_warm_hit_ratio{engine=\"local\"} 0.75",
            "kodx_first_model_call_seconds_count 100",
            "kodx_first_model_call_recent_seconds{quantile=\"0.5\"} 0.5",
            "kodx_first_model_call_recent_seconds{quantile=\"0.95\"} 0.95",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        // Only the newest 512 count for the quantiles.
        for _ in 0..512 {
            m.first_model_call(Duration::from_secs(2));
        }
        assert!(m
            .render()
            .contains("kodx_first_model_call_recent_seconds{quantile=\"0.5\"} 2.0"));
    }
}
