//! The chain's handling of watermarks inside batches, with scripted operators.

use std::sync::Arc;

use parking_lot::Mutex;
use sluice_codec::{BatchReader, BatchWriter, TimeDomain, TimerReader};

use super::*;
use crate::network::BatchWatermark;

type Log = Arc<Mutex<Vec<String>>>;

/// What a scripted operator's `process_batch` returns, given the batch.
type Script = Box<dyn FnMut(&[u8], &[BatchWatermark]) -> ProcessOutput + Send>;

/// The effects a scripted operator's `on_timers` returns, given its timers.
type TimerScript = Box<dyn FnMut(&[u8]) -> Vec<u8> + Send>;

/// An operator that logs its calls and answers `process_batch` from a script.
struct Scripted {
    identity: OperatorIdentity,
    state: OperatorState,
    log: Log,
    takes_watermarks: bool,
    script: Script,
    /// What `close` emits.
    close_emits: Vec<&'static str>,
    /// The effects `on_timers` returns, given its timers.
    timer_effects: Option<TimerScript>,
}

impl Scripted {
    fn note(&self, what: String) {
        self.log
            .lock()
            .push(format!("{} {what}", self.identity.operator));
    }
}

fn values(records: &[u8]) -> Vec<String> {
    BatchReader::new(records)
        .map(|r| String::from_utf8(r.unwrap().value.to_vec()).unwrap())
        .collect()
}

impl Operator for Scripted {
    fn identity(&self) -> &OperatorIdentity {
        &self.identity
    }
    fn state(&mut self) -> &mut OperatorState {
        &mut self.state
    }
    fn open(&mut self, _: &OpenInfo) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }
    fn process(&mut self, records: &[u8]) -> Result<CallOutput, CallError> {
        self.note(format!("process {:?}", values(records)));
        Ok(CallOutput::default())
    }
    fn takes_batch_watermarks(&self) -> bool {
        self.takes_watermarks
    }
    fn process_batch(
        &mut self,
        _input: u32,
        records: &[u8],
        watermarks: &[BatchWatermark],
    ) -> Result<ProcessOutput, CallError> {
        let marks: Vec<String> = watermarks
            .iter()
            .map(|w| format!("{}@{}", w.watermark, w.before))
            .collect();
        self.note(format!("process {:?} {marks:?}", values(records)));
        Ok((self.script)(records, watermarks))
    }
    fn process_watermark(&mut self, watermark: i64) -> Result<CallOutput, CallError> {
        self.note(format!("watermark {watermark}"));
        Ok(CallOutput::default())
    }
    fn on_timers(&mut self, timers: &[u8]) -> Result<CallOutput, CallError> {
        let times: Vec<i64> = TimerReader::new(timers)
            .map(|t| t.unwrap().timestamp)
            .collect();
        self.note(format!("timers {times:?}"));
        let effects = self
            .timer_effects
            .as_mut()
            .map_or(Vec::new(), |f| f(timers));
        Ok(CallOutput {
            records: Vec::new(),
            effects,
        })
    }
    fn snapshot(&mut self, _: u64) -> Result<Vec<u8>, CallError> {
        Ok(Vec::new())
    }
    fn notify_complete(&mut self, _: u64) -> Result<(), CallError> {
        Ok(())
    }
    fn notify_aborted(&mut self, _: u64) -> Result<(), CallError> {
        Ok(())
    }
    fn finish(&mut self) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }
    fn close(&mut self) -> Result<CallOutput, CallError> {
        Ok(CallOutput {
            records: batch(&self.close_emits),
            effects: Vec::new(),
        })
    }
    fn dispose(&mut self) -> Result<(), CallError> {
        Ok(())
    }
}

fn scripted(name: &str, takes_watermarks: bool, log: &Log, script: Script) -> ChainedOperator {
    link(Scripted {
        identity: OperatorIdentity {
            tenant: "t".into(),
            job: "j".into(),
            operator: name.into(),
            subtask: 0,
            parallelism: 1,
        },
        state: OperatorState::new(None),
        log: log.clone(),
        takes_watermarks,
        script,
        close_emits: Vec::new(),
        timer_effects: None,
    })
}

fn link(operator: Scripted) -> ChainedOperator {
    ChainedOperator {
        state_id: operator.identity.operator.clone(),
        operator: Box::new(operator),
        open_info: OpenInfo::default(),
        metrics: Arc::default(),
    }
}

/// Emits nothing and passes on nothing.
fn silent() -> Script {
    Box::new(|_, _| ProcessOutput::default())
}

fn batch(values: &[&str]) -> Vec<u8> {
    let mut w = BatchWriter::new();
    for v in values {
        w.push(None, v.as_bytes(), Some(1));
    }
    w.into_bytes()
}

fn at(before: u32, watermark: i64) -> BatchWatermark {
    BatchWatermark { before, watermark }
}

fn chain(operators: Vec<ChainedOperator>) -> OperatorChain {
    OperatorChain::new(operators, ChainOutput::None, Arc::default())
}

#[test]
fn a_batch_is_cut_where_a_watermark_makes_a_timer_due() {
    let log = Log::default();
    let mut c = chain(vec![scripted("a", true, &log, silent())]);
    c.operators_mut()[0]
        .operator
        .state()
        .timers
        .register(TimeDomain::EventTime, 10, b"k");
    c.process(0, batch(&["r0", "r1", "r2"]), 3, vec![at(1, 5), at(2, 12)])
        .unwrap();
    assert_eq!(
        *log.lock(),
        [
            r#"a process ["r0", "r1"] ["5@1"]"#,
            "a timers [10]",
            r#"a process ["r2"] ["12@0"]"#,
        ]
    );
    assert_eq!(c.operators_mut()[0].operator.state().watermark, 12);
}

#[test]
fn watermarks_reach_the_next_operator_when_one_emits_nothing() {
    let log = Log::default();
    // `a` takes the watermarks and passes them on without records; `b` is of 0.1.0.
    let pass_on: Script = Box::new(|_, given| ProcessOutput {
        watermarks: given.iter().map(|w| at(0, w.watermark)).collect(),
        ..ProcessOutput::default()
    });
    let mut c = chain(vec![
        scripted("a", true, &log, pass_on),
        scripted("b", false, &log, silent()),
    ]);
    c.process(0, batch(&["r0", "r1"]), 2, vec![at(1, 7)])
        .unwrap();
    // And when it passes on nothing at all, the host still forwards the watermark.
    let mut d = chain(vec![
        scripted("a", true, &log, silent()),
        scripted("b", false, &log, silent()),
    ]);
    d.process(0, batch(&["r2"]), 1, vec![at(1, 9)]).unwrap();
    assert_eq!(
        *log.lock(),
        [
            r#"a process ["r0", "r1"] ["7@1"]"#,
            "b watermark 7",
            r#"a process ["r2"] ["9@1"]"#,
            "b watermark 9",
        ]
    );
}

#[test]
fn where_a_guest_stops_and_what_it_passes_on_are_checked() {
    let log = Log::default();
    let cases: Vec<(Script, &str)> = vec![
        (
            Box::new(|_, _| ProcessOutput {
                stopped_at: Some(7),
                ..ProcessOutput::default()
            }),
            "stopped at watermark 7 of the 1",
        ),
        (
            Box::new(|_, _| ProcessOutput {
                stopped_at: Some(0),
                ..ProcessOutput::default()
            }),
            "without handling anything before it",
        ),
        (
            Box::new(|_, _| ProcessOutput {
                watermarks: vec![at(0, 50)],
                ..ProcessOutput::default()
            }),
            "passed on watermark 50 beyond those it handled",
        ),
        (
            Box::new(|_, _| ProcessOutput {
                output: CallOutput {
                    records: batch(&["x"]),
                    effects: Vec::new(),
                },
                watermarks: vec![at(0, 3), at(0, 2)],
                ..ProcessOutput::default()
            }),
            "returned watermarks out of order",
        ),
        (
            Box::new(|_, _| ProcessOutput {
                watermarks: vec![at(4, 3)],
                ..ProcessOutput::default()
            }),
            "returned a watermark before record 4 of 0",
        ),
        (
            Box::new(|_, _| {
                let mut w = BatchWriter::new();
                w.push_record(sluice_codec::RecordRef {
                    output: 3,
                    ..sluice_codec::RecordRef::new(None, b"side", None)
                });
                ProcessOutput {
                    output: CallOutput {
                        records: w.into_bytes(),
                        effects: Vec::new(),
                    },
                    ..ProcessOutput::default()
                }
            }),
            "emitted a record to side output 3 but declared 0",
        ),
    ];
    for (script, expected) in cases {
        let mut c = chain(vec![
            scripted("hostile", true, &log, script),
            scripted("next", true, &log, silent()),
        ]);
        let err = c
            .process(0, batch(&["r0"]), 1, vec![at(0, 5)])
            .expect_err(expected);
        let text = format!("{err:#}");
        assert!(text.contains(expected), "{expected:?} not in {text}");
        assert!(text.contains("broke the operator contract"), "{text}");
    }
}

#[test]
fn watermarks_already_seen_or_at_one_position_reach_an_operator_once() {
    let log = Log::default();
    let mut c = chain(vec![scripted("a", true, &log, silent())]);
    c.operators_mut()[0].operator.state().watermark = 4;
    c.process(
        0,
        batch(&["r0", "r1"]),
        2,
        vec![at(0, 3), at(0, 4), at(1, 6), at(1, 8)],
    )
    .unwrap();
    assert_eq!(*log.lock(), [r#"a process ["r0", "r1"] ["8@1"]"#]);
}

#[test]
fn the_last_watermark_of_a_batch_reaches_the_output_alone_when_its_buffer_holds_it() {
    use crate::network::{NetworkSettings, Partitioner, RecordWriter, StreamElement, channel};
    let log = Log::default();
    // Passes its records on, with the watermark after the last of them.
    let echo: Script = Box::new(|records, given| ProcessOutput {
        output: CallOutput {
            records: records.to_vec(),
            effects: Vec::new(),
        },
        watermarks: given.to_vec(),
        ..ProcessOutput::default()
    });
    let (tx, rx) = channel(16);
    let writer = RecordWriter::new(
        vec![tx],
        Partitioner::Forward,
        &NetworkSettings::default(),
        Arc::default(),
        Arc::default(),
    );
    let mut c = OperatorChain::new(
        vec![scripted("a", true, &log, echo)],
        ChainOutput::single(writer),
        Arc::default(),
    );
    c.process(0, batch(&["r0", "r1"]), 2, vec![at(1, 5), at(2, 9)])
        .unwrap();
    c.flush_outputs().unwrap();
    let received: Vec<String> = rx
        .try_iter()
        .map(|e| match e {
            StreamElement::Records { watermarks, .. } => format!("records {watermarks:?}"),
            other => format!("{other:?}"),
        })
        .collect();
    // 9 came after the last record: the buffer keeps it for the next records, so it
    // also goes alone once the batch is through.
    assert_eq!(
        received,
        [
            "records [BatchWatermark { before: 1, watermark: 5 }]".to_owned(),
            "Watermark(9)".to_owned()
        ]
    );
}

/// `close` runs after the final checkpoint committed the output: records it emits would
/// reach no commit, so the chain refuses them by operator and call, whatever the plugin's
/// language or SDK.
#[test]
fn records_emitted_in_close_fail_the_call() {
    let log = Log::default();
    let closer = ChainedOperator {
        operator: Box::new(Scripted {
            identity: OperatorIdentity {
                tenant: "t".into(),
                job: "j".into(),
                operator: "closer".into(),
                subtask: 0,
                parallelism: 1,
            },
            state: OperatorState::new(None),
            log: log.clone(),
            takes_watermarks: false,
            script: silent(),
            close_emits: vec!["late", "later"],
            timer_effects: None,
        }),
        ..scripted("closer", false, &log, silent())
    };
    let mut c = chain(vec![scripted("quiet", false, &log, silent()), closer]);
    let e = format!("{:#}", c.close_all().unwrap_err());
    assert!(e.contains("operator 'closer'"), "{e}");
    assert!(e.contains("failed in `close`"), "{e}");
    assert!(
        e.contains("emitted 2 record(s) from `close`, which may not emit"),
        "{e}"
    );
}

/// A watermark that makes ten thousand timers due at one time (a window over ten thousand
/// keys) fires them in calls of at most [`TIMERS_PER_CALL`], every one once, in time and
/// key order.
#[test]
fn many_due_timers_fire_in_calls_of_a_bounded_size() {
    let log = Log::default();
    let mut c = chain(vec![scripted("a", true, &log, silent())]);
    let timers = &mut c.operators_mut()[0].operator.state().timers;
    for k in 0..10_000u32 {
        timers.register(TimeDomain::EventTime, 7, format!("k{k:05}").as_bytes());
    }
    timers.register(TimeDomain::EventTime, 3, b"early");
    c.process(0, batch(&["r0"]), 1, vec![at(1, 10)]).unwrap();
    let log = log.lock();
    let calls: Vec<Vec<i64>> = log
        .iter()
        .filter_map(|l| l.strip_prefix("a timers "))
        .map(|t| serde_json::from_str(t).unwrap())
        .collect();
    let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
    assert_eq!(
        sizes,
        [
            TIMERS_PER_CALL,
            TIMERS_PER_CALL,
            10_001 - 2 * TIMERS_PER_CALL
        ]
    );
    assert_eq!(calls[0][0], 3, "the earliest first");
    assert!(calls.concat()[1..].iter().all(|t| *t == 7));
    assert!(c.operators_mut()[0].operator.state().timers.is_empty());
}

/// An operator that answers every `on-timers` with as many new timers, all due at once,
/// never lets the due set drain: it is cut after [`MAX_TIMER_ROUNDS`] calls' worth of
/// them, with the limit's message, instead of holding its task for ever.
#[test]
fn an_operator_refilling_its_due_timers_is_cut() {
    let log = Log::default();
    let mut next = 0u64;
    let refill = move |timers: &[u8]| {
        let mut w = sluice_codec::EffectWriter::new();
        for _ in TimerReader::new(timers) {
            next += 1;
            w.push(sluice_codec::Effect::RegisterTimer {
                domain: TimeDomain::EventTime,
                timestamp: 5,
                key: format!("n{next}").as_bytes(),
            });
        }
        w.take()
    };
    let mut c = chain(vec![link(Scripted {
        identity: OperatorIdentity {
            tenant: "t".into(),
            job: "j".into(),
            operator: "a".into(),
            subtask: 0,
            parallelism: 1,
        },
        state: OperatorState::new(None),
        log: log.clone(),
        takes_watermarks: true,
        script: silent(),
        close_emits: Vec::new(),
        timer_effects: Some(Box::new(refill)),
    })]);
    let timers = &mut c.operators_mut()[0].operator.state().timers;
    for k in 0..TIMERS_PER_CALL {
        timers.register(TimeDomain::EventTime, 5, format!("k{k}").as_bytes());
    }
    let err = c
        .process(0, batch(&["r0"]), 1, vec![at(1, 10)])
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("rounds of `on-timers`"),
        "{err:#}"
    );
    let calls = log
        .lock()
        .iter()
        .filter(|l| l.starts_with("a timers"))
        .count();
    assert!(
        (MAX_TIMER_ROUNDS..=MAX_TIMER_ROUNDS + 2).contains(&calls),
        "{calls} calls"
    );
}
