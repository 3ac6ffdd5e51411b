//! Jobs: the job file, its validation into a graph of chained tasks, restart strategies,
//! and running a job on this machine.
//!
//! A job is a pipeline `source -> operator* -> sink`. Consecutive vertices with the same
//! parallelism connected by a forward edge run in one task (a chain); every other edge —
//! keyed (`key_by`), `rebalance`, `broadcast`, or a change of parallelism — crosses bounded
//! channels between tasks.

mod deploy;
mod file;
mod graph;
mod monitor;
mod restart;
mod runner;
mod start;
mod supervisor;

pub use file::{JobFile, OperatorSpec, SinkKind, SinkSpec, SourceKind, SourceSpec};
pub use graph::{
    ChainSpec, GeneratorShape, JobGraph, OperatorVertex, SinkVertex, SourceInput, SourceVertex,
    Vertex,
};
pub use monitor::JobMonitor;
pub use restart::RestartStrategy;
pub use runner::{Job, JobControl, JobOutcome, JobReport, RestorePoint, RunOptions, load_graph};
pub use supervisor::failure_kind;
