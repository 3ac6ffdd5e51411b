//! `sluice run`: jobs run in this process, or this host's share of a job run over
//! several hosts.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result};
use crossbeam_channel::{Sender, unbounded};
use parking_lot::Mutex;

use super::progress::{Followed, InputSize, show_progress};
use super::{Cli, Command, control, engine};
use crate::job::{
    Job, JobControl, JobMonitor, JobOutcome, JobReport, RestorePoint, RunOptions, SinkKind, Vertex,
};
use crate::tenant::{HostConfig, InstanceBudget};

/// `sluice run`, with `cli`'s arguments.
pub(super) fn run_command(cli: &Cli) -> Result<ExitCode> {
    let Command::Run {
        jobs,
        host_config,
        from_checkpoint,
        fresh,
        allow_rewind,
        allow_non_restored_state,
        drain_on_stop,
        quiet,
        cluster,
    } = &cli.command
    else {
        unreachable!("run_command runs `sluice run`");
    };
    if let Some(bootstrap) = cluster {
        let [job] = &jobs[..] else {
            anyhow::bail!("--cluster runs one job file");
        };
        return run_cluster(cli, job, host_config.as_deref(), bootstrap);
    }
    let restore = match from_checkpoint.as_deref() {
        None => RestorePoint::Fresh,
        Some("latest") => RestorePoint::Latest,
        Some(path) => RestorePoint::Path(PathBuf::from(path)),
    };
    let options = RunOptions {
        restore,
        move_aside: *fresh,
        allow_rewind: *allow_rewind,
        allow_non_restored_state: *allow_non_restored_state,
    };
    let host = match host_config {
        Some(path) => HostConfig::load(path)?,
        None => HostConfig::default(),
    };
    let mut jobs = jobs.clone();
    jobs.extend(host.jobs.iter().cloned());
    if jobs.is_empty() {
        anyhow::bail!("no job to run: name a job file, or list `jobs` in a host configuration");
    }
    if jobs.len() > 1 && options.restore != RestorePoint::Fresh {
        anyhow::bail!("--from-checkpoint applies to one job at a time");
    }
    run_jobs(cli, &host, &jobs, options, *drain_on_stop, *quiet)
}

/// `sluice run --cluster`: this host's share of a job run over several hosts, until the
/// whole job finished or SIGTERM / SIGINT.
fn run_cluster(
    cli: &Cli,
    job: &Path,
    host_config: Option<&Path>,
    bootstrap: &str,
) -> Result<ExitCode> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let host = match host_config {
        Some(path) => HostConfig::load(path)?,
        None => HostConfig::default(),
    };
    let graph = crate::job::load_graph(job)?;
    let settings = crate::cluster::ClusterSettings::of(
        &graph,
        Some(bootstrap).filter(|b| !b.is_empty()),
        host.cluster.as_ref(),
    )
    .with_context(|| format!("{}", job.display()))?;
    let cluster_host =
        crate::cluster::ClusterHost::new(&graph, settings, engine(cli)?, Arc::new(host))?;
    let (stop, stopped) = crossbeam_channel::bounded(1);
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing signal handlers")?;
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                eprintln!(
                    "\nsluice: leaving the cluster (signal {signal}): units move to the other hosts"
                );
                let _ = stop.send(JobControl::Cancel);
            }
        })
        .context("starting the signal thread")?;
    match cluster_host.run(&stopped)? {
        crate::cluster::HostEnd::JobFinished => {
            eprintln!("job '{}' finished on every host", graph.name);
        }
        crate::cluster::HostEnd::Stopped => {
            eprintln!("host {} left job '{}'", cluster_host.client_id, graph.name);
        }
    }
    Ok(ExitCode::SUCCESS)
}
/// One job of a run.
struct RunningJob {
    path: PathBuf,
    name: String,
    tenant: String,
    monitor: Arc<JobMonitor>,
}

fn run_jobs(
    cli: &Cli,
    host: &HostConfig,
    paths: &[PathBuf],
    options: RunOptions,
    drain: bool,
    quiet: bool,
) -> Result<ExitCode> {
    let engine = engine(cli)?;
    let budget = InstanceBudget::default();
    // Load every job first: a bad job file or plugin fails the run before anything runs.
    let mut loaded = Vec::new();
    for path in paths {
        let job = Job::load_with(path, &engine, host)?.with_budget(budget.clone());
        // Owning the job before anything runs: a job another run holds is refused here.
        let locks = job.lock()?;
        loaded.push((path.clone(), job, locks));
    }
    let checkpointing = loaded
        .iter()
        .all(|(_, j, _)| j.graph().checkpoint.is_some());
    let sizes: Vec<Option<InputSize>> = loaded.iter().map(|(_, j, _)| InputSize::of(j)).collect();
    let to_stdout = loaded.iter().any(|(_, j, _)| {
        j.graph()
            .vertices
            .iter()
            .any(|v| matches!(v, Vertex::Sink(s) if s.kind == SinkKind::Stdout))
    });
    let mut controls = Vec::new();
    let mut running = Vec::new();
    for (path, job, locks) in loaded {
        let (control_tx, control_rx) = unbounded();
        controls.push(control_tx.clone());
        let monitor = Arc::new(JobMonitor::default());
        let name = job.graph().name.clone();
        let tenant = job.tenant().name.clone();
        let options = options.clone();
        let m = monitor.clone();
        // The job is ours (locked above), and so is the control socket in its folder.
        let listener = match &job.graph().checkpoint {
            Some(c) => control::listen(&c.dir, control_tx.clone()),
            None => None,
        };
        let thread = thread::Builder::new()
            .name(format!("job {name}"))
            .spawn(move || {
                let result = job
                    .run_locked(locks, options, &control_rx, &m)
                    .map(|r| (job, r));
                drop(listener);
                result
            })?;
        running.push((
            RunningJob {
                path,
                name,
                tenant,
                monitor,
            },
            thread,
        ));
    }
    let savepoint_reports = watch_signals(controls, checkpointing, drain)?;
    let done = Arc::new(AtomicBool::new(false));
    // Never drawn between the lines of a stdout sink.
    let progress = (!quiet && !to_stdout && std::io::stderr().is_terminal()).then(|| {
        let jobs: Vec<Followed> = running
            .iter()
            .zip(&sizes)
            .map(|((j, _), size)| Followed {
                name: j.name.clone(),
                monitor: j.monitor.clone(),
                size: *size,
            })
            .collect();
        let done = done.clone();
        thread::spawn(move || show_progress(&jobs, &done))
    });
    let results: Vec<_> = running
        .into_iter()
        .map(|(job, thread)| {
            let result = thread
                .join()
                .unwrap_or_else(|panic| Err(crate::task::panic_to_error(panic)));
            (job, result)
        })
        .collect();
    done.store(true, Ordering::Relaxed);
    if let Some(p) = progress {
        let _ = p.join();
    }
    let reports = std::mem::take(&mut *savepoint_reports.lock());
    for report in reports {
        let _ = report.join();
    }
    let several = results.len() > 1;
    let mut code = ExitCode::SUCCESS;
    let mut tenants: BTreeMap<String, TenantTotals> = BTreeMap::new();
    for (job, result) in &results {
        let totals = tenants.entry(job.tenant.clone()).or_default();
        totals.jobs += 1;
        for (kind, n) in job.monitor.failures_by_kind() {
            *totals.failures.entry(kind).or_default() += n;
        }
        match result {
            Ok((loaded, report)) => {
                totals.add(report);
                if !quiet {
                    print_summary(loaded, report, &job.path);
                }
                if report.outcome == JobOutcome::Cancelled && code == ExitCode::SUCCESS {
                    code = ExitCode::from(130);
                }
            }
            Err(e) => {
                totals.failed += 1;
                totals.restarts += job.monitor.attempt();
                if several {
                    eprintln!("error: job '{}' ({}): {e:#}", job.name, job.path.display());
                } else {
                    eprintln!("error: {e:#}");
                }
                code = ExitCode::FAILURE;
            }
        }
    }
    if several && !quiet {
        print_tenants(&tenants);
    }
    Ok(code)
}

/// What a tenant's jobs did in a run.
#[derive(Default)]
struct TenantTotals {
    jobs: u32,
    failed: u32,
    restarts: u32,
    records_read: u64,
    records_written: u64,
    busy: Duration,
    peak_memory: u64,
    failures: BTreeMap<String, u64>,
}

impl TenantTotals {
    fn add(&mut self, report: &JobReport) {
        self.restarts += report.restarts;
        for task in &report.tasks {
            if task.is_source {
                self.records_read += task.records_in;
            }
            self.busy += task.busy;
            for op in &task.operators {
                if op.is_sink {
                    self.records_written += op.records_in;
                }
                self.peak_memory = self.peak_memory.max(op.memory_bytes);
            }
        }
    }
}

fn print_tenants(tenants: &BTreeMap<String, TenantTotals>) {
    eprintln!(
        "{:<16} {:>5} {:>7} {:>9} {:>12} {:>12} {:>9} {:>11}  failures",
        "tenant", "jobs", "failed", "restarts", "read", "written", "busy", "peak mem"
    );
    for (name, t) in tenants {
        let failures: Vec<String> = t.failures.iter().map(|(k, v)| format!("{k}={v}")).collect();
        eprintln!(
            "{name:<16} {:>5} {:>7} {:>9} {:>12} {:>12} {:>8.2}s {:>8.1}MiB  {}",
            t.jobs,
            t.failed,
            t.restarts,
            t.records_read,
            t.records_written,
            t.busy.as_secs_f64(),
            t.peak_memory as f64 / (1 << 20) as f64,
            if failures.is_empty() {
                "-".to_string()
            } else {
                failures.join(" ")
            }
        );
    }
}

/// The threads that report how a stop's savepoints went: joined before the command
/// exits, so that what they print is not lost when the jobs end first.
type SavepointReports = Arc<Mutex<Vec<thread::JoinHandle<()>>>>;

/// SIGTERM / SIGINT: the first stops every job (with a savepoint when they checkpoint),
/// the second cancels them.
fn watch_signals(
    controls: Vec<Sender<JobControl>>,
    checkpointing: bool,
    drain: bool,
) -> Result<SavepointReports> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing signal handlers")?;
    let reports = SavepointReports::default();
    let spawned = reports.clone();
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut stopping = false;
            for signal in signals.forever() {
                if stopping || !checkpointing {
                    eprintln!("\nsluice: cancelling (signal {signal})");
                    for control in &controls {
                        let _ = control.send(JobControl::Cancel);
                    }
                    continue;
                }
                stopping = true;
                eprintln!("\nsluice: stopping with a savepoint (signal {signal}; again to cancel)");
                for control in &controls {
                    let (reply, answer) = unbounded();
                    let _ = control.send(JobControl::StopWithSavepoint { drain, reply });
                    let control = control.clone();
                    // The answer comes before the job ends, or the job ends without one
                    // (the reply is dropped): either way the thread ends.
                    let report = thread::spawn(move || match answer.recv() {
                        Ok(Ok(path)) => {
                            eprintln!("sluice: savepoint written to {}", path.display())
                        }
                        Ok(Err(e)) => {
                            eprintln!("sluice: the savepoint failed ({e}); cancelling");
                            let _ = control.send(JobControl::Cancel);
                        }
                        Err(_) => {}
                    });
                    spawned.lock().push(report);
                }
            }
        })?;
    Ok(reports)
}
fn print_summary(job: &Job, report: &JobReport, path: &Path) {
    let graph = job.graph();
    let outcome = match &report.outcome {
        JobOutcome::Finished => "finished".to_string(),
        JobOutcome::Stopped { savepoint } => {
            format!("stopped with savepoint {}", savepoint.display())
        }
        JobOutcome::Cancelled => "cancelled".to_string(),
    };
    eprintln!(
        "job '{}' {outcome} in {:.2}s{}",
        graph.name,
        report.duration.as_secs_f64(),
        if report.restarts > 0 {
            format!(" after {} restarts", report.restarts)
        } else {
            String::new()
        }
    );
    if let JobOutcome::Stopped { savepoint } = &report.outcome {
        eprintln!(
            "  resume it with: sluice run {} --from-checkpoint {}",
            path.display(),
            savepoint.display()
        );
    }
    eprintln!(
        "  {:<28} {:>12} {:>12} {:>10} {:>10}",
        "operator (subtask)", "records in", "records out", "batches", "busy"
    );
    for task in &report.tasks {
        for op in &task.operators {
            eprintln!(
                "  {:<28} {:>12} {:>12} {:>10} {:>9.2}s",
                format!("{} ({})", op.operator, op.subtask + 1),
                op.records_in,
                op.records_out,
                op.batches,
                op.busy.as_secs_f64()
            );
        }
    }
    for op in report
        .tasks
        .iter()
        .flat_map(|t| t.source.iter().chain(&t.operators))
    {
        if !op.lag.is_empty() {
            let lag: Vec<String> = op.lag.iter().map(|(p, n)| format!("{p}={n}")).collect();
            eprintln!(
                "  {:<28} {}",
                format!("{} ({}) lag", op.operator, op.subtask + 1),
                lag.join(" ")
            );
        }
        if !op.counters.is_empty() {
            let counters: Vec<String> = op
                .counters
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            eprintln!(
                "  {:<28} {}",
                format!("{} ({}) counters", op.operator, op.subtask + 1),
                counters.join(" ")
            );
        }
    }
    for task in &report.tasks {
        eprintln!(
            "  task {:<40} busy {:.2}s  idle {:.2}s  backpressured {:.2}s  mails {}",
            task.task,
            task.busy.as_secs_f64(),
            task.idle.as_secs_f64(),
            task.backpressured.as_secs_f64(),
            task.mails
        );
    }
    if !report.checkpoints.completed.is_empty() || !report.checkpoints.aborted.is_empty() {
        eprintln!(
            "  checkpoints: {} completed, {} aborted",
            report.checkpoints.completed.len(),
            report.checkpoints.aborted.len()
        );
    }
    for sink in graph.sinks().filter(|s| s.kind == SinkKind::File) {
        let path = sink.path.as_ref().expect("file sinks have a path");
        if sink.parallelism > 1 {
            eprintln!(
                "output written to {} ({} files, one per subtask)",
                path.display(),
                sink.parallelism
            );
        } else {
            eprintln!("output written to {}", path.display());
        }
    }
}
