//! What users write, as plain serde types: the job file and the host file.
//!
//! This floor imports nothing of the runtime. Each knob is one field with its type and its
//! doc; validation (`crate::job`) and tenant resolution (`crate::tenant`) turn these files
//! into what the runtime uses.

pub mod host_file;
pub mod job_file;
pub mod limits;

pub use host_file::HostFile;
pub use job_file::{
    CheckpointSpec, ClusterSpec, JobFile, OperatorSpec, RestartSpec, RuntimeSpec, SinkKind,
    SinkSpec, SourceKind, SourceSpec,
};
