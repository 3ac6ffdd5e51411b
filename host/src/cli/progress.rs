//! The progress display of `sluice run`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::job::{JobGraph, JobMonitor, SourceInput, Vertex};

/// How far a job's input goes, when that is known before it runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum InputSize {
    /// Records of generator sources.
    Records(u64),
    /// Bytes of file sources.
    Bytes(u64),
}

impl InputSize {
    /// The input of `graph`'s sources, when all of them are generators or all files.
    pub(super) fn of(graph: &JobGraph) -> Option<InputSize> {
        let sources: Vec<&SourceInput> = graph
            .vertices
            .iter()
            .filter_map(|v| match v {
                Vertex::Source(s) => Some(&s.input),
                _ => None,
            })
            .collect();
        let records = sources.iter().map(|s| match s {
            SourceInput::Generator { records, .. } => Some(*records),
            _ => None,
        });
        if let Some(n) = records.sum::<Option<u64>>() {
            return Some(InputSize::Records(n));
        }
        let bytes = sources.iter().map(|s| match s {
            SourceInput::File { path, .. } => std::fs::metadata(path).ok().map(|m| m.len()),
            _ => None,
        });
        bytes.sum::<Option<u64>>().map(InputSize::Bytes)
    }
}

/// A job as the progress display follows it.
pub(super) struct Followed {
    pub(super) name: String,
    pub(super) monitor: Arc<JobMonitor>,
    pub(super) size: Option<InputSize>,
}

/// Progress on stderr (a terminal), one line per job: a bar with percentage and ETA when
/// its input's size is known, else a spinner; with rates, watermark, backpressure and
/// checkpoints.
pub(super) fn show_progress(jobs: &[Followed], done: &AtomicBool) {
    use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
    let multi = MultiProgress::new();
    let bar_style =
        ProgressStyle::with_template("{prefix} [{bar:24}] {percent:>3}% eta {eta:<4} {msg}")
            .expect("a valid template")
            .progress_chars("=> ");
    let spinner_style =
        ProgressStyle::with_template("{prefix} {spinner} {msg}").expect("a valid template");
    let bars: Vec<ProgressBar> = jobs
        .iter()
        .map(|job| {
            let bar = match job.size {
                Some(InputSize::Records(n) | InputSize::Bytes(n)) => {
                    ProgressBar::new(n).with_style(bar_style.clone())
                }
                None => ProgressBar::new_spinner().with_style(spinner_style.clone()),
            };
            bar.set_prefix(job.name.clone());
            multi.add(bar)
        })
        .collect();
    let mut last: Vec<(u64, Instant)> = jobs.iter().map(|_| (0, Instant::now())).collect();
    while !done.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(250));
        for ((job, bar), last) in jobs.iter().zip(&bars).zip(&mut last) {
            let (read, written) = job.monitor.records_read_written();
            let dt = last.1.elapsed().as_secs_f64().max(1e-3);
            let rate = read.saturating_sub(last.0) as f64 / dt;
            *last = (read, Instant::now());
            let tasks = job.monitor.tasks();
            let position = match job.size {
                Some(InputSize::Bytes(_)) => tasks
                    .iter()
                    .filter_map(|t| t.source.as_ref())
                    .filter_map(|s| s.counters.get("bytes-read"))
                    .sum(),
                _ => read,
            };
            bar.set_position(position);
            let mut msg = format!("read {read} ({}/s) written {written}", human(rate));
            match tasks.iter().map(|t| t.watermark).min().flatten() {
                Some(i64::MAX) => msg.push_str(" watermark: end of input"),
                Some(w) => msg.push_str(&format!(" watermark {w}")),
                None => {}
            }
            let (back, total) = tasks.iter().fold((0.0, 0.0), |(b, t), task| {
                let busy = task.busy + task.idle + task.backpressured;
                (b + task.backpressured.as_secs_f64(), t + busy.as_secs_f64())
            });
            if total > 0.0 {
                msg.push_str(&format!(" backpressured {:.0}%", 100.0 * back / total));
            }
            msg.push_str(&format!(
                " checkpoints {}",
                job.monitor.checkpoints().completed.len()
            ));
            let attempt = job.monitor.attempt();
            if attempt > 0 {
                msg.push_str(&format!(" restarts {attempt}"));
            }
            // The longest call in progress, once long enough to stand out.
            let longest = tasks
                .iter()
                .flat_map(|t| &t.operators)
                .filter_map(|o| o.in_call.as_ref().map(|c| (o, c)))
                .max_by_key(|(_, c)| c.running);
            if let Some((op, call)) =
                longest.filter(|(_, c)| c.running.as_millis() as u64 >= super::remote::LONG_CALL_MS)
            {
                msg.push_str(&format!(
                    " · {} ({}) in one `{}` for {:.0} s",
                    op.operator,
                    op.subtask + 1,
                    call.call,
                    call.running.as_secs_f64()
                ));
            }
            bar.set_message(msg);
            bar.tick();
        }
    }
    for bar in &bars {
        bar.finish_and_clear();
    }
}

fn human(n: f64) -> String {
    match n {
        n if n >= 1e6 => format!("{:.2}M", n / 1e6),
        n if n >= 1e3 => format!("{:.1}k", n / 1e3),
        n => format!("{n:.0}"),
    }
}
