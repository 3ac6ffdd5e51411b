//! Small helpers for benchmarks: repeated timing with medians, and tables of ratios.
//!
//! Machines here are shared and noisy, so every figure is the median of several runs, and
//! what matters is the ratio against a baseline measured in the same process.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use sluice::chain::{
    ChainOutput, ChainedOperator, OpenInfo, Operator, OperatorChain, OperatorIdentity,
    OperatorState,
};
use sluice::state::KeyedState;
use sluice::wasm::SandboxLimits;

use crate::engine;

/// Runs `f` `runs` times (after one warm-up run) and returns the median duration.
pub fn median_time(runs: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut times: Vec<Duration> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

/// Median times of a baseline and a subject measured in alternation, and the median of
/// the per-pair ratios.
#[derive(Debug, Clone, Copy)]
pub struct Paired {
    pub baseline: Duration,
    pub subject: Duration,
    /// Median of baseline time / subject time over the pairs: the subject's speed as a
    /// fraction of the baseline's (1.0: as fast; 0.5: half as fast).
    pub speed: f64,
}

/// Runs `baseline` and `subject` alternately `runs` times each (after one warm-up run of
/// each). Alternating keeps a burst of load from another process on the machine from
/// landing on one side only, and pairing the runs lets their ratio cancel slower drifts.
pub fn paired(runs: usize, mut baseline: impl FnMut(), mut subject: impl FnMut()) -> Paired {
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        start.elapsed()
    };
    let pairs = alternate(runs, || time(&mut baseline), || time(&mut subject));
    Paired {
        baseline: median(pairs.iter().map(|p| p.0).collect(), Duration::cmp),
        subject: median(pairs.iter().map(|p| p.1).collect(), Duration::cmp),
        speed: median(
            pairs
                .iter()
                .map(|(b, s)| b.as_secs_f64() / s.as_secs_f64())
                .collect(),
            f64::total_cmp,
        ),
    }
}

/// `runs` pairs of a baseline's and a subject's results measured in alternation, after
/// one warm-up run of each.
fn alternate<T>(
    runs: usize,
    mut baseline: impl FnMut() -> T,
    mut subject: impl FnMut() -> T,
) -> Vec<(T, T)> {
    baseline();
    subject();
    (0..runs.max(1)).map(|_| (baseline(), subject())).collect()
}

/// The median of `v` in the order `order` (the upper one of an even count).
fn median<T: Copy>(mut v: Vec<T>, order: impl Fn(&T, &T) -> std::cmp::Ordering) -> T {
    v.sort_by(order);
    v[v.len() / 2]
}

/// Wall-clock and CPU time (user and system, all threads) of one run.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub wall: Duration,
    pub cpu: Duration,
}

/// The CPU time used so far by `who` (`RUSAGE_THREAD`, `RUSAGE_CHILDREN`, …).
fn cpu_time(who: libc::c_int) -> Duration {
    // SAFETY: `rusage` is plain data, and getrusage writes only into the one passed.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(who, &mut usage), 0, "getrusage");
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The usage of `f` run on this thread (a single-threaded baseline).
pub fn usage_on_this_thread(f: impl FnOnce()) -> Usage {
    let (start, cpu) = (Instant::now(), cpu_time(libc::RUSAGE_THREAD));
    f();
    Usage {
        wall: start.elapsed(),
        cpu: cpu_time(libc::RUSAGE_THREAD) - cpu,
    }
}

/// The usage of `command` run as a child process to its end, and its output; panics unless
/// it succeeds. (Counts the children waited for meanwhile: run one at a time.)
pub fn usage_of_command(command: &mut std::process::Command) -> (Usage, std::process::Output) {
    let (start, cpu) = (Instant::now(), cpu_time(libc::RUSAGE_CHILDREN));
    let output = command.output().expect("starting the command");
    let usage = Usage {
        wall: start.elapsed(),
        cpu: cpu_time(libc::RUSAGE_CHILDREN) - cpu,
    };
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (usage, output)
}

/// The medians of a baseline's and a subject's usage measured in alternation (after one
/// warm-up run of each), and the medians of the per-pair ratios subject / baseline.
#[derive(Debug, Clone, Copy)]
pub struct PairedUsage {
    pub baseline: Usage,
    pub subject: Usage,
    pub wall_ratio: f64,
    pub cpu_ratio: f64,
}

/// Runs `baseline` and `subject` alternately `runs` times each, as [`paired`] does.
pub fn paired_usage(
    runs: usize,
    baseline: impl FnMut() -> Usage,
    subject: impl FnMut() -> Usage,
) -> PairedUsage {
    let pairs = alternate(runs, baseline, subject);
    let durations =
        |f: fn(&(Usage, Usage)) -> Duration| median(pairs.iter().map(f).collect(), Duration::cmp);
    let ratios = |f: fn(&Usage) -> Duration| {
        let v = pairs
            .iter()
            .map(|(b, s)| f(s).as_secs_f64() / f(b).as_secs_f64())
            .collect();
        median(v, f64::total_cmp)
    };
    PairedUsage {
        baseline: Usage {
            wall: durations(|p| p.0.wall),
            cpu: durations(|p| p.0.cpu),
        },
        subject: Usage {
            wall: durations(|p| p.1.wall),
            cpu: durations(|p| p.1.cpu),
        },
        wall_ratio: ratios(|u| u.wall),
        cpu_ratio: ratios(|u| u.cpu),
    }
}

/// `n` per second, human readable.
pub fn rate(n: f64) -> String {
    match n {
        n if n >= 1e6 => format!("{:.2} M/s", n / 1e6),
        n if n >= 1e3 => format!("{:.1} k/s", n / 1e3),
        n => format!("{n:.0} /s"),
    }
}

/// Number of runs: `SLUICE_BENCH_RUNS` or `default`.
pub fn runs(default: usize) -> usize {
    std::env::var("SLUICE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Whether to measure batch size `batch`: every size unless `SLUICE_BENCH_BATCH` names one
/// (for profiling one size).
pub fn measures_batch(batch: usize) -> bool {
    std::env::var("SLUICE_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .is_none_or(|only| only == batch)
}

/// The open info of a benchmark operator: subtask 1 of 1, 128 key groups.
pub fn open_info(name: &str, config: &[(&str, &str)], keyed: bool) -> OpenInfo {
    OpenInfo {
        job: "bench".into(),
        operator: name.into(),
        config: config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        subtask: 0,
        parallelism: 1,
        max_parallelism: 128,
        keyed,
        restored_state: None,
        attempt: 0,
        inputs: vec![sluice::chain::InputInfo {
            name: "bench".into(),
            broadcast: false,
        }],
    }
}

/// An instance of the component at `path` named `name`, over `state`, without a call
/// deadline (a slow run on a busy machine is measured, not cut).
pub fn wasm_operator(path: &str, name: &str, state: OperatorState) -> Box<dyn Operator> {
    let plugin =
        sluice::wasm::Plugin::load(&engine(), Path::new(path), false).expect("loading a plugin");
    let identity = OperatorIdentity {
        tenant: "bench".into(),
        job: "bench".into(),
        operator: name.into(),
        subtask: 0,
        parallelism: 1,
    };
    let limits = SandboxLimits {
        call_deadline: None,
        ..SandboxLimits::default()
    };
    Box::new(
        plugin
            .instantiate(identity, limits, state, Arc::new(AtomicBool::new(false)))
            .expect("instantiating"),
    )
}

/// Keyed state for a benchmark operator: all 128 key groups.
pub fn keyed_state() -> OperatorState {
    OperatorState::new(Some(KeyedState::heap(128, 0..128)))
}

/// The number in environment variable `name`, or `default` when it is unset or not one.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `operators` as one opened chain without outputs.
pub fn opened_chain(operators: Vec<(Box<dyn Operator>, OpenInfo)>) -> OperatorChain {
    let operators = operators
        .into_iter()
        .map(|(operator, open_info)| ChainedOperator {
            state_id: open_info.operator.clone(),
            operator,
            open_info,
            metrics: Arc::default(),
        })
        .collect();
    let mut chain = OperatorChain::new(operators, ChainOutput::None, Arc::default());
    chain.open_all().expect("opening the chain");
    chain
}
