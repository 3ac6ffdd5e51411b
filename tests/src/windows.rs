//! An independent model of event-time windows, written from the rules Sluice follows
//! (Flink's): watermark = max timestamp − bound − 1 after each record (as Flink's
//! `BoundedOutOfOrdernessWatermarks` with one watermark per record, whatever the batch
//! size); a window is
//! late when `max_timestamp + allowed_lateness <= watermark`; a record all of whose windows
//! are late is dropped, and counted when `timestamp + allowed_lateness <= watermark`;
//! windows fire when the watermark reaches their `max_timestamp` (late records within the
//! allowed lateness fire again at once) and are purged at `max_timestamp + lateness`;
//! sessions merge when they touch. Tests compare what the `window` plugin produces with
//! what this model says.

use std::collections::{BTreeMap, BTreeSet};

/// One input event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Event time (ms).
    pub ts: i64,
    /// Key.
    pub key: String,
    /// Value.
    pub value: f64,
}

impl Event {
    /// The event as the CSV line sources read: `ts,key,value`.
    pub fn line(&self) -> String {
        format!("{},{},{}", self.ts, self.key, self.value)
    }
}

/// Window kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Fixed, non-overlapping.
    Tumbling {
        /// Length.
        size: i64,
    },
    /// Fixed, overlapping.
    Sliding {
        /// Length.
        size: i64,
        /// Distance between starts.
        slide: i64,
    },
    /// Per key, closed after `gap` without events.
    Session {
        /// Inactivity gap.
        gap: i64,
    },
}

/// Aggregations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    /// Number of events.
    Count,
    /// Sum of values.
    Sum,
    /// Smallest value.
    Min,
    /// Largest value.
    Max,
}

#[derive(Debug, Clone, Copy)]
struct Acc {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Acc {
    fn new() -> Self {
        Acc {
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }
    fn add(&mut self, v: f64) {
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
    fn merge(&mut self, o: &Acc) {
        self.count += o.count;
        self.sum += o.sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }
    fn result(&self, a: Aggregate) -> String {
        match a {
            Aggregate::Count => self.count.to_string(),
            Aggregate::Sum => format!("{}", self.sum),
            Aggregate::Min => format!("{}", self.min),
            Aggregate::Max => format!("{}", self.max),
        }
    }
}

/// What the model expects: the output lines (`key<TAB>start,end,result`, sorted) and the
/// number of dropped late records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Sorted output lines.
    pub lines: Vec<String>,
    /// Late records dropped.
    pub dropped: u64,
}

struct Model {
    kind: Kind,
    aggregate: Aggregate,
    lateness: i64,
    wm: i64,
    /// Per key: windows `(start, end)` and their accumulators.
    windows: BTreeMap<String, BTreeMap<(i64, i64), Acc>>,
    timers: BTreeSet<(i64, String)>,
    out: Vec<String>,
    dropped: u64,
}

impl Model {
    fn emit(&mut self, key: &str, w: (i64, i64)) {
        let acc = self.windows[key][&w];
        self.out.push(format!(
            "{key}\t{},{},{}",
            w.0,
            w.1,
            acc.result(self.aggregate)
        ));
    }

    fn late(&self, w: (i64, i64)) -> bool {
        w.1 - 1 + self.lateness <= self.wm
    }

    fn trigger(&mut self, key: &str, w: (i64, i64)) {
        if w.1 - 1 <= self.wm {
            self.emit(key, w);
        } else {
            self.timers.insert((w.1 - 1, key.to_string()));
        }
        self.timers
            .insert((w.1 - 1 + self.lateness, key.to_string()));
    }

    fn assign(&self, ts: i64) -> Vec<(i64, i64)> {
        match self.kind {
            Kind::Tumbling { size } => {
                let start = ts - ts.rem_euclid(size);
                vec![(start, start + size)]
            }
            Kind::Sliding { size, slide } => {
                let mut start = ts - ts.rem_euclid(slide);
                let mut out = vec![];
                while start > ts - size {
                    out.push((start, start + size));
                    start -= slide;
                }
                out
            }
            Kind::Session { gap } => vec![(ts, ts + gap)],
        }
    }

    fn process(&mut self, e: &Event) {
        if let Kind::Session { .. } = self.kind {
            return self.process_session(e);
        }
        let mut skipped = true;
        for w in self.assign(e.ts) {
            if self.late(w) {
                continue;
            }
            skipped = false;
            self.windows
                .entry(e.key.clone())
                .or_default()
                .entry(w)
                .or_insert_with(Acc::new)
                .add(e.value);
            self.trigger(&e.key, w);
        }
        if skipped && e.ts + self.lateness <= self.wm {
            self.dropped += 1;
        }
    }

    fn process_session(&mut self, e: &Event) {
        let mut merged = self.assign(e.ts)[0];
        let existing = self.windows.entry(e.key.clone()).or_default();
        let mut absorbed = vec![];
        loop {
            let before = absorbed.len();
            for (&w, _) in existing.iter() {
                let intersects = w.0 <= merged.1 && w.1 >= merged.0;
                if intersects && !absorbed.contains(&w) {
                    absorbed.push(w);
                    merged = (merged.0.min(w.0), merged.1.max(w.1));
                }
            }
            if absorbed.len() == before {
                break;
            }
        }
        if self.late(merged) {
            if e.ts + self.lateness <= self.wm {
                self.dropped += 1;
            }
            return;
        }
        let existing = self.windows.get_mut(&e.key).expect("entry made above");
        let mut acc = Acc::new();
        for w in &absorbed {
            acc.merge(&existing.remove(w).expect("absorbed windows exist"));
        }
        acc.add(e.value);
        existing.insert(merged, acc);
        // Timers of merged-away sessions stay: timers are per key and time, another
        // session may need the same one, and a timer only acts on windows that exist.
        self.trigger(&e.key, merged);
    }

    fn advance(&mut self, wm: i64) {
        if wm <= self.wm {
            return;
        }
        self.wm = wm;
        while let Some((t, key)) = self.timers.first().cloned().filter(|(t, _)| *t <= wm) {
            self.timers.pop_first();
            let windows: Vec<(i64, i64)> = self
                .windows
                .get(&key)
                .map(|ws| ws.keys().copied().collect())
                .unwrap_or_default();
            for w in &windows {
                if w.1 - 1 == t {
                    self.emit(&key, *w);
                }
            }
            for w in &windows {
                if w.1 - 1 + self.lateness == t {
                    self.windows.get_mut(&key).expect("listed").remove(w);
                }
            }
        }
    }
}

/// What a job `source (bound) -> window -> sink` outputs for `events`, at any batch size.
pub fn expected(
    events: &[Event],
    bound: i64,
    kind: Kind,
    aggregate: Aggregate,
    lateness: i64,
) -> Expected {
    expected_in_batches(events, 1, bound, kind, aggregate, lateness)
}

/// What the job outputs when its window sees the watermark only after each source batch
/// of `batch_size` records: a window plugin built for WIT 0.1.0, which gets a batch's
/// watermarks after it.
pub fn expected_in_batches(
    events: &[Event],
    batch_size: usize,
    bound: i64,
    kind: Kind,
    aggregate: Aggregate,
    lateness: i64,
) -> Expected {
    let mut m = Model {
        kind,
        aggregate,
        lateness,
        wm: i64::MIN,
        windows: BTreeMap::new(),
        timers: BTreeSet::new(),
        out: vec![],
        dropped: 0,
    };
    let mut max_ts: Option<i64> = None;
    for batch in events.chunks(batch_size.max(1)) {
        for e in batch {
            m.process(e);
            max_ts = Some(max_ts.map_or(e.ts, |t: i64| t.max(e.ts)));
        }
        if let Some(t) = max_ts {
            m.advance(t - bound - 1);
        }
    }
    m.advance(i64::MAX);
    m.out.sort();
    Expected {
        lines: m.out,
        dropped: m.dropped,
    }
}

/// Events with some out of order within `bound`, and every `late_every`-th one far behind
/// (late beyond the bound), over `keys` keys, values 0–9.
pub fn mixed_events(
    n: usize,
    keys: usize,
    step: i64,
    bound: i64,
    late_every: usize,
    seed: u64,
) -> Vec<Event> {
    let mut state = seed | 1;
    let mut next = move |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % m
    };
    (0..n)
        .map(|i| {
            let in_order = i as i64 * step;
            let ts = if late_every > 0 && i % late_every == late_every - 1 {
                in_order - 5 * bound - next(bound as u64) as i64
            } else {
                in_order - next(bound as u64) as i64
            };
            Event {
                ts,
                key: format!("k{}", next(keys as u64)),
                value: next(10) as f64,
            }
        })
        .collect()
}
