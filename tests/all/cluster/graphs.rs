//! Jobs that are graphs, not lines, over three hosts: an interval join of two topics
//! and events enriched with a broadcast topic of rules, each through a host added
//! mid-run, one SIGKILLed and one SIGSTOPped past its session timeout. The committed
//! output is compared with the independent models of `sluice_tests::graphs`.

use std::process::Child;
use std::time::Duration;

use sluice_tests::graphs::{enrich, interval_join};
use sluice_tests::kafka::{broker, create_topic, produce_to, read_committed, unique_topic};
use sluice_tests::plugins::{ENRICH, JOIN};
use sluice_tests::windows::{Event, mixed_events};
use sluice_tests::{test_dir, write_job};

use super::{log_of, owns, signal, spawn_host, wait_for_output, wait_success, wait_until};

/// Bounded out-of-orderness of every input.
const BOUND: i64 = 1000;

/// Added to every event's time: Kafka takes no negative timestamps.
const EPOCH: i64 = 1_000_000;

/// Far past every event: written last into every partition, it moves each input's
/// watermark past all the others, so the last of them are emitted though the input
/// never ends. (Its own key meets no other record, and its own time is never passed.)
const END: i64 = 1_000_000_000_000;

/// Units of a job with two sources of 2 partitions and 3 exchange partitions.
const UNITS: usize = 7;

fn shifted(events: Vec<Event>) -> Vec<Event> {
    events
        .into_iter()
        .map(|e| Event {
            ts: e.ts + EPOCH,
            ..e
        })
        .collect()
}

/// A job over two input topics (`a`, `b`, 2 partitions each) and an output topic, run
/// by three hosts in turn.
struct TwoInputs {
    broker: String,
    topics: [String; 2],
    events: [Vec<Event>; 2],
    output: String,
    dir: std::path::PathBuf,
    job: std::path::PathBuf,
}

impl TwoInputs {
    /// `None` without a broker. `operator` is the job's `[[operator]]`, reading sources
    /// `a` and `b`.
    fn new(name: &str, events: [Vec<Event>; 2], operator: &str) -> Option<TwoInputs> {
        let broker = broker()?;
        let topics = [unique_topic("graph-a"), unique_topic("graph-b")];
        for topic in &topics {
            create_topic(&broker, topic, 2);
        }
        let output = unique_topic("graph-out");
        create_topic(&broker, &output, 1);
        let dir = test_dir(name);
        let source = |name: &str, topic: &str| {
            format!(
                "[[source]]\nname = \"{name}\"\ntype = \"kafka\"\nbootstrap = \"{broker}\"\n\
                 topics = \"{topic}\"\ntimestamp = {{ field = 0 }}\n\
                 out_of_orderness_ms = {BOUND}\n"
            )
        };
        let job = write_job(
            &dir,
            &format!(
                r#"
name = "{output}"
{}{}
{operator}
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{output}"
[checkpoint]
interval_ms = 100
[runtime]
batch_size = 20
[cluster]
exchange_partitions = 3
session_timeout_ms = 6000
checkpoints = "store"
"#,
                source("a", &topics[0]),
                source("b", &topics[1]),
            ),
        );
        let job = TwoInputs {
            broker,
            topics,
            events: events.map(shifted),
            output,
            dir,
            job,
        };
        job.write(|half| half == 0);
        Some(job)
    }

    /// Writes the events of the halves `which` accepts (0 first, 1 second) of each
    /// input, alternating between its partitions.
    fn write(&self, which: impl Fn(usize) -> bool) {
        for (topic, events) in self.topics.iter().zip(&self.events) {
            for partition in 0..2 {
                let lines: Vec<String> = events
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| i % 2 == partition && which(i * 2 / events.len()))
                    .map(|(_, e)| e.line())
                    .collect();
                let records: Vec<(Option<&str>, &str, Option<i64>)> =
                    lines.iter().map(|l| (None, l.as_str(), None)).collect();
                produce_to(&self.broker, topic, Some(partition as i32), &records);
            }
        }
    }

    /// Writes the second half of each input, then an event at [`END`] into each
    /// partition.
    fn write_rest(&self) {
        self.write(|half| half == 1);
        for (n, topic) in self.topics.iter().enumerate() {
            let end = format!("{END},end-{n},0");
            for partition in 0..2 {
                produce_to(&self.broker, topic, Some(partition), &[(None, &end, None)]);
            }
        }
    }

    fn spawn(&self, n: usize) -> Child {
        spawn_host(&self.dir, &self.job, &self.broker, n)
    }

    /// The committed output, `line(record)` of each, sorted.
    fn committed(&self, line: impl Fn(&sluice_tests::kafka::Read) -> String) -> Vec<String> {
        let mut lines: Vec<String> = read_committed(&self.broker, &self.output)
            .iter()
            .map(line)
            .collect();
        lines.sort();
        lines
    }

    /// Runs the job: two hosts, a third added once output is committed; host 0
    /// SIGKILLed, then host 1 SIGSTOPped until host 2 runs every unit (of every stage),
    /// then woken; the rest of the input written. Returns once the committed output,
    /// as `line` shows each record, is `want`, every host that is left stopped well.
    fn run_through_failures(
        &self,
        want: &[String],
        line: impl Fn(&sluice_tests::kafka::Read) -> String,
    ) {
        let dir = &self.dir;
        let mut hosts: Vec<Child> = (0..2).map(|n| self.spawn(n)).collect();
        wait_for_output(dir, &mut hosts, &self.broker, &self.output, 1);
        hosts.push(self.spawn(2));
        wait_until(
            "the added host runs units",
            Duration::from_secs(120),
            || owned_units(dir, 2) > 0,
        );
        hosts[0].kill().unwrap();
        hosts[0].wait().unwrap();
        signal(&hosts[1], "-STOP");
        wait_until(
            "the added host runs every unit",
            Duration::from_secs(120),
            || owns(dir, 2, UNITS),
        );
        let ran = |stage: usize| {
            let started = [
                format!("(stage {stage}: "),
                "): restoring ".to_string(),
                "): starting ".to_string(),
            ];
            log_of(dir, 2).lines().any(|l| {
                l.contains(&started[0]) && (l.contains(&started[1]) || l.contains(&started[2]))
            })
        };
        wait_until(
            "the added host runs units of every stage",
            Duration::from_secs(60),
            || (0..3).all(ran),
        );
        signal(&hosts[1], "-CONT");
        self.write_rest();
        let mut hosts: Vec<Option<Child>> = hosts.into_iter().map(Some).collect();
        hosts[0] = None;
        wait_until("the whole output", Duration::from_secs(180), || {
            for (n, host) in hosts.iter_mut().enumerate() {
                if let Some(status) = host.as_mut().and_then(|h| h.try_wait().unwrap()) {
                    panic!("host {n} ended ({status}) early: {}", log_of(dir, n));
                }
            }
            let got = self.committed(&line);
            assert!(
                got.len() <= want.len(),
                "more output than the model's: {} records, {} expected",
                got.len(),
                want.len()
            );
            got.len() == want.len()
        });
        for host in hosts.iter().flatten() {
            signal(host, "-TERM");
        }
        for (n, host) in hosts.iter_mut().enumerate() {
            if let Some(host) = host {
                wait_success(dir, host, n, Duration::from_secs(60));
            }
        }
        let got = self.committed(&line);
        let first_wrong = got.iter().zip(want).position(|(g, w)| g != w);
        assert!(
            first_wrong.is_none(),
            "the output differs from the model's first at line {first_wrong:?}: {:?}, \
             expected {:?}",
            first_wrong.map(|i| &got[i]),
            first_wrong.map(|i| &want[i])
        );
        assert_eq!(got.len(), want.len());
    }
}

/// Units host `n`'s log last said it owns.
fn owned_units(dir: &std::path::Path, n: usize) -> usize {
    sluice_tests::cluster::owned_units(&log_of(dir, n)).unwrap_or(0)
}

/// An interval join over three hosts: both inputs keyed into one exchange topic each,
/// partitioned alike, so unit `i` of the join meets both sides of its keys.
#[test]
fn an_interval_join_over_three_hosts_survives_a_kill_and_a_stop() {
    let left = mixed_events(1200, 40, 20, BOUND, 0, 3);
    let right = mixed_events(2000, 40, 12, BOUND, 0, 5);
    let operator = format!(
        r#"[[operator]]
name = "join"
plugin = "{JOIN}"
inputs = ["a", "b"]
key_by = {{ field = 1 }}
config = {{ lower_ms = -300, upper_ms = 500 }}"#
    );
    let Some(job) = TwoInputs::new("cluster-join", [left, right], &operator) else {
        return;
    };
    let want = interval_join(&job.events[0], &job.events[1], -300, 500);
    assert!(
        want.len() > 500,
        "the inputs join too little: {}",
        want.len()
    );
    job.run_through_failures(&want, |r| {
        format!("{}\t{}", r.key.as_deref().unwrap_or(""), r.value)
    });
}

/// Events enriched with rules over three hosts: the rules' exchange topic has one
/// partition, which every unit of the enrichment reads whole.
#[test]
fn a_broadcast_enrichment_over_three_hosts_survives_a_kill_and_a_stop() {
    let events = mixed_events(3000, 30, 10, BOUND, 0, 9);
    let rules = mixed_events(150, 30, 200, BOUND, 0, 4);
    let operator = format!(
        r#"[[operator]]
name = "enrich"
plugin = "{ENRICH}"
inputs = [
  {{ from = "a", key_by = {{ field = 1 }} }},
  {{ from = "b", broadcast = true }},
]"#
    );
    let Some(job) = TwoInputs::new("cluster-enrich", [events, rules], &operator) else {
        return;
    };
    let want = enrich(&job.events[0], &job.events[1]);
    assert!(
        want.iter().filter(|l| !l.ends_with(",-")).count() > 2000,
        "too few events have a rule"
    );
    job.run_through_failures(&want, |r| r.value.clone());
}
