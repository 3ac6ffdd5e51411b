//! The `sluice` command line.

pub(crate) mod control;
mod describe;
pub(crate) mod exit;
mod manual;
mod metrics;
mod new;
mod progress;
mod remote;
mod run;
mod summary;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

pub use exit::Exit;

use crate::server::Server;
use crate::server::client::Client;
use crate::tenant::HostConfig;
use crate::wasm::{ComponentCache, EngineSettings, WasmEngine};

/// Runs stream operators as sandboxed WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about, after_long_help = Exit::help())]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log filter, e.g. `info` or `sluice=debug` (also `SLUICE_LOG`).
    #[arg(long, global = true, env = "SLUICE_LOG", default_value = "warn")]
    log: String,
    /// `text` for people, `json` (one object per line) for log collectors (also
    /// `SLUICE_LOG_FORMAT`).
    #[arg(long, global = true, env = "SLUICE_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
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
    /// Run jobs until their input ends (or they are stopped: SIGTERM or Ctrl-C stops each
    /// with a savepoint when it checkpoints; a second one cancels them). Several jobs run
    /// side by side in this process, isolated from each other.
    Run {
        /// Job files (more may come from the host configuration's `jobs`).
        jobs: Vec<PathBuf>,
        /// Tenants' limits and capabilities, and jobs to run.
        #[arg(long, value_name = "HOST.toml", env = "SLUICE_HOST_CONFIG")]
        host_config: Option<PathBuf>,
        /// Resume from `latest` (the newest checkpoint of the job's last run, or the point
        /// that run started from) or from a checkpoint or savepoint folder. Without it a
        /// job starts from scratch, and refuses to when it has run before.
        #[arg(long, value_name = "latest|PATH", conflicts_with = "fresh")]
        from_checkpoint: Option<String>,
        /// Start from scratch even though the job has run before: its checkpoint folder
        /// and output files are moved aside (to `NAME.N`) first, never deleted.
        #[arg(long)]
        fresh: bool,
        /// Restore a checkpoint older than the output already committed: a file sink's
        /// output as it is stays as a new file generation (`NAME.N`), the job goes on from
        /// the checkpoint's; a Kafka topic keeps what it holds, and the records after the
        /// checkpoint are written to it again.
        #[arg(long, requires = "from_checkpoint")]
        allow_rewind: bool,
        /// Restore a checkpoint that has state of sources or operators the job no longer
        /// has (by id); that state is dropped.
        #[arg(long, requires = "from_checkpoint")]
        allow_non_restored_state: bool,
        /// Advance event time to the end before a stop-with-savepoint (fires all timers
        /// and windows).
        #[arg(long)]
        drain_on_stop: bool,
        /// No progress line and no summary.
        #[arg(long, short)]
        quiet: bool,
        /// Print the summary as one JSON document on stdout instead (and no progress
        /// line): each job's outcome, error, exit code, tasks, operators, checkpoints
        /// and output, and each tenant's totals.
        #[arg(long)]
        json: bool,
        /// Serve the jobs' metrics while they run at `http://ADDR/metrics`, in
        /// Prometheus' text format (port 0 picks a free port; the address is printed on
        /// stderr).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        /// Run the job together with the other hosts that run it with these Kafka
        /// brokers (or `[cluster] bootstrap` when none is given): the hosts share its
        /// units, and take over those of a host that dies. Runs until the whole job
        /// finished or SIGTERM / Ctrl-C (this host's units move to the others).
        #[arg(
            long,
            value_name = "HOST:PORT",
            num_args = 0..=1,
            default_missing_value = "",
            conflicts_with_all = ["from_checkpoint", "fresh", "drain_on_stop", "json", "metrics"]
        )]
        cluster: Option<String>,
    },
    /// Take a savepoint of a job that `sluice run` is running, without stopping it; prints
    /// the savepoint's folder. With `--server`, of a job on that server: triggers it,
    /// waits until it is written and prints its name (for `start --savepoint`).
    Savepoint {
        /// The job file, or its checkpoint folder; with `--server`, the job's id there.
        job: PathBuf,
        /// The server whose job JOB is (given here only: SLUICE_SERVER does not turn a
        /// local savepoint into a server's).
        #[arg(long)]
        server: Option<String>,
        /// Your tenant's bearer token, with `--server`.
        #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Trust this certificate authority (PEM) for an `https://` server, with
        /// `--server`.
        #[arg(long, env = "SLUICE_CA_CERT", value_name = "PEM")]
        ca_cert: Option<PathBuf>,
    },
    /// Check a job file and its plugins without running it: the file, the graph, and
    /// each operator's `open` with its config (one instance each, then disposed).
    Validate {
        /// The job file.
        job: PathBuf,
        /// Tenants' limits and capabilities (the job's tenant's apply to its `open`).
        #[arg(long, value_name = "HOST.toml", env = "SLUICE_HOST_CONFIG")]
        host_config: Option<PathBuf>,
        /// Print what was found as JSON, for programs (`valid` false and the `error`
        /// when the job is not valid).
        #[arg(long)]
        json: bool,
        /// Also show how the job runs over several hosts with these Kafka brokers (or
        /// `[cluster] bootstrap` when none is given): its stages, the topics they read
        /// and write, and its units (the brokers are asked for the source's partitions).
        #[arg(long, value_name = "HOST:PORT", num_args = 0..=1, default_missing_value = "")]
        cluster: Option<String>,
    },
    /// Create a plugin crate from a template: `cargo test` and `cargo build --release
    /// --target wasm32-wasip2` work at once, and its `job.toml` runs it.
    New {
        /// The crate's name (and folder).
        name: String,
        /// What the operator starts as.
        #[arg(long, value_enum, default_value = "map")]
        template: new::Template,
        /// The language it is written in.
        #[arg(long, value_enum, default_value = "rust")]
        lang: new::Language,
        /// Where to create the folder.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The sluice-sdk crate to depend on by path (default: the SDK of this Sluice
        /// checkout if there is one, else the published version); for `--lang python`
        /// and `js`, the Sluice checkout whose SDK and build script to use.
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Show what a plugin component is and exports.
    Inspect {
        /// The `.wasm` file.
        plugin: PathBuf,
        /// Print it as JSON, for programs.
        #[arg(long)]
        json: bool,
    },
    /// Run a multi-tenant job server with an HTTP API until SIGTERM or Ctrl-C (which stop
    /// its jobs with savepoints; they resume when it starts again).
    Serve {
        /// Tenants (with `token_sha256`), their limits and quotas, and `[server]`.
        #[arg(long, value_name = "HOST.toml", env = "SLUICE_HOST_CONFIG")]
        host_config: PathBuf,
        /// Listen here instead of `[server] address`.
        #[arg(long)]
        address: Option<String>,
    },
    /// Runs one tenant's jobs for the `sluice serve` or `sluice run` that started it (a
    /// worker process; not for people).
    #[command(hide = true)]
    Worker {
        /// The host configuration of the process that started it.
        #[arg(long, value_name = "HOST.toml")]
        host_config: PathBuf,
        /// The tenant whose jobs it runs.
        #[arg(long)]
        tenant: String,
    },
    /// Compiles a plugin into the compile cache, for the `sluice serve` that started it
    /// (not for people).
    #[command(hide = true)]
    Compile {
        /// The plugin.
        file: PathBuf,
        /// With fuel metering.
        #[arg(long)]
        fuel: bool,
    },
    /// Submit a job file to a server, uploading the plugins it names.
    Submit {
        /// The job file.
        job: PathBuf,
        #[command(flatten)]
        remote: Remote,
    },
    /// List your jobs on a server.
    List {
        #[command(flatten)]
        remote: Remote,
    },
    /// Show a job on a server: state, tasks, checkpoints, metrics, last failure; with
    /// `--cluster`, a job run over several hosts: its hosts and the units each runs.
    Status {
        /// The job id (with `--cluster`, the job file).
        id: String,
        /// The job file `id` runs over several hosts with these Kafka brokers (or
        /// `[cluster] bootstrap` when none is given).
        #[arg(long, value_name = "HOST:PORT", num_args = 0..=1, default_missing_value = "")]
        cluster: Option<String>,
        /// With `--cluster`: the host configuration whose `[cluster]` fills in what the
        /// job file's leaves out.
        #[arg(long, value_name = "HOST.toml", env = "SLUICE_HOST_CONFIG")]
        host_config: Option<PathBuf>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Reset a unit of a job run over several hosts (`run --cluster`) whose last committed
    /// transaction names a checkpoint the store lost: go on from an older checkpoint of
    /// the same attempt (`--to`), or start the unit over (`--fresh`). Either way the unit
    /// writes again what it committed since; its owner, fenced, starts again from here.
    ResetUnit {
        /// The job file.
        job: PathBuf,
        /// The unit (as the hosts' error names it).
        #[arg(long)]
        unit: u32,
        /// `ATTEMPT/ID`: a checkpoint in the store older than the one the unit's marker
        /// names, of the same attempt (the error lists them).
        #[arg(
            long,
            value_name = "ATTEMPT/ID",
            required_unless_present = "fresh",
            conflicts_with = "fresh"
        )]
        to: Option<crate::cluster::ResetTo>,
        /// Start the unit over, from its input's start, as when the job first ran.
        #[arg(long)]
        fresh: bool,
        /// The Kafka brokers (or `[cluster] bootstrap` when none is given).
        #[arg(long, value_name = "HOST:PORT", num_args = 0..=1, default_missing_value = "")]
        cluster: Option<String>,
        /// The host configuration whose `[cluster]` fills in what the job file's leaves
        /// out.
        #[arg(long, value_name = "HOST.toml", env = "SLUICE_HOST_CONFIG")]
        host_config: Option<PathBuf>,
    },
    /// Commands for a job run over several hosts (`run --cluster`).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Cancel a job on a server.
    Cancel {
        /// The job id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Stop a job on a server with a savepoint.
    Stop {
        /// The job id.
        id: String,
        /// Fire all event-time timers and windows first.
        #[arg(long)]
        drain: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Start a stopped, cancelled or failed job on a server again.
    Start {
        /// The job id.
        id: String,
        /// Resume from this savepoint (a name from `status`) instead of the latest.
        #[arg(long)]
        savepoint: Option<String>,
        /// Start it as this job file describes instead (changed settings, parallelism or
        /// plugins: an upgrade from the savepoint); it replaces the job's file. Secrets
        /// left masked (******), as `status` shows the file, keep their values.
        #[arg(long, value_name = "FILE")]
        job: Option<PathBuf>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Print a job's recent log lines (its tasks' and operators', guest output included).
    Logs {
        /// The job id.
        id: String,
        /// Keep printing new lines until the job is no longer running.
        #[arg(long, short)]
        follow: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Delete a job that is not running, with its checkpoints, savepoints, output and
    /// logs.
    Delete {
        /// The job id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List your plugins on a server.
    Plugins {
        #[command(flatten)]
        remote: Remote,
    },
    /// Delete a plugin from a server (refused while a job that could run uses it).
    DeletePlugin {
        /// Its SHA-256, or the name it was uploaded under.
        plugin: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Print your tenant's metrics (Prometheus' text format; `--json`: each family with
    /// its `name`, `type`, `help` and `samples`, each sample its `name`, `labels` and
    /// `value`): jobs, operators, counters, consumer lag, checkpoints.
    Metrics {
        #[command(flatten)]
        remote: Remote,
    },
    /// Print a job's committed output.
    Output {
        /// The job id.
        id: String,
        /// Only this output file (as `sluice status` lists them, e.g. `output/late.tsv`):
        /// one sink's output of a job with several.
        #[arg(long)]
        file: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Print a shell's completion script, e.g. `sluice completions bash >
    /// ~/.local/share/bash-completion/completions/sluice`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page sluice(1) (roff: `sluice man | man -l -`), or write it and a
    /// page per command to a folder.
    Man {
        /// Write `sluice.1` and a `sluice-COMMAND.1` per command here instead (e.g.
        /// `/usr/local/share/man/man1`).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// `sluice cluster …`.
#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Delete what a job run over several hosts left outside them once it ended on every
    /// host: its control and exchange topics and its units' checkpoints in the store.
    /// Refused while a host is still in the job's group. The job's name is spent after
    /// it (its sink topic's markers name checkpoints that are gone).
    Gc {
        /// The job file.
        job: PathBuf,
        /// The Kafka brokers (or `[cluster] bootstrap` when none is given).
        #[arg(long, value_name = "HOST:PORT", num_args = 0..=1, default_missing_value = "")]
        cluster: Option<String>,
        /// The host configuration whose `[cluster]` fills in what the job file's leaves
        /// out.
        #[arg(long, value_name = "HOST.toml", env = "SLUICE_HOST_CONFIG")]
        host_config: Option<PathBuf>,
    },
}

/// Which server, as which tenant.
#[derive(Debug, clap::Args)]
struct Remote {
    /// The server's address.
    #[arg(long, env = "SLUICE_SERVER", default_value = "http://127.0.0.1:8600")]
    server: String,
    /// Your tenant's bearer token.
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the server's answer as JSON, for programs.
    #[arg(long)]
    json: bool,
    /// Trust this certificate authority (PEM) for an `https://` server, e.g. the
    /// server's own self-signed certificate.
    #[arg(long, env = "SLUICE_CA_CERT", value_name = "PEM")]
    ca_cert: Option<PathBuf>,
}

impl Remote {
    fn client(&self) -> Result<Client> {
        if self.token.is_none() {
            anyhow::bail!(
                "no token: pass your tenant's bearer token with --token TOKEN or in the \
                 SLUICE_TOKEN environment variable"
            );
        }
        let client = Client::new(&self.server, self.token.clone());
        match &self.ca_cert {
            Some(path) => {
                let pem = std::fs::read(path)
                    .with_context(|| format!("reading --ca-cert {}", path.display()))?;
                client
                    .with_ca_cert(&pem)
                    .with_context(|| format!("--ca-cert {}", path.display()))
            }
            None => Ok(client),
        }
    }

    /// Prints `answer` as JSON with `--json`, else as `human` renders it.
    fn print<T: serde::Serialize>(&self, answer: &T, human: fn(&T) -> String) -> Result<Exit> {
        if self.json {
            print_json(answer)?;
        } else {
            write!(std::io::stdout(), "{}", human(answer))?;
        }
        Ok(Exit::Success)
    }
}

/// `println!` that returns an error instead of panicking when stdout is gone (`sluice
/// list | head`); `main` ends such a command quietly.
macro_rules! out {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout(), $($arg)*)?
    };
}

/// The job file `job` run over several hosts, with its `[cluster]` as `--cluster` and the
/// host configuration's complete it.
fn cluster_job(
    job: &Path,
    cluster: Option<&str>,
    host_path: Option<&Path>,
) -> Result<(crate::job::JobGraph, crate::cluster::ClusterSettings)> {
    let graph = crate::job::load_graph(job).map_err(exit::bad_input)?;
    let settings = cluster_settings(job, &graph, cluster, &host_config(host_path)?)?;
    Ok((graph, settings))
}

/// The `[cluster]` of the job file `job` (loaded as `graph`), with `--cluster` and
/// `host`'s completing it.
fn cluster_settings(
    job: &Path,
    graph: &crate::job::JobGraph,
    cluster: Option<&str>,
    host: &HostConfig,
) -> Result<crate::cluster::ClusterSettings> {
    crate::cluster::ClusterSettings::of(
        graph,
        cluster.filter(|b| !b.is_empty()),
        host.cluster.as_ref(),
    )
    .with_context(|| job.display().to_string())
    .map_err(exit::bad_input)
}

/// Parses the arguments, runs the command, maps the result to an exit status
/// ([`Exit`]).
pub fn main() -> ExitCode {
    crate::failpoints::setup();
    let cli = Cli::parse();
    let serving = matches!(cli.command, Command::Serve { .. } | Command::Worker { .. });
    init_logging(&cli.log, cli.log_format, serving);
    match run(cli) {
        Ok(exit) => exit.into(),
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            Exit::of(&e).into()
        }
    }
}

/// Whether to colour what goes to a stream that `is_terminal` or not: only a terminal,
/// and never when `NO_COLOR` is set to anything but nothing (<https://no-color.org>).
fn colour(is_terminal: bool) -> bool {
    is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Prints `value` on stdout as one JSON document.
fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    writeln!(std::io::stdout(), "{text}")?;
    Ok(())
}

/// A table for people: no borders and no colours, columns two spaces apart, the
/// `numbers` columns aligned right. Printed with `trim_fmt`.
fn table(header: &[&str], numbers: std::ops::Range<usize>) -> comfy_table::Table {
    use comfy_table::{CellAlignment, Table, presets};
    let mut table = Table::new();
    table
        .load_style(presets::NOTHING)
        .set_header(header.to_vec());
    let last = header.len().saturating_sub(1);
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, if i == last { 0 } else { 2 }));
        if numbers.contains(&i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// The host configuration at `path` (the defaults without one).
fn host_config(path: Option<&Path>) -> Result<HostConfig> {
    match path {
        Some(path) => HostConfig::load(path).map_err(exit::bad_input),
        None => Ok(HostConfig::default()),
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr as `filter` says; a server also keeps each job's recent lines (at
/// `info` and above, whatever the filter) for `GET /v1/jobs/ID/logs`.
fn init_logging(filter: &str, format: LogFormat, job_logs: bool) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour(std::io::stderr().is_terminal()))
        .with_target(false);
    let stderr = match format {
        LogFormat::Text => stderr.boxed(),
        LogFormat::Json => stderr.json().boxed(),
    };
    let logs = tracing_subscriber::registry().with(stderr.with_filter(filter));
    let _ = if job_logs {
        logs.with(crate::server::logs::layer().with_filter(LevelFilter::INFO))
            .try_init()
    } else {
        logs.try_init()
    };
}

fn engine(cli: &Cli) -> Result<Arc<WasmEngine>> {
    let cache_dir = if cli.no_cache {
        None
    } else {
        cli.cache_dir.clone().or_else(ComponentCache::default_dir)
    };
    // People watch these commands; a server (which logs) has its own engine.
    let announce_compiles = !matches!(
        cli.command,
        Command::Serve { .. } | Command::Worker { .. } | Command::Compile { .. }
    );
    Ok(Arc::new(WasmEngine::new(EngineSettings {
        cache_dir,
        announce_compiles,
    })?))
}

fn run(cli: Cli) -> Result<Exit> {
    match &cli.command {
        Command::Run { .. } => run::run_command(&cli),
        Command::Savepoint {
            job, server: None, ..
        } => {
            let path = control::request_savepoint(job)?;
            out!("{}", path.display());
            Ok(Exit::Success)
        }
        Command::Savepoint {
            job,
            server: Some(server),
            token,
            ca_cert,
        } => {
            let remote = Remote {
                server: server.clone(),
                token: token.clone(),
                json: false,
                ca_cert: ca_cert.clone(),
            };
            let id = job.to_string_lossy();
            // The server fails a savepoint not written within 5 minutes: it answers first.
            let name = remote.client()?.savepoint_polled(
                &id,
                Duration::from_millis(100),
                Duration::from_secs(600),
            )?;
            out!("{name}");
            Ok(Exit::Success)
        }
        Command::Validate {
            job,
            host_config,
            json,
            cluster,
        } => describe::validate(&cli, job, host_config.as_deref(), *json, cluster.as_deref()),
        Command::Inspect { plugin, json } => describe::inspect(&cli, plugin, *json),
        Command::New {
            name,
            template,
            lang,
            dir,
            sdk,
        } => {
            if *lang != new::Language::Rust {
                let root = new::create_guest(dir, name, *template, *lang, sdk.as_deref())?;
                out!(
                    "created {} (its README says how to test, build and run it)",
                    root.display()
                );
                return Ok(Exit::Success);
            }
            let root = new::create(dir, name, *template, sdk.as_deref())?;
            out!("created {}", root.display());
            out!(
                "  cd {} && cargo test && cargo build --release --target wasm32-wasip2",
                root.display()
            );
            out!("  sluice run job.toml");
            Ok(Exit::Success)
        }
        Command::Serve {
            host_config,
            address,
        } => serve(&cli, host_config, address.as_deref()),
        Command::Compile { file, fuel } => {
            crate::server::worker::limits::filter_system_calls()?;
            crate::wasm::Plugin::load(&*engine(&cli)?, file, *fuel)?;
            Ok(Exit::Success)
        }
        Command::Worker {
            host_config,
            tenant,
        } => {
            crate::server::worker::child::run(host_config.clone(), tenant, engine(&cli)?)?;
            Ok(Exit::Success)
        }
        Command::Submit { job, remote } => remote.print(&remote.client()?.submit(job)?, |v| {
            format!("{}\n", remote::job_line(v))
        }),
        Command::List { remote } => remote.print(&remote.client()?.list()?, remote::job_table),
        Command::Status {
            id,
            cluster: Some(bootstrap),
            host_config: host_path,
            remote,
        } => {
            let (graph, settings) =
                cluster_job(Path::new(id), Some(bootstrap), host_path.as_deref())?;
            let status = crate::cluster::status(&graph, settings)?;
            if remote.json {
                print_json(&status)?;
            } else {
                write!(std::io::stdout(), "{status}")?;
            }
            Ok(Exit::Success)
        }
        Command::Status {
            id,
            cluster: None,
            remote,
            ..
        } => remote.print(&remote.client()?.status(id)?, remote::job_detail),
        Command::ResetUnit {
            job,
            unit,
            to,
            fresh: _,
            cluster,
            host_config: host_path,
        } => {
            let (graph, settings) = cluster_job(job, cluster.as_deref(), host_path.as_deref())?;
            let to = to.clone().unwrap_or(crate::cluster::ResetTo::Fresh);
            out!(
                "{}",
                crate::cluster::reset_unit(&graph, settings, *unit, &to)?
            );
            Ok(Exit::Success)
        }
        Command::Cluster(ClusterCommand::Gc {
            job,
            cluster,
            host_config: host_path,
        }) => {
            let (graph, settings) = cluster_job(job, cluster.as_deref(), host_path.as_deref())?;
            let plan = crate::cluster::Plan::new(&graph, &settings)?;
            let resources =
                crate::cluster::gc::ClusterResources::of(&plan, &settings, &graph.base_dir);
            let deleted = crate::cluster::gc::delete(&resources, &settings.client())
                .with_context(|| format!("job '{}'", graph.name))?;
            for topic in &deleted.topics {
                out!("deleted topic {topic}");
            }
            out!(
                "deleted the units' checkpoints under {}",
                deleted.checkpoints
            );
            Ok(Exit::Success)
        }
        Command::Cancel { id, remote } => remote.print(&remote.client()?.cancel(id)?, |v| {
            format!("{}\n", remote::job_line(v))
        }),
        Command::Stop { id, drain, remote } => remote
            .print(&remote.client()?.stop(id, *drain)?, |v| {
                format!("{}\n", remote::job_line(v))
            }),
        Command::Start {
            id,
            savepoint,
            job,
            remote,
        } => {
            let client = remote.client()?;
            let started = match job {
                Some(path) => client.start_as(id, savepoint.as_deref(), path)?,
                None => client.start(id, savepoint.as_deref())?,
            };
            remote.print(&started, |v| format!("{}\n", remote::job_line(v)))
        }
        Command::Logs { id, follow, remote } => {
            let client = remote.client()?;
            if *follow {
                remote::follow_logs(&client, id, &mut std::io::stdout())?;
            } else {
                std::io::stdout().write_all(&client.logs(id)?)?;
            }
            Ok(Exit::Success)
        }
        Command::Delete { id, remote } => remote.print(&remote.client()?.delete_job(id)?, |v| {
            format!("deleted {}\n", remote::job_line(v))
        }),
        Command::Plugins { remote } => {
            remote.print(&remote.client()?.plugins()?, remote::plugin_table)
        }
        Command::DeletePlugin { plugin, remote } => remote
            .print(&remote.client()?.delete_plugin(plugin)?, |p| {
                format!("deleted plugin {} ({})\n", p.name, p.sha256)
            }),
        Command::Metrics { remote } => {
            let text = remote.client()?.metrics()?;
            if remote.json {
                let text = String::from_utf8_lossy(&text);
                print_json(&remote::metrics_json(&text).context("reading the server's metrics")?)?;
            } else {
                std::io::stdout().write_all(&text)?;
            }
            Ok(Exit::Success)
        }
        Command::Output { id, file, remote } => {
            let output = remote.client()?.output(id, file.as_deref())?;
            let mut stdout = std::io::stdout();
            // As it is into a file or a pipe; with its escapes shown, not obeyed, on a
            // terminal.
            if stdout.is_terminal() {
                stdout.write_all(crate::guest_text::for_terminal(&output).as_bytes())?;
            } else {
                stdout.write_all(&output)?;
            }
            Ok(Exit::Success)
        }
        Command::Completions { shell } => manual::completions(*shell),
        Command::Man { dir } => manual::man(dir.as_deref()),
    }
}

/// `sluice serve`: answers until SIGTERM or SIGINT, then stops the jobs with savepoints.
fn serve(cli: &Cli, host_config_path: &Path, address: Option<&str>) -> Result<Exit> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let host = host_config(Some(host_config_path))?;
    let address = address.unwrap_or(&host.server.address).to_string();
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing signal handlers")?;
    // Answering first (`/livez`; `/readyz` and the API answer 503 meanwhile), then
    // resuming the jobs, which can take a while.
    let server = Server::load(host, engine(cli)?)?;
    server.use_workers(worker_command(cli, host_config_path)?)?;
    let running = crate::server::serve(server.clone(), &address)?;
    out!("sluice: serving {}", running.url());
    std::io::stdout().flush()?;
    server.resume_jobs()?;
    // (Not fatal: a reader of the first line alone may have closed the pipe.)
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "sluice: ready").and_then(|()| stdout.flush());
    if let Some(signal) = signals.forever().next() {
        eprintln!("sluice: stopping (signal {signal}): savepoints, then exit");
    }
    running.shutdown(Duration::from_secs(120))?;
    Ok(Exit::Success)
}

/// How `sluice serve` (and a `sluice run` of several tenants' jobs) starts its worker
/// processes: this program, with its logging and compile-cache options.
fn worker_command(
    cli: &Cli,
    host_config: &Path,
) -> Result<crate::server::worker::supervisor::WorkerCommand> {
    let mut args = vec![
        "--log".to_string(),
        cli.log.clone(),
        "--log-format".to_string(),
        match cli.log_format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
        .to_string(),
    ];
    if cli.no_cache {
        args.push("--no-cache".into());
    } else if let Some(dir) = &cli.cache_dir {
        args.push("--cache-dir".into());
        args.push(dir.display().to_string());
    }
    Ok(crate::server::worker::supervisor::WorkerCommand {
        program: std::env::current_exe().context("finding the sluice executable")?,
        args,
        host_config: host_config
            .canonicalize()
            .with_context(|| format!("finding {}", host_config.display()))?,
    })
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
