//! The task runtime's own costs, each as a ratio against a baseline in the same run:
//!
//! * mailbox throughput: mails/s through `TaskMailbox` + `MailboxProcessor` from another
//!   thread, against the same closures through a bare crossbeam channel;
//! * task-loop overhead per batch: a `StreamTask` replaying batches through a chain of one
//!   cheap native operator, against calling the same chain directly in a loop.
//!
//! `cargo bench -p sluice-tests --bench runtime`

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread;
use std::time::Duration;

use crossbeam_channel::Select;
use sluice::chain::{ChainOutput, ChainedOperator, OpenInfo, Operator, OperatorChain};
use sluice::checkpoint::TaskId;
use sluice::mailbox::{ActionResult, MailboxProcessor, Priority, TaskMailbox};
use sluice::task::{SourceReader, StreamTask, TaskContext, TaskInput, TaskSettings};
use sluice_codec::{BatchWriter, RecordRef};
use sluice_tests::bench::{median_time, rate, runs};
use sluice_tests::native::{Native, ReplaySource};

const MAILS: u64 = 200_000;

struct Target {
    done: u64,
}

fn mailbox_run() {
    let mailbox: TaskMailbox<Target> = TaskMailbox::new("bench");
    let producer = {
        let mailbox = mailbox.clone();
        thread::spawn(move || {
            for _ in 0..MAILS {
                mailbox
                    .put(
                        Priority::DEFAULT,
                        "count",
                        Box::new(|t: &mut Target| {
                            t.done += 1;
                            Ok(())
                        }),
                    )
                    .unwrap();
            }
        })
    };
    let mut target = Target { done: 0 };
    let processor = MailboxProcessor::new(mailbox);
    processor
        .run(
            &mut target,
            |t| {
                Ok(if t.done == MAILS {
                    ActionResult::Done
                } else {
                    ActionResult::Suspend
                })
            },
            |_, doorbell| {
                let mut sel = Select::new();
                sel.recv(doorbell);
                let _ = sel.ready_timeout(Duration::from_millis(10));
                Ok(())
            },
        )
        .unwrap();
    producer.join().unwrap();
    assert_eq!(target.done, MAILS);
}

fn channel_run() {
    type Job = Box<dyn FnOnce(&mut Target) + Send>;
    let (tx, rx) = crossbeam_channel::unbounded::<Job>();
    let producer = thread::spawn(move || {
        for _ in 0..MAILS {
            tx.send(Box::new(|t: &mut Target| t.done += 1)).unwrap();
        }
    });
    let mut target = Target { done: 0 };
    while target.done < MAILS {
        (rx.recv().unwrap())(&mut target);
    }
    producer.join().unwrap();
}

fn cheap_operator() -> Box<dyn Operator> {
    Box::new(Native::new(
        "pass",
        |r: RecordRef<'_>, out: &mut BatchWriter| out.push_record(r),
    ))
}

fn chain(metrics: Arc<sluice::metrics::TaskMetrics>) -> OperatorChain {
    let ops = vec![
        ChainedOperator {
            state_id: String::new(),
            operator: cheap_operator(),
            open_info: OpenInfo::default(),
            metrics: Arc::default(),
        },
        ChainedOperator {
            state_id: String::new(),
            operator: Box::new(sluice_tests::native::discard()),
            open_info: OpenInfo::default(),
            metrics: Arc::default(),
        },
    ];
    OperatorChain::new(ops, ChainOutput::None, metrics)
}

fn main() {
    let runs = runs(7);
    println!("mailbox: {MAILS} mails from another thread, median of {runs} runs");
    let mailbox = median_time(runs, mailbox_run);
    let channel = median_time(runs, channel_run);
    let (m, c) = (
        MAILS as f64 / mailbox.as_secs_f64(),
        MAILS as f64 / channel.as_secs_f64(),
    );
    println!("  TaskMailbox + processor  {:>12}", rate(m));
    println!("  bare crossbeam channel   {:>12}", rate(c));
    println!("  mailbox / channel        {:>12.2}", m / c);

    println!("task loop: batches through a 2-operator native chain, median of {runs} runs");
    println!(
        "{:>8} {:>10} {:>14} {:>14} {:>16} {:>10}",
        "records", "batches", "direct", "task loop", "overhead/batch", "ratio"
    );
    for records_per_batch in [1usize, 16, 256] {
        let batches_n = 200_000 / records_per_batch;
        let batches: Arc<Vec<(Vec<u8>, usize)>> = Arc::new(
            (0..batches_n)
                .map(|i| {
                    let mut w = BatchWriter::new();
                    for j in 0..records_per_batch {
                        w.push(None, format!("record {i} {j}").as_bytes(), None);
                    }
                    (w.into_bytes(), records_per_batch)
                })
                .collect(),
        );
        let direct = median_time(runs, || {
            let mut c = chain(Arc::default());
            for (bytes, n) in batches.iter() {
                c.process(0, bytes.clone(), *n, Vec::new()).unwrap();
            }
        });
        let task = median_time(runs, || {
            let metrics = Arc::new(sluice::metrics::TaskMetrics::default());
            let ctx = TaskContext {
                name: "bench (1/1)".into(),
                id: TaskId {
                    vertex: 0,
                    subtask: 0,
                },
                cancel: Arc::new(AtomicBool::new(false)),
                metrics,
            };
            let settings = TaskSettings {
                batch_size: records_per_batch,
                ..TaskSettings::default()
            };
            let input = TaskInput::Source(SourceReader::plain(Box::new(ReplaySource::new(
                batches.clone(),
            ))));
            let t = StreamTask::new(
                ctx,
                settings,
                input,
                Box::new(|ctx: &TaskContext| Ok(chain(ctx.metrics.clone()))),
                None,
                None,
            );
            t.run().unwrap();
        });
        let overhead = task.saturating_sub(direct).as_secs_f64() / batches_n as f64;
        println!(
            "{records_per_batch:>8} {batches_n:>10} {:>12.1}ms {:>12.1}ms {:>14.0}ns {:>10.2}",
            direct.as_secs_f64() * 1e3,
            task.as_secs_f64() * 1e3,
            overhead * 1e9,
            direct.as_secs_f64() / task.as_secs_f64()
        );
    }
}
