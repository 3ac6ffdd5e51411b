//! What the tests of the Kafka connector's files share.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{KafkaSourceConfig, OutOfRange, StartFrom, Topics};

/// A source of topic `t` on a broker that is never asked (the source connects on its
/// first poll).
pub(super) fn config(bounded: bool) -> KafkaSourceConfig {
    KafkaSourceConfig {
        bootstrap: "127.0.0.1:1".into(),
        topics: Topics::Names(vec!["t".into()]),
        allowed: None,
        start: StartFrom::Earliest,
        on_out_of_range: OutOfRange::Fail,
        group: "g".into(),
        discovery: Duration::from_secs(1),
        properties: BTreeMap::new(),
        bounded,
        split: None,
        format: Box::new(crate::connectors::formats::FormatConfig::bytes()),
        exchange_producers: None,
    }
}
