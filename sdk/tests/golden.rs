//! Keyed-state values as the Rust SDK encodes them match the golden vectors the Python
//! and JavaScript SDKs' tests read too (`tests/fixtures/state-values.json`): postcard
//! through serde, and the plain layout (`sluice_sdk::plain`).

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sluice_sdk::plain::{PlainF64, PlainI64, PlainU64};
use sluice_sdk::{from_bytes, to_bytes};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `value` encodes to `want` and decodes back.
fn check<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: T, want: &str) {
    assert_eq!(hex(&to_bytes(&value).unwrap()), want, "{value:?}");
    let bytes: Vec<u8> = (0..want.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&want[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(from_bytes::<T>(&bytes).unwrap(), value, "{want}");
}

fn int<T: std::str::FromStr>(v: &Value) -> T
where
    T::Err: std::fmt::Debug,
{
    v.as_str().expect("integers are strings").parse().unwrap()
}

#[test]
fn state_values_match_the_golden_vectors_every_sdk_reads() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/state-values.json"
    ))
    .unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let vectors = doc["values"].as_array().unwrap();
    assert!(vectors.len() > 20);
    for v in vectors {
        let (value, want) = (&v["value"], v["hex"].as_str().unwrap());
        match v["type"].as_str().unwrap() {
            "u64" => check(int::<u64>(value), want),
            "i64" => check(int::<i64>(value), want),
            "f64" => check(value.as_f64().unwrap(), want),
            "str" => check(value.as_str().unwrap().to_string(), want),
            "bytes" | "seq<u8>" => check(
                value
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|b| b.as_u64().unwrap() as u8)
                    .collect::<Vec<u8>>(),
                want,
            ),
            "option<u64>" => check((!value.is_null()).then(|| int::<u64>(value)), want),
            "tuple<i64,u64>" => check((int::<i64>(&value[0]), int::<u64>(&value[1])), want),
            "plain-i64" => check(PlainI64(int(value)), want),
            "plain-u64" => check(PlainU64(int(value)), want),
            "plain-f64" => check(PlainF64(value.as_f64().unwrap()), want),
            other => panic!("a golden vector of unknown type {other}"),
        }
    }
}
