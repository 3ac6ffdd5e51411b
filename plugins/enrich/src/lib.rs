//! `enrich`: a keyed main stream enriched with a broadcast stream of rules, as of event
//! time (Flink's broadcast state pattern, made deterministic).
//!
//! One input is broadcast (`{ from = "rules", broadcast = true }` in the job file): its
//! records are rules, fields of their value split by `separator`: the key at field
//! `rule_key_field` (default 1) and the rule at field `rule_value_field` (default 2),
//! valid from the rule record's event time on. The other input, keyed (`key_by`), is the
//! main stream: each record at time `t` leaves with its value followed by `separator` and
//! the rule of its key that held at `t` — the latest one at or before `t` (of two at the
//! same time, the later to arrive) — or `default` (default `-`) when none did.
//!
//! A main record waits (in keyed list state `pending`, with an event-time timer) until
//! the watermark reaches its time: the operator's watermark is the lower of its inputs',
//! so by then every rule up to `t` has arrived, whatever order the two streams interleave
//! in. So the output does not depend on how the streams' records are interleaved — at any
//! parallelism, batch size, or after a restore.
//!
//! The rules are broadcast state: every subtask receives every rule and keeps the same
//! map (key → rules by time), returned by `snapshot` and given back to every subtask on
//! restore at any parallelism. Every version is kept (a rules stream is small): a main
//! record restored with an older watermark may still need an old one.
//!
//! Config: `rule_key_field`, `rule_value_field`, `separator` (default `,`), `default`.

use std::collections::BTreeMap;

use sluice_sdk::{Context, Error, ListState, OpenContext, Operator, Record, Result, Timer};

sluice_sdk::config_keys!(KEYS = ["rule_key_field", "rule_value_field", "separator", "default"]);

/// Rules by key: each key's rules by the time they start to hold, in arrival order.
type Rules = BTreeMap<Vec<u8>, Vec<(i64, Vec<u8>)>>;

/// The operator.
pub struct Enrich {
    /// The input number of the rules.
    rules_input: u32,
    rules: Rules,
    pending: ListState<(i64, Vec<u8>)>,
    key_field: usize,
    value_field: usize,
    separator: String,
    default: Vec<u8>,
}

impl Operator for Enrich {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        ctx.config().check_known(KEYS)?;
        let broadcast: Vec<u32> = (0..ctx.inputs().len() as u32)
            .filter(|&i| ctx.inputs()[i as usize].broadcast)
            .collect();
        let [rules_input] = broadcast[..] else {
            return Err(Error::invalid_config(format!(
                "enrich reads two inputs, the main stream (keyed) and the rules \
                 (`{{ from = \"RULES\", broadcast = true }}`); it has {} inputs, {} broadcast",
                ctx.inputs().len(),
                broadcast.len()
            )));
        };
        if ctx.inputs().len() != 2 || !ctx.is_keyed() {
            return Err(Error::invalid_config(
                "enrich reads two inputs: the main stream, keyed by the key rules apply to \
                 (`key_by`), and the broadcast rules",
            ));
        }
        let separator = ctx.config().get("separator").unwrap_or(",").to_string();
        if separator.is_empty() {
            return Err(Error::invalid_config(
                "config `separator` must not be empty",
            ));
        }
        Ok(Enrich {
            rules_input,
            rules: ctx.restore()?.unwrap_or_default(),
            pending: ctx.list_state("pending")?,
            key_field: ctx.config().parse_or("rule_key_field", 1)?,
            value_field: ctx.config().parse_or("rule_value_field", 2)?,
            separator,
            default: ctx
                .config()
                .get("default")
                .unwrap_or("-")
                .as_bytes()
                .to_vec(),
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let Some(time) = record.timestamp else {
            return Err(Error::failed(
                "enrich needs event time: give both sources a `timestamp`",
            ));
        };
        if ctx.input_index() == self.rules_input {
            return self.add_rule(record.value, time);
        }
        let key = record.require_key()?;
        if time <= ctx.current_watermark() {
            // Every rule up to `time` is here already.
            self.emit(ctx, key, record.value, time);
            return Ok(());
        }
        self.pending.add(ctx, key, &(time, record.value.to_vec()))?;
        ctx.register_event_timer(key, time);
        Ok(())
    }

    fn on_timer(&mut self, timer: Timer<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let (due, rest): (Vec<_>, Vec<_>) = self
            .pending
            .get(ctx, timer.key)?
            .into_iter()
            .partition(|(t, _)| *t <= timer.timestamp);
        self.pending.clear(ctx, timer.key)?;
        for entry in &rest {
            self.pending.add(ctx, timer.key, entry)?;
        }
        for (time, value) in due {
            self.emit(ctx, timer.key, &value, time);
        }
        Ok(())
    }

    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>> {
        sluice_sdk::to_bytes(&self.rules)
    }
}

impl Enrich {
    fn add_rule(&mut self, value: &[u8], time: i64) -> Result<()> {
        let text = std::str::from_utf8(value)
            .map_err(|_| Error::failed("a rule record's value is not UTF-8"))?;
        let field = |n: usize| {
            text.split(self.separator.as_str()).nth(n).ok_or_else(|| {
                Error::failed(format!(
                    "rule {text:?} has no field {n} (fields separated by {:?})",
                    self.separator
                ))
            })
        };
        let (key, rule) = (field(self.key_field)?, field(self.value_field)?);
        let versions = self.rules.entry(key.as_bytes().to_vec()).or_default();
        // After the ones at or before its time: of two at one time the later one wins.
        let at = versions.partition_point(|(t, _)| *t <= time);
        versions.insert(at, (time, rule.as_bytes().to_vec()));
        Ok(())
    }

    /// Emits `value` with the rule of `key` that held at `time`.
    fn emit(&self, ctx: &mut Context<'_>, key: &[u8], value: &[u8], time: i64) {
        let rule = self
            .rules
            .get(key)
            .and_then(|v| v[..v.partition_point(|(t, _)| *t <= time)].last())
            .map_or(self.default.as_slice(), |(_, rule)| rule.as_slice());
        let mut out = Vec::with_capacity(value.len() + self.separator.len() + rule.len());
        out.extend_from_slice(value);
        out.extend_from_slice(self.separator.as_bytes());
        out.extend_from_slice(rule);
        ctx.emit_at(Some(key), &out, Some(time));
    }
}

sluice_sdk::export!(Enrich);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::Harness;

    fn harness() -> Harness<Enrich> {
        Harness::<Enrich>::builder()
            .input("events", false)
            .input("rules", true)
            .keyed(true)
            .open()
            .unwrap()
    }

    fn values(h: &mut Harness<Enrich>) -> Vec<String> {
        h.take_output()
            .into_iter()
            .map(|r| String::from_utf8(r.value).unwrap())
            .collect()
    }

    #[test]
    fn applies_the_rule_that_held_at_each_records_time_whatever_arrives_first() {
        let mut h = harness();
        // The main record comes before the rules that held at its time.
        h.process_on(0, Some("k1"), "250,k1,a", Some(250)).unwrap();
        h.process_on(0, Some("k1"), "50,k1,b", Some(50)).unwrap();
        h.process_on(0, Some("k2"), "300,k2,c", Some(300)).unwrap();
        assert!(h.take_output().is_empty(), "they wait for the watermark");
        h.process_on(1, None::<&str>, "100,k1,GOLD", Some(100))
            .unwrap();
        h.process_on(1, None::<&str>, "200,k1,SILVER", Some(200))
            .unwrap();
        h.process_on(1, None::<&str>, "400,k1,LEAD", Some(400))
            .unwrap();
        h.process_watermark(1000).unwrap();
        let mut out = values(&mut h);
        out.sort();
        assert_eq!(out, ["250,k1,a,SILVER", "300,k2,c,-", "50,k1,b,-"]);
        // Behind the watermark: enriched at once.
        h.process_on(0, Some("k1"), "150,k1,d", Some(150)).unwrap();
        assert_eq!(values(&mut h), ["150,k1,d,GOLD"]);
    }

    #[test]
    fn the_rules_are_its_snapshot_and_come_back_on_restore() {
        let mut h = harness();
        h.process_on(1, None::<&str>, "100,k1,GOLD", Some(100))
            .unwrap();
        h.process_on(0, Some("k1"), "150,k1,x", Some(150)).unwrap();
        let snapshot = h.snapshot(1).unwrap();
        let mut h = Harness::<Enrich>::builder()
            .input("events", false)
            .input("rules", true)
            .keyed(true)
            .restore_from(&snapshot)
            .open()
            .unwrap();
        h.process_watermark(200).unwrap();
        assert_eq!(values(&mut h), ["150,k1,x,GOLD"]);
    }

    #[test]
    fn needs_one_broadcast_input_and_a_keyed_one() {
        let no_rules = Harness::<Enrich>::builder()
            .input("a", false)
            .input("b", false)
            .keyed(true)
            .open();
        assert!(no_rules.is_err());
        let unkeyed = Harness::<Enrich>::builder()
            .input("a", false)
            .input("rules", true)
            .open();
        assert!(unkeyed.is_err());
    }
}
