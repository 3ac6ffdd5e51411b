//! The receiving side of a task: reads its input channels, combines their watermarks,
//! aligns their barriers.

use std::collections::VecDeque;
use std::time::Instant;

use anyhow::Result;
use crossbeam_channel::{Receiver, Select, TryRecvError};

use super::alignment::{AlignAction, BarrierAligner, CheckpointingMode};
use super::{Barrier, BatchWatermark, StreamElement, StreamStatus, push_batch_watermark};

/// An input channel closed without its end-of-partition marker: the subtask feeding it
/// failed. A consequence of another task's failure, never the cause of a job's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamFailed {
    /// The input channel.
    pub channel: usize,
}

impl std::fmt::Display for UpstreamFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "input channel {} closed without end of partition: its upstream subtask failed",
            self.channel
        )
    }
}

impl std::error::Error for UpstreamFailed {}

/// What the task should do next with its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateEvent {
    /// Process these records.
    Records {
        /// The input of the task's head they belong to.
        input: u32,
        /// Encoded records.
        bytes: Vec<u8>,
        /// How many.
        count: u32,
        /// Where the combined watermark advanced among them.
        watermarks: Vec<BatchWatermark>,
    },
    /// The combined watermark of all inputs advanced.
    Watermark(i64),
    /// All inputs delivered this barrier (aligned): take the checkpoint.
    Checkpoint(Barrier),
    /// The checkpoint was aborted upstream or overtaken: decline it.
    AbortCheckpoint(u64),
    /// All inputs became idle, or one became active again.
    Status(StreamStatus),
    /// Every input ended.
    EndOfInput,
}

struct InputChannel {
    rx: Receiver<StreamElement>,
    /// The input of the task's head it feeds.
    input: u32,
    watermark: i64,
    blocked: bool,
    /// End of data: no records or watermarks come any more (barriers may).
    data_ended: bool,
    /// End of partition: nothing comes any more.
    ended: bool,
    idle: bool,
}

/// The inputs of a task: one channel per upstream subtask of every edge it reads, each
/// labelled with the input of the task's head it feeds. Barriers align across all of
/// them (Flink's several input gates of a two- or multiple-input task), and the
/// watermark is their minimum: per input the minimum of its channels, and the operator's
/// the minimum of its inputs', idle ones left out.
pub struct InputGate {
    channels: Vec<InputChannel>,
    next: usize,
    watermark: i64,
    aligner: BarrierAligner,
    queued: VecDeque<GateEvent>,
    end_reported: bool,
    /// The status last reported to the task.
    status: StreamStatus,
}

impl InputGate {
    /// A gate over `inputs`, all of input 0, aligning barriers as `mode` says.
    pub fn new(inputs: Vec<Receiver<StreamElement>>, mode: CheckpointingMode) -> Self {
        Self::with_inputs(inputs.into_iter().map(|rx| (0, rx)).collect(), mode)
    }

    /// A gate over `channels`, each with the input it feeds.
    pub fn with_inputs(
        channels: Vec<(u32, Receiver<StreamElement>)>,
        mode: CheckpointingMode,
    ) -> Self {
        let n = channels.len();
        InputGate {
            channels: channels
                .into_iter()
                .map(|(input, rx)| InputChannel {
                    rx,
                    input,
                    watermark: i64::MIN,
                    blocked: false,
                    data_ended: false,
                    ended: false,
                    idle: false,
                })
                .collect(),
            next: 0,
            watermark: i64::MIN,
            aligner: BarrierAligner::new(n, mode),
            queued: VecDeque::new(),
            end_reported: false,
            status: StreamStatus::Active,
        }
    }

    /// Number of input channels.
    pub fn len(&self) -> usize {
        self.channels.len()
    }

    /// True when the gate has no channels.
    pub fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }

    /// True once every channel ended: nothing, not even a barrier, comes any more.
    pub fn is_ended(&self) -> bool {
        self.channels.iter().all(|c| c.ended)
    }

    /// The combined watermark: the minimum over all channels.
    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    /// The next event, or `None` when no channel has anything right now.
    pub fn poll(&mut self) -> Result<Option<GateEvent>> {
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Ok(Some(event));
            }
            // Once every channel's data ended the task finishes; barriers of its final
            // checkpoint still come until the channels end.
            if !self.end_reported && self.channels.iter().all(|c| c.data_ended) {
                self.end_reported = true;
                return Ok(Some(GateEvent::EndOfInput));
            }
            if self.channels.iter().all(|c| c.ended) {
                return Ok(None);
            }
            let n = self.channels.len();
            let mut found = None;
            for k in 0..n {
                let i = (self.next + k) % n;
                let c = &self.channels[i];
                if c.ended || c.blocked {
                    continue;
                }
                match c.rx.try_recv() {
                    Ok(element) => {
                        found = Some((i, element));
                        break;
                    }
                    Err(TryRecvError::Empty) => {}
                    Err(TryRecvError::Disconnected) => {
                        return Err(UpstreamFailed { channel: i }.into());
                    }
                }
            }
            let Some((i, element)) = found else {
                return Ok(None);
            };
            self.next = (i + 1) % n;
            if let Some(event) = self.handle(i, element) {
                return Ok(Some(event));
            }
        }
    }

    fn handle(&mut self, i: usize, element: StreamElement) -> Option<GateEvent> {
        match element {
            StreamElement::Records {
                bytes,
                count,
                watermarks,
            } => {
                if self.channels[i].idle {
                    // Records mean the channel is active, whatever it said before.
                    self.set_idle(i, false);
                }
                // The channel's watermarks among its records, as the combined watermark.
                let mut combined = Vec::new();
                for w in watermarks {
                    let c = &mut self.channels[i];
                    c.watermark = c.watermark.max(w.watermark);
                    if let Some(min) = self.combined_watermark()
                        && min > self.watermark
                    {
                        self.watermark = min;
                        push_batch_watermark(&mut combined, w.before, min);
                    }
                }
                self.queued.push_back(GateEvent::Records {
                    input: self.channels[i].input,
                    bytes,
                    count,
                    watermarks: combined,
                });
                None
            }
            StreamElement::Status(status) => {
                self.set_idle(i, status == StreamStatus::Idle);
                None
            }
            StreamElement::Watermark(w) => {
                let c = &mut self.channels[i];
                c.watermark = c.watermark.max(w);
                self.advance_watermark()
            }
            StreamElement::Barrier(b) => {
                let action = self.aligner.on_barrier(i, b);
                self.apply(action);
                None
            }
            StreamElement::CancelMarker(id) => {
                let action = self.aligner.on_cancel_marker(i, id);
                self.apply(action);
                None
            }
            StreamElement::EndOfData => {
                self.channels[i].data_ended = true;
                // A channel without data no longer holds the combined watermark back,
                // nor keeps the gate active.
                self.set_idle(i, false);
                None
            }
            StreamElement::EndOfPartition => {
                self.channels[i].data_ended = true;
                self.channels[i].ended = true;
                self.channels[i].blocked = false;
                let action = self.aligner.on_end_of_partition(i);
                self.apply(action);
                // An ended channel no longer holds the combined watermark back, nor keeps
                // the gate active.
                self.set_idle(i, false);
                None
            }
        }
    }

    /// Marks channel `i` idle or active; reports a change of the gate's own status (idle
    /// when every open channel is idle) and a watermark the change lets advance.
    fn set_idle(&mut self, i: usize, idle: bool) {
        self.channels[i].idle = idle;
        let open = self.channels.iter().filter(|c| !c.data_ended);
        let status = if open.clone().count() > 0 && open.clone().all(|c| c.idle) {
            StreamStatus::Idle
        } else {
            StreamStatus::Active
        };
        if status != self.status {
            self.status = status;
            self.queued.push_back(GateEvent::Status(status));
        }
        if let Some(w) = self.advance_watermark() {
            self.queued.push_back(w);
        }
    }

    /// The combined watermark: the minimum over the channels that count — every channel
    /// but the idle ones. An ended channel keeps the last watermark it sent (a source
    /// sends the maximum before it ends, unless it was stopped without draining, when event
    /// time must not jump to the end).
    fn advance_watermark(&mut self) -> Option<GateEvent> {
        let min = self.combined_watermark()?;
        if min > self.watermark {
            self.watermark = min;
            Some(GateEvent::Watermark(min))
        } else {
            None
        }
    }

    /// The minimum over the channels that count, if there is one yet.
    fn combined_watermark(&self) -> Option<i64> {
        self.channels
            .iter()
            .filter(|c| c.data_ended || !c.idle)
            .map(|c| c.watermark)
            .min()
            .filter(|&min| min != i64::MIN)
    }

    fn apply(&mut self, action: AlignAction) {
        for id in action.abort {
            self.queued.push_back(GateEvent::AbortCheckpoint(id));
        }
        if action.unblock_all {
            for c in &mut self.channels {
                c.blocked = false;
            }
        }
        if let Some(i) = action.block {
            self.channels[i].blocked = true;
        }
        if let Some(barrier) = action.trigger {
            self.queued.push_back(GateEvent::Checkpoint(barrier));
        }
    }

    /// Blocks until a channel that may be read has an element, `doorbell` rings, or
    /// `deadline` passes.
    pub fn wait(&self, doorbell: &Receiver<()>, deadline: Option<Instant>) {
        let mut sel = Select::new();
        sel.recv(doorbell);
        for c in &self.channels {
            if !c.ended && !c.blocked {
                sel.recv(&c.rx);
            }
        }
        match deadline {
            Some(d) => {
                let _ = sel.ready_deadline(d);
            }
            None => {
                sel.ready();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::{CheckpointKind, channel};

    fn barrier(id: u64) -> StreamElement {
        StreamElement::Barrier(checkpoint_barrier(id))
    }

    /// Barrier `id`, with a timestamp that tells it apart from the others.
    fn checkpoint_barrier(id: u64) -> Barrier {
        Barrier {
            id,
            timestamp: 1000 + id as i64,
            kind: CheckpointKind::Checkpoint,
        }
    }

    fn records(tag: u8) -> StreamElement {
        StreamElement::Records {
            bytes: vec![tag],
            count: 1,
            watermarks: Vec::new(),
        }
    }

    fn drain(gate: &mut InputGate) -> Vec<GateEvent> {
        let mut out = vec![];
        while let Some(e) = gate.poll().unwrap() {
            out.push(e);
        }
        out
    }

    #[test]
    fn combined_watermark_is_the_minimum_and_ends_with_the_maximum_sources_send() {
        let (t0, r0) = channel(8);
        let (t1, r1) = channel(8);
        let mut gate = InputGate::new(vec![r0, r1], CheckpointingMode::ExactlyOnce);
        t0.send(StreamElement::Watermark(10)).unwrap();
        assert_eq!(drain(&mut gate), vec![]);
        t1.send(StreamElement::Watermark(5)).unwrap();
        assert_eq!(drain(&mut gate), vec![GateEvent::Watermark(5)]);
        // A bounded input ends with the maximum watermark, then its end.
        t1.send(StreamElement::Watermark(i64::MAX)).unwrap();
        t1.send(StreamElement::EndOfPartition).unwrap();
        assert_eq!(drain(&mut gate), vec![GateEvent::Watermark(10)]);
        t0.send(StreamElement::Watermark(i64::MAX)).unwrap();
        t0.send(StreamElement::EndOfPartition).unwrap();
        assert_eq!(
            drain(&mut gate),
            vec![GateEvent::Watermark(i64::MAX), GateEvent::EndOfInput]
        );
    }

    #[test]
    fn watermarks_inside_batches_become_the_combined_watermark_where_it_advances() {
        let (t0, r0) = channel(8);
        let (t1, r1) = channel(8);
        let mut gate = InputGate::new(vec![r0, r1], CheckpointingMode::ExactlyOnce);
        let at = |before, watermark| BatchWatermark { before, watermark };
        t1.send(StreamElement::Watermark(15)).unwrap();
        assert_eq!(drain(&mut gate), vec![]);
        t0.send(StreamElement::Records {
            bytes: vec![7],
            count: 3,
            watermarks: vec![at(0, 5), at(1, 12), at(2, 20)],
        })
        .unwrap();
        // Channel 1 holds the minimum at 15 once channel 0 passes it.
        assert_eq!(
            drain(&mut gate),
            vec![GateEvent::Records {
                input: 0,
                bytes: vec![7],
                count: 3,
                watermarks: vec![at(0, 5), at(1, 12), at(2, 15)],
            }]
        );
        assert_eq!(gate.watermark(), 15);
        t1.send(StreamElement::Watermark(30)).unwrap();
        assert_eq!(drain(&mut gate), vec![GateEvent::Watermark(20)]);
    }

    #[test]
    fn an_input_ended_without_the_maximum_does_not_advance_event_time() {
        // What a stop-with-savepoint without drain sends: no jump to the end of time.
        let (t0, r0) = channel(8);
        let mut gate = InputGate::new(vec![r0], CheckpointingMode::ExactlyOnce);
        t0.send(StreamElement::Watermark(7)).unwrap();
        t0.send(StreamElement::EndOfPartition).unwrap();
        assert_eq!(
            drain(&mut gate),
            vec![GateEvent::Watermark(7), GateEvent::EndOfInput]
        );
    }

    #[test]
    fn records_behind_a_barrier_wait_for_the_alignment() {
        let (t0, r0) = channel(8);
        let (t1, r1) = channel(8);
        let mut gate = InputGate::new(vec![r0, r1], CheckpointingMode::ExactlyOnce);
        t0.send(barrier(1)).unwrap();
        t0.send(records(0xa)).unwrap();
        t1.send(records(0xb)).unwrap();
        // Channel 0 is blocked after its barrier: only channel 1's record comes out.
        assert_eq!(drain(&mut gate), vec![records_event(0xb)]);
        t1.send(barrier(1)).unwrap();
        let events = drain(&mut gate);
        assert!(matches!(
            events[0],
            GateEvent::Checkpoint(Barrier { id: 1, .. })
        ));
        assert_eq!(events[1..], [records_event(0xa)]);
    }

    #[test]
    fn at_least_once_lets_records_overtake() {
        let (t0, r0) = channel(8);
        let (t1, r1) = channel(8);
        let mut gate = InputGate::new(vec![r0, r1], CheckpointingMode::AtLeastOnce);
        t0.send(barrier(1)).unwrap();
        t0.send(records(0xa)).unwrap();
        assert_eq!(drain(&mut gate), vec![records_event(0xa)]);
        t1.send(barrier(1)).unwrap();
        assert!(matches!(
            drain(&mut gate)[..],
            [GateEvent::Checkpoint(Barrier { id: 1, .. })]
        ));
    }

    #[test]
    fn at_least_once_takes_every_checkpoint_a_lagging_channel_catches_up_on() {
        // With several checkpoints in flight, a fast channel delivers barriers 1 and 2
        // before the slow one delivers 1.
        let (t0, r0) = channel(8);
        let (t1, r1) = channel(8);
        let mut gate = InputGate::new(vec![r0, r1], CheckpointingMode::AtLeastOnce);
        let mut events = vec![];
        t0.send(barrier(1)).unwrap();
        t0.send(barrier(2)).unwrap();
        t0.send(records(0xa)).unwrap();
        events.extend(drain(&mut gate));
        t1.send(barrier(1)).unwrap();
        events.extend(drain(&mut gate));
        t1.send(barrier(2)).unwrap();
        events.extend(drain(&mut gate));
        assert_eq!(
            events,
            vec![
                records_event(0xa),
                GateEvent::Checkpoint(checkpoint_barrier(1)),
                GateEvent::Checkpoint(checkpoint_barrier(2)),
            ]
        );
    }

    #[test]
    fn exactly_once_ignores_a_stale_barrier_behind_a_cancel_marker() {
        let (t0, r0) = channel(8);
        let (t1, r1) = channel(8);
        let mut gate = InputGate::new(vec![r0, r1], CheckpointingMode::ExactlyOnce);
        let mut events = vec![];
        t1.send(StreamElement::CancelMarker(1)).unwrap();
        t1.send(barrier(2)).unwrap();
        t1.send(records(0xb)).unwrap();
        events.extend(drain(&mut gate));
        t0.send(barrier(1)).unwrap();
        t0.send(barrier(2)).unwrap();
        t0.send(records(0xa)).unwrap();
        events.extend(drain(&mut gate));
        assert_eq!(
            events,
            vec![
                GateEvent::AbortCheckpoint(1),
                GateEvent::Checkpoint(checkpoint_barrier(2)),
                records_event(0xb),
                records_event(0xa),
            ]
        );
    }

    #[test]
    fn cancel_marker_aborts_and_releases_blocked_channels() {
        let (t0, r0) = channel(8);
        let (t1, r1) = channel(8);
        let mut gate = InputGate::new(vec![r0, r1], CheckpointingMode::ExactlyOnce);
        t0.send(barrier(3)).unwrap();
        t0.send(records(1)).unwrap();
        t1.send(StreamElement::CancelMarker(3)).unwrap();
        assert_eq!(
            drain(&mut gate),
            vec![GateEvent::AbortCheckpoint(3), records_event(1)]
        );
    }

    #[test]
    fn idle_channels_do_not_hold_the_watermark_back() {
        let (t0, r0) = channel(16);
        let (t1, r1) = channel(16);
        let mut gate = InputGate::new(vec![r0, r1], CheckpointingMode::ExactlyOnce);
        t0.send(StreamElement::Watermark(10)).unwrap();
        t1.send(StreamElement::Watermark(5)).unwrap();
        assert_eq!(drain(&mut gate), vec![GateEvent::Watermark(5)]);
        t1.send(StreamElement::Status(StreamStatus::Idle)).unwrap();
        assert_eq!(drain(&mut gate), vec![GateEvent::Watermark(10)]);
        // Channel 1 comes back with records and an older watermark: no regression.
        t1.send(records(1)).unwrap();
        t1.send(StreamElement::Watermark(7)).unwrap();
        assert_eq!(drain(&mut gate), vec![records_event(1)]);
        t0.send(StreamElement::Watermark(20)).unwrap();
        assert_eq!(drain(&mut gate), vec![]);
        t1.send(StreamElement::Watermark(12)).unwrap();
        assert_eq!(drain(&mut gate), vec![GateEvent::Watermark(12)]);
    }

    #[test]
    fn the_gate_is_idle_when_every_open_channel_is() {
        let (t0, r0) = channel(16);
        let (t1, r1) = channel(16);
        let mut gate = InputGate::new(vec![r0, r1], CheckpointingMode::ExactlyOnce);
        t0.send(StreamElement::Status(StreamStatus::Idle)).unwrap();
        assert_eq!(drain(&mut gate), vec![]);
        t1.send(StreamElement::EndOfPartition).unwrap();
        assert_eq!(
            drain(&mut gate),
            vec![GateEvent::Status(StreamStatus::Idle)]
        );
        t0.send(StreamElement::Status(StreamStatus::Active))
            .unwrap();
        assert_eq!(
            drain(&mut gate),
            vec![GateEvent::Status(StreamStatus::Active)]
        );
    }

    fn records_event(tag: u8) -> GateEvent {
        GateEvent::Records {
            input: 0,
            bytes: vec![tag],
            count: 1,
            watermarks: Vec::new(),
        }
    }
}
