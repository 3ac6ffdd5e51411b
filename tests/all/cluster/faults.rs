//! A unit's protocol broken at each of its steps over several hosts, against the real
//! broker: a host crashes (aborts at a failpoint) between copying a checkpoint to the
//! store and committing the transaction that names it, or as a new owner after fencing
//! the old one, while copying the checkpoint it restores, or after deleting the older
//! attempts; a host stopped in the middle of starting a unit again wakes after the unit
//! moved. Each checks the committed output against counts computed from the input, and
//! the store against the markers.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use sluice_tests::cluster::{fence_unit, is_stopped, spawn_failing_host, unit_marker};

use super::{WordCount, log_of, owns, wait_for_output, wait_success, wait_until};

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
}

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
