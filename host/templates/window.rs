//! `{{name}}`: sums the numbers of each key in tumbling event-time windows and emits
//! `start,end,sum` per key and window when the watermark passes the window's end.
//! Records of windows already emitted are dropped and counted (`late-records-dropped`).
//!
//! Input: keyed (`key_by`), with event time (`timestamp` on the source); the value's
//! last comma-separated field is the number. Config: `size-ms` (default 10000).

use sluice_sdk::{Context, Error, MapState, OpenContext, Operator, Record, Result, Timer};

sluice_sdk::config_keys!(KEYS = ["size-ms"]);

/// The operator.
pub struct {{Type}} {
    size: i64,
    /// Per key: window start → sum so far.
    sums: MapState<i64, i64>,
}

impl Operator for {{Type}} {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let config = ctx.config();
        config.check_known(KEYS)?;
        let size: i64 = config.parse_or("size-ms", 10_000)?;
        if size <= 0 {
            return Err(Error::invalid_config("`size-ms` must be at least 1"));
        }
        if !ctx.is_keyed() {
            return Err(Error::invalid_config(
                "{{name}} needs keyed input: set `key_by` for it in the job file",
            ));
        }
        Ok({{Type}} {
            size,
            sums: ctx.map_state("sums")?,
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let key = record.require_key()?;
        let Some(timestamp) = record.timestamp else {
            return Err(Error::failed(
                "a record without event time: set `timestamp` on the job's source",
            ));
        };
        let start = timestamp - timestamp.rem_euclid(self.size);
        let end = start + self.size;
        if end - 1 <= ctx.current_watermark() {
            ctx.add_counter("late-records-dropped", 1);
            return Ok(());
        }
        let text = record.value_str()?;
        let field = text.rsplit(',').next().unwrap_or(text).trim();
        let number: i64 = field
            .parse()
            .map_err(|_| Error::failed(format!("{text:?}: {field:?} is not a number")))?;
        let sum = self.sums.get(ctx, key, &start)?.unwrap_or(0) + number;
        self.sums.put(ctx, key, &start, &sum)?;
        ctx.register_event_timer(key, end - 1);
        Ok(())
    }

    fn on_timer(&mut self, timer: Timer<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let start = timer.timestamp + 1 - self.size;
        if let Some(sum) = self.sums.get(ctx, timer.key, &start)? {
            let line = format!("{start},{},{sum}", start + self.size);
            ctx.emit_at(Some(timer.key), line.as_bytes(), Some(timer.timestamp));
            self.sums.remove(ctx, timer.key, &start)?;
        }
        Ok(())
    }
}

sluice_sdk::export!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::Harness;

    #[test]
    fn sums_per_key_and_window_and_drops_late_records() -> Result<()> {
        let mut h = Harness::<{{Type}}>::builder()
            .keyed(true)
            .config("size-ms", "10")
            .open()?;
        h.process(Some("a"), "1,a,5", Some(1))?;
        h.process(Some("a"), "9,a,2", Some(9))?;
        h.process(Some("a"), "12,a,1", Some(12))?;
        h.process_watermark(10)?;
        assert_eq!(h.output_values_str(), ["0,10,7"]);
        // Its window has fired: late.
        h.process(Some("a"), "3,a,4", Some(3))?;
        assert_eq!(h.counter("late-records-dropped"), 1);
        h.process_watermark(i64::MAX)?;
        assert_eq!(h.output_values_str(), ["0,10,7", "10,20,1"]);
        Ok(())
    }
}
