//! What the server's client commands print for people: a job in a few lines, its tasks
//! as a table (`comfy-table`, sizes with `bytesize`). `--json` prints the server's
//! answer as it is instead.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;

use crate::server::client::Client;

/// One line: a job's id, name and state (what `submit`, `stop`, `start` and `cancel`
/// answer), with the savepoint a stop took.
pub(super) fn job_line(job: &Value) -> String {
    let mut line = format!(
        "job {} '{}': {}",
        text(&job["id"]),
        text(&job["name"]),
        text(&job["state"])
    );
    if let Some(savepoint) = job["savepoint"].as_str() {
        line.push_str(&format!(" (savepoint {savepoint})"));
    }
    line
}

/// `sluice status`: the job, its checkpoints, its last failure and its tasks.
pub(super) fn job_detail(job: &Value) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(job_line(job));
    line(format!(
        "  records read {}, written {}; restarts {}",
        count(&job["records_read"]),
        count(&job["records_written"]),
        count(&job["restarts"])
    ));
    let checkpoints = &job["checkpoints"];
    let mut cp = format!(
        "  checkpoints: {} completed, {} aborted",
        count(&checkpoints["completed"]),
        count(&checkpoints["aborted"])
    );
    if let Some(last) = checkpoints["last"].as_array().and_then(|l| l.first()) {
        cp.push_str(&format!(
            "; last #{} ({}) took {:.0} ms, {}",
            count(&last["id"]),
            text(&last["kind"]),
            last["duration_ms"].as_f64().unwrap_or(0.0),
            bytes(last["bytes"].as_u64().unwrap_or(0))
        ));
    }
    line(cp);
    if let Some(failure) = job["last_failure"].as_str() {
        line(format!("  last failure: {failure}"));
    }
    let tasks = job["tasks"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut table = super::table(&["task", "in", "out", "busy", "idle", "back"], 1..6);
    // Below its task's row: its source's and operators' lag and counters.
    let mut details: Vec<Vec<String>> = Vec::new();
    for task in tasks {
        let (busy, idle, back) = (
            task["busy_ms"].as_f64().unwrap_or(0.0),
            task["idle_ms"].as_f64().unwrap_or(0.0),
            task["backpressured_ms"].as_f64().unwrap_or(0.0),
        );
        let total = (busy + idle + back).max(1.0);
        let share = |ms: f64| format!("{:.0}%", 100.0 * ms / total);
        table.add_row(vec![
            text(&task["task"]),
            count(&task["records_in"]).to_string(),
            count(&task["records_out"]).to_string(),
            share(busy),
            share(idle),
            share(back),
        ]);
        let mut below = Vec::new();
        let source = &task["source"];
        if source.is_object() {
            if let Some(lag) = pairs(&source["lag"]) {
                below.push(format!("    {} lag: {lag}", text(&source["source"])));
            }
            if let Some(counters) = pairs(&source["counters"]) {
                below.push(format!("    {}: {counters}", text(&source["source"])));
            }
        }
        for op in task["operators"].as_array().into_iter().flatten() {
            if let Some(counters) = pairs(&op["counters"]) {
                below.push(format!("    {}: {counters}", text(&op["operator"])));
            }
        }
        details.push(below);
    }
    if !tasks.is_empty() {
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
pub(super) fn job_table(jobs: &Value) -> String {
    let mut table = super::table(&["id", "name", "state", "read", "written"], 3..5);
    for job in jobs["jobs"].as_array().into_iter().flatten() {
        table.add_row(vec![
            text(&job["id"]),
            text(&job["name"]),
            text(&job["state"]),
            count(&job["records_read"]).to_string(),
            count(&job["records_written"]).to_string(),
        ]);
    }
    table.trim_fmt() + "\n"
}

/// `sluice plugins`: one row per plugin.
pub(super) fn plugin_table(plugins: &Value) -> String {
    let mut table = super::table(&["name", "sha256", "size", "interface"], 2..3);
    for p in plugins["plugins"].as_array().into_iter().flatten() {
        let sha = text(&p["sha256"]);
        table.add_row(vec![
            text(&p["name"]),
            sha[..sha.len().min(16)].to_string(),
            bytes(count(&p["size"])),
            text(&p["interface"]),
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
        let running = client.status(id)?["running"].as_bool().unwrap_or(false);
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

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn count(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// `k=v k=v` of an object, or `None` when it has no entries.
fn pairs(v: &Value) -> Option<String> {
    let map = v.as_object().filter(|m| !m.is_empty())?;
    Some(
        map.iter()
            .map(|(k, v)| format!("{k}={}", text(v)))
            .collect::<Vec<_>>()
            .join(" "),
    )
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
        let job = serde_json::json!({
            "id": "ab12", "name": "wc", "state": "running", "records_read": 10,
            "records_written": 4, "restarts": 1,
            "checkpoints": {"completed": 3, "aborted": 0,
                "last": [{"id": 3, "kind": "checkpoint", "duration_ms": 12.4, "bytes": 2048}]},
            "tasks": [{"task": "source -> tokenize (1/1)", "records_in": 10, "records_out": 40,
                "busy_ms": 10, "idle_ms": 30, "backpressured_ms": 0,
                "source": {"source": "source", "lag": {"t/0": 5}, "counters": {}},
                "operators": [{"operator": "tokenize", "counters": {"seen": 2}}]}],
        });
        let text = job_detail(&job);
        assert!(text.starts_with("job ab12 'wc': running\n"), "{text}");
        assert!(
            text.contains("records read 10, written 4; restarts 1"),
            "{text}"
        );
        assert!(
            text.contains("last #3 (checkpoint) took 12 ms, 2.0 KiB"),
            "{text}"
        );
        assert!(text.contains("25%") && text.contains("75%"), "{text}");
        assert!(text.contains("source lag: t/0=5"), "{text}");
        assert!(text.contains("tokenize: seen=2"), "{text}");
    }
}
