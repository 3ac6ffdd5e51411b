//! One job over several hosts, with Kafka as the distributed engine (after Kafka
//! Streams): no cluster manager of Sluice's own.
//!
//! - The job is cut into **stages** at every keyed edge ([`plan`]); between two stages an
//!   **exchange topic** with one partition per key group, so keyed state moves with its
//!   partition and is never re-hashed. A **unit** is one source partition or one exchange
//!   partition with its stage's chain of operators; each runs as a job of its own at
//!   parallelism 1, with today's tasks, barriers and checkpoints.
//! - **Membership**: every host joins the job's consumer group on a control topic with
//!   one partition per unit (cooperative-sticky assignment); owning a partition is
//!   running that unit. A host that stops heartbeating loses its units after the session
//!   timeout.
//! - **State**: a unit copies each completed checkpoint to the store every host reads
//!   ([`store`]) before its sink commits that checkpoint's transaction, whose marker
//!   names the checkpoint. A new owner first fences the old one (`init_transactions` of
//!   the unit's transactional id), then restores the checkpoint the last committed
//!   marker names: its output and its input offsets agree, so nothing is lost or written
//!   twice ([`unit`]). A marker whose checkpoint is lost stops the unit with an error
//!   that says so, until the checkpoint is back or the unit is reset by hand ([`reset`]).
//! - **Event time** crosses exchange topics: each producer writes its watermark to every
//!   partition it feeds, with the checkpoint's transaction; a reader takes the smallest
//!   over all producers, and the end of input (`i64::MAX`) from all of them ends its own.

pub mod gc;
pub mod plan;
pub mod reset;
pub mod settings;
pub mod store;
pub mod unit;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

pub use plan::Plan;
pub use reset::{ResetTo, reset_unit};
pub use settings::ClusterSettings;
use store::CheckpointStore;
pub use unit::LostCheckpoint;
use unit::{UnitContext, UnitEnd};

use crate::job::{JobControl, JobGraph, UnitMonitors};
use crate::tenant::{HostConfig, InstanceBudget};
use crate::wasm::WasmEngine;

/// How long an admin or metadata request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How soon a failed unit this host still owns runs again: after the first failure,
/// doubling with each one after, up to the longest.
const RESTART_DELAY: Duration = Duration::from_secs(1);
const LONGEST_RESTART_DELAY: Duration = Duration::from_secs(60);

/// How often the host looks at the store for units that finished.
const FINISHED_CHECK: Duration = Duration::from_secs(1);

/// How often a host asks who in its job's group runs which units (for its view), and
/// how long it waits for the answer.
const GROUP_CHECK: Duration = Duration::from_secs(5);
const GROUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A unit running on this host.
struct Running {
    control: Sender<JobControl>,
    thread: JoinHandle<UnitEnd>,
    cancelled: bool,
}

/// How a host's run of a cluster job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostEnd {
    /// Every unit of the job finished (on this host or another).
    JobFinished,
    /// Asked to stop; its units move to the other hosts.
    Stopped,
}

/// What a host of a cluster job is doing, for whoever watches it (the server's API).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostView {
    /// The host's name in the job's group.
    pub client_id: String,
    /// Units of the job, in all stages.
    pub units: u32,
    /// The units the group gave this host.
    pub owned: Vec<u32>,
    /// The units running here now.
    pub running: Vec<u32>,
    /// The units known to have finished (here or on another host).
    pub finished: Vec<u32>,
    /// Runs of units that failed here (each runs again after a delay).
    pub failures: u64,
    /// Why the last of them failed: the unit, what it runs, and the error.
    pub last_failure: Option<String>,
    /// Every host in the job's group and the units it runs, as the group said last
    /// (asked every few seconds).
    #[serde(default)]
    pub members: Vec<ClusterMember>,
}

/// A host of a cluster job.
pub struct ClusterHost {
    units: UnitContext,
    /// This host's name in the group (`sluice-HOSTNAME-PID`, then `.N` for the N-th
    /// host of a job in the same process).
    pub client_id: String,
    /// Whether to print what happens (units gained, finished, failed) on stderr rather
    /// than log it.
    print: bool,
    view: Arc<Mutex<HostView>>,
}

impl ClusterHost {
    /// Plans `graph` over the cluster, and makes the topics it needs (checking those that
    /// exist fit the plan).
    pub fn new(
        graph: &JobGraph,
        settings: ClusterSettings,
        engine: Arc<WasmEngine>,
        host: Arc<HostConfig>,
    ) -> Result<Self> {
        let plan = Plan::new(graph, &settings)?;
        let store = CheckpointStore::open(&settings.checkpoints, &graph.base_dir)?;
        // Hosts in one process (jobs of a server) each need a name of their own.
        static HOSTS: AtomicU32 = AtomicU32::new(0);
        let mut client_id = format!("sluice-{}-{}", host_name(), std::process::id());
        match HOSTS.fetch_add(1, Ordering::Relaxed) {
            0 => {}
            n => client_id.push_str(&format!(".{}", n + 1)),
        }
        let view = HostView {
            client_id: client_id.clone(),
            units: plan.units(),
            ..HostView::default()
        };
        let this = ClusterHost {
            client_id: client_id.clone(),
            print: true,
            view: Arc::new(Mutex::new(view)),
            units: UnitContext {
                plan: Arc::new(plan),
                settings: Arc::new(settings),
                store: Arc::new(store),
                engine,
                host,
                budget: InstanceBudget::default(),
                client_id,
                monitors: UnitMonitors::default(),
            },
        };
        this.make_topics()
            .with_context(|| format!("job '{}': the cluster's topics", graph.name))?;
        Ok(this)
    }

    /// Counts the units' operator instances, and what they make the host hold, against
    /// `budget` (shared with the other jobs of a server).
    pub fn with_budget(mut self, budget: InstanceBudget) -> Self {
        self.units.budget = budget;
        self
    }

    /// Logs what happens rather than printing it on stderr (a server's job log).
    pub fn quiet(mut self) -> Self {
        self.print = false;
        self
    }

    /// What the host is doing, kept current while it runs.
    pub fn view(&self) -> Arc<Mutex<HostView>> {
        self.view.clone()
    }

    /// The monitors of the units this host runs, or ran and finished.
    pub fn unit_monitors(&self) -> UnitMonitors {
        self.units.monitors.clone()
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.units.plan
    }

    /// Prints `message` on stderr, or logs it when quiet.
    fn say(&self, message: std::fmt::Arguments<'_>) {
        if self.print {
            eprintln!("{message}");
        } else {
            tracing::info!("{message}");
        }
    }

    /// Creates the control topic and the exchange topics if missing; checks their
    /// partitions.
    fn make_topics(&self) -> Result<()> {
        let plan = &self.units.plan;
        let mut wanted = vec![(plan.control_topic.clone(), plan.units())];
        wanted.extend(plan.exchange_topics());
        let admin: AdminClient<DefaultClientContext> = self
            .units
            .settings
            .client()
            .create()
            .context("creating a Kafka admin client")?;
        let topics: Vec<NewTopic<'_>> = wanted
            .iter()
            // Exchange topics keep every record until the job's topics are deleted: a
            // reader restored far behind must find its offsets (a trimmed log would
            // skip records silently).
            .map(|(t, p)| {
                NewTopic::new(t, *p as i32, TopicReplication::Fixed(-1))
                    .set("retention.ms", "-1")
                    .set("retention.bytes", "-1")
            })
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let results = block_on(admin.create_topics(&topics, &options))
            .context("creating the job's topics")?;
        for result in results {
            if let Err((topic, code)) = result
                && code != RDKafkaErrorCode::TopicAlreadyExists
            {
                bail!("creating topic {topic:?}: {code}");
            }
        }
        let consumer: BaseConsumer = self
            .units
            .settings
            .client()
            .create()
            .context("creating a Kafka client to read the topics")?;
        for (topic, partitions) in &wanted {
            // A topic just made may take a moment to show in the metadata.
            let deadline = Instant::now() + REQUEST_TIMEOUT;
            let found = loop {
                let metadata = consumer
                    .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
                    .with_context(|| format!("reading topic {topic:?}"))?;
                let topic_metadata = metadata.topics().first();
                let found = topic_metadata
                    .filter(|t| t.error().is_none())
                    .map_or(0, |t| t.partitions().len() as u32);
                if found > 0 {
                    break found;
                }
                if Instant::now() > deadline {
                    match topic_metadata.and_then(|t| t.error()) {
                        Some(e) => bail!(
                            "topic {topic:?}: {}",
                            rdkafka::error::KafkaError::MetadataFetch(e.into())
                        ),
                        None => bail!("topic {topic:?} has no partitions yet"),
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            if found != *partitions {
                bail!(
                    "topic {topic:?} has {found} partitions where the job needs {partitions}: \
                     it was made for another shape of the job (its source's partitions or \
                     `exchange_partitions` changed); a changed job needs a new name"
                );
            }
        }
        Ok(())
    }

    /// Joins the job's group and runs the units it is given until every unit of the job
    /// finished or anything arrives on `stop`. Whatever ends it, the units running here
    /// are stopped before it returns.
    pub fn run(&self, stop: &Receiver<JobControl>) -> Result<HostEnd> {
        let mut running: BTreeMap<u32, Running> = BTreeMap::new();
        let end = self.serve(stop, &mut running);
        for r in running.values() {
            let _ = r.control.send(JobControl::Cancel);
        }
        for (_, r) in running {
            let _ = r.thread.join();
        }
        end
    }

    fn serve(
        &self,
        stop: &Receiver<JobControl>,
        running: &mut BTreeMap<u32, Running>,
    ) -> Result<HostEnd> {
        let settings = &self.units.settings;
        let plan = &self.units.plan;
        let session = settings.session_timeout.as_millis().to_string();
        let heartbeat = (settings.session_timeout.as_millis() / 4)
            .max(100)
            .to_string();
        let consumer: BaseConsumer = settings
            .client()
            .set("group.id", &plan.group)
            .set("client.id", &self.client_id)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", &session)
            .set("heartbeat.interval.ms", &heartbeat)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "latest")
            .create()
            .context("creating the membership consumer")?;
        consumer
            .subscribe(&[&plan.control_topic])
            .context("joining the job's group")?;
        self.say(format_args!(
            "host {} joined job '{}' ({} units in {} stages) at {}",
            self.client_id,
            plan.graph.name,
            plan.units(),
            plan.stages.len(),
            settings.bootstrap
        ));
        let mut finished: BTreeSet<u32> = BTreeSet::new();
        // Failed units: when each may run again, and how many times it failed in a row.
        let mut retry_at: BTreeMap<u32, (Instant, u32)> = BTreeMap::new();
        let fail = |retry_at: &mut BTreeMap<u32, (Instant, u32)>, unit: u32, why: String| {
            {
                let mut view = self.view.lock();
                view.failures += 1;
                view.last_failure = Some(why);
            }
            let failures = retry_at.get(&unit).map_or(0, |(_, n)| *n) + 1;
            let delay = RESTART_DELAY
                .saturating_mul(1 << (failures - 1).min(6))
                .min(LONGEST_RESTART_DELAY);
            retry_at.insert(unit, (Instant::now() + delay, failures));
        };
        let mut owned_before: BTreeSet<u32> = BTreeSet::new();
        let mut last_check = Instant::now() - FINISHED_CHECK;
        // Dropped when the loop ends: stops the watch.
        let _watching = self.watch_group()?;
        let end = loop {
            if stop.try_recv().is_ok() {
                break HostEnd::Stopped;
            }
            // Polling drives the group's heartbeats and rebalances.
            if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
                tracing::warn!("job '{}': membership: {e}", plan.graph.name);
            }
            let owned: BTreeSet<u32> = consumer
                .assignment()
                .map(|tpl| {
                    tpl.elements()
                        .iter()
                        .filter(|e| e.topic() == plan.control_topic)
                        .map(|e| e.partition() as u32)
                        .collect()
                })
                .unwrap_or_default();
            if owned != owned_before {
                self.say(format_args!(
                    "host {} owns units {:?}",
                    self.client_id,
                    owned.iter().collect::<Vec<_>>()
                ));
                owned_before = owned.clone();
            }
            // Units that ended.
            let ended: Vec<u32> = running
                .iter()
                .filter(|(_, r)| r.thread.is_finished())
                .map(|(u, _)| *u)
                .collect();
            for unit in ended {
                let r = running.remove(&unit).expect("listed");
                match r.thread.join() {
                    Ok(UnitEnd::Finished) => {
                        self.say(format_args!(
                            "unit {unit} finished ({})",
                            plan.describe(unit)
                        ));
                        finished.insert(unit);
                        retry_at.remove(&unit);
                    }
                    Ok(UnitEnd::Cancelled) => {}
                    Ok(UnitEnd::Failed(e)) if !r.cancelled => {
                        fail(&mut retry_at, unit, format!("{e:#}"));
                        if e.downcast_ref::<LostCheckpoint>().is_some() {
                            self.say(format_args!(
                                "unit {unit} cannot be restored (failure {} in a row; it is \
                                 tried again, and fails the same way until its checkpoint is \
                                 back or it is reset): {e:#}",
                                retry_at[&unit].1
                            ));
                        } else {
                            self.say(format_args!(
                                "unit {unit} failed (failure {} in a row; it runs again from \
                                 its last committed checkpoint): {e:#}",
                                retry_at[&unit].1
                            ));
                        }
                    }
                    // Failing after it was moved away (fenced by its new owner) is
                    // what a moved unit does.
                    Ok(UnitEnd::Failed(e)) => {
                        tracing::info!("unit {unit} ended after it moved: {e:#}")
                    }
                    Err(panic) => {
                        let what = panic
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| panic.downcast_ref::<&str>().copied())
                            .unwrap_or("no message");
                        let why = format!(
                            "unit {unit} ({}): its thread panicked: {what}",
                            plan.describe(unit)
                        );
                        fail(&mut retry_at, unit, why);
                        self.say(format_args!(
                            "unit {unit} ({}): its thread panicked: {what}",
                            plan.describe(unit)
                        ));
                    }
                }
            }
            // Units moved away.
            for (unit, r) in running.iter_mut() {
                if !owned.contains(unit) && !r.cancelled {
                    let _ = r.control.send(JobControl::Cancel);
                    r.cancelled = true;
                }
            }
            // Units to start.
            for &unit in &owned {
                if running.contains_key(&unit)
                    || finished.contains(&unit)
                    || retry_at
                        .get(&unit)
                        .is_some_and(|(at, _)| Instant::now() < *at)
                {
                    continue;
                }
                running.insert(unit, self.start(unit)?);
            }
            // A unit no longer here starts afresh wherever it goes next, and its
            // subtasks are shown there.
            retry_at.retain(|unit, _| owned.contains(unit));
            self.units
                .monitors
                .lock()
                .retain(|unit, _| owned.contains(unit) || finished.contains(unit));
            if last_check.elapsed() >= FINISHED_CHECK {
                last_check = Instant::now();
                match self.units.store.finished_units(&plan.prefix) {
                    Ok(done) => finished.extend(done),
                    Err(e) => tracing::warn!("job '{}': {e:#}", plan.graph.name),
                }
                if finished.len() as u32 == plan.units() {
                    break HostEnd::JobFinished;
                }
            }
            {
                let mut view = self.view.lock();
                view.owned = owned.iter().copied().collect();
                view.running = running.keys().copied().collect();
                view.finished = finished.iter().copied().collect();
            }
        };
        consumer.unsubscribe();
        Ok(end)
    }

    /// Starts a thread that asks the job's group who runs which units, every
    /// [`GROUP_CHECK`], into this host's view (with a client of its own: the host's loop
    /// never waits for the answer); it stops once the returned sender is dropped.
    fn watch_group(&self) -> Result<Sender<()>> {
        let (watching, stop) = crossbeam_channel::bounded::<()>(0);
        let consumer: BaseConsumer = self
            .units
            .settings
            .client()
            .create()
            .context("creating a client to watch the job's group")?;
        let plan = self.units.plan.clone();
        let view = self.view.clone();
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name("group watch".into())
            .spawn(move || {
                let _span = span.enter();
                loop {
                    match group_members(&consumer, &plan, GROUP_TIMEOUT) {
                        Ok((_, members)) => view.lock().members = members,
                        Err(e) => tracing::debug!("job '{}': {e:#}", plan.graph.name),
                    }
                    match stop.recv_timeout(GROUP_CHECK) {
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                        _ => break,
                    }
                }
            })
            .context("starting the thread that watches the job's group")?;
        Ok(watching)
    }

    fn start(&self, unit: u32) -> Result<Running> {
        let (control, control_rx) = crossbeam_channel::unbounded();
        let units = self.units.clone();
        // The unit's log lines belong where the host's do (a server job's log).
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name(format!("unit {unit}"))
            .spawn(move || span.in_scope(|| units.run(unit, &control_rx)))
            .context("starting a unit's thread")?;
        Ok(Running {
            control,
            thread,
            cancelled: false,
        })
    }
}

/// What `sluice status --cluster` shows: the members of a cluster job's group and the
/// units each owns, and the units that finished. Printed as it is (`Display`) or as
/// JSON.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClusterStatus {
    /// The job's name.
    pub job: String,
    /// The Kafka brokers asked.
    pub bootstrap: String,
    /// Units of the job.
    pub units: u32,
    /// Stages of the job.
    pub stages: usize,
    /// The state of the job's consumer group, when there is one (`Stable`, ...).
    pub group_state: Option<String>,
    /// The hosts in the group.
    pub hosts: Vec<ClusterMember>,
    /// Units whose input ended and whose output is committed.
    pub finished_units: Vec<u32>,
    /// Units neither finished nor run by a host.
    pub waiting_units: Vec<u32>,
}

/// A host of a cluster job, as its group knows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterMember {
    /// Its client id (`sluice-HOSTNAME-PID`).
    pub client_id: String,
    /// Where it connects from.
    pub host: String,
    /// The units it runs.
    pub units: Vec<ClusterUnit>,
}

/// A unit a host runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterUnit {
    /// Its number.
    pub unit: u32,
    /// Its stage, input and operators (`stage 0: words/1 -> count -> sink`).
    pub runs: String,
}

impl std::fmt::Display for ClusterStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "job '{}' at {}: {} units in {} stages, {} hosts{}",
            self.job,
            self.bootstrap,
            self.units,
            self.stages,
            self.hosts.len(),
            self.group_state
                .as_ref()
                .map_or(String::new(), |s| format!(" (group {s})"))
        )?;
        for host in &self.hosts {
            writeln!(
                f,
                "host {} ({}): {} units",
                host.client_id,
                host.host,
                host.units.len()
            )?;
            for u in &host.units {
                writeln!(f, "  unit {}: {}", u.unit, u.runs)?;
            }
        }
        writeln!(f, "finished units: {:?}", self.finished_units)?;
        if !self.waiting_units.is_empty() {
            writeln!(f, "units no host runs: {:?}", self.waiting_units)?;
        }
        Ok(())
    }
}

/// Asks the job's group and checkpoint store who runs what (`sluice status --cluster`).
pub fn status(graph: &JobGraph, settings: ClusterSettings) -> Result<ClusterStatus> {
    let plan = Plan::new(graph, &settings)?;
    let store = CheckpointStore::open(&settings.checkpoints, &graph.base_dir)?;
    let consumer: BaseConsumer = settings
        .client()
        .create()
        .context("creating a Kafka client")?;
    let (group_state, hosts) = group_members(&consumer, &plan, REQUEST_TIMEOUT)?;
    let owned: BTreeSet<u32> = hosts
        .iter()
        .flat_map(|h| h.units.iter().map(|u| u.unit))
        .collect();
    let done = store.finished_units(&plan.prefix)?;
    Ok(ClusterStatus {
        job: graph.name.clone(),
        bootstrap: settings.bootstrap.clone(),
        units: plan.units(),
        stages: plan.stages.len(),
        group_state,
        hosts,
        finished_units: done.iter().copied().collect(),
        waiting_units: (0..plan.units())
            .filter(|u| !done.contains(u) && !owned.contains(u))
            .collect(),
    })
}

/// The state of the job's group (`Stable`, …) when there is one, and its members with
/// the units each was given, asked of the brokers within `timeout`.
fn group_members(
    consumer: &BaseConsumer,
    plan: &Plan,
    timeout: Duration,
) -> Result<(Option<String>, Vec<ClusterMember>)> {
    let groups = consumer
        .fetch_group_list(Some(&plan.group), timeout)
        .context("reading the job's group")?;
    let group = groups.groups().first();
    let mut hosts = Vec::new();
    for m in group.map_or(&[][..], |g| g.members()) {
        let units = m
            .assignment()
            .map(|a| assigned_partitions(a, &plan.control_topic))
            .transpose()
            .map_err(|e| anyhow!("member {}: {e}", m.client_id()))?
            .unwrap_or_default();
        hosts.push(ClusterMember {
            client_id: m.client_id().to_string(),
            host: m.client_host().to_string(),
            units: units
                .into_iter()
                .map(|unit| ClusterUnit {
                    unit,
                    runs: plan.describe(unit),
                })
                .collect(),
        });
    }
    Ok((group.map(|g| g.state().to_string()), hosts))
}

/// The partitions of `topic` in a consumer group member's assignment (Kafka's
/// `ConsumerProtocolAssignment`: version, then topics with their partitions).
pub fn assigned_partitions(assignment: &[u8], topic: &str) -> Result<Vec<u32>> {
    let mut r = Reader(assignment);
    let _version = r.i16()?;
    let mut out = Vec::new();
    for _ in 0..r.i32()?.max(0) {
        let name = r.string()?;
        for _ in 0..r.i32()?.max(0) {
            let p = r.i32()?;
            if name == topic {
                out.push(p as u32);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.0.len() < n {
            bail!("a truncated assignment");
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn i16(&mut self) -> Result<i16> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into()?))
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into()?))
    }
    fn string(&mut self) -> Result<String> {
        let len = self.i16()?.max(0) as usize;
        Ok(String::from_utf8_lossy(self.take(len)?).into_owned())
    }
}

/// This machine's name, for the host's name in the group.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into())
}

/// Runs a future of the admin client (driven by librdkafka's own thread) to its end.
fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
        .block_on(future)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `sluice status --cluster` prints, as text and as JSON.
    #[test]
    fn a_cluster_status_reads_as_text_and_as_json() {
        let status = ClusterStatus {
            job: "wc".into(),
            bootstrap: "k:9092".into(),
            units: 3,
            stages: 2,
            group_state: Some("Stable".into()),
            hosts: vec![ClusterMember {
                client_id: "sluice-a-1".into(),
                host: "/10.0.0.1".into(),
                units: vec![ClusterUnit {
                    unit: 1,
                    runs: "stage 0: words/1 -> tokenize".into(),
                }],
            }],
            finished_units: vec![0],
            waiting_units: vec![2],
        };
        assert_eq!(
            status.to_string(),
            "job 'wc' at k:9092: 3 units in 2 stages, 1 hosts (group Stable)\n\
             host sluice-a-1 (/10.0.0.1): 1 units\n  \
             unit 1: stage 0: words/1 -> tokenize\n\
             finished units: [0]\n\
             units no host runs: [2]\n"
        );
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["hosts"][0]["units"][0]["unit"], 1);
        assert_eq!(json["group_state"], "Stable");
        assert_eq!(json["waiting_units"], serde_json::json!([2]));
    }

    #[test]
    fn assignments_are_read_as_kafka_writes_them() {
        let mut a = Vec::new();
        a.extend(1i16.to_be_bytes());
        a.extend(2i32.to_be_bytes());
        for (topic, parts) in [("other", &[7i32][..]), ("job.units", &[4, 1])] {
            a.extend((topic.len() as i16).to_be_bytes());
            a.extend(topic.as_bytes());
            a.extend((parts.len() as i32).to_be_bytes());
            for p in parts {
                a.extend(p.to_be_bytes());
            }
        }
        a.extend((-1i32).to_be_bytes()); // no user data
        assert_eq!(assigned_partitions(&a, "job.units").unwrap(), [1, 4]);
        assert!(assigned_partitions(&a[..9], "job.units").is_err());
    }
}
