//! The metrics of jobs, in Prometheus' text format: a server's tenant's jobs
//! (`GET /metrics`), or the jobs of a `sluice run --metrics`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::Server;
use super::plugins::now_ms;
use super::registry::JobEntry;
use super::views::state_name;
use crate::job::JobMonitor;
use crate::tenant::TenantConfig;

impl Server {
    /// Per tenant, job and operator metrics of `tenant`, in Prometheus' text format.
    pub fn metrics(&self, tenant: &TenantConfig) -> String {
        let mut m = Metrics::default();
        let entries: Vec<Arc<JobEntry>> = self.jobs.by_id.lock().values().cloned().collect();
        let t = tenant.name.as_str();
        let mut states: BTreeMap<&'static str, u64> = BTreeMap::new();
        for entry in entries {
            let record = entry.record();
            if record.tenant != tenant.name {
                continue;
            }
            *states.entry(state_name(record.state)).or_default() += 1;
            let monitor = entry.monitor.lock().clone();
            add_job(
                &mut m,
                &JobSample {
                    tenant: t,
                    job: &record.id,
                    earlier_restarts: entry
                        .restarts_before
                        .load(std::sync::atomic::Ordering::Relaxed),
                    monitor: &monitor,
                },
            );
        }
        for (state, n) in states {
            m.add(
                "sluice_jobs",
                "gauge",
                "Jobs by state.",
                &[("tenant", t), ("state", state)],
                n as f64,
            );
        }
        m.finish()
    }
}

/// A job as a scrape sees it.
pub struct JobSample<'a> {
    /// Its tenant (the `tenant` label).
    pub tenant: &'a str,
    /// What the `job` label names it: a server's job id, a local run's job name.
    pub job: &'a str,
    /// Restarts in runs before the monitor's (a server's job that was started again).
    pub earlier_restarts: u32,
    /// Its live metrics.
    pub monitor: &'a JobMonitor,
}

/// The metrics of `jobs` in Prometheus' text format, with the names and labels of a
/// server's `/metrics`: for `sluice run --metrics`.
pub fn jobs_metrics(jobs: &[JobSample<'_>]) -> String {
    let mut m = Metrics::default();
    for job in jobs {
        add_job(&mut m, job);
    }
    m.finish()
}

/// Adds the samples of one job: restarts, failures, checkpoints, and its tasks'
/// watermarks and operators' counters.
fn add_job(m: &mut Metrics, sample: &JobSample<'_>) {
    let monitor = sample.monitor;
    let job = [("tenant", sample.tenant), ("job", sample.job)];
    m.add(
        "sluice_job_restarts_total",
        "counter",
        "Restarts after failures.",
        &job,
        (sample.earlier_restarts + monitor.attempt()) as f64,
    );
    for (kind, n) in monitor.failures_by_kind() {
        let labels = [job[0], job[1], ("kind", kind.as_str())];
        m.add(
            "sluice_job_failures_total",
            "counter",
            "Failed attempts by kind (traps, deadlines, memory, errors).",
            &labels,
            n as f64,
        );
    }
    let checkpoints = monitor.checkpoints();
    m.add(
        "sluice_checkpoints_completed_total",
        "counter",
        "Completed checkpoints and savepoints.",
        &job,
        checkpoints.completed.len() as f64,
    );
    m.add(
        "sluice_checkpoints_aborted_total",
        "counter",
        "Aborted checkpoints.",
        &job,
        checkpoints.aborted.len() as f64,
    );
    if let Some(c) = checkpoints.completed.last() {
        m.add(
            "sluice_checkpoint_last_duration_seconds",
            "gauge",
            "Trigger to completion of the last checkpoint.",
            &job,
            c.duration.as_secs_f64(),
        );
        m.add(
            "sluice_checkpoint_last_size_bytes",
            "gauge",
            "Bytes written by the last checkpoint.",
            &job,
            c.bytes as f64,
        );
        m.add(
            "sluice_checkpoint_last_full_size_bytes",
            "gauge",
            "Bytes of the whole state the last checkpoint restores (with RocksDB state, the \
             files it shares with earlier checkpoints too).",
            &job,
            c.full_bytes as f64,
        );
        m.add(
            "sluice_checkpoint_last_files",
            "gauge",
            "Files written by the last checkpoint: state files and RocksDB tables copied.",
            &job,
            f64::from(c.files),
        );
    }
    for c in &checkpoints.completed {
        m.observe(
            "sluice_checkpoint_duration_seconds",
            "Trigger to completion of the checkpoints and savepoints completed.",
            &job,
            c.duration.as_secs_f64(),
        );
        m.observe(
            "sluice_checkpoint_sync_seconds",
            "The longest synchronous part of a task in each completed checkpoint (how \
             long its records waited).",
            &job,
            c.max_sync.as_secs_f64(),
        );
    }
    for task in monitor.tasks() {
        // A task whose input ended has no event time (its watermark is the end of
        // input, i64::MAX), and so no lag behind the clock.
        if let Some(watermark) = task.watermark.filter(|w| *w != i64::MAX) {
            let labels = [job[0], job[1], ("task", task.task.as_str())];
            m.add(
                "sluice_task_watermark_milliseconds",
                "gauge",
                "The task's current input watermark (event time).",
                &labels,
                watermark as f64,
            );
            m.add(
                "sluice_task_watermark_lag_seconds",
                "gauge",
                "Wall-clock time minus the task's watermark.",
                &labels,
                (now_ms() as f64 - watermark as f64) / 1e3,
            );
        }
        for op in &task.operators {
            let subtask = op.subtask.to_string();
            let labels = [
                job[0],
                job[1],
                ("operator", op.operator.as_str()),
                ("subtask", subtask.as_str()),
            ];
            m.add(
                "sluice_operator_records_in_total",
                "counter",
                "Records into an operator.",
                &labels,
                op.records_in as f64,
            );
            m.add(
                "sluice_operator_records_out_total",
                "counter",
                "Records out of an operator.",
                &labels,
                op.records_out as f64,
            );
            m.add(
                "sluice_operator_busy_seconds_total",
                "counter",
                "Time spent in an operator's calls.",
                &labels,
                op.busy.as_secs_f64(),
            );
            m.add(
                "sluice_operator_memory_bytes",
                "gauge",
                "Linear memory of an operator instance.",
                &labels,
                op.memory_bytes as f64,
            );
            m.add(
                "sluice_operator_state_memory_bytes",
                "gauge",
                "Memory the host holds for an operator instance's keyed state, as of its \
                 last checkpoint.",
                &labels,
                op.state_memory_bytes as f64,
            );
            m.add(
                "sluice_operator_state_disk_bytes",
                "gauge",
                "Disk an operator instance's keyed state takes (RocksDB's files), as of its \
                 last checkpoint.",
                &labels,
                op.state_disk_bytes as f64,
            );
            m.add(
                "sluice_operator_call_seconds",
                "gauge",
                "How long an operator has been in its current call (0 between calls): one \
                 that keeps growing is stuck in a call that does not return.",
                &labels,
                op.in_call.as_ref().map_or(0.0, |c| c.running.as_secs_f64()),
            );
        }
        for op in task.source.iter().chain(&task.operators) {
            let subtask = op.subtask.to_string();
            for (counter, n) in &op.counters {
                let labels = [
                    job[0],
                    job[1],
                    ("operator", op.operator.as_str()),
                    ("subtask", subtask.as_str()),
                    ("counter", counter.as_str()),
                ];
                m.add(
                    "sluice_operator_counter_total",
                    "counter",
                    "Counters of operators, sources and sinks (Kafka records, bytes and \
                     transactions among them).",
                    &labels,
                    *n as f64,
                );
            }
            for (partition, lag) in &op.lag {
                let labels = [
                    job[0],
                    job[1],
                    ("source", op.operator.as_str()),
                    ("subtask", subtask.as_str()),
                    ("partition", partition.as_str()),
                ];
                m.add(
                    "sluice_source_lag_records",
                    "gauge",
                    "Records behind the end of a partition a source reads (consumer lag).",
                    &labels,
                    *lag as f64,
                );
            }
        }
    }
}

/// Labels of one sample.
type Labels = Vec<(String, String)>;

/// Histograms by labels, each made by [`duration_histogram`].
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// A histogram's buckets, from 1 ms to about 65 s.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// One scrape's metric families, built with `prometheus-client` and encoded in the
/// OpenMetrics text format.
#[derive(Default)]
pub(super) struct Metrics {
    registry: Registry,
    counters: BTreeMap<String, Family<Labels, Counter<f64, AtomicU64>>>,
    gauges: BTreeMap<String, Family<Labels, Gauge<f64, AtomicU64>>>,
    histograms: BTreeMap<String, HistogramFamily>,
}

/// The labels of a sample, their values escaped as the text format wants (the encoder
/// writes them as they are, and operator and counter names come from tenants).
fn labels(labels: &[(&str, &str)]) -> Labels {
    labels
        .iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            (k.to_string(), v)
        })
        .collect()
}

impl Metrics {
    /// Adds a sample of counter `name` (ending in `_total`, as exposed) or of gauge
    /// `name`.
    pub(super) fn add(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        sample: &[(&str, &str)],
        value: f64,
    ) {
        let registry = &mut self.registry;
        if kind == "counter" {
            // (OpenMetrics names a counter's family without the `_total` of its sample.)
            let family = name.strip_suffix("_total").unwrap_or(name);
            self.counters
                .entry(family.to_string())
                .or_insert_with(|| {
                    let f = Family::default();
                    registry.register(family, help, f.clone());
                    f
                })
                .get_or_create(&labels(sample))
                .inc_by(value);
        } else {
            self.gauges
                .entry(name.to_string())
                .or_insert_with(|| {
                    let f = Family::default();
                    registry.register(name, help, f.clone());
                    f
                })
                .get_or_create(&labels(sample))
                .set(value);
        }
    }

    /// Observes `seconds` in histogram `name` (buckets from 1 ms to about 65 s).
    pub(super) fn observe(
        &mut self,
        name: &str,
        help: &str,
        sample: &[(&str, &str)],
        seconds: f64,
    ) {
        let registry = &mut self.registry;
        self.histograms
            .entry(name.to_string())
            .or_insert_with(|| {
                let f = Family::new_with_constructor(duration_histogram as fn() -> Histogram);
                registry.register(name, help, f.clone());
                f
            })
            .get_or_create(&labels(sample))
            .observe(seconds);
    }

    pub(super) fn finish(self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_from_tenants_cannot_break_the_text_format() {
        let mut m = Metrics::default();
        let name = "op\"} 1\nsluice_jobs{tenant=\"victim\"";
        m.add("sluice_x_total", "counter", "x", &[("operator", name)], 2.0);
        let text = m.finish();
        let sample = text
            .lines()
            .find(|l| l.starts_with("sluice_x_total"))
            .unwrap();
        assert_eq!(
            sample,
            "sluice_x_total{operator=\"op\\\"} 1\\nsluice_jobs{tenant=\\\"victim\\\"\"} 2.0"
        );
        assert!(
            !text.lines().any(|l| l.starts_with("sluice_jobs")),
            "{text}"
        );
    }
}
