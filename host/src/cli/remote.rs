//! What the server's client commands print for people: a job in a few lines, its tasks
//! as a table (`comfy-table`, sizes with `bytesize`). `--json` prints the server's
//! answer (the same types, as JSON) instead.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use anyhow::Result;

use crate::server::client::Client;
use crate::server::model::{JobDetail, JobList, JobSummary, PluginList};

/// One line: a job's id, name and state (what `submit`, `stop`, `start` and `cancel`
/// answer).
pub(super) fn job_line(job: &JobSummary) -> String {
    format!("job {} '{}': {}", job.id, job.name, state(job))
}

fn state(job: &JobSummary) -> String {
    serde_json::to_value(job.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// `sluice status`: the job, its checkpoints, its last failure and its tasks.
pub(super) fn job_detail(job: &JobDetail) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    let mut first = job_line(&job.job);
    if let Some(savepoint) = &job.savepoint {
        first.push_str(&format!(" (savepoint {savepoint})"));
    }
    line(first);
    line(format!(
        "  records read {}, written {}; restarts {}",
        job.records_read, job.records_written, job.restarts
    ));
    let checkpoints = &job.checkpoints;
    let mut cp = format!(
        "  checkpoints: {} completed, {} aborted",
        checkpoints.completed, checkpoints.aborted
    );
    if let Some(last) = checkpoints.last.first() {
        cp.push_str(&format!(
            "; last #{} ({}) took {:.0} ms (sync {:.1} ms, async {:.0} ms), {}",
            last.id,
            last.kind,
            last.duration_ms,
            last.max_sync_ms,
            last.max_async_ms,
            bytes(last.bytes)
        ));
        // Incremental: it wrote less than the state it restores.
        if last.full_bytes > last.bytes {
            cp.push_str(&format!(" of {}", bytes(last.full_bytes)));
        }
    }
    line(cp);
    if let Some(failure) = &job.last_failure {
        line(format!("  last failure: {failure}"));
    }
    let mut table = super::table(&["task", "in", "out", "busy", "idle", "back"], 1..6);
    // Below its task's row: its source's and operators' lag and counters.
    let mut details: Vec<Vec<String>> = Vec::new();
    for task in &job.tasks {
        let (busy, idle, back) = (task.busy_ms, task.idle_ms, task.backpressured_ms);
        let total = (busy + idle + back).max(1) as f64;
        let share = |ms: u64| format!("{:.0}%", 100.0 * ms as f64 / total);
        table.add_row(vec![
            task.task.clone(),
            task.records_in.to_string(),
            task.records_out.to_string(),
            share(busy),
            share(idle),
            share(back),
        ]);
        let mut below = Vec::new();
        if let Some(source) = &task.source {
            if let Some(lag) = pairs(&source.lag) {
                below.push(format!("    {} lag: {lag}", source.source));
            }
            if let Some(counters) = pairs(&source.counters) {
                below.push(format!("    {}: {counters}", source.source));
            }
        }
        for op in &task.operators {
            if op.state_memory_bytes > 0 || op.state_disk_bytes > 0 {
                below.push(format!(
                    "    {} state: {} in memory, {} on disk (at its last checkpoint)",
                    op.operator,
                    bytes(op.state_memory_bytes),
                    bytes(op.state_disk_bytes)
                ));
            }
            if let Some(counters) = pairs(&op.counters) {
                below.push(format!("    {}: {counters}", op.operator));
            }
        }
        details.push(below);
    }
    if !job.tasks.is_empty() {
        let rows = table.trim_fmt();
        let mut rows = rows.lines();
        line(format!("  {}", rows.next().unwrap_or_default()));
        for (row, below) in rows.zip(&details) {
            line(format!("  {row}"));
            below.iter().for_each(|l| line(l.clone()));
        }
    }
    out
}

/// `sluice list`: one row per job.
pub(super) fn job_table(jobs: &JobList) -> String {
    let mut table = super::table(&["id", "name", "state", "read", "written"], 3..5);
    for job in &jobs.jobs {
        table.add_row(vec![
            job.job.id.clone(),
            job.job.name.clone(),
            state(&job.job),
            job.records_read.to_string(),
            job.records_written.to_string(),
        ]);
    }
    table.trim_fmt() + "\n"
}

/// `sluice plugins`: one row per plugin.
pub(super) fn plugin_table(plugins: &PluginList) -> String {
    let mut table = super::table(&["name", "sha256", "size", "interface"], 2..3);
    for p in &plugins.plugins {
        table.add_row(vec![
            p.name.clone(),
            p.sha256[..p.sha256.len().min(16)].to_string(),
            bytes(p.size),
            p.interface.clone(),
        ]);
    }
    table.trim_fmt() + "\n"
}

/// `sluice logs --follow`: prints the job's log lines as they come, until the job is
/// no longer running (then its last lines, and returns).
pub(super) fn follow_logs(client: &Client, id: &str, out: &mut dyn Write) -> Result<()> {
    let mut printed: Vec<String> = Vec::new();
    loop {
        // Asked before the lines, so that the lines read after it ended are its last.
        let running = client.status(id)?.job.running;
        let text = String::from_utf8_lossy(&client.logs(id)?).into_owned();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        for line in &lines[new_lines_from(&printed, &lines)..] {
            writeln!(out, "{line}")?;
        }
        out.flush()?;
        printed = lines;
        if !running {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Where the lines not printed yet begin in `now`, the server's latest window of a
/// job's lines, given `before`, the window printed last: after the longest end of
/// `before` that `now` begins with (the window slides as old lines leave it).
fn new_lines_from(before: &[String], now: &[String]) -> usize {
    (0..=before.len().min(now.len()))
        .rev()
        .find(|&n| before[before.len() - n..] == now[..n])
        .unwrap_or(0)
}

/// `k=v k=v` of a map, or `None` when it has no entries.
fn pairs(map: &BTreeMap<String, u64>) -> Option<String> {
    (!map.is_empty()).then(|| {
        map.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    })
}

fn bytes(n: u64) -> String {
    bytesize::ByteSize(n).display().iec().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn following_prints_only_the_lines_not_printed_yet() {
        assert_eq!(new_lines_from(&[], &lines("a b")), 0);
        assert_eq!(new_lines_from(&lines("a b"), &lines("a b c")), 2);
        // The window slid: `a` left it.
        assert_eq!(new_lines_from(&lines("a b c"), &lines("b c d e")), 2);
        assert_eq!(new_lines_from(&lines("a b"), &lines("a b")), 2);
        // Nothing in common: all of it is new.
        assert_eq!(new_lines_from(&lines("a b"), &lines("x y")), 0);
    }

    #[test]
    fn a_job_reads_in_a_few_lines() {
        let job: JobDetail = serde_json::from_value(serde_json::json!({
            "id": "ab12", "name": "wc", "state": "running", "running": true,
            "submitted_ms": 0, "submitted": "1970-01-01T00:00:00.000Z", "tenant": "t",
            "plugins": {}, "records_read": 10, "records_written": 4, "restarts": 1,
            "failures_by_kind": {}, "last_failure": null, "savepoint": null,
            "checkpoints": {"completed": 3, "aborted": 0, "last_aborted": [],
                "last": [{"status": "completed", "id": 3, "kind": "checkpoint", "name": null,
                    "triggered_ms": 0, "triggered": "1970-01-01T00:00:00.000Z",
                    "duration_ms": 12.4, "max_sync_ms": 1.0, "max_async_ms": 9.0,
                    "bytes": 2048, "full_bytes": 8192}]},
            "tasks": [{"task": "source -> tokenize (1/1)", "records_in": 10, "records_out": 40,
                "busy_ms": 10, "idle_ms": 30, "backpressured_ms": 0, "mailbox_depth": 0,
                "watermark": null,
                "source": {"source": "source", "subtask": 0, "records_out": 10,
                    "lag": {"t/0": 5}, "counters": {}},
                "operators": [{"operator": "tokenize", "subtask": 0, "records_in": 10,
                    "records_out": 40, "busy_ms": 10, "memory_bytes": 0,
                    "state_memory_bytes": 67108864, "state_disk_bytes": 1048576,
                    "counters": {"seen": 2}}]}],
            "graph": [], "output": [], "cluster": false,
        }))
        .unwrap();
        let text = job_detail(&job);
        assert!(text.starts_with("job ab12 'wc': running\n"), "{text}");
        assert!(
            text.contains("records read 10, written 4; restarts 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "last #3 (checkpoint) took 12 ms (sync 1.0 ms, async 9 ms), 2.0 KiB of 8.0 KiB"
            ),
            "{text}"
        );
        assert!(text.contains("25%") && text.contains("75%"), "{text}");
        assert!(text.contains("source lag: t/0=5"), "{text}");
        assert!(text.contains("tokenize: seen=2"), "{text}");
        assert!(
            text.contains("tokenize state: 64.0 MiB in memory, 1.0 MiB on disk"),
            "{text}"
        );
    }
}
