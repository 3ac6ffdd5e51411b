//! What `sluice run` reports when its jobs end: each job (how it ended, its tasks and
//! operators, checkpoints, output) and each tenant's totals. One set of types, printed
//! for people on stderr or, with `--json`, as one JSON document on stdout.

use std::collections::BTreeMap;
use std::time::Duration;

use bytesize::ByteSize;
use serde::Serialize;

use super::exit::Exit;
use super::table;
use crate::job::{CheckpointStats, JobGraph, JobOutcome, JobReport, SinkKind};
use crate::metrics::{OperatorReport, TaskReport};

/// The end of a `sluice run`.
#[derive(Debug, Serialize)]
pub(super) struct RunSummary {
    /// The status the command exits with: that of the first job that failed (in the
    /// order given), else `130` when one was cancelled, else `0`.
    pub(super) exit_code: Exit,
    pub(super) jobs: Vec<JobSummary>,
    pub(super) tenants: Vec<TenantSummary>,
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Outcome {
    Finished,
    Stopped,
    Cancelled,
    /// It did not start, and nothing was changed.
    Refused,
    Failed,
}

/// One job of the run.
#[derive(Debug, Serialize)]
pub(super) struct JobSummary {
    pub(super) job: String,
    pub(super) tenant: String,
    /// The job file.
    pub(super) file: String,
    pub(super) outcome: Outcome,
    /// The savepoint a stop took.
    pub(super) savepoint: Option<String>,
    /// Why it failed or was refused.
    pub(super) error: Option<String>,
    pub(super) exit_code: Exit,
    pub(super) duration_ms: u64,
    pub(super) restarts: u32,
    pub(super) records_read: u64,
    pub(super) records_written: u64,
    /// Records the sinks committed, over every attempt (as of the last checkpoint;
    /// `None` without checkpoints). Unlike `records_written`, which counts what the last
    /// attempt's sinks took in, re-reads after a restart are not in it.
    pub(super) records_committed: Option<u64>,
    /// Failed attempts by kind (`error`, `panic`, `deadline`, `memory`, ...).
    pub(super) failures: BTreeMap<String, u64>,
    /// The tasks of the last attempt.
    pub(super) tasks: Vec<TaskSummary>,
    pub(super) checkpoints: CheckpointCounts,
    /// The file sinks' output.
    pub(super) outputs: Vec<Output>,
}

/// A task of the last attempt.
#[derive(Debug, Serialize)]
pub(super) struct TaskSummary {
    task: String,
    records_in: u64,
    records_out: u64,
    busy_ms: f64,
    idle_ms: f64,
    backpressured_ms: f64,
    mails: u64,
    /// The source it reads, if it reads one.
    source: Option<OperatorSummary>,
    operators: Vec<OperatorSummary>,
}

/// A source, operator or sink instance.
#[derive(Debug, Serialize)]
pub(super) struct OperatorSummary {
    operator: String,
    /// From 1, as printed.
    subtask: u32,
    records_in: u64,
    records_out: u64,
    batches: u64,
    busy_ms: f64,
    memory_bytes: u64,
    counters: BTreeMap<String, u64>,
    /// Records behind the end of each partition it reads (`topic/partition`).
    lag: BTreeMap<String, u64>,
}

/// Checkpoints of the last attempt.
#[derive(Debug, Serialize)]
pub(super) struct CheckpointCounts {
    completed: usize,
    aborted: usize,
    /// Bytes the completed ones wrote, in all (incremental ones: their new files).
    written_bytes: u64,
    /// The whole state of the last completed one.
    last_full_bytes: u64,
    /// Their synchronous parts (the longest task's): median and longest, ms.
    sync_ms_median: f64,
    sync_ms_max: f64,
    /// Their asynchronous parts (the longest task's): median, ms.
    async_ms_median: f64,
}

impl CheckpointCounts {
    fn of(stats: &CheckpointStats) -> CheckpointCounts {
        let done = &stats.completed;
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        CheckpointCounts {
            completed: done.len(),
            aborted: stats.aborted.len(),
            written_bytes: done.iter().map(|c| c.bytes).sum(),
            last_full_bytes: done.last().map_or(0, |c| c.full_bytes),
            sync_ms_median: median(done.iter().map(|c| ms(c.max_sync)).collect()),
            sync_ms_max: done.iter().map(|c| ms(c.max_sync)).fold(0.0, f64::max),
            async_ms_median: median(done.iter().map(|c| ms(c.max_async)).collect()),
        }
    }
}

/// Where a file sink wrote.
#[derive(Debug, Serialize)]
pub(super) struct Output {
    path: String,
    /// One per subtask.
    files: u32,
}

/// What a tenant's jobs did in the run.
#[derive(Debug, Default, Serialize)]
pub(super) struct TenantSummary {
    tenant: String,
    jobs: u32,
    failed: u32,
    restarts: u32,
    records_read: u64,
    records_written: u64,
    busy_ms: f64,
    peak_memory_bytes: u64,
    failures: BTreeMap<String, u64>,
}

/// A job's end as the run saw it.
pub(super) struct Ended<'a> {
    pub(super) file: &'a std::path::Path,
    /// Its graph: its name, tenant and the files it wrote.
    pub(super) graph: &'a JobGraph,
    pub(super) result: &'a anyhow::Result<JobReport>,
    /// From the job's monitor, for a job that failed (its report has them otherwise).
    pub(super) restarts: u32,
    pub(super) failures: BTreeMap<String, u64>,
    pub(super) tasks: Vec<TaskReport>,
    pub(super) checkpoints: CheckpointStats,
    pub(super) duration: Duration,
}

impl JobSummary {
    pub(super) fn of(ended: Ended<'_>) -> JobSummary {
        let (outcome, exit_code, savepoint, error) = match ended.result {
            Ok(report) => match &report.outcome {
                JobOutcome::Finished => (Outcome::Finished, Exit::Success, None, None),
                JobOutcome::Stopped { savepoint } => (
                    Outcome::Stopped,
                    Exit::Success,
                    Some(savepoint.display().to_string()),
                    None,
                ),
                JobOutcome::Cancelled => (Outcome::Cancelled, Exit::Cancelled, None, None),
            },
            Err(e) => {
                let exit = Exit::of(e);
                let outcome = match exit {
                    Exit::Refused => Outcome::Refused,
                    _ => Outcome::Failed,
                };
                (outcome, exit, None, Some(format!("{e:#}")))
            }
        };
        let (tasks, checkpoints, restarts, duration, failures) = match ended.result {
            Ok(r) => (
                &r.tasks,
                &r.checkpoints,
                r.restarts,
                r.duration,
                &r.failures_by_kind,
            ),
            Err(_) => (
                &ended.tasks,
                &ended.checkpoints,
                ended.restarts,
                ended.duration,
                &ended.failures,
            ),
        };
        let outputs = match ended.result {
            Ok(_) => ended
                .graph
                .sinks()
                .filter(|s| s.kind == SinkKind::File)
                .filter_map(|s| {
                    Some(Output {
                        path: s.path.as_ref()?.display().to_string(),
                        files: s.parallelism,
                    })
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        JobSummary {
            job: ended.graph.name.clone(),
            tenant: ended.graph.tenant.clone(),
            file: ended.file.display().to_string(),
            outcome,
            savepoint,
            error,
            exit_code,
            duration_ms: duration.as_millis() as u64,
            restarts,
            records_read: tasks
                .iter()
                .filter(|t| t.is_source)
                .map(|t| t.records_in)
                .sum(),
            records_written: tasks
                .iter()
                .flat_map(|t| &t.operators)
                .filter(|o| o.is_sink)
                .map(|o| o.records_in)
                .sum(),
            records_committed: checkpoints.records_committed(),
            failures: failures.clone(),
            tasks: tasks.iter().map(TaskSummary::of).collect(),
            checkpoints: CheckpointCounts::of(checkpoints),
            outputs,
        }
    }
}

impl TaskSummary {
    fn of(task: &TaskReport) -> TaskSummary {
        TaskSummary {
            task: task.task.clone(),
            records_in: task.records_in,
            records_out: task.records_out,
            busy_ms: ms(task.busy),
            idle_ms: ms(task.idle),
            backpressured_ms: ms(task.backpressured),
            mails: task.mails,
            source: task.source.as_ref().map(OperatorSummary::of),
            operators: task.operators.iter().map(OperatorSummary::of).collect(),
        }
    }
}

impl OperatorSummary {
    fn of(op: &OperatorReport) -> OperatorSummary {
        OperatorSummary {
            operator: op.operator.clone(),
            subtask: op.subtask + 1,
            records_in: op.records_in,
            records_out: op.records_out,
            batches: op.batches,
            busy_ms: ms(op.busy),
            memory_bytes: op.memory_bytes,
            counters: op.counters.clone(),
            lag: op.lag.clone(),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl RunSummary {
    /// The summary of jobs that ended, in the order they were given.
    pub(super) fn of(jobs: Vec<JobSummary>) -> RunSummary {
        let failed = |j: &&JobSummary| !matches!(j.exit_code, Exit::Success | Exit::Cancelled);
        let exit_code = match jobs.iter().find(failed) {
            Some(j) => j.exit_code,
            None if jobs.iter().any(|j| j.exit_code == Exit::Cancelled) => Exit::Cancelled,
            None => Exit::Success,
        };
        let mut tenants: BTreeMap<&str, TenantSummary> = BTreeMap::new();
        for job in &jobs {
            let t = tenants.entry(&job.tenant).or_default();
            t.tenant = job.tenant.clone();
            t.jobs += 1;
            t.failed += u32::from(job.outcome == Outcome::Failed);
            t.restarts += job.restarts;
            t.records_read += job.records_read;
            t.records_written += job.records_written;
            for task in &job.tasks {
                t.busy_ms += task.busy_ms;
                for op in &task.operators {
                    t.peak_memory_bytes = t.peak_memory_bytes.max(op.memory_bytes);
                }
            }
            for (kind, n) in &job.failures {
                *t.failures.entry(kind.clone()).or_default() += n;
            }
        }
        let tenants = tenants.into_values().collect();
        RunSummary {
            exit_code,
            jobs,
            tenants,
        }
    }

    /// The summary for people, on stderr: each job that ended (a failed one's error is
    /// printed as it happens), then with several jobs a line per tenant.
    pub(super) fn print(&self) {
        for job in &self.jobs {
            if job.error.is_none() {
                print_job(job);
            }
        }
        if self.jobs.len() > 1 {
            print_tenants(&self.tenants);
        }
    }
}

fn print_job(job: &JobSummary) {
    let outcome = match (&job.outcome, &job.savepoint) {
        (Outcome::Stopped, Some(savepoint)) => format!("stopped with savepoint {savepoint}"),
        (Outcome::Finished, _) => "finished".into(),
        (Outcome::Cancelled, _) => "cancelled".into(),
        (outcome, _) => format!("{outcome:?}").to_lowercase(),
    };
    let restarts = match job.restarts {
        0 => String::new(),
        n => format!(" after {n} restarts"),
    };
    let committed = match job.records_committed {
        Some(n) => format!(", {n} records committed"),
        None => String::new(),
    };
    eprintln!(
        "job '{}' {outcome} in {:.2}s{restarts}{committed}",
        job.job,
        job.duration_ms as f64 / 1e3
    );
    if let Some(savepoint) = &job.savepoint {
        eprintln!(
            "  resume it with: sluice run {} --from-checkpoint {savepoint}",
            job.file
        );
    }
    let mut operators = table(
        &[
            "operator (subtask)",
            "records in",
            "records out",
            "batches",
            "busy",
        ],
        1..5,
    );
    for op in job.tasks.iter().flat_map(|t| &t.operators) {
        operators.add_row(vec![
            format!("{} ({})", op.operator, op.subtask),
            op.records_in.to_string(),
            op.records_out.to_string(),
            op.batches.to_string(),
            seconds(op.busy_ms),
        ]);
    }
    eprintln!("{}", indent(&operators.trim_fmt()));
    for op in job
        .tasks
        .iter()
        .flat_map(|t| t.source.iter().chain(&t.operators))
    {
        let who = format!("{} ({})", op.operator, op.subtask);
        if !op.lag.is_empty() {
            eprintln!("  {who} lag {}", pairs(&op.lag));
        }
        if !op.counters.is_empty() {
            eprintln!("  {who} counters {}", pairs(&op.counters));
        }
    }
    let mut tasks = table(&["task", "busy", "idle", "backpressured", "mails"], 1..5);
    for task in &job.tasks {
        tasks.add_row(vec![
            task.task.clone(),
            seconds(task.busy_ms),
            seconds(task.idle_ms),
            seconds(task.backpressured_ms),
            task.mails.to_string(),
        ]);
    }
    eprintln!("{}", indent(&tasks.trim_fmt()));
    let c = &job.checkpoints;
    if c.completed > 0 || c.aborted > 0 {
        eprintln!(
            "  checkpoints: {} completed, {} aborted",
            c.completed, c.aborted
        );
        if c.completed > 0 {
            eprintln!(
                "    wrote {} in all, the last one's state {}; sync part {:.1} ms median \
                 ({:.1} ms longest), async part {:.0} ms median",
                ByteSize(c.written_bytes).display().iec(),
                ByteSize(c.last_full_bytes).display().iec(),
                c.sync_ms_median,
                c.sync_ms_max,
                c.async_ms_median
            );
        }
    }
    for output in &job.outputs {
        match output.files {
            1 => eprintln!("output written to {}", output.path),
            n => eprintln!(
                "output written to {} ({n} files, one per subtask)",
                output.path
            ),
        }
    }
}

fn print_tenants(tenants: &[TenantSummary]) {
    let mut t = table(
        &[
            "tenant", "jobs", "failed", "restarts", "read", "written", "busy", "peak mem",
            "failures",
        ],
        1..8,
    );
    for tenant in tenants {
        t.add_row(vec![
            tenant.tenant.clone(),
            tenant.jobs.to_string(),
            tenant.failed.to_string(),
            tenant.restarts.to_string(),
            tenant.records_read.to_string(),
            tenant.records_written.to_string(),
            seconds(tenant.busy_ms),
            ByteSize(tenant.peak_memory_bytes)
                .display()
                .iec()
                .to_string(),
            match tenant.failures.is_empty() {
                true => "-".into(),
                false => pairs(&tenant.failures),
            },
        ]);
    }
    eprintln!("{}", t.trim_fmt());
}

fn seconds(ms: f64) -> String {
    format!("{:.2}s", ms / 1e3)
}

/// `k=v k=v`.
fn pairs(map: &BTreeMap<String, u64>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` with each line indented by two spaces.
fn indent(text: &str) -> String {
    text.lines()
        .map(|line| format!("  {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(tenant: &str, exit_code: Exit) -> JobSummary {
        JobSummary {
            job: "j".into(),
            tenant: tenant.into(),
            file: "j.toml".into(),
            outcome: match exit_code {
                Exit::Success => Outcome::Finished,
                Exit::Cancelled => Outcome::Cancelled,
                Exit::Refused => Outcome::Refused,
                _ => Outcome::Failed,
            },
            savepoint: None,
            error: None,
            exit_code,
            duration_ms: 10,
            restarts: 1,
            records_read: 5,
            records_written: 4,
            records_committed: Some(4),
            failures: BTreeMap::from([("error".to_string(), 1)]),
            tasks: Vec::new(),
            checkpoints: CheckpointCounts::of(&CheckpointStats::default()),
            outputs: Vec::new(),
        }
    }

    #[test]
    fn the_first_job_that_failed_decides_the_exit_status() {
        let run =
            |codes: &[Exit]| RunSummary::of(codes.iter().map(|&c| job("t", c)).collect()).exit_code;
        assert_eq!(run(&[Exit::Success, Exit::Success]), Exit::Success);
        assert_eq!(run(&[Exit::Success, Exit::Cancelled]), Exit::Cancelled);
        assert_eq!(
            run(&[Exit::Cancelled, Exit::Refused, Exit::JobFailed]),
            Exit::Refused
        );
        assert_eq!(run(&[Exit::JobFailed, Exit::Refused]), Exit::JobFailed);
    }

    #[test]
    fn tenants_add_up_their_jobs() {
        let summary = RunSummary::of(vec![
            job("a", Exit::Success),
            job("b", Exit::JobFailed),
            job("a", Exit::Success),
        ]);
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["exit_code"], 70);
        assert_eq!(json["jobs"][1]["outcome"], "failed");
        assert_eq!(json["tenants"][0]["tenant"], "a");
        assert_eq!(json["tenants"][0]["jobs"], 2);
        assert_eq!(json["tenants"][0]["records_read"], 10);
        assert_eq!(json["tenants"][0]["failures"]["error"], 2);
        assert_eq!(json["tenants"][1]["failed"], 1);
    }
}
