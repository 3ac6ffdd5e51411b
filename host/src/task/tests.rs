//! Lifecycle tests with native operators that record the calls they receive.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Result;
use parking_lot::Mutex;
use sluice_codec::{BatchWriter, Effect, EffectWriter, TimeDomain};

use super::*;
use crate::chain::{
    Call, CallError, CallOutput, ChainOutput, ChainedOperator, OpenInfo, Operator,
    OperatorIdentity, OperatorState,
};
use crate::checkpoint::TaskId;
use crate::connectors::{Source, SourceStatus};
use crate::timers::now_millis;

type Log = Arc<Mutex<Vec<String>>>;

/// Emits the given batches, then idles until `end_at` (if any), then ends.
struct TestSource {
    batches: VecDeque<Vec<&'static str>>,
    end_at: Option<Instant>,
}

impl Source for TestSource {
    fn poll(&mut self, out: &mut BatchWriter, _max: usize) -> Result<SourceStatus> {
        if let Some(batch) = self.batches.pop_front() {
            for v in batch {
                out.push(None, v.as_bytes(), None);
            }
            return Ok(SourceStatus::More);
        }
        match self.end_at {
            Some(t) if Instant::now() < t => Ok(SourceStatus::Idle { retry_at: Some(t) }),
            None if self.batches.is_empty() && self.end_at.is_none() => Ok(SourceStatus::End),
            _ => Ok(SourceStatus::End),
        }
    }
    fn position(&self) -> Vec<u8> {
        Vec::new()
    }
    fn seek(&mut self, _position: &[u8]) -> Result<()> {
        Ok(())
    }
}

/// A source that never produces anything and never ends.
struct SilentSource;

impl Source for SilentSource {
    fn poll(&mut self, _out: &mut BatchWriter, _max: usize) -> Result<SourceStatus> {
        Ok(SourceStatus::Idle { retry_at: None })
    }
    fn position(&self) -> Vec<u8> {
        Vec::new()
    }
    fn seek(&mut self, _position: &[u8]) -> Result<()> {
        Ok(())
    }
}

#[derive(Default, Clone)]
struct Behavior {
    fail_in: Option<Call>,
    fail_dispose: bool,
    /// Pass records on (false for the tail, which stands in for a sink).
    forward: bool,
    /// Register a processing-time timer this many ms after `open`.
    timer_after_ms: Option<i64>,
    /// Runs in `dispose`.
    on_dispose: Option<Arc<dyn Fn() + Send + Sync>>,
}

struct Recording {
    identity: OperatorIdentity,
    state: OperatorState,
    log: Log,
    behavior: Behavior,
}

impl Recording {
    fn note(&self, call: Call) -> Result<(), CallError> {
        self.log
            .lock()
            .push(format!("{}:{}", self.identity.operator, call));
        if self.behavior.fail_in == Some(call) {
            return Err(CallError::Failed(format!(
                "{} fails in {call}",
                self.identity.operator
            )));
        }
        Ok(())
    }
}

impl Operator for Recording {
    fn identity(&self) -> &OperatorIdentity {
        &self.identity
    }
    fn state(&mut self) -> &mut OperatorState {
        &mut self.state
    }
    fn open(&mut self, _info: &OpenInfo) -> Result<CallOutput, CallError> {
        self.note(Call::Open)?;
        let mut effects = EffectWriter::new();
        if let Some(ms) = self.behavior.timer_after_ms {
            effects.push(Effect::RegisterTimer {
                domain: TimeDomain::ProcessingTime,
                timestamp: now_millis() + ms,
                key: b"",
            });
        }
        Ok(CallOutput {
            records: Vec::new(),
            effects: effects.take(),
        })
    }
    fn process(&mut self, records: &[u8]) -> Result<CallOutput, CallError> {
        self.note(Call::Process)?;
        Ok(CallOutput {
            records: if self.behavior.forward {
                records.to_vec()
            } else {
                Vec::new()
            },
            effects: Vec::new(),
        })
    }
    fn process_watermark(&mut self, _watermark: i64) -> Result<CallOutput, CallError> {
        self.note(Call::ProcessWatermark)?;
        Ok(CallOutput::default())
    }
    fn on_timers(&mut self, _timers: &[u8]) -> Result<CallOutput, CallError> {
        self.note(Call::OnTimers)?;
        Ok(CallOutput::default())
    }
    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, CallError> {
        self.note(Call::Snapshot)?;
        Ok(Vec::new())
    }
    fn notify_complete(&mut self, _checkpoint_id: u64) -> Result<(), CallError> {
        self.note(Call::NotifyComplete)
    }
    fn notify_aborted(&mut self, _checkpoint_id: u64) -> Result<(), CallError> {
        self.note(Call::NotifyAborted)
    }
    fn finish(&mut self) -> Result<CallOutput, CallError> {
        self.note(Call::Finish)?;
        Ok(CallOutput::default())
    }
    fn close(&mut self) -> Result<CallOutput, CallError> {
        self.note(Call::Close)?;
        Ok(CallOutput::default())
    }
    fn dispose(&mut self) -> Result<(), CallError> {
        self.note(Call::Dispose)?;
        if let Some(f) = &self.behavior.on_dispose {
            f();
        }
        if self.behavior.fail_dispose {
            return Err(CallError::Failed("dispose failed".into()));
        }
        Ok(())
    }
}

fn task_with(source: Box<dyn Source>, ops: Vec<(&'static str, Behavior)>, log: &Log) -> StreamTask {
    let ctx = TaskContext {
        name: "test (1/1)".into(),
        id: TaskId {
            vertex: 0,
            subtask: 0,
        },
        cancel: Arc::new(AtomicBool::new(false)),
        metrics: Arc::default(),
    };
    let log = log.clone();
    let factory: ChainFactory = Box::new(move |ctx: &TaskContext| {
        let operators = ops
            .into_iter()
            .map(|(name, behavior)| ChainedOperator {
                state_id: name.to_string(),
                operator: Box::new(Recording {
                    identity: OperatorIdentity {
                        tenant: "t".into(),
                        job: "j".into(),
                        operator: name.into(),
                        subtask: 0,
                        parallelism: 1,
                    },
                    state: OperatorState::new(None),
                    log: log.clone(),
                    behavior,
                }) as Box<dyn Operator>,
                open_info: OpenInfo::default(),
                metrics: Arc::default(),
            })
            .collect();
        Ok(OperatorChain::new(
            operators,
            ChainOutput::None,
            ctx.metrics.clone(),
        ))
    });
    StreamTask::new(
        ctx,
        TaskSettings::default(),
        TaskInput::Source(SourceReader::plain(source)),
        factory,
        None,
        None,
    )
}

fn two_ops(head: Behavior, tail: Behavior) -> Vec<(&'static str, Behavior)> {
    vec![
        (
            "a",
            Behavior {
                forward: true,
                ..head
            },
        ),
        ("b", tail),
    ]
}

fn taken(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.lock())
}

#[test]
fn a_clean_run_calls_every_operator_in_the_reference_order() {
    let log = Log::default();
    let source = TestSource {
        batches: VecDeque::from([vec!["x", "y"], vec!["z"]]),
        end_at: None,
    };
    let outcome = task_with(
        Box::new(source),
        two_ops(Behavior::default(), Behavior::default()),
        &log,
    )
    .run()
    .unwrap();
    assert_eq!(outcome, TaskOutcome::Finished);
    assert_eq!(
        taken(&log),
        [
            "b:open",
            "a:open", // tail to head
            "a:process",
            "b:process",
            "a:process",
            "b:process",
            "a:process-watermark",
            "b:process-watermark", // end of event time
            "a:finish",
            "b:finish", // head to tail
            "a:close",
            "b:close", // head to tail
            "b:dispose",
            "a:dispose", // tail to head
        ]
    );
}

#[test]
fn a_failure_still_disposes_every_operator_and_reports_the_first_error() {
    let log = Log::default();
    let source = TestSource {
        batches: VecDeque::from([vec!["x"]]),
        end_at: None,
    };
    let head = Behavior {
        fail_in: Some(Call::Process),
        ..Behavior::default()
    };
    let tail = Behavior {
        fail_dispose: true,
        ..Behavior::default()
    };
    let err = task_with(Box::new(source), two_ops(head, tail), &log)
        .run()
        .unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("task test (1/1) failed"), "{message}");
    assert!(message.contains("operator 'a' (subtask 1/1)"), "{message}");
    assert!(
        message.contains("failed in `process`: operator error: a fails in process"),
        "{message}"
    );
    assert!(
        !message.contains("dispose failed"),
        "a secondary error hid the first: {message}"
    );
    // No finish or close after a failure; dispose for every operator, tail to head.
    assert_eq!(
        taken(&log),
        ["b:open", "a:open", "a:process", "b:dispose", "a:dispose"]
    );
}

#[test]
fn a_task_cancelled_while_it_cleans_up_after_its_own_failure_reports_that_failure() {
    // A failed task's outputs close first; a downstream task fails on that and the job
    // cancels every task, this one too, while it still disposes its operators.
    let log = Log::default();
    let source = TestSource {
        batches: VecDeque::from([vec!["x"]]),
        end_at: None,
    };
    let handle: Arc<Mutex<Option<TaskHandle>>> = Arc::default();
    let cancel = handle.clone();
    let head = Behavior {
        fail_in: Some(Call::Process),
        ..Behavior::default()
    };
    let tail = Behavior {
        on_dispose: Some(Arc::new(move || {
            cancel.lock().as_ref().unwrap().cancel();
        })),
        ..Behavior::default()
    };
    let task = task_with(Box::new(source), two_ops(head, tail), &log);
    *handle.lock() = Some(task.handle());
    let err = task.run().unwrap_err();
    assert!(format!("{err:#}").contains("a fails in process"), "{err:#}");
}

#[test]
fn a_failing_open_skips_the_loop_and_disposes() {
    let log = Log::default();
    let source = TestSource {
        batches: VecDeque::from([vec!["x"]]),
        end_at: None,
    };
    let tail = Behavior {
        fail_in: Some(Call::Open),
        ..Behavior::default()
    };
    let err = task_with(Box::new(source), two_ops(Behavior::default(), tail), &log)
        .run()
        .unwrap_err();
    assert!(format!("{err:#}").contains("failed in `open`"));
    assert_eq!(taken(&log), ["b:open", "b:dispose", "a:dispose"]);
}

#[test]
fn an_async_exception_fails_the_running_task_and_is_ignored_afterwards() {
    let log = Log::default();
    let task = task_with(
        Box::new(SilentSource),
        two_ops(Behavior::default(), Behavior::default()),
        &log,
    );
    let handle = task.handle();
    let handler = handle.async_exception_handler();
    let runner = thread::spawn(move || task.run());
    thread::sleep(Duration::from_millis(100));
    handler.handle("timer thread failed", anyhow::anyhow!("boom"));
    let err = runner.join().unwrap().unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("timer thread failed: boom"), "{message}");
    // After the task ended, the handler does nothing (and does not panic).
    handler.handle("late", anyhow::anyhow!("ignored"));
    assert!(!taken(&log).iter().any(|c| c.ends_with(":close")));
}

#[test]
fn processing_time_timers_fire_as_mails_before_the_task_finishes() {
    let log = Log::default();
    let source = TestSource {
        batches: VecDeque::new(),
        end_at: Some(Instant::now() + Duration::from_millis(300)),
    };
    let head = Behavior {
        timer_after_ms: Some(50),
        ..Behavior::default()
    };
    task_with(Box::new(source), two_ops(head, Behavior::default()), &log)
        .run()
        .unwrap();
    let calls = taken(&log);
    let timer = calls
        .iter()
        .position(|c| c == "a:on-timers")
        .expect("the timer fired");
    let finish = calls.iter().position(|c| c == "a:finish").unwrap();
    assert!(timer < finish, "{calls:?}");
}

#[test]
fn cancel_ends_an_idle_task_without_finish_or_close_but_with_dispose() {
    let log = Log::default();
    let task = task_with(
        Box::new(SilentSource),
        two_ops(Behavior::default(), Behavior::default()),
        &log,
    );
    let handle = task.handle();
    let runner = thread::spawn(move || task.run());
    thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    handle.cancel();
    let outcome = runner.join().unwrap().unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(outcome, TaskOutcome::Cancelled { interrupted: None });
    assert_eq!(taken(&log), ["b:open", "a:open", "b:dispose", "a:dispose"]);
}

#[test]
fn mails_are_rejected_once_the_task_has_ended() {
    let log = Log::default();
    let source = TestSource {
        batches: VecDeque::new(),
        end_at: None,
    };
    let task = task_with(
        Box::new(source),
        two_ops(Behavior::default(), Behavior::default()),
        &log,
    );
    let handle = task.handle();
    task.run().unwrap();
    let err = handle.notify_complete(1).unwrap_err();
    assert!(
        err.to_string()
            .contains("mailbox of task test (1/1) is closed"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------
// Checkpoints at the task and the coordinator.

use crate::checkpoint::{AsyncPool, CheckpointLink, CheckpointStorage, CoordinatorMessage};
use crate::job::{CheckpointSettings, CheckpointStats, Coordinator, CoordinatorSetup};
use crate::network::{
    Barrier, CheckpointKind, CheckpointingMode, InputGate, NetworkSettings, Partitioner,
    RecordWriter, StreamElement, channel,
};
use crossbeam_channel::{Receiver, Sender, unbounded};

fn storage(name: &str) -> Arc<CheckpointStorage> {
    let dir = std::env::temp_dir().join(format!("sluice-task-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Arc::new(CheckpointStorage::new(dir).unwrap())
}

fn recording_chain(log: &Log, ctx: &TaskContext, output: ChainOutput) -> OperatorChain {
    recording_chain_with(log, ctx, output, Behavior::default())
}

/// One recording operator that forwards its records and otherwise behaves as `behavior`.
fn recording_chain_with(
    log: &Log,
    ctx: &TaskContext,
    output: ChainOutput,
    behavior: Behavior,
) -> OperatorChain {
    let op = ChainedOperator {
        state_id: "op".into(),
        operator: Box::new(Recording {
            identity: OperatorIdentity {
                tenant: "t".into(),
                job: "j".into(),
                operator: format!("op{}", ctx.id.vertex),
                subtask: 0,
                parallelism: 1,
            },
            state: OperatorState::new(None),
            log: log.clone(),
            behavior: Behavior {
                forward: true,
                ..behavior
            },
        }),
        open_info: OpenInfo::default(),
        metrics: Arc::default(),
    };
    OperatorChain::new(vec![op], output, ctx.metrics.clone())
}

fn context(vertex: usize) -> TaskContext {
    TaskContext {
        name: format!("task{vertex} (1/1)"),
        id: TaskId { vertex, subtask: 0 },
        cancel: Arc::new(AtomicBool::new(false)),
        metrics: Arc::default(),
    }
}

/// A task reading `inputs` and writing one output channel, with a checkpoint link.
fn network_task(
    log: &Log,
    inputs: Vec<Receiver<StreamElement>>,
    output: Sender<StreamElement>,
    link: CheckpointLink,
) -> StreamTask {
    let ctx = context(1);
    let log = log.clone();
    let writer = RecordWriter::new(
        vec![output],
        Partitioner::Forward,
        &NetworkSettings::default(),
        ctx.cancel.clone(),
        ctx.metrics.clone(),
    );
    let factory: ChainFactory = Box::new(move |ctx: &TaskContext| {
        Ok(recording_chain(&log, ctx, ChainOutput::single(writer)))
    });
    let input = TaskInput::Network(InputGate::new(inputs, CheckpointingMode::ExactlyOnce));
    StreamTask::new(
        ctx,
        TaskSettings::default(),
        input,
        factory,
        Some(link),
        None,
    )
}

fn barrier(id: u64) -> StreamElement {
    StreamElement::Barrier(Barrier {
        id,
        timestamp: 0,
        kind: CheckpointKind::Checkpoint,
    })
}

#[test]
fn a_cancel_marker_makes_the_task_decline_and_forward_it_instead_of_the_barrier() {
    let log = Log::default();
    let (in0, rx0) = channel(8);
    let (in1, rx1) = channel(8);
    let (out, downstream) = channel(64);
    let (coordinator, messages) = unbounded();
    let link = CheckpointLink::new(
        coordinator,
        storage("cancel-marker"),
        Arc::new(AsyncPool::new(1)),
    );
    let task = network_task(&log, vec![rx0, rx1], out, link);
    let runner = thread::spawn(move || task.run());

    in0.send(barrier(5)).unwrap();
    in1.send(StreamElement::CancelMarker(5)).unwrap();
    // The next checkpoint aligns and completes normally.
    in0.send(barrier(6)).unwrap();
    in1.send(barrier(6)).unwrap();
    in0.send(StreamElement::EndOfPartition).unwrap();
    in1.send(StreamElement::EndOfPartition).unwrap();
    assert_eq!(runner.join().unwrap().unwrap(), TaskOutcome::Finished);

    let sent: Vec<StreamElement> = downstream.try_iter().collect();
    assert!(sent.contains(&StreamElement::CancelMarker(5)), "{sent:?}");
    assert!(!sent.contains(&barrier(5)), "{sent:?}");
    assert!(sent.contains(&barrier(6)), "{sent:?}");
    let mut declined = vec![];
    let mut acked = vec![];
    while let Ok(m) = messages.recv_timeout(Duration::from_millis(500)) {
        match m {
            CoordinatorMessage::Decline { id, .. } => declined.push(id),
            CoordinatorMessage::Ack(a) => acked.push(a.id),
            _ => {}
        }
    }
    assert_eq!(declined, [5]);
    assert_eq!(acked, [6]);
    let calls = taken(&log);
    assert_eq!(
        calls.iter().filter(|c| *c == "op1:snapshot").count(),
        1,
        "{calls:?}"
    );
}

/// A coordinator over a source task (idle, never ending) and a network task that never
/// gets a barrier (so it never acknowledges).
struct Stuck {
    handles: Vec<TaskHandle>,
    threads: Vec<thread::JoinHandle<Result<TaskOutcome>>>,
    coordinator: Sender<CoordinatorMessage>,
    coordinator_thread: thread::JoinHandle<()>,
    stats: Arc<Mutex<CheckpointStats>>,
    _upstream: Sender<StreamElement>,
}

fn stuck_job(log: &Log, timeout: Duration) -> Stuck {
    let storage = storage(&format!("stuck-{}", timeout.as_millis()));
    let (coordinator, messages) = unbounded();
    let link = CheckpointLink::new(
        coordinator.clone(),
        storage.clone(),
        Arc::new(AsyncPool::new(1)),
    );
    let source_log = log.clone();
    let source = StreamTask::new(
        context(0),
        TaskSettings::default(),
        TaskInput::Source(SourceReader::plain(Box::new(SilentSource))),
        Box::new(move |ctx: &TaskContext| Ok(recording_chain(&source_log, ctx, ChainOutput::None))),
        Some(link.clone()),
        None,
    );
    let (upstream, rx) = channel(8);
    let (out, _downstream) = channel(8);
    let waiting = network_task(log, vec![rx], out, link);
    let handles = vec![source.handle(), waiting.handle()];
    let threads = vec![
        thread::spawn(move || source.run()),
        thread::spawn(move || waiting.run()),
    ];
    let stats = Arc::new(Mutex::new(CheckpointStats::default()));
    let setup = CoordinatorSetup {
        job: "j".into(),
        settings: CheckpointSettings {
            interval: Duration::from_millis(50),
            timeout,
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            retain: 2,
            mode: CheckpointingMode::ExactlyOnce,
            dir: storage.dir().to_path_buf(),
            phase: None,
        },
        storage,
        protect: None,
        chain_vertices: Default::default(),
        on_complete: None,
        committed_before: Some(0),
        max_parallelism: 128,
        sources_by_chain: [(0, ("source".to_string(), 1))].into(),
        operator_parallelism: Default::default(),
        sources: vec![handles[0].clone()],
        tasks: handles.clone(),
        first_id: 1,
    };
    let c = Coordinator::new(setup, messages, stats.clone());
    let coordinator_thread = thread::spawn(move || c.run());
    Stuck {
        handles,
        threads,
        coordinator,
        coordinator_thread,
        stats,
        _upstream: upstream,
    }
}

impl Stuck {
    fn wait_for_aborts(&self, n: usize) -> Vec<(u64, String)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let aborted = self.stats.lock().aborted.clone();
            if aborted.len() >= n || Instant::now() > deadline {
                return aborted;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn stop(self) {
        self.coordinator.send(CoordinatorMessage::Shutdown).unwrap();
        self.coordinator_thread.join().unwrap();
        for h in &self.handles {
            h.cancel();
        }
        for t in self.threads {
            t.join().unwrap().unwrap();
        }
    }
}

#[test]
fn a_checkpoint_not_acknowledged_in_time_is_aborted_and_operators_hear_of_it() {
    let log = Log::default();
    let job = stuck_job(&log, Duration::from_millis(200));
    let aborted = job.wait_for_aborts(1);
    assert!(
        aborted[0].1.contains("not complete after the timeout"),
        "{aborted:?}"
    );
    assert!(job.stats.lock().completed.is_empty());
    thread::sleep(Duration::from_millis(100));
    job.stop();
    let calls = taken(&log);
    // The source took part (snapshot); both tasks' operators heard of the abort.
    assert!(calls.contains(&"op0:snapshot".to_string()), "{calls:?}");
    assert!(
        calls.contains(&"op0:notify-aborted".to_string()),
        "{calls:?}"
    );
    assert!(
        calls.contains(&"op1:notify-aborted".to_string()),
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c.ends_with("notify-complete")),
        "{calls:?}"
    );
}

#[test]
fn a_decline_aborts_the_checkpoint_with_its_reason() {
    let log = Log::default();
    let job = stuck_job(&log, Duration::from_secs(60));
    // Wait for checkpoint 1 to be pending, then let the waiting task decline it.
    thread::sleep(Duration::from_millis(150));
    job.coordinator
        .send(CoordinatorMessage::Decline {
            id: 1,
            task: TaskId {
                vertex: 1,
                subtask: 0,
            },
            reason: "disk full".into(),
        })
        .unwrap();
    let aborted = job.wait_for_aborts(1);
    assert_eq!(aborted[0], (1, "disk full".to_string()));
    job.stop();
    assert!(taken(&log).contains(&"op1:notify-aborted".to_string()));
}

/// A source task over `source` with one recording operator writing to a channel, and a
/// checkpoint link whose messages the test reads.
struct LinkedSource {
    task: StreamTask,
    coordinator: Receiver<CoordinatorMessage>,
    downstream: Receiver<StreamElement>,
}

fn linked_source(
    log: &Log,
    source: Box<dyn Source>,
    behavior: Behavior,
    name: &str,
) -> LinkedSource {
    let (coordinator, messages) = unbounded();
    let link = CheckpointLink::new(coordinator, storage(name), Arc::new(AsyncPool::new(1)));
    let (out, downstream) = channel(64);
    let ctx = context(0);
    let writer = forward_writer(&ctx, out);
    let log = log.clone();
    let task = StreamTask::new(
        ctx,
        TaskSettings::default(),
        TaskInput::Source(SourceReader::plain(source)),
        Box::new(move |ctx: &TaskContext| {
            Ok(recording_chain_with(
                &log,
                ctx,
                ChainOutput::single(writer),
                behavior,
            ))
        }),
        Some(link),
        None,
    );
    LinkedSource {
        task,
        coordinator: messages,
        downstream,
    }
}

fn next_message(messages: &Receiver<CoordinatorMessage>) -> CoordinatorMessage {
    messages
        .recv_timeout(Duration::from_secs(10))
        .expect("a message for the coordinator")
}

fn savepoint(id: u64, drain: bool) -> Barrier {
    Barrier {
        id,
        timestamp: 0,
        kind: CheckpointKind::Savepoint { stop: true, drain },
    }
}

/// A finished source whose final checkpoint completed may still find a later trigger in
/// its mailbox (the coordinator keeps triggering while any source task lives). The tasks
/// downstream have ended by then; the trigger must not make the source send to them.
#[test]
fn a_trigger_after_the_final_checkpoint_sends_nothing_downstream() {
    let log = Log::default();
    let source = TestSource {
        batches: VecDeque::from([vec!["x"]]),
        end_at: None,
    };
    let LinkedSource {
        task,
        coordinator,
        downstream,
    } = linked_source(&log, Box::new(source), Behavior::default(), "after-final");
    let handle = task.handle();
    let runner = thread::spawn(move || task.run());
    assert!(matches!(
        next_message(&coordinator),
        CoordinatorMessage::InputEnded(_)
    ));
    let StreamElement::Barrier(first) = barrier(1) else {
        unreachable!()
    };
    handle.trigger_checkpoint(first).unwrap();
    let CoordinatorMessage::Ack(ack) = next_message(&coordinator) else {
        panic!("expected the final checkpoint's acknowledgement");
    };
    assert!(ack.finished);
    // The downstream task ends after the final checkpoint; the next trigger comes
    // with the completion.
    let sent: Vec<StreamElement> = downstream.try_iter().collect();
    assert!(sent.contains(&barrier(1)), "{sent:?}");
    drop(downstream);
    handle.notify_complete(1).unwrap();
    let StreamElement::Barrier(second) = barrier(2) else {
        unreachable!()
    };
    let late = handle.trigger_checkpoint(second);
    assert_eq!(runner.join().unwrap().unwrap(), TaskOutcome::Finished);
    if late.is_ok() {
        // Taken in: settled by the final checkpoint, neither acknowledged nor declined.
        let after: Vec<_> = coordinator.try_iter().collect();
        assert!(
            !after.iter().any(|m| matches!(
                m,
                CoordinatorMessage::Ack(_) | CoordinatorMessage::Decline { .. }
            )),
            "{after:?}"
        );
    }
}

/// A source that never ends, for stop-with-savepoint.
fn endless() -> Box<dyn Source> {
    Box::new(SilentSource)
}

/// Starts a stop-with-savepoint on `task` and waits for its acknowledgement: the task is
/// then in its synchronous-savepoint loop.
fn in_savepoint_loop(
    task: StreamTask,
    coordinator: &Receiver<CoordinatorMessage>,
    drain: bool,
) -> (TaskHandle, thread::JoinHandle<Result<TaskOutcome>>) {
    let handle = task.handle();
    let runner = thread::spawn(move || task.run());
    handle.trigger_checkpoint(savepoint(1, drain)).unwrap();
    assert!(matches!(next_message(coordinator), CoordinatorMessage::Ack(a) if a.id == 1));
    (handle, runner)
}

#[test]
fn a_mail_failing_in_the_savepoint_loop_fails_the_task() {
    let log = Log::default();
    let behavior = Behavior {
        fail_in: Some(Call::NotifyComplete),
        ..Behavior::default()
    };
    let source = linked_source(&log, endless(), behavior, "loop-mail-fails");
    let (handle, runner) = in_savepoint_loop(source.task, &source.coordinator, false);
    // The sink's commit fails after the savepoint completed: the task must not wait for
    // anything more, nor end as if stopped.
    handle.notify_complete(1).unwrap();
    let err = runner.join().unwrap().unwrap_err();
    assert!(
        format!("{err:#}").contains("op0 fails in notify-complete"),
        "{err:#}"
    );
}

#[test]
fn processing_time_timers_do_not_fire_in_the_savepoint_loop() {
    let log = Log::default();
    let behavior = Behavior {
        timer_after_ms: Some(30),
        ..Behavior::default()
    };
    let source = linked_source(&log, endless(), behavior, "loop-timers");
    let (handle, runner) = in_savepoint_loop(source.task, &source.coordinator, false);
    // The timer is due while the task waits for the savepoint to complete; a mail that
    // the loop runs (an abort of an older checkpoint) comes after it.
    thread::sleep(Duration::from_millis(100));
    handle.notify_aborted(0).unwrap();
    handle.notify_complete(1).unwrap();
    assert_eq!(runner.join().unwrap().unwrap(), TaskOutcome::Finished);
    let calls = taken(&log);
    assert!(
        calls.contains(&"op0:notify-aborted".to_string()),
        "{calls:?}"
    );
    // Stopped without drain: the job resumes from the savepoint, where the timer is. (On
    // a slow machine it may have fired before the savepoint began, which is fine.)
    let position = |call: &str| calls.iter().position(|c| c == call);
    let snapshot = position("op0:snapshot").expect("the savepoint's snapshot");
    assert!(
        position("op0:on-timers").is_none_or(|t| t < snapshot),
        "{calls:?}"
    );
}

#[test]
fn an_aborted_savepoint_with_drain_fails_the_task_and_without_drain_it_goes_on() {
    let log = Log::default();
    let source = linked_source(&log, endless(), Behavior::default(), "drain-aborted");
    let (handle, runner) = in_savepoint_loop(source.task, &source.coordinator, true);
    handle.notify_aborted(1).unwrap();
    let err = runner.join().unwrap().unwrap_err();
    assert!(
        format!("{err:#}").contains("event time had advanced to the end"),
        "{err:#}"
    );

    let source = linked_source(&log, endless(), Behavior::default(), "kept-aborted");
    let (handle, runner) = in_savepoint_loop(source.task, &source.coordinator, false);
    handle.notify_aborted(1).unwrap();
    // It runs on and takes the next checkpoint.
    let StreamElement::Barrier(next) = barrier(2) else {
        unreachable!()
    };
    handle.trigger_checkpoint(next).unwrap();
    assert!(matches!(next_message(&source.coordinator), CoordinatorMessage::Ack(a) if a.id == 2));
    handle.cancel();
    assert!(runner.join().unwrap().is_ok());
}

/// Drained, a stop-with-savepoint is the task's final checkpoint: the operators finish
/// before the snapshot, so what `finish` flushes goes out before the barrier and is
/// committed with the savepoint (after it, no sink would commit it), and they are not
/// finished a second time when the task ends.
#[test]
fn a_drained_stop_finishes_the_operators_before_the_savepoint() {
    let log = Log::default();
    let source = linked_source(&log, endless(), Behavior::default(), "drain-finish");
    let (handle, runner) = in_savepoint_loop(source.task, &source.coordinator, true);
    let sent: Vec<StreamElement> = source.downstream.try_iter().collect();
    assert!(
        sent.contains(&StreamElement::Barrier(savepoint(1, true))),
        "{sent:?}"
    );
    handle.notify_complete(1).unwrap();
    assert_eq!(runner.join().unwrap().unwrap(), TaskOutcome::Finished);
    let calls = taken(&log);
    let position = |call: &str| calls.iter().position(|c| c == call);
    let finish = position("op0:finish").expect("finish was called");
    let snapshot = position("op0:snapshot").expect("the savepoint's snapshot");
    assert!(finish < snapshot, "{calls:?}");
    assert_eq!(
        calls.iter().filter(|c| *c == "op0:finish").count(),
        1,
        "{calls:?}"
    );
}

/// A source stopped by a full output channel must go on as soon as the channel has room,
/// even when the receiver made that room after the source looked: it then finds no full
/// channel to wait on, and before waited for a mail instead, which without a buffer
/// timeout (or checkpoints) never comes. The steps are taken one by one so the order is
/// the one that stalled.
#[test]
fn a_source_blocked_on_output_goes_on_when_room_appears_before_it_waits() {
    let log = Log::default();
    let source = TestSource {
        batches: VecDeque::from([vec!["a"], vec!["b"], vec!["c"]]),
        end_at: None,
    };
    let (out, downstream) = channel(1);
    let ctx = context(0);
    let writer = forward_writer(&ctx, out);
    let settings = TaskSettings {
        buffer_timeout: Duration::ZERO,
        ..TaskSettings::default()
    };
    let chain_log = log.clone();
    let mut task = StreamTask::new(
        ctx,
        settings,
        TaskInput::Source(SourceReader::plain(Box::new(source))),
        Box::new(move |ctx: &TaskContext| {
            Ok(recording_chain_with(
                &chain_log,
                ctx,
                ChainOutput::single(writer),
                Behavior::default(),
            ))
        }),
        None,
        None,
    );
    open_by_hand(&mut task);
    // "a" fills the channel; the next action finds it full.
    assert_eq!(task.default_action().unwrap(), ActionResult::Continue);
    assert_eq!(task.default_action().unwrap(), ActionResult::Suspend);
    // The receiver takes "a" before the task waits.
    assert!(matches!(
        downstream.recv().unwrap(),
        StreamElement::Records { .. }
    ));
    let (_bell, doorbell) = crossbeam_channel::bounded::<()>(1);
    let (done, waited) = crossbeam_channel::bounded(1);
    let waiter = thread::spawn(move || {
        task.wait_for_input(&doorbell).unwrap();
        done.send(()).unwrap();
        task
    });
    waited
        .recv_timeout(Duration::from_secs(10))
        .expect("the source waited for a mail although its output had room");
    let mut task = waiter.join().unwrap();
    assert_eq!(task.default_action().unwrap(), ActionResult::Continue);
    assert!(matches!(
        downstream.recv().unwrap(),
        StreamElement::Records { .. }
    ));
}

/// A processing-time timer whose mail runs only after a stop-with-savepoint completed
/// (the timer thread was late) does not fire: the job resumes from the savepoint, which
/// holds the timer. The mail is run by hand after the completion, the order a loaded
/// machine produced.
#[test]
fn a_timer_mail_after_a_completed_stop_with_savepoint_fires_nothing() {
    let log = Log::default();
    let LinkedSource { mut task, .. } =
        linked_source(&log, endless(), behavior_with_timer(), "late-timer");
    open_by_hand(&mut task);
    // In the synchronous savepoint of a stop without drain, which then completes.
    task.sync_savepoint = Some((1, false));
    task.notify_checkpoint_complete(1).unwrap();
    task.on_processing_time(now_millis()).unwrap();
    let calls = taken(&log);
    assert!(!calls.contains(&"op0:on-timers".to_string()), "{calls:?}");
    // Before the stop, the same mail fires the due timer.
    let LinkedSource { mut task, .. } =
        linked_source(&log, endless(), behavior_with_timer(), "due-timer");
    open_by_hand(&mut task);
    task.on_processing_time(now_millis()).unwrap();
    assert!(taken(&log).contains(&"op0:on-timers".to_string()));
}

/// An operator that registers a processing-time timer already due when it opens.
fn behavior_with_timer() -> Behavior {
    Behavior {
        timer_after_ms: Some(-1_000),
        ..Behavior::default()
    }
}

/// A writer of `ctx`'s task to one channel.
fn forward_writer(ctx: &TaskContext, out: Sender<StreamElement>) -> RecordWriter {
    RecordWriter::new(
        vec![out],
        Partitioner::Forward,
        &NetworkSettings::default(),
        ctx.cancel.clone(),
        ctx.metrics.clone(),
    )
}

/// Builds and opens the task's chain and marks it running, as `run` does before its
/// loop, so a test can take the loop's steps one by one.
fn open_by_hand(task: &mut StreamTask) {
    let factory = task.chain_factory.take().unwrap();
    task.chain = Some(factory(&task.ctx).unwrap());
    task.chain().open_all().unwrap();
    task.running = true;
}
