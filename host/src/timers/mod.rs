//! Timers: the processing-time service that turns wall-clock deadlines into mails, and the
//! per-operator timer queues that operators register event- and processing-time timers in.
//!
//! # Catch-up policy for late timers
//!
//! A processing-time timer fires by putting a mail at [`Priority::MAX`](crate::mailbox::Priority::MAX)
//! into the task's mailbox; the task runs it between two input batches. When the task is
//! busy (a long batch, a slow operator call) or the machine is loaded, timers fire late.
//! Sluice then fires **every** overdue timer at once, in timestamp order, each with the
//! time it was registered for (tokio calls this `MissedTickBehavior::Burst`); none is
//! skipped or merged, so an operator sees exactly the timers it registered. A periodic
//! host timer (the output flusher) instead reschedules relative to the time it actually
//! ran, so a stall does not cause a burst of flushes.

mod queues;
mod service;

pub use queues::TimerQueues;
pub use service::{ProcessingTimeService, TimerHandle, millis_at, now_millis};
