//! Where a task's input comes from, and waiting for it.

use std::time::Instant;

use crossbeam_channel::{Receiver, Select};

use crate::connectors::Source;
use crate::network::{InputGate, RecordWriter};

/// A task reads either a source or the channels from upstream tasks.
pub enum TaskInput {
    /// The head of the job.
    Source(Box<dyn Source>),
    /// Channels from the subtasks of upstream operators.
    Network(InputGate),
}

/// Blocks until the mailbox doorbell rings, the source's waker fires, or `deadline`.
pub(super) fn wait_for_source(
    doorbell: &Receiver<()>,
    waker: Option<&Receiver<()>>,
    deadline: Option<Instant>,
) {
    let mut sel = Select::new();
    sel.recv(doorbell);
    if let Some(w) = waker {
        sel.recv(w);
    }
    match deadline {
        Some(d) => {
            let _ = sel.ready_deadline(d);
        }
        None => {
            sel.ready();
        }
    }
}

/// Blocks until a full output channel has room again or the doorbell rings.
pub(super) fn wait_for_output(doorbell: &Receiver<()>, writer: &RecordWriter) {
    let mut sel = Select::new();
    sel.recv(doorbell);
    for ch in writer.channels() {
        if ch.is_full() {
            sel.send(ch);
        }
    }
    sel.ready();
}
