//! What the server's client commands print for people: a job in a few lines, its tasks
//! as a table. `--json` prints the server's answer as it is instead.

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
    if !tasks.is_empty() {
        line(format!(
            "  {:<36} {:>10} {:>10} {:>6} {:>6} {:>6}",
            "task", "in", "out", "busy", "idle", "back"
        ));
    }
    for task in tasks {
        let (busy, idle, back) = (
            task["busy_ms"].as_f64().unwrap_or(0.0),
            task["idle_ms"].as_f64().unwrap_or(0.0),
            task["backpressured_ms"].as_f64().unwrap_or(0.0),
        );
        let total = (busy + idle + back).max(1.0);
        let share = |ms: f64| format!("{:.0}%", 100.0 * ms / total);
        line(format!(
            "  {:<36} {:>10} {:>10} {:>6} {:>6} {:>6}",
            text(&task["task"]),
            count(&task["records_in"]),
            count(&task["records_out"]),
            share(busy),
            share(idle),
            share(back)
        ));
        let source = &task["source"];
        if source.is_object() {
            if let Some(lag) = pairs(&source["lag"]) {
                line(format!("    {} lag: {lag}", text(&source["source"])));
            }
            if let Some(counters) = pairs(&source["counters"]) {
                line(format!("    {}: {counters}", text(&source["source"])));
            }
        }
        for op in task["operators"].as_array().into_iter().flatten() {
            if let Some(counters) = pairs(&op["counters"]) {
                line(format!("    {}: {counters}", text(&op["operator"])));
            }
        }
    }
    out
}

/// `sluice list`: one row per job.
pub(super) fn job_table(jobs: &Value) -> String {
    let mut out = format!(
        "{:<18} {:<24} {:<12} {:>12} {:>12}\n",
        "id", "name", "state", "read", "written"
    );
    for job in jobs["jobs"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<18} {:<24} {:<12} {:>12} {:>12}\n",
            text(&job["id"]),
            text(&job["name"]),
            text(&job["state"]),
            count(&job["records_read"]),
            count(&job["records_written"])
        ));
    }
    out
}

/// `sluice plugins`: one row per plugin.
pub(super) fn plugin_table(plugins: &Value) -> String {
    let mut out = format!(
        "{:<24} {:<16} {:>10}  {}\n",
        "name", "sha256", "bytes", "interface"
    );
    for p in plugins["plugins"].as_array().into_iter().flatten() {
        let sha = text(&p["sha256"]);
        out.push_str(&format!(
            "{:<24} {:<16} {:>10}  {}\n",
            text(&p["name"]),
            &sha[..sha.len().min(16)],
            count(&p["size"]),
            text(&p["interface"])
        ));
    }
    out
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
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
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
