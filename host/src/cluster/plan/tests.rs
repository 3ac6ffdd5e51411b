use super::*;

/// The graph of a job file whose `[source]`, operators and `[sink]` are `body`.
pub(crate) fn graph(body: &str) -> JobGraph {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.toml");
    std::fs::write(&path, format!("name = \"j\"\n{body}")).unwrap();
    crate::job::load_graph(&path).unwrap()
}

pub(crate) const KAFKA_SOURCE: &str =
    "[source]\ntype = \"kafka\"\nbootstrap = \"127.0.0.1:1\"\ntopics = \"in\"\n";
pub(crate) const KAFKA_SINK: &str =
    "[sink]\ntype = \"kafka\"\nbootstrap = \"127.0.0.1:1\"\ntopic = \"out\"\n";
pub(crate) const COUNT: &str =
    "[[operator]]\nname = \"count\"\nplugin = \"c.wasm\"\nkey_by = \"key\"\n";
pub(crate) const CLUSTER: &str =
    "[checkpoint]\ninterval_ms = 100\n[cluster]\ncheckpoints = \"s\"\n";

fn plan_error(body: &str) -> String {
    let g = graph(body);
    let settings = ClusterSettings::of(&g, Some("127.0.0.1:1"), None).unwrap();
    format!("{:#}", Plan::new(&g, &settings).unwrap_err())
}

#[test]
fn only_kafka_sources_and_exactly_once_kafka_sinks_without_fan_outs_are_planned() {
    let file_source = "[source]\ntype = \"file\"\npath = \"in.txt\"\n";
    let e = plan_error(&format!("{file_source}{COUNT}{KAFKA_SINK}{CLUSTER}"));
    assert!(e.contains("must be a Kafka source"), "{e}");
    let file_sink = "[sink]\ntype = \"file\"\npath = \"out.txt\"\n";
    let e = plan_error(&format!("{KAFKA_SOURCE}{COUNT}{file_sink}{CLUSTER}"));
    assert!(e.contains("must be an exactly-once Kafka sink"), "{e}");
    let at_least_once = KAFKA_SINK.to_string() + "delivery = \"at-least-once\"\n";
    let e = plan_error(&format!("{KAFKA_SOURCE}{COUNT}{at_least_once}{CLUSTER}"));
    assert!(e.contains("must be an exactly-once Kafka sink"), "{e}");
    let pattern = KAFKA_SOURCE.replace("topics = \"in\"", "topics = { pattern = \"i.*\" }");
    let e = plan_error(&format!("{pattern}{COUNT}{KAFKA_SINK}{CLUSTER}"));
    assert!(e.contains("must name its topics"), "{e}");
    // Two sinks of one operator: a fan-out, which would write two topics.
    let two_sinks = "[[sink]]\nname = \"a\"\ntype = \"kafka\"\nbootstrap = \"b:1\"\ntopic = \"x\"\n\
         [[sink]]\nname = \"b\"\ntype = \"kafka\"\nbootstrap = \"b:1\"\ntopic = \"y\"\n\
         inputs = [\"count\"]";
    let e = plan_error(&format!("{KAFKA_SOURCE}{COUNT}{two_sinks}\n{CLUSTER}"));
    assert!(e.contains("operator 'count' feeds several vertices"), "{e}");
    // A graph that fits gets as far as asking the (unreachable) brokers.
    let e = plan_error(&format!("{KAFKA_SOURCE}{COUNT}{KAFKA_SINK}{CLUSTER}"));
    assert!(
        e.contains("reading the partitions of source 'source'"),
        "{e}"
    );
}

/// The plan of `graph` as [`Plan::new`] makes it when every source topic has 2
/// partitions (without asking the brokers), with `exchange_partitions`.
fn plan_of(g: &JobGraph, exchange_partitions: u32) -> (Plan, ClusterSettings) {
    let settings = ClusterSettings {
        exchange_partitions,
        ..ClusterSettings::of(g, Some("127.0.0.1:1"), None).unwrap()
    };
    let plan = Plan::cut(g, &settings, |src| {
        let SourceInput::Kafka(k) = &src.input else {
            unreachable!()
        };
        let Topics::Names(topics) = &k.topics else {
            unreachable!()
        };
        Ok(vec![(topics[0].clone(), 0), (topics[0].clone(), 1)])
    })
    .unwrap();
    (plan, settings)
}

#[test]
fn each_stage_checkpoints_half_an_interval_after_the_one_it_reads() {
    let g = graph(&format!(
        "{KAFKA_SOURCE}[[operator]]\nname = \"tokenize\"\nplugin = \"t.wasm\"\n\
         {COUNT}[[operator]]\nname = \"upper\"\nplugin = \"u.wasm\"\nkey_by = \"key\"\n\
         {KAFKA_SINK}{CLUSTER}"
    ));
    let (plan, settings) = plan_of(&g, 2);
    assert_eq!(plan.stages.len(), 3);
    assert_eq!(plan.units(), 6);
    assert_eq!(plan.describe(3), "stage 1: sluice-j.exchange-1/1 -> count");
    assert_eq!(
        plan.describe(5),
        "stage 2: sluice-j.exchange-2/1 -> upper -> sink"
    );
    let dir = tempfile::tempdir().unwrap();
    let phase = |unit: u32| {
        let g = plan
            .unit_graph(unit, &settings, dir.path(), "attempt=a", None)
            .unwrap();
        g.checkpoint.unwrap().phase
    };
    let ms = Duration::from_millis;
    // (`CLUSTER` checkpoints every 100 ms.)
    assert_eq!(phase(0), Some(ms(0)));
    assert_eq!(phase(1), Some(ms(0)));
    assert_eq!(phase(2), Some(ms(50)), "the stage after the source's");
    assert_eq!(phase(3), Some(ms(50)));
    assert_eq!(phase(4), Some(ms(0)), "the stage after that");
}

/// Two Kafka sources `a` and `b`, events of `time,key,value`.
const TWO_SOURCES: &str = "[[source]]\nname = \"a\"\ntype = \"kafka\"\n\
    bootstrap = \"127.0.0.1:1\"\ntopics = \"in-a\"\ntimestamp = { field = 0 }\n\
    [[source]]\nname = \"b\"\ntype = \"kafka\"\nbootstrap = \"127.0.0.1:1\"\n\
    topics = \"in-b\"\ntimestamp = { field = 0 }\n";

#[test]
fn a_join_reads_two_exchange_topics_partitioned_alike() {
    let g = graph(&format!(
        "{TWO_SOURCES}[[operator]]\nname = \"join\"\nplugin = \"j.wasm\"\n\
         inputs = [\"a\", \"b\"]\nkey_by = {{ field = 1 }}\n{KAFKA_SINK}{CLUSTER}"
    ));
    let (plan, settings) = plan_of(&g, 3);
    // A stage for each source (2 units each), then 3 units of the join.
    assert_eq!(plan.stages.len(), 3);
    assert_eq!(plan.units(), 7);
    assert_eq!(
        plan.exchange_topics(),
        [
            ("sluice-j.exchange-2-0".to_string(), 3),
            ("sluice-j.exchange-2-1".to_string(), 3)
        ]
    );
    assert_eq!(plan.output_topic(0), "sluice-j.exchange-2-0");
    assert_eq!(plan.output_topic(2), "sluice-j.exchange-2-1");
    assert_eq!(plan.output_topic(6), "out");
    assert_eq!(
        plan.describe(5),
        "stage 2: sluice-j.exchange-2-0/1 + sluice-j.exchange-2-1/1 -> join -> sink"
    );
    // Both sides keyed into 3 partitions by the join's key.
    for unit in [0, 3] {
        let sink = plan.unit_sink(unit, &settings).unwrap();
        let exchange = sink.kafka.unwrap().exchange.unwrap();
        assert_eq!((exchange.partitions, exchange.key.is_some()), (3, true));
    }
    let dir = tempfile::tempdir().unwrap();
    let unit = plan
        .unit_graph(5, &settings, dir.path(), "attempt=a", None)
        .unwrap();
    // Each source: its name, the partition it reads, its producers.
    let reads: Vec<String> = unit
        .sources()
        .map(|s| match &s.input {
            SourceInput::Kafka(k) => {
                format!("{} {:?} {:?}", s.name, k.split, k.exchange_producers)
            }
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(
        reads,
        [
            "exchange-0 Some((\"sluice-j.exchange-2-0\", 1)) Some(2)",
            "exchange-1 Some((\"sluice-j.exchange-2-1\", 1)) Some(2)",
        ]
    );
    let inputs: Vec<u32> = unit
        .edges
        .iter()
        .filter(|e| e.to == 2)
        .map(|e| e.input)
        .collect();
    assert_eq!(inputs, [0, 1], "each side its own input of the join");
    assert!(unit.sources().all(|s| s.event_time.is_some()));
}

#[test]
fn a_broadcast_input_is_one_partition_every_unit_reads() {
    let g = graph(&format!(
        "{TWO_SOURCES}[[operator]]\nname = \"enrich\"\nplugin = \"e.wasm\"\n\
         inputs = [{{ from = \"a\", key_by = {{ field = 1 }} }}, \
         {{ from = \"b\", broadcast = true }}]\n{KAFKA_SINK}{CLUSTER}"
    ));
    let (plan, settings) = plan_of(&g, 3);
    assert_eq!(
        plan.exchange_topics(),
        [
            ("sluice-j.exchange-2-0".to_string(), 3),
            ("sluice-j.exchange-2-1".to_string(), 1)
        ]
    );
    let rules = plan.unit_sink(2, &settings).unwrap().kafka.unwrap();
    let exchange = rules.exchange.unwrap();
    assert_eq!((exchange.partitions, exchange.key), (1, None));
    assert_eq!(
        plan.view()[2].reads,
        [
            "sluice-j.exchange-2-0/0 + sluice-j.exchange-2-1/0",
            "sluice-j.exchange-2-0/1 + sluice-j.exchange-2-1/0",
            "sluice-j.exchange-2-0/2 + sluice-j.exchange-2-1/0",
        ]
    );
    let dir = tempfile::tempdir().unwrap();
    let unit = plan
        .unit_graph(6, &settings, dir.path(), "attempt=a", None)
        .unwrap();
    assert!(unit.has_broadcast_state(2), "the rules are broadcast state");
    let groups: Vec<String> = unit
        .sources()
        .map(|s| match &s.input {
            SourceInput::Kafka(k) => k.group.clone(),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(
        groups,
        [
            "sluice-j.exchange-2-0.readers",
            "sluice-j.exchange-2-1.unit-2.readers"
        ]
    );
}
