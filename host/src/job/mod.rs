//! Jobs: the job file, its validation into a graph of chained tasks, restart strategies,
//! and running a job on this machine.
//!
//! A job is a graph of sources, operators and sinks; each operator and sink names the
//! outputs it reads (by default the vertex before it, so a list is a pipeline `source ->
//! operator* -> sink`). A vertex whose only input is a forward edge from its reader's only
//! output runs in that vertex's task (a chain); every other edge — keyed (`key_by`),
//! `rebalance`, `broadcast`, a change of parallelism, a fan-out or a side output — crosses
//! bounded channels between tasks.

mod deploy;
mod file;
mod graph;
mod monitor;
mod restart;
mod runner;
mod start;
mod supervisor;

pub use file::{ClusterSpec, JobFile, OperatorSpec, SinkKind, SinkSpec, SourceKind, SourceSpec};
pub use graph::{
    ChainSpec, Edge, GeneratorShape, JobGraph, OperatorVertex, SinkVertex, SourceInput,
    SourceVertex, Vertex,
};
pub use monitor::JobMonitor;
pub use restart::RestartStrategy;
pub use runner::{Job, JobControl, JobOutcome, JobReport, RestorePoint, RunOptions, load_graph};
pub use supervisor::failure_kind;
