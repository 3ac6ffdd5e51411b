//! Independent models of the two-input operators, written from the semantics they
//! follow: Flink's interval join, and rules that hold from their event time on.

use crate::windows::Event;

/// What an interval join of `left` and `right` emits, as `key\tLEFT|RIGHT` lines (the
/// events' lines), sorted: every pair of one key with `left.ts + lower <= right.ts <=
/// left.ts + upper`. (No event may be late: each input's events are within its
/// watermark bound.)
pub fn interval_join(left: &[Event], right: &[Event], lower: i64, upper: i64) -> Vec<String> {
    let mut out = Vec::new();
    for l in left {
        for r in right {
            if l.key == r.key && l.ts + lower <= r.ts && r.ts <= l.ts + upper {
                out.push(format!("{}\t{}|{}", l.key, l.line(), r.line()));
            }
        }
    }
    out.sort();
    out
}

/// What an enrichment of `events` with `rules` emits, as `LINE,RULE` lines, sorted: each
/// event with the value of the rule of its key with the latest time at or before the
/// event's (of two at one time, the later in `rules`), or `-`.
pub fn enrich(events: &[Event], rules: &[Event]) -> Vec<String> {
    let mut out: Vec<String> = events
        .iter()
        .map(|e| {
            let rule = rules
                .iter()
                .filter(|r| r.key == e.key && r.ts <= e.ts)
                // `max_by_key` keeps the last of equal maxima: the later rule.
                .max_by_key(|r| r.ts)
                .map_or("-".to_string(), |r| r.value.to_string());
            format!("{},{rule}", e.line())
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ts: i64, key: &str, value: f64) -> Event {
        Event {
            ts,
            key: key.into(),
            value,
        }
    }

    #[test]
    fn the_join_pairs_records_of_one_key_within_the_bounds() {
        let left = [ev(100, "a", 1.0), ev(100, "b", 2.0)];
        let right = [ev(95, "a", 3.0), ev(111, "a", 4.0), ev(100, "c", 5.0)];
        assert_eq!(interval_join(&left, &right, -5, 10), ["a\t100,a,1|95,a,3"]);
    }

    #[test]
    fn enrichment_takes_the_latest_rule_at_or_before_the_event() {
        let rules = [ev(10, "a", 1.0), ev(20, "a", 2.0), ev(20, "a", 3.0)];
        let events = [ev(5, "a", 0.0), ev(15, "a", 0.0), ev(25, "a", 0.0)];
        assert_eq!(enrich(&events, &rules), ["15,a,0,1", "25,a,0,3", "5,a,0,-"]);
    }
}
