//! `sluice validate` and `sluice inspect`: what a job file or a plugin is, for people or
//! (`--json`) as one JSON document built from the types below.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::exit::{Exit, bad_input};
use super::{Cli, engine, host_config, print_json};
use crate::job::{Job, JobGraph, Vertex};
use crate::network::CheckpointingMode;
use crate::wasm::{Plugin, supported_version};

/// A job file that passed `validate`: the tasks it would run, its operators' plugins and
/// its checkpoints.
#[derive(Debug, Serialize)]
struct Validated {
    file: String,
    valid: bool,
    job: String,
    tenant: String,
    tasks: Vec<TaskPlan>,
    operators: Vec<OperatorPlugin>,
    /// `None` when the job does not checkpoint.
    checkpoint: Option<CheckpointPlan>,
    /// With `--cluster`: its stages over several hosts.
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<Vec<crate::cluster::plan::StageView>>,
}

/// A job file that did not pass `validate`, and why.
#[derive(Debug, Serialize)]
struct Invalid {
    file: String,
    valid: bool,
    error: String,
}

/// A task (a chain of vertices) and what it reads.
#[derive(Debug, Serialize)]
struct TaskPlan {
    task: usize,
    /// `source -> tokenize`.
    name: String,
    parallelism: u32,
    inputs: Vec<TaskInput>,
}

/// An edge into a task.
#[derive(Debug, Serialize)]
struct TaskInput {
    /// The task that sends.
    from_task: usize,
    /// The vertex that sends (`window.side:late` for a side output).
    from: String,
    /// How records are spread (`forward`, `hash`, `rebalance`, `broadcast`).
    partitioner: String,
    /// The vertex that receives, and which of its inputs.
    into: String,
    input: u32,
}

/// An operator and the component it runs.
#[derive(Debug, Serialize)]
struct OperatorPlugin {
    operator: String,
    plugin: String,
    size: u64,
    interface: String,
}

/// How the job checkpoints.
#[derive(Debug, Serialize)]
struct CheckpointPlan {
    interval_ms: u128,
    /// `exactly-once` or `at-least-once`.
    mode: &'static str,
    dir: String,
}

/// `sluice validate`.
pub(super) fn validate(
    cli: &Cli,
    path: &Path,
    host_config_path: Option<&Path>,
    json: bool,
    cluster: Option<&str>,
) -> Result<Exit> {
    let checked = host_config(host_config_path).and_then(|host| {
        let job = Job::load_with(path, &*engine(cli)?, &host).map_err(bad_input)?;
        job.check_open()
            .with_context(|| format!("{}", path.display()))
            .map_err(bad_input)?;
        let stages = match cluster {
            Some(bootstrap) => {
                let settings = super::cluster_settings(path, job.graph(), Some(bootstrap), &host)?;
                let plan = crate::cluster::Plan::new(job.graph(), &settings)
                    .with_context(|| format!("{}", path.display()))
                    .map_err(bad_input)?;
                Some(plan.view())
            }
            None => None,
        };
        Ok((job, stages))
    });
    let (job, stages) = match checked {
        Ok(checked) => checked,
        Err(e) if json => {
            print_json(&Invalid {
                file: path.display().to_string(),
                valid: false,
                error: format!("{e:#}"),
            })?;
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let validated = describe_job(path, &job, stages);
    if json {
        print_json(&validated)?;
        return Ok(Exit::Success);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "job '{}' (tenant '{}') is valid",
        validated.job, validated.tenant
    )?;
    for task in &validated.tasks {
        writeln!(
            out,
            "  task {}: {} x{}",
            task.task, task.name, task.parallelism
        )?;
        for input in &task.inputs {
            writeln!(
                out,
                "    <- task {} '{}' ({}) into {} input {}",
                input.from_task, input.from, input.partitioner, input.into, input.input
            )?;
        }
    }
    for op in &validated.operators {
        writeln!(
            out,
            "  operator '{}': {} ({} bytes, {})",
            op.operator, op.plugin, op.size, op.interface
        )?;
    }
    match &job.graph().checkpoint {
        Some(c) => writeln!(
            out,
            "  checkpoints every {:?} ({:?}) in {}",
            c.interval,
            c.mode,
            c.dir.display()
        )?,
        None => writeln!(out, "  checkpoints: off")?,
    }
    if let Some(stages) = &validated.cluster {
        let units = stages.last().map_or(0, |s| s.units.1 + 1);
        writeln!(
            out,
            "  over several hosts: {units} units in {} stages",
            stages.len()
        )?;
        for s in stages {
            let reads = match &s.reads[..] {
                [one] => one.clone(),
                [first, .., last] => format!("{first} .. {last}"),
                [] => String::new(),
            };
            let units = match s.units {
                (first, last) if first == last => format!("unit {first}"),
                (first, last) => format!("units {first}-{last}"),
            };
            // (A stage of a source alone runs nothing: it hands its records on.)
            let path: Vec<&str> = s
                .runs
                .iter()
                .map(String::as_str)
                .chain([s.writes.as_str()])
                .collect();
            writeln!(
                out,
                "    stage {}: {units}, one each of {reads} -> {} (checkpoints at +{} ms)",
                s.stage,
                path.join(" -> "),
                s.checkpoint_phase_ms
            )?;
        }
    }
    Ok(Exit::Success)
}

fn describe_job(
    path: &Path,
    job: &Job,
    cluster: Option<Vec<crate::cluster::plan::StageView>>,
) -> Validated {
    let graph: &JobGraph = job.graph();
    let tasks = graph
        .chains
        .iter()
        .enumerate()
        .map(|(i, chain)| TaskPlan {
            task: i,
            name: chain.name(graph),
            parallelism: chain.parallelism,
            inputs: chain
                .inputs
                .iter()
                .map(|edge| {
                    let tail = *graph.chains[edge.from]
                        .vertices
                        .last()
                        .expect("a chain has vertices");
                    let tail = graph.vertices[tail].name();
                    TaskInput {
                        from_task: edge.from,
                        from: match &edge.side {
                            Some(side) => format!("{tail}.side:{side}"),
                            None => tail.to_string(),
                        },
                        partitioner: edge.partitioner.name().to_string(),
                        into: graph.vertices[chain.vertices[0]].name().to_string(),
                        input: edge.input,
                    }
                })
                .collect(),
        })
        .collect();
    let operators = graph
        .vertices
        .iter()
        .filter_map(|v| match v {
            Vertex::Operator(o) => Some(o),
            _ => None,
        })
        .map(|o| {
            let plugin = &job.plugins()[&o.name];
            OperatorPlugin {
                operator: o.name.clone(),
                plugin: plugin.path.display().to_string(),
                size: plugin.size,
                interface: plugin.info.interface.clone(),
            }
        })
        .collect();
    Validated {
        file: path.display().to_string(),
        valid: true,
        job: graph.name.clone(),
        tenant: graph.tenant.clone(),
        tasks,
        operators,
        checkpoint: graph.checkpoint.as_ref().map(|c| CheckpointPlan {
            interval_ms: c.interval.as_millis(),
            mode: match c.mode {
                CheckpointingMode::ExactlyOnce => "exactly-once",
                CheckpointingMode::AtLeastOnce => "at-least-once",
            },
            dir: c.dir.display().to_string(),
        }),
        cluster,
    }
}

/// What `sluice inspect` shows about a component.
#[derive(Debug, Serialize)]
struct Inspected {
    file: String,
    size: u64,
    sha256: String,
    world: &'static str,
    /// The operator interface versions this host runs.
    host_supports: String,
    exports: String,
    calls: Vec<String>,
    types: Vec<String>,
    imports: Vec<String>,
    /// `None` when the plugin does not declare them.
    config_keys: Option<Vec<String>>,
    /// Where the compiled code came from: `Compiled` now, the `Disk` cache or `Memory`.
    compiled: String,
}

/// `sluice inspect`.
pub(super) fn inspect(cli: &Cli, path: &Path, json: bool) -> Result<Exit> {
    let engine = engine(cli)?;
    let plugin = Plugin::load(&engine, path, false).map_err(bad_input)?;
    let p = Inspected {
        file: plugin.path.display().to_string(),
        size: plugin.size,
        sha256: plugin.digest.clone(),
        world: "sluice:operator/operator",
        host_supports: supported_version(),
        exports: plugin.info.interface.clone(),
        calls: plugin.info.calls.clone(),
        types: plugin.info.types.clone(),
        imports: plugin.info.imports.clone(),
        config_keys: plugin.info.config_keys.clone(),
        compiled: format!("{:?}", plugin.compiled),
    };
    if json {
        print_json(&p)?;
        return Ok(Exit::Success);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "file:      {}", p.file)?;
    writeln!(out, "size:      {} bytes", p.size)?;
    writeln!(out, "sha256:    {}", p.sha256)?;
    writeln!(
        out,
        "world:     {} (host supports {})",
        p.world, p.host_supports
    )?;
    writeln!(out, "exports:   {}", p.exports)?;
    writeln!(out, "calls:     {}", p.calls.join(", "))?;
    writeln!(out, "types:     {}", p.types.join(", "))?;
    writeln!(out, "imports:   {}", p.imports.join(", "))?;
    match &p.config_keys {
        Some(keys) if keys.is_empty() => {
            writeln!(out, "config:    none (it takes no config keys)")?
        }
        Some(keys) => writeln!(out, "config:    {}", keys.join(", "))?,
        None => writeln!(
            out,
            "config:    not declared (the SDK's `config_keys!` declares them)"
        )?,
    }
    writeln!(out, "compiled:  {}", p.compiled)?;
    Ok(Exit::Success)
}
