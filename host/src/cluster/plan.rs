//! How a job spreads over hosts: stages cut at every keyed, broadcast and multi-input
//! edge, exchange topics between them, and the units of work (one source partition, or
//! one exchange partition of each input, with its chain of operators), each run by some
//! host as a job of its own at parallelism 1.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::ClusterSettings;
use crate::connectors::formats::FormatConfig;
use crate::connectors::kafka::{
    Delivery, ExchangeOutput, KafkaSinkConfig, KafkaSourceConfig, OutOfRange, StartFrom, Topics,
};
use crate::job::{
    Edge, JobGraph, OperatorVertex, RestartStrategy, SinkKind, SinkVertex, SourceInput,
    SourceVertex, Vertex,
};
use crate::network::Partitioner;

/// How long a metadata request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A stage: a line of operators from where records enter it (a source, or exchange
/// topics) to where they leave it (an exchange topic, or a sink), run as `units` units.
#[derive(Debug, Clone)]
pub struct Stage {
    /// The global number of its first unit.
    pub first_unit: u32,
    /// Its units.
    pub units: u32,
    /// What its units read: a source (one partition each), or exchange topics.
    pub inputs: Vec<StageInput>,
    /// Its operators (vertex indices of the job's graph), in order.
    pub operators: Vec<usize>,
    /// Where its units write.
    pub output: StageOutput,
    /// Stages on the longest way from a source stage to it (0 for a source stage).
    pub depth: usize,
}

/// What the units of a stage read.
#[derive(Debug, Clone)]
pub enum StageInput {
    /// One of the job's sources, one partition per unit.
    Source {
        /// The source (a vertex of the job's graph).
        source: usize,
        /// The partitions, unit by unit.
        partitions: Vec<(String, i32)>,
    },
    /// An exchange topic written by another stage's units: for a keyed or rebalanced
    /// edge one partition per unit, unit `i` reading partition `i` (the key groups of
    /// every keyed input of a stage are partitioned alike, so a join's two sides of a
    /// key meet in one unit); for a broadcast edge one partition, read whole by every
    /// unit.
    Exchange {
        /// The topic.
        topic: String,
        /// The edge of the job's graph it carries (into the stage's first operator).
        edge: Edge,
        /// The stage whose units write it.
        from_stage: usize,
    },
}

impl StageInput {
    /// Whether every unit reads all of it (a broadcast edge's topic).
    pub fn broadcast(&self) -> bool {
        matches!(self, StageInput::Exchange { edge, .. } if edge.partitioner == Partitioner::Broadcast)
    }

    /// What unit `index` of its stage reads: `topic/partition`.
    fn read_by(&self, index: u32) -> String {
        match self {
            StageInput::Source { partitions, .. } => {
                let (t, p) = &partitions[index as usize];
                format!("{t}/{p}")
            }
            StageInput::Exchange { topic, .. } if self.broadcast() => format!("{topic}/0"),
            StageInput::Exchange { topic, .. } => format!("{topic}/{index}"),
        }
    }
}

/// Where the units of a stage write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageOutput {
    /// Input `input` of stage `stage` (an exchange topic).
    Exchange {
        /// The stage.
        stage: usize,
        /// Its input.
        input: usize,
    },
    /// A sink of the job (a vertex of its graph).
    Sink(usize),
}

/// A job cut into stages for running over several hosts.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The job.
    pub graph: JobGraph,
    /// Its stages, each after those it reads.
    pub stages: Vec<Stage>,
    /// Names the job's topics, groups and transactional ids begin with.
    pub prefix: String,
    /// The control topic: one partition per unit; owning one is running the unit.
    pub control_topic: String,
    /// The hosts' consumer group.
    pub group: String,
}

/// A stage as `sluice validate --cluster` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageView {
    /// Its number.
    pub stage: usize,
    /// Its units' numbers, first and last.
    pub units: (u32, u32),
    /// What each unit reads: `topic/partition` of the source, or of each exchange topic
    /// (joined by ` + `).
    pub reads: Vec<String>,
    /// Its operators, then the job's sink when it writes one.
    pub runs: Vec<String>,
    /// The topic its units write: an exchange topic, or the sink's.
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

/// A stage as [`Plan::new`] first finds it: its vertices, head first.
struct Line {
    /// A source, or the operator its exchange topics go into; then the operators
    /// chained after it.
    vertices: Vec<usize>,
    /// The edges into its head from other stages (none for a source).
    inputs: Vec<Edge>,
    /// The edge out of its last vertex.
    out: Edge,
    /// Its sink, when `out` reaches one within the stage.
    sink: Option<usize>,
}

impl Plan {
    /// Cuts `graph` into stages, asking the brokers for the sources' partitions.
    ///
    /// A stage begins at each source and at each operator reached by a keyed or
    /// broadcast edge, by several edges, or marked `repartition`; it runs the operators
    /// chained after its first up to the next such edge, and writes one exchange topic
    /// (or a sink). A vertex whose output several vertices read (a fan-out, a side
    /// output) would write several: that is refused.
    pub fn new(graph: &JobGraph, settings: &ClusterSettings) -> Result<Plan> {
        Self::cut(graph, settings, source_partitions)
    }

    /// [`Plan::new`], with the partitions of each Kafka source from `partitions`.
    fn cut(
        graph: &JobGraph,
        settings: &ClusterSettings,
        partitions_of: impl Fn(&SourceVertex) -> Result<Vec<(String, i32)>>,
    ) -> Result<Plan> {
        let job = &graph.name;
        let context = || format!("job '{job}' over several hosts");
        if graph.checkpoint.is_none() {
            bail!("{}: it needs `[checkpoint]`", context());
        }
        let lines = lines_of(graph).with_context(context)?;
        for line in &lines {
            let Some(sink) = line.sink else { continue };
            match &graph.vertices[sink] {
                Vertex::Sink(SinkVertex {
                    kind: SinkKind::Kafka,
                    kafka: Some(k),
                    ..
                }) if k.delivery == Delivery::ExactlyOnce => {}
                other => bail!(
                    "{}: its {} must be an exactly-once Kafka sink (each unit commits its \
                     output with its checkpoints)",
                    context(),
                    other.describe()
                ),
            }
        }
        // Each line's depth: one more than the deepest line writing into it.
        let mut depth = vec![0usize; lines.len()];
        // (The graph has no cycles: a depth settles within as many rounds as lines.)
        for _ in 0..lines.len() {
            for (i, line) in lines.iter().enumerate() {
                for e in &line.inputs {
                    depth[i] = depth[i].max(depth[line_of(&lines, e.from)] + 1);
                }
            }
        }
        // Stages by depth (each after those it reads), then by their first vertex.
        let mut by_depth: Vec<(usize, Line)> = depth.into_iter().zip(lines).collect();
        by_depth.sort_by_key(|(depth, line)| (*depth, line.vertices[0]));
        let (depths, lines): (Vec<usize>, Vec<Line>) = by_depth.into_iter().unzip();
        let prefix = format!("{}sluice-{}", settings.name_prefix, kafka_name(job));
        let mut stages: Vec<Stage> = Vec::new();
        for (s, (line, depth)) in lines.iter().zip(depths).enumerate() {
            let head = line.vertices[0];
            let (units, inputs) = match &graph.vertices[head] {
                Vertex::Source(src) => {
                    let partitions = partitions_of(src).with_context(context)?;
                    let units = partitions.len() as u32;
                    (
                        units,
                        vec![StageInput::Source {
                            source: head,
                            partitions,
                        }],
                    )
                }
                _ => {
                    let several = line.inputs.len() > 1;
                    let inputs = line
                        .inputs
                        .iter()
                        .enumerate()
                        .map(|(k, edge)| StageInput::Exchange {
                            // (A stage of one input keeps the name it always had.)
                            topic: if several {
                                format!("{prefix}.exchange-{s}-{k}")
                            } else {
                                format!("{prefix}.exchange-{s}")
                            },
                            edge: edge.clone(),
                            from_stage: line_of(&lines, edge.from),
                        })
                        .collect();
                    (settings.exchange_partitions, inputs)
                }
            };
            let output = match line.sink {
                Some(sink) => StageOutput::Sink(sink),
                None => {
                    let stage = line_of(&lines, line.out.to);
                    let input = lines[stage]
                        .inputs
                        .iter()
                        .position(|e| *e == line.out)
                        .expect("an edge between lines is an input of the second");
                    StageOutput::Exchange { stage, input }
                }
            };
            stages.push(Stage {
                first_unit: stages.last().map_or(0, |l| l.first_unit + l.units),
                units,
                inputs,
                operators: (line.vertices.iter().copied())
                    .filter(|&v| matches!(graph.vertices[v], Vertex::Operator(_)))
                    .collect(),
                output,
                depth,
            });
        }
        Ok(Plan {
            graph: graph.clone(),
            stages,
            control_topic: format!("{prefix}.units"),
            group: prefix.clone(),
            prefix,
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

    /// What unit `index` of stage `stage` reads, for people: `in/0`, or `x-0/3 + x-1/0`.
    fn reads(&self, stage: usize, index: u32) -> String {
        let inputs = self.stages[stage].inputs.iter();
        let reads: Vec<String> = inputs.map(|i| i.read_by(index)).collect();
        reads.join(" + ")
    }

    /// The names of what stage `stage` runs: its operators, then its sink.
    fn runs(&self, stage: usize) -> Vec<&str> {
        let s = &self.stages[stage];
        let mut runs: Vec<&str> = s
            .operators
            .iter()
            .map(|&v| self.graph.vertices[v].name())
            .collect();
        if let StageOutput::Sink(sink) = s.output {
            runs.push(self.graph.vertices[sink].name());
        }
        runs
    }

    /// What unit `unit` runs, for people: `stage 1: exchange partition 3 -> count`.
    pub fn describe(&self, unit: u32) -> String {
        let Some(place) = self.place(unit) else {
            return format!("unit {unit} (not in this job)");
        };
        let runs = self.runs(place.stage);
        format!(
            "stage {}: {} -> {}",
            place.stage,
            self.reads(place.stage, place.index),
            // (A stage of a source alone only hands its records on.)
            if runs.is_empty() {
                self.output_topic(unit)
            } else {
                runs.join(" -> ")
            }
        )
    }

    /// How long after each multiple of the checkpoint interval (in wall-clock time) the
    /// units of stage `stage` checkpoint: each stage half an interval after the ones it
    /// reads (by depth: a stage's inputs are all one level less deep, or less), so what
    /// a unit commits reaches the next stage's units before their next checkpoint (when
    /// the commit takes less than half an interval) and a hop holds a record back about
    /// half an interval. With every unit in step it was a whole one.
    pub fn checkpoint_phase(&self, stage: usize) -> Duration {
        let interval = self
            .graph
            .checkpoint
            .as_ref()
            .map_or(Duration::ZERO, |c| c.interval);
        interval / 2 * (self.stages[stage].depth % 2) as u32
    }

    /// Its stages, as `sluice validate --cluster` shows them.
    pub fn view(&self) -> Vec<StageView> {
        self.stages
            .iter()
            .enumerate()
            .map(|(i, stage)| StageView {
                stage: i,
                units: (stage.first_unit, stage.first_unit + stage.units - 1),
                reads: (0..stage.units).map(|u| self.reads(i, u)).collect(),
                runs: self.runs(i).into_iter().map(str::to_string).collect(),
                writes: self.output_topic(stage.first_unit),
                checkpoint_phase_ms: self.checkpoint_phase(i).as_millis(),
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
        match self.stages[place.stage].output {
            StageOutput::Exchange { stage, input } => match &self.stages[stage].inputs[input] {
                StageInput::Exchange { topic, .. } => topic.clone(),
                StageInput::Source { .. } => unreachable!("a stage's output is an exchange"),
            },
            StageOutput::Sink(sink) => match &self.graph.vertices[sink] {
                Vertex::Sink(SinkVertex { kafka: Some(k), .. }) => k.topic.clone(),
                _ => unreachable!("checked in Plan::new"),
            },
        }
    }

    /// The exchange topics, each with its partitions.
    pub fn exchange_topics(&self) -> Vec<(String, u32)> {
        self.stages
            .iter()
            .flat_map(|s| {
                s.inputs.iter().filter_map(|i| match i {
                    StageInput::Exchange { topic, .. } => {
                        Some((topic.clone(), if i.broadcast() { 1 } else { s.units }))
                    }
                    StageInput::Source { .. } => None,
                })
            })
            .collect()
    }

    /// A client of the brokers unit `unit` writes to (its sink's, with their
    /// properties): where its producer is fenced and its marker read.
    pub fn sink_client(&self, unit: u32, cluster: &ClusterSettings) -> ClientConfig {
        let output = self.place(unit).map(|p| self.stages[p.stage].output);
        let Some(StageOutput::Sink(sink)) = output else {
            return cluster.client();
        };
        let Vertex::Sink(SinkVertex { kafka: Some(k), .. }) = &self.graph.vertices[sink] else {
            unreachable!("checked in Plan::new")
        };
        let mut client = ClientConfig::new();
        for (key, value) in &k.properties {
            client.set(key, value);
        }
        client.set("bootstrap.servers", &k.bootstrap);
        client
    }

    /// The exactly-once Kafka sink of unit `unit`: into the exchange topic its stage
    /// writes, or the job's sink, with the unit's transactional ids (its markers' note
    /// and the marker it expects unset).
    pub fn unit_sink(&self, unit: u32, cluster: &ClusterSettings) -> Result<SinkVertex> {
        let place = self
            .place(unit)
            .ok_or_else(|| anyhow!("unit {unit}: the job has {} units", self.units()))?;
        let prefix = self.transactional_prefix(unit);
        Ok(match self.stages[place.stage].output {
            StageOutput::Exchange { stage, input } => {
                let next = &self.stages[stage].inputs[input];
                let StageInput::Exchange { edge, .. } = next else {
                    unreachable!("a stage's output is an exchange")
                };
                let (key, partitions) = match &edge.partitioner {
                    Partitioner::Hash { key, .. } => (Some(key.clone()), self.stages[stage].units),
                    Partitioner::Broadcast => (None, 1),
                    _ => (None, self.stages[stage].units),
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
                            key,
                            partitions,
                            producer: place.index,
                        }),
                        marker_note: None,
                        expect_marker: None,
                    }),
                }
            }
            StageOutput::Sink(sink) => {
                let Vertex::Sink(s) = &self.graph.vertices[sink] else {
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

    /// The reader of `input` in unit `index` of a stage: the source itself for its
    /// partition, or an exchange topic's reader.
    fn unit_source(
        &self,
        input: &StageInput,
        index: u32,
        name: &str,
        cluster: &ClusterSettings,
    ) -> SourceVertex {
        let g = &self.graph;
        match input {
            StageInput::Source { source, partitions } => {
                let Vertex::Source(original) = &g.vertices[*source] else {
                    unreachable!("a source stage reads a source")
                };
                let SourceInput::Kafka(kafka) = &original.input else {
                    unreachable!("checked in Plan::new")
                };
                SourceVertex {
                    input: SourceInput::Kafka(KafkaSourceConfig {
                        split: Some(partitions[index as usize].clone()),
                        ..kafka.clone()
                    }),
                    parallelism: 1,
                    ..original.clone()
                }
            }
            StageInput::Exchange {
                topic,
                edge,
                from_stage,
            } => {
                let broadcast = input.broadcast();
                let (partition, group) = if broadcast {
                    (0, format!("{topic}.unit-{index}.readers"))
                } else {
                    (index as i32, format!("{topic}.readers"))
                };
                SourceVertex {
                    name: name.into(),
                    id: name.into(),
                    input: SourceInput::Kafka(KafkaSourceConfig {
                        bootstrap: cluster.bootstrap.clone(),
                        topics: Topics::Names(vec![topic.clone()]),
                        allowed: None,
                        start: StartFrom::Earliest,
                        // An offset no longer in the log is an error, never a silent
                        // skip.
                        on_out_of_range: OutOfRange::Fail,
                        group,
                        discovery: Duration::from_secs(3600),
                        properties: cluster.properties.clone(),
                        bounded: false,
                        split: Some((topic.clone(), partition)),
                        format: Box::new(FormatConfig::bytes()),
                        exchange_producers: Some(self.stages[*from_stage].units),
                    }),
                    parallelism: 1,
                    // Records keep the timestamps they had; watermarks come from the
                    // producers.
                    event_time: upstream_event_time(g, edge.from).map(|e| {
                        crate::connectors::EventTime {
                            field: None,
                            json_field: None,
                            ..e
                        }
                    }),
                    idle_timeout: None,
                }
            }
        }
    }

    /// The job unit `unit` runs at parallelism 1: its stage's operators between its
    /// inputs (its source's partition, or its exchange partitions) and the exchange
    /// topic it writes (or the job's sink), checkpointing into `checkpoint_dir`, its
    /// sink's markers noting `note`; its sink checks at open that the marker is still
    /// `restored` (the note and checkpoint the unit restored, or none).
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
        let mut vertices = Vec::new();
        let mut edges = Vec::new();
        let inputs = stage.inputs.len();
        // Inputs first, then the line they feed: its head is vertex `inputs`.
        for (k, input) in stage.inputs.iter().enumerate() {
            // (A stage of one input keeps the name its checkpoints always had.)
            let name = if inputs == 1 {
                "exchange".to_string()
            } else {
                format!("exchange-{k}")
            };
            vertices.push(Vertex::Source(self.unit_source(
                input,
                place.index,
                &name,
                cluster,
            )));
            let (input, partitioner) = match input {
                StageInput::Source { .. } => (0, Partitioner::Forward),
                StageInput::Exchange { edge, .. } => (
                    edge.input,
                    match &edge.partitioner {
                        p @ (Partitioner::Hash { .. } | Partitioner::Broadcast) => p.clone(),
                        _ => Partitioner::Forward,
                    },
                ),
            };
            edges.push(Edge {
                from: k,
                side: None,
                to: inputs,
                input,
                partitioner,
            });
        }
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
        // The line after its head: forward edges (a keyed one would begin a stage).
        edges.extend((inputs + 1..vertices.len()).map(|to| Edge {
            from: to - 1,
            side: None,
            to,
            input: 0,
            partitioner: Partitioner::Forward,
        }));
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

/// The line (of `lines`) vertex `v` is in.
fn line_of(lines: &[Line], v: usize) -> usize {
    lines
        .iter()
        .position(|l| l.vertices.contains(&v))
        .expect("every vertex but a sink is in a line")
}

/// Whether `e` begins a stage: it is keyed or broadcast, its vertex reads several edges,
/// or is marked `repartition`.
fn is_cut(graph: &JobGraph, e: &Edge) -> bool {
    matches!(
        e.partitioner,
        Partitioner::Hash { .. } | Partitioner::Broadcast
    ) || graph.edges.iter().filter(|x| x.to == e.to).count() > 1
        || matches!(
            &graph.vertices[e.to],
            Vertex::Operator(OperatorVertex {
                repartition: true,
                ..
            })
        )
}

/// The job's vertices cut into lines, one per stage, or why they cannot be.
fn lines_of(graph: &JobGraph) -> Result<Vec<Line>> {
    let out_of = |v: usize| -> Result<Edge> {
        let out: Vec<&Edge> = graph.edges.iter().filter(|e| e.from == v).collect();
        match out[..] {
            [e] if e.side.is_none() => Ok(e.clone()),
            [] => bail!("{} writes nowhere", graph.vertices[v].describe()),
            _ => bail!(
                "{} feeds several vertices or a side output: over several hosts each stage \
                 writes one exchange topic or sink",
                graph.vertices[v].describe()
            ),
        }
    };
    let mut lines = Vec::new();
    for (head, vertex) in graph.vertices.iter().enumerate() {
        let inputs: Vec<Edge> = graph
            .edges
            .iter()
            .filter(|e| e.to == head)
            .cloned()
            .collect();
        match vertex {
            Vertex::Source(src) => {
                let SourceInput::Kafka(kafka) = &src.input else {
                    bail!(
                        "its source '{}' must be a Kafka source: each unit reads one partition",
                        src.name
                    );
                };
                if !matches!(kafka.topics, Topics::Names(_)) {
                    bail!(
                        "its source '{}' must name its topics (a pattern could match other \
                         partitions on each host)",
                        src.name
                    );
                }
            }
            Vertex::Operator(_) if inputs.iter().any(|e| is_cut(graph, e)) => {}
            Vertex::Operator(_) => continue,
            Vertex::Sink(_) => {
                if inputs.len() > 1 || inputs.iter().any(|e| is_cut(graph, e)) {
                    bail!(
                        "{} reads several inputs: over several hosts a sink is written by \
                         one stage",
                        vertex.describe()
                    );
                }
                continue;
            }
        }
        let mut vertices = vec![head];
        let mut out = out_of(head)?;
        while !is_cut(graph, &out) && matches!(graph.vertices[out.to], Vertex::Operator(_)) {
            vertices.push(out.to);
            out = out_of(out.to)?;
        }
        let sink = (matches!(graph.vertices[out.to], Vertex::Sink(_))).then_some(out.to);
        lines.push(Line {
            vertices,
            inputs: if matches!(vertex, Vertex::Source(_)) {
                Vec::new()
            } else {
                inputs
            },
            out,
            sink,
        });
    }
    Ok(lines)
}

/// The event time of the records reaching vertex `v`: that of the first source upstream
/// with one.
fn upstream_event_time(graph: &JobGraph, v: usize) -> Option<crate::connectors::EventTime> {
    let mut todo = vec![v];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(v) = todo.pop() {
        if !seen.insert(v) {
            continue;
        }
        if let Vertex::Source(s) = &graph.vertices[v]
            && s.event_time.is_some()
        {
            return s.event_time.clone();
        }
        todo.extend(graph.edges.iter().filter(|e| e.to == v).map(|e| e.from));
    }
    None
}

/// The partitions of a Kafka source's topics, topic by topic in the order given.
fn source_partitions(src: &SourceVertex) -> Result<Vec<(String, i32)>> {
    let SourceInput::Kafka(kafka) = &src.input else {
        unreachable!("checked in lines_of")
    };
    let Topics::Names(topics) = &kafka.topics else {
        unreachable!("checked in lines_of")
    };
    partitions_of(kafka, topics)
        .with_context(|| format!("reading the partitions of source '{}'", src.name))
}

/// The partitions of `topics`, topic by topic in the order given.
fn partitions_of(kafka: &KafkaSourceConfig, topics: &[String]) -> Result<Vec<(String, i32)>> {
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
pub(super) mod tests;
