//! The task mailbox: everything a task does besides processing input runs as a *mail* on
//! the task's own thread.
//!
//! A task thread owns its operators (their Wasm stores, keyed state and outputs). Other
//! threads — the processing-time timer service, the checkpoint coordinator, the async
//! snapshot workers, a user cancelling the job — never touch those directly: they put a
//! [`Mail`] into the task's [`TaskMailbox`], and the task thread runs it between two input
//! batches. That is what replaces Flink's checkpoint lock: there is nothing to lock,
//! because only one thread ever runs operator code.
//!
//! # What a mail may do
//!
//! A mail runs with `&mut` access to the task and may call its operators, emit records,
//! trigger a checkpoint or fail the task by returning an error. It must not block for
//! long (it holds up input processing and every other mail) and must not wait for
//! another mail of the same task, which could never run.
//!
//! # Priorities
//!
//! Mails are taken highest [`Priority`] first and in submission order within a
//! priority. [`MailboxExecutor::yield_mail`] runs only mails at or above the executor's
//! priority, which lets a task wait for, say, a checkpoint notification without
//! processing unrelated lower-priority mails.

mod processor;

pub use processor::{ActionResult, MailboxProcessor};

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{Result, bail};
use crossbeam_channel::{Receiver, Sender, bounded};
use parking_lot::{Mutex, MutexGuard};

/// An action to run on the task thread, with exclusive access to the task `T`.
pub type Mail<T> = Box<dyn FnOnce(&mut T) -> Result<()> + Send>;

/// Priority of a mail; higher runs first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(pub u8);

impl Priority {
    /// Ordinary work: the lowest priority, at which everything runs.
    pub const DEFAULT: Priority = Priority(0);
    /// Checkpoint triggers, acknowledgements and other control mails.
    pub const CONTROL: Priority = Priority(1);
    /// Timer firings and checkpoint notifications: the highest priority.
    pub const MAX: Priority = Priority(u8::MAX);
}

/// A mail with its metadata.
pub struct Letter<T> {
    /// Priority it was submitted with.
    pub priority: Priority,
    /// What it does, for logs and errors.
    pub description: Cow<'static, str>,
    action: Mail<T>,
}

impl<T> Letter<T> {
    /// Runs the mail against the task.
    pub fn run(self, target: &mut T) -> Result<()> {
        (self.action)(target)
    }
}

impl<T> std::fmt::Debug for Letter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Letter")
            .field("priority", &self.priority)
            .field("description", &self.description)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Accepts mails.
    Open,
    /// Rejects new mails; the ones queued can still be taken (drained).
    Quiesced,
    /// Rejects new mails; the queue was emptied.
    Closed,
}

/// FIFO queues per priority, highest priority first.
struct Queue<T> {
    by_priority: Vec<(Priority, VecDeque<Letter<T>>)>,
    len: usize,
    state: State,
}

impl<T> Queue<T> {
    /// Queues a letter; returns true when it is the only one of its priority.
    fn push(&mut self, letter: Letter<T>) -> bool {
        let i = match self
            .by_priority
            .binary_search_by(|(p, _)| letter.priority.cmp(p))
        {
            Ok(i) => i,
            Err(i) => {
                self.by_priority
                    .insert(i, (letter.priority, VecDeque::new()));
                i
            }
        };
        self.by_priority[i].1.push_back(letter);
        self.len += 1;
        self.by_priority[i].1.len() == 1
    }

    fn pop(&mut self, min: Priority) -> Option<Letter<T>> {
        let queue = self
            .by_priority
            .iter_mut()
            .take_while(|(p, _)| *p >= min)
            .find(|(_, q)| !q.is_empty())?;
        self.len -= 1;
        queue.1.pop_front()
    }

    fn drain(&mut self) -> Vec<Letter<T>> {
        self.len = 0;
        self.by_priority
            .iter_mut()
            .flat_map(|(_, q)| q.drain(..))
            .collect()
    }
}

struct Inner<T> {
    name: String,
    queue: Mutex<Queue<T>>,
    /// Mails taken so far.
    taken: AtomicU64,
    /// Holds at most one token: "the queue or a control flag may have changed".
    doorbell_tx: Sender<()>,
    doorbell_rx: Receiver<()>,
    /// Set from any thread to make the mailbox loop end (end of input, cancel).
    all_actions_completed: AtomicBool,
}

/// The mailbox of one task. Cloning gives another handle to the same mailbox.
pub struct TaskMailbox<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for TaskMailbox<T> {
    fn clone(&self) -> Self {
        TaskMailbox {
            inner: self.inner.clone(),
        }
    }
}

impl<T> std::fmt::Debug for TaskMailbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskMailbox")
            .field("name", &self.inner.name)
            .field("len", &self.len())
            .finish()
    }
}

impl<T> TaskMailbox<T> {
    /// An open, empty mailbox; `name` identifies the task in errors.
    pub fn new(name: impl Into<String>) -> Self {
        let (doorbell_tx, doorbell_rx) = bounded(1);
        TaskMailbox {
            inner: Arc::new(Inner {
                name: name.into(),
                queue: Mutex::new(Queue {
                    by_priority: Vec::new(),
                    len: 0,
                    state: State::Open,
                }),
                taken: AtomicU64::new(0),
                doorbell_tx,
                doorbell_rx,
                all_actions_completed: AtomicBool::new(false),
            }),
        }
    }

    /// Submits a mail. Fails once the mailbox was quiesced or closed: the task is
    /// shutting down and will not run it.
    pub fn put(
        &self,
        priority: Priority,
        description: impl Into<Cow<'static, str>>,
        mail: Mail<T>,
    ) -> Result<()> {
        let description = description.into();
        let first_of_its_priority = {
            let mut q = self.lock();
            if q.state != State::Open {
                bail!(
                    "mailbox of task {} is closed; rejected mail '{description}'",
                    self.inner.name
                );
            }
            q.push(Letter {
                priority,
                description,
                action: mail,
            })
        };
        // Whoever waits for mails of some minimum priority either finds an earlier mail
        // of this priority (and does not sleep) or is woken by the first one.
        if first_of_its_priority {
            self.ring();
        }
        Ok(())
    }

    /// Takes the first mail with at least `min` priority, without blocking.
    pub fn try_take(&self, min: Priority) -> Option<Letter<T>> {
        let letter = self.lock().pop(min);
        if letter.is_some() {
            self.inner.taken.fetch_add(1, Ordering::Relaxed);
        }
        letter
    }

    /// Takes every queued mail, highest priority first, under one lock.
    pub fn take_all(&self) -> Vec<Letter<T>> {
        let letters = self.lock().drain();
        self.inner
            .taken
            .fetch_add(letters.len() as u64, Ordering::Relaxed);
        letters
    }

    /// How many mails were taken (to be run) so far.
    pub fn taken(&self) -> u64 {
        self.inner.taken.load(Ordering::Relaxed)
    }

    /// Takes the first mail with at least `min` priority, blocking until there is one.
    /// Fails when the mailbox is closed or all actions were completed meanwhile.
    pub fn take(&self, min: Priority) -> Result<Letter<T>> {
        loop {
            // Consume the token before looking, so a put that lands after the look rings
            // again and wakes the wait below.
            let _ = self.inner.doorbell_rx.try_recv();
            if let Some(letter) = self.try_take(min) {
                return Ok(letter);
            }
            if self.lock().state == State::Closed {
                bail!("mailbox of task {} is closed", self.inner.name);
            }
            if self.is_all_actions_completed() {
                bail!("task {} is no longer running", self.inner.name);
            }
            let _ = self.inner.doorbell_rx.recv();
        }
    }

    /// Number of queued mails.
    pub fn len(&self) -> usize {
        self.lock().len
    }

    /// True when no mail is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rejects new mails from now on; queued ones can still be taken.
    pub fn quiesce(&self) {
        let mut q = self.lock();
        if q.state == State::Open {
            q.state = State::Quiesced;
        }
    }

    /// Rejects new mails and returns the ones still queued (which will never run).
    pub fn close(&self) -> Vec<Letter<T>> {
        let dropped = {
            let mut q = self.lock();
            q.state = State::Closed;
            q.drain()
        };
        self.ring();
        dropped
    }

    /// Asks the mailbox loop to end after the mail it is running, from any thread.
    pub fn all_actions_completed(&self) {
        self.inner
            .all_actions_completed
            .store(true, Ordering::SeqCst);
        self.ring();
    }

    /// True once [`TaskMailbox::all_actions_completed`] was called.
    pub fn is_all_actions_completed(&self) -> bool {
        self.inner.all_actions_completed.load(Ordering::SeqCst)
    }

    /// A receiver that becomes ready whenever a mail is put or the loop should end; the
    /// task waits on it together with its inputs while its default action is suspended.
    pub fn doorbell(&self) -> &Receiver<()> {
        &self.inner.doorbell_rx
    }

    /// An executor that submits mails at `priority` and yields to mails at or above it.
    pub fn executor(&self, priority: Priority) -> MailboxExecutor<T> {
        MailboxExecutor {
            mailbox: self.clone(),
            priority,
        }
    }

    fn ring(&self) {
        let _ = self.inner.doorbell_tx.try_send(());
    }

    fn lock(&self) -> MutexGuard<'_, Queue<T>> {
        // A panic while holding this lock can only come from VecDeque itself; the
        // queue stays structurally valid, so keep using it.
        self.inner.queue.lock()
    }
}

/// Submits mails at one priority, and lets code running on the task thread yield to
/// pending mails (for example while waiting for a condition another mail establishes).
pub struct MailboxExecutor<T> {
    mailbox: TaskMailbox<T>,
    priority: Priority,
}

impl<T> Clone for MailboxExecutor<T> {
    fn clone(&self) -> Self {
        MailboxExecutor {
            mailbox: self.mailbox.clone(),
            priority: self.priority,
        }
    }
}

impl<T> MailboxExecutor<T> {
    /// Submits a mail at this executor's priority.
    pub fn submit(
        &self,
        description: impl Into<Cow<'static, str>>,
        mail: impl FnOnce(&mut T) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        self.mailbox.put(self.priority, description, Box::new(mail))
    }

    /// Runs one mail of at least this priority, blocking until one is available. Must be
    /// called on the task thread.
    pub fn yield_mail(&self, target: &mut T) -> Result<()> {
        let letter = self.mailbox.take(self.priority)?;
        letter.run(target)
    }

    /// Runs one mail of at least this priority if one is queued; returns whether it did.
    pub fn try_yield(&self, target: &mut T) -> Result<bool> {
        match self.mailbox.try_take(self.priority) {
            Some(letter) => letter.run(target).map(|()| true),
            None => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;
    use std::time::Duration;

    fn push(log: &str) -> Mail<Vec<String>> {
        let log = log.to_string();
        Box::new(move |v: &mut Vec<String>| {
            v.push(log);
            Ok(())
        })
    }

    #[test]
    fn higher_priority_first_then_fifo() {
        let mb = TaskMailbox::new("t");
        mb.put(Priority::DEFAULT, "a", push("a")).unwrap();
        mb.put(Priority::MAX, "b", push("b")).unwrap();
        mb.put(Priority::DEFAULT, "c", push("c")).unwrap();
        mb.put(Priority::MAX, "d", push("d")).unwrap();
        mb.put(Priority::CONTROL, "e", push("e")).unwrap();
        let mut log = vec![];
        while let Some(l) = mb.try_take(Priority::DEFAULT) {
            l.run(&mut log).unwrap();
        }
        assert_eq!(log, ["b", "d", "e", "a", "c"]);
    }

    #[test]
    fn try_yield_only_runs_mails_at_or_above_its_priority() {
        let mb = TaskMailbox::new("t");
        mb.put(Priority::DEFAULT, "low", push("low")).unwrap();
        let high = mb.executor(Priority::MAX);
        let mut log = vec![];
        assert!(!high.try_yield(&mut log).unwrap());
        high.submit("high", |v: &mut Vec<String>| {
            v.push("high".into());
            Ok(())
        })
        .unwrap();
        assert!(high.try_yield(&mut log).unwrap());
        assert!(!high.try_yield(&mut log).unwrap());
        assert_eq!(log, ["high"]);
        assert!(mb.executor(Priority::DEFAULT).try_yield(&mut log).unwrap());
        assert_eq!(log, ["high", "low"]);
    }

    #[test]
    fn yield_blocks_until_a_mail_arrives_from_another_thread() {
        let mb = TaskMailbox::new("t");
        let exec = mb.executor(Priority::DEFAULT);
        let other = mb.executor(Priority::CONTROL);
        let sender = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            other
                .submit("late", |v: &mut Vec<String>| {
                    v.push("late".into());
                    Ok(())
                })
                .unwrap();
        });
        let mut log = vec![];
        exec.yield_mail(&mut log).unwrap();
        assert_eq!(log, ["late"]);
        sender.join().unwrap();
    }

    #[test]
    fn a_high_priority_yield_wakes_while_lower_mails_wait() {
        let mb = TaskMailbox::new("t");
        mb.put(Priority::DEFAULT, "low", push("low")).unwrap();
        let high = mb.executor(Priority::MAX);
        let sender = {
            let mb = mb.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                mb.put(Priority::MAX, "notify", push("notify")).unwrap();
            })
        };
        let mut log = vec![];
        high.yield_mail(&mut log).unwrap();
        assert_eq!(log, ["notify"]);
        sender.join().unwrap();
        assert_eq!(mb.len(), 1);
    }

    #[test]
    fn quiesce_rejects_new_mails_but_drains_queued_ones() {
        let mb = TaskMailbox::new("word count (1/2)");
        mb.put(Priority::DEFAULT, "queued", push("queued")).unwrap();
        mb.quiesce();
        let err = mb.put(Priority::MAX, "timer", push("x")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "mailbox of task word count (1/2) is closed; rejected mail 'timer'"
        );
        let mut log = vec![];
        while mb.executor(Priority::DEFAULT).try_yield(&mut log).unwrap() {}
        assert_eq!(log, ["queued"]);
    }

    #[test]
    fn close_returns_unrun_mails_and_wakes_a_blocked_take() {
        let mb: TaskMailbox<Vec<String>> = TaskMailbox::new("t");
        let waiter = {
            let mb = mb.clone();
            thread::spawn(move || mb.take(Priority::DEFAULT).map(|l| l.description))
        };
        thread::sleep(Duration::from_millis(20));
        mb.put(Priority::DEFAULT, "first", push("first")).unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), "first");
        mb.put(Priority::DEFAULT, "never", push("never")).unwrap();
        let dropped = mb.close();
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].description, "never");
        assert!(mb.take(Priority::DEFAULT).is_err());
    }

    #[test]
    fn all_actions_completed_wakes_a_blocked_take() {
        let mb: TaskMailbox<Vec<String>> = TaskMailbox::new("t");
        let waiter = {
            let mb = mb.clone();
            thread::spawn(move || mb.take(Priority::DEFAULT).is_err())
        };
        thread::sleep(Duration::from_millis(20));
        mb.all_actions_completed();
        assert!(waiter.join().unwrap());
    }
}
