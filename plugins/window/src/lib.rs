//! `window`: event-time windows per key, each aggregated to a count, sum, minimum or
//! maximum.
//!
//! The semantics are those of Apache Flink's `WindowOperator` with its `EventTimeTrigger`
//! and allowed lateness: tumbling and sliding windows are assigned like Flink's
//! `TumblingEventTimeWindows` and `SlidingEventTimeWindows`, sessions merge like
//! `EventTimeSessionWindows` in a `MergingWindowSet`, and late records are skipped,
//! re-fire their window or are dropped and counted exactly when Flink would do so.
//!
//! The input must be keyed (`key_by` in the job file) and carry event time (`timestamp` on
//! the source); a record without a timestamp fails the task. Values are UTF-8 CSV lines.
//!
//! # Config
//!
//! - `kind`: `tumbling` (default), `sliding` or `session`.
//! - `size-ms`: length of a window (tumbling and sliding; required, positive).
//! - `slide-ms`: distance between the starts of sliding windows (sliding; required,
//!   positive).
//! - `gap-ms`: session gap (session; required, positive).
//! - `offset-ms` (tumbling and sliding; default 0): shifts where windows start. As in Flink
//!   its absolute value must be less than `size-ms` (tumbling) or `slide-ms` (sliding).
//! - `aggregate`: `count` (default), `sum`, `min` or `max`.
//! - `field` (default 2, counted from 0) and `separator` (default `,`, not empty): the field
//!   of the value that `sum`, `min` and `max` parse as an `f64`; a record whose field is
//!   missing or not a number fails the task. `count` ignores the value.
//! - `allowed-lateness-ms` (default 0, not negative).
//!
//! Unknown keys, and window keys that do not apply to the `kind` (such as `gap-ms` for
//! tumbling windows), are configuration errors.
//!
//! # Output
//!
//! Each firing of a window emits key = the input key, value = `start,end,result` and
//! timestamp = `end - 1`, the window's max timestamp. A `count` is an integer; a `sum`, `min`
//! or `max` is printed with Rust's `f64` `Display` (`6`, `2.5`, `-0.25`).
//!
//! # Semantics
//!
//! A window is `[start, end)` with max timestamp `end - 1`. For a record with event time
//! `ts`:
//!
//! - tumbling: its window starts at `ts - (ts - offset).rem_euclid(size)` (so negative
//!   times and offsets work) and ends `size` later;
//! - sliding: with `last = ts - (ts - offset).rem_euclid(slide)`, its windows start at
//!   `last, last - slide, ...` while `start > ts - size` (that is `size / slide` windows when
//!   the slide divides the size) and each ends `size` after its start;
//! - session: its window is `[ts, ts + gap)`, merged with every session of the key that
//!   intersects it (Flink's `TimeWindow::intersects`, so sessions that only touch merge too),
//!   repeatedly, into one session covering them all whose aggregate combines theirs.
//!
//! With `wm` the watermark when the record arrives and `lateness` the allowed lateness,
//! each window of the record is handled in turn (sliding windows from the latest start
//! down, as Flink's assigner lists them):
//!
//! 1. The window is *late* when `end - 1 + lateness <= wm`: the record skips it.
//! 2. Otherwise the record is added to the window's aggregate. If `end - 1 <= wm` the
//!    window fires at once (a late record within the allowed lateness: every such record
//!    re-emits the window with its updated result); otherwise it fires when the watermark
//!    reaches `end - 1`.
//! 3. The window's state is purged when the watermark reaches `end - 1 + lateness`, after
//!    the window fired if both times are the same.
//!
//! A record that joined no window and is itself late (`ts + lateness <= wm`) is dropped,
//! counted in the counter `late-records-dropped` and sent to the side output `late` (as
//! it came, with its key and timestamp). A session that would be late after
//! merging drops the record and changes nothing; merging away a session deletes its
//! timers.
//!
//! At the end of a bounded input the host advances the watermark to `i64::MAX`, which fires
//! every window still open.
//!
//! # State
//!
//! Everything lives in the host's keyed state, so it is checkpointed, restored and
//! redistributed with the keys: a map state `windows` per key from window start to the
//! window's end and aggregate, and per-key event-time timers at each window's max timestamp
//! and cleanup time (`end - 1 + lateness`, saturating at `i64::MAX`). There is no operator
//! state.

use serde::{Deserialize, Serialize};
use sluice_sdk::{
    Config, Context, Error, MapState, OpenContext, Operator, Record, Result, SideOutput, Timer,
};

// Every config key the operator knows.
sluice_sdk::config_keys!(
    KEYS = [
        "kind",
        "size-ms",
        "slide-ms",
        "gap-ms",
        "offset-ms",
        "aggregate",
        "field",
        "separator",
        "allowed-lateness-ms",
    ]
);

/// The config keys that shape windows; each kind takes only some of them.
const SHAPE_KEYS: &[&str] = &["size-ms", "slide-ms", "gap-ms", "offset-ms"];

/// The counter of records dropped for being late.
const LATE_RECORDS_DROPPED: &str = "late-records-dropped";

/// Which windows a record belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Assigner {
    /// Windows of `size` starting every `slide` (at `offset` plus a multiple of `slide`).
    /// Tumbling windows are the ones whose slide is their size.
    Fixed { size: i64, slide: i64, offset: i64 },
    /// Windows of activity separated by at least `gap` without records.
    Session { gap: i64 },
}

/// What a window computes over its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Aggregate {
    Count,
    Sum,
    Min,
    Max,
}

impl Aggregate {
    /// Combines two values of this aggregate (`Count` keeps no value).
    fn combine(self, a: f64, b: f64) -> f64 {
        match self {
            Aggregate::Count => 0.0,
            Aggregate::Sum => a + b,
            Aggregate::Min => a.min(b),
            Aggregate::Max => a.max(b),
        }
    }
}

/// The state of one window of one key, stored in `windows` under the window's start.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Accumulator {
    /// End of the window (exclusive). Fixed for tumbling and sliding windows; a session
    /// grows when it merges.
    end: i64,
    /// Records in the window.
    count: u64,
    /// Sum, minimum or maximum of the records' values, per `aggregate` (0 for `count`).
    value: f64,
}

/// The operator.
pub struct Window {
    assigner: Assigner,
    aggregate: Aggregate,
    /// The CSV field `sum`, `min` and `max` read, counted from 0.
    field: usize,
    separator: String,
    allowed_lateness: i64,
    /// Where late records go (Flink's `sideOutputLateData`).
    late: SideOutput,
    /// Per key: window start -> the window's end and aggregate.
    windows: MapState<i64, Accumulator>,
    /// The latest window start of the last record of fixed windows: the next record's
    /// too when it falls less than a slide after it, as most do (no division to align).
    last_start: Option<i64>,
}

impl Operator for Window {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let config = ctx.config();
        config.check_known(KEYS)?;
        let assigner = parse_assigner(config)?;
        let aggregate = match config.get("aggregate").unwrap_or("count") {
            "count" => Aggregate::Count,
            "sum" => Aggregate::Sum,
            "min" => Aggregate::Min,
            "max" => Aggregate::Max,
            other => {
                return Err(Error::invalid_config(format!(
                    "config `aggregate` = {other:?}: expected `count`, `sum`, `min` or `max`"
                )));
            }
        };
        let field = config.parse_or("field", 2)?;
        let separator = config.get("separator").unwrap_or(",").to_owned();
        if separator.is_empty() {
            return Err(Error::invalid_config(
                "config `separator` = \"\": must not be empty",
            ));
        }
        let allowed_lateness = config.parse_or("allowed-lateness-ms", 0)?;
        if allowed_lateness < 0 {
            return Err(Error::invalid_config(format!(
                "config `allowed-lateness-ms` = \"{allowed_lateness}\": must not be negative"
            )));
        }
        if !ctx.is_keyed() {
            // Restarting cannot fix the job file, hence a configuration error.
            return Err(Error::invalid_config(
                "window needs keyed input: partition its input with `key_by` in the job file",
            ));
        }
        Ok(Window {
            assigner,
            aggregate,
            field,
            separator,
            allowed_lateness,
            late: ctx.side_output("late")?,
            windows: ctx.map_state("windows")?,
            last_start: None,
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let key = record.require_key()?;
        let ts = record.timestamp.ok_or_else(|| {
            Error::failed(
                "record has no event timestamp: windows need event time \
                 (configure `timestamp` on the source in the job file)",
            )
        })?;
        let value = self.value_of(&record)?;
        let watermark = ctx.current_watermark();
        let added = match self.assigner {
            Assigner::Fixed {
                size,
                slide,
                offset,
            } => {
                let start = window_start_after(self.last_start, ts, offset, slide)
                    .ok_or_else(|| out_of_range(ts))?;
                self.last_start = Some(start);
                let windows =
                    fixed_windows(ts, start, size, slide).ok_or_else(|| out_of_range(ts))?;
                let mut added = false;
                for (start, end) in windows {
                    added |= self.add_to_window(ctx, key, start, end, value)?;
                }
                added
            }
            Assigner::Session { gap } => self.add_to_session(ctx, key, ts, gap, value)?,
        };
        // Flink's `isSkippedElement && isElementLate`.
        if !added && ts.saturating_add(self.allowed_lateness) <= watermark {
            ctx.add_counter(LATE_RECORDS_DROPPED, 1);
            ctx.emit_to(self.late, Some(key), record.value);
        }
        Ok(())
    }

    fn on_timer(&mut self, timer: Timer<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let (key, time) = (timer.key, timer.timestamp);
        // A key's timers are shared by its windows (the host keeps one timer per key and
        // time), so look at every window of the key: first fire those that end here, then
        // purge those whose allowed lateness is over.
        let windows = self.windows.entries(ctx, key)?;
        for (start, acc) in &windows {
            if max_timestamp(acc.end) == time {
                self.emit(ctx, key, *start, acc);
            }
        }
        for (start, acc) in &windows {
            if self.cleanup_time(acc.end) == time {
                self.windows.remove(ctx, key, start)?;
            }
        }
        Ok(())
    }
}

sluice_sdk::export!(Window);

impl Window {
    /// The number `sum`, `min` and `max` aggregate (0 for `count`, which ignores the value).
    fn value_of(&self, record: &Record<'_>) -> Result<f64> {
        if self.aggregate == Aggregate::Count {
            return Ok(0.0);
        }
        // A one-byte separator (the usual case) is found by a plain byte scan, and a
        // whole number read from the bytes: only a field that is not one must be text.
        let field = match self.separator.as_bytes() {
            &[sep] => nth_field(record.value, sep, self.field),
            _ => record
                .value_str()?
                .split(self.separator.as_str())
                .nth(self.field)
                .map(str::as_bytes),
        };
        let text = || String::from_utf8_lossy(record.value);
        let Some(field) = field else {
            return Err(Error::failed(format!(
                "record {:?} has no field {} (fields separated by {:?})",
                text(),
                self.field,
                self.separator
            )));
        };
        parse_number(field).ok_or_else(|| {
            Error::failed(format!(
                "record {:?}: field {} is {:?}, not a number",
                text(),
                self.field,
                String::from_utf8_lossy(field)
            ))
        })
    }

    /// Adds a record to the tumbling or sliding window `[start, end)` unless the window is
    /// late, and triggers the window. Returns whether the record was added.
    fn add_to_window(
        &self,
        ctx: &mut Context<'_>,
        key: &[u8],
        start: i64,
        end: i64,
        value: f64,
    ) -> Result<bool> {
        if self.is_late(ctx, end) {
            return Ok(false);
        }
        let mut new = false;
        let acc = self.windows.update(ctx, key, &start, |acc| {
            Some(match acc {
                Some(acc) => self.add(acc, value),
                None => {
                    new = true;
                    Accumulator {
                        end,
                        count: 1,
                        value,
                    }
                }
            })
        })?;
        let acc = acc.expect("the update sets the window");
        if new {
            self.trigger(ctx, key, start, &acc);
        } else if max_timestamp(acc.end) <= ctx.current_watermark() {
            // A late record within the allowed lateness fires the window again; its
            // timers are registered since the window began (they stay until they fire,
            // and the state is purged by the second).
            self.emit(ctx, key, start, &acc);
        }
        Ok(true)
    }

    /// Adds a record to the key's sessions: its own session `[ts, ts + gap)` absorbs every
    /// session it intersects, until none is left that intersects the cover (Flink's
    /// `MergingWindowSet::addWindow`). Returns whether the record was added (false when the
    /// resulting session is late, which changes nothing).
    fn add_to_session(
        &self,
        ctx: &mut Context<'_>,
        key: &[u8],
        ts: i64,
        gap: i64,
        value: f64,
    ) -> Result<bool> {
        let end = ts.checked_add(gap).ok_or_else(|| out_of_range(ts))?;
        let mut start = ts;
        let mut acc = Accumulator {
            end,
            count: 1,
            value,
        };
        let mut others = self.windows.entries(ctx, key)?;
        let mut merged = Vec::new();
        while let Some(i) = others
            .iter()
            .position(|(s, a)| intersects(start, acc.end, *s, a.end))
        {
            let (other_start, other) = others.swap_remove(i);
            start = start.min(other_start);
            acc = Accumulator {
                end: acc.end.max(other.end),
                count: acc.count + other.count,
                value: self.aggregate.combine(acc.value, other.value),
            };
            merged.push((other_start, other));
        }
        if self.is_late(ctx, acc.end) {
            // Only possible when nothing merged: stored sessions are never late, and merging
            // only moves the end later.
            return Ok(false);
        }
        for (old_start, old) in &merged {
            self.windows.remove(ctx, key, old_start)?;
            // Delete the merged-away session's timers, except where another session of the
            // key still needs a timer at that time (timers are per key and time, not per
            // window as in Flink). The merged session's own timers are registered below,
            // after these deletions.
            for time in [max_timestamp(old.end), self.cleanup_time(old.end)] {
                let needed = others.iter().any(|(_, other)| {
                    max_timestamp(other.end) == time || self.cleanup_time(other.end) == time
                });
                if !needed {
                    ctx.delete_event_timer(key, time);
                }
            }
        }
        self.windows.put(ctx, key, &start, &acc)?;
        self.trigger(ctx, key, start, &acc);
        Ok(true)
    }

    /// `acc` with one more record of `value`.
    fn add(&self, acc: Accumulator, value: f64) -> Accumulator {
        Accumulator {
            end: acc.end,
            count: acc.count + 1,
            value: self.aggregate.combine(acc.value, value),
        }
    }

    /// Flink's `EventTimeTrigger::onElement` after a record was added to a window, plus the
    /// operator's cleanup timer: fire now if the watermark has passed the window's end
    /// (a late firing), else at the end; purge at the cleanup time.
    fn trigger(&self, ctx: &mut Context<'_>, key: &[u8], start: i64, acc: &Accumulator) {
        let max_timestamp = max_timestamp(acc.end);
        let cleanup_time = self.cleanup_time(acc.end);
        if max_timestamp <= ctx.current_watermark() {
            self.emit(ctx, key, start, acc);
        } else if max_timestamp < cleanup_time {
            ctx.register_event_timer(key, max_timestamp);
        }
        // (Without allowed lateness, one timer fires and purges the window.)
        ctx.register_event_timer(key, cleanup_time);
    }

    /// When the state of a window ending at `end` is purged: its max timestamp plus the
    /// allowed lateness (`i64::MAX` on overflow, like Flink's `cleanupTime`).
    fn cleanup_time(&self, end: i64) -> i64 {
        max_timestamp(end).saturating_add(self.allowed_lateness)
    }

    /// Flink's `isWindowLate` for the window ending at `end`: its state has been purged, or
    /// would have been, by now.
    fn is_late(&self, ctx: &Context<'_>, end: i64) -> bool {
        self.cleanup_time(end) <= ctx.current_watermark()
    }

    /// Emits the window's result: `start,end,result` at the window's max timestamp.
    fn emit(&self, ctx: &mut Context<'_>, key: &[u8], start: i64, acc: &Accumulator) {
        // (`itoa` for the integers: `fmt` costs far more in Wasm.)
        let mut value = String::with_capacity(48);
        let mut integer = itoa::Buffer::new();
        value.push_str(integer.format(start));
        value.push(',');
        value.push_str(integer.format(acc.end));
        value.push(',');
        match self.aggregate {
            Aggregate::Count => value.push_str(integer.format(acc.count)),
            Aggregate::Sum | Aggregate::Min | Aggregate::Max => push_number(&mut value, acc.value),
        }
        ctx.emit_at(Some(key), value.as_bytes(), Some(max_timestamp(acc.end)));
    }
}

/// Appends `x` as `Display` writes it. A whole number (what sums, minimums and maximums of
/// whole numbers are) goes through `itoa`: `fmt`'s shortest float formatting costs far
/// more in Wasm.
fn push_number(out: &mut String, x: f64) {
    // Below 2^53 in magnitude every whole number is exact, and `Display` writes its digits
    // with no point or exponent; negative zero is written "-0".
    if x.fract() == 0.0 && x.abs() < 9_007_199_254_740_992.0 && !(x == 0.0 && x.is_sign_negative())
    {
        out.push_str(itoa::Buffer::new().format(x as i64));
    } else {
        use std::fmt::Write as _;
        let _ = write!(out, "{x}");
    }
}

/// The `n`-th field (from 0) of `bytes` split at `sep`.
fn nth_field(bytes: &[u8], sep: u8, n: usize) -> Option<&[u8]> {
    let mut start = 0;
    for _ in 0..n {
        start += bytes[start..].iter().position(|&b| b == sep)? + 1;
    }
    let end = bytes[start..]
        .iter()
        .position(|&b| b == sep)
        .map_or(bytes.len(), |i| start + i);
    Some(&bytes[start..end])
}

/// `field` as a number, as `f64`'s parser reads it after trimming whitespace; whole
/// numbers of up to 15 digits (exact in an `f64`), the usual case, without the parser.
fn parse_number(bytes: &[u8]) -> Option<f64> {
    let (negative, digits) = match bytes.first() {
        Some(b'-') => (true, &bytes[1..]),
        Some(b'+') => (false, &bytes[1..]),
        _ => (false, bytes),
    };
    if (1..=15).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit) {
        // (At most 15 digits: no overflow to check, which Wasm does by a 128-bit multiply.)
        let whole = digits.iter().fold(0u64, |n, d| {
            n.wrapping_mul(10).wrapping_add(u64::from(d - b'0'))
        }) as f64;
        return Some(if negative { -whole } else { whole });
    }
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// Reads `kind` and the window keys that apply to it.
fn parse_assigner(config: &Config) -> Result<Assigner> {
    let kind = config.get("kind").unwrap_or("tumbling");
    let applicable: &[&str] = match kind {
        "tumbling" => &["size-ms", "offset-ms"],
        "sliding" => &["size-ms", "slide-ms", "offset-ms"],
        "session" => &["gap-ms"],
        other => {
            return Err(Error::invalid_config(format!(
                "config `kind` = {other:?}: expected `tumbling`, `sliding` or `session`"
            )));
        }
    };
    // A shape key that does not apply would be silently ignored; most likely `kind` is not
    // what the job meant.
    if let Some(key) = SHAPE_KEYS
        .iter()
        .find(|key| !applicable.contains(key) && config.get(key).is_some())
    {
        return Err(Error::invalid_config(format!(
            "config `{key}` does not apply to `kind` = {kind:?} (it takes {})",
            applicable.join(", ")
        )));
    }
    Ok(match kind {
        "tumbling" => {
            let size = positive(config, "size-ms", kind)?;
            Assigner::Fixed {
                size,
                slide: size,
                offset: offset(config, "size-ms", size)?,
            }
        }
        "sliding" => {
            let size = positive(config, "size-ms", kind)?;
            let slide = positive(config, "slide-ms", kind)?;
            Assigner::Fixed {
                size,
                slide,
                offset: offset(config, "slide-ms", slide)?,
            }
        }
        _ => Assigner::Session {
            gap: positive(config, "gap-ms", kind)?,
        },
    })
}

/// The value of `key`, which `kind` requires to be a positive number of milliseconds.
fn positive(config: &Config, key: &str, kind: &str) -> Result<i64> {
    let Some(value) = config.parse::<i64>(key)? else {
        return Err(Error::invalid_config(format!(
            "missing required config key `{key}` (`kind` = {kind:?} needs it)"
        )));
    };
    if value <= 0 {
        return Err(Error::invalid_config(format!(
            "config `{key}` = \"{value}\": must be positive"
        )));
    }
    Ok(value)
}

/// `offset-ms`, which Flink requires to be smaller in absolute value than `limit`, the
/// value of `limit_key`.
fn offset(config: &Config, limit_key: &str, limit: i64) -> Result<i64> {
    let offset: i64 = config.parse_or("offset-ms", 0)?;
    if offset.unsigned_abs() >= limit.unsigned_abs() {
        return Err(Error::invalid_config(format!(
            "config `offset-ms` = \"{offset}\": its absolute value must be less than \
             `{limit_key}` ({limit})"
        )));
    }
    Ok(offset)
}

/// The start of the window of length `size`, aligned to `offset`, that holds `ts`
/// (Flink's `TimeWindow::getWindowStartWithOffset`); `None` on overflow.
fn window_start(ts: i64, offset: i64, size: i64) -> Option<i64> {
    ts.checked_sub(ts.checked_sub(offset)?.rem_euclid(size))
}

/// [`window_start`] of `ts`, taken from `last` (that of an earlier timestamp) when `ts`
/// falls less than a slide after it, as consecutive records mostly do: no division.
fn window_start_after(last: Option<i64>, ts: i64, offset: i64, slide: i64) -> Option<i64> {
    match last {
        // (`ts - last` fits a `u64` when `ts >= last`; `ts - offset` overflows here when
        // it does in `window_start`.)
        Some(last)
            if ts >= last
                && (ts.wrapping_sub(last) as u64) < slide as u64
                && ts.checked_sub(offset).is_some() =>
        {
            Some(last)
        }
        _ => window_start(ts, offset, slide),
    }
}

/// The windows of `size` every `slide` that hold `ts`, as `(start, end)`, latest start
/// first (Flink's `SlidingEventTimeWindows::assignWindows`; with `slide == size` it yields
/// the one window of `TumblingEventTimeWindows`), given the latest start `start` (what
/// [`window_start`] gives with `slide`). `None` when a bound overflows `i64`.
fn fixed_windows(ts: i64, start: i64, size: i64, slide: i64) -> Option<FixedWindows> {
    let lowest_excluded = ts.checked_sub(size)?;
    if start > lowest_excluded {
        // The latest window ends last: if its end fits, every end does.
        start.checked_add(size)?;
    }
    Some(FixedWindows {
        start,
        lowest_excluded,
        size,
        slide,
    })
}

/// The windows [`fixed_windows`] gives, one after the other.
#[derive(Debug, Clone, Copy)]
struct FixedWindows {
    /// The start of the next window.
    start: i64,
    /// Windows starting at or before this one do not hold the timestamp.
    lowest_excluded: i64,
    size: i64,
    slide: i64,
}

impl Iterator for FixedWindows {
    type Item = (i64, i64);

    fn next(&mut self) -> Option<(i64, i64)> {
        if self.start <= self.lowest_excluded {
            return None;
        }
        let window = (self.start, self.start + self.size);
        // Below `i64::MIN` is below `lowest_excluded` too.
        self.start = self
            .start
            .checked_sub(self.slide)
            .unwrap_or(self.lowest_excluded);
        Some(window)
    }
}

/// The largest timestamp in the window ending at `end` (exclusive).
fn max_timestamp(end: i64) -> i64 {
    end - 1
}

/// Flink's `TimeWindow::intersects` for `[a_start, a_end)` and `[b_start, b_end)`: true also
/// when the windows only touch, so that such sessions merge.
fn intersects(a_start: i64, a_end: i64, b_start: i64, b_end: i64) -> bool {
    a_start <= b_end && a_end >= b_start
}

/// The error for a timestamp whose windows would reach past the range of `i64`.
fn out_of_range(ts: i64) -> Error {
    Error::failed(format!(
        "record timestamp {ts} is too close to the limits of i64 for its windows"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::TimeDomain;
    use sluice_sdk::testing::{Harness, HarnessBuilder};

    /// A harness for keyed input configured with `config`.
    fn open(config: &[(&str, &str)]) -> Result<Harness<Window>> {
        builder(config).open()
    }

    fn builder(config: &[(&str, &str)]) -> HarnessBuilder<Window> {
        let mut builder = Harness::<Window>::builder().keyed(true);
        for (k, v) in config {
            builder = builder.config(*k, *v);
        }
        builder
    }

    /// Processes a record of `key` at `ts` whose value field 2 is `value`.
    fn send(h: &mut Harness<Window>, key: &str, ts: i64, value: i64) -> Result<()> {
        h.process(Some(key), format!("{ts},{key},{value}"), Some(ts))
    }

    /// The records emitted since the last call, as `(key, value, timestamp)`.
    fn take(h: &mut Harness<Window>) -> Vec<(String, String, i64)> {
        h.take_output()
            .into_iter()
            .map(|r| {
                let key = String::from_utf8(r.key.expect("keyed output")).unwrap();
                let value = String::from_utf8(r.value).unwrap();
                (key, value, r.timestamp.expect("timestamped output"))
            })
            .collect()
    }

    /// `(key, value, timestamp)` as owned strings, for comparing with [`take`].
    fn out(expected: &[(&str, &str, i64)]) -> Vec<(String, String, i64)> {
        expected
            .iter()
            .map(|(k, v, t)| ((*k).to_owned(), (*v).to_owned(), *t))
            .collect()
    }

    #[test]
    fn windows_follow_from_the_last_start_as_from_the_timestamp_alone() {
        /// The windows holding `ts`, latest first, worked out in `i128`; `None` where a
        /// bound leaves `i64`.
        fn by_definition(ts: i64, size: i64, slide: i64, offset: i64) -> Option<Vec<(i64, i64)>> {
            let (t, size, slide, offset) =
                (ts as i128, size as i128, slide as i128, offset as i128);
            let fits = |x: i128| i64::try_from(x).ok();
            fits(t - size)?;
            let mut windows = Vec::new();
            let mut start = t - (t - offset).rem_euclid(slide);
            while start > t - size {
                windows.push((fits(start)?, fits(start + size)?));
                start -= slide;
            }
            Some(windows)
        }
        // (size, slide, offset): tumbling, sliding, with offsets, with gaps between windows.
        let shapes = [
            (10, 10, 0),
            (10, 5, 0),
            (10, 3, 2),
            (10, 10, -4),
            (4, 10, 3),
        ];
        let mut timestamps: Vec<i64> = (-40..40).collect();
        timestamps.extend([35, 12, 12, -7, 0, 39, 1, 1000, -1000, 999]);
        timestamps.extend((0..25).map(|d| i64::MIN + d));
        timestamps.extend((0..25).map(|d| i64::MAX - d));
        timestamps.extend([i64::MAX - 3, i64::MIN + 2, i64::MAX - 20, 5]);
        // A start that holds a later timestamp for which `ts - offset` overflows.
        timestamps.extend([i64::MIN + 2, i64::MIN + 1, i64::MAX - 10, i64::MAX - 2]);
        for (size, slide, offset) in shapes {
            let mut last = None;
            for &ts in &timestamps {
                let what =
                    format!("{ts} after {last:?}, size {size} slide {slide} offset {offset}");
                let start = window_start_after(last, ts, offset, slide);
                assert_eq!(start, window_start(ts, offset, slide), "{what}");
                last = start.or(last);
                let Some(start) = start else { continue };
                let windows = fixed_windows(ts, start, size, slide).map(Iterator::collect);
                assert_eq!(windows, by_definition(ts, size, slide, offset), "{what}");
            }
        }
    }

    #[test]
    fn numbers_are_written_as_display_writes_them() {
        let exact = 9_007_199_254_740_992.0; // 2^53
        let numbers = [
            0.0,
            -0.0,
            1.0,
            -7.0,
            4950.0,
            0.5,
            -2.25,
            1e-7,
            exact - 1.0,
            -(exact - 1.0),
            exact,
            -exact,
            1e20,
            1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for x in numbers {
            let mut got = String::from("x,");
            push_number(&mut got, x);
            assert_eq!(got, format!("x,{x}"), "{x:e}");
        }
    }

    #[test]
    fn fields_and_numbers_read_as_split_and_the_f64_parser_read_them() {
        let numbers = [
            "0",
            "-0",
            "+0",
            "7",
            "-7",
            "+7",
            "007",
            "123456789012345",
            "1234567890123456",
            "99999999999999999999",
            "1.5",
            "-2.25e3",
            " 42 ",
            "42 ",
            "-",
            "+",
            "",
            "+-1",
            "1_0",
            "inf",
            "NaN",
            "٣",
            "1e400",
            "0x10",
        ];
        for n in numbers {
            let want: Option<f64> = n.trim().parse().ok();
            let got = parse_number(n.as_bytes());
            assert_eq!(
                got.map(f64::to_bits),
                want.map(f64::to_bits),
                "{n:?}: {got:?} against {want:?}"
            );
        }
        let lines = ["a,b,c", "a,,c,", ",", "", "é,ü,→", "only", "1,2"];
        for line in lines {
            for n in 0..5 {
                assert_eq!(
                    nth_field(line.as_bytes(), b',', n),
                    line.split(',').nth(n).map(str::as_bytes),
                    "{line:?} {n}"
                );
            }
        }
    }

    #[test]
    fn tumbling_in_order() -> Result<()> {
        let mut h = open(&[("size-ms", "10")])?;
        send(&mut h, "a", 1, 0)?;
        send(&mut h, "b", 3, 0)?;
        send(&mut h, "a", 9, 0)?;
        h.process_watermark(9)?;
        assert_eq!(take(&mut h), out(&[("a", "0,10,2", 9), ("b", "0,10,1", 9)]));
        send(&mut h, "a", 10, 0)?;
        send(&mut h, "a", 25, 0)?;
        h.process_watermark(19)?;
        assert_eq!(take(&mut h), out(&[("a", "10,20,1", 19)]));
        h.finish()?;
        assert_eq!(take(&mut h), out(&[("a", "20,30,1", 29)]));
        // Every window was purged at its cleanup time, and every timer has fired.
        assert!(h.state_entries("windows", b"a").is_empty());
        assert!(h.timers(TimeDomain::EventTime).is_empty());
        assert_eq!(h.counter(LATE_RECORDS_DROPPED), 0);
        Ok(())
    }

    #[test]
    fn out_of_order_within_the_watermark() -> Result<()> {
        let mut h = open(&[("size-ms", "10")])?;
        send(&mut h, "a", 12, 0)?;
        h.process_watermark(5)?;
        // Earlier than the record before, but the watermark has not passed its window.
        send(&mut h, "a", 7, 0)?;
        send(&mut h, "a", 6, 0)?;
        h.process_watermark(9)?;
        assert_eq!(take(&mut h), out(&[("a", "0,10,2", 9)]));
        send(&mut h, "a", 11, 0)?;
        h.finish()?;
        assert_eq!(take(&mut h), out(&[("a", "10,20,2", 19)]));
        Ok(())
    }

    #[test]
    fn late_record_is_dropped_and_counted() -> Result<()> {
        let mut h = open(&[("size-ms", "10")])?;
        send(&mut h, "a", 5, 0)?;
        h.process_watermark(9)?;
        assert_eq!(take(&mut h), out(&[("a", "0,10,1", 9)]));
        send(&mut h, "a", 9, 0)?; // its window has been fired and purged
        send(&mut h, "a", 10, 0)?; // after the watermark: on time
        assert_eq!(h.counter(LATE_RECORDS_DROPPED), 1);
        // The late record goes to the side output `late` as it came.
        let late = h.take_side_output("late");
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].value, b"9,a,0");
        assert_eq!(
            (late[0].key.as_deref(), late[0].timestamp),
            (Some(&b"a"[..]), Some(9))
        );
        h.finish()?;
        assert_eq!(take(&mut h), out(&[("a", "10,20,1", 19)]));
        Ok(())
    }

    /// Out-of-order events of three keys, with a watermark of max − 3 − 1 after each.
    fn events_and_watermarks(n: usize) -> (Vec<(String, i64, String)>, Vec<i64>) {
        let mut seed = 7u64;
        let mut random = move |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        let (mut events, mut watermarks, mut max) = (Vec::new(), Vec::new(), i64::MIN);
        for i in 0..n as i64 {
            let ts = i - random(8) as i64;
            let key = ["a", "b", "c"][random(3) as usize].to_owned();
            events.push((key.clone(), ts, format!("{ts},{key},{}", random(10))));
            max = max.max(ts);
            watermarks.push(max - 3 - 1);
        }
        (events, watermarks)
    }

    #[test]
    fn a_batch_with_watermarks_gives_what_records_one_by_one_give() -> Result<()> {
        for config in [
            &[("size-ms", "5"), ("allowed-lateness-ms", "2")][..],
            &[("kind", "sliding"), ("size-ms", "6"), ("slide-ms", "2")],
            &[
                ("kind", "session"),
                ("gap-ms", "2"),
                ("allowed-lateness-ms", "1"),
            ],
        ] {
            let (events, watermarks) = events_and_watermarks(400);
            let records: Vec<Record<'_>> = events
                .iter()
                .map(|(k, ts, v)| Record {
                    key: Some(k.as_bytes()),
                    value: v.as_bytes(),
                    timestamp: Some(*ts),
                })
                .collect();
            let mut one_by_one = open(config)?;
            for (record, &w) in records.iter().zip(&watermarks) {
                one_by_one.process_records([*record])?;
                one_by_one.process_watermark(w)?;
            }
            let mut batched = open(config)?;
            for (chunk, marks) in records.chunks(64).zip(watermarks.chunks(64)) {
                // The watermark after record i comes before record i + 1; the last one
                // of a chunk after it, between batches.
                let inside: Vec<(usize, i64)> = marks[..marks.len() - 1]
                    .iter()
                    .enumerate()
                    .map(|(i, &w)| (i + 1, w))
                    .collect::<Vec<_>>()
                    .chunk_by(|a, b| a.1 == b.1)
                    .map(|run| run[0])
                    .collect();
                batched.process_batch(chunk.iter().copied(), &inside)?;
                batched.process_watermark(marks[marks.len() - 1])?;
            }
            one_by_one.finish()?;
            batched.finish()?;
            let expected = take(&mut one_by_one);
            assert!(expected.len() > 50, "{config:?}: {}", expected.len());
            assert_eq!(take(&mut batched), expected, "{config:?}");
            assert_eq!(
                batched.counter(LATE_RECORDS_DROPPED),
                one_by_one.counter(LATE_RECORDS_DROPPED),
                "{config:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn allowed_lateness_refires_and_purges_at_cleanup() -> Result<()> {
        let mut h = open(&[("size-ms", "10"), ("allowed-lateness-ms", "5")])?;
        send(&mut h, "a", 1, 0)?;
        h.process_watermark(9)?;
        assert_eq!(take(&mut h), out(&[("a", "0,10,1", 9)]));
        // Late but within the allowed lateness: each one re-fires with the updated count.
        send(&mut h, "a", 2, 0)?;
        assert_eq!(take(&mut h), out(&[("a", "0,10,2", 9)]));
        h.process_watermark(13)?;
        send(&mut h, "a", 3, 0)?;
        assert_eq!(take(&mut h), out(&[("a", "0,10,3", 9)]));
        assert_eq!(h.state_entries("windows", b"a").len(), 1);
        // The cleanup time 9 + 5 purges the window: later records for it are dropped.
        h.process_watermark(14)?;
        assert!(take(&mut h).is_empty());
        assert!(h.state_entries("windows", b"a").is_empty());
        send(&mut h, "a", 4, 0)?;
        assert!(take(&mut h).is_empty());
        assert_eq!(h.counter(LATE_RECORDS_DROPPED), 1);
        Ok(())
    }

    #[test]
    fn records_in_no_window_are_counted_only_when_late() -> Result<()> {
        // With slide > size there are gaps between windows. As in Flink, a record that
        // joins no window is counted as dropped only if the record itself is late.
        let mut h = open(&[("kind", "sliding"), ("size-ms", "5"), ("slide-ms", "10")])?;
        h.process_watermark(3)?;
        send(&mut h, "a", 7, 0)?; // in the gap [5, 10), and not late: skipped silently
        send(&mut h, "a", 2, 0)?; // [0, 5) has not ended yet
        send(&mut h, "a", 1, 0)?;
        h.process_watermark(4)?;
        assert_eq!(take(&mut h), out(&[("a", "0,5,2", 4)]));
        assert_eq!(h.counter(LATE_RECORDS_DROPPED), 0);
        send(&mut h, "a", 3, 0)?; // late
        assert_eq!(h.counter(LATE_RECORDS_DROPPED), 1);
        Ok(())
    }

    #[test]
    fn sliding_windows() -> Result<()> {
        let mut h = open(&[("kind", "sliding"), ("size-ms", "10"), ("slide-ms", "5")])?;
        send(&mut h, "a", 7, 0)?; // in [0, 10) and [5, 15)
        send(&mut h, "a", 12, 0)?; // in [5, 15) and [10, 20)
        h.finish()?;
        assert_eq!(
            take(&mut h),
            out(&[
                ("a", "0,10,1", 9),
                ("a", "5,15,2", 14),
                ("a", "10,20,1", 19)
            ])
        );
        // Each record is in size / slide windows.
        let mut h = open(&[("kind", "sliding"), ("size-ms", "6"), ("slide-ms", "2")])?;
        send(&mut h, "a", 5, 0)?;
        h.finish()?;
        assert_eq!(
            take(&mut h),
            out(&[("a", "0,6,1", 5), ("a", "2,8,1", 7), ("a", "4,10,1", 9)])
        );
        Ok(())
    }

    #[test]
    fn sliding_late_firings_go_latest_window_first() -> Result<()> {
        let mut h = open(&[
            ("kind", "sliding"),
            ("size-ms", "10"),
            ("slide-ms", "5"),
            ("allowed-lateness-ms", "5"),
        ])?;
        send(&mut h, "a", 7, 0)?; // in [5, 15) and [0, 10)
        h.process_watermark(15)?;
        assert_eq!(
            take(&mut h),
            out(&[("a", "0,10,1", 9), ("a", "5,15,1", 14)])
        );
        // Both windows have ended; [0, 10) was purged at 9 + 5 = 14, [5, 15) is within its
        // lateness until 19, so only [5, 15) takes the record and re-fires.
        send(&mut h, "a", 8, 0)?;
        assert_eq!(take(&mut h), out(&[("a", "5,15,2", 14)]));
        assert_eq!(h.counter(LATE_RECORDS_DROPPED), 0);

        // With a longer lateness both re-fire, in the order the assigner lists them.
        let mut h = open(&[
            ("kind", "sliding"),
            ("size-ms", "10"),
            ("slide-ms", "5"),
            ("allowed-lateness-ms", "10"),
        ])?;
        send(&mut h, "a", 7, 0)?;
        h.process_watermark(15)?;
        take(&mut h);
        send(&mut h, "a", 8, 0)?;
        assert_eq!(
            take(&mut h),
            out(&[("a", "5,15,2", 14), ("a", "0,10,2", 9)])
        );
        // At 19 [0, 10) is purged; a record for both windows now only updates [5, 15) and
        // is not counted as dropped, since it joined a window.
        h.process_watermark(20)?;
        send(&mut h, "a", 9, 0)?;
        assert_eq!(take(&mut h), out(&[("a", "5,15,3", 14)]));
        assert_eq!(h.counter(LATE_RECORDS_DROPPED), 0);
        Ok(())
    }

    #[test]
    fn sum_min_and_max_read_the_field() -> Result<()> {
        for (aggregate, expected) in [("sum", "6"), ("min", "-1"), ("max", "4")] {
            let mut h = open(&[("size-ms", "10"), ("aggregate", aggregate)])?;
            for (ts, value) in [(1, 3), (2, -1), (3, 4)] {
                send(&mut h, "a", ts, value)?;
            }
            h.finish()?;
            assert_eq!(
                take(&mut h),
                out(&[("a", &format!("0,10,{expected}"), 9)]),
                "{aggregate}"
            );
        }
        // Another field and separator; fractions print as they are.
        let mut h = open(&[
            ("size-ms", "10"),
            ("aggregate", "sum"),
            ("field", "0"),
            ("separator", ";"),
        ])?;
        h.process(Some("a"), " 1.5;x", Some(1))?;
        h.process(Some("a"), "1;y", Some(2))?;
        h.finish()?;
        assert_eq!(h.output_values_str(), ["0,10,2.5"]);
        Ok(())
    }

    #[test]
    fn bad_values_fail_naming_the_record() -> Result<()> {
        let mut h = open(&[("size-ms", "10"), ("aggregate", "max")])?;
        let err = h.process(Some("a"), "1,a,many", Some(1)).unwrap_err();
        assert!(!err.is_invalid_config());
        assert!(
            err.message().contains("\"1,a,many\"") && err.message().contains("not a number"),
            "{err}"
        );
        let err = h.process(Some("a"), "1,a", Some(1)).unwrap_err();
        assert!(err.message().contains("has no field 2"), "{err}");
        // `count` does not look at the value at all.
        let mut h = open(&[("size-ms", "10")])?;
        h.process(Some("a"), b"\xff", Some(1))?;
        Ok(())
    }

    #[test]
    fn records_need_a_key_and_a_timestamp() -> Result<()> {
        let mut h = open(&[("size-ms", "10")])?;
        let err = h.process(Some("a"), "1,a,1", None).unwrap_err();
        assert!(
            !err.is_invalid_config() && err.message().contains("`timestamp`"),
            "{err}"
        );
        let err = h.process(None::<&str>, "1,a,1", Some(1)).unwrap_err();
        assert!(err.message().contains("key_by"), "{err}");
        Ok(())
    }

    #[test]
    fn sessions_merge_and_a_record_can_bridge_two() -> Result<()> {
        let mut h = open(&[("kind", "session"), ("gap-ms", "5"), ("aggregate", "sum")])?;
        send(&mut h, "a", 0, 1)?; // [0, 5)
        send(&mut h, "a", 3, 2)?; // [0, 8)
        send(&mut h, "a", 20, 4)?; // [20, 25)
        send(&mut h, "b", 10, 100)?; // another key: never merges with `a`
        assert_eq!(h.state_entries("windows", b"a").len(), 2);
        // [13, 18) touches neither [0, 8) nor [20, 25); then [8, 13) bridges [0, 8) and
        // [13, 18), and [15, 20) bridges the result and [20, 25).
        send(&mut h, "a", 13, 8)?;
        assert_eq!(h.state_entries("windows", b"a").len(), 3);
        send(&mut h, "a", 8, 16)?;
        assert_eq!(h.state_entries("windows", b"a").len(), 2);
        send(&mut h, "a", 15, 32)?;
        assert_eq!(h.state_entries("windows", b"a").len(), 1);
        // The merged-away sessions' timers are gone; the merged one's are registered.
        let a_timers: Vec<i64> = h
            .timers(TimeDomain::EventTime)
            .into_iter()
            .filter(|(_, key)| key == b"a")
            .map(|(time, _)| time)
            .collect();
        assert_eq!(a_timers, [24]);
        h.finish()?;
        assert_eq!(
            take(&mut h),
            out(&[("b", "10,15,100", 14), ("a", "0,25,63", 24)])
        );
        Ok(())
    }

    #[test]
    fn sessions_fire_at_the_watermark_and_late_ones_drop() -> Result<()> {
        let mut h = open(&[("kind", "session"), ("gap-ms", "10")])?;
        send(&mut h, "a", 1, 0)?;
        send(&mut h, "a", 5, 0)?; // [1, 15)
        h.process_watermark(13)?;
        assert!(take(&mut h).is_empty());
        send(&mut h, "a", 4, 0)?; // inside the open session
        h.process_watermark(14)?;
        assert_eq!(take(&mut h), out(&[("a", "1,15,3", 14)]));
        send(&mut h, "a", 2, 0)?; // its session [2, 12) would be late: dropped
        assert_eq!(h.counter(LATE_RECORDS_DROPPED), 1);
        assert!(h.state_entries("windows", b"a").is_empty());
        // A record whose session ends after the watermark opens a new session.
        send(&mut h, "a", 6, 0)?;
        h.finish()?;
        assert_eq!(take(&mut h), out(&[("a", "6,16,1", 15)]));
        Ok(())
    }

    #[test]
    fn session_late_firing_within_lateness() -> Result<()> {
        let mut h = open(&[
            ("kind", "session"),
            ("gap-ms", "10"),
            ("allowed-lateness-ms", "10"),
            ("aggregate", "max"),
        ])?;
        send(&mut h, "a", 0, 5)?; // [0, 10)
        h.process_watermark(12)?;
        assert_eq!(take(&mut h), out(&[("a", "0,10,5", 9)]));
        // [-5, 5) merges into [-5, 10), which ended but is within lateness: fires at once.
        send(&mut h, "a", -5, 7)?;
        assert_eq!(take(&mut h), out(&[("a", "-5,10,7", 9)]));
        // [11, 21) does not touch [-5, 10) (11 > 10): a new session, still open.
        send(&mut h, "a", 11, 1)?;
        assert!(take(&mut h).is_empty());
        h.process_watermark(19)?; // cleanup of [-5, 10)
        assert_eq!(h.state_entries("windows", b"a").len(), 1);
        h.finish()?;
        assert_eq!(take(&mut h), out(&[("a", "11,21,1", 20)]));
        Ok(())
    }

    #[test]
    fn merged_away_timer_kept_when_another_session_needs_it() -> Result<()> {
        // Timers are per key and time: deleting a merged-away session's timer must not
        // take away another session's timer at the same time.
        let mut h = open(&[
            ("kind", "session"),
            ("gap-ms", "3"),
            ("allowed-lateness-ms", "5"),
        ])?;
        send(&mut h, "a", 0, 0)?; // [0, 3): fires at 2, cleanup at 7
        send(&mut h, "a", 5, 0)?; // [5, 8): fires at 7, cleanup at 12
        // [7, 10) merges [5, 8) into [5, 10): timer 12 goes, 7 stays for [0, 3)'s cleanup.
        send(&mut h, "a", 7, 0)?;
        let times: Vec<i64> = h
            .timers(TimeDomain::EventTime)
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        assert_eq!(times, [2, 7, 9, 14]);
        h.process_watermark(7)?;
        assert_eq!(take(&mut h), out(&[("a", "0,3,1", 2)]));
        assert_eq!(h.state_entries("windows", b"a").len(), 1);
        h.finish()?;
        assert_eq!(take(&mut h), out(&[("a", "5,10,2", 9)]));
        assert!(h.state_entries("windows", b"a").is_empty());

        // The same for a fire timer: [5, 8) fires at 7, the cleanup time of [0, 3), which
        // merges away into [-2, 3). Without the guard [5, 8) would never fire.
        let mut h = open(&[
            ("kind", "session"),
            ("gap-ms", "3"),
            ("allowed-lateness-ms", "5"),
        ])?;
        send(&mut h, "a", 0, 0)?;
        send(&mut h, "a", 5, 0)?;
        send(&mut h, "a", -2, 0)?;
        h.finish()?;
        assert_eq!(take(&mut h), out(&[("a", "-2,3,2", 2), ("a", "5,8,1", 7)]));
        Ok(())
    }

    #[test]
    fn negative_timestamps_and_offsets() -> Result<()> {
        let mut h = open(&[("size-ms", "10")])?;
        send(&mut h, "a", -1, 0)?;
        send(&mut h, "a", -10, 0)?;
        send(&mut h, "a", -11, 0)?;
        h.finish()?;
        // Window order in the output follows the timers: by end.
        assert_eq!(
            take(&mut h),
            out(&[("a", "-20,-10,1", -11), ("a", "-10,0,2", -1)])
        );

        let mut h = open(&[("size-ms", "10"), ("offset-ms", "3")])?;
        send(&mut h, "a", 2, 0)?; // [-7, 3)
        send(&mut h, "a", 3, 0)?; // [3, 13)
        h.finish()?;
        assert_eq!(h.output_values_str(), ["-7,3,1", "3,13,1"]);

        let mut h = open(&[("size-ms", "10"), ("offset-ms", "-3")])?;
        send(&mut h, "a", -4, 0)?; // [-13, -3)
        send(&mut h, "a", 7, 0)?; // [7, 17)
        h.finish()?;
        assert_eq!(h.output_values_str(), ["-13,-3,1", "7,17,1"]);

        let mut h = open(&[
            ("kind", "sliding"),
            ("size-ms", "10"),
            ("slide-ms", "5"),
            ("offset-ms", "2"),
        ])?;
        send(&mut h, "a", -1, 0)?; // in [-3, 7) and [-8, 2)
        h.finish()?;
        assert_eq!(h.output_values_str(), ["-8,2,1", "-3,7,1"]);
        Ok(())
    }

    #[test]
    fn extreme_timestamps() -> Result<()> {
        // The last whole window before i64::MAX fires at the end of the input.
        let mut h = open(&[("size-ms", "10")])?;
        send(&mut h, "a", i64::MAX - 20, 0)?;
        h.finish()?;
        assert_eq!(h.output().len(), 1);
        // A window that would end past i64::MAX is an error, not a panic.
        let mut h = open(&[("size-ms", "10")])?;
        let err = send(&mut h, "a", i64::MAX - 1, 0).unwrap_err();
        assert!(err.message().contains("too close to the limits"), "{err}");
        Ok(())
    }

    #[test]
    fn state_survives_a_restore() -> Result<()> {
        let config = [("kind", "session"), ("gap-ms", "5"), ("aggregate", "sum")];
        let mut h = open(&config)?;
        send(&mut h, "a", 0, 1)?;
        send(&mut h, "a", 10, 2)?;
        let snapshot = h.snapshot(1)?;
        let mut h = builder(&config).restore_from(&snapshot).open()?;
        send(&mut h, "a", 5, 4)?; // bridges the two restored sessions
        h.finish()?;
        assert_eq!(take(&mut h), out(&[("a", "0,15,7", 14)]));
        Ok(())
    }

    #[test]
    fn config_errors_name_the_key() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("size-ms", "10"), ("sise-ms", "1")], "`sise-ms`"),
            (&[], "`size-ms`"),
            (&[("size-ms", "0")], "`size-ms` = \"0\""),
            (&[("size-ms", "ten")], "`size-ms` = \"ten\""),
            (
                &[("kind", "hopping"), ("size-ms", "10")],
                "`kind` = \"hopping\"",
            ),
            (&[("kind", "sliding"), ("size-ms", "10")], "`slide-ms`"),
            (
                &[("kind", "sliding"), ("size-ms", "10"), ("slide-ms", "-5")],
                "`slide-ms` = \"-5\"",
            ),
            (&[("kind", "session")], "`gap-ms`"),
            (&[("kind", "session"), ("gap-ms", "0")], "`gap-ms` = \"0\""),
            (
                &[("kind", "session"), ("gap-ms", "5"), ("size-ms", "10")],
                "`size-ms` does not apply",
            ),
            (
                &[("size-ms", "10"), ("slide-ms", "5")],
                "`slide-ms` does not apply",
            ),
            (
                &[("size-ms", "10"), ("offset-ms", "10")],
                "`offset-ms` = \"10\"",
            ),
            (
                &[("size-ms", "10"), ("offset-ms", "-10")],
                "`offset-ms` = \"-10\"",
            ),
            (
                &[
                    ("kind", "sliding"),
                    ("size-ms", "10"),
                    ("slide-ms", "5"),
                    ("offset-ms", "5"),
                ],
                "`offset-ms` = \"5\"",
            ),
            (
                &[("size-ms", "10"), ("aggregate", "avg")],
                "`aggregate` = \"avg\"",
            ),
            (&[("size-ms", "10"), ("field", "-1")], "`field` = \"-1\""),
            (&[("size-ms", "10"), ("separator", "")], "`separator`"),
            (
                &[("size-ms", "10"), ("allowed-lateness-ms", "-1")],
                "`allowed-lateness-ms` = \"-1\"",
            ),
            (
                &[("size-ms", "10"), ("allowed-lateness-ms", "soon")],
                "`allowed-lateness-ms` = \"soon\"",
            ),
        ];
        for (config, expected) in cases {
            let err = open(config).unwrap_err();
            assert!(
                err.is_invalid_config() && err.message().contains(expected),
                "{config:?}: {err}"
            );
        }
        let err = Harness::<Window>::builder()
            .config("size-ms", "10")
            .open()
            .unwrap_err();
        assert!(
            err.is_invalid_config() && err.message().contains("key_by"),
            "{err}"
        );
    }
}
