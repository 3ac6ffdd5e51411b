//! Host processes of a job run over several hosts (`sluice run --cluster`), what their
//! logs say, and what a unit's marker names.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::scratch_root;

/// A host process of `job` meeting at `broker`, logging (at `info`) into `log`; `bin`
/// is `env!("CARGO_BIN_EXE_sluice-test-cli")` (only tests and benches know it).
pub fn spawn_host(bin: &str, job: &Path, broker: &str, log: &Path) -> Child {
    spawn_host_with(bin, job, broker, log, &[])
}

/// [`spawn_host`] with further arguments of `sluice run`.
pub fn spawn_host_with(bin: &str, job: &Path, broker: &str, log: &Path, args: &[&str]) -> Child {
    host_command(bin, job, broker, log)
        .args(args)
        .env_remove("FAILPOINTS")
        .spawn()
        .expect("spawning sluice")
}

/// [`spawn_host`] with `FAILPOINTS` set to `failpoints` (see `sluice::failpoints`).
pub fn spawn_failing_host(
    bin: &str,
    job: &Path,
    broker: &str,
    log: &Path,
    failpoints: &str,
) -> Child {
    host_command(bin, job, broker, log)
        .env("FAILPOINTS", failpoints)
        .spawn()
        .expect("spawning sluice")
}

fn host_command(bin: &str, job: &Path, broker: &str, log: &Path) -> Command {
    let mut command = Command::new(bin);
    command
        .args(["--log", "info", "run", "--quiet"])
        .arg(job)
        .args(["--cluster", broker])
        .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("a host's log file"));
    // A host ends with the test thread that started it, also when the test fails
    // before it stops its hosts: left running, they would load the machine under the
    // tests that follow.
    // SAFETY: `prctl` is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

/// `sluice run` of `job`, logging (at `info`) into `log`: a host process meeting at
/// `cluster`'s brokers, else the job on this host alone.
pub fn spawn_run(bin: &str, job: &Path, cluster: Option<&str>, log: &Path) -> Child {
    if let Some(broker) = cluster {
        return spawn_host(bin, job, broker, log);
    }
    Command::new(bin)
        .args(["--log", "info", "run", "--quiet"])
        .arg(job)
        .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("a job's log file"))
        .spawn()
        .expect("spawning sluice")
}

/// How many units a host's log last said it owns.
pub fn owned_units(log: &str) -> Option<usize> {
    let line = log.lines().rev().find(|l| l.contains(" owns units "))?;
    let list = line.rsplit_once('[')?.1.trim_end_matches(']');
    Some(list.split(',').filter(|u| !u.trim().is_empty()).count())
}

/// How many units a host's log says it started or restored.
pub fn started_units(log: &str) -> usize {
    log.matches("): restoring ").count() + log.matches("): starting").count()
}

/// The attempt and checkpoint that unit `unit` of job `job` (run over several hosts at
/// `broker`) last committed a transaction with, writing `topic`: what a new owner
/// restores. `None` before its first commit.
pub fn unit_marker(broker: &str, job: &str, unit: u32, topic: &str) -> Option<(String, u64)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", format!("sluice-{job}.unit-{unit}-0"))
        .set("enable.auto.commit", "false")
        // The committed marker, even while a transaction of a crashed owner is open
        // (read committed, the broker answers only once it ends: when a new owner
        // fences that one, or after the transaction's timeout).
        .set("isolation.level", "read_uncommitted")
        .create()
        .expect("a consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(30))
        .expect("the marker");
    let e = committed.elements().into_iter().next()?;
    let Offset::Offset(id) = e.offset() else {
        return None;
    };
    // `sluice-run=RUN;attempt=ATTEMPT`
    let attempt = e.metadata().split_once(";attempt=")?.1.to_string();
    Some((attempt, id as u64))
}

/// Fences whoever runs unit `unit` of job `job` (run over several hosts at `broker`), as
/// a new owner does when it starts: the owner's next commit fails, and it starts the
/// unit again.
pub fn fence_unit(broker: &str, job: &str, unit: u32) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("transactional.id", format!("sluice-{job}.unit-{unit}-0"))
        .create()
        .expect("a producer");
    producer
        .init_transactions(Duration::from_secs(30))
        .expect("fencing the unit's owner");
}

/// Whether process `pid` is stopped (SIGSTOP).
pub fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}
