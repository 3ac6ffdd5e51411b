//! Barrier alignment: deciding, from the barriers and cancel markers that arrive on a
//! task's input channels, when the task takes a checkpoint.
//!
//! This is a pure state machine (no I/O): the input gate feeds it what arrived and does
//! what the returned [`AlignAction`] says.
//!
//! In **exactly-once** mode a channel that delivered barrier *n* is blocked until every
//! other open channel delivered *n* too; records behind the barrier wait, so the
//! checkpoint contains exactly the records before barrier *n* from every channel. One
//! checkpoint is aligned at a time: a newer barrier or cancel marker aborts it.
//!
//! In **at-least-once** mode nothing is blocked (the reference's
//! `CheckpointBarrierTracker`): several checkpoints may be pending at once, since a fast
//! channel may deliver barriers *n* and *n + 1* before a slow one delivers *n*. Each is
//! taken when the last open channel delivers its barrier; records that overtook a barrier
//! on faster channels are replayed after a restore (hence "at least once").

use std::collections::VecDeque;

use super::Barrier;

/// Checkpoints tracked at once in at-least-once mode; past this, the oldest is aborted.
const MAX_PENDING_CHECKPOINTS: usize = 50;

/// Whether inputs are aligned on barriers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointingMode {
    /// Block channels that delivered a barrier until all did.
    #[default]
    ExactlyOnce,
    /// Never block; checkpoint when the last barrier arrives.
    AtLeastOnce,
}

/// What the gate must do after feeding the aligner one event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlignAction {
    /// Checkpoints to abort (decline, and forward a cancel marker), oldest first; all older
    /// than `trigger`.
    pub abort: Vec<u64>,
    /// Block this channel until the alignment ends.
    pub block: Option<usize>,
    /// Take this checkpoint now, after the aborts.
    pub trigger: Option<Barrier>,
    /// The alignment ended: unblock every channel.
    pub unblock_all: bool,
}

/// A checkpoint whose barrier arrived on some channels, but not yet on every open one.
#[derive(Debug, Clone)]
struct PendingCheckpoint {
    barrier: Barrier,
    /// Which channels delivered the barrier.
    received: Vec<bool>,
}

/// Tracks barrier alignment over `channels` input channels.
#[derive(Debug, Clone)]
pub struct BarrierAligner {
    mode: CheckpointingMode,
    ended: Vec<bool>,
    /// Checkpoints waiting for barriers, by increasing id, all newer than `last_handled`;
    /// at most one in exactly-once mode.
    pending: VecDeque<PendingCheckpoint>,
    /// Highest checkpoint id triggered or aborted; older barriers are ignored.
    last_handled: Option<u64>,
}

impl BarrierAligner {
    /// An aligner for `channels` channels.
    pub fn new(channels: usize, mode: CheckpointingMode) -> Self {
        BarrierAligner {
            mode,
            ended: vec![false; channels],
            pending: VecDeque::new(),
            last_handled: None,
        }
    }

    /// The checkpoints waiting for barriers, oldest first.
    pub fn pending(&self) -> impl Iterator<Item = u64> + '_ {
        self.pending.iter().map(|p| p.barrier.id)
    }

    /// True when `id` was triggered or aborted, or is older than one that was.
    fn is_handled(&self, id: u64) -> bool {
        self.last_handled.is_some_and(|last| id <= last)
    }

    /// True when an event for checkpoint `id` changes nothing: it was handled already, or
    /// (exactly-once) it is older than the checkpoint being aligned.
    fn ignores(&self, id: u64) -> bool {
        self.is_handled(id)
            || (self.mode == CheckpointingMode::ExactlyOnce
                && self.pending.front().is_some_and(|p| p.barrier.id > id))
    }

    /// `barrier` arrived on `channel`.
    pub fn on_barrier(&mut self, channel: usize, barrier: Barrier) -> AlignAction {
        let mut action = AlignAction::default();
        if self.ignores(barrier.id) {
            return action;
        }
        if self.mode == CheckpointingMode::ExactlyOnce {
            // A newer checkpoint overtook the one being aligned: give that one up.
            self.abort_older(barrier.id, &mut action);
        }
        let at = self.pending.partition_point(|p| p.barrier.id < barrier.id);
        if self
            .pending
            .get(at)
            .is_none_or(|p| p.barrier.id != barrier.id)
        {
            let received = vec![false; self.ended.len()];
            self.pending
                .insert(at, PendingCheckpoint { barrier, received });
        }
        self.pending[at].received[channel] = true;
        self.trigger_newest_complete(&mut action);
        match self.mode {
            CheckpointingMode::ExactlyOnce if action.trigger.is_none() => {
                action.block = Some(channel);
            }
            CheckpointingMode::ExactlyOnce => {}
            CheckpointingMode::AtLeastOnce => {
                let excess = self.pending.len().saturating_sub(MAX_PENDING_CHECKPOINTS);
                for oldest in self.pending.drain(..excess) {
                    action.abort.push(oldest.barrier.id);
                    self.last_handled = Some(oldest.barrier.id);
                }
            }
        }
        self.finish(action)
    }

    /// A cancel marker for checkpoint `id` arrived on `channel`: an upstream task
    /// declined it, so its barrier will never come. Aborts it and every older pending
    /// checkpoint.
    pub fn on_cancel_marker(&mut self, _channel: usize, id: u64) -> AlignAction {
        let mut action = AlignAction::default();
        if self.ignores(id) {
            return action;
        }
        self.abort_older(id, &mut action);
        if self.pending.front().is_some_and(|p| p.barrier.id == id) {
            self.pending.pop_front();
        }
        action.abort.push(id);
        self.last_handled = Some(id);
        self.finish(action)
    }

    /// `channel` ended: it will deliver no more barriers, so no checkpoint waits for it.
    pub fn on_end_of_partition(&mut self, channel: usize) -> AlignAction {
        self.ended[channel] = true;
        let mut action = AlignAction::default();
        self.trigger_newest_complete(&mut action);
        self.finish(action)
    }

    /// Aborts every pending checkpoint older than `id`.
    fn abort_older(&mut self, id: u64, action: &mut AlignAction) {
        while let Some(oldest) = self.pending.front().filter(|p| p.barrier.id < id) {
            action.abort.push(oldest.barrier.id);
            self.last_handled = Some(oldest.barrier.id);
            self.pending.pop_front();
        }
    }

    /// Triggers the newest checkpoint whose barrier every open channel delivered, and
    /// aborts the pending ones older than it: a newer checkpoint subsumes them.
    fn trigger_newest_complete(&mut self, action: &mut AlignAction) {
        let Some(at) = self.pending.iter().rposition(|p| {
            p.received
                .iter()
                .zip(&self.ended)
                .all(|(&received, &ended)| received || ended)
        }) else {
            return;
        };
        let barrier = self.pending[at].barrier;
        self.abort_older(barrier.id, action);
        self.pending.pop_front();
        self.last_handled = Some(barrier.id);
        action.trigger = Some(barrier);
    }

    /// Sets `unblock_all`: in exactly-once mode the blocked channels are those that
    /// delivered the barrier being aligned, released when it is triggered or aborted.
    fn finish(&self, mut action: AlignAction) -> AlignAction {
        action.unblock_all = self.mode == CheckpointingMode::ExactlyOnce
            && (action.trigger.is_some() || !action.abort.is_empty());
        action
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::CheckpointKind;
    use CheckpointingMode::{AtLeastOnce, ExactlyOnce};

    /// Barrier `id`, with a timestamp that tells it apart from the others.
    fn barrier(id: u64) -> Barrier {
        Barrier {
            id,
            timestamp: 1000 + id as i64,
            kind: CheckpointKind::Checkpoint,
        }
    }

    fn pending(a: &BarrierAligner) -> Vec<u64> {
        a.pending().collect()
    }

    fn triggers(id: u64) -> AlignAction {
        AlignAction {
            trigger: Some(barrier(id)),
            ..AlignAction::default()
        }
    }

    /// All orders in which `n` channels can deliver one barrier.
    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![vec![]];
        }
        let mut out = vec![];
        for p in permutations(n - 1) {
            for i in 0..=p.len() {
                let mut q = p.clone();
                q.insert(i, n - 1);
                out.push(q);
            }
        }
        out
    }

    #[test]
    fn exactly_once_blocks_each_channel_until_the_last_barrier_then_triggers_once() {
        for n in 1..=5 {
            for order in permutations(n) {
                let mut a = BarrierAligner::new(n, ExactlyOnce);
                let mut blocked = vec![false; n];
                let mut triggers = 0;
                for (step, &ch) in order.iter().enumerate() {
                    assert!(!blocked[ch]);
                    let act = a.on_barrier(ch, barrier(7));
                    assert!(act.abort.is_empty());
                    if step + 1 < n {
                        assert_eq!(act.block, Some(ch));
                        assert_eq!(act.trigger, None);
                        blocked[ch] = true;
                    } else {
                        assert_eq!(act.trigger, Some(barrier(7)));
                        assert!(act.unblock_all);
                        triggers += 1;
                    }
                }
                assert_eq!(triggers, 1);
                assert!(pending(&a).is_empty());
                // A late duplicate of the same barrier changes nothing.
                assert_eq!(a.on_barrier(order[0], barrier(7)), AlignAction::default());
            }
        }
    }

    #[test]
    fn at_least_once_never_blocks_and_triggers_on_the_last_barrier() {
        for order in permutations(4) {
            let mut a = BarrierAligner::new(4, AtLeastOnce);
            for (step, &ch) in order.iter().enumerate() {
                let act = a.on_barrier(ch, barrier(1));
                assert_eq!(act.block, None);
                assert_eq!(act.trigger, (step == 3).then_some(barrier(1)));
            }
        }
    }

    #[test]
    fn a_newer_barrier_aborts_the_pending_alignment() {
        let mut a = BarrierAligner::new(3, ExactlyOnce);
        assert_eq!(a.on_barrier(0, barrier(1)).block, Some(0));
        let act = a.on_barrier(1, barrier(2));
        assert_eq!(act.abort, [1]);
        assert!(act.unblock_all);
        assert_eq!(act.block, Some(1));
        assert_eq!(pending(&a), [2]);
        // The old barrier arriving late is ignored.
        assert_eq!(a.on_barrier(2, barrier(1)), AlignAction::default());
        assert_eq!(a.on_barrier(0, barrier(2)).block, Some(0));
        assert_eq!(a.on_barrier(2, barrier(2)).trigger, Some(barrier(2)));
    }

    #[test]
    fn cancel_marker_aborts_and_unblocks() {
        let mut a = BarrierAligner::new(2, ExactlyOnce);
        a.on_barrier(0, barrier(5));
        let act = a.on_cancel_marker(1, 5);
        assert_eq!(act.abort, [5]);
        assert!(act.unblock_all);
        assert!(pending(&a).is_empty());
        // The barrier of the aborted checkpoint, arriving later, is ignored.
        assert_eq!(a.on_barrier(1, barrier(5)), AlignAction::default());
        // A cancel marker for a checkpoint no barrier announced yet still aborts it.
        assert_eq!(a.on_cancel_marker(0, 6).abort, [6]);
        assert_eq!(a.on_barrier(1, barrier(6)), AlignAction::default());
    }

    #[test]
    fn cancel_marker_for_a_newer_checkpoint_aborts_both() {
        for mode in [ExactlyOnce, AtLeastOnce] {
            let mut a = BarrierAligner::new(2, mode);
            a.on_barrier(0, barrier(3));
            let act = a.on_cancel_marker(1, 4);
            assert_eq!(act.abort, [3, 4]);
            assert_eq!(act.unblock_all, mode == ExactlyOnce);
            assert!(pending(&a).is_empty());
        }
    }

    #[test]
    fn an_ended_channel_is_not_waited_for() {
        let mut a = BarrierAligner::new(3, ExactlyOnce);
        a.on_barrier(0, barrier(1));
        a.on_barrier(1, barrier(1));
        let act = a.on_end_of_partition(2);
        assert_eq!(act.trigger, Some(barrier(1)));
        assert!(act.unblock_all);
        // With channel 2 gone, the next checkpoint needs only channels 0 and 1.
        assert_eq!(a.on_barrier(1, barrier(2)).block, Some(1));
        assert_eq!(a.on_barrier(0, barrier(2)).trigger, Some(barrier(2)));
    }

    #[test]
    fn exactly_once_ignores_a_stale_barrier_after_a_cancel_marker() {
        let mut a = BarrierAligner::new(2, ExactlyOnce);
        assert_eq!(a.on_cancel_marker(1, 1).abort, [1]);
        assert_eq!(a.on_barrier(1, barrier(2)).block, Some(1));
        assert_eq!(a.on_barrier(0, barrier(1)), AlignAction::default());
        let act = a.on_barrier(0, barrier(2));
        assert_eq!(act.trigger, Some(barrier(2)));
        assert!(act.abort.is_empty() && act.unblock_all);
    }

    #[test]
    fn at_least_once_tracks_the_checkpoints_a_lagging_channel_has_not_reached() {
        let mut a = BarrierAligner::new(2, AtLeastOnce);
        for id in 1..=3 {
            assert_eq!(a.on_barrier(0, barrier(id)), AlignAction::default());
        }
        assert_eq!(pending(&a), [1, 2, 3]);
        for id in 1..=3 {
            assert_eq!(a.on_barrier(1, barrier(id)), triggers(id));
        }
        assert!(pending(&a).is_empty());
    }

    #[test]
    fn at_least_once_cancel_marker_aborts_it_and_the_older_pending_ones() {
        let mut a = BarrierAligner::new(3, AtLeastOnce);
        for id in 1..=3 {
            a.on_barrier(0, barrier(id));
        }
        let act = a.on_cancel_marker(1, 2);
        assert_eq!(act.abort, [1, 2]);
        assert_eq!(
            (act.trigger, act.block, act.unblock_all),
            (None, None, false)
        );
        assert_eq!(pending(&a), [3]);
        assert_eq!(a.on_barrier(1, barrier(3)), AlignAction::default());
        // Barriers of the aborted checkpoints, arriving late, are ignored.
        assert_eq!(a.on_barrier(2, barrier(1)), AlignAction::default());
        assert_eq!(a.on_barrier(2, barrier(2)), AlignAction::default());
        assert_eq!(a.on_barrier(2, barrier(3)), triggers(3));
    }

    #[test]
    fn at_least_once_end_of_partition_completes_several_checkpoints_at_once() {
        let mut a = BarrierAligner::new(3, AtLeastOnce);
        for id in 1..=3 {
            a.on_barrier(0, barrier(id));
        }
        a.on_barrier(1, barrier(1));
        a.on_barrier(1, barrier(2));
        // Checkpoints 1 and 2 now wait only for channel 2: the newest is taken.
        let act = a.on_end_of_partition(2);
        assert_eq!(act.abort, [1]);
        assert_eq!(act.trigger, Some(barrier(2)));
        assert_eq!(pending(&a), [3]);
        assert_eq!(a.on_barrier(1, barrier(3)), triggers(3));
    }

    #[test]
    fn at_least_once_bounds_the_pending_checkpoints() {
        let max = MAX_PENDING_CHECKPOINTS as u64;
        let mut a = BarrierAligner::new(2, AtLeastOnce);
        for id in 1..=max {
            assert_eq!(a.on_barrier(0, barrier(id)), AlignAction::default());
        }
        assert_eq!(a.on_barrier(0, barrier(max + 1)).abort, [1]);
        assert_eq!(a.on_barrier(0, barrier(max + 2)).abort, [2]);
        assert_eq!(pending(&a), (3..=max + 2).collect::<Vec<_>>());
        assert_eq!(a.on_barrier(1, barrier(2)), AlignAction::default());
        assert_eq!(a.on_barrier(1, barrier(3)), triggers(3));
    }

    /// One element of a channel, as far as alignment goes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Event {
        Barrier(u64),
        CancelMarker(u64),
        Record,
        EndOfPartition,
    }

    /// What one channel may deliver: for each checkpoint `1..=ids` in order its barrier, a
    /// cancel marker (with `cancel`) or nothing (with `skip`); ended after any of them, or
    /// else followed by a record.
    fn channel_scripts(ids: u64, cancel: bool, skip: bool) -> Vec<Vec<Event>> {
        let mut out = vec![];
        let mut stack = vec![(vec![], 1)];
        while let Some((prefix, id)) = stack.pop() {
            let mut ended = prefix.clone();
            ended.push(Event::EndOfPartition);
            out.push(ended);
            if id > ids {
                let mut open = prefix;
                open.push(Event::Record);
                out.push(open);
                continue;
            }
            let mut choices = vec![Some(Event::Barrier(id))];
            if cancel {
                choices.push(Some(Event::CancelMarker(id)));
            }
            if skip {
                choices.push(None);
            }
            for choice in choices {
                let mut next = prefix.clone();
                next.extend(choice);
                stack.push((next, id + 1));
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The gate's part, played by hand: feeds the aligner one channel's next event at a
    /// time, never reads a blocked channel, and checks every action it gets back.
    #[derive(Clone)]
    struct Run<'a> {
        scripts: &'a [Vec<Event>],
        aligner: BarrierAligner,
        next: Vec<usize>,
        blocked: Vec<bool>,
        ended: Vec<bool>,
        /// Bit `n` set: the channel delivered barrier `n`.
        barriers: Vec<u64>,
        /// Exactly-once: the barrier the channel's following elements are behind.
        behind: Vec<Option<u64>>,
        /// Bit `n` set: some channel delivered a barrier or cancel marker for `n`.
        seen: u64,
        triggered: Vec<u64>,
        aborted: Vec<u64>,
        trace: Vec<(usize, Event)>,
        /// No channel skips a checkpoint: each delivers a barrier or cancel marker for
        /// every id up to its end, or, if it stays open, up to the highest id of all.
        gapless: bool,
    }

    impl<'a> Run<'a> {
        fn new(mode: CheckpointingMode, scripts: &'a [Vec<Event>]) -> Self {
            let n = scripts.len();
            Run {
                scripts,
                aligner: BarrierAligner::new(n, mode),
                next: vec![0; n],
                blocked: vec![false; n],
                ended: vec![false; n],
                barriers: vec![0; n],
                behind: vec![None; n],
                seen: 0,
                triggered: vec![],
                aborted: vec![],
                trace: vec![],
                gapless: gapless(scripts),
            }
        }

        fn reported(&self, id: u64) -> bool {
            self.triggered.contains(&id) || self.aborted.contains(&id)
        }

        fn readable(&self, ch: usize) -> bool {
            !self.blocked[ch] && self.next[ch] < self.scripts[ch].len()
        }

        fn deliver(&mut self, ch: usize) {
            let event = self.scripts[ch][self.next[ch]];
            self.next[ch] += 1;
            self.trace.push((ch, event));
            if let Some(n) = self.behind[ch].take() {
                assert!(
                    self.reported(n),
                    "channel {ch} read past barrier {n} before it was taken or aborted: {:?}",
                    self.trace
                );
            }
            let mode = self.aligner.mode;
            let action = match event {
                Event::Barrier(id) => {
                    // A barrier older than one seen before is ignored, not aligned.
                    if mode == ExactlyOnce && self.seen >> id <= 1 {
                        self.behind[ch] = Some(id);
                    }
                    self.seen |= 1 << id;
                    self.barriers[ch] |= 1 << id;
                    self.aligner.on_barrier(ch, barrier(id))
                }
                Event::CancelMarker(id) => {
                    self.seen |= 1 << id;
                    self.aligner.on_cancel_marker(ch, id)
                }
                Event::EndOfPartition => {
                    self.ended[ch] = true;
                    self.aligner.on_end_of_partition(ch)
                }
                Event::Record => return,
            };
            self.check(ch, event, &action);
            self.aborted.extend(&action.abort);
            if action.unblock_all {
                self.blocked.fill(false);
            }
            if let Some(c) = action.block {
                self.blocked[c] = true;
            }
            self.triggered.extend(action.trigger.map(|b| b.id));
        }

        fn check(&self, ch: usize, event: Event, action: &AlignAction) {
            let trace = &self.trace;
            let handled: Vec<u64> = action
                .abort
                .iter()
                .copied()
                .chain(action.trigger.map(|b| b.id))
                .collect();
            assert!(
                handled.is_sorted_by(|a, b| a < b),
                "aborts must be oldest first and older than the trigger: {action:?} {trace:?}"
            );
            for &id in &handled {
                assert!(!self.reported(id), "{id} handled twice: {trace:?}");
            }
            for &id in &action.abort {
                let cause = match event {
                    Event::CancelMarker(c) => id <= c,
                    Event::Barrier(b) => id < b,
                    _ => false,
                };
                assert!(
                    cause || action.trigger.is_some(),
                    "{id} aborted for no reason: {trace:?}"
                );
            }
            if let Some(b) = action.trigger {
                assert_eq!(b, barrier(b.id), "{trace:?}");
                for c in 0..self.scripts.len() {
                    assert!(
                        self.ended[c] || self.barriers[c] & 1 << b.id != 0,
                        "{} taken before channel {c} delivered its barrier: {trace:?}",
                        b.id
                    );
                }
                assert!(
                    self.triggered.last().is_none_or(|&last| last < b.id),
                    "{} taken after {:?}: {trace:?}",
                    b.id,
                    self.triggered
                );
            }
            let ids: Vec<u64> = self.aligner.pending().collect();
            assert!(ids.is_sorted_by(|a, b| a < b));
            assert!(ids.iter().all(|&id| !self.aligner.is_handled(id)));
            match self.aligner.mode {
                AtLeastOnce => {
                    assert_eq!(action.block, None, "{trace:?}");
                }
                ExactlyOnce => {
                    assert!(ids.len() <= 1, "{ids:?} aligned at once: {trace:?}");
                    if let Some(c) = action.block {
                        assert!(c == ch && matches!(event, Event::Barrier(_)), "{trace:?}");
                    }
                }
            }
        }

        /// Checks a run that can go no further. Unless channels skip checkpoints, every
        /// element was delivered (no channel stays blocked) and every checkpoint announced
        /// was taken or aborted.
        fn check_end(&self) {
            if !self.gapless {
                return;
            }
            let trace = &self.trace;
            for ch in 0..self.scripts.len() {
                assert_eq!(
                    self.next[ch],
                    self.scripts[ch].len(),
                    "channel {ch} stuck: {trace:?}"
                );
            }
            for id in 0..64 {
                if self.seen & 1 << id != 0 {
                    assert!(
                        self.reported(id),
                        "{id} neither taken nor aborted: {trace:?}"
                    );
                }
            }
        }
    }

    fn gapless(scripts: &[Vec<Event>]) -> bool {
        let id = |e: &Event| match e {
            Event::Barrier(id) | Event::CancelMarker(id) => Some(*id),
            _ => None,
        };
        let highest = scripts.iter().flatten().filter_map(id).max().unwrap_or(0);
        scripts.iter().all(|s| {
            let ids: Vec<u64> = s.iter().filter_map(id).collect();
            ids.iter().zip(1..).all(|(&id, n)| id == n)
                && (s.last() == Some(&Event::EndOfPartition) || ids.len() as u64 == highest)
        })
    }

    /// Plays every schedule from `run` on; calls `end` with each finished run. Returns how
    /// many there were.
    fn explore(mut run: Run, end: &mut dyn FnMut(&Run)) -> usize {
        let mut readable = (0..run.scripts.len()).filter(|&ch| run.readable(ch));
        let Some(mut ch) = readable.next() else {
            end(&run);
            return 1;
        };
        let mut runs = 0;
        for other in readable {
            let mut next = run.clone();
            next.deliver(ch);
            runs += explore(next, end);
            ch = other;
        }
        run.deliver(ch);
        runs + explore(run, end)
    }

    /// Explores every schedule of every choice of `channels` scripts (as a multiset:
    /// the channels are interchangeable).
    fn explore_all(
        mode: CheckpointingMode,
        channels: usize,
        scripts: &[Vec<Event>],
        end: &mut dyn FnMut(&Run),
    ) -> usize {
        let mut choice = vec![0; channels];
        let mut runs = 0;
        loop {
            let chosen: Vec<Vec<Event>> = choice.iter().map(|&i| scripts[i].clone()).collect();
            runs += explore(Run::new(mode, &chosen), end);
            // The next non-decreasing choice.
            let Some(k) = (0..channels).rev().find(|&k| choice[k] + 1 < scripts.len()) else {
                return runs;
            };
            let value = choice[k] + 1;
            choice[k..].fill(value);
        }
    }

    #[test]
    fn every_schedule_of_two_channels_over_three_checkpoints() {
        // Barriers, cancel markers, skipped checkpoints and ends, in both modes.
        let scripts = channel_scripts(3, true, true);
        for mode in [ExactlyOnce, AtLeastOnce] {
            let runs = explore_all(mode, 2, &scripts, &mut |run| run.check_end());
            assert!(runs > 10_000, "{runs}");
        }
    }

    #[test]
    fn every_schedule_of_three_channels_over_two_checkpoints() {
        let scripts = channel_scripts(2, true, true);
        for mode in [ExactlyOnce, AtLeastOnce] {
            let runs = explore_all(mode, 3, &scripts, &mut |run| run.check_end());
            assert!(runs > 10_000, "{runs}");
        }
    }

    #[test]
    fn every_schedule_of_three_channels_over_three_checkpoints_with_cancel_markers() {
        let scripts: Vec<_> = channel_scripts(3, true, false)
            .into_iter()
            .filter(|s| s.last() == Some(&Event::Record))
            .collect();
        assert_eq!(scripts.len(), 8);
        for mode in [ExactlyOnce, AtLeastOnce] {
            let runs = explore_all(mode, 3, &scripts, &mut |run| run.check_end());
            assert!(runs > 10_000, "{runs}");
        }
    }

    #[test]
    fn at_least_once_lagging_channels_take_every_checkpoint_in_order() {
        let scripts = channel_scripts(3, false, false);
        let (open, ending): (Vec<_>, Vec<_>) = scripts
            .into_iter()
            .partition(|s| s.last() == Some(&Event::Record));
        // Without ends: every checkpoint is taken, none aborted, whatever the skew.
        let runs = explore_all(AtLeastOnce, 3, &open, &mut |run| {
            run.check_end();
            assert_eq!(run.triggered, [1, 2, 3], "{:?}", run.trace);
            assert!(run.aborted.is_empty(), "{:?}", run.trace);
        });
        assert_eq!(runs, 34_650); // 12! / (4!)^3
        // With ends too, and exactly-once under the same skew.
        let mut all = open;
        all.extend(ending);
        for mode in [ExactlyOnce, AtLeastOnce] {
            let runs = explore_all(mode, 3, &all, &mut |run| run.check_end());
            assert!(runs > 1_000, "{runs}");
        }
    }
}
