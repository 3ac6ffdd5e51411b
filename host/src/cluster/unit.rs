//! Running one unit of a cluster job on this host: fence whoever ran it before, find the
//! checkpoint its last committed transaction names, restore it, run (its sink writing
//! with the producer that fenced).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use crossbeam_channel::Receiver;
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;

use super::store::{AttemptTables, CheckpointStore, finished_key, unit_key};
use super::{ClusterSettings, Plan};
use crate::connectors::kafka::{fence_ahead, parse_marker_metadata, read_marker};
use crate::job::{Job, JobControl, JobMonitor, JobOutcome, RestorePoint, RunOptions, UnitMonitors};
use crate::tenant::{HostConfig, InstanceBudget};
use crate::wasm::WasmEngine;

/// How long fencing or reading a marker may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What a unit's run came to.
#[derive(Debug)]
pub enum UnitEnd {
    /// Its input ended and its output is committed (now or by an earlier owner).
    Finished,
    /// Stopped on request (the unit moved, or the host stops).
    Cancelled,
    /// Failed; runs again (here or elsewhere) from its last committed checkpoint.
    Failed(anyhow::Error),
}

/// Everything a unit's run needs from its host.
#[derive(Clone)]
pub struct UnitContext {
    /// The job's plan.
    pub plan: Arc<Plan>,
    /// The cluster settings.
    pub settings: Arc<ClusterSettings>,
    /// The checkpoint store.
    pub store: Arc<CheckpointStore>,
    /// The engine.
    pub engine: Arc<WasmEngine>,
    /// The host configuration (tenants).
    pub host: Arc<HostConfig>,
    /// What the units' instances count against (shared with a server's other jobs).
    pub budget: InstanceBudget,
    /// This host's name in the job's group.
    pub client_id: String,
    /// The monitors of the units that run or ran here, for whoever watches the host.
    pub monitors: UnitMonitors,
}

impl UnitContext {
    /// The store key of unit `unit`.
    pub fn unit_key(&self, unit: u32) -> String {
        unit_key(&self.plan.prefix, unit)
    }

    fn finished_key(&self, unit: u32) -> String {
        finished_key(&self.plan.prefix, unit)
    }

    /// Whether unit `unit` finished (its `finished` object is in the store).
    pub fn is_finished(&self, unit: u32) -> Result<bool> {
        Ok(self.store.get(&self.finished_key(unit))?.is_some())
    }

    /// Runs unit `unit` until it ends or `control` cancels it.
    pub fn run(&self, unit: u32, control: &Receiver<JobControl>) -> UnitEnd {
        match self.try_run(unit, control) {
            Ok(end) => end,
            Err(e) => {
                UnitEnd::Failed(e.context(format!("unit {unit} ({})", self.plan.describe(unit))))
            }
        }
    }

    fn try_run(&self, unit: u32, control: &Receiver<JobControl>) -> Result<UnitEnd> {
        if self.is_finished(unit)? {
            return Ok(UnitEnd::Finished);
        }
        let key = self.unit_key(unit);
        // Attempts in the store now are older than the fence below; any that appears
        // later is a newer owner's, and is left alone.
        let earlier = self.store.folders(&key)?;
        let transactional_id = format!("{}-0", self.plan.transactional_prefix(unit));
        let client = self.plan.sink_client(unit, &self.settings);
        // Moved away already: fencing would only fence its new owner.
        if let Ok(JobControl::Cancel) = control.try_recv() {
            return Ok(UnitEnd::Cancelled);
        }
        // The one fence of this start: the sink writes with the producer that fenced
        // (and never fences again), so an owner that fences this one later, however long
        // this host is stopped meanwhile, keeps it fenced.
        let sink = self.plan.unit_sink(unit, &self.settings)?;
        let _fenced = fence_ahead(sink.kafka.as_ref().expect("a unit's Kafka sink"), 0)
            .context("fencing the unit's earlier owners")?;
        crate::failpoint!("cluster::after-fence");
        // Only now, with the earlier owner fenced, does the marker stay put (until
        // another owner fences this one: the sink checks it again when it opens).
        let topic = self.plan.output_topic(unit);
        let marker = self.committed_marker(client.clone(), &transactional_id, &topic)?;
        let local = self.local_folder(unit);
        // What this host kept of earlier runs of the unit is of no use: the store has
        // what counts.
        if local.exists() {
            std::fs::remove_dir_all(&local)
                .with_context(|| format!("clearing {}", local.display()))?;
        }
        let restore = match &marker {
            Some((attempt, id)) => {
                let marker = Marker {
                    group: &transactional_id,
                    topic: &topic,
                    attempt,
                    id: *id,
                };
                Some(self.fetch(unit, &marker, client, &local)?)
            }
            None => None,
        };
        // Checkpoints of earlier attempts but the one restored can never be restored:
        // none of their transactions is the last committed one, and their producers are
        // fenced.
        for old in earlier {
            if marker.as_ref().is_none_or(|(a, _)| *a != old) {
                self.store.delete(&format!("{key}/{old}"))?;
            }
        }
        crate::failpoint!("cluster::after-delete-attempts");
        let attempt = new_attempt_id();
        let graph = self.plan.unit_graph(
            unit,
            &self.settings,
            &local.join(&attempt),
            &format!("attempt={attempt}"),
            marker.map(|(a, id)| (format!("attempt={a}"), id)),
        )?;
        let store = self.store.clone();
        let attempt_key = format!("{key}/{attempt}");
        let tables = parking_lot::Mutex::new(AttemptTables::default());
        let job = Job::from_graph(graph, &self.engine, &self.host)?
            .with_budget(self.budget.clone())
            .with_checkpoint_hook(Arc::new(move |id: u64, folder: &Path| {
                store.save_checkpoint(&attempt_key, id, folder, &mut tables.lock())
            }));
        match &restore {
            Some(folder) => tracing::info!(
                "unit {unit} ({}): restoring {} as attempt {attempt}",
                self.plan.describe(unit),
                folder.display()
            ),
            None => tracing::info!(
                "unit {unit} ({}): starting as attempt {attempt}",
                self.plan.describe(unit)
            ),
        }
        // Moved away while fencing or copying: no need to open.
        if let Ok(JobControl::Cancel) = control.try_recv() {
            let _ = std::fs::remove_dir_all(&local);
            return Ok(UnitEnd::Cancelled);
        }
        let options = RunOptions {
            restore: restore.map_or(RestorePoint::Fresh, RestorePoint::Path),
            move_aside: false,
            allow_rewind: false,
            allow_non_restored_state: false,
        };
        // (Kept after the run ends, so a finished unit's subtasks show what they did,
        // until the unit runs again or leaves this host.)
        let monitor = Arc::new(JobMonitor::default());
        self.monitors.lock().insert(unit, monitor.clone());
        let report = job.run(options, control, &monitor);
        // The local folder only stages checkpoints for the store.
        let _ = std::fs::remove_dir_all(&local);
        Ok(match report?.outcome {
            JobOutcome::Finished => {
                self.store.put(
                    &self.finished_key(unit),
                    format!("attempt={attempt}").into_bytes(),
                )?;
                UnitEnd::Finished
            }
            JobOutcome::Cancelled | JobOutcome::Stopped { .. } => UnitEnd::Cancelled,
        })
    }

    /// Copies the checkpoint `marker` names from the store into `local` and checks it
    /// (every file its metadata lists, whole); returns its folder. When it is missing or
    /// incomplete, fails with [`LostCheckpoint`] — unless the marker moved meanwhile
    /// (another host owns the unit now, and may have deleted what this one read).
    fn fetch(
        &self,
        unit: u32,
        marker: &Marker<'_>,
        client: ClientConfig,
        local: &Path,
    ) -> Result<PathBuf> {
        let (attempt, id) = (marker.attempt, marker.id);
        let key = format!("{}/{attempt}/{id}", self.unit_key(unit));
        let folder = local.join(format!("restore-{attempt}-{id}"));
        let attempt_key = format!("{}/{attempt}", self.unit_key(unit));
        let fetched = self
            .store
            .download_checkpoint(&key, &folder)
            .and_then(|found| {
                Ok(match found {
                    true => Some(self.store.download_shared_files(&attempt_key, &folder)?),
                    false => None,
                })
            });
        let problem = match fetched {
            Ok(Some(Err(missing))) => missing,
            Ok(Some(Ok(()))) => match crate::checkpoint::load(&folder) {
                Ok(_) => return Ok(folder),
                // Named as the store has it, not as this host copied it.
                Err(e) => format!("{e:#}")
                    .replace(&folder.display().to_string(), &self.store.describe(&key)),
            },
            Ok(None) => format!(
                "{} is missing",
                self.store
                    .describe(&format!("{key}/{}", super::store::METADATA))
            ),
            Err(e) => {
                return Err(e.context(format!("copying checkpoint {id} of attempt {attempt}")));
            }
        };
        let now = self.committed_marker(client, marker.group, marker.topic)?;
        if now
            .as_ref()
            .is_none_or(|(a, i)| (a.as_str(), *i) != (attempt, id))
        {
            return Err(anyhow!(
                "its last committed checkpoint moved from {id} of attempt {attempt} while this \
                 host restored it ({problem}): another host runs it now"
            ));
        }
        let older = self
            .store
            .complete_checkpoints(&format!("{}/{attempt}", self.unit_key(unit)))?
            .into_iter()
            .filter(|c| *c < id)
            .collect();
        Err(LostCheckpoint {
            unit,
            group: marker.group.to_string(),
            topic: marker.topic.to_string(),
            attempt: attempt.to_string(),
            id,
            folder: self.store.describe(&key),
            problem,
            older,
        }
        .into())
    }

    /// This host's folder of unit `unit` (each host its own, even on one machine).
    fn local_folder(&self, unit: u32) -> PathBuf {
        self.settings
            .work_dir
            .join(&self.client_id)
            .join(format!("unit-{unit}"))
    }

    /// The attempt and checkpoint the unit's last committed transaction names.
    fn committed_marker(
        &self,
        mut client: ClientConfig,
        group: &str,
        topic: &str,
    ) -> Result<Option<(String, u64)>> {
        let consumer: BaseConsumer = client
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .context("creating a client of the unit's marker group")?;
        let Some((id, metadata)) = read_marker(&consumer, topic, REQUEST_TIMEOUT)
            .with_context(|| format!("reading the unit's last committed checkpoint ({group})"))?
        else {
            return Ok(None);
        };
        let attempt = parse_marker_metadata(&metadata)
            .and_then(|(_, note)| note?.strip_prefix("attempt="))
            .ok_or_else(|| {
                anyhow!("the marker of group {group} ({metadata:?}) names no attempt")
            })?;
        Ok(Some((attempt.to_string(), id)))
    }
}

/// A name for one start of a unit, unique across hosts and time.
fn new_attempt_id() -> String {
    format!("{:016x}", crate::connectors::kafka::new_run_id())
}

/// The marker a unit restores by: its group and topic, the attempt and checkpoint it
/// names.
struct Marker<'a> {
    group: &'a str,
    topic: &'a str,
    attempt: &'a str,
    id: u64,
}

/// The checkpoint a unit's last committed transaction names is not in the store, or not
/// whole (lost with a disk, deleted by hand): no host can restore the unit until it is
/// back or the unit is reset ([`reset_unit`](super::reset_unit)).
#[derive(Debug)]
pub struct LostCheckpoint {
    /// The unit.
    pub unit: u32,
    /// Its marker group (its sink's transactional id).
    pub group: String,
    /// The topic the marker is on.
    pub topic: String,
    /// The attempt the marker names.
    pub attempt: String,
    /// The checkpoint the marker names.
    pub id: u64,
    /// Where the checkpoint's folder is (or was) in the store.
    pub folder: String,
    /// What is missing or wrong.
    pub problem: String,
    /// The complete checkpoints of the same attempt older than it, oldest first.
    pub older: Vec<u64>,
}

impl std::fmt::Display for LostCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let LostCheckpoint {
            unit,
            group,
            topic,
            attempt,
            id,
            folder,
            problem,
            older,
        } = self;
        write!(
            f,
            "its last committed transaction (the marker of group {group:?} on topic \
             {topic:?}) names checkpoint {id} of attempt {attempt}, which the checkpoint \
             store does not hold whole: {problem}. No host can restore the unit until that \
             checkpoint is back in {folder} (from a backup of the store; the unit then goes \
             on by itself) or the unit is reset: "
        )?;
        if let Some(newest) = older.last() {
            let ids: Vec<String> = older.iter().map(u64::to_string).collect();
            write!(
                f,
                "`sluice reset-unit JOB.toml --unit {unit} --to {attempt}/{newest}` goes on \
                 from the newest older checkpoint of that attempt in the store (it has {}), \
                 and writes again what the unit committed after it; ",
                ids.join(", ")
            )?;
        } else {
            write!(
                f,
                "the store holds no older checkpoint of that attempt to go on from; "
            )?;
        }
        write!(
            f,
            "`sluice reset-unit JOB.toml --unit {unit} --fresh` starts the unit over, and \
             writes everything it wrote again (JOB.toml: the job file, with the hosts' \
             `--cluster` and `--host-config`)"
        )
    }
}

impl std::error::Error for LostCheckpoint {}
