//! Jobs: the job file, its validation into a graph of chained tasks, restart strategies,
//! and running a job on this machine.
//!
//! A job is a pipeline `source -> operator* -> sink`. Consecutive vertices with the same
//! parallelism connected by a forward edge run in one task (a chain); every other edge —
//! keyed (`key_by`), `rebalance`, `broadcast`, or a change of parallelism — crosses bounded
//! channels between tasks.

mod file;
mod graph;
mod restart;
mod runner;

pub use file::{JobFile, OperatorSpec, SinkKind, SinkSpec, SourceKind, SourceSpec};
pub use graph::{
    ChainSpec, GeneratorShape, JobGraph, OperatorVertex, SinkVertex, SourceInput, SourceVertex,
    Vertex,
};
pub use restart::RestartStrategy;
pub use runner::{Job, JobControl, JobMonitor, JobOutcome, JobReport, RestorePoint};
