//! The typed values of the job file: names from a fixed list, the shapes `key_by`,
//! `inputs`, `timestamp`, `topics` and `start` take, operator config values, durations
//! and sizes. Each says what it accepts when it gets something else, so a mistake is
//! reported where it was written (the file's line and column) with what was allowed.

use std::borrow::Cow;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{Deserializer, Error as _};
use serde::{Deserialize, Serialize};

/// `"a"`, `"a" or "b"`, `"a", "b" or "c"`.
fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// A string from a fixed list, as a Rust enum. `$field` names the field in errors;
/// `hint` arms give a better message for a name users try that is not on the list.
macro_rules! names {
    (
        $(#[$meta:meta])*
        pub enum $ty:ident($field:literal) {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+
        }
        $(hint $htext:literal => $hmsg:literal;)*
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $ty {
            $($(#[$vmeta])* $variant,)+
        }

        impl $ty {
            /// The names a job file may write, in order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// The name as a job file writes it.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                match s.as_str() {
                    $($text => Ok(Self::$variant),)+
                    $($htext => Err(D::Error::custom($hmsg)),)*
                    other => Err(D::Error::custom(format!(
                        "`{}` must be {}, not {other:?}",
                        $field,
                        one_of(Self::NAMES)
                    ))),
                }
            }
        }

        impl JsonSchema for $ty {
            fn schema_name() -> Cow<'static, str> {
                stringify!($ty).into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({ "type": "string", "enum": Self::NAMES })
            }
        }
    };
}

names! {
    /// What a generator source makes (`shape`).
    pub enum GeneratorShapeName("shape") {
        /// Lines of pseudo-words.
        Words = "words",
        /// Lines `timestamp,key,value`.
        Events = "events",
    }
}

names! {
    /// How an unkeyed input is spread over the subtasks reading it (`partition`).
    pub enum Partition("partition") {
        /// Subtask *i* to subtask *i* (equal parallelism).
        Forward = "forward",
        /// Round robin.
        Rebalance = "rebalance",
        /// Every record to every subtask.
        Broadcast = "broadcast",
    }
    hint "hash" => "use `key_by` to partition by key";
}

names! {
    /// What the values of a Kafka source's or sink's records are (`format`).
    pub enum RecordFormatName("format") {
        /// As they are: operators read and write bytes.
        Bytes = "bytes",
        /// JSON text, checked.
        Json = "json",
        /// Avro, decoded into JSON for the operators and encoded from it.
        Avro = "avro",
        /// Protocol Buffers, decoded into JSON for the operators and encoded from it.
        Protobuf = "protobuf",
    }
    hint "proto" => "Protocol Buffers is `format = \"protobuf\"`";
}

names! {
    /// How a sink writes a record (`format`): a file or stdout sink `value`, `key-value`
    /// or `json` (JSON lines), a Kafka sink `bytes`, `json`, `avro` or `protobuf`.
    pub enum SinkFormatName("format") {
        /// The value alone.
        Value = "value",
        /// The key, a tab, the value.
        KeyValue = "key-value",
        /// Values as they are.
        Bytes = "bytes",
        /// JSON text, checked (a file or stdout sink: one value a line).
        Json = "json",
        /// Avro, encoded from the JSON operators emit.
        Avro = "avro",
        /// Protocol Buffers, encoded from the JSON operators emit.
        Protobuf = "protobuf",
    }
}

names! {
    /// How an Avro file sink compresses its blocks (`codec`).
    pub enum AvroCodecName("codec") {
        /// Not at all.
        Null = "null",
        /// Deflate (RFC 1951), as every Avro reader reads.
        Deflate = "deflate",
        /// Snappy, each block followed by the CRC-32 of its uncompressed bytes.
        Snappy = "snappy",
    }
    hint "gzip" => "Avro's gzip-like codec is `codec = \"deflate\"`";
    hint "zstd" => "zstd is not offered: `codec = \"deflate\"` or `\"snappy\"`";
    hint "none" => "no compression is `codec = \"null\"`";
}

/// What a source does with a record its `format` cannot decode (`on_bad_record`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnBadRecordName {
    /// The source fails, naming the record and what is wrong with it.
    Fail,
    /// The record is left out and counted (`bad-records`).
    Skip,
    /// The record is written to this topic as it was read, with headers saying where it
    /// came from and why, and counted (`{ dead_letter = "TOPIC" }`).
    DeadLetter(String),
}

impl<'de> Deserialize<'de> for OnBadRecordName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match toml::Value::deserialize(d)? {
            toml::Value::String(s) if s == "fail" => Ok(OnBadRecordName::Fail),
            toml::Value::String(s) if s == "skip" => Ok(OnBadRecordName::Skip),
            toml::Value::Table(t) if t.contains_key("dead_letter") => {
                if let Some(other) = t.keys().find(|k| *k != "dead_letter") {
                    return Err(D::Error::custom(format!(
                        "`on_bad_record = {{ dead_letter = … }}` takes no `{other}`"
                    )));
                }
                match &t["dead_letter"] {
                    toml::Value::String(topic) if !topic.trim().is_empty() => {
                        Ok(OnBadRecordName::DeadLetter(topic.trim().to_string()))
                    }
                    other => Err(D::Error::custom(format!(
                        "`on_bad_record = {{ dead_letter = … }}` names a topic (a string), \
                         not {other}"
                    ))),
                }
            }
            other => Err(D::Error::custom(format!(
                "`on_bad_record` must be \"fail\", \"skip\" or {{ dead_letter = \"TOPIC\" }}, \
                 not {other}"
            ))),
        }
    }
}

/// A schema (`schema`, `key_schema`): the path of its file, relative to the job file, or
/// its text in the job file, `{ text = "…", imports = { "common/address.proto" = "…" } }`
/// (`imports`: the files a `.proto` imports, by the paths it imports them as; or the
/// Avro types it names, by full name). `sluice submit` sends a job's schema files to a
/// server this way, since a server job reads no file of the server's disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaSpec {
    File(std::path::PathBuf),
    Text {
        text: String,
        imports: std::collections::BTreeMap<String, String>,
    },
}

impl<'de> Deserialize<'de> for SchemaSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let shape = "a schema is the path of its file (a string) or { text = \"…\", \
                     imports = { \"PATH\" = \"…\" } }";
        match toml::Value::deserialize(d)? {
            toml::Value::String(path) => Ok(SchemaSpec::File(path.into())),
            toml::Value::Table(mut t) => {
                if let Some(other) = t.keys().find(|k| !matches!(k.as_str(), "text" | "imports")) {
                    return Err(D::Error::custom(format!("{shape}: it takes no `{other}`")));
                }
                let text = match t.remove("text") {
                    Some(toml::Value::String(text)) => text,
                    Some(other) => {
                        return Err(D::Error::custom(format!(
                            "{shape}: `text` is the schema's text, not {other}"
                        )));
                    }
                    None => return Err(D::Error::custom(format!("{shape}: `text` is missing"))),
                };
                let imports = match t.remove("imports") {
                    None => Default::default(),
                    Some(toml::Value::Table(imports)) => imports
                        .into_iter()
                        .map(|(name, text)| match text {
                            toml::Value::String(text) => Ok((name, text)),
                            other => Err(D::Error::custom(format!(
                                "{shape}: `imports.{name}` is the text of the file imported \
                                 as {name:?}, not {other}"
                            ))),
                        })
                        .collect::<Result<_, _>>()?,
                    Some(other) => {
                        return Err(D::Error::custom(format!(
                            "{shape}: `imports` is a table of texts, not {other}"
                        )));
                    }
                };
                Ok(SchemaSpec::Text { text, imports })
            }
            other => Err(D::Error::custom(format!("{shape}, not {other}"))),
        }
    }
}

impl JsonSchema for SchemaSpec {
    fn schema_name() -> Cow<'static, str> {
        "SchemaSpec".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "oneOf": [
                { "type": "string", "minLength": 1 },
                {
                    "type": "object",
                    "properties": {
                        "text": { "type": "string" },
                        "imports": {
                            "type": "object",
                            "additionalProperties": { "type": "string" }
                        }
                    },
                    "required": ["text"],
                    "additionalProperties": false
                }
            ]
        })
    }
}

impl JsonSchema for OnBadRecordName {
    fn schema_name() -> Cow<'static, str> {
        "OnBadRecordName".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "oneOf": [
                { "type": "string", "enum": ["fail", "skip"] },
                {
                    "type": "object",
                    "properties": { "dead_letter": { "type": "string", "minLength": 1 } },
                    "required": ["dead_letter"],
                    "additionalProperties": false
                }
            ]
        })
    }
}

names! {
    /// What a Kafka sink promises (`delivery`).
    pub enum DeliveryName("delivery") {
        /// Each checkpoint's records in one transaction once it completes.
        ExactlyOnce = "exactly-once",
        /// Records as they come; after a failure some again.
        AtLeastOnce = "at-least-once",
    }
}

names! {
    /// What a Kafka source does when the offset it is to read next is no longer in its
    /// partition (`on_out_of_range`).
    pub enum OutOfRangeName("on_out_of_range") {
        /// The source fails, naming the topic, the partition, the offset and what the
        /// partition holds.
        Fail = "fail",
        /// It goes on from the partition's first offset still in the log.
        Earliest = "earliest",
        /// It goes on from the partition's end.
        Latest = "latest",
    }
}

names! {
    /// Which partition a Kafka sink writes a record to (`partitioner`).
    pub enum SinkPartitioner("partitioner") {
        /// The murmur2 hash of its key, as Kafka's Java clients (keyless records spread).
        Key = "key",
        /// The partition it was read from.
        Record = "record",
    }
}

names! {
    /// How barriers are aligned (`mode` of `[checkpoint]`).
    pub enum CheckpointMode("mode") {
        /// Aligned barriers: each record in exactly one checkpoint.
        ExactlyOnce = "exactly-once",
        /// Unaligned: after a failure some records are processed again.
        AtLeastOnce = "at-least-once",
    }
}

names! {
    /// What a job does when it fails (`strategy` of `[restart]`).
    pub enum RestartStrategyName("strategy") {
        /// Fail the job.
        None = "none",
        /// Restart up to `attempts` times, `delay` apart.
        FixedDelay = "fixed-delay",
        /// Restart up to `attempts` times, the delay growing by `multiplier`.
        Exponential = "exponential",
    }
}

/// A field of a record's value: `{ field = N, separator = "," }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    /// Which field (from 0).
    pub field: usize,
    /// What separates the fields (default `,`).
    #[serde(default = "comma")]
    pub separator: String,
}

fn comma() -> String {
    ",".into()
}

/// `{ field = N, separator = "," }` from a TOML table, or why not.
fn field_spec(t: &toml::Table) -> Result<FieldSpec, String> {
    for k in t.keys() {
        if k != "field" && k != "separator" {
            return Err(format!(
                "unknown field `{k}` (expected `field` and `separator`)"
            ));
        }
    }
    let field = match t.get("field") {
        Some(toml::Value::Integer(i)) if *i >= 0 => *i as usize,
        _ => return Err("`field` must be a field index (0 or more)".into()),
    };
    let separator = match t.get("separator") {
        None => comma(),
        Some(toml::Value::String(s)) if !s.is_empty() => s.clone(),
        Some(_) => return Err("`separator` must be a non-empty string".into()),
    };
    Ok(FieldSpec { field, separator })
}

/// What partitions an input by key (`key_by`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyBy {
    /// `"key"`: the record's key.
    Key,
    /// `"value"`: the whole value.
    Value,
    /// `{ field = N, separator = "," }`: a field of the value.
    Field(FieldSpec),
}

impl KeyBy {
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        match v {
            toml::Value::String(s) if s == "key" => Ok(KeyBy::Key),
            toml::Value::String(s) if s == "value" => Ok(KeyBy::Value),
            toml::Value::Table(t) => field_spec(t).map(KeyBy::Field),
            other => Err(format!(
                "`key_by` must be \"key\", \"value\" or {{ field = N, separator = \",\" }}, not {other}"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for KeyBy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        KeyBy::from_toml(&toml::Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

impl JsonSchema for KeyBy {
    fn schema_name() -> Cow<'static, str> {
        "KeyBy".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let field = generator.subschema_for::<FieldSpec>();
        json_schema!({ "anyOf": [{ "type": "string", "enum": ["key", "value"] }, field] })
    }
}

/// Where a record's event time is (`timestamp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Timestamp {
    /// `"record"`: the timestamp a Kafka record carries.
    Record,
    /// `{ field = N, separator = "," }`: a field holding milliseconds.
    Field(FieldSpec),
    /// `{ field = "NAME" }`: a top-level field of JSON values (a Kafka source's with
    /// `format = "json"` or `"avro"`) holding milliseconds.
    Named(String),
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match toml::Value::deserialize(d)? {
            toml::Value::String(s) if s == "record" => Ok(Timestamp::Record),
            toml::Value::Table(t)
                if t.len() == 1
                    && matches!(t.get("field"), Some(toml::Value::String(name)) if !name.is_empty()) =>
            {
                Ok(Timestamp::Named(
                    t["field"].as_str().expect("matched").to_string(),
                ))
            }
            toml::Value::Table(t) if field_spec(&t).is_ok() => field_spec(&t)
                .map(Timestamp::Field)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "`timestamp` must be { field = N, separator = \",\" } (the field holding the \
                 event time in milliseconds), { field = \"NAME\" } (a field of JSON or Avro \
                 values) or \"record\" (the timestamp a Kafka record carries)",
            )),
        }
    }
}

impl JsonSchema for Timestamp {
    fn schema_name() -> Cow<'static, str> {
        "Timestamp".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let field = generator.subschema_for::<FieldSpec>();
        json_schema!({ "anyOf": [
            { "const": "record" },
            field,
            {
                "type": "object",
                "properties": { "field": { "type": "string", "minLength": 1 } },
                "required": ["field"],
                "additionalProperties": false
            }
        ] })
    }
}

/// What a Kafka source reads (`topics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicsSpec {
    /// A name, or a list of names.
    Names(Vec<String>),
    /// `{ pattern = "REGEX" }`: every topic whose whole name matches.
    Pattern(String),
}

impl<'de> Deserialize<'de> for TopicsSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let topics = match toml::Value::deserialize(d)? {
            toml::Value::String(t) => TopicsSpec::Names(vec![t]),
            toml::Value::Array(ts) => TopicsSpec::Names(
                ts.into_iter()
                    .map(|t| match t {
                        toml::Value::String(t) => Ok(t),
                        other => Err(D::Error::custom(format!(
                            "`topics` must be topic names, not {other}"
                        ))),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            toml::Value::Table(t) if t.len() == 1 && t.contains_key("pattern") => {
                match &t["pattern"] {
                    toml::Value::String(p) if !p.is_empty() => TopicsSpec::Pattern(p.clone()),
                    _ => {
                        return Err(D::Error::custom(
                            "`topics` = { pattern = \"...\" } needs a regular expression",
                        ));
                    }
                }
            }
            other => {
                return Err(D::Error::custom(format!(
                    "`topics` must be a topic name, a list of them or {{ pattern = \"REGEX\" }}, not {other}"
                )));
            }
        };
        if let TopicsSpec::Names(names) = &topics
            && (names.is_empty() || names.iter().any(|t| t.is_empty()))
        {
            return Err(D::Error::custom(
                "`topics` must name at least one topic, and no empty one",
            ));
        }
        Ok(topics)
    }
}

impl JsonSchema for TopicsSpec {
    fn schema_name() -> Cow<'static, str> {
        "Topics".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "anyOf": [
            { "type": "string", "minLength": 1 },
            { "type": "array", "items": { "type": "string", "minLength": 1 }, "minItems": 1 },
            {
                "type": "object",
                "properties": { "pattern": { "type": "string", "minLength": 1 } },
                "required": ["pattern"],
                "additionalProperties": false
            }
        ] })
    }
}

/// Where a Kafka source starts in a partition no checkpoint names (`start`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartSpec {
    /// `"earliest"`: the oldest record kept.
    Earliest,
    /// `"latest"`: records written from now on.
    Latest,
    /// `"committed"`: the group's committed offsets.
    Committed,
    /// `{ timestamp_ms = N }`: the first record at or after N ms since the epoch.
    Timestamp(i64),
}

impl<'de> Deserialize<'de> for StartSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let expected = "expected \"earliest\", \"latest\", \"committed\" or { timestamp_ms = N }";
        match toml::Value::deserialize(d)? {
            toml::Value::String(s) => match s.as_str() {
                "earliest" => Ok(StartSpec::Earliest),
                "latest" => Ok(StartSpec::Latest),
                "committed" => Ok(StartSpec::Committed),
                other => Err(D::Error::custom(format!("`start` = {other:?}: {expected}"))),
            },
            toml::Value::Table(t) if t.len() == 1 => match t.get("timestamp_ms") {
                Some(toml::Value::Integer(ms)) if *ms >= 0 => Ok(StartSpec::Timestamp(*ms)),
                _ => Err(D::Error::custom(
                    "`start` = { timestamp_ms = N } needs milliseconds since the epoch (0 or more)",
                )),
            },
            other => Err(D::Error::custom(format!("`start` = {other}: {expected}"))),
        }
    }
}

impl JsonSchema for StartSpec {
    fn schema_name() -> Cow<'static, str> {
        "Start".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "anyOf": [
            { "type": "string", "enum": ["earliest", "latest", "committed"] },
            {
                "type": "object",
                "properties": { "timestamp_ms": { "type": "integer", "minimum": 0 } },
                "required": ["timestamp_ms"],
                "additionalProperties": false
            }
        ] })
    }
}

/// One entry of `inputs`: `"NAME"`, `"NAME.side:OUTPUT"`, or a table `{ from = "NAME",
/// key_by = ..., partition = ..., broadcast = true }` that partitions this input its own
/// way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputEntry {
    /// The source or operator read.
    pub from: String,
    /// Its side output read, if not its main output.
    pub side: Option<String>,
    /// This input's own `key_by`.
    pub key_by: Option<KeyBy>,
    /// This input's own `partition`.
    pub partition: Option<Partition>,
    /// Every record to every subtask.
    pub broadcast: bool,
}

impl InputEntry {
    /// The name as written: `NAME` or `NAME.side:OUTPUT`.
    pub fn written(&self) -> String {
        match &self.side {
            Some(side) => format!("{}.side:{side}", self.from),
            None => self.from.clone(),
        }
    }

    fn named(name: &str) -> Result<Self, String> {
        let (from, side) = match name.split_once(".side:") {
            Some((from, side)) if !side.is_empty() => (from, Some(side.to_string())),
            Some(_) => {
                return Err(format!(
                    "`inputs` entry {name:?}: name the side output after `.side:`"
                ));
            }
            None => (name, None),
        };
        if from.is_empty() {
            return Err("an `inputs` entry names no source or operator".into());
        }
        Ok(InputEntry {
            from: from.to_string(),
            side,
            key_by: None,
            partition: None,
            broadcast: false,
        })
    }

    fn from_toml(value: toml::Value) -> Result<Self, String> {
        let table = match value {
            toml::Value::String(name) => return InputEntry::named(&name),
            toml::Value::Table(t) => t,
            other => {
                return Err(format!(
                    "an `inputs` entry must be a name or {{ from = \"NAME\", ... }}, not {other}"
                ));
            }
        };
        let Some(toml::Value::String(name)) = table.get("from") else {
            return Err("an `inputs` table needs `from = \"NAME\"`".into());
        };
        let mut entry = InputEntry::named(name)?;
        let name = name.clone();
        for (k, v) in table {
            let field = |e: String| format!("input '{name}': {e}");
            match k.as_str() {
                "from" => {}
                "key_by" => entry.key_by = Some(KeyBy::from_toml(&v).map_err(field)?),
                "partition" => {
                    entry.partition = Some(
                        Partition::deserialize(v).map_err(|e| field(e.message().to_string()))?,
                    )
                }
                "broadcast" => match v {
                    toml::Value::Boolean(b) => entry.broadcast = b,
                    _ => return Err(field("`broadcast` must be true or false".into())),
                },
                other => {
                    return Err(field(format!(
                        "unknown field `{other}` (expected `from`, `key_by`, `partition` or \
                         `broadcast`)"
                    )));
                }
            }
        }
        Ok(entry)
    }
}

impl<'de> Deserialize<'de> for InputEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        InputEntry::from_toml(toml::Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

impl JsonSchema for InputEntry {
    fn schema_name() -> Cow<'static, str> {
        "Input".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let key_by = generator.subschema_for::<KeyBy>();
        let partition = generator.subschema_for::<Partition>();
        json_schema!({ "anyOf": [
            { "type": "string", "description": "NAME, or NAME.side:OUTPUT" },
            {
                "type": "object",
                "properties": {
                    "from": { "type": "string" },
                    "key_by": key_by,
                    "partition": partition,
                    "broadcast": { "type": "boolean" }
                },
                "required": ["from"],
                "additionalProperties": false
            }
        ] })
    }
}

/// An operator's config value: a string, number or boolean, handed to `open` as a string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ConfigValue(pub String);

impl<'de> Deserialize<'de> for ConfigValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match toml::Value::deserialize(d)? {
            toml::Value::String(s) => Ok(ConfigValue(s)),
            toml::Value::Integer(i) => Ok(ConfigValue(i.to_string())),
            toml::Value::Float(f) => Ok(ConfigValue(f.to_string())),
            toml::Value::Boolean(b) => Ok(ConfigValue(b.to_string())),
            _ => Err(D::Error::custom(
                "a config value must be a string, number or boolean",
            )),
        }
    }
}

impl JsonSchema for ConfigValue {
    fn schema_name() -> Cow<'static, str> {
        "ConfigValue".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": ["string", "number", "boolean"] })
    }
}

/// A duration: milliseconds as a number, or a string with units (`"10s"`, `"1m 30s"`,
/// `"250ms"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Millis(pub u64);

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match toml::Value::deserialize(d)? {
            toml::Value::Integer(ms) => u64::try_from(ms).map(Millis).map_err(|_| {
                D::Error::custom(format!("invalid value: integer `{ms}`, expected u64"))
            }),
            toml::Value::String(s) => {
                let d: Duration = humantime::parse_duration(s.trim()).map_err(|e| {
                    D::Error::custom(format!(
                        "{s:?} is not a duration ({e}); write milliseconds, or a number with a \
                         unit such as \"250ms\", \"10s\" or \"5m\""
                    ))
                })?;
                u64::try_from(d.as_millis())
                    .map(Millis)
                    .map_err(|_| D::Error::custom(format!("{s:?} is too long a duration")))
            }
            other => Err(D::Error::custom(format!(
                "expected milliseconds or a duration such as \"10s\", not {other}"
            ))),
        }
    }
}

impl JsonSchema for Millis {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "milliseconds, or a duration with units such as \"250ms\", \"10s\", \"5m\"",
            "anyOf": [{ "type": "integer", "minimum": 0 }, { "type": "string" }]
        })
    }
}

/// An amount of bytes: a number in the field's unit (bytes for `*_bytes`, MiB for
/// `*_mb`), or a string with units (`"32KiB"`, `"64MiB"`, `"1GiB"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes<const UNIT: u64>(pub u64);

/// A size written in bytes when a plain number.
pub type ByteSize = Bytes<1>;
/// A size written in MiB when a plain number.
pub type MiBSize = Bytes<{ 1 << 20 }>;

impl<const UNIT: u64> Bytes<UNIT> {
    /// The size in the field's unit (bytes or MiB).
    pub fn units(self) -> u64 {
        self.0
    }
}

impl<'de, const UNIT: u64> Deserialize<'de> for Bytes<UNIT> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match toml::Value::deserialize(d)? {
            toml::Value::Integer(n) => u64::try_from(n).map(Bytes).map_err(|_| {
                D::Error::custom(format!("invalid value: integer `{n}`, expected u64"))
            }),
            toml::Value::String(s) => {
                let bytes = s.trim().parse::<bytesize::ByteSize>().map_err(|e| {
                    D::Error::custom(format!(
                        "{s:?} is not a size ({e}); write a number, or one with a unit such as \
                         \"32KiB\" or \"64MiB\""
                    ))
                })?;
                let bytes = bytes.as_u64();
                if bytes % UNIT != 0 {
                    return Err(D::Error::custom(format!(
                        "{s:?} is not a whole number of MiB"
                    )));
                }
                Ok(Bytes(bytes / UNIT))
            }
            other => Err(D::Error::custom(format!(
                "expected a number or a size such as \"64MiB\", not {other}"
            ))),
        }
    }
}

impl<const UNIT: u64> JsonSchema for Bytes<UNIT> {
    fn schema_name() -> Cow<'static, str> {
        if UNIT == 1 { "Bytes" } else { "MiB" }.into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let unit = if UNIT == 1 { "bytes" } else { "MiB" };
        json_schema!({
            "description": format!("{unit}, or a size with units such as \"32KiB\", \"64MiB\""),
            "anyOf": [{ "type": "integer", "minimum": 0 }, { "type": "string" }]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct T {
        d: Option<Millis>,
        b: Option<ByteSize>,
        m: Option<MiBSize>,
    }

    fn parse(text: &str) -> Result<T, String> {
        toml::from_str(text).map_err(|e| e.message().to_string())
    }

    #[test]
    fn durations_and_sizes_take_numbers_or_units() {
        let t = parse("d = 1500\nb = 2048\nm = 64").unwrap();
        assert_eq!(
            (t.d, t.b, t.m),
            (Some(Millis(1500)), Some(Bytes(2048)), Some(Bytes(64)))
        );
        let t = parse("d = \"1m 30s\"\nb = \"32KiB\"\nm = \"1GiB\"").unwrap();
        assert_eq!(
            (t.d, t.b, t.m),
            (
                Some(Millis(90_000)),
                Some(Bytes(32 << 10)),
                Some(Bytes(1024))
            )
        );
        assert!(
            parse("d = \"soon\"")
                .unwrap_err()
                .contains("is not a duration")
        );
        assert!(parse("d = -5").unwrap_err().contains("expected u64"));
        assert!(
            parse("m = \"1500KiB\"")
                .unwrap_err()
                .contains("whole number of MiB")
        );
        assert!(
            parse("b = true")
                .unwrap_err()
                .contains("expected a number or a size")
        );
    }

    #[test]
    fn names_say_what_is_allowed() {
        #[derive(Debug, Deserialize)]
        struct P {
            #[allow(dead_code)]
            p: Partition,
        }
        let e = toml::from_str::<P>("p = \"random\"").unwrap_err();
        assert_eq!(
            e.message(),
            "`partition` must be \"forward\", \"rebalance\" or \"broadcast\", not \"random\""
        );
        let e = toml::from_str::<P>("p = \"hash\"").unwrap_err();
        assert_eq!(e.message(), "use `key_by` to partition by key");
        assert_eq!(one_of(&["a"]), "\"a\"");
    }
}
