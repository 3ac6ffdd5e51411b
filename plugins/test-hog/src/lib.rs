//! `test-hog`: a pass-through operator that makes the host hold ever more, for the
//! sandbox's tests of host-memory limits (not an example).
//!
//! Config `hog` (default `none`) says what every record adds, `per-record` (default 100)
//! how many times:
//! - `keys`: a 100-byte value under a new map key (in the record's key's map);
//! - `values`: a 16 KiB value under a new map key;
//! - `list`: a 100-byte element appended to one list;
//! - `ttl`: a 100-byte value under a new map key of a map state with a 1 ms TTL (which
//!   the host must drop, so this one holds little);
//! - `timers`: a processing-time timer a day ahead, at a new time;
//! - `timer-keys`: a processing-time timer a day ahead under a new key of `line-bytes`
//!   bytes;
//! - `counters`: an increment of a new counter name;
//! - `timer-loop`: (once per record) an event-time timer at 1, which re-registers itself
//!   at its own time each time it fires, for ever;
//! - `log`: a log line of `line-bytes` bytes (default 1 MiB) with a line break inside;
//! - `fail`: fails the call with a message of `line-bytes` bytes.

use std::time::Duration;

use sluice_sdk::{
    Context, Error, Level, ListState, MapState, OpenContext, Operator, Record, Result, Timer,
};

/// The operator.
pub struct Hog {
    hog: String,
    per_record: u64,
    line_bytes: usize,
    n: u64,
    values: MapState<u64, Vec<u8>>,
    expiring: MapState<u64, Vec<u8>>,
    list: ListState<Vec<u8>>,
}

impl Operator for Hog {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let config = ctx.config();
        config.check_known(&["hog", "per-record", "line-bytes"])?;
        let hog = config.get("hog").unwrap_or("none").to_string();
        let known = [
            "none",
            "keys",
            "values",
            "list",
            "ttl",
            "timers",
            "timer-keys",
            "counters",
            "timer-loop",
            "log",
            "fail",
        ];
        if !known.contains(&hog.as_str()) {
            return Err(Error::invalid_config(format!(
                "config `hog` = {hog:?}: expected one of {}",
                known.join(", ")
            )));
        }
        let number = |name: &str, default: u64| -> Result<u64> {
            config.get(name).map_or(Ok(default), |v| {
                v.parse()
                    .map_err(|e| Error::invalid_config(format!("config `{name}`: {e}")))
            })
        };
        let per_record = number("per-record", 100)?;
        let line_bytes = number("line-bytes", 1 << 20)? as usize;
        Ok(Hog {
            hog,
            per_record,
            line_bytes,
            n: 0,
            values: ctx.map_state("values")?,
            expiring: ctx.map_state_with_ttl("expiring", Duration::from_millis(1))?,
            list: ctx.list_state("list")?,
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        ctx.emit(record.key, record.value);
        let key = record.key.unwrap_or(b"");
        if self.hog == "timer-loop" {
            ctx.register_event_timer(key, 1);
            return Ok(());
        }
        if self.hog == "log" {
            let mut line = "x".repeat(self.line_bytes);
            line.insert_str(0, "start\nINFO forged line\n");
            ctx.log(Level::Info, &line);
            return Ok(());
        }
        if self.hog == "fail" {
            return Err(Error::failed("y".repeat(self.line_bytes)));
        }
        for _ in 0..self.per_record {
            self.n += 1;
            let n = self.n;
            match self.hog.as_str() {
                "keys" => self.values.put(ctx, key, &n, &vec![7; 100])?,
                "values" => self.values.put(ctx, key, &n, &vec![7; 16 << 10])?,
                "list" => self.list.add(ctx, key, &vec![7; 100])?,
                "ttl" => self.expiring.put(ctx, key, &n, &vec![7; 100])?,
                "timers" => {
                    let at = ctx.processing_time() + 86_400_000 + self.n as i64;
                    ctx.register_processing_timer(key, at);
                }
                "timer-keys" => {
                    let mut key = n.to_le_bytes().to_vec();
                    key.resize(self.line_bytes.max(8), b'k');
                    let at = ctx.processing_time() + 86_400_000;
                    ctx.register_processing_timer(&key, at);
                }
                "counters" => ctx.add_counter(&format!("c{}", self.n), 1),
                _ => {}
            }
        }
        Ok(())
    }

    fn on_timer(&mut self, timer: Timer<'_>, ctx: &mut Context<'_>) -> Result<()> {
        if self.hog == "timer-loop" {
            ctx.register_event_timer(timer.key, timer.timestamp);
        }
        Ok(())
    }
}

sluice_sdk::export!(Hog);
