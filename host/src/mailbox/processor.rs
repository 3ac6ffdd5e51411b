//! The mailbox loop.

use anyhow::{Context as _, Result};
use crossbeam_channel::Receiver;

use super::TaskMailbox;

/// What one run of the default action found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionResult {
    /// It processed input and more may be available: run it again (after any mails).
    Continue,
    /// No input is available: suspend it until input or a mail arrives.
    Suspend,
    /// The input has ended: the loop finishes.
    Done,
}

/// Runs a task's mailbox loop: all queued mails, then one step of the default action,
/// and again, until the input ends or the loop is told to stop.
pub struct MailboxProcessor<T> {
    mailbox: TaskMailbox<T>,
}

impl<T> MailboxProcessor<T> {
    /// A processor for `mailbox`.
    pub fn new(mailbox: TaskMailbox<T>) -> Self {
        MailboxProcessor { mailbox }
    }

    /// The mailbox this processor takes mails from.
    pub fn mailbox(&self) -> &TaskMailbox<T> {
        &self.mailbox
    }

    /// Runs the loop on the calling thread (the task thread).
    ///
    /// `default_action` processes one unit of input. While it is suspended, `wait` is
    /// called with the mailbox's doorbell and must block until either the doorbell or one
    /// of the task's inputs is ready — never spin. The loop ends when the default action
    /// reports [`ActionResult::Done`], when [`TaskMailbox::all_actions_completed`] is
    /// called (end of a stop-with-savepoint, cancel), or with the first error of a mail
    /// or of the default action.
    pub fn run(
        &self,
        target: &mut T,
        mut default_action: impl FnMut(&mut T) -> Result<ActionResult>,
        mut wait: impl FnMut(&mut T, &Receiver<()>) -> Result<()>,
    ) -> Result<()> {
        loop {
            // Consume the doorbell before draining: a mail put after the drain rings it
            // again, so `wait` cannot sleep through it.
            let _ = self.mailbox.doorbell().try_recv();
            if self.process_mails(target)? {
                return Ok(());
            }
            match default_action(target)? {
                ActionResult::Continue => {}
                ActionResult::Done => return Ok(()),
                ActionResult::Suspend => {
                    if !self.mailbox.is_all_actions_completed() {
                        wait(target, self.mailbox.doorbell())?;
                    }
                }
            }
        }
    }

    /// Runs all queued mails (taken in one batch, highest priority first, and again
    /// until none is left); returns true when the loop should end.
    fn process_mails(&self, target: &mut T) -> Result<bool> {
        loop {
            if self.mailbox.is_all_actions_completed() {
                return Ok(true);
            }
            let batch = self.mailbox.take_all();
            if batch.is_empty() {
                return Ok(false);
            }
            let mut batch = batch.into_iter();
            while let Some(letter) = batch.next() {
                let description = letter.description.clone();
                letter
                    .run(target)
                    .with_context(|| format!("mail '{description}' failed"))?;
                if self.mailbox.is_all_actions_completed() {
                    // Mails of this batch that did not run are dropped, as at close.
                    for dropped in batch {
                        tracing::debug!("dropped mail '{}': the loop ended", dropped.description);
                    }
                    return Ok(true);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mailbox::Priority;
    use crossbeam_channel::{Select, bounded};
    use std::thread;
    use std::time::{Duration, Instant};

    struct Task {
        input: Receiver<u32>,
        log: Vec<String>,
    }

    fn wait_for_input_or_mail(task: &mut Task, doorbell: &Receiver<()>) -> Result<()> {
        let mut sel = Select::new();
        sel.recv(doorbell);
        sel.recv(&task.input);
        sel.ready();
        Ok(())
    }

    fn default_action(task: &mut Task) -> Result<ActionResult> {
        match task.input.try_recv() {
            Ok(0) => Ok(ActionResult::Done),
            Ok(n) => {
                task.log.push(format!("record {n}"));
                Ok(ActionResult::Continue)
            }
            Err(crossbeam_channel::TryRecvError::Empty) => Ok(ActionResult::Suspend),
            Err(crossbeam_channel::TryRecvError::Disconnected) => Ok(ActionResult::Done),
        }
    }

    #[test]
    fn mails_run_between_records_and_suspension_wakes_on_input_or_mail() {
        let (tx, rx) = bounded(16);
        let mailbox = TaskMailbox::new("t");
        let processor = MailboxProcessor::new(mailbox.clone());
        let feeder = thread::spawn(move || {
            tx.send(1).unwrap();
            thread::sleep(Duration::from_millis(30));
            mailbox
                .put(
                    Priority::DEFAULT,
                    "mail",
                    Box::new(|t: &mut Task| {
                        t.log.push("mail".into());
                        Ok(())
                    }),
                )
                .unwrap();
            thread::sleep(Duration::from_millis(30));
            tx.send(2).unwrap();
            tx.send(0).unwrap();
        });
        let mut task = Task {
            input: rx,
            log: vec![],
        };
        processor
            .run(&mut task, default_action, wait_for_input_or_mail)
            .unwrap();
        feeder.join().unwrap();
        assert_eq!(task.log, ["record 1", "mail", "record 2"]);
    }

    #[test]
    fn all_actions_completed_from_another_thread_ends_a_suspended_loop() {
        let (_tx, rx) = bounded::<u32>(1);
        let mailbox = TaskMailbox::new("t");
        let processor = MailboxProcessor::new(mailbox.clone());
        let start = Instant::now();
        let stopper = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            mailbox.all_actions_completed();
        });
        let mut task = Task {
            input: rx,
            log: vec![],
        };
        processor
            .run(&mut task, default_action, wait_for_input_or_mail)
            .unwrap();
        stopper.join().unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_failing_mail_fails_the_loop_with_its_description() {
        let (_tx, rx) = bounded::<u32>(1);
        let mailbox = TaskMailbox::new("t");
        mailbox
            .put(
                Priority::MAX,
                "fire timers",
                Box::new(|_: &mut Task| anyhow::bail!("operator trapped")),
            )
            .unwrap();
        let mut task = Task {
            input: rx,
            log: vec![],
        };
        let err = MailboxProcessor::new(mailbox)
            .run(&mut task, default_action, wait_for_input_or_mail)
            .unwrap_err();
        assert_eq!(
            format!("{err:#}"),
            "mail 'fire timers' failed: operator trapped"
        );
    }
}
