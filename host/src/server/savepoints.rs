//! Savepoints triggered without waiting (`POST /v1/jobs/{id}/savepoints`), as Flink's
//! REST API has them: the request is answered at once with a request id, which the
//! client then asks about until the savepoint completed or failed.
//!
//! No thread waits for them. Each request keeps the channel the job answers it on, and
//! whoever asks about the job's requests looks there first ([`Triggers::refresh`]). What
//! a job keeps is bounded: at most [`MAX_IN_PROGRESS`] requests in progress (more are
//! refused), and of the ended ones the last [`KEEP_ENDED`], each for [`KEEP_ENDED_FOR`]
//! after it ended; a request still in progress after [`TIMEOUT`] fails.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError, unbounded};

use super::model::{SavepointStatus, SavepointTriggered, TriggerStatus, rfc3339};
use super::plugins::now_ms;
use super::{ApiError, ErrorKind, Server, hex};
use crate::job::JobControl;
use crate::tenant::TenantConfig;

/// Savepoints a job may have in progress at once.
pub(super) const MAX_IN_PROGRESS: usize = 4;

/// Ended requests a job keeps the answers of.
pub(super) const KEEP_ENDED: usize = 16;

/// How long the answer of an ended request is kept.
pub(super) const KEEP_ENDED_FOR: Duration = Duration::from_secs(10 * 60);

/// How long a savepoint may take before its request fails.
pub(super) const TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// What the job answers a savepoint request with: the savepoint's folder, or why it
/// failed.
type Answer = Result<PathBuf, String>;

/// The savepoints triggered of one job, oldest first.
pub(super) struct Triggers {
    /// The job's id, for messages.
    job: String,
    requests: Vec<Request>,
}

struct Request {
    id: String,
    triggered_ms: u64,
    triggered_at: Instant,
    state: State,
}

enum State {
    /// Waiting for the job's answer.
    InProgress(Receiver<Answer>),
    /// Answered (or given up on) at `at`: the savepoint's name, or why it failed.
    Ended {
        at: Instant,
        outcome: Result<String, String>,
    },
}

impl Triggers {
    pub(super) fn new(job: &str) -> Triggers {
        Triggers {
            job: job.to_string(),
            requests: Vec::new(),
        }
    }

    /// Learns which savepoints ended by `now`, and forgets the ended requests past
    /// [`KEEP_ENDED_FOR`] and [`KEEP_ENDED`].
    pub(super) fn refresh(&mut self, now: Instant) {
        for request in &mut self.requests {
            let State::InProgress(answer) = &request.state else {
                continue;
            };
            let outcome = match answer.try_recv() {
                Ok(Ok(path)) => Ok(path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()),
                Ok(Err(e)) => Err(format!("the savepoint of job '{}' failed: {e}", self.job)),
                Err(TryRecvError::Disconnected) => Err(format!(
                    "job '{}' ended before its savepoint completed",
                    self.job
                )),
                Err(TryRecvError::Empty) if now >= request.triggered_at + TIMEOUT => Err(format!(
                    "the savepoint of job '{}' did not complete within {} s",
                    self.job,
                    TIMEOUT.as_secs()
                )),
                Err(TryRecvError::Empty) => continue,
            };
            request.state = State::Ended { at: now, outcome };
        }
        self.requests.retain(|r| match r.state {
            State::Ended { at, .. } => now < at + KEEP_ENDED_FOR,
            State::InProgress(_) => true,
        });
        let ended = self
            .requests
            .iter()
            .filter(|r| matches!(r.state, State::Ended { .. }))
            .count();
        let mut surplus = ended.saturating_sub(KEEP_ENDED);
        // Oldest first: the first ended ones go.
        self.requests.retain(|r| {
            let drop = surplus > 0 && matches!(r.state, State::Ended { .. });
            surplus -= usize::from(drop);
            !drop
        });
    }

    /// Requests still in progress (as of the last [`Triggers::refresh`]).
    pub(super) fn in_progress(&self) -> usize {
        self.requests
            .iter()
            .filter(|r| matches!(r.state, State::InProgress(_)))
            .count()
    }

    /// Adds a request the job answers on `answer`.
    pub(super) fn add(&mut self, id: String, now: Instant, answer: Receiver<Answer>) {
        self.requests.push(Request {
            id,
            triggered_ms: now_ms(),
            triggered_at: now,
            state: State::InProgress(answer),
        });
    }

    /// Where request `id` is, if it is known.
    pub(super) fn status(&mut self, id: &str, now: Instant) -> Option<SavepointStatus> {
        self.refresh(now);
        let request = self.requests.iter().find(|r| r.id == id)?;
        let (status, location, error) = match &request.state {
            State::InProgress(_) => (TriggerStatus::InProgress, None, None),
            State::Ended {
                outcome: Ok(name), ..
            } => (TriggerStatus::Completed, Some(name.clone()), None),
            State::Ended {
                outcome: Err(e), ..
            } => (TriggerStatus::Failed, None, Some(e.clone())),
        };
        Some(SavepointStatus {
            status,
            location,
            error,
            triggered_ms: request.triggered_ms,
            triggered: rfc3339(request.triggered_ms as i64),
        })
    }
}

impl Server {
    /// Triggers a savepoint of one of `tenant`'s running jobs, without stopping it or
    /// waiting for it; [`Server::savepoint_status`] tells how it went.
    pub fn trigger_savepoint(
        &self,
        tenant: &TenantConfig,
        id: &str,
    ) -> Result<SavepointTriggered, ApiError> {
        let entry = self.entry(tenant, id)?;
        Self::no_savepoints(&entry, "take a savepoint of")?;
        let control = self.control(&entry, "take a savepoint of")?;
        let mut triggers = entry.savepoints.lock();
        let now = Instant::now();
        triggers.refresh(now);
        if triggers.in_progress() >= MAX_IN_PROGRESS {
            return Err(ApiError::new(
                ErrorKind::Quota,
                format!(
                    "job '{id}' has {MAX_IN_PROGRESS} savepoints in progress, as many as a job \
                     may have at once: wait until one of them completes or fails"
                ),
            ));
        }
        static REQUESTS: AtomicU64 = AtomicU64::new(0);
        let seq = REQUESTS.fetch_add(1, Ordering::Relaxed);
        let seed = format!("{id}/{seq}/{}/{}", now_ms(), std::process::id());
        let request_id = hex(&super::token_sha256(&seed)[..8]);
        let (reply, answer) = unbounded();
        // A job that ended meanwhile drops `reply`: the request then fails as "ended".
        let _ = control.send(JobControl::Savepoint { reply });
        triggers.add(request_id.clone(), now, answer);
        Ok(SavepointTriggered { request_id })
    }

    /// Where savepoint request `request` of one of `tenant`'s jobs is.
    pub fn savepoint_status(
        &self,
        tenant: &TenantConfig,
        id: &str,
        request: &str,
    ) -> Result<SavepointStatus, ApiError> {
        let entry = self.entry(tenant, id)?;
        let status = entry.savepoints.lock().status(request, Instant::now());
        status.ok_or_else(|| {
            ApiError::new(
                ErrorKind::NotFound,
                format!(
                    "job '{id}' has no savepoint request '{request}' (requests are kept for {} \
                     minutes after they end, the last {KEEP_ENDED} of a job)",
                    KEEP_ENDED_FOR.as_secs() / 60
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request the test answers through the returned sender.
    fn request(
        triggers: &mut Triggers,
        id: &str,
        now: Instant,
    ) -> crossbeam_channel::Sender<Answer> {
        let (reply, answer) = unbounded();
        triggers.add(id.to_string(), now, answer);
        reply
    }

    fn status(triggers: &mut Triggers, id: &str, now: Instant) -> Option<TriggerStatus> {
        triggers.status(id, now).map(|s| s.status)
    }

    #[test]
    fn a_request_goes_from_in_progress_to_completed_with_its_location() {
        let now = Instant::now();
        let mut triggers = Triggers::new("j");
        let reply = request(&mut triggers, "r", now);
        assert_eq!(
            status(&mut triggers, "r", now),
            Some(TriggerStatus::InProgress)
        );
        assert_eq!(triggers.in_progress(), 1);
        reply
            .send(Ok(PathBuf::from("/x/checkpoints/savepoint-3")))
            .unwrap();
        let done = triggers.status("r", now).unwrap();
        assert_eq!(done.status, TriggerStatus::Completed);
        assert_eq!(done.location.as_deref(), Some("savepoint-3"));
        assert_eq!(done.error, None);
        assert_eq!(triggers.in_progress(), 0);
        assert_eq!(status(&mut triggers, "other", now), None);
    }

    #[test]
    fn a_request_fails_with_the_jobs_error_its_end_or_the_timeout() {
        let now = Instant::now();
        let mut triggers = Triggers::new("j");
        request(&mut triggers, "refused", now)
            .send(Err("a savepoint needs a [checkpoint] table".into()))
            .unwrap();
        drop(request(&mut triggers, "ended", now));
        let _waiting = request(&mut triggers, "slow", now);
        let error = |t: &mut Triggers, id: &str, at: Instant| {
            let s = t.status(id, at).unwrap();
            assert_eq!(s.status, TriggerStatus::Failed, "{id}");
            s.error.unwrap()
        };
        assert_eq!(
            error(&mut triggers, "refused", now),
            "the savepoint of job 'j' failed: a savepoint needs a [checkpoint] table"
        );
        assert_eq!(
            error(&mut triggers, "ended", now),
            "job 'j' ended before its savepoint completed"
        );
        assert_eq!(
            status(&mut triggers, "slow", now),
            Some(TriggerStatus::InProgress)
        );
        let late = now + TIMEOUT;
        assert!(error(&mut triggers, "slow", late).contains("did not complete within 300 s"));
    }

    #[test]
    fn ended_requests_are_kept_for_a_while_and_only_the_last_ones() {
        let now = Instant::now();
        let mut triggers = Triggers::new("j");
        for i in 0..KEEP_ENDED + 3 {
            request(&mut triggers, &format!("r{i}"), now)
                .send(Ok(PathBuf::from("savepoint-1")))
                .unwrap();
        }
        let _waiting = request(&mut triggers, "waiting", now);
        triggers.refresh(now);
        // The oldest ended ones went; the one in progress stays.
        for i in 0..3 {
            assert_eq!(status(&mut triggers, &format!("r{i}"), now), None);
        }
        for i in 3..KEEP_ENDED + 3 {
            assert_eq!(
                status(&mut triggers, &format!("r{i}"), now),
                Some(TriggerStatus::Completed)
            );
        }
        assert_eq!(triggers.requests.len(), KEEP_ENDED + 1);
        // Past KEEP_ENDED_FOR, the ended ones go too.
        let later = now + KEEP_ENDED_FOR;
        assert_eq!(status(&mut triggers, "r5", later), None);
        assert_eq!(
            status(&mut triggers, "waiting", later),
            Some(TriggerStatus::Failed)
        );
    }
}
