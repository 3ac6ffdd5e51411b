//! A unit's protocol broken at each of its steps over several hosts, against the real
//! broker: a host crashes (aborts at a failpoint) between copying a checkpoint to the
//! store and committing the transaction that names it, or as a new owner after fencing
//! the old one, while copying the checkpoint it restores, or after deleting the older
//! attempts; a host stopped in the middle of starting a unit again wakes after the unit
//! moved; a checkpoint a marker names is lost from the store. Each checks the committed
//! output against counts computed from the input, and the store against the markers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Output};
use std::time::Duration;

use sluice_tests::cluster::{fence_unit, is_stopped, spawn_failing_host, unit_marker};
use sluice_tests::expected_word_counts;
use sluice_tests::kafka::read_committed;

use super::{WordCount, log_of, owns, signal, wait_for_output, wait_success, wait_until};

/// Units of [`WordCount`]'s job: four reading the source, four counting.
const UNITS: u32 = 8;

/// An attempt and a checkpoint id, as a marker names them.
type Marker = (String, u64);

impl WordCount {
    /// Host `n`, with `FAILPOINTS` set to `failpoints`.
    fn spawn_failing(&self, n: usize, failpoints: &str) -> Child {
        spawn_failing_host(
            env!("CARGO_BIN_EXE_sluice-test-cli"),
            &self.job,
            &self.broker,
            &self.dir.join(format!("host-{n}.log")),
            failpoints,
        )
    }

    /// Stops host `n` with SIGTERM (it leaves the job's group at once: its units move
    /// without waiting for the session timeout) and waits for it to end well.
    fn stop(&self, host: &mut Child, n: usize) {
        signal(host, "-TERM");
        wait_success(&self.dir, host, n, Duration::from_secs(60));
    }

    /// Waits for host `n` to crash at failpoint `point`.
    fn wait_crash(&self, host: &mut Child, n: usize, point: &str) {
        wait_until(
            &format!("host {n} to crash at {point}"),
            Duration::from_secs(60),
            || host.try_wait().unwrap().is_some(),
        );
        let log = log_of(&self.dir, n);
        assert!(
            log.contains(&format!("failpoint {point}: aborting the process")),
            "host {n} did not crash at {point}: {log}"
        );
    }

    /// The checkpoint unit `unit`'s last committed transaction names.
    fn marker(&self, unit: u32) -> Option<Marker> {
        let topic = if unit < 4 {
            format!("sluice-{}.exchange-1", self.output)
        } else {
            self.output.clone()
        };
        unit_marker(&self.broker, &self.output, unit, &topic)
    }

    fn markers(&self) -> Vec<Option<Marker>> {
        (0..UNITS).map(|u| self.marker(u)).collect()
    }

    /// Unit `unit`'s folder in the checkpoint store.
    fn unit_dir(&self, unit: u32) -> PathBuf {
        self.dir
            .join("store")
            .join(format!("sluice-{}", self.output))
            .join(format!("unit-{unit}"))
    }

    /// The attempts of unit `unit` in the store.
    fn attempts(&self, unit: u32) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.unit_dir(unit))
            .map(|entries| {
                entries
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The complete checkpoints (with their metadata) of `attempt` of unit `unit` in
    /// the store, oldest first.
    fn checkpoints(&self, unit: u32, attempt: &str) -> Vec<u64> {
        let mut ids: Vec<u64> = std::fs::read_dir(self.unit_dir(unit).join(attempt))
            .map(|entries| {
                entries
                    .map(|e| e.unwrap().path())
                    .filter(|p| p.join("_metadata").is_file())
                    .filter_map(|p| p.file_name()?.to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort_unstable();
        ids
    }

    /// Whether the store holds the checkpoint `marker` names, complete.
    fn holds(&self, unit: u32, (attempt, id): &Marker) -> bool {
        self.checkpoints(unit, attempt).contains(id)
    }

    /// Asserts that every unit's marker names a checkpoint the store holds: the one a
    /// new owner restores.
    fn assert_markers_held(&self) {
        for unit in 0..UNITS {
            if let Some(marker) = self.marker(unit) {
                assert!(
                    self.holds(unit, &marker),
                    "unit {unit}'s marker names {marker:?}, which the store does not hold \
                     (it has {:?})",
                    self.attempts(unit)
                );
            }
        }
    }

    /// `sluice reset-unit` of this job with `args`.
    fn reset_unit(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
            .arg("reset-unit")
            .arg(&self.job)
            .args(["--cluster", &self.broker])
            .args(args)
            .env_remove("FAILPOINTS")
            .output()
            .unwrap()
    }
}

/// A host crashes between copying a checkpoint to the store and committing the
/// transaction that would name it: the store holds a checkpoint newer than the marker,
/// and the next owner restores the one the marker names, not that one.
#[test]
fn a_crash_between_a_checkpoints_upload_and_its_commit() {
    let point = "cluster::after-upload";
    let Some(wc) = WordCount::new("cluster-after-upload", 53, 1_600, false) else {
        return;
    };
    // Alone, the host runs every unit: about 5 checkpoints each, then the crash.
    let mut host = wc.spawn_failing(0, &format!("{point}=40*off->return(abort)"));
    wc.wait_crash(&mut host, 0, point);
    wc.assert_markers_held();
    let ahead: Vec<(u32, Marker)> = (0..UNITS)
        .filter_map(|u| {
            let marker = wc.marker(u)?;
            let newest = *wc.checkpoints(u, &marker.0).last()?;
            (newest > marker.1).then_some((u, marker))
        })
        .collect();
    assert!(
        !ahead.is_empty(),
        "no checkpoint in the store is newer than its unit's marker"
    );
    wc.write_rest();
    let next = wc.spawn(1);
    wc.complete(&mut [None, Some(next)]);
    let log = log_of(&wc.dir, 1);
    for (unit, (attempt, id)) in ahead {
        let restored = format!("unit {unit} (");
        assert!(
            log.lines()
                .any(|l| l.contains(&restored) && l.contains(&format!("restore-{attempt}-{id} "))),
            "unit {unit} did not restore checkpoint {id} of {attempt}, the marker's: {log}"
        );
    }
}

/// The first host runs the job until output is committed and stops (its units move at
/// once); the next, a new owner of every unit, crashes at `point` while it starts its
/// first; a third takes them all over, restores each and finishes the job.
fn a_new_owner_crashes_at(point: &str, name: &str, seed: u64) {
    let Some(wc) = WordCount::new(name, seed, 1_600, false) else {
        return;
    };
    let mut first = wc.spawn(0);
    wait_for_output(
        &wc.dir,
        std::slice::from_mut(&mut first),
        &wc.broker,
        &wc.output,
        100,
    );
    // Every unit committed once, so that each has a checkpoint to restore (on a busy
    // machine a unit can start late and commit after the output passed 100 records).
    wait_until("every unit committed", Duration::from_secs(60), || {
        wc.markers().iter().all(Option::is_some)
    });
    wc.stop(&mut first, 0);
    let mut crashing = wc.spawn_failing(1, &format!("{point}=return(abort)"));
    wc.wait_crash(&mut crashing, 1, point);
    wc.assert_markers_held();
    wc.write_rest();
    let third = wc.spawn(2);
    wc.complete(&mut [None, None, Some(third)]);
    let log = log_of(&wc.dir, 2);
    assert_eq!(
        log.matches("): restoring ").count(),
        UNITS as usize,
        "{log}"
    );
}

#[test]
fn a_new_owner_crashing_after_it_fenced_the_old_one() {
    a_new_owner_crashes_at("cluster::after-fence", "cluster-after-fence", 67);
}

#[test]
fn a_new_owner_crashing_while_it_copies_the_checkpoint() {
    a_new_owner_crashes_at("cluster::during-download", "cluster-download", 71);
}

/// A new owner crashes right after deleting the attempts older than the one the marker
/// names: what it deleted is never needed again, and what the marker names is kept.
#[test]
fn a_new_owner_crashing_after_it_deleted_the_old_attempts() {
    let point = "cluster::after-delete-attempts";
    let Some(wc) = WordCount::new("cluster-after-delete", 73, 1_600, false) else {
        return;
    };
    let mut first = wc.spawn(0);
    wait_for_output(
        &wc.dir,
        std::slice::from_mut(&mut first),
        &wc.broker,
        &wc.output,
        100,
    );
    wc.stop(&mut first, 0);
    // A second host takes every unit over and commits: each unit then has two attempts
    // in the store, the first host's and the second's (its marker names the second's).
    let firsts = wc.markers();
    let mut second = wc.spawn(1);
    wait_until(
        "the second host committed for every unit",
        Duration::from_secs(60),
        || {
            assert!(
                second.try_wait().unwrap().is_none(),
                "{}",
                log_of(&wc.dir, 1)
            );
            wc.markers()
                .iter()
                .zip(&firsts)
                .all(|(now, first)| now.as_ref().map(|m| &m.0) != first.as_ref().map(|m| &m.0))
        },
    );
    wc.stop(&mut second, 1);
    for unit in 0..UNITS {
        assert_eq!(wc.attempts(unit).len(), 2, "unit {unit}");
    }
    let mut crashing = wc.spawn_failing(2, &format!("{point}=return(abort)"));
    wc.wait_crash(&mut crashing, 2, point);
    wc.assert_markers_held();
    let cleaned = (0..UNITS)
        .filter(|&u| {
            wc.marker(u)
                .is_some_and(|(attempt, _)| wc.attempts(u) == [attempt])
        })
        .count();
    assert!(cleaned >= 1, "no unit's older attempt was deleted");
    wc.write_rest();
    let fourth = wc.spawn(3);
    wc.complete(&mut [None, None, None, Some(fourth)]);
}

/// A host stopped at `point` while it starts a unit again (fenced by someone, its run
/// failed), past the session timeout: the unit moves, and the other host restores it
/// and commits. When the stopped host wakes it goes on with what it was doing, on a
/// unit no longer its own: it must be fenced, not fence the new owner (whose units never
/// fail), and it must leave the new owner's checkpoints alone (every marker names a
/// checkpoint the store holds, while it wakes and after).
fn a_zombie_woken_at(point: &str, name: &str, seed: u64) {
    let Some(wc) = WordCount::new(name, seed, 2_400, false) else {
        return;
    };
    // Alone, the first host starts the 8 units (8 passes through `point`); fenced, the
    // last one fails, and this host starts it again: there it stops. (The last: when the
    // stopped host joins again, the group moves the first units to it, so the other host
    // keeps this one, and a fence of its run would fail it.)
    let unit = UNITS - 1;
    let mut zombie = wc.spawn_failing(0, &format!("{point}=8*off->1*return(stop)->off"));
    wait_for_output(
        &wc.dir,
        std::slice::from_mut(&mut zombie),
        &wc.broker,
        &wc.output,
        100,
    );
    fence_unit(&wc.broker, &wc.output, unit);
    let stopping = format!("failpoint {point}: stopping");
    wait_until(
        "the first host to stop while it starts the unit again",
        Duration::from_secs(60),
        || {
            assert!(
                zombie.try_wait().unwrap().is_none(),
                "{}",
                log_of(&wc.dir, 0)
            );
            log_of(&wc.dir, 0).contains(&stopping) && is_stopped(zombie.id())
        },
    );
    let log = log_of(&wc.dir, 0);
    let failed = log.find(&format!("unit {unit} failed (failure 1 in a row"));
    assert!(
        failed.is_some() && failed < log.find(&stopping),
        "the host did not stop while starting unit {unit} again: {log}"
    );
    let stale = wc.markers();
    let mut owner = wc.spawn(1);
    wait_until(
        "the other host to commit for every unit",
        Duration::from_secs(90),
        || {
            assert!(
                owner.try_wait().unwrap().is_none(),
                "{}",
                log_of(&wc.dir, 1)
            );
            owns(&wc.dir, 1, UNITS as usize)
                && wc.markers().iter().zip(&stale).all(|(now, before)| {
                    now.as_ref().map(|m| &m.0) != before.as_ref().map(|m| &m.0)
                })
        },
    );
    wc.assert_markers_held();
    signal(&zombie, "-CONT");
    // While it goes on, and until it is back in the group with units of its own, every
    // marker names a checkpoint the store holds.
    let continued = format!("failpoint {point}: continued");
    wait_until(
        "the woken host to be back in the group",
        Duration::from_secs(60),
        || {
            assert!(
                zombie.try_wait().unwrap().is_none(),
                "{}",
                log_of(&wc.dir, 0)
            );
            wc.assert_markers_held();
            let log = log_of(&wc.dir, 0);
            log.split(&continued).nth(1).is_some_and(|after| {
                after
                    .lines()
                    .filter(|l| l.contains(" owns units "))
                    .any(|l| !l.ends_with("[]"))
            })
        },
    );
    wc.write_rest();
    wc.complete(&mut [Some(zombie), Some(owner)]);
    wc.assert_markers_held();
    let log = log_of(&wc.dir, 1);
    assert!(
        !log.contains(" failed (failure "),
        "the woken host fenced a unit of the new owner: {log}"
    );
}

#[test]
fn a_zombie_woken_after_it_fenced_is_fenced_and_leaves_the_new_owners_checkpoints() {
    a_zombie_woken_at("cluster::after-fence", "cluster-zombie-fence", 59);
}

#[test]
fn a_zombie_woken_as_its_sink_opens_is_fenced_and_leaves_the_new_owners_checkpoints() {
    a_zombie_woken_at("kafka-sink::open", "cluster-zombie-open", 61);
}

/// Stops the first host once output is committed, and takes the checkpoint unit
/// `unit`'s marker names out of the store (as a lost disk or a hand would); returns the
/// marker and where the folder went.
fn lose_checkpoint(wc: &WordCount, unit: u32) -> (Marker, PathBuf, PathBuf) {
    let mut first = wc.spawn(0);
    wait_for_output(
        &wc.dir,
        std::slice::from_mut(&mut first),
        &wc.broker,
        &wc.output,
        100,
    );
    wc.stop(&mut first, 0);
    let (attempt, id) = wc.marker(unit).expect("a marker");
    let folder = wc.unit_dir(unit).join(&attempt).join(id.to_string());
    let aside = wc.dir.join("lost");
    std::fs::rename(&folder, &aside).unwrap();
    ((attempt, id), folder, aside)
}

/// The lines of host `n`'s log that say unit `unit` cannot be restored.
fn cannot_restore(wc: &WordCount, n: usize, unit: u32) -> Vec<String> {
    log_of(&wc.dir, n)
        .lines()
        .filter(|l| l.contains(&format!("unit {unit} cannot be restored")))
        .map(str::to_string)
        .collect()
}

/// A checkpoint a unit's marker names is missing from the store: the host that gets the
/// unit says, each time it tries, which unit, which marker, what is missing and how to
/// go on; the other units go on. Put back, the unit goes on by itself, exactly once.
#[test]
fn a_lost_checkpoint_stops_its_unit_with_what_to_do_until_it_is_back() {
    let Some(wc) = WordCount::new("cluster-lost", 89, 1_600, false) else {
        return;
    };
    let unit = 5;
    let ((attempt, id), folder, aside) = lose_checkpoint(&wc, unit);
    let older: Vec<u64> = wc
        .checkpoints(unit, &attempt)
        .into_iter()
        .filter(|c| *c < id)
        .collect();
    let mut host = wc.spawn(1);
    wait_until(
        "the host to say twice that the unit cannot be restored",
        Duration::from_secs(60),
        || {
            assert!(host.try_wait().unwrap().is_none(), "{}", log_of(&wc.dir, 1));
            cannot_restore(&wc, 1, unit).len() >= 2
        },
    );
    let said = &cannot_restore(&wc, 1, unit)[0];
    let missing = wc.dir.join("store").canonicalize().unwrap().join(format!(
        "sluice-{}/unit-{unit}/{attempt}/{id}/_metadata",
        wc.output
    ));
    let mut expected = vec![
        format!("unit {unit} (stage 1: "),
        format!("names checkpoint {id} of attempt {attempt}"),
        format!("\"sluice-{}.unit-{unit}-0\"", wc.output),
        format!("{} is missing", missing.display()),
        format!("sluice reset-unit JOB.toml --unit {unit} --fresh"),
    ];
    if let Some(newest) = older.last() {
        expected.push(format!(
            "sluice reset-unit JOB.toml --unit {unit} --to {attempt}/{newest}"
        ));
    }
    for what in expected {
        assert!(said.contains(&what), "{what:?} is not in: {said}");
    }
    std::fs::rename(&aside, &folder).unwrap();
    wc.write_rest();
    wc.complete(&mut [None, Some(host)]);
}

/// Every word's running counts, which may repeat (a reset unit writes some again) but
/// must have no gap: the highest per word.
fn counts_without_gaps(broker: &str, topic: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut seen: BTreeMap<String, std::collections::BTreeSet<u64>> = BTreeMap::new();
    for r in read_committed(broker, topic) {
        let count = r.value.parse().map_err(|e| format!("{:?}: {e}", r.value))?;
        seen.entry(r.key.unwrap_or_default())
            .or_default()
            .insert(count);
    }
    seen.into_iter()
        .map(|(word, counts)| {
            let n = counts.len() as u64;
            match counts.last() {
                Some(&last) if last == n => Ok((word, n)),
                _ => Err(format!("word {word:?} has gaps: {counts:?}")),
            }
        })
        .collect()
}

/// `sluice reset-unit` moves a unit whose checkpoint is lost back to an older one of the
/// same attempt (refusing newer ones, whose output was never committed), and starts
/// another unit over: both go on, and write again what they had committed since, but
/// nothing is lost.
#[test]
fn a_unit_whose_checkpoint_is_lost_goes_on_once_reset() {
    let Some(wc) = WordCount::new("cluster-reset", 83, 1_600, false) else {
        return;
    };
    let unit = 5;
    let ((attempt, id), _, _) = lose_checkpoint(&wc, unit);
    let newest = wc
        .checkpoints(unit, &attempt)
        .into_iter()
        .rfind(|c| *c < id)
        .expect("an older checkpoint of the attempt");
    let mut host = wc.spawn(1);
    wait_until(
        "the host to say the unit cannot be restored",
        Duration::from_secs(60),
        || {
            assert!(host.try_wait().unwrap().is_none(), "{}", log_of(&wc.dir, 1));
            !cannot_restore(&wc, 1, unit).is_empty()
        },
    );
    let unit_arg = unit.to_string();
    for (to, refusal) in [
        (
            format!("{attempt}/{}", id + 1),
            "only from an older checkpoint of that attempt",
        ),
        (
            format!("{attempt}/{id}"),
            "only from an older checkpoint of that attempt",
        ),
        (
            format!("0a/{newest}"),
            "only from an older checkpoint of that attempt",
        ),
    ] {
        let out = wc.reset_unit(&["--unit", &unit_arg, "--to", &to]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(refusal),
            "--to {to}: {stderr}"
        );
    }
    let out = wc.reset_unit(&["--unit", &unit_arg, "--to", &format!("{attempt}/{newest}")]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && said.contains(&format!("unit {unit} (stage 1: "))
            && said.contains(&format!(
                "goes on from checkpoint {newest} of attempt {attempt}"
            )),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = wc.reset_unit(&["--unit", "6", "--fresh"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("unit 6 (stage 1: ") && said.contains("starts over"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wc.write_rest();
    let expected = expected_word_counts(&wc.text, 1);
    wait_until("every line counted", Duration::from_secs(120), || {
        assert!(host.try_wait().unwrap().is_none(), "{}", log_of(&wc.dir, 1));
        counts_without_gaps(&wc.broker, &wc.output).is_ok_and(|counts| counts == expected)
    });
    let written = read_committed(&wc.broker, &wc.output).len() as u64;
    assert!(
        written > expected.values().sum::<u64>(),
        "the unit started over wrote nothing again"
    );
    wc.stop(&mut host, 1);
    assert_eq!(
        counts_without_gaps(&wc.broker, &wc.output),
        Ok(expected),
        "after the host stopped"
    );
    assert!(wc.marker(unit).is_some_and(|(a, _)| a != attempt));
}
