//! `join`: an interval join of two keyed streams, with the semantics of Flink's
//! `IntervalJoinOperator`.
//!
//! Input 0 is the left stream and input 1 the right one, both keyed by the join key
//! (`key_by` in the job file) and both with event time. A left record at time `l` joins
//! every right record of the same key at time `r` with `l + lower_ms <= r <= l + upper_ms`.
//! Each pair is emitted once, when the later of its two records arrives: key = the join
//! key, value = `LEFT SEPARATOR RIGHT` (the two values), timestamp = the later of `l` and
//! `r`.
//!
//! Records wait in keyed state (map states `left` and `right`, time → values) until the
//! watermark passes the last time a partner could arrive: `l + max(upper_ms, 0)` for a
//! left record, `r + max(-lower_ms, 0)` for a right one; an event-time timer then drops
//! them. A record older than the watermark when it arrives can no longer find all its
//! partners: it joins nothing and goes to side output `late-left` or `late-right` (as
//! Flink's `sideOutputLeftLateData` and `sideOutputRightLateData`), counted as
//! `late-records`.
//!
//! Config:
//! - `lower_ms`, `upper_ms` (required): the bounds, `lower_ms <= upper_ms`.
//! - `separator`: between the two values (default `|`).

use sluice_sdk::{
    Context, Error, MapState, OpenContext, Operator, Record, Result, SideOutput, Timer,
};

sluice_sdk::config_keys!(KEYS = ["lower_ms", "upper_ms", "separator"]);

/// Records of one side of one key, by event time, in arrival order.
type Buffer = MapState<i64, Vec<Vec<u8>>>;

/// The operator.
pub struct Join {
    left: Buffer,
    right: Buffer,
    lower: i64,
    upper: i64,
    separator: Vec<u8>,
    late_left: SideOutput,
    late_right: SideOutput,
}

/// Which input a record came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

impl Operator for Join {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        ctx.config().check_known(KEYS)?;
        let bound = |key: &str| -> Result<i64> {
            ctx.config()
                .parse::<i64>(key)?
                .ok_or_else(|| Error::invalid_config(format!("join needs config `{key}`")))
        };
        let (lower, upper) = (bound("lower_ms")?, bound("upper_ms")?);
        if lower > upper {
            return Err(Error::invalid_config(format!(
                "config `lower_ms` = {lower} is above `upper_ms` = {upper}"
            )));
        }
        if ctx.inputs().len() != 2 {
            return Err(Error::invalid_config(format!(
                "join reads two inputs (`inputs = [\"LEFT\", \"RIGHT\"]` in the job file), not {}",
                ctx.inputs().len()
            )));
        }
        if ctx.inputs().iter().any(|i| i.broadcast) || !ctx.is_keyed() {
            return Err(Error::invalid_config(
                "join needs both inputs keyed by the join key (`key_by`), not broadcast",
            ));
        }
        Ok(Join {
            left: ctx.map_state("left")?,
            right: ctx.map_state("right")?,
            lower,
            upper,
            separator: ctx
                .config()
                .get("separator")
                .unwrap_or("|")
                .as_bytes()
                .to_vec(),
            late_left: ctx.side_output("late-left")?,
            late_right: ctx.side_output("late-right")?,
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let key = record.require_key()?;
        let Some(time) = record.timestamp else {
            return Err(Error::failed(
                "join needs event time: give both sources a `timestamp`",
            ));
        };
        let side = if ctx.input_index() == 0 {
            Side::Left
        } else {
            Side::Right
        };
        if time < ctx.current_watermark() {
            ctx.add_counter("late-records", 1);
            let late = match side {
                Side::Left => self.late_left,
                Side::Right => self.late_right,
            };
            ctx.emit_to(late, Some(key), record.value);
            return Ok(());
        }
        // The partners' times: right records in [l + lower, l + upper] for a left record,
        // left records in [r - upper, r - lower] for a right one.
        let (ours, theirs, from, to) = match side {
            Side::Left => (
                &self.left,
                &self.right,
                time.saturating_add(self.lower),
                time.saturating_add(self.upper),
            ),
            Side::Right => (
                &self.right,
                &self.left,
                time.saturating_sub(self.upper),
                time.saturating_sub(self.lower),
            ),
        };
        ours.update(ctx, key, &time, |values| {
            let mut values = values.unwrap_or_default();
            values.push(record.value.to_vec());
            Some(values)
        })?;
        let mut pair = Vec::new();
        for (t, values) in theirs.entries_where(ctx, key, |&t| from <= t && t <= to)? {
            for value in &values {
                pair.clear();
                let (l, r) = match side {
                    Side::Left => (record.value, value.as_slice()),
                    Side::Right => (value.as_slice(), record.value),
                };
                pair.extend_from_slice(l);
                pair.extend_from_slice(&self.separator);
                pair.extend_from_slice(r);
                ctx.emit_at(Some(key), &pair, Some(time.max(t)));
            }
        }
        ctx.register_event_timer(key, self.cleanup_time(side, time));
        Ok(())
    }

    fn on_timer(&mut self, timer: Timer<'_>, ctx: &mut Context<'_>) -> Result<()> {
        for (side, buffer) in [(Side::Left, &self.left), (Side::Right, &self.right)] {
            for t in buffer.keys(ctx, timer.key)? {
                if self.cleanup_time(side, t) <= timer.timestamp {
                    buffer.remove(ctx, timer.key, &t)?;
                }
            }
        }
        Ok(())
    }
}

impl Join {
    /// When a record of `side` at `time` can find no more partners: the watermark has
    /// passed the last time one could have.
    fn cleanup_time(&self, side: Side, time: i64) -> i64 {
        let after = match side {
            Side::Left => self.upper,
            Side::Right => -self.lower,
        };
        time.saturating_add(after.max(0))
    }
}

sluice_sdk::export!(Join);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::Harness;

    fn harness(lower: i64, upper: i64) -> Harness<Join> {
        Harness::<Join>::builder()
            .config("lower_ms", lower.to_string())
            .config("upper_ms", upper.to_string())
            .input("left", false)
            .input("right", false)
            .keyed(true)
            .open()
            .unwrap()
    }

    fn values(h: &mut Harness<Join>) -> Vec<(String, i64)> {
        let mut out: Vec<(String, i64)> = h
            .take_output()
            .into_iter()
            .map(|r| (String::from_utf8(r.value).unwrap(), r.timestamp.unwrap()))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn joins_records_within_the_bounds_once_whichever_comes_first() {
        let mut h = harness(-5, 10);
        h.process_on(0, Some("k"), "l100", Some(100)).unwrap();
        // In [95, 110]: joins; 94 and 111 do not; another key never does.
        h.process_on(1, Some("k"), "r95", Some(95)).unwrap();
        h.process_on(1, Some("k"), "r110", Some(110)).unwrap();
        h.process_on(1, Some("k"), "r94", Some(94)).unwrap();
        h.process_on(1, Some("k"), "r111", Some(111)).unwrap();
        h.process_on(1, Some("other"), "x100", Some(100)).unwrap();
        // A later left record finds the right records already there (those in [99, 114]).
        h.process_on(0, Some("k"), "l104", Some(104)).unwrap();
        assert_eq!(
            values(&mut h),
            [
                ("l100|r110".into(), 110),
                ("l100|r95".into(), 100),
                ("l104|r110".into(), 110),
                ("l104|r111".into(), 111),
            ]
        );
    }

    #[test]
    fn the_watermark_drops_what_can_find_no_partner_and_late_records_go_aside() {
        let mut h = harness(0, 10);
        h.process_on(0, Some("k"), "l100", Some(100)).unwrap();
        h.process_on(1, Some("k"), "r50", Some(50)).unwrap();
        // Left 100 waits until 110; right 50 (lower 0) until 50.
        h.process_watermark(60).unwrap();
        assert_eq!(h.state_entries("right", b"k").len(), 0);
        assert_eq!(h.state_entries("left", b"k").len(), 1);
        h.process_watermark(110).unwrap();
        assert_eq!(h.state_entries("left", b"k").len(), 0);
        // Older than the watermark: joins nothing, goes to its side's late output.
        h.process_on(1, Some("k"), "r105", Some(105)).unwrap();
        h.process_on(0, Some("k"), "l1", Some(1)).unwrap();
        assert!(h.take_output().is_empty());
        let values = |records: Vec<sluice_sdk::OwnedRecord>| -> Vec<Vec<u8>> {
            records.into_iter().map(|r| r.value).collect()
        };
        assert_eq!(values(h.take_side_output("late-right")), [b"r105".to_vec()]);
        assert_eq!(values(h.take_side_output("late-left")), [b"l1".to_vec()]);
        assert_eq!(h.counter("late-records"), 2);
    }

    #[test]
    fn restores_its_buffers_from_a_snapshot() {
        let mut h = harness(-10, 10);
        h.process_on(0, Some("k"), "l100", Some(100)).unwrap();
        let snapshot = h.snapshot(1).unwrap();
        let mut h = Harness::<Join>::builder()
            .config("lower_ms", "-10")
            .config("upper_ms", "10")
            .input("left", false)
            .input("right", false)
            .keyed(true)
            .restore_from(&snapshot)
            .open()
            .unwrap();
        h.process_on(1, Some("k"), "r105", Some(105)).unwrap();
        assert_eq!(values(&mut h), [("l100|r105".into(), 105)]);
    }

    #[test]
    fn refuses_bad_bounds_and_inputs() {
        let bad = Harness::<Join>::builder()
            .config("lower_ms", "5")
            .config("upper_ms", "1")
            .input("a", false)
            .input("b", false)
            .keyed(true)
            .open();
        assert!(bad.is_err());
        let one_input = Harness::<Join>::builder()
            .config("lower_ms", "0")
            .config("upper_ms", "1")
            .keyed(true)
            .open();
        assert!(one_input.is_err());
    }
}
