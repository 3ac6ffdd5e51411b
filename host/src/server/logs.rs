//! Each server job's recent log lines, for `GET /jobs/ID/logs`: a `tracing` layer that
//! keeps what is logged inside a job's span (its tasks' and operators' lines, guest output
//! included) in a bounded buffer per job.

use std::collections::{HashMap, VecDeque};
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Lines kept per job; older ones are dropped (and counted).
pub const LINES_PER_JOB: usize = 1000;

/// The name of the span a server runs each job in; its `job` field is the job id.
pub const JOB_SPAN: &str = "job";

/// Recent log lines by job id.
#[derive(Debug, Default)]
pub struct JobLogs {
    jobs: Mutex<HashMap<String, JobLog>>,
}

#[derive(Debug, Default)]
struct JobLog {
    lines: VecDeque<String>,
    dropped: u64,
}

impl JobLogs {
    /// The logs of this process (what the layer of [`layer`] writes to).
    pub fn global() -> &'static Arc<JobLogs> {
        static LOGS: OnceLock<Arc<JobLogs>> = OnceLock::new();
        LOGS.get_or_init(Arc::default)
    }

    fn push(&self, job: &str, line: String) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let log = jobs.entry(job.to_string()).or_default();
        if log.lines.len() == LINES_PER_JOB {
            log.lines.pop_front();
            log.dropped += 1;
        }
        log.lines.push_back(line);
    }

    /// The job's kept lines, oldest first, and how many older ones were dropped.
    pub fn lines(&self, job: &str) -> (Vec<String>, u64) {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.get(job)
            .map(|log| (log.lines.iter().cloned().collect(), log.dropped))
            .unwrap_or_default()
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
