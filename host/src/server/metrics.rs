//! The metrics of jobs, in Prometheus' text format: a server's tenant's jobs
//! (`GET /metrics`), or the jobs of a `sluice run --metrics`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Server;
use super::api::Metrics;
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
                    earlier_restarts: record.restarts,
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
        if let Some(watermark) = task.watermark {
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
