//! Barrier alignment: deciding, from the barriers and cancel markers that arrive on a
//! task's input channels, when the task takes a checkpoint.
//!
//! This is a pure state machine (no I/O): the input gate feeds it what arrived and does
//! what the returned [`AlignAction`] says.
//!
//! In **exactly-once** mode a channel that delivered barrier *n* is blocked until every
//! other open channel delivered *n* too; records behind the barrier wait, so the
//! checkpoint contains exactly the records before barrier *n* from every channel. In
//! **at-least-once** mode nothing is blocked: the checkpoint is taken when the last
//! channel's barrier arrives, and records that overtook a barrier on faster channels
//! are replayed after a restore (hence "at least once").

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
    /// Checkpoints to abort (decline, and forward a cancel marker), oldest first.
    pub abort: Vec<u64>,
    /// Block this channel until the alignment ends.
    pub block: Option<usize>,
    /// Take this checkpoint now.
    pub trigger: Option<u64>,
    /// The alignment ended: unblock every channel.
    pub unblock_all: bool,
}

/// Tracks barrier alignment over `channels` input channels.
#[derive(Debug, Clone)]
pub struct BarrierAligner {
    mode: CheckpointingMode,
    ended: Vec<bool>,
    /// Checkpoint currently being aligned and which channels delivered its barrier.
    pending: Option<(u64, Vec<bool>)>,
    /// Highest checkpoint id triggered or aborted; older barriers are ignored.
    last_handled: Option<u64>,
}

impl BarrierAligner {
    /// An aligner for `channels` channels.
    pub fn new(channels: usize, mode: CheckpointingMode) -> Self {
        BarrierAligner {
            mode,
            ended: vec![false; channels],
            pending: None,
            last_handled: None,
        }
    }

    /// The checkpoint being aligned, if any.
    pub fn pending(&self) -> Option<u64> {
        self.pending.as_ref().map(|(id, _)| *id)
    }

    fn is_stale(&self, id: u64) -> bool {
        self.last_handled.is_some_and(|last| id <= last)
    }

    /// Barrier `id` arrived on `channel`.
    pub fn on_barrier(&mut self, channel: usize, id: u64) -> AlignAction {
        let mut action = AlignAction::default();
        if self.is_stale(id) {
            return action;
        }
        match &self.pending {
            Some((current, _)) if *current > id => return action,
            Some((current, _)) if *current < id => {
                // A newer checkpoint overtook the one being aligned: give that one up.
                action.abort.push(*current);
                action.unblock_all = true;
                self.last_handled = Some(*current);
                self.pending = None;
            }
            _ => {}
        }
        let channels = self.ended.len();
        let (_, received) = self
            .pending
            .get_or_insert_with(|| (id, vec![false; channels]));
        received[channel] = true;
        if self.all_received() {
            self.pending = None;
            self.last_handled = Some(id);
            action.trigger = Some(id);
            action.unblock_all = true;
            action.block = None;
        } else if self.mode == CheckpointingMode::ExactlyOnce {
            action.block = Some(channel);
        }
        action
    }

    /// A cancel marker for checkpoint `id` arrived on `channel`: an upstream task
    /// declined it, so its barrier will never come.
    pub fn on_cancel_marker(&mut self, _channel: usize, id: u64) -> AlignAction {
        let mut action = AlignAction::default();
        if self.is_stale(id) {
            return action;
        }
        match self.pending() {
            Some(current) if current > id => return action,
            Some(current) => {
                if current < id {
                    action.abort.push(current);
                }
                self.pending = None;
                action.unblock_all = true;
            }
            None => {}
        }
        action.abort.push(id);
        self.last_handled = Some(id);
        action
    }

    /// `channel` ended: it will deliver no more barriers, so alignment no longer waits
    /// for it.
    pub fn on_end_of_partition(&mut self, channel: usize) -> AlignAction {
        self.ended[channel] = true;
        let mut action = AlignAction::default();
        if let Some((id, _)) = &self.pending {
            let id = *id;
            if self.all_received() {
                self.pending = None;
                self.last_handled = Some(id);
                action.trigger = Some(id);
                action.unblock_all = true;
            }
        }
        action
    }

    fn all_received(&self) -> bool {
        let Some((_, received)) = &self.pending else {
            return false;
        };
        received
            .iter()
            .zip(&self.ended)
            .all(|(&got, &ended)| got || ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                let mut a = BarrierAligner::new(n, CheckpointingMode::ExactlyOnce);
                let mut blocked = vec![false; n];
                let mut triggers = 0;
                for (step, &ch) in order.iter().enumerate() {
                    assert!(!blocked[ch]);
                    let act = a.on_barrier(ch, 7);
                    assert!(act.abort.is_empty());
                    if step + 1 < n {
                        assert_eq!(act.block, Some(ch));
                        assert_eq!(act.trigger, None);
                        blocked[ch] = true;
                    } else {
                        assert_eq!(act.trigger, Some(7));
                        assert!(act.unblock_all);
                        triggers += 1;
                    }
                }
                assert_eq!(triggers, 1);
                assert_eq!(a.pending(), None);
                // A late duplicate of the same barrier changes nothing.
                assert_eq!(a.on_barrier(order[0], 7), AlignAction::default());
            }
        }
    }

    #[test]
    fn at_least_once_never_blocks_and_triggers_on_the_last_barrier() {
        for order in permutations(4) {
            let mut a = BarrierAligner::new(4, CheckpointingMode::AtLeastOnce);
            for (step, &ch) in order.iter().enumerate() {
                let act = a.on_barrier(ch, 1);
                assert_eq!(act.block, None);
                assert_eq!(act.trigger, (step == 3).then_some(1));
            }
        }
    }

    #[test]
    fn a_newer_barrier_aborts_the_pending_alignment() {
        let mut a = BarrierAligner::new(3, CheckpointingMode::ExactlyOnce);
        assert_eq!(a.on_barrier(0, 1).block, Some(0));
        let act = a.on_barrier(1, 2);
        assert_eq!(act.abort, vec![1]);
        assert!(act.unblock_all);
        assert_eq!(act.block, Some(1));
        assert_eq!(a.pending(), Some(2));
        // The old barrier arriving late is ignored.
        assert_eq!(a.on_barrier(2, 1), AlignAction::default());
        assert_eq!(a.on_barrier(0, 2).block, Some(0));
        assert_eq!(a.on_barrier(2, 2).trigger, Some(2));
    }

    #[test]
    fn cancel_marker_aborts_and_unblocks() {
        let mut a = BarrierAligner::new(2, CheckpointingMode::ExactlyOnce);
        a.on_barrier(0, 5);
        let act = a.on_cancel_marker(1, 5);
        assert_eq!(act.abort, vec![5]);
        assert!(act.unblock_all);
        assert_eq!(a.pending(), None);
        // The barrier of the aborted checkpoint, arriving later, is ignored.
        assert_eq!(a.on_barrier(1, 5), AlignAction::default());
        // A cancel marker for a checkpoint no barrier announced yet still aborts it.
        assert_eq!(a.on_cancel_marker(0, 6).abort, vec![6]);
        assert_eq!(a.on_barrier(1, 6), AlignAction::default());
    }

    #[test]
    fn cancel_marker_for_a_newer_checkpoint_aborts_both() {
        let mut a = BarrierAligner::new(2, CheckpointingMode::ExactlyOnce);
        a.on_barrier(0, 3);
        let act = a.on_cancel_marker(1, 4);
        assert_eq!(act.abort, vec![3, 4]);
        assert!(act.unblock_all);
    }

    #[test]
    fn an_ended_channel_is_not_waited_for() {
        let mut a = BarrierAligner::new(3, CheckpointingMode::ExactlyOnce);
        a.on_barrier(0, 1);
        a.on_barrier(1, 1);
        let act = a.on_end_of_partition(2);
        assert_eq!(act.trigger, Some(1));
        assert!(act.unblock_all);
        // With channel 2 gone, the next checkpoint needs only channels 0 and 1.
        assert_eq!(a.on_barrier(1, 2).block, Some(1));
        assert_eq!(a.on_barrier(0, 2).trigger, Some(2));
    }
}
