//! Avro values to and from the JSON text operators read and write.
//!
//! A schema is compiled once into a flat tree ([`Compiled`]) with named types resolved
//! to indices, and a datum is turned into JSON walking that tree and the bytes
//! together: no intermediate value per record (`apache-avro`'s `Value` and then
//! `serde_json`'s took 0.87 µs per small record, this a fraction of it). A datum written
//! with another schema than the reader's goes through `apache-avro`'s schema resolution
//! first (fields added with defaults, removed, promoted), which is slower and only
//! taken while old records are read.
//!
//! The JSON is Avro's own JSON mapping without its union wrappers: records are objects
//! with their fields in the schema's order, unions their value as it is, enums their
//! symbol, `bytes` and `fixed` strings whose code points are the bytes (0–255), logical
//! types their underlying type (a `timestamp-millis` is a number, a `uuid` a string), and
//! a float that is not finite `null`. Writing takes that JSON back: a union takes the
//! first branch the value fits, a field left out its default.

use std::collections::HashMap;
use std::fmt::Write as _;

use anyhow::{Result, anyhow, bail};
use apache_avro::Schema;
use apache_avro::schema::{InnerDecimalSchema, Name, UuidSchema};
use apache_avro::types::Value;
use serde_json::Value as Json;

use super::json::J;

mod references;

pub use references::with_references;

/// One node of a compiled schema; children are indices into [`Compiled::nodes`].
#[derive(Debug, Clone)]
enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Array(usize),
    Map(usize),
    Union(Vec<usize>),
    Record(Vec<Field>),
    Enum(Vec<String>),
    Fixed(usize),
}

#[derive(Debug, Clone)]
struct Field {
    name: String,
    /// The name as a JSON key, quoted and escaped, with its colon.
    key: String,
    node: usize,
    default: Option<J<'static>>,
}

/// A schema compiled for reading and writing JSON.
#[derive(Debug, Clone)]
pub struct Compiled {
    nodes: Vec<Node>,
    /// The node of the schema itself.
    root: usize,
    /// The schema as parsed, for resolution against another.
    pub schema: Schema,
}

/// How deep values may nest (a hostile datum of nested arrays must not overflow the
/// stack).
const MAX_DEPTH: usize = 128;

/// The most JSON one datum may decode to. Items of an array or a map can take no bytes
/// at all (nulls, empty records), so a small hostile datum could otherwise ask for
/// terabytes.
pub const MAX_JSON_BYTES: usize = 64 << 20;

impl Compiled {
    /// Parses and compiles a schema written as JSON text.
    pub fn parse(text: &str) -> Result<Compiled> {
        let schema = Schema::parse_str(text).map_err(|e| anyhow!("not an Avro schema: {e}"))?;
        Compiled::new(schema)
    }

    /// Compiles a parsed schema.
    pub fn new(schema: Schema) -> Result<Compiled> {
        let mut compiler = Compiler {
            nodes: Vec::new(),
            named: HashMap::new(),
        };
        let root = compiler.node(&schema, None)?;
        Ok(Compiled {
            nodes: compiler.nodes,
            root,
            schema,
        })
    }

    /// Appends the JSON text of the datum at the start of `input` to `out`, taking the
    /// bytes it used from `input`.
    pub fn datum_to_json(&self, input: &mut &[u8], out: &mut Vec<u8>) -> Result<()> {
        self.to_json(self.root, input, out, 0)
    }

    fn to_json(
        &self,
        node: usize,
        input: &mut &[u8],
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<()> {
        if depth > MAX_DEPTH {
            bail!("values nest deeper than {MAX_DEPTH} levels");
        }
        match &self.nodes[node] {
            Node::Null => out.extend_from_slice(b"null"),
            Node::Boolean => match take(input, 1)?[0] {
                0 => out.extend_from_slice(b"false"),
                1 => out.extend_from_slice(b"true"),
                b => bail!("a boolean is 0 or 1, not {b}"),
            },
            Node::Int => {
                let v = long(input)?;
                let v = i32::try_from(v).map_err(|_| anyhow!("an int out of range: {v}"))?;
                out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
            }
            Node::Long => {
                out.extend_from_slice(itoa::Buffer::new().format(long(input)?).as_bytes())
            }
            Node::Float => {
                let b = take(input, 4)?;
                float(
                    f64::from(f32::from_le_bytes(b.try_into().expect("4 bytes"))),
                    out,
                );
            }
            Node::Double => {
                let b = take(input, 8)?;
                float(f64::from_le_bytes(b.try_into().expect("8 bytes")), out);
            }
            Node::Bytes => {
                let n = length(input)?;
                latin1(take(input, n)?, out);
            }
            Node::String => {
                let n = length(input)?;
                let s = std::str::from_utf8(take(input, n)?)
                    .map_err(|e| anyhow!("a string that is not UTF-8: {e}"))?;
                string(s, out);
            }
            Node::Fixed(size) => latin1(take(input, *size)?, out),
            Node::Enum(symbols) => {
                let i = long(input)?;
                let symbol = usize::try_from(i)
                    .ok()
                    .and_then(|i| symbols.get(i))
                    .ok_or_else(|| anyhow!("enum index {i} of {} symbols", symbols.len()))?;
                string(symbol, out);
            }
            Node::Union(branches) => {
                let i = long(input)?;
                let branch = usize::try_from(i)
                    .ok()
                    .and_then(|i| branches.get(i))
                    .ok_or_else(|| anyhow!("union branch {i} of {}", branches.len()))?;
                self.to_json(*branch, input, out, depth + 1)?;
            }
            Node::Record(fields) => {
                out.push(b'{');
                for (i, field) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(field.key.as_bytes());
                    self.to_json(field.node, input, out, depth + 1)?;
                }
                out.push(b'}');
            }
            Node::Array(items) => {
                out.push(b'[');
                let mut first = true;
                blocks(input, |input| {
                    if !std::mem::take(&mut first) {
                        out.push(b',');
                    }
                    self.to_json(*items, input, out, depth + 1)?;
                    too_large(out)
                })?;
                out.push(b']');
            }
            Node::Map(values) => {
                out.push(b'{');
                let mut first = true;
                blocks(input, |input| {
                    if !std::mem::take(&mut first) {
                        out.push(b',');
                    }
                    let n = length(input)?;
                    let key = std::str::from_utf8(take(input, n)?)
                        .map_err(|e| anyhow!("a map key that is not UTF-8: {e}"))?;
                    string(key, out);
                    out.push(b':');
                    self.to_json(*values, input, out, depth + 1)?;
                    too_large(out)
                })?;
                out.push(b'}');
            }
        }
        Ok(())
    }

    /// Appends the Avro datum of the JSON text `text` to `out`.
    pub fn json_to_datum(&self, text: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let value = J::parse(text).map_err(|e| anyhow!("not JSON: {e}"))?;
        self.encode(self.root, &value, out, At::Root)
    }

    fn encode(&self, node: usize, value: &J<'_>, out: &mut Vec<u8>, path: At<'_>) -> Result<()> {
        let wrong = |expected: &str| {
            let at = match path {
                At::Root => "the value".to_string(),
                _ => path.to_string(),
            };
            anyhow!("{at} is {}, not {expected}", describe(value))
        };
        match (&self.nodes[node], value) {
            (Node::Null, J::Null) => {}
            (Node::Boolean, J::Bool(b)) => out.push(u8::from(*b)),
            (Node::Int, J::Int(v)) => {
                let v = i32::try_from(*v).map_err(|_| wrong("an int"))?;
                put_long(i64::from(v), out);
            }
            (Node::Long, J::Int(v)) => put_long(*v, out),
            (Node::Float, J::Int(_) | J::UInt(_) | J::Float(_)) => {
                let v = value.as_f64().expect("a number");
                out.extend_from_slice(&(v as f32).to_le_bytes());
            }
            (Node::Double, J::Int(_) | J::UInt(_) | J::Float(_)) => {
                out.extend_from_slice(&value.as_f64().expect("a number").to_le_bytes());
            }
            (Node::Float, J::Null) => out.extend_from_slice(&f32::NAN.to_le_bytes()),
            (Node::Double, J::Null) => out.extend_from_slice(&f64::NAN.to_le_bytes()),
            (Node::String, J::Str(s)) => {
                put_long(s.len() as i64, out);
                out.extend_from_slice(s.as_bytes());
            }
            (Node::Bytes, J::Str(s)) => {
                let bytes = from_latin1(s).ok_or_else(|| wrong("bytes (code points 0 to 255)"))?;
                put_long(bytes.len() as i64, out);
                out.extend_from_slice(&bytes);
            }
            (Node::Fixed(size), J::Str(s)) => {
                let bytes = from_latin1(s)
                    .filter(|b| b.len() == *size)
                    .ok_or_else(|| wrong(&format!("{size} bytes (code points 0 to 255)")))?;
                out.extend_from_slice(&bytes);
            }
            (Node::Enum(symbols), J::Str(s)) => {
                let i = symbols
                    .iter()
                    .position(|x| x == s)
                    .ok_or_else(|| wrong(&format!("one of the symbols {}", symbols.join(", "))))?;
                put_long(i as i64, out);
            }
            (Node::Union(branches), _) => {
                let (i, branch) = branches
                    .iter()
                    .enumerate()
                    .find(|(_, b)| self.fits(**b, value))
                    .ok_or_else(|| wrong("any branch of its union"))?;
                put_long(i as i64, out);
                self.encode(*branch, value, out, path)?;
            }
            (Node::Record(fields), J::Obj(_)) => {
                for field in fields {
                    let at = At::Field(&path, &field.name);
                    match value.get(&field.name).or(field.default.as_ref()) {
                        Some(v) => self.encode(field.node, v, out, at)?,
                        None => bail!("field {at} is missing and has no default"),
                    }
                }
            }
            (Node::Array(items), J::Arr(values)) => {
                if !values.is_empty() {
                    put_long(values.len() as i64, out);
                    for (i, v) in values.iter().enumerate() {
                        self.encode(*items, v, out, At::Index(&path, i))?;
                    }
                }
                out.push(0);
            }
            (Node::Map(values), J::Obj(map)) => {
                if !map.is_empty() {
                    put_long(map.len() as i64, out);
                    for (k, v) in map {
                        put_long(k.len() as i64, out);
                        out.extend_from_slice(k.as_bytes());
                        self.encode(*values, v, out, At::Key(&path, k))?;
                    }
                }
                out.push(0);
            }
            (Node::Null, _) => return Err(wrong("null")),
            (Node::Boolean, _) => return Err(wrong("a boolean")),
            (Node::Int | Node::Long, _) => return Err(wrong("an integer")),
            (Node::Float | Node::Double, _) => return Err(wrong("a number")),
            (Node::String | Node::Bytes | Node::Fixed(_) | Node::Enum(_), _) => {
                return Err(wrong("a string"));
            }
            (Node::Record(_) | Node::Map(_), _) => return Err(wrong("an object")),
            (Node::Array(_), _) => return Err(wrong("an array")),
        }
        Ok(())
    }

    /// Whether `value` is of the kind `node` takes (a union's branch choice).
    fn fits(&self, node: usize, value: &J<'_>) -> bool {
        match (&self.nodes[node], value) {
            (Node::Null, J::Null) | (Node::Boolean, J::Bool(_)) => true,
            (Node::Int, J::Int(v)) => i32::try_from(*v).is_ok(),
            (Node::Long, J::Int(_)) => true,
            (Node::Float | Node::Double, J::Int(_) | J::UInt(_) | J::Float(_)) => true,
            (Node::String | Node::Bytes, J::Str(_)) => true,
            (Node::Fixed(size), J::Str(s)) => s.chars().count() == *size,
            (Node::Enum(symbols), J::Str(s)) => symbols.iter().any(|x| x == s),
            (Node::Array(_), J::Arr(_)) | (Node::Map(_), J::Obj(_)) => true,
            (Node::Record(fields), J::Obj(map)) => {
                map.iter().all(|(k, _)| fields.iter().any(|f| f.name == *k))
                    && fields
                        .iter()
                        .all(|f| f.default.is_some() || value.get(&f.name).is_some())
            }
            _ => false,
        }
    }
}

/// Where in a value the encoder is, written out only in an error:
/// `ship.city`, `tags[2]`, `attrs["k"]`.
#[derive(Clone, Copy)]
enum At<'a> {
    Root,
    Field(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
    Key(&'a At<'a>, &'a str),
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Root => Ok(()),
            At::Field(At::Root, name) => f.write_str(name),
            At::Field(up, name) => write!(f, "{up}.{name}"),
            At::Index(up, i) => write!(f, "{up}[{i}]"),
            At::Key(up, k) => write!(f, "{up}[{k:?}]"),
        }
    }
}

/// Appends the JSON text of a value `apache-avro` decoded (and resolved) to `out`.
pub fn value_to_json(value: &Value, out: &mut Vec<u8>) -> Result<()> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Boolean(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Int(v) | Value::Date(v) | Value::TimeMillis(v) => {
            out.extend_from_slice(itoa::Buffer::new().format(*v).as_bytes())
        }
        Value::Long(v)
        | Value::TimeMicros(v)
        | Value::TimestampMillis(v)
        | Value::TimestampMicros(v)
        | Value::TimestampNanos(v)
        | Value::LocalTimestampMillis(v)
        | Value::LocalTimestampMicros(v)
        | Value::LocalTimestampNanos(v) => {
            out.extend_from_slice(itoa::Buffer::new().format(*v).as_bytes())
        }
        Value::Float(v) => float(f64::from(*v), out),
        Value::Double(v) => float(*v, out),
        Value::Bytes(b) | Value::Fixed(_, b) => latin1(b, out),
        Value::String(s) | Value::Enum(_, s) => string(s, out),
        Value::Uuid(u) => string(&u.to_string(), out),
        Value::Decimal(d) => {
            let bytes: Vec<u8> = d.try_into().map_err(|e| anyhow!("a decimal: {e}"))?;
            latin1(&bytes, out);
        }
        Value::BigDecimal(d) => string(&d.to_string(), out),
        Value::Duration(d) => {
            let bytes: [u8; 12] = (*d).into();
            latin1(&bytes, out);
        }
        Value::Union(_, v) => value_to_json(v, out)?,
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                value_to_json(v, out)?;
            }
            out.push(b']');
        }
        Value::Map(map) => {
            out.push(b'{');
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(k, out);
                out.push(b':');
                value_to_json(&map[k], out)?;
            }
            out.push(b'}');
        }
        Value::Record(fields) => {
            out.push(b'{');
            for (i, (k, v)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(k, out);
                out.push(b':');
                value_to_json(v, out)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

struct Compiler {
    nodes: Vec<Node>,
    /// Named types (records, enums, fixed) by full name, to their nodes.
    named: HashMap<String, usize>,
}

impl Compiler {
    /// Compiles `schema` into a node and returns its index. `namespace`: the enclosing
    /// one, for references by short name.
    fn node(&mut self, schema: &Schema, namespace: Option<&str>) -> Result<usize> {
        let node = match schema {
            Schema::Null => Node::Null,
            Schema::Boolean => Node::Boolean,
            Schema::Int | Schema::Date | Schema::TimeMillis => Node::Int,
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => Node::Long,
            Schema::Float => Node::Float,
            Schema::Double => Node::Double,
            Schema::Bytes | Schema::BigDecimal => Node::Bytes,
            Schema::String => Node::String,
            Schema::Uuid(UuidSchema::String) => Node::String,
            Schema::Uuid(UuidSchema::Bytes) => Node::Bytes,
            Schema::Uuid(UuidSchema::Fixed(f)) => {
                return self.named(&f.name, namespace, |_, _| Ok(Node::Fixed(f.size)));
            }
            Schema::Decimal(d) => match &d.inner {
                InnerDecimalSchema::Bytes => Node::Bytes,
                InnerDecimalSchema::Fixed(f) => {
                    return self.named(&f.name, namespace, |_, _| Ok(Node::Fixed(f.size)));
                }
            },
            Schema::Duration(f) => {
                return self.named(&f.name, namespace, |_, _| Ok(Node::Fixed(f.size)));
            }
            Schema::Fixed(f) => {
                return self.named(&f.name, namespace, |_, _| Ok(Node::Fixed(f.size)));
            }
            Schema::Enum(e) => {
                return self.named(&e.name, namespace, |_, _| Ok(Node::Enum(e.symbols.clone())));
            }
            Schema::Array(a) => {
                let items = self.node(&a.items, namespace)?;
                Node::Array(items)
            }
            Schema::Map(m) => {
                let values = self.node(&m.types, namespace)?;
                Node::Map(values)
            }
            Schema::Union(u) => {
                let branches = u
                    .variants()
                    .iter()
                    .map(|v| self.node(v, namespace))
                    .collect::<Result<_>>()?;
                Node::Union(branches)
            }
            Schema::Record(r) => {
                return self.named(&r.name, namespace, |compiler, inner| {
                    let mut fields = Vec::with_capacity(r.fields.len());
                    for f in &r.fields {
                        let mut key = String::new();
                        let _ = write!(key, "{}:", Json::String(f.name.clone()));
                        fields.push(Field {
                            name: f.name.clone(),
                            key,
                            node: compiler.node(&f.schema, inner)?,
                            default: f.default.as_ref().map(J::from_value),
                        });
                    }
                    Ok(Node::Record(fields))
                });
            }
            Schema::Ref { name } => {
                let full = name.fullname(namespace);
                return self
                    .named
                    .get(&full)
                    .copied()
                    .ok_or_else(|| anyhow!("the schema names a type it does not define: {full}"));
            }
        };
        self.nodes.push(node);
        Ok(self.nodes.len() - 1)
    }

    /// A named type's node: its index is taken before its children are compiled, so
    /// that a recursive type can refer to itself.
    fn named(
        &mut self,
        name: &Name,
        namespace: Option<&str>,
        build: impl FnOnce(&mut Self, Option<&str>) -> Result<Node>,
    ) -> Result<usize> {
        let full = name.fullname(namespace);
        let index = self.nodes.len();
        self.nodes.push(Node::Null);
        self.named.insert(full, index);
        let inner = name.namespace().or(namespace).map(str::to_string);
        let node = build(self, inner.as_deref())?;
        self.nodes[index] = node;
        Ok(index)
    }
}

/// An error once `out` holds more than [`MAX_JSON_BYTES`].
fn too_large(out: &[u8]) -> Result<()> {
    if out.len() > MAX_JSON_BYTES {
        bail!(
            "the datum decodes to more than {} MiB of JSON",
            MAX_JSON_BYTES >> 20
        );
    }
    Ok(())
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    if input.len() < n {
        bail!(
            "the datum ends early: {n} more bytes needed, {} left",
            input.len()
        );
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Ok(head)
}

/// A zig-zag variable-length long.
fn long(input: &mut &[u8]) -> Result<i64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = take(input, 1)?[0];
        value |= u64::from(b & 0x7F) << shift;
        if b & 0x80 == 0 {
            return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    bail!("a variable-length integer longer than 10 bytes")
}

fn length(input: &mut &[u8]) -> Result<usize> {
    let n = long(input)?;
    usize::try_from(n).map_err(|_| anyhow!("a negative length: {n}"))
}

/// Appends an Avro `long`: zigzag, then a varint.
pub(crate) fn put_long(v: i64, out: &mut Vec<u8>) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// An array's or a map's blocks: a count (negative: its absolute value, then the
/// block's size in bytes), items, until a count of 0.
fn blocks(input: &mut &[u8], mut item: impl FnMut(&mut &[u8]) -> Result<()>) -> Result<()> {
    loop {
        let count = long(input)?;
        if count == 0 {
            return Ok(());
        }
        if count < 0 {
            long(input)?;
        }
        let count = count.unsigned_abs();
        // Each item takes a byte at least (a null takes none: bound by what is left).
        if count > input.len() as u64 + 1 && count > 1 << 20 {
            bail!("a block of {count} items in {} bytes", input.len());
        }
        for _ in 0..count {
            item(input)?;
        }
    }
}

/// A double as serde_json writes it: the shortest text that reads back as the same
/// double (`1.0` for one), `null` when it is not finite.
fn float(v: f64, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, &v).expect("writing to a Vec");
}

/// `s` as a JSON string: copied between quotes when nothing in it needs escaping (most
/// strings), else escaped by serde_json.
fn string(s: &str, out: &mut Vec<u8>) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("writing to a Vec");
    }
}

/// Bytes as a JSON string whose code points are the bytes.
fn latin1(bytes: &[u8], out: &mut Vec<u8>) {
    let s: String = bytes.iter().map(|&b| char::from(b)).collect();
    string(&s, out);
}

fn from_latin1(s: &str) -> Option<Vec<u8>> {
    s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

fn describe(value: &J<'_>) -> String {
    match value {
        J::Null => "null".into(),
        J::Bool(b) => b.to_string(),
        J::Int(_) | J::UInt(_) | J::Float(_) => format!("the number {value}"),
        J::Str(s) if s.len() <= 40 => format!("the string {s:?}"),
        J::Str(_) => "a string".into(),
        J::Arr(_) => "an array".into(),
        J::Obj(_) => "an object".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = r#"{
        "type": "record", "name": "Order", "namespace": "shop",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "user", "type": "string"},
            {"name": "amount", "type": "double"},
            {"name": "qty", "type": "int"},
            {"name": "ok", "type": "boolean"},
            {"name": "note", "type": ["null", "string"], "default": null},
            {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "attrs", "type": {"type": "map", "values": "long"}},
            {"name": "raw", "type": "bytes"},
            {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 2}},
            {"name": "ship", "type": {"type": "record", "name": "Address",
                "fields": [{"name": "city", "type": "string"}]}},
            {"name": "bill", "type": ["null", "Address"], "default": null},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "ratio", "type": "float", "default": 0.5},
            {"name": "next", "type": ["null", "Order"], "default": null}
        ]
    }"#;

    const ORDER: &str = r#"{"id":-7,"user":"zoë \"q\"","amount":12.5,"qty":3,"ok":true,"note":"hi","status":"PAID","tags":["a","b"],"attrs":{"k":1},"raw":"\u0000ÿ","digest":"ab","ship":{"city":"Delft"},"bill":{"city":"Gouda"},"at":1700000000000,"ratio":0.25,"next":{"id":1,"user":"u","amount":1.0,"qty":0,"ok":false,"note":null,"status":"NEW","tags":[],"attrs":{},"raw":"","digest":"zz","ship":{"city":"x"},"bill":null,"at":0,"ratio":0.5,"next":null}}"#;

    fn json(text: &str) -> Json {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn json_goes_to_avro_and_back_unchanged_and_as_apache_avro_reads_it() {
        let compiled = Compiled::parse(SCHEMA).unwrap();
        let mut datum = Vec::new();
        compiled
            .json_to_datum(ORDER.as_bytes(), &mut datum)
            .unwrap();
        let mut out = Vec::new();
        let mut input = &datum[..];
        compiled.datum_to_json(&mut input, &mut out).unwrap();
        assert!(input.is_empty());
        assert_eq!(json(std::str::from_utf8(&out).unwrap()), json(ORDER));
        // Fields in the schema's order.
        assert!(
            std::str::from_utf8(&out)
                .unwrap()
                .starts_with(r#"{"id":-7,"user":"#)
        );
        // The same datum through apache-avro's decoder and its values.
        let value = apache_avro::reader::datum::GenericDatumReader::builder(&compiled.schema)
            .build()
            .unwrap()
            .read_value(&mut &datum[..])
            .unwrap();
        let mut via_values = Vec::new();
        value_to_json(&value, &mut via_values).unwrap();
        assert_eq!(via_values, out);
        // apache-avro's encoder writes the same bytes.
        let resolved = value.resolve(&compiled.schema).unwrap();
        let written = apache_avro::writer::datum::GenericDatumWriter::builder(&compiled.schema)
            .build()
            .unwrap()
            .write_value_to_vec(resolved)
            .unwrap();
        assert_eq!(written, datum);
    }

    #[test]
    fn left_out_fields_take_their_defaults_and_wrong_ones_are_named() {
        let compiled = Compiled::parse(SCHEMA).unwrap();
        let mut partial = json(ORDER);
        let map = partial.as_object_mut().unwrap();
        map.remove("ratio");
        map.remove("note");
        let mut datum = Vec::new();
        compiled
            .json_to_datum(partial.to_string().as_bytes(), &mut datum)
            .unwrap();
        let mut out = Vec::new();
        compiled.datum_to_json(&mut &datum[..], &mut out).unwrap();
        let back = json(std::str::from_utf8(&out).unwrap());
        assert_eq!(back["ratio"], json("0.5"));
        assert_eq!(back["note"], Json::Null);

        let mut missing = json(ORDER);
        missing.as_object_mut().unwrap().remove("user");
        let e = compiled
            .json_to_datum(missing.to_string().as_bytes(), &mut Vec::new())
            .unwrap_err();
        assert_eq!(e.to_string(), "field user is missing and has no default");
        let mut wrong = json(ORDER);
        wrong["ship"]["city"] = json("3");
        let e = compiled
            .json_to_datum(wrong.to_string().as_bytes(), &mut Vec::new())
            .unwrap_err();
        assert_eq!(e.to_string(), "ship.city is the number 3, not a string");
        wrong = json(ORDER);
        wrong["status"] = json(r#""LOST""#);
        let e = compiled
            .json_to_datum(wrong.to_string().as_bytes(), &mut Vec::new())
            .unwrap_err();
        assert!(
            e.to_string().contains("one of the symbols NEW, PAID"),
            "{e}"
        );
        wrong = json(ORDER);
        wrong["qty"] = json("4294967296");
        assert!(
            compiled
                .json_to_datum(wrong.to_string().as_bytes(), &mut Vec::new())
                .is_err()
        );
    }

    #[test]
    fn malformed_datums_are_errors_never_panics() {
        let compiled = Compiled::parse(SCHEMA).unwrap();
        let mut datum = Vec::new();
        compiled
            .json_to_datum(ORDER.as_bytes(), &mut datum)
            .unwrap();
        // Every proper prefix ends early.
        for end in 0..datum.len() {
            let mut input = &datum[..end];
            assert!(
                compiled.datum_to_json(&mut input, &mut Vec::new()).is_err(),
                "prefix {end}"
            );
        }
        // Bytes flipped anywhere: an error or some value, never a panic or a hang.
        let mut rng = 0x9E37_79B9_7F4A_7C15_u64;
        for _ in 0..20_000 {
            let mut bad = datum.clone();
            for _ in 0..3 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let i = (rng % bad.len() as u64) as usize;
                bad[i] = (rng >> 32) as u8;
            }
            let _ = compiled.datum_to_json(&mut &bad[..], &mut Vec::new());
        }
        // A huge block count over few bytes is refused without trying to read it.
        let array = Compiled::parse(r#"{"type":"array","items":"null"}"#).unwrap();
        let mut huge = Vec::new();
        put_long(i64::MAX / 4, &mut huge);
        assert!(
            array
                .datum_to_json(&mut &huge[..], &mut Vec::new())
                .is_err()
        );
        // Blocks of nulls (no bytes each) that would decode to ~2 TB of JSON stop at the
        // bound.
        let mut nulls = Vec::new();
        for _ in 0..400_000 {
            put_long(1 << 20, &mut nulls);
        }
        nulls.push(0);
        let e = array
            .datum_to_json(&mut &nulls[..], &mut Vec::new())
            .unwrap_err();
        assert!(e.to_string().contains("more than 64 MiB of JSON"), "{e}");
        // Nesting deeper than the bound is an error, not a stack overflow.
        let nested = Compiled::parse(
            r#"{"type":"record","name":"N","fields":[{"name":"n","type":["null","N"]}]}"#,
        )
        .unwrap();
        let deep = vec![2u8; 100_000];
        let e = nested
            .datum_to_json(&mut &deep[..], &mut Vec::new())
            .unwrap_err();
        assert!(e.to_string().contains("nest deeper"), "{e}");
    }

    #[test]
    fn a_schema_naming_an_undefined_type_is_refused() {
        let e = Compiled::parse(
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":"Nope"}]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("not an Avro schema"), "{e}");
    }
}
