//! The `sluice` command line.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use crossbeam_channel::{Sender, unbounded};

use crate::job::{
    Job, JobControl, JobMonitor, JobOutcome, JobReport, RestorePoint, SinkKind, Vertex,
};
use crate::wasm::{ComponentCache, EngineSettings, WasmEngine, supported_version};

/// Runs stream operators as sandboxed WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log filter, e.g. `info` or `sluice=debug` (also `SLUICE_LOG`).
    #[arg(long, global = true, env = "SLUICE_LOG", default_value = "warn")]
    log: String,
    /// Where compiled components are cached (default: `~/.cache/sluice`; also
    /// `SLUICE_CACHE_DIR`).
    #[arg(long, global = true)]
    cache_dir: Option<PathBuf>,
    /// Do not cache compiled components on disk.
    #[arg(long, global = true)]
    no_cache: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a job until its input ends (or it is stopped: SIGTERM or Ctrl-C stops it with a
    /// savepoint when it checkpoints; a second one cancels it).
    Run {
        /// The job file.
        job: PathBuf,
        /// Resume from `latest` (the newest complete checkpoint or savepoint of the job)
        /// or from a checkpoint or savepoint folder.
        #[arg(long, value_name = "latest|PATH")]
        from_checkpoint: Option<String>,
        /// Advance event time to the end before a stop-with-savepoint (fires all timers
        /// and windows).
        #[arg(long)]
        drain_on_stop: bool,
        /// No progress line and no summary.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Check a job file and its plugins without running it.
    Validate {
        /// The job file.
        job: PathBuf,
    },
    /// Show what a plugin component is and exports.
    Inspect {
        /// The `.wasm` file.
        plugin: PathBuf,
    },
}

/// Parses the arguments, runs the command, maps the result to an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

fn engine(cli: &Cli) -> Result<Arc<WasmEngine>> {
    let cache_dir = if cli.no_cache {
        None
    } else {
        cli.cache_dir.clone().or_else(ComponentCache::default_dir)
    };
    Ok(Arc::new(WasmEngine::new(EngineSettings { cache_dir })?))
}

fn run(cli: Cli) -> Result<ExitCode> {
    match &cli.command {
        Command::Run {
            job,
            from_checkpoint,
            drain_on_stop,
            quiet,
        } => {
            let restore = match from_checkpoint.as_deref() {
                None => RestorePoint::Fresh,
                Some("latest") => RestorePoint::Latest,
                Some(path) => RestorePoint::Path(PathBuf::from(path)),
            };
            run_job(&cli, job, restore, *drain_on_stop, *quiet)
        }
        Command::Validate { job } => validate(&cli, job),
        Command::Inspect { plugin } => inspect(&cli, plugin),
    }
}

fn run_job(
    cli: &Cli,
    path: &Path,
    restore: RestorePoint,
    drain: bool,
    quiet: bool,
) -> Result<ExitCode> {
    let job = Job::load(path, engine(cli)?)?;
    let (control_tx, control_rx) = unbounded();
    watch_signals(control_tx, job.graph().checkpoint.is_some(), drain)?;
    let monitor = Arc::new(JobMonitor::default());
    let done = Arc::new(AtomicBool::new(false));
    let progress = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let monitor = monitor.clone();
        let done = done.clone();
        thread::spawn(move || show_progress(&monitor, &done))
    });
    let result = job.run(restore, &control_rx, &monitor);
    done.store(true, Ordering::Relaxed);
    if let Some(p) = progress {
        let _ = p.join();
    }
    let report = result?;
    if !quiet {
        print_summary(&job, &report);
    }
    Ok(match report.outcome {
        JobOutcome::Finished | JobOutcome::Stopped { .. } => ExitCode::SUCCESS,
        JobOutcome::Cancelled => ExitCode::from(130),
    })
}

/// SIGTERM / SIGINT: the first stops the job (with a savepoint when it checkpoints), the
/// second cancels it.
fn watch_signals(control: Sender<JobControl>, checkpointing: bool, drain: bool) -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing signal handlers")?;
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut stopping = false;
            for signal in signals.forever() {
                if stopping || !checkpointing {
                    eprintln!("\nsluice: cancelling the job (signal {signal})");
                    let _ = control.send(JobControl::Cancel);
                    continue;
                }
                stopping = true;
                eprintln!(
                    "\nsluice: stopping the job with a savepoint (signal {signal}; again to cancel)"
                );
                let (reply, answer) = unbounded();
                let _ = control.send(JobControl::StopWithSavepoint { drain, reply });
                let control = control.clone();
                thread::spawn(move || match answer.recv() {
                    Ok(Ok(path)) => eprintln!("sluice: savepoint written to {}", path.display()),
                    Ok(Err(e)) => {
                        eprintln!("sluice: the savepoint failed ({e}); cancelling");
                        let _ = control.send(JobControl::Cancel);
                    }
                    Err(_) => {}
                });
            }
        })?;
    Ok(())
}

fn totals(monitor: &JobMonitor) -> (u64, u64) {
    let tasks = monitor.tasks();
    let read = tasks
        .iter()
        .filter(|t| t.is_source)
        .map(|t| t.records_in)
        .sum();
    let written = tasks
        .iter()
        .flat_map(|t| &t.operators)
        .filter(|o| o.operator == "sink")
        .map(|o| o.records_in)
        .sum();
    (read, written)
}

fn show_progress(monitor: &JobMonitor, done: &AtomicBool) {
    let start = Instant::now();
    let mut last = (0u64, Instant::now());
    while !done.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(250));
        let (read, written) = totals(monitor);
        let dt = last.1.elapsed().as_secs_f64().max(1e-3);
        let rate = (read.saturating_sub(last.0)) as f64 / dt;
        last = (read, Instant::now());
        let checkpoints = monitor.checkpoints().completed.len();
        let attempt = monitor.attempt();
        let restarts = if attempt > 0 {
            format!("  restarts {attempt}")
        } else {
            String::new()
        };
        eprint!(
            "\r\x1b[2K{:>6.1}s  read {read}  written {written}  {}/s  checkpoints {checkpoints}{restarts}",
            start.elapsed().as_secs_f64(),
            human(rate)
        );
        let _ = std::io::stderr().flush();
    }
    eprint!("\r\x1b[2K");
}

fn human(n: f64) -> String {
    match n {
        n if n >= 1e6 => format!("{:.2}M", n / 1e6),
        n if n >= 1e3 => format!("{:.1}k", n / 1e3),
        n => format!("{n:.0}"),
    }
}

fn print_summary(job: &Job, report: &JobReport) {
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
    for op in report.tasks.iter().flat_map(|t| &t.operators) {
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
    let sink = graph.sink();
    if sink.kind == SinkKind::File {
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

fn validate(cli: &Cli, path: &Path) -> Result<ExitCode> {
    let job = Job::load(path, engine(cli)?)?;
    let graph = job.graph();
    println!("job '{}' (tenant '{}') is valid", graph.name, graph.tenant);
    for (i, chain) in graph.chains.iter().enumerate() {
        let input: String = chain
            .inputs
            .iter()
            .map(|(u, p)| format!(" <- {} from task {u}", p.name()))
            .collect();
        println!(
            "  task {i}: {} x{}{input}",
            chain.name(graph),
            chain.parallelism
        );
    }
    for v in &graph.vertices {
        if let Vertex::Operator(o) = v {
            let plugin = &job.plugins()[&o.name];
            println!(
                "  operator '{}': {} ({} bytes, {})",
                o.name,
                plugin.path.display(),
                plugin.size,
                plugin.info.interface
            );
        }
    }
    match &graph.checkpoint {
        Some(c) => println!(
            "  checkpoints every {:?} ({:?}) in {}",
            c.interval,
            c.mode,
            c.dir.display()
        ),
        None => println!("  checkpoints: off"),
    }
    Ok(ExitCode::SUCCESS)
}

fn inspect(cli: &Cli, path: &Path) -> Result<ExitCode> {
    let engine = engine(cli)?;
    let plugin = engine.load_plugin(path)?;
    println!("file:      {}", plugin.path.display());
    println!("size:      {} bytes", plugin.size);
    println!("sha256:    {}", plugin.digest);
    println!(
        "world:     sluice:operator/operator (host supports {})",
        supported_version()
    );
    println!("exports:   {}", plugin.info.interface);
    println!("calls:     {}", plugin.info.calls.join(", "));
    println!("imports:   {}", plugin.info.imports.join(", "));
    println!("compiled:  {:?}", plugin.compiled);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        Cli::command().debug_assert();
    }
}
