//! The processing-time service of a task.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, MutexGuard};

/// Wall-clock milliseconds since the Unix epoch: Sluice's processing time.
pub fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// [`now_millis`] at `at`, derived from the monotonic clock: the wall clock is read at
/// most once a second per thread. Calls at small batches read the clock several times
/// each (busy time, CPU shares, deadlines, state TTL), so one reading serves them all; a
/// step of the system clock shows within a second.
pub fn millis_at(at: Instant) -> i64 {
    thread_local! {
        static ANCHOR: Cell<Option<(Instant, i64)>> = const { Cell::new(None) };
    }
    const REREAD: Duration = Duration::from_secs(1);
    let signed_ms = |from: Instant, to: Instant| match to.checked_duration_since(from) {
        Some(d) => d.as_millis() as i64,
        None => -(from.duration_since(to).as_millis() as i64),
    };
    ANCHOR.with(|anchor| {
        if let Some((then, ms)) = anchor.get()
            && at.checked_duration_since(then).is_some_and(|d| d < REREAD)
        {
            return ms + signed_ms(then, at);
        }
        let (then, ms) = (Instant::now(), now_millis());
        anchor.set(Some((then, ms)));
        ms + signed_ms(then, at)
    })
}

type Callback = Box<dyn FnOnce(i64) + Send>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Running,
    /// No new timers are accepted and queued ones were dropped.
    Quiesced,
    /// The thread is told to exit.
    Shutdown,
}

struct State {
    queue: BinaryHeap<Reverse<(i64, u64)>>,
    callbacks: HashMap<u64, Callback>,
    next_id: u64,
    status: Status,
    /// A callback is running right now (outside the lock).
    firing: bool,
    exited: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }
}

/// Calls callbacks at wall-clock times, on its own thread.
///
/// A task registers a callback that puts a mail into its mailbox, so the actual work
/// runs on the task thread (see [`crate::timers`] for the catch-up policy). On shutdown the
/// task first [quiesces](ProcessingTimeService::quiesce) the service — no new timers, the
/// queued ones dropped — then waits, bounded by a timeout, for a callback that may be
/// running at that moment.
pub struct ProcessingTimeService {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// A registered timer; [`TimerHandle::cancel`] prevents it from firing.
#[derive(Debug, Clone)]
pub struct TimerHandle {
    id: u64,
    shared: Weak<Shared>,
}

impl TimerHandle {
    /// Cancels the timer if it has not fired yet.
    pub fn cancel(&self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.lock().callbacks.remove(&self.id);
        }
    }
}

impl ProcessingTimeService {
    /// Starts the service thread; `name` identifies the task in thread names.
    pub fn new(name: &str) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: BinaryHeap::new(),
                callbacks: HashMap::new(),
                next_id: 0,
                status: Status::Running,
                firing: false,
                exited: false,
            }),
            changed: Condvar::new(),
        });
        let worker = shared.clone();
        let thread = thread::Builder::new()
            .name(format!("timers {name}"))
            .spawn(move || run(&worker))
            .expect("spawning the timer thread");
        ProcessingTimeService {
            shared,
            thread: Some(thread),
        }
    }

    /// Calls `callback(at)` on the service thread once the wall clock reaches `at`
    /// (milliseconds since the epoch); immediately if `at` has passed. After
    /// [`quiesce`](Self::quiesce) the callback is dropped without being called.
    pub fn register_timer(
        &self,
        at: i64,
        callback: impl FnOnce(i64) + Send + 'static,
    ) -> TimerHandle {
        let mut s = self.shared.lock();
        let id = s.next_id;
        s.next_id += 1;
        if s.status == Status::Running {
            s.queue.push(Reverse((at, id)));
            s.callbacks.insert(id, Box::new(callback));
            self.shared.changed.notify_all();
        }
        TimerHandle {
            id,
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// Number of timers waiting to fire.
    pub fn pending(&self) -> usize {
        self.shared.lock().callbacks.len()
    }

    /// Stops accepting timers and drops the ones that have not started; a callback
    /// running at this moment completes.
    pub fn quiesce(&self) {
        let mut s = self.shared.lock();
        if s.status == Status::Running {
            s.status = Status::Quiesced;
        }
        s.queue.clear();
        s.callbacks.clear();
        self.shared.changed.notify_all();
    }

    /// After [`quiesce`](Self::quiesce): waits until no callback is running, at most
    /// `timeout`. Returns false on timeout.
    pub fn await_pending_after_quiesce(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.lock();
        while s.firing {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.shared.changed.wait_for(&mut s, left);
        }
        true
    }

    /// Quiesces and stops the service thread, waiting at most `timeout` for a running
    /// callback. Returns false when the thread did not stop in time (it is then left to
    /// exit on its own).
    pub fn shutdown(&mut self, timeout: Duration) -> bool {
        self.quiesce();
        self.shared.lock().status = Status::Shutdown;
        self.shared.changed.notify_all();
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.lock();
        while !s.exited {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.shared.changed.wait_for(&mut s, left);
        }
        drop(s);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        true
    }
}

impl Drop for ProcessingTimeService {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown(Duration::from_secs(1));
        }
    }
}

fn run(shared: &Shared) {
    let mut s = shared.lock();
    loop {
        if s.status == Status::Shutdown {
            break;
        }
        let Some(&Reverse((at, id))) = s.queue.peek() else {
            shared.changed.wait(&mut s);
            continue;
        };
        let now = now_millis();
        if at > now {
            let wait = Duration::from_millis((at - now) as u64);
            shared.changed.wait_for(&mut s, wait);
            continue;
        }
        s.queue.pop();
        let Some(callback) = s.callbacks.remove(&id) else {
            continue; // cancelled
        };
        s.firing = true;
        drop(s);
        callback(at);
        s = shared.lock();
        s.firing = false;
        shared.changed.notify_all();
    }
    s.exited = true;
    shared.changed.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::unbounded;

    #[test]
    fn millis_at_follows_the_wall_clock_from_a_monotonic_reading() {
        let (before, at, after) = (now_millis(), Instant::now(), now_millis());
        let ms = millis_at(at);
        // (The anchor may be read a millisecond after `after`.)
        assert!(
            (before..=after + 1).contains(&ms),
            "{before} <= {ms} <= {after} + 1"
        );
        // Later and earlier instants, inside and beyond the re-reading interval.
        for offset in [1, 999, 1500, 60_000] {
            let d = Duration::from_millis(offset);
            let later = millis_at(at + d) - ms;
            assert!(
                (offset as i64 - 1..=offset as i64 + 1).contains(&later),
                "{later}"
            );
            let Some(earlier) = at.checked_sub(d) else {
                continue;
            };
            let earlier = ms - millis_at(earlier);
            assert!(
                (offset as i64 - 1..=offset as i64 + 1).contains(&earlier),
                "{earlier}"
            );
        }
    }

    #[test]
    fn timers_fire_in_deadline_order_with_their_registered_time() {
        let service = ProcessingTimeService::new("t");
        let (tx, rx) = unbounded();
        let base = now_millis() + 30;
        for offset in [20, 0, 10] {
            let tx = tx.clone();
            service.register_timer(base + offset, move |at| tx.send(at).unwrap());
        }
        let fired: Vec<i64> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(fired, vec![base, base + 10, base + 20]);
        assert!(now_millis() >= base + 20);
    }

    #[test]
    fn overdue_timers_fire_at_once_in_order() {
        let service = ProcessingTimeService::new("t");
        let (tx, rx) = unbounded();
        let past = now_millis() - 1000;
        // A first overdue timer holds the service's thread until the others are all
        // registered, so they are overdue together (else the first registered may fire
        // before the next is there).
        let (hold, held) = unbounded::<()>();
        let (entered, in_first) = unbounded::<()>();
        service.register_timer(past, move |_| {
            entered.send(()).unwrap();
            held.recv().unwrap();
        });
        in_first.recv().unwrap();
        for offset in [3, 1, 2] {
            let tx = tx.clone();
            service.register_timer(past + offset, move |at| tx.send(at - past).unwrap());
        }
        hold.send(()).unwrap();
        let fired: Vec<i64> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(fired, vec![1, 2, 3]);
    }

    #[test]
    fn cancelled_and_quiesced_timers_never_fire() {
        let service = ProcessingTimeService::new("t");
        let (tx, rx) = unbounded();
        let soon = now_millis() + 50;
        let t1 = tx.clone();
        service
            .register_timer(soon, move |_| t1.send("cancelled").unwrap())
            .cancel();
        let t2 = tx.clone();
        service.register_timer(soon, move |_| t2.send("quiesced").unwrap());
        service.quiesce();
        let t3 = tx.clone();
        service.register_timer(0, move |_| t3.send("after quiesce").unwrap());
        assert_eq!(service.pending(), 0);
        thread::sleep(Duration::from_millis(120));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn quiesce_lets_a_running_callback_finish_and_await_is_bounded() {
        let service = ProcessingTimeService::new("t");
        let (started_tx, started) = unbounded();
        service.register_timer(0, move |_| {
            started_tx.send(()).unwrap();
            thread::sleep(Duration::from_millis(300));
        });
        started.recv().unwrap();
        service.quiesce();
        assert!(!service.await_pending_after_quiesce(Duration::from_millis(20)));
        assert!(service.await_pending_after_quiesce(Duration::from_secs(5)));
    }

    #[test]
    fn shutdown_gives_up_after_its_timeout() {
        let mut service = ProcessingTimeService::new("t");
        let (started_tx, started) = unbounded();
        service.register_timer(0, move |_| {
            started_tx.send(()).unwrap();
            thread::sleep(Duration::from_millis(500));
        });
        started.recv().unwrap();
        let t0 = Instant::now();
        assert!(!service.shutdown(Duration::from_millis(50)));
        assert!(t0.elapsed() < Duration::from_millis(400));
    }
}
