//! The SDK against the test harness: keyed state and its cache, effects, timers, snapshots.
//!
//! `Probe` runs the commands in each record's value (`;`-separated) against the record's
//! key and emits what reads return, so a test can put several steps into one call or
//! spread them over several.

use std::time::Duration;

use sluice_sdk::testing::Harness;
use sluice_sdk::{
    Context, Error, Level, ListState, MapState, OpenContext, Operator, Record, Result, TimeDomain,
    Timer, ValueState, to_bytes,
};

struct Probe {
    value: ValueState<u64>,
    list: ListState<String>,
    map: MapState<String, u64>,
    ttl: ValueState<u64>,
    /// Operator state (not keyed): number of records processed, kept through snapshots.
    processed: u64,
    /// On `on_timer` at this time, register an event timer at this time + 1.
    chain_timers_until: i64,
}

impl Operator for Probe {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        ctx.config().check_known(&["chain-timers-until"])?;
        Ok(Probe {
            value: ctx.value_state("value")?,
            list: ctx.list_state("list")?,
            map: ctx.map_state("map")?,
            ttl: ctx.value_state_with_ttl("ttl", Duration::from_millis(100))?,
            processed: ctx.restore()?.unwrap_or(0),
            chain_timers_until: ctx.config().parse_or("chain-timers-until", i64::MIN)?,
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        self.processed += 1;
        let key = record.require_key()?;
        for command in record.value_str()?.split(';') {
            let words: Vec<&str> = command.split_whitespace().collect();
            let out = match words[..] {
                ["put", n] => self.value.put(ctx, key, &n.parse()?).map(|()| None)?,
                ["get"] => Some(show(self.value.get(ctx, key)?)),
                ["incr"] => self
                    .value
                    .update(ctx, key, |n| Some(n.unwrap_or(0) + 1))?
                    .map(|n| n.to_string()),
                ["clear"] => self.value.clear(ctx, key).map(|()| None)?,
                ["ladd", item] => self.list.add(ctx, key, &item.to_owned()).map(|()| None)?,
                ["lget"] => Some(self.list.get(ctx, key)?.join(",")),
                ["lclear"] => self.list.clear(ctx, key).map(|()| None)?,
                ["mput", k, n] => self
                    .map
                    .put(ctx, key, &k.to_owned(), &n.parse()?)
                    .map(|()| None)?,
                ["mget", k] => Some(show(self.map.get(ctx, key, &k.to_owned())?)),
                ["mremove", k] => self.map.remove(ctx, key, &k.to_owned()).map(|()| None)?,
                ["mentries"] => Some(
                    self.map
                        .entries(ctx, key)?
                        .iter()
                        .map(|(k, n)| format!("{k}={n}"))
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                ["mclear"] => self.map.clear(ctx, key).map(|()| None)?,
                ["tput", n] => self.ttl.put(ctx, key, &n.parse()?).map(|()| None)?,
                ["tget"] => Some(show(self.ttl.get(ctx, key)?)),
                ["event", t] => {
                    ctx.register_event_timer(key, t.parse()?);
                    None
                }
                ["unevent", t] => {
                    ctx.delete_event_timer(key, t.parse()?);
                    None
                }
                ["proc", t] => {
                    ctx.register_processing_timer(key, t.parse()?);
                    None
                }
                ["unproc", t] => {
                    ctx.delete_processing_timer(key, t.parse()?);
                    None
                }
                ["count", name, n] => {
                    ctx.add_counter(name, n.parse()?);
                    None
                }
                ["log", text] => {
                    ctx.warn(text);
                    None
                }
                ["emit", text] => Some(text.to_owned()),
                ["fail"] => return Err(Error::failed("asked to fail")),
                _ => return Err(Error::failed(format!("unknown command {command:?}"))),
            };
            if let Some(out) = out {
                ctx.emit(Some(key), out.as_bytes());
            }
        }
        Ok(())
    }

    fn process_watermark(&mut self, watermark: i64, ctx: &mut Context<'_>) -> Result<()> {
        ctx.emit(None, format!("watermark {watermark}").as_bytes());
        Ok(())
    }

    fn on_timer(&mut self, timer: Timer<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let domain = match timer.domain {
            TimeDomain::EventTime => "event",
            TimeDomain::ProcessingTime => "processing",
        };
        let key = String::from_utf8_lossy(timer.key);
        let text = format!("timer {domain} {} {key}", timer.timestamp);
        ctx.emit(Some(timer.key), text.as_bytes());
        if timer.timestamp < self.chain_timers_until {
            ctx.register_event_timer(timer.key, timer.timestamp + 1);
        }
        Ok(())
    }

    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>> {
        to_bytes(&self.processed)
    }

    fn finish(&mut self, ctx: &mut Context<'_>) -> Result<()> {
        ctx.emit(
            None,
            format!("finish after {} records", self.processed).as_bytes(),
        );
        Ok(())
    }
}

fn show(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

fn probe() -> Harness<Probe> {
    Harness::<Probe>::builder().keyed(true).open().unwrap()
}

/// Runs `commands` for key `a` and returns the values emitted.
fn run(h: &mut Harness<Probe>, commands: &str) -> Result<Vec<String>> {
    h.take_output();
    h.process(Some("a"), commands, None)?;
    Ok(h.output_values_str())
}

#[test]
fn value_state_reads_its_own_writes_within_and_across_calls() -> Result<()> {
    let mut h = probe();
    assert_eq!(
        run(&mut h, "get;put 5;get;incr;incr;get")?,
        ["none", "5", "6", "7", "7"]
    );
    assert_eq!(h.state_value::<u64>("value", b"a")?, Some(7));
    assert_eq!(run(&mut h, "get;incr")?, ["7", "8"]);
    assert_eq!(run(&mut h, "clear;get")?, ["none"]);
    assert_eq!(run(&mut h, "get")?, ["none"]);
    assert_eq!(h.state_value::<u64>("value", b"a")?, None);
    // Keys are separate.
    h.process(Some("b"), "put 1", None)?;
    assert_eq!(h.state_value::<u64>("value", b"a")?, None);
    assert_eq!(h.state_value::<u64>("value", b"b")?, Some(1));
    Ok(())
}

#[test]
fn a_failed_call_changes_nothing() -> Result<()> {
    let mut h = probe();
    run(&mut h, "put 1")?;
    let err = run(
        &mut h,
        "put 9;ladd x;mput k 1;event 5;count c 1;emit lost;fail",
    )
    .unwrap_err();
    assert_eq!(err, Error::failed("asked to fail"));
    assert!(h.output().is_empty());
    assert_eq!(h.state_value::<u64>("value", b"a")?, Some(1));
    assert!(h.state_entries("list", b"a").is_empty());
    assert!(h.state_entries("map", b"a").is_empty());
    assert!(h.timers(TimeDomain::EventTime).is_empty());
    assert!(h.counters().is_empty());
    // The SDK's cache forgot the failed call's writes too.
    assert_eq!(run(&mut h, "get;lget;mget k")?, ["1", "", "none"]);
    Ok(())
}

#[test]
fn list_state_appends_in_order_and_sees_its_own_appends() -> Result<()> {
    let mut h = probe();
    assert_eq!(run(&mut h, "lget;ladd x;ladd y;lget")?, ["", "x,y"]);
    assert_eq!(run(&mut h, "ladd z;lget")?, ["x,y,z"]);
    assert_eq!(run(&mut h, "lclear;lget;ladd w;lget")?, ["", "w"]);
    assert_eq!(run(&mut h, "lget")?, ["w"]);
    let entries = h.state_entries("list", b"a");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].1, to_bytes("w")?);
    Ok(())
}

#[test]
fn map_state_merges_host_entries_with_the_calls_writes() -> Result<()> {
    let mut h = probe();
    assert_eq!(
        run(&mut h, "mput b 2;mput a 1;mget a;mget c;mentries")?,
        ["1", "none", "a=1,b=2"]
    );
    assert_eq!(run(&mut h, "mremove a;mentries;mget a")?, ["b=2", "none"]);
    assert_eq!(h.state_entries("map", b"a").len(), 1);

    // A fresh instance (empty cache) restored from a snapshot reads the host's entries and
    // overlays this call's writes on them.
    let snapshot = h.snapshot(1)?;
    let mut h = Harness::<Probe>::builder()
        .keyed(true)
        .restore_from(&snapshot)
        .open()?;
    assert_eq!(run(&mut h, "mput c 3;mget b;mentries")?, ["2", "b=2,c=3"]);
    assert_eq!(run(&mut h, "mput b 5;mremove c;mentries")?, ["b=5"]);
    assert_eq!(
        run(&mut h, "mclear;mget b;mentries;mput d 4;mentries")?,
        ["none", "", "d=4"]
    );
    assert_eq!(run(&mut h, "mentries")?, ["d=4"]);
    Ok(())
}

#[test]
fn ttl_state_expires_by_processing_time() -> Result<()> {
    let mut h = Harness::<Probe>::builder()
        .keyed(true)
        .processing_time(1_000)
        .open()?;
    assert_eq!(run(&mut h, "tput 7;tget")?, ["7"]);
    h.set_processing_time(1_099)?;
    assert_eq!(run(&mut h, "tget")?, ["7"]);
    h.set_processing_time(1_100)?;
    assert_eq!(run(&mut h, "tget")?, ["none"]);
    assert!(h.state_entries("ttl", b"a").is_empty());
    // A write restarts the time-to-live.
    assert_eq!(run(&mut h, "tput 8")?, Vec::<String>::new());
    h.advance_processing_time(50)?;
    assert_eq!(run(&mut h, "tget;tput 9")?, ["8"]);
    h.advance_processing_time(99)?;
    assert_eq!(run(&mut h, "tget")?, ["9"]);
    Ok(())
}

#[test]
fn event_timers_fire_in_order_deduplicated_before_the_watermark() -> Result<()> {
    let mut h = probe();
    run(&mut h, "event 30;event 10;event 20;event 10;unevent 20")?;
    h.process(Some("b"), "event 10", None)?;
    assert_eq!(
        h.timers(TimeDomain::EventTime),
        [
            (10, b"a".to_vec()),
            (10, b"b".to_vec()),
            (30, b"a".to_vec())
        ]
    );
    h.take_output();
    h.process_watermark(25)?;
    assert_eq!(
        h.output_values_str(),
        ["timer event 10 a", "timer event 10 b", "watermark 25"]
    );
    // What an event-time timer emits carries the timer's time.
    assert_eq!(h.output()[0].timestamp, Some(10));
    assert_eq!(h.output()[2].timestamp, None);
    // A watermark that does not advance is not processed.
    h.take_output();
    h.process_watermark(25)?;
    assert!(h.output().is_empty());
    // End of input fires the rest.
    h.finish()?;
    assert_eq!(
        h.output_values_str(),
        [
            "timer event 30 a",
            &format!("watermark {}", i64::MAX),
            "finish after 2 records"
        ]
    );
    assert!(h.timers(TimeDomain::EventTime).is_empty());
    Ok(())
}

#[test]
fn timers_registered_by_timers_fire_in_the_same_advance() -> Result<()> {
    let mut h = Harness::<Probe>::builder()
        .keyed(true)
        .config("chain-timers-until", "3")
        .open()?;
    run(&mut h, "event 1")?;
    h.take_output();
    h.process_watermark(10)?;
    assert_eq!(
        h.output_values_str(),
        [
            "timer event 1 a",
            "timer event 2 a",
            "timer event 3 a",
            "watermark 10"
        ]
    );
    Ok(())
}

#[test]
fn processing_timers_fire_when_the_clock_reaches_them() -> Result<()> {
    let mut h = probe();
    run(&mut h, "proc 100;proc 50;proc 300;proc 70;unproc 70")?;
    h.set_processing_time(40)?;
    assert!(h.output().is_empty());
    h.set_processing_time(200)?;
    assert_eq!(
        h.output_values_str(),
        ["timer processing 50 a", "timer processing 100 a"]
    );
    assert_eq!(h.output()[0].timestamp, None);
    assert_eq!(h.timers(TimeDomain::ProcessingTime), [(300, b"a".to_vec())]);
    // Processing time never goes back.
    h.set_processing_time(10)?;
    assert_eq!(h.processing_time(), 200);
    Ok(())
}

#[test]
fn snapshot_and_restore_keep_operator_state_keyed_state_and_timers() -> Result<()> {
    let mut h = probe();
    run(&mut h, "put 3;ladd x;mput k 1;event 50;proc 500")?;
    run(&mut h, "emit second")?;
    let snapshot = h.snapshot(7)?;
    assert_eq!(snapshot.checkpoint_id(), 7);
    assert_eq!(snapshot.operator_state(), to_bytes(&2u64)?);
    // Changes after the snapshot are not in it.
    run(&mut h, "put 4;ladd y")?;

    let mut restored = Harness::<Probe>::builder()
        .keyed(true)
        .attempt(1)
        .restore_from(&snapshot)
        .open()?;
    assert_eq!(restored.operator().map(|p| p.processed), Some(2));
    assert_eq!(run(&mut restored, "get;lget;mentries")?, ["3", "x", "k=1"]);
    restored.take_output();
    restored.process_watermark(60)?;
    restored.set_processing_time(600)?;
    assert_eq!(
        restored.output_values_str(),
        ["timer event 50 a", "watermark 60", "timer processing 500 a"]
    );
    Ok(())
}

#[test]
fn counters_and_logs() -> Result<()> {
    let mut h = probe();
    run(
        &mut h,
        "count seen 2;count seen 3;count other 1;log careful",
    )?;
    assert_eq!(h.counter("seen"), 5);
    assert_eq!(h.counter("other"), 1);
    assert_eq!(h.counter("never"), 0);
    assert_eq!(h.logs().len(), 1);
    assert_eq!(h.logs()[0].level, Level::Warn);
    assert_eq!(h.logs()[0].message, "careful");
    Ok(())
}

#[test]
fn keyed_state_on_unkeyed_input_is_a_clear_error() {
    let err = Harness::<Probe>::builder().open().unwrap_err();
    assert!(!err.is_invalid_config());
    assert!(
        err.message().starts_with("cannot declare state `value`:"),
        "{err}"
    );
    assert!(err.message().contains("not keyed"), "{err}");
}

#[test]
fn config_errors_are_invalid_config() {
    let err = Harness::<Probe>::builder()
        .keyed(true)
        .config("chain-timers-until", "soon")
        .open()
        .unwrap_err();
    assert!(err.is_invalid_config());
    assert!(
        err.message().contains("`chain-timers-until` = \"soon\""),
        "{err}"
    );
    let err = Harness::<Probe>::builder()
        .keyed(true)
        .config("chain-timer-until", "1")
        .open()
        .unwrap_err();
    assert_eq!(
        err,
        Error::invalid_config(
            "unknown config key `chain-timer-until` (known keys: chain-timers-until)"
        )
    );
}

#[test]
fn calls_after_dispose_fail_instead_of_panicking() {
    let mut h = probe();
    h.dispose();
    let err = h.process(Some("a"), "get", None).unwrap_err();
    assert_eq!(err, Error::failed("process called after dispose"));
    assert_eq!(
        h.snapshot(1).unwrap_err(),
        Error::failed("snapshot called after dispose")
    );
}

/// Emits with every `emit` flavour, to check timestamps and typed values.
struct Emitter;

impl Operator for Emitter {
    fn open(_ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Emitter)
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        ctx.emit(None, b"inherits");
        ctx.emit_at(Some(b"k"), b"explicit", Some(-1));
        ctx.emit_record(record);
        ctx.emit_typed(None, &(1u8, "typed"))?;
        Ok(())
    }

    fn finish(&mut self, ctx: &mut Context<'_>) -> Result<()> {
        ctx.emit(None, b"finishing");
        Ok(())
    }

    fn close(&mut self, ctx: &mut Context<'_>) -> Result<()> {
        ctx.emit(None, b"closing");
        Ok(())
    }
}

#[test]
fn emitted_records_keep_order_keys_and_timestamps() -> Result<()> {
    let mut h = Harness::<Emitter>::builder().open()?;
    h.process(Some([0xff_u8]), b"raw", Some(5))?;
    h.finish()?;
    let out = h.take_output();
    assert_eq!(out.len(), 5);
    assert_eq!((out[0].key.as_deref(), out[0].timestamp), (None, Some(5)));
    assert_eq!(
        (out[1].key.as_deref(), out[1].timestamp),
        (Some(&b"k"[..]), Some(-1))
    );
    assert_eq!(
        out[2].as_record(),
        Record {
            key: Some(&[0xff]),
            value: b"raw",
            timestamp: Some(5)
        }
    );
    assert_eq!(out[3].decode::<(u8, String)>()?, (1, "typed".to_owned()));
    assert_eq!(out[4].value_str()?, "finishing");
    // `close` runs after the job's output was committed: it may not emit.
    let err = h.close().unwrap_err();
    assert!(
        err.message().contains("from `close`, which may not emit"),
        "{err}"
    );
    assert!(h.take_output().is_empty());
    assert_eq!(out[4].timestamp, None);
    Ok(())
}

#[test]
fn one_batch_is_one_call() -> Result<()> {
    let mut h = probe();
    let records = [
        Record {
            key: Some(b"a"),
            value: b"put 1",
            timestamp: None,
        },
        Record {
            key: Some(b"a"),
            value: b"incr",
            timestamp: None,
        },
        Record {
            key: Some(b"a"),
            value: b"fail",
            timestamp: None,
        },
    ];
    // The whole batch fails, so the first two records change nothing either.
    assert!(h.process_records(records).is_err());
    assert_eq!(h.state_value::<u64>("value", b"a")?, None);
    h.process_records(records[..2].iter().copied())?;
    assert_eq!(h.output_values_str(), ["2"]);
    Ok(())
}

/// What [`Canceller`] does when a timer fires: `(command, key, time)`.
type Plan = Vec<(String, Vec<u8>, i64)>;

/// Registers timers as its records say (`event T`, `proc T` for the record's key) and
/// queues commands to run when a timer fires (`then T CMD K2 T2`: when the timer at `T`
/// for the record's key fires, in either domain, run `CMD`, one of `event`, `unevent`,
/// `proc`, `unproc`, for key `K2` at `T2`). A timer that fires emits `T K`.
#[derive(Default)]
struct Canceller {
    plans: std::collections::HashMap<(i64, Vec<u8>), Plan>,
}

impl Canceller {
    fn timer(ctx: &mut Context<'_>, command: &str, key: &[u8], time: i64) -> Result<()> {
        match command {
            "event" => ctx.register_event_timer(key, time),
            "unevent" => ctx.delete_event_timer(key, time),
            "proc" => ctx.register_processing_timer(key, time),
            "unproc" => ctx.delete_processing_timer(key, time),
            _ => return Err(Error::failed(format!("unknown command {command:?}"))),
        }
        Ok(())
    }
}

impl Operator for Canceller {
    fn open(_ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Canceller::default())
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let key = record.require_key()?;
        for command in record.value_str()?.split(';') {
            match command.split_whitespace().collect::<Vec<_>>()[..] {
                ["then", t, command, key2, t2] => {
                    let step = (command.to_owned(), key2.as_bytes().to_vec(), t2.parse()?);
                    self.plans
                        .entry((t.parse()?, key.to_vec()))
                        .or_default()
                        .push(step);
                }
                [command, t] => Self::timer(ctx, command, key, t.parse()?)?,
                _ => return Err(Error::failed(format!("unknown command {command:?}"))),
            }
        }
        Ok(())
    }

    fn on_timer(&mut self, timer: Timer<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let key = String::from_utf8_lossy(timer.key);
        ctx.emit(None, format!("{} {key}", timer.timestamp).as_bytes());
        let plan = self
            .plans
            .get(&(timer.timestamp, timer.key.to_vec()))
            .cloned()
            .unwrap_or_default();
        for (command, key, time) in plan {
            Self::timer(ctx, &command, &key, time)?;
        }
        Ok(())
    }
}

/// A keyed harness running [`Canceller`] with the given `(key, commands)` processed.
fn canceller(steps: &[(&str, &str)]) -> Result<Harness<Canceller>> {
    let mut h = Harness::<Canceller>::builder().keyed(true).open()?;
    for (key, commands) in steps {
        h.process(Some(key), commands, None)?;
    }
    Ok(h)
}

#[test]
fn a_timer_deleted_by_an_earlier_timer_of_the_same_batch_does_not_fire() -> Result<()> {
    let mut h = canceller(&[("k", "event 10;event 20;event 30;then 10 unevent k 20")])?;
    // All three are due at once, so they come in one `on-timers` call.
    h.process_watermark(100)?;
    assert_eq!(h.output_values_str(), ["10 k", "30 k"]);
    assert!(h.timers(TimeDomain::EventTime).is_empty());
    h.finish()?;
    assert_eq!(h.output_values_str(), ["10 k", "30 k"]);
    Ok(())
}

#[test]
fn a_timer_deleted_by_one_of_the_same_time_and_another_key_does_not_fire() -> Result<()> {
    let mut h = canceller(&[
        ("a", "event 10;then 10 unevent b 10"),
        ("b", "event 10"),
        ("c", "event 10"),
    ])?;
    h.process_watermark(10)?;
    assert_eq!(h.output_values_str(), ["10 a", "10 c"]);
    assert!(h.timers(TimeDomain::EventTime).is_empty());
    Ok(())
}

#[test]
fn a_timer_deleted_and_registered_again_before_its_turn_fires_once_in_order() -> Result<()> {
    let mut h = canceller(&[(
        "k",
        "event 10;event 20;event 30;then 10 unevent k 20;then 10 event k 20",
    )])?;
    h.process_watermark(100)?;
    assert_eq!(h.output_values_str(), ["10 k", "20 k", "30 k"]);
    // It fired: it is not registered any more, so it does not fire again.
    assert!(h.timers(TimeDomain::EventTime).is_empty());
    h.finish()?;
    assert_eq!(h.output_values_str(), ["10 k", "20 k", "30 k"]);

    // Deleted, registered and deleted again: it does not fire.
    let mut h = canceller(&[(
        "k",
        "event 10;event 20;then 10 unevent k 20;then 10 event k 20;then 10 unevent k 20",
    )])?;
    h.finish()?;
    assert_eq!(h.output_values_str(), ["10 k"]);
    assert!(h.timers(TimeDomain::EventTime).is_empty());
    Ok(())
}

#[test]
fn a_processing_timer_deleted_by_an_earlier_one_of_the_same_batch_does_not_fire() -> Result<()> {
    let mut h = canceller(&[("k", "proc 10;proc 20;proc 30;then 10 unproc k 20")])?;
    h.set_processing_time(100)?;
    assert_eq!(h.output_values_str(), ["10 k", "30 k"]);
    assert!(h.timers(TimeDomain::ProcessingTime).is_empty());
    Ok(())
}

#[test]
fn deleting_a_timer_of_the_other_domain_or_one_already_fired_skips_nothing() -> Result<()> {
    // 10 deletes a processing-time timer at 20 (not the event-time one due with it); 20
    // deletes 10, which already fired.
    let mut h = canceller(&[(
        "k",
        "event 10;event 20;event 30;proc 20;then 10 unproc k 20;then 20 unevent k 10",
    )])?;
    h.process_watermark(100)?;
    assert_eq!(h.output_values_str(), ["10 k", "20 k", "30 k"]);
    assert!(h.timers(TimeDomain::ProcessingTime).is_empty());
    Ok(())
}

#[test]
fn a_timer_deleted_in_an_earlier_batch_and_registered_again_fires() -> Result<()> {
    let mut h = canceller(&[("k", "event 10;event 20;then 10 unevent k 20")])?;
    h.process_watermark(15)?;
    assert_eq!(h.output_values_str(), ["10 k"]);
    assert!(h.timers(TimeDomain::EventTime).is_empty());
    h.process(Some("k"), "event 20", None)?;
    h.process_watermark(100)?;
    assert_eq!(h.output_values_str(), ["10 k", "20 k"]);
    Ok(())
}

/// Emits as many bytes as the record's value says, and keeps that many in its own state.
struct Floods(usize);

impl Operator for Floods {
    fn open(_ctx: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Floods(0))
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        self.0 = record
            .value_str()?
            .parse()
            .map_err(|e: std::num::ParseIntError| Error::failed(e.to_string()))?;
        ctx.emit(None, &vec![b'x'; self.0]);
        Ok(())
    }

    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>> {
        Ok(vec![b's'; self.0])
    }
}

#[test]
fn a_call_returning_more_than_the_output_limit_fails_as_on_the_host() -> Result<()> {
    let mut h = Harness::<Floods>::builder().max_output_bytes(1000).open()?;
    h.process_value("500")?;
    assert_eq!(h.take_output().len(), 1);
    h.snapshot(1)?;
    let e = h.process_value("2000").unwrap_err();
    assert!(
        e.message()
            .contains("bytes of records and effects from one call; the limit is 1000"),
        "{e}"
    );
    // Nothing of the failed call counts.
    assert!(h.take_output().is_empty());
    let e = h.snapshot(2).unwrap_err();
    assert!(e.message().contains("the limit is 1000"), "{e}");
    Ok(())
}

/// Reads an order as JSON (what a source with `format = "avro"` hands operators) and
/// emits a discounted total as JSON.
struct Discount;

#[derive(serde::Deserialize)]
struct Order {
    user: String,
    amount: f64,
}

#[derive(serde::Serialize)]
struct Total<'a> {
    user: &'a str,
    total: f64,
}

impl Operator for Discount {
    fn open(_: &mut OpenContext<'_>) -> Result<Self> {
        Ok(Discount)
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let order: Order = record.json()?;
        ctx.emit_json(
            record.key,
            &Total {
                user: &order.user,
                total: order.amount * 0.5,
            },
        )
    }
}

#[test]
fn json_values_are_read_into_types_and_written_from_them() -> Result<()> {
    let mut h = Harness::<Discount>::builder().open()?;
    h.process_value(r#"{"user":"zoë","amount":10.0,"tags":[]}"#)?;
    assert_eq!(h.output_values_str(), [r#"{"user":"zoë","total":5.0}"#]);
    let e = h.process_value(r#"{"user":"x"}"#).unwrap_err();
    assert!(e.to_string().contains("missing field `amount`"), "{e}");
    Ok(())
}
