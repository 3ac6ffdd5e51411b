//! Which job a job file describes on a server: the file checked against its tenant
//! (sources, sinks, checkpoints and state in the job's folder, Kafka within its grant, no
//! value read from the server's environment or files), its plugins resolved to uploads,
//! and the run it makes — on this server alone, or as its share of a job over several
//! servers.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;

use super::super::kafka_grant::{no_kafka_grant, within_kafka_grant};
use super::super::registry::Needs;
use super::super::views::output_files;
use super::super::{ApiError, ErrorKind, Server};
use crate::cluster::gc::ClusterResources;
use crate::cluster::plan::is_topic_char;
use crate::cluster::{ClusterHost, ClusterSettings, HostEnd, Plan};
use crate::job::{
    Job, JobControl, JobFile, JobGraph, JobMonitor, JobOutcome, SinkKind, SourceKind,
};
use crate::spec::values::SchemaSpec;
use crate::tenant::TenantConfig;

/// A job ready to run: on this server alone, or as this server's share of a job over
/// several servers (`[cluster]`).
pub(in crate::server) enum Run {
    Local(Box<Job>),
    Cluster(Box<ClusterRun>),
}

/// A job over several servers, as this server runs its share.
pub(in crate::server) struct ClusterRun {
    pub(super) graph: JobGraph,
    pub(super) settings: ClusterSettings,
}

impl ClusterRun {
    /// Runs this server's host of the job until the job finished on every host
    /// (`Finished`) or it is cancelled (`Cancelled`: its units move to the other hosts).
    pub(in crate::server) fn run(
        self,
        engine: Arc<crate::wasm::WasmEngine>,
        host: Arc<crate::tenant::HostConfig>,
        budget: crate::tenant::InstanceBudget,
        control: &crossbeam_channel::Receiver<JobControl>,
        monitor: &JobMonitor,
    ) -> Result<JobOutcome> {
        let host = ClusterHost::new(&self.graph, self.settings, engine, host)?
            .with_budget(budget)
            .quiet();
        monitor.follow_cluster(host.view(), host.unit_monitors());
        Ok(match host.run(control)? {
            HostEnd::JobFinished => JobOutcome::Finished,
            HostEnd::Stopped => JobOutcome::Cancelled,
        })
    }
}

impl Run {
    pub(super) fn graph(&self) -> &JobGraph {
        match self {
            Run::Local(job) => job.graph(),
            Run::Cluster(c) => &c.graph,
        }
    }

    /// The operator instances, subtasks and slots it may take on this server, and for a
    /// cluster job what it makes outside the server. A cluster job may take all of its units'
    /// (the group can give every unit to one server), so it is admitted for them all;
    /// finding its units asks the brokers for its source's partitions.
    pub(super) fn needs(&self) -> Result<(Needs, Option<ClusterResources>), ApiError> {
        let bad = |e: anyhow::Error| ApiError::bad(format!("{e:#}"));
        match self {
            Run::Local(job) => Ok((Needs::of(job.graph()), None)),
            Run::Cluster(c) => {
                let plan = Plan::new(&c.graph, &c.settings).map_err(bad)?;
                let resources = ClusterResources::of(&plan, &c.settings, &c.graph.base_dir);
                Ok((
                    units_need(&plan, &c.settings).map_err(bad)?,
                    Some(resources),
                ))
            }
        }
    }
}

/// Refuses a server job whose Kafka properties take a value from `${env:…}` or
/// `${file:…}`: those would read the server's own environment and files. A tenant's
/// secrets go in the job file (masked wherever it is shown) or in its Kafka grant in
/// the host file, whose properties may use them.
fn refuse_secret_references(file: &JobFile) -> Result<(), ApiError> {
    let sources = file.source.iter().enumerate().map(|(i, s)| {
        (
            format!("source {}", s.name.clone().unwrap_or(format!("#{}", i + 1))),
            &s.properties,
        )
    });
    let sinks = file.sink.iter().enumerate().map(|(i, s)| {
        (
            format!("sink {}", s.name.clone().unwrap_or(format!("#{}", i + 1))),
            &s.properties,
        )
    });
    let cluster = file
        .cluster
        .iter()
        .map(|c| ("[cluster]".to_string(), &c.properties));
    for (what, properties) in sources.chain(sinks).chain(cluster) {
        for (key, value) in properties.iter().flatten() {
            if crate::spec::secrets::reference(value).is_some() {
                return Err(ApiError::new(
                    ErrorKind::Forbidden,
                    format!(
                        "job.toml: {what}: property {key:?} takes its value from {value:?}, \
                         which on a server would read the server's own environment or files: \
                         give the value in the job file (it is masked wherever the file is \
                         shown), or ask for it in your Kafka grant of the host file"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A server job may name only the schema registry of its tenant's Kafka grant (checked
/// with the grant: the server would otherwise make HTTP requests to any address a tenant
/// wrote, inside its own network), without credentials (the grant's are used: a job's
/// `${env:…}` would read the server's environment), and no schema *file* (it would be read
/// from the server's own disk: a job brings its schemas' text in its job file, as
/// `sluice submit` writes them in).
fn refuse_schema_registries(file: &JobFile) -> Result<(), ApiError> {
    let credentials = |r: &Option<crate::spec::job_file::SchemaRegistrySpec>| {
        r.as_ref()
            .is_some_and(|r| r.username.is_some() || r.password.is_some())
    };
    let is_file = |s: &Option<SchemaSpec>| matches!(s, Some(SchemaSpec::File(_)));
    let endpoints = file
        .source
        .iter()
        .map(|s| {
            (
                &s.name,
                "source",
                credentials(&s.schema_registry),
                is_file(&s.schema),
                is_file(&s.key_schema),
            )
        })
        .chain(file.sink.iter().map(|s| {
            (
                &s.name,
                "sink",
                credentials(&s.schema_registry),
                is_file(&s.schema),
                is_file(&s.key_schema),
            )
        }));
    for (name, what, credentials, schema, key_schema) in endpoints {
        let name = name.as_deref().unwrap_or("(unnamed)");
        let why = match (credentials, schema, key_schema) {
            (true, _, _) => {
                "`schema_registry` may not carry a username or password in a server \
                             job: the registry's credentials are those of the tenant's Kafka \
                             grant (its `schema_registry`)"
            }
            (false, true, _) | (false, false, true) => {
                "a schema file (`schema`, `key_schema`) is \
                 not available to server jobs (the server would read a file of its own disk): \
                 `sluice submit` writes each schema file a job names into the job file it sends \
                 (`schema = { text = \"…\" }`); or leave it out, and the registry's latest \
                 schema of the topic is read with"
            }
            (false, false, false) => continue,
        };
        return Err(ApiError::new(
            ErrorKind::Forbidden,
            format!("job.toml: {what} {name}: {why}"),
        ));
    }
    Ok(())
}

/// Whether a path a job file gives would lead out of the folder the server keeps the job
/// in (absolute, or up through `..`): refused, never quietly moved inside.
fn leaves_its_folder(path: &Path) -> bool {
    path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
}

/// The operator instances, subtasks and slots of all of a plan's units.
pub(super) fn units_need(plan: &Plan, settings: &ClusterSettings) -> Result<Needs> {
    (0..plan.units())
        .map(|unit| {
            let graph = plan.unit_graph(unit, settings, Path::new("unit"), "", None)?;
            Ok(Needs::of(&graph))
        })
        .sum()
}

impl Server {
    /// Builds the job a record describes: its file as submitted, with the server's
    /// choices for plugins, checkpoints and output.
    pub(in crate::server) fn prepare(
        &self,
        tenant: &TenantConfig,
        text: &str,
        job_dir: &Path,
        plugins: &mut BTreeMap<String, String>,
    ) -> Result<(Run, Vec<String>), ApiError> {
        let shown = Path::new("job.toml");
        let mut file = JobFile::parse(text, shown).map_err(|e| ApiError::bad(format!("{e:#}")))?;
        if file.tenant != tenant.name && file.tenant != "default" {
            return Err(ApiError::new(
                ErrorKind::Forbidden,
                format!(
                    "job.toml names tenant '{}', but the token is tenant '{}'",
                    file.tenant, tenant.name
                ),
            ));
        }
        file.tenant = tenant.name.clone();
        refuse_secret_references(&file)?;
        refuse_schema_registries(&file)?;
        let grant = tenant.kafka.as_ref();
        for (i, source) in file.source.iter_mut().enumerate() {
            let name = source.name.clone().unwrap_or_else(|| format!("#{}", i + 1));
            match (source.kind, grant) {
                (SourceKind::Generator, _) => {}
                (SourceKind::Kafka, Some(grant)) => {
                    source
                        .bootstrap
                        .get_or_insert_with(|| grant.bootstrap.join(","));
                }
                (SourceKind::Kafka, None) => return Err(no_kafka_grant(tenant, "source", &name)),
                _ => {
                    return Err(ApiError::bad(format!(
                        "job.toml: source {name}: only generator and kafka sources run on a \
                         server (a file or stdin source would read the server's own files and \
                         input)"
                    )));
                }
            }
        }
        for (i, sink) in file.sink.iter_mut().enumerate() {
            let name = sink.name.clone().unwrap_or_else(|| format!("#{}", i + 1));
            match (sink.kind, grant) {
                (SinkKind::File, _) => {
                    if let Some(path) = sink.path.as_deref().filter(|p| leaves_its_folder(p)) {
                        return Err(ApiError::new(
                            ErrorKind::Forbidden,
                            format!(
                                "job.toml: sink {name}: path {:?} is outside the job's output \
                                 folder, where a server job's file sinks write (read back \
                                 with GET /v1/jobs/ID/output): give a relative path, such as \
                                 \"counts.tsv\"",
                                path.display().to_string()
                            ),
                        ));
                    }
                    let file_name = sink
                        .path
                        .as_deref()
                        .and_then(Path::file_name)
                        .filter(|n| !n.to_string_lossy().starts_with('.'))
                        .map(|n| n.to_string_lossy().into_owned())
                        .ok_or_else(|| {
                            ApiError::bad(format!("job.toml: sink {name}: `path` must name a file"))
                        })?;
                    sink.path = Some(job_dir.join("output").join(&file_name));
                }
                (SinkKind::Kafka, Some(grant)) => {
                    sink.bootstrap
                        .get_or_insert_with(|| grant.bootstrap.join(","));
                }
                (SinkKind::Kafka, None) => return Err(no_kafka_grant(tenant, "sink", &name)),
                (SinkKind::Stdout, _) => {
                    return Err(ApiError::bad(format!(
                        "job.toml: sink {name}: a server job writes to a file sink (type = \"file\"), whose \
                         output is read back with GET /v1/jobs/ID/output, or to a kafka sink",
                    )));
                }
            }
        }
        if let Some(checkpoint) = &mut file.checkpoint {
            if let Some(dir) = checkpoint.dir.as_deref().filter(|d| leaves_its_folder(d)) {
                return Err(ApiError::new(
                    ErrorKind::Forbidden,
                    format!(
                        "job.toml: [checkpoint]: dir {:?} is outside the job's folder, where \
                         the server keeps a job's checkpoints: leave `dir` out",
                        dir.display().to_string()
                    ),
                ));
            }
            checkpoint.dir = Some(job_dir.join("checkpoints"));
        }
        // RocksDB's working files stay in the job's folder, within the tenant's disk quota.
        let state = file.state.get_or_insert_with(Default::default);
        if state.dir.is_some() {
            return Err(ApiError::bad(
                "job.toml: [state]: `dir` is the server's to choose (in the job's folder)",
            ));
        }
        state.dir = Some(job_dir.join("state"));
        if let Some(spec) = &mut file.cluster {
            let Some(grant) = grant else {
                return Err(no_kafka_grant(tenant, "[cluster]", ""));
            };
            for (key, set) in [
                ("checkpoints", spec.checkpoints.is_some()),
                ("work_dir", spec.work_dir.is_some()),
            ] {
                if set {
                    return Err(ApiError::bad(format!(
                        "job.toml: [cluster]: `{key}` is the server's to choose (a tenant's \
                         checkpoint store is `checkpoints` in [tenant.{}.kafka] of the host \
                         configuration): leave it out",
                        tenant.name
                    )));
                }
            }
            let store = grant.checkpoints.clone().ok_or_else(|| {
                ApiError::new(
                    ErrorKind::Forbidden,
                    format!(
                        "job.toml: [cluster]: tenant '{}''s Kafka grant names no checkpoint \
                         store (`checkpoints` in [tenant.{}.kafka] of the host configuration), \
                         so it runs no job over several servers",
                        tenant.name, tenant.name
                    ),
                )
            })?;
            if let Some(c) = grant.id_prefix.chars().find(|c| !is_topic_char(*c)) {
                return Err(ApiError::new(
                    ErrorKind::Forbidden,
                    format!(
                        "job.toml: [cluster]: the job's topics are named under tenant '{}''s \
                         Kafka id_prefix {:?}, and a topic's name cannot hold {c:?}",
                        tenant.name, grant.id_prefix
                    ),
                ));
            }
            spec.bootstrap
                .get_or_insert_with(|| grant.bootstrap.join(","));
            spec.checkpoints = Some(store);
            spec.work_dir = Some(job_dir.join("cluster"));
        }
        for op in &mut file.operators {
            let hash = match plugins.get(&op.name) {
                Some(hash) => hash.clone(),
                None => {
                    let named = op.plugin.to_string_lossy();
                    let hash = match named.strip_prefix("sha256:") {
                        Some(hash) => hash.to_ascii_lowercase(),
                        None => self
                            .plugin_named(tenant, &named)
                            .map(|p| p.sha256)
                            .unwrap_or_default(),
                    };
                    plugins.insert(op.name.clone(), hash.clone());
                    hash
                }
            };
            op.plugin = self.plugin_path(&tenant.name, &hash).ok_or_else(|| {
                ApiError::bad(format!(
                    "job.toml: operator '{}': plugin {:?} was not uploaded by tenant '{}' \
                     (upload it first: POST /v1/plugins?name=FILE.wasm)",
                    op.name,
                    op.plugin.display().to_string(),
                    tenant.name
                ))
            })?;
        }
        let mut graph =
            JobGraph::from_file(&file, shown).map_err(|e| ApiError::bad(format!("{e:#}")))?;
        // From the validated graph: its parallelism is within bounds.
        let output = graph
            .sinks()
            .filter_map(|s| Some((s.path.as_deref()?.file_name()?, s.parallelism)))
            .flat_map(|(name, parallelism)| output_files(&name.to_string_lossy(), parallelism))
            .collect();
        if let Some(grant) = grant {
            within_kafka_grant(&mut graph, grant, &tenant.name)?;
        }
        let bad = |e: anyhow::Error| ApiError::bad(format!("{e:#}"));
        let Some(grant) = grant.filter(|_| graph.cluster.is_some()) else {
            let job = Job::from_graph(graph, &self.engine, &self.host)
                .map_err(bad)?
                .with_budget(self.budget.clone());
            return Ok((Run::Local(Box::new(job)), output));
        };
        // Its plugins load, whichever units come here.
        Job::from_graph(graph.clone(), &self.engine, &self.host).map_err(bad)?;
        // (The host file's `[cluster]` is for `sluice run --cluster`: a server's come from
        // the grant.)
        let mut settings = ClusterSettings::of(&graph, None, None).map_err(bad)?;
        settings.name_prefix = grant.id_prefix.clone();
        Ok((
            Run::Cluster(Box::new(ClusterRun { graph, settings })),
            output,
        ))
    }
}
