//! What the bytes of a record's value are (`format`): decoded by a source into the JSON
//! operators read, and encoded by a sink from the JSON operators write.
//!
//! Decoding runs on the host, in the source's task, not in the guest: the guest has no
//! network to ask a schema registry, Avro decoders in Python or JavaScript would run
//! interpreted, and each SDK would need one. The host decodes once, natively, into JSON
//! text, which every SDK reads with its language's native parser (`Record::json` in
//! Rust, `record.json()` in Python and JavaScript), so an operator gets typed fields
//! without writing a decoder; a sink encodes what operators emit back the same way.
//! A record that cannot be decoded is a *bad record*: the source fails naming it, or
//! skips and counts it (`on_bad_record`).

pub mod avro;
mod json;
pub mod protobuf;
pub mod registry;

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};

pub use avro::Compiled;
pub use protobuf::Proto;
pub use registry::{Registry, RegistryConfig};

/// How a record's value is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// As it is: operators get the bytes.
    Bytes,
    /// JSON text (with a registry: in Confluent's wire format, the header stripped).
    Json,
    /// Avro: with a registry in Confluent's wire format, without one bare datums of
    /// `schema`.
    Avro,
    /// Protocol Buffers: with a registry in Confluent's wire format, without one bare
    /// messages of `schema`'s `message`.
    Protobuf,
}

impl Format {
    /// The registry's name of the format's schemas (its `schemaType`).
    pub fn registry_kind(self) -> &'static str {
        match self {
            Format::Protobuf => "PROTOBUF",
            Format::Json => "JSON",
            Format::Avro | Format::Bytes => "AVRO",
        }
    }
}

/// What a source does with a record it cannot decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnBadRecord {
    /// Fail, naming the record and what is wrong with it.
    Fail,
    /// Leave it out, counted in the source's `bad-records` counter.
    Skip,
    /// Write it to this topic (of the source's cluster) as it was read, counted too.
    DeadLetter(String),
}

/// `Err(why)` unless `value` is JSON text.
pub fn check_json(value: &[u8]) -> Result<(), String> {
    serde_json::from_slice::<serde::de::IgnoredAny>(value)
        .map(drop)
        .map_err(|e| format!("not JSON: {e}"))
}

/// `value` as text for an error message: quoted, its first 120 bytes.
pub fn quoted(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(&value[..value.len().min(120)]);
    let more = if value.len() > 120 { "…" } else { "" };
    format!("{text:?}{more}")
}

/// Which part of a record a format is of: its schemas are the registry's subject
/// `TOPIC-value` or `TOPIC-key`, as Confluent's serializers name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Value,
    Key,
}

impl Part {
    /// The subject of `topic`'s schemas of this part.
    pub fn subject(self, topic: &str) -> String {
        match self {
            Part::Value => format!("{topic}-value"),
            Part::Key => format!("{topic}-key"),
        }
    }
}

/// A schema's text and the texts of the schemas it names: a `.proto` file's imports
/// (other than Google's well-known types) under the paths they are imported as, an Avro
/// schema's referenced types under their full names — read beside the job's schema file
/// or from the registry's schema references.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SchemaText {
    pub text: String,
    pub references: Vec<(String, String)>,
}

impl SchemaText {
    /// A schema that names no other.
    pub fn plain(text: impl Into<String>) -> SchemaText {
        SchemaText {
            text: text.into(),
            references: Vec::new(),
        }
    }
}

/// A source's or sink's format, as validated from the job file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatConfig {
    pub format: Format,
    /// What it is the format of (the values, or with `key_format` the keys).
    pub part: Part,
    /// The keys' format (`key_format`), if they are not bytes.
    pub key: Option<Box<FormatConfig>>,
    pub registry: Option<RegistryConfig>,
    /// The Avro or `.proto` schema the job reads with or writes, from `schema`.
    pub schema: Option<SchemaText>,
    /// Protobuf: the message read or written (full name); default: the one each value's
    /// message indexes name (bare values and sinks: the schema's first).
    pub message: Option<String>,
    pub on_bad_record: OnBadRecord,
    /// A sink with a registry: whether it registers the files its `.proto` schema imports
    /// (else they must be registered already, as on a server, whose jobs register no
    /// subject but their topics').
    pub register_imports: bool,
}

impl FormatConfig {
    /// Values as they are.
    pub fn bytes() -> FormatConfig {
        FormatConfig {
            format: Format::Bytes,
            part: Part::Value,
            key: None,
            registry: None,
            schema: None,
            message: None,
            on_bad_record: OnBadRecord::Fail,
            register_imports: true,
        }
    }

    /// The format's name in a job file.
    pub fn name(&self) -> &'static str {
        match self.format {
            Format::Bytes => "bytes",
            Format::Json => "json",
            Format::Avro => "avro",
            Format::Protobuf => "protobuf",
        }
    }
}

/// A schema of the registry or the job, compiled.
#[derive(Clone)]
enum Schema {
    Avro(Arc<Compiled>),
    Proto(Arc<Proto>),
    /// A JSON schema, or a kind the job does not read (its name).
    Other(String),
}

impl Schema {
    /// The registry's name of the schema's kind.
    fn kind(&self) -> &str {
        match self {
            Schema::Avro(_) => "AVRO",
            Schema::Proto(_) => "PROTOBUF",
            Schema::Other(kind) => kind,
        }
    }

    fn compile(kind: &str, schema: &SchemaText) -> Result<Schema> {
        Ok(match kind {
            "AVRO" => Schema::Avro(Arc::new(Compiled::parse(&avro::with_references(schema)?)?)),
            "PROTOBUF" => Schema::Proto(Arc::new(Proto::parse_with(schema)?)),
            other => Schema::Other(other.to_string()),
        })
    }

    /// `schema` of the registry compiled, with the schemas it refers to.
    fn of_registry(registry: &Registry, schema: &registry::Registered) -> Result<Schema> {
        let text = SchemaText {
            text: schema.text.clone(),
            references: registry.references(schema)?,
        };
        Schema::compile(&schema.kind, &text)
    }
}

/// How a value written with one schema is read.
enum Plan {
    /// With the reader's schema itself.
    Direct(Arc<Compiled>),
    /// Resolved from the writer's schema to the reader's.
    Resolve {
        writer: Arc<Compiled>,
        reader: Arc<Compiled>,
    },
    /// A Protobuf message, read with the job's schema.
    Message(prost_reflect::MessageDescriptor),
}

impl Plan {
    /// Reads one Avro datum off the front of `datum` as JSON into `out`.
    fn read_avro(&self, datum: &mut &[u8], out: &mut Vec<u8>) -> Result<()> {
        match self {
            Plan::Direct(reader) => reader.datum_to_json(datum, out),
            Plan::Resolve { writer, reader } => {
                // Read with the writer's schema first: it bounds what the datum decodes
                // to before `apache-avro` builds its values.
                let mut check = *datum;
                let start = out.len();
                let bounded = writer.datum_to_json(&mut check, out);
                out.truncate(start);
                bounded?;
                let value = apache_avro::reader::datum::GenericDatumReader::builder(&writer.schema)
                    .reader_schema(&reader.schema)
                    .build()
                    .and_then(|r| r.read_value(datum))
                    .map_err(|e| anyhow!("{e}"))?;
                avro::value_to_json(&value, out)
            }
            Plan::Message(_) => unreachable!("an Avro plan"),
        }
    }

    /// How datums written with `writer` are read with `reader` (`Err`: they cannot be).
    fn avro(writer: Arc<Compiled>, reader: Arc<Compiled>) -> Result<Plan, String> {
        if writer.schema.canonical_form() == reader.schema.canonical_form() {
            return Ok(Plan::Direct(reader));
        }
        apache_avro::schema_compatibility::SchemaCompatibility::can_read(
            &writer.schema,
            &reader.schema,
        )
        .map_err(|e| e.to_string())?;
        Ok(Plan::Resolve { writer, reader })
    }
}

/// Reads the Avro datums of one writer's schema (an Avro file's) with the job's.
pub struct AvroReading(Plan);

impl AvroReading {
    /// Datums written with `writer`, read with `reader` (default: `writer` itself); `Err`:
    /// `reader` cannot read them, and why.
    pub fn new(
        writer: Arc<Compiled>,
        reader: Option<Arc<Compiled>>,
    ) -> Result<AvroReading, String> {
        let reader = reader.unwrap_or_else(|| writer.clone());
        Plan::avro(writer, reader).map(AvroReading)
    }

    /// Reads one datum off the front of `datum` as JSON into `out`.
    pub fn read(&self, datum: &mut &[u8], out: &mut Vec<u8>) -> Result<()> {
        self.0.read_avro(datum, out)
    }
}

/// Decodes a source's values into JSON.
pub struct Decoder {
    format: Format,
    part: Part,
    registry: Option<Registry>,
    /// The schema the job reads with: `schema`, or each topic's latest at first sight.
    fixed_reader: Option<Schema>,
    readers: HashMap<String, Schema>,
    /// Protobuf: the message read, if the job names one.
    message: Option<String>,
    /// Schemas by id, as the registry told them.
    writers: HashMap<u32, Schema>,
    /// Ids the registry does not know (bad records, not asked again).
    unknown: std::collections::HashSet<u32>,
    /// How to read each (topic, schema id, Protobuf message indexes) met so far: a few,
    /// looked up without allocating per record.
    plans: Vec<(String, u32, Vec<i32>, Plan)>,
    /// The message indexes of the value being decoded.
    indexes: Vec<i32>,
    out: Vec<u8>,
}

/// What decoding a value gave.
pub enum Decoded<'a> {
    /// The value operators get.
    Value(&'a [u8]),
    /// A bad record, and what is wrong with it.
    Bad(String),
}

impl Decoder {
    pub fn new(config: &FormatConfig) -> Result<Decoder> {
        // `apache-avro` allocates what a length in a datum says, up to this (its default
        // is 512 MiB); set once for the process.
        apache_avro::util::max_allocation_bytes(avro::MAX_JSON_BYTES);
        let fixed_reader = config
            .schema
            .as_ref()
            .map(|schema| Schema::compile(config.format.registry_kind(), schema))
            .transpose()?;
        if let (Some(Schema::Proto(proto)), Some(name)) = (&fixed_reader, &config.message) {
            proto.message(Some(name))?;
        }
        Ok(Decoder {
            format: config.format,
            part: config.part,
            registry: config.registry.clone().map(Registry::new),
            fixed_reader,
            readers: HashMap::new(),
            message: config.message.clone(),
            writers: HashMap::new(),
            unknown: Default::default(),
            plans: Vec::new(),
            indexes: Vec::new(),
            out: Vec::new(),
        })
    }

    /// Whether values pass as they are.
    pub fn is_bytes(&self) -> bool {
        self.format == Format::Bytes
    }

    /// Decodes `value`, read from `topic` (a file source: its path). Errors are the
    /// registry's trouble (unreachable, refused), not the record's.
    pub fn decode<'a>(&'a mut self, topic: &str, value: &'a [u8]) -> Result<Decoded<'a>> {
        match self.format {
            Format::Bytes => Ok(Decoded::Value(value)),
            Format::Json => {
                let text = match &self.registry {
                    None => value,
                    Some(_) => match registry::split_framed(value) {
                        Ok((id, rest)) => {
                            if let Some(bad) = self.check_id(id)? {
                                return Ok(Decoded::Bad(bad));
                            }
                            rest
                        }
                        Err(e) => return Ok(Decoded::Bad(e)),
                    },
                };
                match check_json(text) {
                    Ok(()) => Ok(Decoded::Value(text)),
                    Err(why) => Ok(Decoded::Bad(why)),
                }
            }
            Format::Avro | Format::Protobuf => {
                let (id, mut datum) = match &self.registry {
                    None => (0, value),
                    Some(_) => match registry::split_framed(value) {
                        Ok(framed) => framed,
                        Err(e) => return Ok(Decoded::Bad(e)),
                    },
                };
                self.indexes.clear();
                if self.format == Format::Protobuf && self.registry.is_some() {
                    match protobuf::split_indexes(datum, &mut self.indexes) {
                        Ok(rest) => datum = rest,
                        Err(e) => return Ok(Decoded::Bad(e)),
                    }
                }
                let found = self
                    .plans
                    .iter()
                    .position(|(t, i, ix, _)| *i == id && *ix == self.indexes && t == topic);
                let at = match found {
                    Some(at) => at,
                    None => match self.plan(topic, id)? {
                        Ok(plan) => {
                            let indexes = self.indexes.clone();
                            self.plans.push((topic.to_string(), id, indexes, plan));
                            self.plans.len() - 1
                        }
                        Err(bad) => return Ok(Decoded::Bad(bad)),
                    },
                };
                let plan = &self.plans[at].3;
                self.out.clear();
                let decoded = match plan {
                    Plan::Message(message) => {
                        return Ok(
                            match protobuf::message_to_json(message, datum, &mut self.out) {
                                Ok(()) => Decoded::Value(&self.out),
                                Err(why) => Decoded::Bad(why),
                            },
                        );
                    }
                    avro => avro.read_avro(&mut datum, &mut self.out),
                };
                match decoded {
                    Err(e) => Ok(Decoded::Bad(format!(
                        "not an Avro datum of its schema: {e:#}"
                    ))),
                    Ok(()) if !datum.is_empty() => Ok(Decoded::Bad(format!(
                        "{} bytes left after the Avro datum of its schema",
                        datum.len()
                    ))),
                    Ok(()) => Ok(Decoded::Value(&self.out)),
                }
            }
        }
    }

    /// `Some(why)` when the registry does not know schema `id`.
    fn check_id(&mut self, id: u32) -> Result<Option<String>> {
        if self.writers.contains_key(&id) {
            return Ok(None);
        }
        if self.unknown.contains(&id) {
            return Ok(Some(format!(
                "schema id {id} is not in the schema registry"
            )));
        }
        let registry = self
            .registry
            .as_ref()
            .expect("framed values come with a registry");
        match registry.by_id(id)? {
            None => {
                // (Bounded: a topic of garbage names ids at random.)
                if self.unknown.len() >= 10_000 {
                    self.unknown.clear();
                }
                self.unknown.insert(id);
                Ok(Some(format!(
                    "schema id {id} is not in the schema registry"
                )))
            }
            Some(schema) => {
                let compiled = Schema::of_registry(registry, &schema)
                    .with_context(|| format!("schema {id} in the registry"))?;
                self.writers.insert(id, compiled);
                Ok(None)
            }
        }
    }

    /// The schema the job reads `topic` with: `schema`, or the subject `TOPIC-value`'s
    /// latest, asked once.
    fn reader(&mut self, topic: &str) -> Result<Schema> {
        if let Some(reader) = self.fixed_reader.as_ref().or(self.readers.get(topic)) {
            return Ok(reader.clone());
        }
        let registry = self
            .registry
            .as_ref()
            .expect("validated: a format without `schema` has a registry");
        let subject = self.part.subject(topic);
        let latest = registry.latest_of(
            &subject,
            self.format.registry_kind(),
            "register the topic's schema, or name one with `schema`",
        )?;
        let compiled = Schema::of_registry(registry, &latest)
            .with_context(|| format!("the latest schema of subject {subject:?}"))?;
        if let (Schema::Proto(proto), Some(name)) = (&compiled, &self.message) {
            proto
                .message(Some(name))
                .with_context(|| format!("the latest schema of subject {subject:?}"))?;
        }
        self.writers
            .entry(latest.id)
            .or_insert_with(|| compiled.clone());
        self.readers.insert(topic.to_string(), compiled.clone());
        Ok(compiled)
    }

    /// How to read values of `topic` written with schema `id` (and, Protobuf, the
    /// message indexes in `self.indexes`); `Err` inside: a bad record.
    fn plan(&mut self, topic: &str, id: u32) -> Result<Result<Plan, String>> {
        let reader = self.reader(topic)?;
        if self.registry.is_some()
            && let Some(bad) = self.check_id(id)?
        {
            return Ok(Err(bad));
        }
        match reader {
            Schema::Avro(reader) if self.registry.is_none() => Ok(Ok(Plan::Direct(reader))),
            Schema::Avro(reader) => {
                let writer = match &self.writers[&id] {
                    Schema::Avro(writer) => writer.clone(),
                    other => {
                        return Ok(Err(format!(
                            "written with schema {id}, which is {}, not an Avro schema",
                            other.kind()
                        )));
                    }
                };
                Ok(Plan::avro(writer, reader).map_err(|e| {
                    format!("written with schema {id}, which the job's schema cannot read: {e}")
                }))
            }
            Schema::Proto(reader) => {
                if self.registry.is_none() || self.message.is_some() {
                    let message = reader.message(self.message.as_deref())?;
                    return Ok(Ok(Plan::Message(message)));
                }
                let writer = match &self.writers[&id] {
                    Schema::Proto(writer) => writer,
                    other => {
                        return Ok(Err(format!(
                            "written with schema {id}, which is {}, not a Protobuf schema",
                            other.kind()
                        )));
                    }
                };
                let Some(written) = writer.by_indexes(&self.indexes) else {
                    return Ok(Err(format!(
                        "the message indexes {:?} name no message of schema {id}",
                        self.indexes
                    )));
                };
                match reader.message(Some(written.full_name())) {
                    Ok(message) => Ok(Ok(Plan::Message(message))),
                    Err(_) => Ok(Err(format!(
                        "written as message {} (schema {id}), which the job's schema does not \
                         have (name the message to read with `message`)",
                        written.full_name()
                    ))),
                }
            }
            Schema::Other(_) => unreachable!("readers are Avro or Protobuf"),
        }
    }
}

/// Registers the files a sink's `.proto` schema imports (read beside it), each under the
/// path it is imported as, with the files it imports as its references — as Confluent's
/// Protobuf serializer registers them — so that readers resolve the schema's imports;
/// the references of the schema itself. Unless `write`: only finds them registered.
fn register_imports(
    registry: &Registry,
    format: Format,
    schema: &SchemaText,
    write: bool,
) -> Result<Vec<registry::Reference>> {
    if format != Format::Protobuf || schema.references.is_empty() {
        return Ok(Vec::new());
    }
    let proto = Proto::parse_with(schema)?;
    let mut versions: HashMap<String, i64> = HashMap::new();
    // Each file after the files it imports (`protox` has refused cycles).
    fn register(
        name: &str,
        (proto, schema, registry, write): (&Proto, &SchemaText, &Registry, bool),
        versions: &mut HashMap<String, i64>,
    ) -> Result<registry::Reference> {
        if let Some(&version) = versions.get(name) {
            return Ok(reference(name, version));
        }
        let references = proto
            .imports(Some(name))
            .iter()
            .map(|import| register(import, (proto, schema, registry, write), versions))
            .collect::<Result<Vec<_>>>()?;
        let text = &schema
            .references
            .iter()
            .find(|(n, _)| n == name)
            .expect("every file the schema imports was read")
            .1;
        if write {
            registry
                .register(name, "PROTOBUF", text, &references)
                .with_context(|| format!("registering {name:?}, which the schema imports"))?;
        }
        let version = registry
            .version_of(name, "PROTOBUF", text, &references)?
            .ok_or_else(|| match write {
                true => anyhow!("the registry does not find {name:?} just registered"),
                false => anyhow!(
                    "the schema imports {name:?}, which the registry does not hold under \
                     subject {name:?} with that text: a server job registers no subject but \
                     its topics', so register it there first"
                ),
            })?;
        versions.insert(name.to_string(), version);
        Ok(reference(name, version))
    }
    fn reference(name: &str, version: i64) -> registry::Reference {
        registry::Reference {
            name: name.to_string(),
            subject: name.to_string(),
            version,
        }
    }
    proto
        .imports(None)
        .iter()
        .map(|import| register(import, (&proto, schema, registry, write), &mut versions))
        .collect()
}

/// Encodes what a sink's operators emit (JSON) into its format.
pub struct Encoder {
    format: Format,
    schema: Option<Compiled>,
    /// Protobuf: the message written, and its message indexes.
    message: Option<(prost_reflect::MessageDescriptor, Vec<i32>)>,
    /// The registry's id of the schema: values are framed with it.
    id: Option<u32>,
    out: Vec<u8>,
}

impl Encoder {
    /// The encoder of a sink writing `topic` (a file sink: its path). Registers the
    /// sink's schema under `TOPIC-value`, or takes the subject's latest.
    pub fn open(config: &FormatConfig, topic: &str) -> Result<Encoder> {
        let mut encoder = Encoder {
            format: config.format,
            schema: None,
            message: None,
            id: None,
            out: Vec::new(),
        };
        if !matches!(config.format, Format::Avro | Format::Protobuf) {
            return Ok(encoder);
        }
        let kind = config.format.registry_kind();
        let registry = config.registry.clone().map(Registry::new);
        let subject = config.part.subject(topic);
        let schema = match (&config.schema, &registry) {
            (Some(schema), Some(registry)) => {
                let registering =
                    || format!("registering the sink's schema under subject {subject:?}");
                let references =
                    register_imports(registry, config.format, schema, config.register_imports)
                        .with_context(registering)?;
                let id = registry
                    .register(&subject, kind, &schema.text, &references)
                    .with_context(registering)?;
                encoder.id = Some(id);
                schema.clone()
            }
            (None, Some(registry)) => {
                let latest = registry.latest_of(
                    &subject,
                    kind,
                    "name the sink's schema with `schema`, and it is registered",
                )?;
                encoder.id = Some(latest.id);
                let references = registry
                    .references(&latest)
                    .with_context(|| format!("the latest schema of subject {subject:?}"))?;
                SchemaText {
                    text: latest.text,
                    references,
                }
            }
            (Some(schema), None) => schema.clone(),
            (None, None) => bail!(
                "a {} sink needs `schema` or `schema_registry`",
                config.name()
            ),
        };
        match config.format {
            Format::Avro => {
                encoder.schema = Some(Compiled::parse(&avro::with_references(&schema)?)?)
            }
            _ => {
                let message = Proto::parse_with(&schema)?.message(config.message.as_deref())?;
                let indexes = protobuf::indexes_of(&message);
                encoder.message = Some((message, indexes));
            }
        }
        Ok(encoder)
    }

    /// Whether values pass as they are.
    pub fn is_bytes(&self) -> bool {
        self.format == Format::Bytes
    }

    /// `value` in the sink's format; `Err`: what is wrong with it.
    pub fn encode<'a>(&'a mut self, value: &'a [u8]) -> Result<&'a [u8], String> {
        match self.format {
            Format::Bytes => Ok(value),
            Format::Json => check_json(value).map(|()| value),
            Format::Avro => {
                self.out.clear();
                if let Some(id) = self.id {
                    registry::put_header(id, &mut self.out);
                }
                let schema = self
                    .schema
                    .as_ref()
                    .expect("an avro encoder has its schema");
                schema.json_to_datum(value, &mut self.out).map_err(|e| {
                    let e = format!("{e:#}");
                    if e.starts_with("not JSON") {
                        e
                    } else {
                        format!("does not fit the sink's Avro schema: {e}")
                    }
                })?;
                Ok(&self.out)
            }
            Format::Protobuf => {
                self.out.clear();
                let (message, indexes) = self
                    .message
                    .as_ref()
                    .expect("a protobuf encoder has its message");
                if let Some(id) = self.id {
                    registry::put_header(id, &mut self.out);
                    protobuf::put_indexes(indexes, &mut self.out);
                }
                protobuf::json_to_message(message, value, &mut self.out)?;
                Ok(&self.out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = r#"{"type":"record","name":"E","fields":[{"name":"user","type":"string"},{"name":"n","type":"int"}]}"#;

    fn config(format: Format, schema: Option<&str>) -> FormatConfig {
        FormatConfig {
            format,
            schema: schema.map(SchemaText::plain),
            ..FormatConfig::bytes()
        }
    }

    fn decoded(decoder: &mut Decoder, value: &[u8]) -> Result<String, String> {
        match decoder.decode("t", value).unwrap() {
            Decoded::Value(v) => Ok(String::from_utf8(v.to_vec()).unwrap()),
            Decoded::Bad(why) => Err(why),
        }
    }

    #[test]
    fn bare_avro_values_of_the_jobs_schema_are_read_as_json() {
        let mut encoder = Encoder::open(&config(Format::Avro, Some(V1)), "t").unwrap();
        let datum = encoder.encode(br#"{"user":"a","n":2}"#).unwrap().to_vec();
        let mut decoder = Decoder::new(&config(Format::Avro, Some(V1))).unwrap();
        assert_eq!(
            decoded(&mut decoder, &datum),
            Ok(r#"{"user":"a","n":2}"#.into())
        );
        assert_eq!(datum, [2, b'a', 4]);
        let bad = decoded(&mut decoder, &datum[..2]).unwrap_err();
        assert!(bad.contains("ends early"), "{bad}");
        let mut longer = datum.clone();
        longer.push(0);
        assert!(
            decoded(&mut decoder, &longer)
                .unwrap_err()
                .contains("1 bytes left")
        );
        let e = encoder.encode(br#"{"user":"a"}"#).unwrap_err();
        assert!(e.contains("field n is missing"), "{e}");
        assert!(
            encoder
                .encode(b"not json")
                .unwrap_err()
                .starts_with("not JSON")
        );
    }

    #[test]
    fn bare_protobuf_messages_of_the_jobs_schema_are_read_as_json() {
        const PROTO: &str = "syntax = \"proto3\"; package p; message A { int32 x = 1; } \
                             message B { string user = 1; int64 n = 2; }";
        let named = FormatConfig {
            message: Some("p.B".into()),
            ..config(Format::Protobuf, Some(PROTO))
        };
        let mut encoder = Encoder::open(&named, "t").unwrap();
        let message = encoder.encode(br#"{"user":"a","n":2}"#).unwrap().to_vec();
        assert_eq!(message, [0x0a, 1, b'a', 0x10, 2]);
        let mut decoder = Decoder::new(&named).unwrap();
        assert_eq!(
            decoded(&mut decoder, &message),
            Ok(r#"{"user":"a","n":2}"#.into())
        );
        let bad = decoded(&mut decoder, &message[..2]).unwrap_err();
        assert!(bad.contains("not a Protobuf message p.B"), "{bad}");
        let e = encoder.encode(br#"{"user":"a","m":1}"#).unwrap_err();
        assert!(
            e.contains("does not fit the sink's Protobuf message p.B"),
            "{e}"
        );
        // Without `message`, the schema's first.
        let first = config(Format::Protobuf, Some(PROTO));
        let mut decoder = Decoder::new(&first).unwrap();
        assert_eq!(decoded(&mut decoder, &[0x08, 7]), Ok(r#"{"x":7}"#.into()));
        let wrong = FormatConfig {
            message: Some("p.C".into()),
            ..first
        };
        let e = Decoder::new(&wrong).err().unwrap().to_string();
        assert!(e.contains("no message \"p.C\""), "{e}");
    }

    #[test]
    fn json_values_are_checked_and_passed_as_they_are() {
        let mut decoder = Decoder::new(&config(Format::Json, None)).unwrap();
        assert_eq!(
            decoded(&mut decoder, br#"{"a": [1, 2]}"#),
            Ok(r#"{"a": [1, 2]}"#.into())
        );
        assert!(
            decoded(&mut decoder, b"{\"a\":")
                .unwrap_err()
                .starts_with("not JSON")
        );
        let mut bytes = Decoder::new(&FormatConfig::bytes()).unwrap();
        assert!(matches!(
            bytes.decode("t", b"\xff{").unwrap(),
            Decoded::Value(b"\xff{")
        ));
    }
}
