//! What a checkpoint captures of a task.

use serde::{Deserialize, Serialize};

use crate::state::KeyedSnapshot;
use crate::timers::TimerQueues;

/// Identifies a task: its place in the job graph and its subtask index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskId {
    /// Index of the task's chain in the job graph (0 is the source's chain).
    pub vertex: usize,
    /// Subtask index.
    pub subtask: u32,
}

/// The synchronous-part copy of one operator instance: cheap to take (its keyed state
/// and timers are persistent structures), written out by the asynchronous part.
#[derive(Debug, Clone)]
pub struct OperatorSnapshot {
    /// Operator name.
    pub operator: String,
    /// What the operator's `snapshot` returned.
    pub state: Vec<u8>,
    /// Keyed state, for keyed operators.
    pub keyed: Option<KeyedSnapshot>,
    /// Timers.
    pub timers: TimerQueues,
    /// The operator's watermark at the checkpoint, so that after a restore records are
    /// judged late exactly as they would have been without the failure.
    pub watermark: i64,
}

/// Where a written operator snapshot is, as recorded in the checkpoint's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHandle {
    /// Operator name.
    pub operator: String,
    /// Subtask index.
    pub subtask: u32,
    /// File name inside the checkpoint folder.
    pub file: String,
    /// File size in bytes.
    pub size: u64,
    /// CRC-32 of the file.
    pub crc32: u32,
    /// Files of the checkpoint storage's shared folder the state refers to (an LSM
    /// instance's tables), with their sizes: kept while a retained checkpoint names them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<(String, u64)>,
}
