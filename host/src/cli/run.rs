//! `sluice run`: jobs run in this process, or this host's share of a job run over
//! several hosts.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Instant;

use anyhow::{Context, Result};
use crossbeam_channel::{Sender, unbounded};
use parking_lot::Mutex;

use super::exit::{Exit, bad_input, mark};
use super::metrics::Scraped;
use super::progress::{Followed, InputSize, show_progress};
use super::summary::{Ended, JobSummary, RunSummary};
use super::{Cli, Command, control, engine, host_config, print_json};
use crate::job::{
    Job, JobControl, JobGraph, JobMonitor, JobReport, RestorePoint, RunLocks, RunOptions, SinkKind,
    Vertex, load_graph,
};
use crate::server::worker::Restarts;
use crate::server::worker::protocol::JobSource;
use crate::server::worker::supervisor::{WorkerJob, Workers};
use crate::tenant::{HostConfig, InstanceBudget, TenantConfig};

/// `sluice run`, with `cli`'s arguments.
pub(super) fn run_command(cli: &Cli) -> Result<Exit> {
    let Command::Run {
        jobs,
        host_config: host_path,
        from_checkpoint,
        fresh,
        allow_rewind,
        allow_non_restored_state,
        drain_on_stop,
        quiet,
        json,
        metrics,
        cluster,
    } = &cli.command
    else {
        unreachable!("run_command runs `sluice run`");
    };
    if let Some(bootstrap) = cluster {
        let [job] = &jobs[..] else {
            return Err(mark(
                Exit::Usage,
                anyhow::anyhow!("--cluster runs one job file"),
            ));
        };
        return run_cluster(cli, job, host_path.as_deref(), bootstrap);
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
    let host = host_config(host_path.as_deref())?;
    let mut jobs = jobs.clone();
    jobs.extend(host.jobs.iter().cloned());
    let usage = |message: &str| mark(Exit::Usage, anyhow::anyhow!("{message}"));
    if jobs.is_empty() {
        return Err(usage(
            "no job to run: name a job file, or list `jobs` in a host configuration",
        ));
    }
    if jobs.len() > 1 && options.restore != RestorePoint::Fresh {
        return Err(usage("--from-checkpoint applies to one job at a time"));
    }
    let report = Report {
        quiet: *quiet,
        json: *json,
        metrics: metrics.clone(),
    };
    run_jobs(
        cli,
        &host,
        host_path.as_deref(),
        &jobs,
        options,
        *drain_on_stop,
        &report,
    )
}

/// What a run shows while its jobs run and when they end.
struct Report {
    /// No progress line and no summary.
    quiet: bool,
    /// The summary as JSON on stdout, and no progress line.
    json: bool,
    /// Where to serve the jobs' metrics.
    metrics: Option<String>,
}

/// `sluice run --cluster`: this host's share of a job run over several hosts, until the
/// whole job finished or SIGTERM / SIGINT.
fn run_cluster(cli: &Cli, job: &Path, host_path: Option<&Path>, bootstrap: &str) -> Result<Exit> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let host = host_config(host_path)?;
    let graph = load_graph(job).map_err(bad_input)?;
    let settings = crate::cluster::ClusterSettings::of(
        &graph,
        Some(bootstrap).filter(|b| !b.is_empty()),
        host.cluster.as_ref(),
    )
    .with_context(|| format!("{}", job.display()))
    .map_err(bad_input)?;
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
    Ok(Exit::Success)
}
/// One job of a run.
struct RunningJob {
    path: PathBuf,
    graph: JobGraph,
    monitor: Arc<JobMonitor>,
    started: Instant,
}

/// Where a run's job runs: in this process, or in its tenant's worker process when the
/// run has jobs of several tenants.
enum Launch {
    Here(Job, RunLocks),
    InWorker(WorkerJob, TenantConfig),
}

fn run_jobs(
    cli: &Cli,
    host: &HostConfig,
    host_path: Option<&Path>,
    paths: &[PathBuf],
    options: RunOptions,
    drain: bool,
    report: &Report,
) -> Result<Exit> {
    // Read every job file first: a bad one fails the run before anything runs.
    let mut graphs = Vec::new();
    let cores = crate::tenant::cores();
    for path in paths {
        let graph = load_graph(path).map_err(bad_input)?;
        let tenant = host
            .tenant(&graph.tenant)
            .with_context(|| format!("{}: job '{}'", path.display(), graph.name))
            .map_err(bad_input)?;
        if graph.slots() > cores {
            eprintln!(
                "warning: job '{}' ({}) runs {} subtasks of a task side by side on a machine \
                 with {cores} cores: they take turns on the cores, and the job is rarely \
                 faster than with a parallelism of {cores}",
                graph.name,
                path.display(),
                graph.slots()
            );
        }
        graphs.push((path.clone(), graph, tenant));
    }
    let tenants: BTreeSet<&str> = graphs.iter().map(|(_, g, _)| g.tenant.as_str()).collect();
    // Jobs of several tenants run in a worker process per tenant, under the tenant's
    // OS limits, as on a server: one tenant's crash never ends another's jobs.
    let workers = match host_path {
        Some(host_path) if tenants.len() > 1 && host.server.workers => {
            tracing::info!("{}", crate::server::worker::limits::describe());
            Some(Arc::new(Workers::new(
                super::worker_command(cli, host_path)?,
                host.server.worker_timeout,
            )?))
        }
        _ => None,
    };
    let checkpointing = graphs.iter().all(|(_, g, _)| g.checkpoint.is_some());
    let sizes: Vec<Option<InputSize>> = graphs.iter().map(|(_, g, _)| InputSize::of(g)).collect();
    let writing_to_stdout = graphs.iter().find(|(_, g, _)| {
        g.vertices
            .iter()
            .any(|v| matches!(v, Vertex::Sink(s) if s.kind == SinkKind::Stdout))
    });
    let to_stdout = writing_to_stdout.is_some();
    if let (true, Some((path, graph, _))) = (report.json, writing_to_stdout) {
        return Err(mark(
            Exit::Usage,
            anyhow::anyhow!(
                "--json prints the summary on stdout, where job '{}' ({}) writes its output: \
                 give it another sink, or leave out --json",
                graph.name,
                path.display()
            ),
        ));
    }
    // In this process, every job's plugins are compiled and its run locked before
    // anything runs; a worker does both for its tenant's jobs.
    let mut launches = Vec::new();
    let budget = InstanceBudget::default();
    let engine = match workers {
        None => Some(engine(cli)?),
        Some(_) => None,
    };
    for (path, graph, tenant) in graphs {
        let launch = match &engine {
            Some(engine) => {
                let job = Job::from_graph(graph.clone(), engine, host)
                    .with_context(|| path.display().to_string())
                    .map_err(bad_input)?
                    .with_budget(budget.clone());
                // Owning the job before anything runs: a job another run holds is
                // refused here.
                let locks = job.lock()?;
                Launch::Here(job, locks)
            }
            None => Launch::InWorker(
                WorkerJob {
                    id: graph.name.clone(),
                    source: JobSource::File(path.canonicalize().unwrap_or_else(|_| path.clone())),
                    plugins: plugin_hashes(&graph),
                },
                tenant,
            ),
        };
        launches.push((path, graph, launch));
    }
    let mut controls = Vec::new();
    let mut running = Vec::new();
    for (path, graph, launch) in launches {
        let (control_tx, control_rx) = unbounded();
        controls.push(control_tx.clone());
        let monitor = Arc::new(JobMonitor::default());
        let name = graph.name.clone();
        let options = options.clone();
        let m = monitor.clone();
        let started = Instant::now();
        let thread = match launch {
            Launch::Here(job, locks) => {
                // The job is ours (locked above), and so is the control socket in its
                // folder.
                let listener = match &job.graph().checkpoint {
                    Some(c) => control::listen(&c.dir, control_tx.clone()),
                    None => None,
                };
                thread::Builder::new()
                    .name(format!("job {name}"))
                    .spawn(move || {
                        let result = job.run_locked(locks, options, &control_rx, &m);
                        drop(listener);
                        result
                    })?
            }
            Launch::InWorker(job, tenant) => {
                let workers = workers.clone().expect("workers run this job");
                let strategy = graph.restart.clone();
                let checkpoints = graph.checkpoint.as_ref().map(|c| c.dir.clone());
                thread::Builder::new()
                    .name(format!("job {name}"))
                    .spawn(move || {
                        let restarts = Restarts {
                            workers: &workers,
                            tenant: &tenant,
                            strategy: &strategy,
                            control: &control_rx,
                            monitor: &m,
                        };
                        let outcome = restarts.run_file(job, options, checkpoints.as_deref())?;
                        Ok(JobReport {
                            outcome,
                            restarts: m.attempt(),
                            duration: started.elapsed(),
                            tasks: m.tasks(),
                            checkpoints: m.checkpoints(),
                            failures: m.last_failure().into_iter().collect(),
                            interrupted: Vec::new(),
                            failures_by_kind: m.failures_by_kind(),
                        })
                    })?
            }
        };
        running.push((
            RunningJob {
                path,
                graph,
                monitor,
                started,
            },
            thread,
        ));
    }
    let endpoint = match &report.metrics {
        Some(address) => {
            let scraped = running
                .iter()
                .map(|(j, _)| Scraped {
                    tenant: j.graph.tenant.clone(),
                    job: j.graph.name.clone(),
                    monitor: j.monitor.clone(),
                })
                .collect();
            let endpoint = super::metrics::serve(address, scraped)?;
            eprintln!("sluice: metrics at http://{}/metrics", endpoint.address);
            Some(endpoint)
        }
        None => None,
    };
    let savepoint_reports = watch_signals(controls, checkpointing, drain)?;
    let done = Arc::new(AtomicBool::new(false));
    // Never drawn between the lines of a stdout sink.
    let drawn = !report.quiet && !report.json && !to_stdout;
    let progress = (drawn && std::io::stderr().is_terminal()).then(|| {
        let jobs: Vec<Followed> = running
            .iter()
            .zip(&sizes)
            .map(|((j, _), size)| Followed {
                name: j.graph.name.clone(),
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
    drop(endpoint);
    let reports = std::mem::take(&mut *savepoint_reports.lock());
    for report in reports {
        let _ = report.join();
    }
    let several = results.len() > 1;
    let mut jobs = Vec::new();
    for (job, result) in &results {
        if let Err(e) = result {
            if several {
                eprintln!(
                    "error: job '{}' ({}): {e:#}",
                    job.graph.name,
                    job.path.display()
                );
            } else {
                eprintln!("error: {e:#}");
            }
        }
        jobs.push(JobSummary::of(Ended {
            file: &job.path,
            graph: &job.graph,
            result,
            restarts: job.monitor.attempt(),
            failures: job.monitor.failures_by_kind(),
            tasks: job.monitor.tasks(),
            checkpoints: job.monitor.checkpoints(),
            duration: job.started.elapsed(),
        }));
    }
    let summary = RunSummary::of(jobs);
    if report.json {
        print_json(&summary)?;
    } else if !report.quiet {
        summary.print();
    }
    Ok(summary.exit_code)
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

/// The SHA-256 of each plugin file of `graph` (a worker's deaths count against them, as
/// on a server); a file that cannot be read is left out (its worker says why).
fn plugin_hashes(graph: &JobGraph) -> Vec<String> {
    graph
        .operators()
        .filter_map(|op| std::fs::read(&op.plugin).ok())
        .map(|bytes| crate::wasm::content_digest(&bytes))
        .collect()
}
