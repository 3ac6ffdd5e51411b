//! Checkpoints: what tasks and the coordinator tell each other (the coordinator itself
//! runs with the job, in `job::coordinator`), the asynchronous part of a task's
//! snapshot, the state file format, storage with restore, and which part of a
//! checkpoint each subtask of a restored job gets.
//!
//! A checkpoint *n* starts at the sources (a mail from the coordinator), travels as a
//! barrier through the job, and at every task is taken in two parts: a synchronous part on
//! the task thread (each operator's `snapshot` plus O(1) copies of keyed state and timers)
//! and an asynchronous part on a worker thread that writes the files and acknowledges.
//! When every task acknowledged, the coordinator writes the metadata — which makes the
//! checkpoint complete — and notifies every task, so every operator gets
//! `notify-complete`.

mod assignment;
mod async_part;
pub(crate) mod format;
mod protocol;
mod snapshot;
mod storage;

pub use assignment::{OperatorRestore, assign_operator_state};
pub use async_part::{AsyncPartHandle, AsyncPool, CheckpointLink};
pub use format::{CrcWriter, read_operator_state, write_operator_state};
pub use protocol::{Acknowledgement, CoordinatorMessage};
pub use snapshot::{OperatorSnapshot, StateHandle, TaskId};
pub use storage::{
    CheckpointMetadata, CheckpointStorage, FinishedTask, Lineage, LoadedCheckpoint, OperatorMeta,
    SnapshotKind, SourceMeta, SourcePosition, load, shared_files_of, shared_folder_of,
    state_file_name,
};
