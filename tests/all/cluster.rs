//! One job over several hosts (`sluice run --cluster`), against the real broker: host
//! processes share the units of a job, a killed or stopped host's units move, and the
//! committed output is checked against counts computed here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use sluice_tests::cluster::owned_units;
use sluice_tests::kafka::{broker, create_topic, produce_to, read_committed, topics, unique_topic};
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TOKENIZE};
use sluice_tests::{expected_word_counts, final_counts_any_order, sample_text, test_dir};

use crate::kafka::{as_count_lines, assert_counts, topic_of_lines};

mod event_time;
mod faults;
mod graphs;

/// What a word count job over several hosts is like.
struct Shape<'a> {
    /// The brokers its source and sink name (none: a server's, from the tenant's grant).
    broker: Option<&'a str>,
    /// Whether its source ends at the end of its input as the job started.
    bounded: bool,
    /// How its first operator misbehaves (`slow-process`: 2 ms a line).
    behavior: &'a str,
    /// Whether `tokenize` begins a stage of its own (three stages).
    repartition: bool,
    /// More of its `[cluster]` table.
    cluster: &'a str,
}

/// A word count from `input` to `output` over several hosts, written to
/// `dir/name`: an operator that misbehaves (slowly, usually), `tokenize`, then `count`
/// by word after an exchange topic of 4 partitions.
fn word_count_job(dir: &Path, name: &str, input: &str, output: &str, shape: Shape<'_>) -> PathBuf {
    let Shape {
        broker,
        bounded,
        behavior,
        repartition,
        cluster,
    } = shape;
    let bootstrap = broker.map_or(String::new(), |b| format!("bootstrap = \"{b}\""));
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            r#"
name = "{output}"
[source]
type = "kafka"
{bootstrap}
topics = "{input}"
bounded = {bounded}
[[operator]]
name = "misbehave"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "{behavior}", delay-ms = 2 }}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
repartition = {repartition}
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
[sink]
type = "kafka"
{bootstrap}
topic = "{output}"
[checkpoint]
interval_ms = 100
[runtime]
batch_size = 20
buffer_timeout_ms = 5
[cluster]
exchange_partitions = 4
session_timeout_ms = 6000
{cluster}
"#
        ),
    )
    .unwrap();
    path
}

/// A host process of the job, logging into `dir/host-N.log`.
fn spawn_host(dir: &Path, job: &Path, broker: &str, n: usize) -> Child {
    sluice_tests::cluster::spawn_host(
        env!("CARGO_BIN_EXE_sluice-test-cli"),
        job,
        broker,
        &dir.join(format!("host-{n}.log")),
    )
}

fn log_of(dir: &Path, n: usize) -> String {
    std::fs::read_to_string(dir.join(format!("host-{n}.log"))).unwrap_or_default()
}

/// Waits for `host` to end, successfully, within `limit`.
fn wait_success(dir: &Path, host: &mut Child, n: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = host.try_wait().unwrap() {
            assert!(status.success(), "host {n} failed: {}", log_of(dir, n));
            return;
        }
        if Instant::now() > deadline {
            let _ = host.kill();
            panic!("host {n} did not end within {limit:?}: {}", log_of(dir, n));
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the committed output holds at least `records`, every host running.
fn wait_for_output(dir: &Path, hosts: &mut [Child], broker: &str, topic: &str, records: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while read_committed(broker, topic).len() < records {
        for (n, host) in hosts.iter_mut().enumerate() {
            if let Some(status) = host.try_wait().unwrap() {
                panic!("host {n} ended ({status}) early: {}", log_of(dir, n));
            }
        }
        assert!(
            Instant::now() < deadline,
            "no output of {records} records in 2 minutes"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// A word count over several hosts, of `lines` lines of sample text in a topic of 4
/// partitions read unbounded: the first half is written at the start and the second by
/// [`WordCount::write_rest`], so a test decides when the input is complete and no host
/// can finish the job before the test has done what it does mid-run.
struct WordCount {
    broker: String,
    input: String,
    text: String,
    output: String,
    dir: PathBuf,
    job: PathBuf,
}

impl WordCount {
    /// `None` without a broker.
    fn new(name: &str, seed: u64, lines: usize, repartition: bool) -> Option<WordCount> {
        Self::with_state(name, seed, lines, repartition, "heap")
    }

    /// [`WordCount::new`] with keyed state in `backend`.
    fn with_state(
        name: &str,
        seed: u64,
        lines: usize,
        repartition: bool,
        backend: &str,
    ) -> Option<WordCount> {
        let broker = broker()?;
        let input = unique_topic("cluster-in");
        create_topic(&broker, &input, 4);
        let text = sample_text(seed, lines);
        let output = unique_topic("cluster-out");
        create_topic(&broker, &output, 2);
        let dir = test_dir(name);
        let shape = Shape {
            broker: Some(&broker),
            bounded: false,
            behavior: "slow-process",
            repartition,
            cluster: &format!("checkpoints = \"store\"\n[state]\nbackend = \"{backend}\""),
        };
        let job = word_count_job(&dir, "job.toml", &input, &output, shape);
        let wc = WordCount {
            broker,
            input,
            text,
            output,
            dir,
            job,
        };
        wc.write(|half| half == 0);
        Some(wc)
    }

    /// Writes the lines of the halves `which` accepts (0 first, 1 second), round-robin
    /// over the partitions so that each half reaches every one.
    fn write(&self, which: impl Fn(usize) -> bool) {
        let lines: Vec<&str> = self.text.lines().collect();
        for partition in 0..4 {
            let records: Vec<(Option<&str>, &str, Option<i64>)> = lines
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 4 == partition && which(i * 2 / lines.len()))
                .map(|(_, l)| (None, *l, None))
                .collect();
            produce_to(&self.broker, &self.input, Some(partition as i32), &records);
        }
    }

    /// Writes the second half of the input.
    fn write_rest(&self) {
        self.write(|half| half == 1);
    }

    fn spawn(&self, n: usize) -> Child {
        spawn_host(&self.dir, &self.job, &self.broker, n)
    }

    /// SIGKILLs host 0, writes the rest of the input (it reaches every partition, the
    /// killed host's too), and completes with the others.
    fn kill_first_and_complete(&self, mut hosts: Vec<Child>) {
        hosts[0].kill().unwrap();
        hosts[0].wait().unwrap();
        self.write_rest();
        let mut hosts: Vec<Option<Child>> = hosts.into_iter().map(Some).collect();
        hosts[0] = None;
        self.complete(&mut hosts);
    }

    /// Once the committed output counts every line (the whole input written), stops the
    /// hosts still running (SIGTERM: each leaves the job) and checks that nothing was
    /// counted twice on the way out. `hosts[n]` is `None` for a host that is gone.
    fn complete(&self, hosts: &mut [Option<Child>]) {
        let expected = expected_word_counts(&self.text, 1);
        let committed =
            || final_counts_any_order(&as_count_lines(&read_committed(&self.broker, &self.output)));
        wait_until("every line counted", Duration::from_secs(180), || {
            for (n, host) in hosts.iter_mut().enumerate() {
                if let Some(status) = host.as_mut().and_then(|h| h.try_wait().unwrap()) {
                    panic!("host {n} ended ({status}) early: {}", log_of(&self.dir, n));
                }
            }
            committed().is_ok_and(|counts| counts == expected)
        });
        for host in hosts.iter().flatten() {
            signal(host, "-TERM");
        }
        for (n, host) in hosts.iter_mut().enumerate() {
            if let Some(host) = host {
                wait_success(&self.dir, host, n, Duration::from_secs(60));
            }
        }
        assert_counts(
            &as_count_lines(&read_committed(&self.broker, &self.output)),
            &self.text,
        );
    }
}

#[test]
fn three_hosts_share_a_job_and_a_killed_hosts_units_move() {
    let Some(wc) = WordCount::new("cluster-kill", 31, 1_600, false) else {
        return;
    };
    let mut hosts: Vec<Child> = (0..3).map(|n| wc.spawn(n)).collect();
    // Killed once some output is committed: mid-run, with units of both stages busy.
    wait_for_output(&wc.dir, &mut hosts, &wc.broker, &wc.output, 200);
    wc.kill_first_and_complete(hosts);
    let logs = log_of(&wc.dir, 1) + &log_of(&wc.dir, 2);
    assert!(logs.contains("restoring"), "{logs}");
}

/// RocksDB state over several hosts: each unit's checkpoints copy only the table files
/// the store lacks into its attempt's `shared` folder, and a killed host's units restore
/// on the others from the store, table files and all, with exact output.
#[test]
fn rocksdb_state_moves_with_its_units_between_hosts() {
    let Some(wc) = WordCount::with_state("cluster-rocksdb", 43, 1_600, false, "rocksdb") else {
        return;
    };
    let mut hosts: Vec<Child> = (0..2).map(|n| wc.spawn(n)).collect();
    wait_until("both hosts own units", Duration::from_secs(60), || {
        owns(&wc.dir, 0, 4) && owns(&wc.dir, 1, 4)
    });
    wait_for_output(&wc.dir, &mut hosts, &wc.broker, &wc.output, 200);
    let tables = || -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut dirs = vec![wc.dir.join("store")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.parent().is_some_and(|p| p.ends_with("shared"))
                    && path.extension().is_some_and(|e| e == "sst")
                {
                    found.push(path);
                }
            }
        }
        found
    };
    wait_until("table files in the store", Duration::from_secs(60), || {
        !tables().is_empty()
    });
    wc.kill_first_and_complete(hosts);
    assert!(
        log_of(&wc.dir, 1).contains("restoring"),
        "{}",
        log_of(&wc.dir, 1)
    );
}

/// Sends `signal` (`-KILL`, `-STOP`, `-TERM`, …) to `host`.
fn signal(host: &Child, signal: &str) {
    let pid = host.id().to_string();
    assert!(
        Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success()
    );
}

/// Whether host `n`'s log says it owns `units` units.
fn owns(dir: &Path, n: usize, units: usize) -> bool {
    owned_units(&log_of(dir, n)) == Some(units)
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        thread::sleep(Duration::from_millis(100));
    }
}

/// A host stopped (SIGSTOP) past the session timeout loses its units to the other; when
/// it wakes, its producers are fenced: nothing it had in flight reaches the output.
#[test]
fn a_stopped_host_is_fenced_when_it_wakes() {
    let Some(wc) = WordCount::new("cluster-stop", 37, 2_400, false) else {
        return;
    };
    let dir = &wc.dir;
    let mut hosts: Vec<Child> = (0..2).map(|n| wc.spawn(n)).collect();
    wait_until("both hosts own units", Duration::from_secs(60), || {
        owns(dir, 0, 4) && owns(dir, 1, 4)
    });
    wait_for_output(dir, &mut hosts, &wc.broker, &wc.output, 200);
    signal(&hosts[0], "-STOP");
    // Past the session timeout, the other host runs every unit.
    wait_until("host 1 took every unit", Duration::from_secs(60), || {
        owns(dir, 1, 8)
    });
    signal(&hosts[0], "-CONT");
    wc.write_rest();
    wc.complete(&mut hosts.into_iter().map(Some).collect::<Vec<_>>());
}

/// A host that joins mid-run takes over units from the one running all; `sluice status`
/// shows both and what each runs. The job has three stages: `repartition` spreads the
/// slow operator's lines round-robin over a second exchange topic before `tokenize`.
#[test]
fn a_host_added_mid_run_takes_over_units() {
    let Some(wc) = WordCount::new("cluster-add", 41, 2_400, true) else {
        return;
    };
    let dir = &wc.dir;
    let mut hosts = vec![wc.spawn(0)];
    wait_for_output(dir, &mut hosts, &wc.broker, &wc.output, 100);
    hosts.push(wc.spawn(1));
    wait_until("the new host owns units", Duration::from_secs(120), || {
        owns(dir, 0, 6) && owns(dir, 1, 6)
    });
    let status = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["status"])
        .arg(&wc.job)
        .args(["--cluster", &wc.broker])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(shown.contains("12 units in 3 stages, 2 hosts"), "{shown}");
    assert_eq!(shown.matches("  unit ").count(), 12, "{shown}");
    assert!(
        shown.contains("stage 1: ") && shown.contains("-> tokenize"),
        "{shown}"
    );
    assert!(
        shown.contains("stage 2: ") && shown.contains("-> count -> sink"),
        "{shown}"
    );
    // The same, for programs.
    let status = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["status"])
        .arg(&wc.job)
        .args(["--cluster", &wc.broker, "--json"])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&status.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&status.stderr)));
    assert_eq!(
        (&json["units"], &json["stages"]),
        (&12.into(), &3.into()),
        "{json:#}"
    );
    let members = json["hosts"].as_array().unwrap();
    assert_eq!(members.len(), 2, "{json:#}");
    let units: usize = members
        .iter()
        .map(|h| h["units"].as_array().unwrap().len())
        .sum();
    assert_eq!(units, 12, "{json:#}");
    // What the job made outside the hosts: its control and two exchange topics, its
    // units' checkpoints in the store. Not deleted while hosts run it.
    let prefix = format!("sluice-{}", wc.output);
    let made: BTreeSet<String> = ["units", "exchange-1", "exchange-2"]
        .iter()
        .map(|t| format!("{prefix}.{t}"))
        .collect();
    let gc = || {
        Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
            .args(["cluster", "gc"])
            .arg(&wc.job)
            .args(["--cluster", &wc.broker])
            .output()
            .unwrap()
    };
    let refused = gc();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(75), "{said}");
    assert!(
        said.contains("still runs on 2 host(s)") && said.contains("nothing was deleted"),
        "{said}"
    );
    assert!(topics(&wc.broker).is_superset(&made));
    let store = dir.join("store").join(&prefix);
    assert!(store.is_dir());
    wc.write_rest();
    wc.complete(&mut hosts.into_iter().map(Some).collect::<Vec<_>>());
    assert!(
        log_of(dir, 1).contains("restoring"),
        "the new host restored no unit: {}",
        log_of(dir, 1)
    );
    // Every host left the group (SIGTERM): now they go, and the output stays.
    let deleted = gc();
    let said = String::from_utf8_lossy(&deleted.stdout);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    for topic in &made {
        assert!(said.contains(&format!("deleted topic {topic}")), "{said}");
    }
    wait_until("the topics are gone", Duration::from_secs(30), || {
        topics(&wc.broker).is_disjoint(&made)
    });
    assert!(!store.exists(), "{} is still there", store.display());
    assert_counts(
        &as_count_lines(&read_committed(&wc.broker, &wc.output)),
        &wc.text,
    );
}

/// Tenant `a`'s Kafka grant on `broker`: topics `a.*`, its cluster jobs' checkpoints in
/// `dir/store`.
fn grant_of_a(broker: &str, dir: &Path) -> String {
    format!(
        "[tenant.a.kafka]\nbootstrap = \"{broker}\"\nread = [\"a\\\\..*\"]\n\
         write = [\"a\\\\..*\"]\ncheckpoints = \"{}\"\n",
        dir.join("store").display()
    )
}

/// Two servers (`sluice serve`) run the same tenant's job over Kafka: each is given the
/// job file, which has `[cluster]`, and runs its share under the tenant's grant (the
/// brokers, and the checkpoint store, come from the host configuration; the job's topics
/// and groups are named under the tenant's id prefix). What a server job may not do with
/// it is refused with the reason.
#[test]
fn two_servers_share_a_tenants_job() {
    use crate::server::{ServerProcess, error_of, host_config, wait_for};
    use sluice::server::model::{ClusterStatus, JobState};
    let Some(broker) = broker() else { return };
    let dir = test_dir("cluster-servers");
    let (input, text) = topic_of_lines(&broker, "a.cluster-in", 4, 43, 3_000);
    let output = unique_topic("a.cluster-out");
    create_topic(&broker, &output, 2);
    // Each job's topics take 12 partitions (a control topic of 8, an exchange of 4).
    let grant = format!("{}cluster_partitions = 20\n", grant_of_a(&broker, &dir));
    let servers: Vec<ServerProcess> = (0..2)
        .map(|n| {
            let home = dir.join(format!("server-{n}"));
            std::fs::create_dir_all(&home).unwrap();
            ServerProcess::start(&host_config(&home, &grant))
        })
        .collect();
    let job = |extra: &str| {
        let shape = Shape {
            broker: None,
            bounded: true,
            behavior: "slow-process",
            repartition: false,
            cluster: extra,
        };
        word_count_job(
            &dir,
            &format!("job-{}.toml", extra.len()),
            &input,
            &output,
            shape,
        )
    };
    let clients: Vec<_> = servers.iter().map(|s| s.client(Some("token-a"))).collect();
    let e = error_of(clients[0].submit(&job("checkpoints = \"/tmp/elsewhere\"")));
    assert!(
        e.contains("400") && e.contains("`checkpoints` is the server's to choose"),
        "{e}"
    );
    for (extra, reason) in [
        (
            "bootstrap = \"127.0.0.1:1\"",
            "[cluster]: broker \"127.0.0.1:1\" is not one of",
        ),
        (
            "properties = { \"sasl.kerberos.kinit.cmd\" = \"touch /tmp/x\" }",
            "[cluster]: property \"sasl.kerberos.kinit.cmd\" is not one a server job may set",
        ),
    ] {
        let e = error_of(clients[0].submit(&job(extra)));
        assert!(
            e.contains("403") && e.contains(reason) && e.contains("outside tenant 'a''s"),
            "{e}"
        );
    }
    let e = error_of(servers[0].client(Some("token-b")).submit(&job("")));
    assert!(
        e.contains("403") && e.contains("tenant 'b' has no Kafka grant"),
        "{e}"
    );

    let ids: Vec<String> = clients
        .iter()
        .map(|c| c.submit(&job("")).unwrap().id)
        .collect();
    let e = error_of(clients[0].stop(&ids[0], false));
    assert!(
        e.contains("409") && e.contains("runs over several servers"),
        "{e}"
    );
    // Both servers run units of it; then one is killed mid-run, and the other finishes
    // the job.
    let mut shared = [false, false];
    wait_for(
        "both servers to run units",
        Duration::from_secs(120),
        || {
            for (n, (client, id)) in clients.iter().zip(&ids).enumerate() {
                let status = client.status(id).unwrap();
                assert_eq!(status.job.state, JobState::Running, "{status:?}");
                // (`true` until the server's host has planned the job.)
                if let ClusterStatus::Host(cluster) = &status.cluster {
                    assert_eq!(cluster.units, 8, "{status:?}");
                    shared[n] |= !cluster.running.is_empty();
                }
            }
            shared == [true, true] && read_committed(&broker, &output).len() >= 100
        },
    );
    // Each server shows the subtasks of the units it runs, each with its unit and this
    // host, and who in the job's group runs which units.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let statuses: Vec<_> = clients
            .iter()
            .zip(&ids)
            .map(|(client, id)| client.status(id).unwrap())
            .collect();
        let shown = statuses.iter().all(|status| {
            let ClusterStatus::Host(cluster) = &status.cluster else {
                return false;
            };
            cluster.group.len() == 2
                && cluster.group.iter().any(|m| m.host == cluster.host)
                && cluster.group.iter().all(|m| !m.units.is_empty())
                && !status.tasks.is_empty()
                && status.tasks.iter().all(|t| {
                    t.unit.is_some_and(|u| u < 8)
                        && t.host.as_deref() == Some(cluster.host.as_str())
                })
        });
        if shown {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "each server's subtasks and its view of the group: {:#?}",
            statuses
                .iter()
                .map(|s| (
                    &s.cluster,
                    s.tasks
                        .iter()
                        .map(|t| (&t.task, t.unit, &t.host))
                        .collect::<Vec<_>>()
                ))
                .collect::<Vec<_>>()
        );
        thread::sleep(Duration::from_millis(100));
    }
    // Each server runs its share in tenant a's worker process: the member of the job's
    // group is the worker (its client id names the worker's pid). Killing server 1's
    // worker fails that share alone, which joins again from a new worker, while the
    // server answers throughout.
    let workers_of = |server: &ServerProcess| crate::workers::children(server.pid());
    let worker = workers_of(&servers[1]);
    assert_eq!(worker.len(), 1, "{worker:?}");
    let status = clients[1].status(&ids[1]).unwrap();
    let ClusterStatus::Host(cluster) = &status.cluster else {
        panic!("{status:?}")
    };
    assert!(
        cluster.host.contains(&format!("-{}", worker[0])),
        "{} is not worker {}",
        cluster.host,
        worker[0]
    );
    let killed = Command::new("kill")
        .args(["-KILL", &worker[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_for(
        "server 1's share to run again in a new worker",
        Duration::from_secs(60),
        || {
            let status = clients[1].status(&ids[1]).unwrap();
            assert_eq!(status.job.state, JobState::Running, "{status:?}");
            let again = workers_of(&servers[1]);
            let ClusterStatus::Host(cluster) = &status.cluster else {
                return false;
            };
            status.failures_by_kind.get("worker") == Some(&1)
                && again.len() == 1
                && again[0] != worker[0]
                && cluster.host.contains(&format!("-{}", again[0]))
        },
    );
    let mut servers = servers.into_iter();
    servers.next().unwrap().kill();
    let finished = |client: &sluice::server::client::Client, id: &str| {
        let status = client.status(id).unwrap();
        assert_ne!(status.job.state, JobState::Failed, "{status:?}");
        status.job.state == JobState::Finished
    };
    wait_for(
        "the other server to finish the job",
        Duration::from_secs(180),
        || finished(&clients[1], &ids[1]),
    );
    assert_counts(&as_count_lines(&read_committed(&broker, &output)), &text);
    // The killed server, started again, resumes its share: the job has finished.
    let again = ServerProcess::start(&dir.join("server-0").join("host.toml"));
    let client = again.client(Some("token-a"));
    wait_for(
        "the restarted server to see the end",
        Duration::from_secs(60),
        || finished(&client, &ids[0]),
    );
    assert_counts(&as_count_lines(&read_committed(&broker, &output)), &text);
    // Its exchange topic is the tenant's: named under its id prefix.
    let exchange = format!("a.sluice-{output}.exchange-1");
    assert!(
        !read_committed(&broker, &exchange).is_empty(),
        "no records in {exchange}"
    );
    // The topics stay while the job is stored, and count against the tenant's
    // `cluster_partitions`: a second job's would pass it.
    let e = error_of(clients[1].submit(&job("")));
    assert!(
        e.contains("429") && e.contains("need 12 partitions") && e.contains("12 of its 20"),
        "{e}"
    );
    // Deleting the job deletes its topics and its units' checkpoints in the store; the
    // output stays.
    let made: BTreeSet<String> = [format!("a.sluice-{output}.units"), exchange]
        .into_iter()
        .collect();
    assert!(topics(&broker).is_superset(&made));
    let store = dir.join("store").join(format!("a.sluice-{output}"));
    assert!(store.is_dir());
    client.delete_job(&ids[0]).unwrap();
    assert!(!store.exists(), "{} is still there", store.display());
    wait_for("the topics to go", Duration::from_secs(30), || {
        topics(&broker).is_disjoint(&made)
    });
    clients[1].delete_job(&ids[1]).unwrap();
    let admitted = clients[1].submit(&job("")).unwrap();
    clients[1].cancel(&admitted.id).unwrap();
    assert_counts(&as_count_lines(&read_committed(&broker, &output)), &text);
}

/// A server's unit that keeps failing (a plugin that panics) runs again after a delay,
/// and the job's status says why it failed; the server goes on serving, and the job is
/// cancelled as any other.
#[test]
fn a_failing_unit_on_a_server_shows_why_and_the_job_cancels() {
    use crate::server::{ServerProcess, host_config, wait_for};
    use sluice::server::model::{ClusterStatus, JobState};
    let Some(broker) = broker() else { return };
    let dir = test_dir("cluster-server-failing");
    let (input, _) = topic_of_lines(&broker, "a.cluster-in", 2, 47, 100);
    let output = unique_topic("a.cluster-out");
    create_topic(&broker, &output, 1);
    let server = ServerProcess::start(&host_config(&dir, &grant_of_a(&broker, &dir)));
    let client = server.client(Some("token-a"));
    let shape = Shape {
        broker: None,
        bounded: true,
        behavior: "panic-in-process",
        repartition: false,
        cluster: "",
    };
    let job = word_count_job(&dir, "job.toml", &input, &output, shape);
    let id = client.submit(&job).unwrap().id;
    wait_for(
        "a unit's failure in the status",
        Duration::from_secs(60),
        || {
            let status = client.status(&id).unwrap();
            assert_eq!(status.job.state, JobState::Running, "{status:?}");
            matches!(&status.cluster, ClusterStatus::Host(c) if c.failures >= 2)
        },
    );
    let status = client.status(&id).unwrap();
    let why = status.last_failure.as_deref().unwrap_or_default();
    assert!(
        why.contains("deliberate panic in process") && why.contains("tenant 'a'"),
        "{status:?}"
    );
    let ClusterStatus::Host(cluster) = &status.cluster else {
        panic!("no host's status of the cluster job: {status:?}")
    };
    assert_eq!(cluster.last_failure, status.last_failure);
    let cancelled = client.cancel(&id).unwrap();
    assert_eq!(cancelled.state, JobState::Cancelled, "{cancelled:?}");
    assert!(read_committed(&broker, &output).is_empty());
}

#[test]
fn validate_shows_the_stages_their_topics_and_units() {
    let Some(broker) = broker() else { return };
    let dir = test_dir("cluster-validate");
    let input = unique_topic("cluster-validate-in");
    create_topic(&broker, &input, 2);
    let output = unique_topic("cluster-validate-out");
    let shape = |repartition| Shape {
        broker: Some(&broker),
        bounded: true,
        behavior: "slow-process",
        repartition,
        cluster: "checkpoints = \"store\"",
    };
    let job = word_count_job(&dir, "job.toml", &input, &output, shape(true));
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .arg("validate")
        .arg(&job)
        .args(["--cluster", &broker])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 2 source partitions, then 4 partitions of each exchange topic; checkpoints every
    // 100 ms, each stage 50 ms after the one it reads.
    let prefix = format!("sluice-{output}");
    for line in [
        "over several hosts: 10 units in 3 stages".to_string(),
        format!(
            "stage 0: units 0-1, one each of {input}/0 .. {input}/1 -> misbehave -> \
             {prefix}.exchange-1 (checkpoints at +0 ms)"
        ),
        format!(
            "stage 1: units 2-5, one each of {prefix}.exchange-1/0 .. {prefix}.exchange-1/3 \
             -> tokenize -> {prefix}.exchange-2 (checkpoints at +50 ms)"
        ),
        format!(
            "stage 2: units 6-9, one each of {prefix}.exchange-2/0 .. {prefix}.exchange-2/3 \
             -> count -> sink -> {output} (checkpoints at +0 ms)"
        ),
    ] {
        assert!(stdout.contains(&line), "{line:?} not in:\n{stdout}");
    }
    let json = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .arg("validate")
        .arg(&job)
        .args(["--json", "--cluster", &broker])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["cluster"][1]["units"], serde_json::json!([2, 5]));
    assert_eq!(json["cluster"][1]["checkpoint_phase_ms"], 50);
    assert_eq!(json["cluster"][2]["writes"], output.as_str());

    // A job that cannot run over several hosts fails validation with --cluster only.
    let file_sink = job.with_file_name("file-sink.toml");
    let text = std::fs::read_to_string(&job).unwrap().replace(
        &format!("type = \"kafka\"\nbootstrap = \"{broker}\"\ntopic = \"{output}\""),
        "type = \"file\"\npath = \"out.txt\"",
    );
    std::fs::write(&file_sink, text).unwrap();
    let validate = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
            .arg("validate")
            .arg(&file_sink)
            .args(args)
            .output()
            .unwrap()
    };
    assert!(validate(&[]).status.success());
    let refused = validate(&["--cluster", &broker]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(65), "{stderr}");
    assert!(
        stderr.contains("file-sink.toml") && stderr.contains("must be an exactly-once Kafka sink"),
        "{stderr}"
    );
}
