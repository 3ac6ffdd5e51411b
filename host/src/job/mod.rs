//! Jobs: the job file, its validation into a graph of chained tasks, restart strategies,
//! running a job on this machine, and its checkpoint coordinator.
//!
//! A job is a graph of sources, operators and sinks; each operator and sink names the
//! outputs it reads (by default the vertex before it, so a list is a pipeline `source ->
//! operator* -> sink`). A vertex whose only input is a forward edge from its reader's only
//! output runs in that vertex's task (a chain); every other edge — keyed (`key_by`),
//! `rebalance`, `broadcast`, a change of parallelism, a fan-out or a side output — crosses
//! bounded channels between tasks.

mod chaining;
mod coordinator;
mod deploy;
mod graph;

mod monitor;
mod ownership;
mod restart;
mod run;
mod runner;
mod start;
mod supervisor;
pub(crate) mod validate;

pub use crate::spec::{
    ClusterSpec, JobFile, OperatorSpec, SinkKind, SinkSpec, SourceKind, SourceSpec,
};
pub use coordinator::{
    AckOutcome, CheckpointHook, CheckpointSettings, CheckpointStats, CompletedCheckpoint,
    Coordinator, CoordinatorSetup, PendingCheckpoint, next_trigger,
};
pub use graph::{
    ChainSpec, Edge, FileOutput, GeneratorShape, JobGraph, OperatorVertex, SinkVertex, SourceInput,
    SourceVertex, Vertex,
};
pub use monitor::{FAILURE_HISTORY, FailureRecord, JobMonitor, MonitorSnapshot, UnitMonitors};
pub use ownership::{InUse, RunLocks, lock_path, lock_run};
pub use restart::RestartStrategy;
pub use run::{JobControl, JobFailed, JobOutcome, RestorePoint, RunOptions, StartRefused};
pub use runner::{Job, JobReport, load_graph};
pub use supervisor::failure_kind;
