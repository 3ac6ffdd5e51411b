//! The example plugins' logic as native Rust operators over the same flat batch layout:
//! the baseline that benchmarks measure Wasm against. Each reads a batch with
//! `BatchReader` and writes its output with `BatchWriter`, exactly like the plugins do
//! through the SDK. `count` keeps its counts in a `HashMap`, as native code would;
//! `keyed_count` keeps them in the host's keyed state backend, as a native operator must
//! for its state to be checkpointed.

use std::collections::HashMap;

use sluice::chain::{CallError, CallOutput, OpenInfo, Operator, OperatorIdentity, OperatorState};
use sluice::state::{KeyedStateBackend, StateDescriptor, StateKind};
use sluice_codec::{BatchReader, BatchWriter, RecordRef};

fn identity(name: &str) -> OperatorIdentity {
    OperatorIdentity {
        tenant: "bench".into(),
        job: "bench".into(),
        operator: name.into(),
        subtask: 0,
        parallelism: 1,
    }
}

/// A native operator: a per-batch function from records to records.
pub struct Native<F> {
    identity: OperatorIdentity,
    state: OperatorState,
    f: F,
}

impl<F: FnMut(RecordRef<'_>, &mut BatchWriter) + Send> Native<F> {
    /// An operator named `name` applying `f` to every record.
    pub fn new(name: &str, f: F) -> Self {
        Native {
            identity: identity(name),
            state: OperatorState::new(None),
            f,
        }
    }
}

impl<F: FnMut(RecordRef<'_>, &mut BatchWriter) + Send> Operator for Native<F> {
    fn identity(&self) -> &OperatorIdentity {
        &self.identity
    }
    fn state(&mut self) -> &mut OperatorState {
        &mut self.state
    }
    fn open(&mut self, _info: &OpenInfo) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }
    fn process(&mut self, records: &[u8]) -> Result<CallOutput, CallError> {
        let mut out = BatchWriter::with_capacity(records.len());
        for record in BatchReader::new(records) {
            let record = record.map_err(|e| CallError::Failed(e.to_string()))?;
            (self.f)(record, &mut out);
        }
        Ok(CallOutput {
            records: out.into_bytes(),
            effects: Vec::new(),
        })
    }
    fn process_watermark(&mut self, _watermark: i64) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }
    fn on_timers(&mut self, _timers: &[u8]) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }
    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, CallError> {
        Ok(Vec::new())
    }
    fn notify_complete(&mut self, _checkpoint_id: u64) -> Result<(), CallError> {
        Ok(())
    }
    fn notify_aborted(&mut self, _checkpoint_id: u64) -> Result<(), CallError> {
        Ok(())
    }
    fn finish(&mut self) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }
    fn close(&mut self) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }
    fn dispose(&mut self) -> Result<(), CallError> {
        Ok(())
    }
}

/// `tokenize` with `min-length` as a native operator.
pub fn tokenize(min_length: usize) -> impl Operator {
    Native::new(
        "tokenize",
        move |r: RecordRef<'_>, out: &mut BatchWriter| {
            let Ok(line) = std::str::from_utf8(r.value) else {
                return;
            };
            for word in line.split(|c: char| !c.is_alphanumeric()) {
                if word.is_empty() || word.chars().count() < min_length {
                    continue;
                }
                if word
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                {
                    out.push(Some(word.as_bytes()), word.as_bytes(), r.timestamp);
                } else {
                    let word = word.to_lowercase();
                    out.push(Some(word.as_bytes()), word.as_bytes(), r.timestamp);
                }
            }
        },
    )
}

/// `filter` with `none-of` as a native operator.
pub fn filter_none_of(words: &[&str]) -> impl Operator {
    let words: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
    Native::new("filter", move |r: RecordRef<'_>, out: &mut BatchWriter| {
        if !words.iter().any(|w| w == r.value) {
            out.push_record(r);
        }
    })
}

/// `count` as a native operator (counts in a `HashMap`, emitted as decimal text).
pub fn count() -> impl Operator {
    let mut counts: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut text = itoa::Buffer::new();
    Native::new("count", move |r: RecordRef<'_>, out: &mut BatchWriter| {
        let key = r.key.unwrap_or_default();
        let c = match counts.get_mut(key) {
            Some(c) => c,
            None => counts.entry(key.to_vec()).or_insert(0),
        };
        *c += 1;
        out.push(Some(key), text.format(*c).as_bytes(), r.timestamp);
    })
}

/// `count` over the host's keyed state backend (a value state read and written per
/// record), like a native Sluice operator whose counts are checkpointed with the job.
pub fn keyed_count(max_parallelism: u32) -> impl Operator {
    let mut backend = KeyedStateBackend::new(max_parallelism, 0..max_parallelism);
    let id = backend
        .declare(StateDescriptor {
            name: "count".into(),
            kind: StateKind::Value,
            ttl_ms: None,
        })
        .expect("a fresh backend");
    let mut text = itoa::Buffer::new();
    Native::new("count", move |r: RecordRef<'_>, out: &mut BatchWriter| {
        let key = r.key.unwrap_or_default();
        let old = backend.get(id, key, &[], 0).expect("declared state");
        let count = old.map_or(0, |v| {
            u64::from_le_bytes(v[..].try_into().unwrap_or_default())
        }) + 1;
        backend
            .put(id, key, &[], &count.to_le_bytes(), 0)
            .expect("declared state");
        out.push(Some(key), text.format(count).as_bytes(), r.timestamp);
    })
}

/// A sink that drops what it gets (so a benchmark measures the operators, not I/O).
pub fn discard() -> impl Operator {
    Native::new("sink", |_r: RecordRef<'_>, _out: &mut BatchWriter| {})
}

/// A source replaying prepared batches, for benchmarks of the task loop.
pub struct ReplaySource {
    batches: std::sync::Arc<Vec<(Vec<u8>, usize)>>,
    next: usize,
}

impl ReplaySource {
    /// Replays `batches` once.
    pub fn new(batches: std::sync::Arc<Vec<(Vec<u8>, usize)>>) -> Self {
        ReplaySource { batches, next: 0 }
    }
}

impl sluice::connectors::Source for ReplaySource {
    fn poll(
        &mut self,
        out: &mut BatchWriter,
        _max: usize,
    ) -> anyhow::Result<sluice::connectors::SourceStatus> {
        match self.batches.get(self.next) {
            Some((bytes, n)) => {
                out.extend_encoded(bytes, *n);
                self.next += 1;
                Ok(sluice::connectors::SourceStatus::More)
            }
            None => Ok(sluice::connectors::SourceStatus::End),
        }
    }
    fn position(&self) -> Vec<u8> {
        (self.next as u64).to_le_bytes().to_vec()
    }
    fn seek(&mut self, _position: &[u8]) -> anyhow::Result<()> {
        Ok(())
    }
}

/// A keyed tumbling event-time window summing field 2 of `ts,key,value` records, as a
/// native operator: the baseline for the window plugin. Windows live in a `HashMap` and
/// fire when the watermark passes their end; records of windows that already fired are
/// dropped.
pub struct TumblingSum {
    identity: OperatorIdentity,
    state: OperatorState,
    size: i64,
    watermark: i64,
    windows: HashMap<(Vec<u8>, i64), f64>,
}

impl TumblingSum {
    /// Windows of `size` milliseconds.
    pub fn new(size: i64) -> Self {
        TumblingSum {
            identity: identity("window"),
            state: OperatorState::new(None),
            size,
            watermark: i64::MIN,
            windows: HashMap::new(),
        }
    }
}

impl Operator for TumblingSum {
    fn identity(&self) -> &OperatorIdentity {
        &self.identity
    }
    fn state(&mut self) -> &mut OperatorState {
        &mut self.state
    }
    fn open(&mut self, _info: &OpenInfo) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }
    fn process(&mut self, records: &[u8]) -> Result<CallOutput, CallError> {
        for record in BatchReader::new(records) {
            let r = record.map_err(|e| CallError::Failed(e.to_string()))?;
            let ts = r.timestamp.unwrap_or(0);
            let start = ts - ts.rem_euclid(self.size);
            if start + self.size - 1 <= self.watermark {
                continue;
            }
            let value: f64 = std::str::from_utf8(r.value)
                .ok()
                .and_then(|v| v.split(',').nth(2))
                .and_then(|f| f.parse().ok())
                .unwrap_or(0.0);
            let key = r.key.unwrap_or_default();
            match self.windows.get_mut(&(key.to_vec(), start)) {
                Some(sum) => *sum += value,
                None => {
                    self.windows.insert((key.to_vec(), start), value);
                }
            }
        }
        Ok(CallOutput::default())
    }
    fn process_watermark(&mut self, watermark: i64) -> Result<CallOutput, CallError> {
        self.watermark = watermark;
        let size = self.size;
        let mut out = BatchWriter::new();
        self.windows.retain(|(key, start), sum| {
            let fire = start + size - 1 <= watermark;
            if fire {
                let value = format!("{start},{},{sum}", start + size);
                out.push(Some(key), value.as_bytes(), Some(start + size - 1));
            }
            !fire
        });
        Ok(CallOutput {
            records: out.into_bytes(),
            effects: Vec::new(),
        })
    }
    fn on_timers(&mut self, _timers: &[u8]) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }
    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, CallError> {
        Ok(Vec::new())
    }
    fn notify_complete(&mut self, _checkpoint_id: u64) -> Result<(), CallError> {
        Ok(())
    }
    fn notify_aborted(&mut self, _checkpoint_id: u64) -> Result<(), CallError> {
        Ok(())
    }
    fn finish(&mut self) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }
    fn close(&mut self) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }
    fn dispose(&mut self) -> Result<(), CallError> {
        Ok(())
    }
}
