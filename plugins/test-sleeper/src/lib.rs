//! `test-sleeper`: a pass-through operator that waits on the host's clocks instead of
//! computing, for the sandbox's tests of time outside Wasm code (not an example).
//!
//! Config:
//! - `sleep-in` (optional): the call that sleeps an hour with `std::thread::sleep` (a
//!   WASI poll on a monotonic-clock pollable, which blocks inside a host call): one of
//!   `open`, `process`, `snapshot`, `on-timers`, `finish`, `close`, `dispose`.
//! - `attempts` (optional, e.g. `0`): sleep only in these restart attempts; by default
//!   always.
//!
//! Every keyed record registers an event-time timer at 1 (so `on-timers` comes, at the
//! latest when the input ends), and the first record of each instance is followed by one record
//! `clock: wall=S mono=N` with what the guest reads from WASI's wall clock (seconds since
//! the epoch) and how far its monotonic clock moved over that call, in nanoseconds.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_sdk::{Context, Error, OpenContext, Operator, Record, Result, Timer};

/// The calls `sleep-in` may name.
pub const CALLS: &[&str] = &[
    "open",
    "process",
    "snapshot",
    "on-timers",
    "finish",
    "close",
    "dispose",
];

/// The operator.
pub struct Sleeper {
    sleep_in: Option<&'static str>,
    reported: bool,
}

impl Sleeper {
    fn maybe_sleep(&self, call: &str) {
        if self.sleep_in == Some(call) {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

impl Operator for Sleeper {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let config = ctx.config();
        config.check_known(&["sleep-in", "attempts"])?;
        let sleep_in = match config.get("sleep-in") {
            None => None,
            Some(name) => Some(*CALLS.iter().find(|c| **c == name).ok_or_else(|| {
                Error::invalid_config(format!(
                    "config `sleep-in` = {name:?}: expected one of {}",
                    CALLS.join(", ")
                ))
            })?),
        };
        let attempts = config
            .get("attempts")
            .map(|list| {
                list.split(',')
                    .map(|a| a.trim().parse::<u32>())
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()
            .map_err(|e| Error::invalid_config(format!("config `attempts`: {e}")))?;
        let active = attempts.is_none_or(|list| list.contains(&ctx.attempt()));
        let sleeper = Sleeper {
            sleep_in: sleep_in.filter(|_| active),
            reported: false,
        };
        sleeper.maybe_sleep("open");
        Ok(sleeper)
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let started = Instant::now();
        self.maybe_sleep("process");
        if let Some(key) = record.key {
            // Fires at the latest when the input ends (the watermark goes to the end).
            ctx.register_event_timer(key, 1);
        }
        ctx.emit(record.key, record.value);
        if !self.reported {
            self.reported = true;
            let wall = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let mono = started.elapsed().as_nanos();
            ctx.emit(None, format!("clock: wall={wall} mono={mono}").as_bytes());
        }
        Ok(())
    }

    fn on_timer(&mut self, _timer: Timer<'_>, _ctx: &mut Context<'_>) -> Result<()> {
        self.maybe_sleep("on-timers");
        Ok(())
    }

    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>> {
        self.maybe_sleep("snapshot");
        Ok(Vec::new())
    }

    fn finish(&mut self, _ctx: &mut Context<'_>) -> Result<()> {
        self.maybe_sleep("finish");
        Ok(())
    }

    fn close(&mut self, _ctx: &mut Context<'_>) -> Result<()> {
        self.maybe_sleep("close");
        Ok(())
    }

    fn dispose(&mut self) {
        self.maybe_sleep("dispose");
    }
}

sluice_sdk::export!(Sleeper);
