//! Each server job's recent log lines, for `GET /v1/jobs/ID/logs`: a `tracing` layer that
//! keeps what is logged inside a job's span (its tasks' and operators' lines, guest output
//! included) in a bounded buffer per job.
//!
//! A job's buffer is bounded in lines and in bytes, and each line in bytes: a guest may
//! log long lines, and the server keeps the buffers of every job it has in memory.

use std::collections::{HashMap, VecDeque};
use std::fmt::{self, Write as _};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Lines kept per job; older ones are dropped (and counted).
pub const LINES_PER_JOB: usize = 1000;

/// Bytes kept of one line; the rest is cut (and the cut said). 4 KiB holds any line the
/// host writes and the start of a guest's, which is what a person reads.
pub const BYTES_PER_LINE: usize = 4 << 10;

/// Bytes of lines kept per job; older lines are dropped (and counted) to stay below. A
/// megabyte is the 1,000 lines at ~1 KiB each: a few hundred jobs fit in memory.
pub const BYTES_PER_JOB: usize = 1 << 20;

/// The line that says how many older lines were dropped.
const DROPPED: (&str, &str) = ("(", " older lines dropped)");

/// The name of the span a server runs each job in; its `job` field is the job id.
pub const JOB_SPAN: &str = "job";

/// Recent log lines by job id.
#[derive(Debug, Default)]
pub struct JobLogs {
    jobs: Mutex<HashMap<String, JobLog>>,
    /// Where a worker process sends its jobs' lines instead of keeping them.
    forward: OnceLock<crossbeam_channel::Sender<(String, String)>>,
}

#[derive(Debug, Default)]
struct JobLog {
    lines: VecDeque<String>,
    bytes: usize,
    dropped: u64,
}

impl JobLog {
    fn push(&mut self, mut line: String) {
        if line.len() > BYTES_PER_LINE {
            let cut = line.len() - BYTES_PER_LINE;
            line.truncate(line.floor_char_boundary(BYTES_PER_LINE));
            let _ = write!(line, "… ({cut} more bytes cut)");
        }
        while !self.lines.is_empty()
            && (self.lines.len() >= LINES_PER_JOB || self.bytes + line.len() > BYTES_PER_JOB)
        {
            let old = self.lines.pop_front().expect("not empty");
            self.bytes -= old.len();
            self.dropped += 1;
        }
        self.bytes += line.len();
        self.lines.push_back(line);
    }

    fn text(&self) -> String {
        let mut text = String::with_capacity(self.bytes + self.lines.len() + 32);
        if self.dropped > 0 {
            let _ = writeln!(text, "{}{}{}", DROPPED.0, self.dropped, DROPPED.1);
        }
        for line in &self.lines {
            text.push_str(line);
            text.push('\n');
        }
        text
    }
}

impl JobLogs {
    /// The logs of this process (what the layer of [`layer`] writes to).
    pub fn global() -> &'static Arc<JobLogs> {
        static LOGS: OnceLock<Arc<JobLogs>> = OnceLock::new();
        LOGS.get_or_init(Arc::default)
    }

    fn jobs(&self) -> parking_lot::MutexGuard<'_, HashMap<String, JobLog>> {
        self.jobs.lock()
    }

    /// Keeps a line of `job` (or forwards it, in a worker process).
    pub fn push(&self, job: &str, line: String) {
        if let Some(forward) = self.forward.get() {
            let _ = forward.send((job.to_string(), line));
            return;
        }
        self.jobs().entry(job.to_string()).or_default().push(line);
    }

    /// Sends every line from now on to `forward` instead of keeping it (a worker process
    /// forwards its jobs' lines to the server, which keeps them).
    pub fn forward_to(&self, forward: crossbeam_channel::Sender<(String, String)>) {
        let _ = self.forward.set(forward);
    }

    /// The job's kept lines as text, one per line, after a line saying how many older
    /// ones were dropped (if any); `None` when none are kept in memory.
    pub fn text(&self, job: &str) -> Option<String> {
        self.jobs().get(job).map(JobLog::text)
    }

    /// Removes the job's lines from memory, returning them as [`JobLogs::text`] does.
    pub fn take(&self, job: &str) -> Option<String> {
        self.jobs().remove(job).map(|log| log.text())
    }

    /// Puts lines that [`JobLogs::take`] returned back in memory, before the job's own
    /// lines if it has any (unless it has some already, since they were never taken).
    pub fn restore(&self, job: &str, text: &str) {
        let mut jobs = self.jobs();
        if jobs.contains_key(job) {
            return;
        }
        let mut log = JobLog::default();
        for line in text.lines() {
            let dropped = line
                .strip_prefix(DROPPED.0)
                .and_then(|l| l.strip_suffix(DROPPED.1))
                .and_then(|n| n.parse::<u64>().ok());
            match dropped {
                Some(n) if log.lines.is_empty() => log.dropped += n,
                _ => log.push(line.to_string()),
            }
        }
        jobs.insert(job.to_string(), log);
    }
}

/// A layer that copies every event inside a job span into [`JobLogs::global`].
pub fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    JobLogLayer {
        logs: JobLogs::global().clone(),
    }
}

struct JobLogLayer {
    logs: Arc<JobLogs>,
}

/// The job id a span carries, kept in its extensions.
struct JobId(String);

impl<S> Layer<S> for JobLogLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != JOB_SPAN {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let job = fields
            .pairs
            .iter()
            .find(|(name, _)| *name == "job")
            .map(|(_, value)| value.clone());
        if let (Some(job), Some(span)) = (job, ctx.span(id)) {
            span.extensions_mut().insert(JobId(job));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        let Some(job) = scope
            .into_iter()
            .find_map(|span| span.extensions().get::<JobId>().map(|j| j.0.clone()))
        else {
            return;
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let mut line = format!("{millis} {} {}", event.metadata().level(), fields.message);
        for (name, value) in &fields.pairs {
            let _ = write!(line, " {name}={value}");
        }
        self.logs.push(&job, line);
    }
}

/// An event's or span's message and other fields, as text.
#[derive(Default)]
struct Fields {
    message: String,
    pairs: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.pairs.push((field.name(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.pairs.push((field.name(), format!("{value:?}")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_and_the_buffer_stays_within_its_lines_and_bytes() {
        let logs = JobLogs::default();
        logs.push("j", "x".repeat(100_000));
        let text = logs.text("j").unwrap();
        assert!(text.len() < BYTES_PER_LINE + 100, "{}", text.len());
        assert!(text.contains("(95904 more bytes cut)"), "{text}");
        // Long lines: the byte bound drops old ones long before the line bound.
        for i in 0..1000 {
            logs.push("j", format!("{i} {}", "y".repeat(BYTES_PER_LINE)));
        }
        let jobs = logs.jobs();
        let log = &jobs["j"];
        assert!(
            log.bytes <= BYTES_PER_JOB && log.lines.len() < 300,
            "{}",
            log.bytes
        );
        assert_eq!(log.dropped as usize + log.lines.len(), 1001);
        assert_eq!(log.bytes, log.lines.iter().map(String::len).sum::<usize>());
        drop(jobs);
        // Short lines: the line bound.
        for i in 0..2000 {
            logs.push("k", format!("line {i}"));
        }
        let text = logs.text("k").unwrap();
        assert!(
            text.starts_with("(1000 older lines dropped)\nline 1000\n"),
            "{text}"
        );
    }

    #[test]
    fn taken_lines_come_back_with_their_dropped_count() {
        let logs = JobLogs::default();
        for i in 0..1005 {
            logs.push("j", format!("line {i}"));
        }
        let text = logs.take("j").unwrap();
        assert!(logs.text("j").is_none());
        logs.restore("j", &text);
        logs.push("j", "again".into());
        let back = logs.text("j").unwrap();
        assert!(
            back.starts_with("(6 older lines dropped)\nline 6\n"),
            "{back}"
        );
        assert!(back.ends_with("line 1004\nagain\n"), "{back}");
    }
}
