//! Small helpers for benchmarks: repeated timing with medians, and tables of ratios.
//!
//! Machines here are shared and noisy, so every figure is the median of several runs, and
//! what matters is the ratio against a baseline measured in the same process.

use std::time::{Duration, Instant};

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
