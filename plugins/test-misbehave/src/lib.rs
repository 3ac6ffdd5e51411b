//! `test-misbehave`: a pass-through operator that misbehaves on request, for the host's
//! sandbox and failure tests (not an example).
//!
//! Config:
//! - `behavior` (default `none`): the misbehaviour, one of the names in [`BEHAVIORS`].
//! - `after` (default 0): records to pass through before a record-triggered misbehaviour.
//! - `attempts` (optional, e.g. `0` or `0,1`): misbehave only when the job's restart attempt
//!   is in this list; by default always.
//! - `delay-ms` (default 2000): how long `slow-snapshot` takes, and how long `slow-process`
//!   waits per record.
//! - `flood-bytes` (default 64 MiB): how many value bytes `emit-flood` emits.
//! - `after-checkpoint` (default `false`): a record-triggered misbehaviour also waits
//!   until a checkpoint taken after the operator saw a record has completed, so a restart
//!   resumes from one (however slowly the machine runs); until then each record past
//!   `after` is held for a millisecond of the host's clock, so the input cannot end first.
//!
//! `error-in-open`, `invalid-config` and `panic-in-open` happen in `open`;
//! `panic-in-snapshot`, `slow-snapshot`, `panic-in-finish`, `panic-in-close` and
//! `emit-in-close` (one record, which `close` may not emit) in those calls, every time. All other behaviours are triggered by record number `after` (counting
//! from 0) and happen once per instance: the fatal ones end the call; the reporting ones
//! (`read-file`, `open-socket`, `read-env`) emit one record `<behavior>: <result>` and the
//! flooding ones emit, log or print their flood, after which the triggering record and all
//! later ones pass through.
//!
//! `snapshot` gets no context, so it cannot read the host's clock: `slow-snapshot` busy-waits
//! for a number of iterations calibrated in `open` against the host's processing time, at
//! the fastest rate seen (assuming 10⁶ iterations per millisecond when that clock stands
//! still, as in the test harness).

use std::hint::black_box;

use sluice_sdk::{Context, Error, OpenContext, Operator, Record, Result};

/// Names of the behaviours, as given in config `behavior`.
pub const BEHAVIORS: &[&str] = &[
    "none",
    "error-in-open",
    "invalid-config",
    "panic-in-open",
    "panic-in-process",
    "error-in-process",
    "loop-in-process",
    "panic-in-snapshot",
    "slow-snapshot",
    "slow-process",
    "panic-in-close",
    "emit-in-close",
    "panic-in-finish",
    "memory-bomb",
    "stack-overflow",
    "emit-flood",
    "read-file",
    "open-socket",
    "read-env",
    "log-flood",
    "print-flood",
];

/// The operator.
pub struct Misbehave {
    behavior: &'static str,
    delay_ms: u64,
    after: u64,
    seen: u64,
    done: bool,
    flood_bytes: usize,
    snapshot_spins: u64,
    after_checkpoint: bool,
    /// Checkpoints taken after a record was seen, not yet completed.
    taken: Vec<u64>,
    /// One of them completed.
    checkpointed: bool,
}

impl Operator for Misbehave {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let config = ctx.config();
        config.check_known(&[
            "behavior",
            "after",
            "attempts",
            "delay-ms",
            "flood-bytes",
            "after-checkpoint",
        ])?;
        let name = config.get("behavior").unwrap_or("none");
        let Some(&behavior) = BEHAVIORS.iter().find(|b| **b == name) else {
            let known = BEHAVIORS.join(", ");
            let why = format!("config `behavior` = {name:?}: expected one of {known}");
            return Err(Error::invalid_config(why));
        };
        let attempts = config.get("attempts").map(|list| {
            list.split(',')
                .map(|a| a.trim().parse::<u32>())
                .collect::<Result<Vec<_>, _>>()
        });
        let attempts = attempts.transpose().map_err(|e| {
            Error::invalid_config(format!("config `attempts`: not a list of numbers: {e}"))
        })?;
        let active = attempts.is_none_or(|list| list.contains(&ctx.attempt()));
        let behavior = if active { behavior } else { "none" };
        match behavior {
            "error-in-open" => {
                return Err(Error::failed("test-misbehave: deliberate error in open"));
            }
            "invalid-config" => {
                return Err(Error::invalid_config(
                    "test-misbehave: deliberate invalid-config",
                ));
            }
            "panic-in-open" => panic!("test-misbehave: deliberate panic in open"),
            _ => {}
        }
        let delay_ms: u64 = config.parse_or("delay-ms", 2000)?;
        let snapshot_spins = match behavior {
            "slow-snapshot" => spins_per_ms(ctx).saturating_mul(delay_ms),
            _ => 0,
        };
        Ok(Misbehave {
            behavior,
            delay_ms,
            after: config.parse_or("after", 0)?,
            seen: 0,
            done: false,
            flood_bytes: config.parse_or("flood-bytes", 64 << 20)?,
            snapshot_spins,
            after_checkpoint: config.parse_or("after-checkpoint", false)?,
            taken: Vec::new(),
            checkpointed: false,
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        self.seen += 1;
        if self.behavior == "slow-process" && self.seen > self.after {
            // A slow operator (or sink): waits on the host's clock for every record.
            let until = ctx.processing_time() + self.delay_ms as i64;
            while ctx.processing_time() < until {
                spin(1000);
            }
        }
        let ready = !self.after_checkpoint || self.checkpointed;
        if self.seen > self.after && !self.done && !ready {
            // Past the trigger but no checkpoint has completed yet: hold each record for a
            // millisecond of the host's clock so that a short input cannot end first.
            // (At most 10⁶ iterations, in case that clock stands still, as in the harness.)
            let until = ctx.processing_time() + 1;
            for _ in 0..1000 {
                if ctx.processing_time() >= until {
                    break;
                }
                spin(1000);
            }
        }
        if self.seen > self.after && !self.done && ready {
            self.done = true;
            self.misbehave(ctx)?;
        }
        ctx.emit_record(record);
        Ok(())
    }

    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>> {
        if self.seen > 0 {
            self.taken.push(checkpoint_id);
        }
        match self.behavior {
            "panic-in-snapshot" => panic!("test-misbehave: deliberate panic in snapshot"),
            "slow-snapshot" => spin(self.snapshot_spins),
            _ => {}
        }
        Ok(Vec::new())
    }

    fn notify_complete(&mut self, checkpoint_id: u64) -> Result<()> {
        self.checkpointed |= self.taken.contains(&checkpoint_id);
        self.taken.retain(|&id| id > checkpoint_id);
        Ok(())
    }

    fn finish(&mut self, _ctx: &mut Context<'_>) -> Result<()> {
        if self.behavior == "panic-in-finish" {
            panic!("test-misbehave: deliberate panic in finish");
        }
        Ok(())
    }

    fn close(&mut self, ctx: &mut Context<'_>) -> Result<()> {
        match self.behavior {
            "panic-in-close" => panic!("test-misbehave: deliberate panic in close"),
            "emit-in-close" => ctx.emit(None, b"emitted in close"),
            _ => {}
        }
        Ok(())
    }
}

impl Misbehave {
    /// The record-triggered behaviours.
    fn misbehave(&self, ctx: &mut Context<'_>) -> Result<()> {
        let report = match self.behavior {
            "panic-in-process" => panic!("test-misbehave: deliberate panic in process"),
            "error-in-process" => {
                return Err(Error::failed("test-misbehave: deliberate error in process"));
            }
            "loop-in-process" => loop {
                spin(1 << 20);
            },
            "memory-bomb" => memory_bomb(),
            "stack-overflow" => format!("stack-overflow: returned {}", recurse(0)),
            "read-file" => match std::fs::read("/etc/passwd") {
                Ok(bytes) => format!("read-file: Ok({} bytes)", bytes.len()),
                Err(e) => format!("read-file: Err({e})"),
            },
            "open-socket" => match std::net::TcpStream::connect("127.0.0.1:80") {
                Ok(_) => "open-socket: Ok(connected)".to_owned(),
                Err(e) => format!("open-socket: Err({e})"),
            },
            "read-env" => {
                let mut names: Vec<String> = std::env::vars().map(|(name, _)| name).collect();
                names.sort();
                format!("read-env: {names:?}")
            }
            "emit-flood" => return emit_flood(ctx, self.flood_bytes),
            "log-flood" => return log_flood(ctx),
            "print-flood" => return print_flood(),
            _ => return Ok(()),
        };
        ctx.emit(None, report.as_bytes());
        Ok(())
    }
}

/// Emits records of 64 KiB values until `bytes` value bytes went out.
fn emit_flood(ctx: &mut Context<'_>, bytes: usize) -> Result<()> {
    let chunk = vec![b'x'; 64 << 10];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        ctx.emit(None, &chunk[..n]);
        left -= n;
    }
    Ok(())
}

/// Logs 100 000 lines through the host.
fn log_flood(ctx: &mut Context<'_>) -> Result<()> {
    for i in 0..100_000 {
        ctx.info(&format!("test-misbehave: log line {i}"));
    }
    Ok(())
}

/// Prints 100 000 lines to stdout and to stderr.
fn print_flood() -> Result<()> {
    for i in 0..100_000 {
        println!("test-misbehave: stdout line {i}");
        eprintln!("test-misbehave: stderr line {i}");
    }
    Ok(())
}

/// Busy work the optimizer cannot remove.
fn spin(iterations: u64) {
    let mut x = 0u64;
    for i in 0..iterations {
        x = black_box(x.wrapping_add(i));
    }
    black_box(x);
}

/// Iterations of [`spin`] per millisecond of the host's clock.
fn spins_per_ms(ctx: &OpenContext<'_>) -> u64 {
    const ROUND: u64 = 100_000;
    // The fastest of four 5 ms windows: on a loaded machine some windows lose the CPU to
    // other threads, which would make the estimate, and so the delay, too small.
    let mut best = 0;
    for _ in 0..4 {
        let start = ctx.processing_time();
        let mut rounds = 0;
        while ctx.processing_time() - start < 5 && rounds < 500 {
            spin(ROUND);
            rounds += 1;
        }
        if let Ok(elapsed) = u64::try_from(ctx.processing_time() - start)
            && elapsed > 0
        {
            best = best.max(rounds * ROUND / elapsed);
        }
    }
    if best == 0 { 1_000_000 } else { best }
}

/// Allocates and touches 1 MiB blocks until the memory limit stops it.
fn memory_bomb() -> ! {
    let mut hoard = Vec::new();
    loop {
        let mut block = vec![0u8; 1 << 20];
        block.iter_mut().step_by(4096).for_each(|b| *b = 1);
        hoard.push(black_box(block));
    }
}

/// Recurses until the stack runs out; the addition after the call prevents tail calls.
fn recurse(depth: u64) -> u64 {
    let frame = black_box([depth; 32]);
    if black_box(depth) == u64::MAX {
        return frame[0];
    }
    recurse(depth + 1).wrapping_add(frame[31])
}

sluice_sdk::export!(Misbehave);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{Harness, HarnessBuilder};

    fn with(behavior: &str) -> HarnessBuilder<Misbehave> {
        Harness::<Misbehave>::builder().config("behavior", behavior)
    }

    #[test]
    fn passes_through_until_after_then_fails() -> Result<()> {
        let mut h = with("error-in-process").config("after", "2").open()?;
        h.process_value("a")?;
        h.process_value("b")?;
        let err = h.process_value("c").unwrap_err();
        assert_eq!(
            err,
            Error::failed("test-misbehave: deliberate error in process")
        );
        assert_eq!(h.output_values_str(), ["a", "b"]);
        Ok(())
    }

    #[test]
    fn open_behaviours_and_attempts() {
        let err = with("error-in-open").open().unwrap_err();
        assert!(
            !err.is_invalid_config() && err.message().contains("deliberate"),
            "{err}"
        );
        assert!(
            with("invalid-config")
                .open()
                .unwrap_err()
                .is_invalid_config()
        );
        assert!(
            with("error-in-open")
                .config("attempts", "0, 1")
                .attempt(1)
                .open()
                .is_err()
        );
        assert!(
            with("error-in-open")
                .config("attempts", "0,1")
                .attempt(2)
                .open()
                .is_ok()
        );
        let err = with("explode").open().unwrap_err();
        assert!(
            err.is_invalid_config() && err.message().contains("panic-in-process"),
            "{err}"
        );
        let err = with("none").config("attempts", "first").open().unwrap_err();
        assert!(
            err.is_invalid_config() && err.message().contains("`attempts`"),
            "{err}"
        );
    }

    #[test]
    #[should_panic(expected = "test-misbehave: deliberate panic in process")]
    fn panic_in_process() {
        let mut h = with("panic-in-process").open().unwrap();
        let _ = h.process_value("x");
    }

    #[test]
    fn reports_and_floods_happen_once() -> Result<()> {
        let mut h = with("read-env").open()?;
        h.process_value("x")?;
        h.process_value("y")?;
        let out = h.output_values_str();
        assert!(out[0].starts_with("read-env: "), "{out:?}");
        assert_eq!(out[1..], ["x", "y"]);

        let mut h = with("read-file").open()?;
        h.process_value("x")?;
        assert!(h.output_values_str()[0].starts_with("read-file: "));

        let mut h = with("emit-flood").config("flood-bytes", "200000").open()?;
        h.process_value("x")?;
        let flood: usize = h.output().iter().map(|r| r.value.len()).sum();
        assert_eq!(flood, 200_000 + 1);

        let mut h = with("log-flood").open()?;
        h.process_value("x")?;
        h.process_value("y")?;
        assert_eq!(h.logs().len(), 100_000);
        Ok(())
    }

    #[test]
    fn slow_snapshot_returns() -> Result<()> {
        let mut h = with("slow-snapshot").config("delay-ms", "1").open()?;
        assert!(h.snapshot(1)?.operator_state().is_empty());
        Ok(())
    }

    #[test]
    #[should_panic(expected = "deliberate panic in finish")]
    fn panic_in_finish() {
        let _ = with("panic-in-finish").open().unwrap().finish();
    }
}
