//! Checkpoints: the coordinator, the asynchronous part of a task's snapshot, the state
//! file format, and storage with restore.
//!
//! A checkpoint *n* starts at the sources (a mail from the coordinator), travels as a
//! barrier through the job, and at every task is taken in two parts: a synchronous part on
//! the task thread (each operator's `snapshot` plus O(1) copies of keyed state and timers)
//! and an asynchronous part on a worker thread that writes the files and acknowledges.
//! When every task acknowledged, the coordinator writes the metadata — which makes the
//! checkpoint complete — and notifies every task, so every operator gets
//! `notify-complete`.

mod async_part;
mod coordinator;
mod format;
mod snapshot;
mod storage;

pub use async_part::{AsyncPartHandle, AsyncPool, CheckpointLink};
pub use coordinator::{
    AckOutcome, Acknowledgement, CheckpointHook, CheckpointSettings, CheckpointStats,
    CompletedCheckpoint, Coordinator, CoordinatorMessage, CoordinatorSetup, PendingCheckpoint,
    next_trigger,
};
pub use format::{read_operator_state, write_operator_state};
pub use snapshot::{OperatorSnapshot, StateHandle, TaskId};
pub use storage::{
    CheckpointMetadata, CheckpointStorage, FinishedTask, Lineage, LoadedCheckpoint, OperatorMeta,
    SnapshotKind, SourceMeta, SourcePosition, load, state_file_name,
};
