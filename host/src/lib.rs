//! Sluice runs stream operators as sandboxed WebAssembly components.
//!
//! The host does what Apache Flink's `StreamTask` does — a mailbox loop per task,
//! processing- and event-time timers, checkpoint barriers with alignment, asynchronous
//! snapshots, notify-complete, restore, stop-with-savepoint — and every operator of a
//! chain is a component speaking the WIT interface in `wit/`. This page is a tour: the
//! floors of the house from the ground up, then the life of a record and the life of a
//! checkpoint through them.
//!
//! # The floors
//!
//! Each module imports only from the floors below it.
//!
//! | floor | modules | what lives there |
//! |---|---|---|
//! | ground | [`spec`], [`guest_text`], [`durable`], [`failpoints`], [`metrics`], [`mailbox`] | what users write (the job file, the host file, every knob's default and range); guest strings made safe to print; files written whole or not at all; fault injection; counters; the task mailbox |
//! | time and state | [`timers`], [`state`] | the processing-time service and timer queues; host-managed keyed state, key groups, accounting |
//! | exchange | [`network`] | stream elements, bounded channels, partitioners, the input gate, barrier alignment |
//! | checkpoints | [`checkpoint`] | snapshots, the asynchronous part, the state file format, storage and restore, state assignment |
//! | operators | [`chain`], [`wasm`], [`connectors`] | the operator contract and chains; Wasm instances in their sandbox; native sources and sinks |
//! | the task | [`task`] | one thread running a chain: lifecycle, input, checkpointing |
//! | jobs | [`tenant`], [`job`] | tenants' limits; a job file validated into a graph, deployed as tasks, coordinated, supervised and restarted |
//! | over several hosts | [`cluster`] | a job cut into stages over Kafka exchange topics, units owned through a consumer group |
//! | the front | [`server`], [`cli`] | `sluice serve` and its HTTP API; the `sluice` command |
//!
//! # The life of a record
//!
//! 1. A source task's mailbox loop runs its default action: it polls its
//!    [`Source`](connectors::Source) for a batch, which arrives encoded as one flat buffer
//!    (the `sluice-codec` crate), with watermarks beside the records.
//! 2. The batch goes through the task's [`OperatorChain`](chain::OperatorChain): each
//!    operator gets one `process` call per batch — for a Wasm operator one crossing into
//!    its sandboxed store ([`WasmOperator`](wasm::WasmOperator)) — and returns its output
//!    records and its effects (state writes, timers, counters) as the result of that call.
//!    The chain applies the effects to the host's keyed state and hands the output, still
//!    the same flat buffer, to the next operator.
//! 3. The last operator's output is partitioned — by key group for a keyed edge — into
//!    buffers of bounded channels ([`RecordWriter`](network::RecordWriter)); a full channel
//!    blocks the writer, which is the backpressure that bounds memory.
//! 4. The next task's [`InputGate`](network::InputGate) takes buffers from all its
//!    channels, combines their watermarks and feeds its own chain; event-time timers fire
//!    where the watermark passes them, inside a batch if need be.
//! 5. A sink at the end of the last chain writes what it receives and makes it visible only
//!    when the checkpoint that covers it completes (two-phase commit), so output is exactly
//!    once across failures.
//!
//! # The life of a checkpoint
//!
//! 1. The job's coordinator triggers checkpoint *n*: a mail to every source task, which
//!    emits a barrier in-band after its current batch.
//! 2. A task with several input channels aligns the barriers
//!    ([`BarrierAligner`](network::BarrierAligner)) for exactly once, then takes the
//!    synchronous part on its own thread: every operator's `snapshot` and O(1)
//!    copy-on-write views of its keyed state and timers; it forwards the barrier.
//! 3. The asynchronous part ([`AsyncPool`](checkpoint::AsyncPool)) writes the state files
//!    on a worker thread and acknowledges to the coordinator.
//! 4. When every task acknowledged, the coordinator writes the checkpoint's metadata last,
//!    with an atomic rename ([`CheckpointStorage`](checkpoint::CheckpointStorage)): the
//!    checkpoint is complete. Then every task hears notify-complete, and sinks commit.
//! 5. After a failure the job restarts by its [`RestartStrategy`](job::RestartStrategy)
//!    from the newest complete checkpoint of its own run; each subtask gets its part of the
//!    state back by key group, at any parallelism.

pub mod chain;
pub mod checkpoint;
pub mod cli;
pub mod cluster;
pub mod connectors;
pub mod durable;
pub mod failpoints;
pub mod guest_text;
pub mod job;
pub mod mailbox;
pub mod metrics;
pub mod network;
pub mod server;
pub mod spec;
pub mod state;
pub mod task;
pub mod tenant;
pub mod timers;
pub mod wasm;
