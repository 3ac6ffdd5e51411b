//! What the server's client commands print for people: a job in a few lines, its tasks
//! as a table (`comfy-table`, sizes with `bytesize`). `--json` prints the server's
//! answer (the same types, as JSON) instead.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::server::client::Client;
use crate::server::model::{ClusterStatus, JobDetail, JobList, JobSummary, PluginList};

/// A call an operator has been in this long (ms) is shown in `sluice status`: an operator
/// stuck in one call then stands out from one that is busy.
pub(crate) const LONG_CALL_MS: u64 = 1000;

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
    let committed = match job.records_committed {
        Some(n) => format!(", committed {n}"),
        None => String::new(),
    };
    line(format!(
        "  records read {}, written {}{committed}; restarts {}",
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
        if last.files > 0 {
            cp.push_str(&format!(" in {} files", last.files));
        }
    }
    line(cp);
    for c in &checkpoints.in_progress {
        line(format!(
            "  in progress: #{} ({}) acknowledged by {} of {} tasks, {} written so far",
            c.id,
            c.kind,
            c.acknowledged,
            c.tasks,
            bytes(c.bytes)
        ));
    }
    if let Some(failure) = &job.last_failure {
        line(format!("  last failure: {failure}"));
    }
    if !job.exceptions.is_empty() {
        line(format!(
            "  failures, newest first ({} kept):",
            job.exceptions.len()
        ));
        for e in job.exceptions.iter().take(5) {
            line(format!(
                "    {} attempt {} ({}): {}",
                e.at, e.attempt, e.kind, e.error
            ));
        }
    }
    if let ClusterStatus::Host(cluster) = &job.cluster {
        line(format!(
            "  over several servers: this one is {}, running units {:?} of {} ({} finished)",
            cluster.host,
            cluster.running,
            cluster.units,
            cluster.finished.len()
        ));
        for member in &cluster.group {
            let units: Vec<u32> = member.units.iter().map(|u| u.unit).collect();
            line(format!(
                "    {} ({}): units {units:?}",
                member.host, member.address
            ));
        }
    }
    let mut table = super::table(&["task", "in", "out", "busy", "idle", "back"], 1..6);
    // Below its task's row: its source's and operators' lag and counters.
    let mut details: Vec<Vec<String>> = Vec::new();
    for task in &job.tasks {
        let (busy, idle, back) = (task.busy_ms, task.idle_ms, task.backpressured_ms);
        let total = (busy + idle + back).max(1) as f64;
        let share = |ms: u64| format!("{:.0}%", 100.0 * ms as f64 / total);
        table.add_row(vec![
            match task.unit {
                Some(unit) => format!("unit {unit}: {}", task.task),
                None => task.task.clone(),
            },
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
            if let Some(call) = op.in_call.as_ref().filter(|c| c.running_ms >= LONG_CALL_MS) {
                below.push(format!(
                    "    {} has been in one `{}` call for {:.1} s",
                    op.operator,
                    call.call,
                    call.running_ms as f64 / 1000.0
                ));
            }
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
    let mut table = super::table(
        &["id", "name", "state", "read", "written", "committed"],
        3..6,
    );
    for job in &jobs.jobs {
        table.add_row(vec![
            job.job.id.clone(),
            job.job.name.clone(),
            state(&job.job),
            job.records_read.to_string(),
            job.records_written.to_string(),
            job.records_committed.map_or("-".into(), |n| n.to_string()),
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

/// Prometheus' text format as JSON: `{"families": [{"name", "type", "help", "samples":
/// [{"name", "labels", "value"}]}]}`, families in the order given. A value that is not a
/// finite number (`NaN`, `+Inf`) stays a string, as JSON has no such numbers.
pub(super) fn metrics_json(text: &str) -> Result<serde_json::Value> {
    use serde_json::{Map, Value, json};
    let mut families: Vec<Map<String, Value>> = Vec::new();
    let family_of = |families: &mut Vec<Map<String, Value>>, name: &str| -> usize {
        match families.iter().position(|f| f["name"] == name) {
            Some(i) => i,
            None => {
                let mut family = Map::new();
                family.insert("name".into(), json!(name));
                family.insert("type".into(), json!("untyped"));
                family.insert("help".into(), json!(""));
                family.insert("samples".into(), json!([]));
                families.push(family);
                families.len() - 1
            }
        }
    };
    for (n, line) in text.lines().enumerate().map(|(n, l)| (n + 1, l.trim())) {
        if line.is_empty() || line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut words = rest.splitn(3, ' ');
            if let (Some(kind @ ("HELP" | "TYPE")), Some(name)) = (words.next(), words.next()) {
                let i = family_of(&mut families, name);
                let field = if kind == "HELP" { "help" } else { "type" };
                families[i].insert(field.into(), json!(words.next().unwrap_or("")));
            }
            continue;
        }
        let (name, labels, value) =
            metric_line(line).with_context(|| format!("line {n}: {line:?}"))?;
        // A sample belongs to the family its name extends (`_total`, `_bucket`, …).
        let i = families
            .iter()
            .rposition(|f| {
                let family = f["name"].as_str().unwrap_or_default();
                name == family
                    || name
                        .strip_prefix(family)
                        .is_some_and(|suffix| suffix.starts_with('_'))
            })
            .unwrap_or_else(|| family_of(&mut families, &name));
        let value = match value.parse::<f64>() {
            Ok(v) if v.is_finite() => json!(v),
            _ => json!(value),
        };
        families[i]["samples"]
            .as_array_mut()
            .expect("an array")
            .push(json!({ "name": name, "labels": labels, "value": value }));
    }
    Ok(json!({ "families": families }))
}

/// One sample line: `name{label="value",…} value [timestamp]`.
fn metric_line(line: &str) -> Result<(String, serde_json::Map<String, serde_json::Value>, String)> {
    let end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .context("no value")?;
    let name = line[..end].to_string();
    let mut labels = serde_json::Map::new();
    let mut rest = &line[end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let closed = loop {
            // A label's name, `=`, and its quoted value with `\\`, `\"` and `\n` escapes.
            while chars
                .peek()
                .is_some_and(|(_, c)| *c == ',' || c.is_whitespace())
            {
                chars.next();
            }
            let Some(&(start, c)) = chars.peek() else {
                anyhow::bail!("labels not closed");
            };
            if c == '}' {
                break start + 1;
            }
            let eq = inner[start..].find('=').context("a label without `=`")? + start;
            let key = inner[start..eq].trim().to_string();
            while chars.next().is_some_and(|(i, _)| i < eq) {}
            if chars.next().map(|(_, c)| c) != Some('"') {
                anyhow::bail!("label {key:?}: its value is not quoted");
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => anyhow::bail!("label {key:?}: unfinished escape"),
                    },
                    Some((_, '"')) => break,
                    Some((_, c)) => value.push(c),
                    None => anyhow::bail!("label {key:?}: its value is not closed"),
                }
            }
            labels.insert(key, serde_json::Value::String(value));
        };
        rest = &inner[closed..];
    }
    let value = rest
        .split_whitespace()
        .next()
        .context("no value")?
        .to_string();
    Ok((name, labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lines(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn metrics_read_as_families_of_samples_with_their_labels() {
        let text = "# HELP sluice_jobs Jobs by state.\n# TYPE sluice_jobs gauge\n\
                    sluice_jobs{tenant=\"a\",state=\"finished\"} 1\n\
                    # TYPE sluice_records counter\n\
                    sluice_records_total{job=\"x \\\"q\\\" \\\\ \\n\",kind=\"in\"} 12.5\n\
                    sluice_records_created{job=\"x\"} 1.7e9\n\
                    lag NaN\n# EOF\n";
        let json = metrics_json(text).unwrap();
        assert_eq!(
            json,
            json!({"families": [
                {"name": "sluice_jobs", "type": "gauge", "help": "Jobs by state.", "samples": [
                    {"name": "sluice_jobs", "labels": {"tenant": "a", "state": "finished"}, "value": 1.0}
                ]},
                {"name": "sluice_records", "type": "counter", "help": "", "samples": [
                    {"name": "sluice_records_total", "labels": {"job": "x \"q\" \\ \n", "kind": "in"}, "value": 12.5},
                    {"name": "sluice_records_created", "labels": {"job": "x"}, "value": 1.7e9}
                ]},
                {"name": "lag", "type": "untyped", "help": "", "samples": [
                    {"name": "lag", "labels": {}, "value": "NaN"}
                ]}
            ]})
        );
        let e = format!("{:#}", metrics_json("x{a=b} 1\n").unwrap_err());
        assert!(e.contains("line 1") && e.contains("not quoted"), "{e}");
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
            "records_committed": 3,
            "failures_by_kind": {}, "last_failure": null, "savepoint": null,
            "checkpoints": {"completed": 3, "aborted": 0, "last_aborted": [],
                "in_progress": [{"id": 4, "kind": "checkpoint", "triggered_ms": 0,
                    "acknowledged": 2, "tasks": 5, "bytes": 3072}],
                "last": [{"status": "completed", "id": 3, "kind": "checkpoint", "name": null,
                    "triggered_ms": 0, "triggered": "1970-01-01T00:00:00.000Z",
                    "duration_ms": 12.4, "max_sync_ms": 1.0, "max_async_ms": 9.0,
                    "bytes": 2048, "full_bytes": 8192, "files": 3}]},
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
            text.contains("records read 10, written 4, committed 3; restarts 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "last #3 (checkpoint) took 12 ms (sync 1.0 ms, async 9 ms), 2.0 KiB of 8.0 KiB \
                 in 3 files"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "in progress: #4 (checkpoint) acknowledged by 2 of 5 tasks, 3.0 KiB written so far"
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

    #[test]
    fn a_job_over_several_servers_shows_its_hosts_and_each_tasks_unit() {
        let job: JobDetail = serde_json::from_value(serde_json::json!({
            "id": "ab12", "name": "wc", "state": "running", "running": true,
            "submitted_ms": 0, "submitted": "1970-01-01T00:00:00.000Z", "tenant": "t",
            "plugins": {}, "records_read": 10, "records_written": 4, "restarts": 0,
            "failures_by_kind": {}, "last_failure": null, "savepoint": null,
            "checkpoints": {"completed": 0, "aborted": 0, "last": [], "last_aborted": []},
            "tasks": [{"task": "source -> count (1/1)", "records_in": 10, "records_out": 4,
                "busy_ms": 1, "idle_ms": 1, "backpressured_ms": 0, "mailbox_depth": 0,
                "watermark": null, "source": null, "operators": [],
                "unit": 3, "host": "sluice-a-1"}],
            "graph": [], "output": [],
            "cluster": {"host": "sluice-a-1", "units": 8, "owned": [3, 5], "running": [3],
                "finished": [0], "failures": 0, "last_failure": null,
                "group": [
                    {"host": "sluice-a-1", "address": "/10.0.0.1",
                        "units": [{"unit": 3, "runs": "stage 1"}, {"unit": 5, "runs": "stage 1"}]},
                    {"host": "sluice-b-7", "address": "/10.0.0.2",
                        "units": [{"unit": 1, "runs": "stage 0"}]}]},
        }))
        .unwrap();
        let text = job_detail(&job);
        for expected in [
            "over several servers: this one is sluice-a-1, running units [3] of 8 (1 finished)",
            "    sluice-a-1 (/10.0.0.1): units [3, 5]",
            "    sluice-b-7 (/10.0.0.2): units [1]",
            "unit 3: source -> count (1/1)",
        ] {
            assert!(text.contains(expected), "{expected} not in:\n{text}");
        }
    }
}
