//! The kill soak: runs the word count in a `sluice run` process and SIGKILLs it at
//! random moments, resuming from the latest checkpoint each time, `KILLS` times (default
//! 100) at parallelism 1 and 4, then compares the committed output with a failure-free
//! run. Prints kills, lost and duplicated lines. Not part of the test suite: it takes
//! minutes.
//!
//! ```text
//! cargo bench -p sluice-tests --bench soak            # KILLS=20 for a shorter one
//! ```

use std::collections::BTreeMap;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_tests::{run_job, sluice_run, test_dir, throttled_wordcount, write_job};

/// Lines by how often they occur.
fn multiset(text: &str) -> BTreeMap<&str, i64> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        *m.entry(line).or_insert(0) += 1;
    }
    m
}

fn soak(parallelism: u32, kills: usize, seed: &mut u64) {
    // Long enough that every kill lands while it runs: about 1 s of input per kill.
    let records = 5_000 * (kills as u64 + 2);
    let rate = 5000.0;
    let text = throttled_wordcount(parallelism, records, rate);
    // The same records, unthrottled.
    let reference_dir = test_dir(&format!("soak-reference-{parallelism}"));
    let unthrottled = text.replace(&format!("rate = {rate}\n"), "");
    run_job(&write_job(&reference_dir, &unthrottled)).expect("the failure-free run");
    let reference = std::fs::read_to_string(reference_dir.join("out/counts.tsv")).unwrap();

    let dir = test_dir(&format!("soak-{parallelism}"));
    let job = write_job(&dir, &text);
    let started = Instant::now();
    let mut killed = 0;
    loop {
        let mut child = sluice_run(
            env!("CARGO_BIN_EXE_sluice-test-cli"),
            &job,
            Some(&dir.join("checkpoints")),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning sluice");
        if killed == kills {
            assert!(child.wait().unwrap().success(), "the last run failed");
            break;
        }
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let delay = Duration::from_millis(150 + (*seed >> 33) % 900);
        let deadline = Instant::now() + delay;
        while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            thread::sleep(Duration::from_millis(5));
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        killed += 1;
    }
    let output = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    let (want, got) = (multiset(&reference), multiset(&output));
    let mut lost = 0;
    let mut duplicated = 0;
    for (line, n) in &want {
        let diff = got.get(line).copied().unwrap_or(0) - n;
        if diff < 0 {
            lost += -diff;
        } else {
            duplicated += diff;
        }
    }
    duplicated += got
        .iter()
        .filter(|(line, _)| !want.contains_key(*line))
        .map(|(_, n)| n)
        .sum::<i64>();
    println!(
        "parallelism {parallelism}: {killed} kills in {:.0} s, {} lines expected, {lost} lost, {duplicated} duplicated",
        started.elapsed().as_secs_f64(),
        reference.lines().count()
    );
}

fn main() {
    let kills: usize = std::env::var("KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(100);
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("kill soak: {kills} SIGKILLs per parallelism, seed {seed}");
    for parallelism in [1, 4] {
        soak(parallelism, kills, &mut seed);
    }
}
