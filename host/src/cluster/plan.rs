//! How a job spreads over hosts: stages cut at every keyed edge, exchange topics between
//! them, and the units of work (one source partition, or one exchange partition, with its
//! chain of operators), each run by some host as a job of its own at parallelism 1.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::connectors::formats::FormatConfig;
use crate::connectors::kafka::{
    Delivery, ExchangeOutput, KafkaSinkConfig, KafkaSourceConfig, OutOfRange, StartFrom, Topics,
};
use crate::job::{
    ClusterSpec, Edge, JobGraph, OperatorVertex, RestartStrategy, SinkKind, SinkVertex,
    SourceInput, SourceVertex, Vertex,
};
use crate::network::Partitioner;
use crate::spec::limits;

/// How long a metadata request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `[cluster]` resolved, with `--cluster` applied.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// The brokers the hosts meet at.
    pub bootstrap: String,
    /// The checkpoint store (a directory or URL).
    pub checkpoints: String,
    /// Partitions of each exchange topic.
    pub exchange_partitions: u32,
    /// Kafka's `session.timeout.ms` of the hosts' membership.
    pub session_timeout: Duration,
    /// This host's local checkpoint folders.
    pub work_dir: std::path::PathBuf,
    /// Further librdkafka properties.
    pub properties: BTreeMap<String, String>,
    /// What the names of the job's topics, groups and transactional ids begin with
    /// before `sluice-JOB` (on a server, the tenant's `id_prefix`; else nothing).
    pub name_prefix: String,
}

impl ClusterSettings {
    /// The job's `[cluster]`, with `bootstrap` from the command line when given, and
    /// what the job leaves out from `machine` (the host file's `[cluster]`; its
    /// `properties` under the job's).
    pub fn of(
        graph: &JobGraph,
        bootstrap: Option<&str>,
        machine: Option<&ClusterSpec>,
    ) -> Result<Self> {
        let mut job = graph.cluster.clone().unwrap_or_default();
        // (The host file's were resolved when it was read.)
        job.properties = job
            .properties
            .map(|p| crate::spec::secrets::resolved(&p, &|path| graph.base_dir.join(path)))
            .transpose()
            .context("[cluster]")?;
        let machine = machine.cloned().unwrap_or_default();
        let properties = match (machine.properties, job.properties) {
            (Some(mut m), Some(j)) => {
                m.extend(j);
                Some(m)
            }
            (m, j) => j.or(m),
        };
        let spec = ClusterSpec {
            bootstrap: job.bootstrap.or(machine.bootstrap),
            checkpoints: job.checkpoints.or(machine.checkpoints),
            exchange_partitions: job.exchange_partitions.or(machine.exchange_partitions),
            session_timeout_ms: job.session_timeout_ms.or(machine.session_timeout_ms),
            work_dir: job.work_dir.or(machine.work_dir),
            properties,
        };
        let bootstrap = bootstrap
            .map(str::to_string)
            .or(spec.bootstrap)
            .filter(|b| !b.trim().is_empty())
            .ok_or_else(|| {
                anyhow!(
                    "no Kafka brokers to meet at: pass --cluster HOST:PORT or set `[cluster] \
                     bootstrap` (in the job file, or the host file's)"
                )
            })?;
        let checkpoints = spec
            .checkpoints
            .filter(|c| !c.trim().is_empty())
            .ok_or_else(|| {
                anyhow!(
                    "`[cluster] checkpoints` is missing (in the job file, or the host file's): \
                     the storage every host reads the units' checkpoints from (a shared \
                     directory, or s3://, gs://, az://)"
                )
            })?;
        let exchange_partitions = limits::EXCHANGE_PARTITIONS
            .resolve(spec.exchange_partitions)
            .map_err(|e| anyhow!("[cluster]: {e}"))?;
        let session_ms = limits::SESSION_TIMEOUT_MS
            .resolve(
                spec.session_timeout_ms
                    .map(|m| u32::try_from(m.0).unwrap_or(u32::MAX)),
            )
            .map_err(|e| anyhow!("[cluster]: {e}"))?;
        Ok(ClusterSettings {
            bootstrap,
            checkpoints,
            exchange_partitions,
            session_timeout: Duration::from_millis(u64::from(session_ms)),
            work_dir: graph.base_dir.join(
                spec.work_dir
                    .unwrap_or_else(|| format!("{}.cluster-work", graph.name).into()),
            ),
            properties: spec.properties.unwrap_or_default(),
            name_prefix: String::new(),
        })
    }

    /// A librdkafka client configuration for the cluster's brokers.
    pub fn client(&self) -> ClientConfig {
        let mut client = ClientConfig::new();
        for (k, v) in &self.properties {
            client.set(k, v);
        }
        client.set("bootstrap.servers", &self.bootstrap);
        client
    }
}

/// A stage: operators between two keyed edges, run as `units` units.
#[derive(Debug, Clone)]
pub struct Stage {
    /// The global number of its first unit.
    pub first_unit: u32,
    /// Its units.
    pub units: u32,
    /// What its units read: a source partition each, or an exchange partition each.
    pub input: StageInput,
    /// Its operators (vertex indices of the job's graph).
    pub operators: Vec<usize>,
}

/// What the units of a stage read.
#[derive(Debug, Clone)]
pub enum StageInput {
    /// The job's source, one partition per unit.
    Source {
        /// The partitions, unit by unit.
        partitions: Vec<(String, i32)>,
    },
    /// An exchange topic, one partition per unit, written by the previous stage.
    Exchange {
        /// The topic.
        topic: String,
    },
}

/// A job cut into stages for running over several hosts.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The job.
    pub graph: JobGraph,
    /// Its stages, in order.
    pub stages: Vec<Stage>,
    /// Names the job's topics, groups and transactional ids begin with.
    pub prefix: String,
    /// The control topic: one partition per unit; owning one is running the unit.
    pub control_topic: String,
    /// The hosts' consumer group.
    pub group: String,
    source: usize,
    sink: usize,
}

/// A stage as `sluice validate --cluster` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageView {
    /// Its number.
    pub stage: usize,
    /// Its units' numbers, first and last.
    pub units: (u32, u32),
    /// What each unit reads: `topic/partition` of the source, or of an exchange topic.
    pub reads: Vec<String>,
    /// Its operators, then the job's sink in the last stage.
    pub runs: Vec<String>,
    /// The topic its units write: the next stage's exchange topic, or the sink's.
    pub writes: String,
    /// How long after each multiple of the interval its units checkpoint.
    pub checkpoint_phase_ms: u128,
}

/// A unit's place in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitPlace {
    /// Its stage.
    pub stage: usize,
    /// Its number in the stage.
    pub index: u32,
}

/// Whether Kafka accepts `c` in a topic's name.
pub fn is_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// A name Kafka accepts for topics and groups: letters, digits, `.`, `_`, `-`.
fn kafka_name(s: &str) -> String {
    s.chars()
        .map(|c| if is_topic_char(c) { c } else { '_' })
        .collect()
}

impl Plan {
    /// Cuts `graph` into stages, asking the brokers for the source's partitions.
    pub fn new(graph: &JobGraph, settings: &ClusterSettings) -> Result<Plan> {
        let job = &graph.name;
        let context = || format!("job '{job}' over several hosts");
        let (source, order) = line_of(graph).with_context(context)?;
        let Vertex::Source(src) = &graph.vertices[source] else {
            unreachable!("a line starts at its source")
        };
        let SourceInput::Kafka(kafka) = &src.input else {
            bail!(
                "{}: its source '{}' must be a Kafka source: each unit reads one partition",
                context(),
                src.name
            );
        };
        let Topics::Names(topics) = &kafka.topics else {
            bail!(
                "{}: its source '{}' must name its topics (a pattern could match other \
                 partitions on each host)",
                context(),
                src.name
            );
        };
        let sink = *order.last().expect("a line ends at its sink");
        match &graph.vertices[sink] {
            Vertex::Sink(SinkVertex {
                kind: SinkKind::Kafka,
                kafka: Some(k),
                ..
            }) if k.delivery == Delivery::ExactlyOnce => {}
            other => bail!(
                "{}: its {} must be an exactly-once Kafka sink (each unit commits its output \
                 with its checkpoints)",
                context(),
                other.describe()
            ),
        }
        if graph.checkpoint.is_none() {
            bail!("{}: it needs `[checkpoint]`", context());
        }
        let partitions = source_partitions(kafka, topics)
            .with_context(|| format!("{}: reading the source's partitions", context()))?;
        let prefix = format!("{}sluice-{}", settings.name_prefix, kafka_name(job));
        let mut stages = vec![Stage {
            first_unit: 0,
            units: partitions.len() as u32,
            input: StageInput::Source { partitions },
            operators: Vec::new(),
        }];
        for &v in &order[1..order.len() - 1] {
            let edge = graph
                .edges
                .iter()
                .find(|e| e.to == v)
                .expect("a line's edge");
            let marked = matches!(
                &graph.vertices[v],
                Vertex::Operator(OperatorVertex {
                    repartition: true,
                    ..
                })
            );
            if marked || matches!(edge.partitioner, Partitioner::Hash { .. }) {
                let last = stages.last().expect("a first stage");
                stages.push(Stage {
                    first_unit: last.first_unit + last.units,
                    units: settings.exchange_partitions,
                    input: StageInput::Exchange {
                        topic: format!("{prefix}.exchange-{}", stages.len()),
                    },
                    operators: Vec::new(),
                });
            }
            stages.last_mut().expect("a stage").operators.push(v);
        }
        Ok(Plan {
            graph: graph.clone(),
            stages,
            control_topic: format!("{prefix}.units"),
            group: prefix.clone(),
            prefix,
            source,
            sink,
        })
    }

    /// Units in all stages.
    pub fn units(&self) -> u32 {
        self.stages.last().map_or(0, |s| s.first_unit + s.units)
    }

    /// Where unit `unit` is.
    pub fn place(&self, unit: u32) -> Option<UnitPlace> {
        self.stages.iter().enumerate().find_map(|(stage, s)| {
            (unit >= s.first_unit && unit < s.first_unit + s.units).then(|| UnitPlace {
                stage,
                index: unit - s.first_unit,
            })
        })
    }

    /// What unit `unit` runs, for people: `stage 1: exchange partition 3 -> count`.
    pub fn describe(&self, unit: u32) -> String {
        let Some(place) = self.place(unit) else {
            return format!("unit {unit} (not in this job)");
        };
        let stage = &self.stages[place.stage];
        let input = match &stage.input {
            StageInput::Source { partitions } => {
                let (t, p) = &partitions[place.index as usize];
                format!("{t}/{p}")
            }
            StageInput::Exchange { topic } => format!("{topic}/{}", place.index),
        };
        let mut ops: Vec<&str> = stage
            .operators
            .iter()
            .map(|&v| self.graph.vertices[v].name())
            .collect();
        if place.stage + 1 == self.stages.len() {
            ops.push(self.graph.vertices[self.sink].name());
        }
        format!("stage {}: {input} -> {}", place.stage, ops.join(" -> "))
    }

    /// How long after each multiple of the checkpoint interval (in wall-clock time) the
    /// units of stage `stage` checkpoint: each stage half an interval after the one it
    /// reads, so what a unit commits reaches the next stage's units before their next
    /// checkpoint (when the commit takes less than half an interval) and a hop holds a
    /// record back about half an interval. With every unit in step it was a whole one.
    pub fn checkpoint_phase(&self, stage: usize) -> Duration {
        let interval = self
            .graph
            .checkpoint
            .as_ref()
            .map_or(Duration::ZERO, |c| c.interval);
        interval / 2 * (stage % 2) as u32
    }

    /// Its stages, as `sluice validate --cluster` shows them.
    pub fn view(&self) -> Vec<StageView> {
        self.stages
            .iter()
            .enumerate()
            .map(|(i, stage)| {
                let reads = match &stage.input {
                    StageInput::Source { partitions } => {
                        partitions.iter().map(|(t, p)| format!("{t}/{p}")).collect()
                    }
                    StageInput::Exchange { topic } => {
                        (0..stage.units).map(|p| format!("{topic}/{p}")).collect()
                    }
                };
                let mut runs: Vec<String> = stage
                    .operators
                    .iter()
                    .map(|&v| self.graph.vertices[v].name().to_string())
                    .collect();
                if i + 1 == self.stages.len() {
                    runs.push(self.graph.vertices[self.sink].name().to_string());
                }
                StageView {
                    stage: i,
                    units: (stage.first_unit, stage.first_unit + stage.units - 1),
                    reads,
                    runs,
                    writes: self.output_topic(stage.first_unit),
                    checkpoint_phase_ms: self.checkpoint_phase(i).as_millis(),
                }
            })
            .collect()
    }

    /// The transactional id prefix of unit `unit`'s sink (its producer is `PREFIX-0`).
    pub fn transactional_prefix(&self, unit: u32) -> String {
        format!("{}.unit-{unit}", self.prefix)
    }

    /// The topic unit `unit` writes.
    pub fn output_topic(&self, unit: u32) -> String {
        let place = self.place(unit).expect("a unit of the plan");
        match self.stages.get(place.stage + 1) {
            Some(Stage {
                input: StageInput::Exchange { topic },
                ..
            }) => topic.clone(),
            _ => match &self.graph.vertices[self.sink] {
                Vertex::Sink(SinkVertex { kafka: Some(k), .. }) => k.topic.clone(),
                _ => unreachable!("checked in Plan::new"),
            },
        }
    }

    /// The exchange topics, each with its partitions.
    pub fn exchange_topics(&self) -> Vec<(String, u32)> {
        self.stages
            .iter()
            .filter_map(|s| match &s.input {
                StageInput::Exchange { topic } => Some((topic.clone(), s.units)),
                StageInput::Source { .. } => None,
            })
            .collect()
    }

    /// A client of the brokers unit `unit` writes to (its sink's, with their
    /// properties): where its producer is fenced and its marker read.
    pub fn sink_client(&self, unit: u32, cluster: &ClusterSettings) -> ClientConfig {
        let last = self
            .place(unit)
            .is_some_and(|p| p.stage + 1 == self.stages.len());
        match &self.graph.vertices[self.sink] {
            Vertex::Sink(SinkVertex { kafka: Some(k), .. }) if last => {
                let mut client = ClientConfig::new();
                for (key, value) in &k.properties {
                    client.set(key, value);
                }
                client.set("bootstrap.servers", &k.bootstrap);
                client
            }
            _ => cluster.client(),
        }
    }

    /// The exactly-once Kafka sink of unit `unit`: into the next stage's exchange topic,
    /// or the job's sink, with the unit's transactional ids (its markers' note and the
    /// marker it expects unset).
    pub fn unit_sink(&self, unit: u32, cluster: &ClusterSettings) -> Result<SinkVertex> {
        let place = self
            .place(unit)
            .ok_or_else(|| anyhow!("unit {unit}: the job has {} units", self.units()))?;
        let g = &self.graph;
        let prefix = self.transactional_prefix(unit);
        Ok(match self.stages.get(place.stage + 1) {
            Some(next) => {
                let Vertex::Operator(OperatorVertex { key_by, .. }) =
                    &g.vertices[next.operators[0]]
                else {
                    unreachable!("a stage after the first begins at an operator")
                };
                SinkVertex {
                    name: "exchange".into(),
                    id: "exchange".into(),
                    kind: SinkKind::Kafka,
                    path: None,
                    format: Default::default(),
                    file_format: None,
                    parallelism: 1,
                    kafka: Some(KafkaSinkConfig {
                        bootstrap: cluster.bootstrap.clone(),
                        topic: self.output_topic(unit),
                        delivery: Delivery::ExactlyOnce,
                        transactional_id_prefix: prefix,
                        default_prefix: false,
                        max_pending_bytes: 256 << 20,
                        by_record_partition: false,
                        properties: exchange_producer_properties(&cluster.properties),
                        format: FormatConfig::bytes(),
                        exchange: Some(ExchangeOutput {
                            key: key_by.clone(),
                            partitions: next.units,
                            producer: place.index,
                        }),
                        marker_note: None,
                        expect_marker: None,
                    }),
                }
            }
            None => {
                let Vertex::Sink(s) = &g.vertices[self.sink] else {
                    unreachable!("checked in Plan::new")
                };
                let k = s.kafka.as_ref().expect("checked in Plan::new");
                SinkVertex {
                    parallelism: 1,
                    kafka: Some(KafkaSinkConfig {
                        // A unit's ids are the plan's, whatever its checkpoint says.
                        transactional_id_prefix: prefix,
                        default_prefix: false,
                        ..k.clone()
                    }),
                    ..s.clone()
                }
            }
        })
    }

    /// The job unit `unit` runs at parallelism 1: its stage's operators between its
    /// partition and the next stage's exchange topic (or the job's sink), checkpointing
    /// into `checkpoint_dir`, its sink's markers noting `note`; its sink checks at open
    /// that the marker is still `restored` (the note and checkpoint the unit restored,
    /// or none).
    pub fn unit_graph(
        &self,
        unit: u32,
        cluster: &ClusterSettings,
        checkpoint_dir: &Path,
        note: &str,
        restored: Option<(String, u64)>,
    ) -> Result<JobGraph> {
        let place = self
            .place(unit)
            .ok_or_else(|| anyhow!("unit {unit}: the job has {} units", self.units()))?;
        let stage = &self.stages[place.stage];
        let g = &self.graph;
        let Vertex::Source(original) = &g.vertices[self.source] else {
            unreachable!("checked in Plan::new")
        };
        let SourceInput::Kafka(kafka) = &original.input else {
            unreachable!("checked in Plan::new")
        };
        let source = match &stage.input {
            StageInput::Source { partitions } => SourceVertex {
                input: SourceInput::Kafka(KafkaSourceConfig {
                    split: Some(partitions[place.index as usize].clone()),
                    ..kafka.clone()
                }),
                parallelism: 1,
                ..original.clone()
            },
            StageInput::Exchange { topic } => SourceVertex {
                name: "exchange".into(),
                id: "exchange".into(),
                input: SourceInput::Kafka(KafkaSourceConfig {
                    bootstrap: cluster.bootstrap.clone(),
                    topics: Topics::Names(vec![topic.clone()]),
                    allowed: None,
                    start: StartFrom::Earliest,
                    // An offset no longer in the log is an error, never a silent skip.
                    on_out_of_range: OutOfRange::Fail,
                    group: format!("{topic}.readers"),
                    discovery: Duration::from_secs(3600),
                    properties: cluster.properties.clone(),
                    bounded: false,
                    split: Some((topic.clone(), place.index as i32)),
                    format: Box::new(FormatConfig::bytes()),
                    exchange_producers: Some(self.stages[place.stage - 1].units),
                }),
                parallelism: 1,
                // Records keep the timestamps they had; watermarks come from the
                // producers.
                event_time: original
                    .event_time
                    .clone()
                    .map(|e| crate::connectors::EventTime {
                        field: None,
                        json_field: None,
                        ..e
                    }),
                idle_timeout: None,
            },
        };
        let mut vertices = vec![Vertex::Source(source)];
        for &v in &stage.operators {
            let Vertex::Operator(op) = &g.vertices[v] else {
                unreachable!("a stage's operators")
            };
            vertices.push(Vertex::Operator(OperatorVertex {
                parallelism: 1,
                ..op.clone()
            }));
        }
        let mut sink = self.unit_sink(unit, cluster)?;
        if let Some(k) = &mut sink.kafka {
            k.marker_note = Some(note.to_string());
            k.expect_marker = Some(restored);
        }
        vertices.push(Vertex::Sink(sink));
        let edges = (1..vertices.len())
            .map(|to| Edge {
                from: to - 1,
                side: None,
                to,
                input: 0,
                partitioner: match &vertices[to] {
                    Vertex::Operator(OperatorVertex {
                        key_by: Some(key), ..
                    }) => Partitioner::Hash {
                        key: key.clone(),
                        max_parallelism: g.max_parallelism,
                    },
                    _ => Partitioner::Forward,
                },
            })
            .collect();
        let mut graph = JobGraph {
            name: format!("{}.unit-{unit}", g.name),
            vertices,
            edges,
            chains: Vec::new(),
            checkpoint: g.checkpoint.clone().map(|mut c| {
                c.dir = checkpoint_dir.to_path_buf();
                c.phase = Some(self.checkpoint_phase(place.stage));
                c
            }),
            restart: RestartStrategy::None,
            ..g.clone()
        };
        graph.rechain()?;
        Ok(graph)
    }
}

/// An exchange producer's librdkafka properties: the cluster's, over defaults for
/// writing a checkpoint interval's records at once (large batches, compressed), which
/// halve what the broker handles per record.
fn exchange_producer_properties(cluster: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut properties: BTreeMap<String, String> = [
        ("compression.type", "lz4"),
        ("linger.ms", "5"),
        ("batch.size", "1048576"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    properties.extend(cluster.clone());
    properties
}

/// The job's vertices as a line from its source to its sink, or why it is not one.
fn line_of(graph: &JobGraph) -> Result<(usize, Vec<usize>)> {
    let sources: Vec<usize> = (0..graph.vertices.len())
        .filter(|&v| matches!(graph.vertices[v], Vertex::Source(_)))
        .collect();
    let sinks = graph
        .vertices
        .iter()
        .filter(|v| matches!(v, Vertex::Sink(_)))
        .count();
    let [source] = sources[..] else {
        bail!("it must have one source (it has {})", sources.len());
    };
    if sinks != 1 {
        bail!("it must have one sink (it has {sinks})");
    }
    let mut order = vec![source];
    let mut at = source;
    loop {
        let out: Vec<&Edge> = graph.edges.iter().filter(|e| e.from == at).collect();
        match out[..] {
            [] => break,
            [e] if e.side.is_none() && e.partitioner != Partitioner::Broadcast => {
                if graph.edges.iter().filter(|x| x.to == e.to).count() != 1 {
                    bail!(
                        "{} reads several inputs: only a line of operators runs over \
                         several hosts",
                        graph.vertices[e.to].describe()
                    );
                }
                at = e.to;
                order.push(at);
            }
            _ => bail!(
                "{} feeds several vertices, a side output or a broadcast: only a line of \
                 operators runs over several hosts",
                graph.vertices[at].describe()
            ),
        }
    }
    if order.len() != graph.vertices.len() || !matches!(graph.vertices[at], Vertex::Sink(_)) {
        bail!("only a line of operators from the source to the sink runs over several hosts");
    }
    Ok((source, order))
}

/// The partitions of `topics`, topic by topic in the order given.
fn source_partitions(kafka: &KafkaSourceConfig, topics: &[String]) -> Result<Vec<(String, i32)>> {
    let mut client = ClientConfig::new();
    for (k, v) in &kafka.properties {
        client.set(k, v);
    }
    let consumer: BaseConsumer = client
        .set("bootstrap.servers", &kafka.bootstrap)
        .create()
        .with_context(|| format!("connecting to {}", kafka.bootstrap))?;
    let mut all = Vec::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
            .with_context(|| format!("reading the partitions of Kafka topic {topic:?}"))?;
        let t = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .ok_or_else(|| anyhow!("Kafka topic {topic:?} does not exist"))?;
        let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
        ids.sort_unstable();
        all.extend(ids.into_iter().map(|p| (topic.clone(), p)));
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The graph of a job file whose `[source]`, operators and `[sink]` are `body`.
    fn graph(body: &str) -> JobGraph {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.toml");
        std::fs::write(&path, format!("name = \"j\"\n{body}")).unwrap();
        crate::job::load_graph(&path).unwrap()
    }

    const KAFKA_SOURCE: &str =
        "[source]\ntype = \"kafka\"\nbootstrap = \"127.0.0.1:1\"\ntopics = \"in\"\n";
    const KAFKA_SINK: &str =
        "[sink]\ntype = \"kafka\"\nbootstrap = \"127.0.0.1:1\"\ntopic = \"out\"\n";
    const COUNT: &str = "[[operator]]\nname = \"count\"\nplugin = \"c.wasm\"\nkey_by = \"key\"\n";
    const CLUSTER: &str = "[checkpoint]\ninterval_ms = 100\n[cluster]\ncheckpoints = \"s\"\n";

    fn plan_error(body: &str) -> String {
        let g = graph(body);
        let settings = ClusterSettings::of(&g, Some("127.0.0.1:1"), None).unwrap();
        format!("{:#}", Plan::new(&g, &settings).unwrap_err())
    }

    #[test]
    fn only_a_line_from_a_kafka_source_to_an_exactly_once_kafka_sink_is_planned() {
        let file_source = "[source]\ntype = \"file\"\npath = \"in.txt\"\n";
        let e = plan_error(&format!("{file_source}{COUNT}{KAFKA_SINK}{CLUSTER}"));
        assert!(e.contains("must be a Kafka source"), "{e}");
        let file_sink = "[sink]\ntype = \"file\"\npath = \"out.txt\"\n";
        let e = plan_error(&format!("{KAFKA_SOURCE}{COUNT}{file_sink}{CLUSTER}"));
        assert!(e.contains("must be an exactly-once Kafka sink"), "{e}");
        let at_least_once = KAFKA_SINK.to_string() + "delivery = \"at-least-once\"\n";
        let e = plan_error(&format!("{KAFKA_SOURCE}{COUNT}{at_least_once}{CLUSTER}"));
        assert!(e.contains("must be an exactly-once Kafka sink"), "{e}");
        let pattern = KAFKA_SOURCE.replace("topics = \"in\"", "topics = { pattern = \"i.*\" }");
        let e = plan_error(&format!("{pattern}{COUNT}{KAFKA_SINK}{CLUSTER}"));
        assert!(e.contains("must name its topics"), "{e}");
        let two_sinks = "[[sink]]\nname = \"a\"\ntype = \"kafka\"\nbootstrap = \"b:1\"\ntopic = \"x\"\n\
             [[sink]]\nname = \"b\"\ntype = \"kafka\"\nbootstrap = \"b:1\"\ntopic = \"y\"\n\
             inputs = [\"count\"]";
        let e = plan_error(&format!("{KAFKA_SOURCE}{COUNT}{two_sinks}\n{CLUSTER}"));
        assert!(e.contains("one sink"), "{e}");
        // A line that fits gets as far as asking the (unreachable) brokers.
        let e = plan_error(&format!("{KAFKA_SOURCE}{COUNT}{KAFKA_SINK}{CLUSTER}"));
        assert!(e.contains("reading the source's partitions"), "{e}");
    }

    #[test]
    fn each_stage_checkpoints_half_an_interval_after_the_one_it_reads() {
        let g = graph(&format!(
            "{KAFKA_SOURCE}[[operator]]\nname = \"tokenize\"\nplugin = \"t.wasm\"\n\
             {COUNT}[[operator]]\nname = \"upper\"\nplugin = \"u.wasm\"\nkey_by = \"key\"\n\
             {KAFKA_SINK}{CLUSTER}"
        ));
        let settings = ClusterSettings::of(&g, Some("127.0.0.1:1"), None).unwrap();
        let (source, order) = line_of(&g).unwrap();
        // The plan `Plan::new` makes of a source topic of 2 partitions (without asking
        // the brokers): 2 units reading it, then 2 of each exchange.
        let exchange = |n: u32, first_unit: u32, operator: usize| Stage {
            first_unit,
            units: 2,
            input: StageInput::Exchange {
                topic: format!("x.exchange-{n}"),
            },
            operators: vec![order[operator]],
        };
        let plan = Plan {
            graph: g.clone(),
            stages: vec![
                Stage {
                    first_unit: 0,
                    units: 2,
                    input: StageInput::Source {
                        partitions: vec![("in".into(), 0), ("in".into(), 1)],
                    },
                    operators: vec![order[1]],
                },
                exchange(1, 2, 2),
                exchange(2, 4, 3),
            ],
            prefix: "x".into(),
            control_topic: "x.units".into(),
            group: "x".into(),
            source,
            sink: *order.last().unwrap(),
        };
        let dir = tempfile::tempdir().unwrap();
        let phase = |unit: u32| {
            let g = plan
                .unit_graph(unit, &settings, dir.path(), "attempt=a", None)
                .unwrap();
            g.checkpoint.unwrap().phase
        };
        let ms = Duration::from_millis;
        // (`CLUSTER` checkpoints every 100 ms.)
        assert_eq!(phase(0), Some(ms(0)));
        assert_eq!(phase(1), Some(ms(0)));
        assert_eq!(phase(2), Some(ms(50)), "the stage after the source's");
        assert_eq!(phase(3), Some(ms(50)));
        assert_eq!(phase(4), Some(ms(0)), "the stage after that");
    }

    #[test]
    fn cluster_settings_name_what_is_missing_or_out_of_range() {
        let g = graph(&format!(
            "{KAFKA_SOURCE}{COUNT}{KAFKA_SINK}[checkpoint]\ninterval_ms = 100\n"
        ));
        let e = ClusterSettings::of(&g, None, None).unwrap_err().to_string();
        assert!(e.contains("--cluster"), "{e}");
        let e = ClusterSettings::of(&g, Some("b:1"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`[cluster] checkpoints` is missing"), "{e}");
        let g = graph(&format!(
            "{KAFKA_SOURCE}{COUNT}{KAFKA_SINK}{CLUSTER}exchange_partitions = 0\n"
        ));
        let e = ClusterSettings::of(&g, Some("b:1"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("exchange_partitions"), "{e}");
        let g = graph(&format!(
            "{KAFKA_SOURCE}{COUNT}{KAFKA_SINK}{CLUSTER}bootstrap = \"k:9\"\n"
        ));
        let s = ClusterSettings::of(&g, None, None).unwrap();
        assert_eq!(s.bootstrap, "k:9");
        assert_eq!(
            ClusterSettings::of(&g, Some("o:1"), None)
                .unwrap()
                .bootstrap,
            "o:1"
        );
        assert_eq!(s.exchange_partitions, 8);
        assert!(s.work_dir.ends_with("j.cluster-work"));
    }

    #[test]
    fn the_host_files_cluster_fills_in_what_the_job_leaves_out() {
        let machine = ClusterSpec {
            bootstrap: Some("m:1".into()),
            checkpoints: Some("/mnt/shared".into()),
            session_timeout_ms: Some(crate::spec::values::Millis(20_000)),
            work_dir: Some("/var/sluice".into()),
            properties: Some(BTreeMap::from([
                ("security.protocol".into(), "SASL_SSL".into()),
                ("linger.ms".into(), "1".into()),
            ])),
            ..ClusterSpec::default()
        };
        let g = graph(&format!(
            "{KAFKA_SOURCE}{COUNT}{KAFKA_SINK}[checkpoint]\ninterval_ms = 100\n\
             [cluster]\nsession_timeout_ms = 5000\nproperties = {{ \"linger.ms\" = \"9\" }}\n"
        ));
        let s = ClusterSettings::of(&g, None, Some(&machine)).unwrap();
        assert_eq!(s.bootstrap, "m:1");
        assert_eq!(s.checkpoints, "/mnt/shared");
        assert_eq!(
            s.session_timeout,
            Duration::from_secs(5),
            "the job's own win"
        );
        assert_eq!(s.work_dir, Path::new("/var/sluice"));
        assert_eq!(s.properties["security.protocol"], "SASL_SSL");
        assert_eq!(
            s.properties["linger.ms"], "9",
            "the job's properties go over"
        );
        let s = ClusterSettings::of(&g, Some("c:1"), Some(&machine)).unwrap();
        assert_eq!(s.bootstrap, "c:1", "the command line goes over both");
    }
}
