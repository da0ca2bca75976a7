//! `GET /metrics`: the server's counters in the Prometheus text exposition format, rendered by
//! `prometheus-client` (the Prometheus project's Rust client), never by hand.
//!
//! Every label set is bounded by the server, never by what a client sends: methods are the names
//! of parsed calls ([`proto::methods::call::Call::method`]: a request whose method is unknown is
//! refused before it is timed), exit reasons and error kinds are enums, budget
//! names are the server's own list. Counters only ever grow; gauges (active processes, budget
//! use, sessions, relay streams) are read from the live state when the page is rendered.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use proto::error::ErrorKind;
use proto::methods::process::ExitReason;
use proto::methods::status::BudgetUse;

/// Request durations: from 100 µs, doubling, to about 52 s.
const DURATION_BUCKETS: (f64, f64, u16) = (0.0001, 2.0, 20);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabel {
    budget: String,
    unit: String,
}

type DurationFamily = Family<MethodLabel, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    let (start, factor, count) = DURATION_BUCKETS;
    Histogram::new(exponential_buckets(start, factor, count))
}

/// What the page shows of the live state, read when it is rendered.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Every server-wide budget.
    pub budgets: Vec<BudgetUse>,
    /// Sessions held (attached or detached).
    pub sessions: u64,
    /// Relay streams (remote mode) holding a slot.
    pub relay_streams: u64,
    /// Pooled fs-helpers alive.
    pub helpers: u64,
    /// Sandbox launchers alive.
    pub launchers: u64,
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    started: Counter,
    exited: Family<ReasonLabel, Counter>,
    active: Gauge,
    errors: Family<KindLabel, Counter>,
    refusals: Family<KindLabel, Counter>,
    durations: DurationFamily,
    budget_limit: Family<BudgetLabel, Gauge>,
    budget_in_use: Family<BudgetLabel, Gauge>,
    sessions: Gauge,
    relay_streams: Gauge,
    helpers: Gauge,
    launchers: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty metrics, registered under the `execward_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("execward");
        let metrics = Self {
            started: Counter::default(),
            exited: Family::default(),
            active: Gauge::default(),
            errors: Family::default(),
            refusals: Family::default(),
            durations: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            budget_limit: Family::default(),
            budget_in_use: Family::default(),
            sessions: Gauge::default(),
            relay_streams: Gauge::default(),
            helpers: Gauge::default(),
            launchers: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "processes_started",
            "Processes started (process/start that spawned a child)",
            metrics.started.clone(),
        );
        registry.register(
            "processes_exited",
            "Processes whose leader exited, by exit reason",
            metrics.exited.clone(),
        );
        registry.register(
            "processes_active",
            "Processes running now (live-process slots held)",
            metrics.active.clone(),
        );
        registry.register(
            "request_errors",
            "Requests answered with an error, by data.kind (sandboxDenied, permissionDenied and \
             limitExceeded are the denials)",
            metrics.errors.clone(),
        );
        registry.register(
            "listener_refusals",
            "Connections or HTTP requests the listener refused before any method ran, by reason",
            metrics.refusals.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from a request's dispatch to its answer being queued, by method",
            metrics.durations.clone(),
        );
        registry.register(
            "budget_limit",
            "Limit of each server-wide budget",
            metrics.budget_limit.clone(),
        );
        registry.register(
            "budget_in_use",
            "Use of each server-wide budget",
            metrics.budget_in_use.clone(),
        );
        registry.register(
            "sessions",
            "Sessions held (attached or detached)",
            metrics.sessions.clone(),
        );
        registry.register(
            "relay_streams",
            "Relay streams (remote mode) holding a connection slot",
            metrics.relay_streams.clone(),
        );
        registry.register(
            "helpers",
            "Pooled fs-helpers alive",
            metrics.helpers.clone(),
        );
        registry.register(
            "launchers",
            "Pre-confined sandbox launchers alive",
            metrics.launchers.clone(),
        );
        Self {
            registry,
            ..metrics
        }
    }

    /// A process started.
    pub fn process_started(&self) {
        self.started.inc();
    }

    /// A process's leader exited for `reason`.
    pub fn process_exited(&self, reason: ExitReason) {
        self.exited
            .get_or_create(&ReasonLabel {
                reason: reason_label(reason),
            })
            .inc();
    }

    /// A request was answered with an error of `kind`.
    pub fn request_failed(&self, kind: ErrorKind) {
        self.errors
            .get_or_create(&KindLabel {
                kind: kind_label(kind),
            })
            .inc();
    }

    /// The listener refused a peer (`reason` is one of the server's own constants).
    pub fn listener_refused(&self, reason: &'static str) {
        self.refusals
            .get_or_create(&KindLabel {
                kind: reason.to_owned(),
            })
            .inc();
    }

    /// A request of `method` (a [`proto::methods::call::Call::method`]) took `elapsed`.
    pub fn request_done(&self, method: &'static str, elapsed: Duration) {
        self.durations
            .get_or_create(&MethodLabel { method })
            .observe(elapsed.as_secs_f64());
    }

    /// The page: the counters, and the gauges set from `snapshot`.
    ///
    /// # Errors
    /// A formatting error (writing to a `String` does not fail).
    pub fn render(&self, snapshot: &Snapshot) -> Result<String, std::fmt::Error> {
        let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        for budget in &snapshot.budgets {
            let label = BudgetLabel {
                budget: budget.name.clone(),
                unit: budget.unit.clone(),
            };
            self.budget_limit
                .get_or_create(&label)
                .set(gauge(budget.limit));
            self.budget_in_use
                .get_or_create(&label)
                .set(gauge(budget.in_use));
            if budget.name == "liveProcesses" {
                self.active.set(gauge(budget.in_use));
            }
        }
        self.sessions.set(gauge(snapshot.sessions));
        self.relay_streams.set(gauge(snapshot.relay_streams));
        self.helpers.set(gauge(snapshot.helpers));
        self.launchers.set(gauge(snapshot.launchers));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// The wire name of an exit reason (`oom`, `cpuLimit`, ...).
pub fn reason_label(reason: ExitReason) -> &'static str {
    match reason {
        ExitReason::Oom => "oom",
        ExitReason::CpuLimit => "cpuLimit",
        ExitReason::WallTimeout => "wallTimeout",
        ExitReason::Terminated => "terminated",
        ExitReason::Signal => "signal",
        ExitReason::Exit => "exit",
    }
}

fn kind_label(kind: ErrorKind) -> String {
    match serde_json::to_value(kind) {
        Ok(serde_json::Value::String(name)) => name,
        _ => "unknown".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_their_labels() {
        let metrics = Metrics::new();
        metrics.process_started();
        metrics.process_exited(ExitReason::Oom);
        metrics.request_failed(ErrorKind::SandboxDenied);
        metrics.request_done(proto::methods::FS_WALK, Duration::from_millis(3));
        let text = metrics
            .render(&Snapshot {
                budgets: vec![BudgetUse::new("liveProcesses", "processes", 4096, 2)],
                ..Snapshot::default()
            })
            .unwrap();
        for line in [
            "execward_processes_started_total 1",
            "execward_processes_exited_total{reason=\"oom\"} 1",
            "execward_request_errors_total{kind=\"sandboxDenied\"} 1",
            "execward_request_duration_seconds_count{method=\"fs/walk\"} 1",
            "execward_processes_active 2",
            "execward_budget_limit{budget=\"liveProcesses\",unit=\"processes\"} 4096",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
