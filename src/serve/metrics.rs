//! `GET /metrics` (SPEC §10): Prometheus text of webhooks, runs by outcome, active runs,
//! spend, model latency and run duration.

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
            "Warm sandboxes (started, fenced, empty) waiting on the Docker engine for a run",
            engine_warm.clone(),
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

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
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
}
