//! Protocol Buffers messages to and from the JSON text operators read and write.
//!
//! A schema is a `.proto` file's text (the job's `schema`, or the registry's), compiled
//! at start with `protox`. It may import Google's well-known types, such as
//! `google/protobuf/timestamp.proto`, and other files: the job's schema those beside it
//! (paths relative to its folder), the registry's those its schema references name.
//!
//! A message is decoded with `prost-reflect` into a dynamic message and written as
//! proto3's JSON mapping, with two choices made for operators that read it typed: fields
//! keep their `.proto` names (not lowerCamelCase), and every field is present, with its
//! default when it was not set (as an Avro record has all its fields). 64-bit integers
//! are JSON numbers, as Avro's longs are. Writing takes that JSON back (either field
//! name, numbers or strings for 64-bit integers); a field the message does not have is
//! an error, not dropped.
//!
//! Protobuf readers are tolerant by design: a message written with an older or newer
//! version of the schema is read with the job's (unknown fields left out, missing ones
//! their defaults), so no resolution step is needed.
//!
//! In Confluent's wire format the schema id is followed by the *message indexes*: which
//! message of the schema's file the value is (a count, then the index at each level of
//! nesting, as zigzag varints; `[0]`, the first message, written as a single 0 byte).

use std::cell::RefCell;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use anyhow::{Result, anyhow, bail};
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions,
};

use super::SchemaText;
use super::avro::MAX_JSON_BYTES;

/// The name the schema's text is compiled under: none an import would name (registries
/// hold files named `schema.proto`).
const FILE: &str = "<the job's schema>.proto";

/// A compiled `.proto` schema.
#[derive(Debug, Clone)]
pub struct Proto {
    pool: DescriptorPool,
}

impl Proto {
    /// Compiles a `.proto` file's text (importing only Google's well-known types).
    pub fn parse(text: &str) -> Result<Proto> {
        Proto::parse_with(&SchemaText::plain(text))
    }

    /// Compiles a `.proto` file's text and the files it imports.
    pub fn parse_with(schema: &SchemaText) -> Result<Proto> {
        Proto::compile(Files {
            main: schema.text.clone(),
            imports: schema.references.clone(),
        })
    }

    fn compile(files: impl protox::file::FileResolver + 'static) -> Result<Proto> {
        let mut resolver = protox::file::ChainFileResolver::new();
        resolver.add(files);
        resolver.add(protox::file::GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler.include_imports(true);
        compiler.open_file(FILE).map_err(|e| {
            let e = e.to_string();
            anyhow!("not a .proto schema protox can compile: {e}")
        })?;
        let proto = Proto {
            pool: compiler.descriptor_pool(),
        };
        if proto.file().messages().len() == 0 {
            bail!("the .proto schema defines no message");
        }
        Ok(proto)
    }

    /// The `.proto` file `text` of folder `folder` with the files it imports (other than
    /// Google's well-known types), read relative to that folder as `protoc -I FOLDER`
    /// finds them; and the schema compiled.
    pub fn with_imports(text: String, folder: &Path) -> Result<(SchemaText, Proto)> {
        let read = Rc::new(RefCell::new(Vec::new()));
        let proto = Proto::compile(Folder {
            main: text.clone(),
            folder: folder.to_path_buf(),
            read: read.clone(),
        })?;
        let references = read.take();
        Ok((SchemaText { text, references }, proto))
    }

    /// The files `file` (the schema's own when `None`) imports, other than Google's
    /// well-known types.
    pub fn imports(&self, file: Option<&str>) -> Vec<String> {
        self.pool
            .get_file_by_name(file.unwrap_or(FILE))
            .map(|f| {
                f.dependencies()
                    .map(|d| d.name().to_string())
                    .filter(|name| !is_well_known(name))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn file(&self) -> prost_reflect::FileDescriptor {
        self.pool
            .get_file_by_name(FILE)
            .expect("the compiled file is in its pool")
    }

    /// The message named `name` (its full name, `package.Message`), or the file's first.
    pub fn message(&self, name: Option<&str>) -> Result<MessageDescriptor> {
        match name {
            None => Ok(self
                .file()
                .messages()
                .next()
                .expect("checked at parse: a message")),
            // Only the schema's own messages (nested ones too): a message of a file it
            // imports has no message indexes in it.
            Some(name) => match self.pool.get_message_by_name(name) {
                Some(message) if message.parent_file().name() == FILE => Ok(message),
                found => {
                    let names: Vec<String> = self
                        .file()
                        .messages()
                        .map(|m| m.full_name().to_string())
                        .collect();
                    let imported = match found {
                        Some(m) => format!(", only a file it imports: {}", m.parent_file().name()),
                        None => String::new(),
                    };
                    Err(anyhow!(
                        "the .proto schema has no message {name:?} (it has {names:?}){imported}"
                    ))
                }
            },
        }
    }

    /// The message the wire format's message indexes name.
    pub fn by_indexes(&self, indexes: &[i32]) -> Option<MessageDescriptor> {
        let (first, nested) = indexes.split_first()?;
        let mut message = self.file().messages().nth(usize::try_from(*first).ok()?)?;
        for index in nested {
            let child = message
                .child_messages()
                .nth(usize::try_from(*index).ok()?)?;
            message = child;
        }
        Some(message)
    }
}

/// The message indexes of `message` in its file, for the wire format.
pub fn indexes_of(message: &MessageDescriptor) -> Vec<i32> {
    // A message's path in its file is [4, i] at the top and [.., 3, j] for each level of
    // nesting: the indexes are every second element.
    message.path().iter().skip(1).step_by(2).copied().collect()
}

/// Decodes a message of `descriptor` from `bytes` into JSON in `out`; `Err`: why the
/// bytes are not one.
pub fn message_to_json(
    descriptor: &MessageDescriptor,
    bytes: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let message = DynamicMessage::decode(descriptor.clone(), bytes)
        .map_err(|e| format!("not a Protobuf message {}: {e}", descriptor.full_name()))?;
    let options = SerializeOptions::new()
        .stringify_64_bit_integers(false)
        .use_proto_field_name(true)
        .skip_default_fields(false);
    // Every field present can make a small message large (a repeated field of empty
    // messages with many fields): what it decodes to is bounded as Avro's is.
    let mut bounded = Bounded {
        out,
        left: MAX_JSON_BYTES,
    };
    let mut serializer = serde_json::Serializer::new(&mut bounded);
    message
        .serialize_with_options(&mut serializer, &options)
        .map_err(|e| {
            if bounded.left == 0 {
                format!(
                    "the message decodes to more than {} MiB of JSON",
                    MAX_JSON_BYTES >> 20
                )
            } else {
                format!("cannot be written as JSON: {e}")
            }
        })
}

/// Encodes the JSON `value` as a message of `descriptor`, appended to `out`.
pub fn json_to_message(
    descriptor: &MessageDescriptor,
    value: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let mut deserializer = serde_json::Deserializer::from_slice(value);
    let message = DynamicMessage::deserialize_with_options(
        descriptor.clone(),
        &mut deserializer,
        &DeserializeOptions::new(),
    )
    .and_then(|m| deserializer.end().map(|()| m))
    .map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            format!("not JSON: {e}")
        } else {
            format!(
                "does not fit the sink's Protobuf message {}: {e}",
                descriptor.full_name()
            )
        }
    })?;
    message
        .encode(out)
        .map_err(|e| format!("cannot be encoded: {e}"))
}

/// Splits the message indexes off a framed value's message, into `indexes`.
pub fn split_indexes<'a>(bytes: &'a [u8], indexes: &mut Vec<i32>) -> Result<&'a [u8], String> {
    let mut rest = bytes;
    let count = zigzag(&mut rest)?;
    indexes.clear();
    if count == 0 {
        indexes.push(0);
        return Ok(rest);
    }
    if count < 0 || count as usize > rest.len() {
        return Err(format!(
            "the wire format's message indexes give a count of {count}, which the value \
             cannot hold"
        ));
    }
    for _ in 0..count {
        indexes.push(zigzag(&mut rest)?);
    }
    Ok(rest)
}

/// Appends the message indexes `indexes` in the wire format.
pub fn put_indexes(indexes: &[i32], out: &mut Vec<u8>) {
    if indexes == [0] {
        out.push(0);
        return;
    }
    put_zigzag(indexes.len() as i32, out);
    for index in indexes {
        put_zigzag(*index, out);
    }
}

fn zigzag(bytes: &mut &[u8]) -> Result<i32, String> {
    let mut value: u32 = 0;
    for shift in (0..35).step_by(7) {
        let Some((&byte, rest)) = bytes.split_first() else {
            return Err("the wire format's message indexes end early".into());
        };
        *bytes = rest;
        value |= u32::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(((value >> 1) as i32) ^ -((value & 1) as i32));
        }
    }
    Err("a message index of the wire format is longer than 5 bytes".into())
}

fn put_zigzag(value: i32, out: &mut Vec<u8>) {
    let mut v = ((value << 1) ^ (value >> 31)) as u32;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A writer that fails once `left` bytes have been written.
struct Bounded<'a> {
    out: &'a mut Vec<u8>,
    left: usize,
}

impl Write for Bounded<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() > self.left {
            self.left = 0;
            return Err(std::io::Error::other("bound reached"));
        }
        self.left -= buf.len();
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether `name` is one of Google's well-known types, which every compiler has.
fn is_well_known(name: &str) -> bool {
    name.starts_with("google/protobuf/")
}

/// The schema's text and the files it imports, by the names they are imported as.
struct Files {
    main: String,
    imports: Vec<(String, String)>,
}

impl protox::file::FileResolver for Files {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        if name == FILE {
            return protox::file::File::from_source(name, &self.main);
        }
        match self.imports.iter().find(|(n, _)| n == name) {
            Some((_, text)) => protox::file::File::from_source(name, text),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

/// The job's schema file, the files it imports read from its folder (and noted).
struct Folder {
    main: String,
    folder: PathBuf,
    read: Rc<RefCell<Vec<(String, String)>>>,
}

impl protox::file::FileResolver for Folder {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        if name == FILE {
            return protox::file::File::from_source(name, &self.main);
        }
        // Only paths inside the folder: `a/b.proto`, never `/etc/x` or `../x`.
        let relative = Path::new(name);
        if is_well_known(name)
            || !relative
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(protox::Error::file_not_found(name));
        }
        let path = self.folder.join(relative);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(protox::Error::file_not_found(name));
            }
            Err(e) => return Err(protox::Error::new(e)),
        };
        let file = protox::file::File::from_source(name, &text)?;
        self.read.borrow_mut().push((name.to_string(), text));
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOP: &str = r#"
        syntax = "proto3";
        package shop;
        import "google/protobuf/timestamp.proto";
        message Order {
            string id = 1;
            int64 cents = 2;
            repeated string tags = 3;
            Address ship = 4;
            google.protobuf.Timestamp at = 5;
            message Line { string sku = 1; }
        }
        message Address { string city = 1; }
    "#;

    #[test]
    fn imports_come_from_the_schemas_folder_or_its_references() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("common")).unwrap();
        std::fs::write(
            dir.path().join("common/geo.proto"),
            "syntax = \"proto3\"; package common; message Point { double lat = 1; }",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("common/address.proto"),
            "syntax = \"proto3\"; package common; import \"common/geo.proto\";\n\
             message Address { string city = 1; Point at = 2; }",
        )
        .unwrap();
        let main = "syntax = \"proto3\"; package shop; import \"common/address.proto\";\n\
                    import \"google/protobuf/timestamp.proto\";\n\
                    message Order { string id = 1; common.Address ship = 2; \
                    google.protobuf.Timestamp at = 3; }";
        let (schema, _) = Proto::with_imports(main.into(), dir.path()).unwrap();
        let mut names: Vec<&str> = schema.references.iter().map(|(n, _)| n.as_str()).collect();
        names.sort();
        assert_eq!(names, ["common/address.proto", "common/geo.proto"]);
        let proto = Proto::parse_with(&schema).unwrap();
        assert_eq!(proto.imports(None), ["common/address.proto"]);
        assert_eq!(
            proto.imports(Some("common/address.proto")),
            ["common/geo.proto"]
        );
        // A message of a file it imports is not one of the schema's own.
        let e = proto
            .message(Some("common.Address"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("only a file it imports: common/address.proto"),
            "{e}"
        );
        let order = proto.message(None).unwrap();
        let mut bytes = Vec::new();
        json_to_message(
            &order,
            br#"{"id":"o","ship":{"city":"Oslo","at":{"lat":1.5}}}"#,
            &mut bytes,
        )
        .unwrap();
        assert_eq!(
            json(&order, &bytes).unwrap(),
            r#"{"id":"o","ship":{"city":"Oslo","at":{"lat":1.5}}}"#
        );
        // Without its imports the schema does not compile; an import outside the folder
        // is not read.
        let e = Proto::parse(main).unwrap_err().to_string();
        assert!(e.contains("import 'common/address.proto' not found"), "{e}");
        std::fs::write(dir.path().join("secret.proto"), "syntax = \"proto3\";").unwrap();
        let inner = dir.path().join("common");
        for outside in ["../secret.proto", "common/../../secret.proto"] {
            let sneaky = format!("syntax = \"proto3\";\nimport \"{outside}\";\nmessage S {{}}");
            assert!(Proto::with_imports(sneaky, &inner).is_err(), "{outside}");
        }
    }

    fn json(descriptor: &MessageDescriptor, bytes: &[u8]) -> Result<String, String> {
        let mut out = Vec::new();
        message_to_json(descriptor, bytes, &mut out).map(|()| String::from_utf8(out).unwrap())
    }

    #[test]
    fn messages_round_trip_through_json_with_every_field_present() {
        let proto = Proto::parse(SHOP).unwrap();
        let order = proto.message(None).unwrap();
        assert_eq!(order.full_name(), "shop.Order");
        let mut bytes = Vec::new();
        json_to_message(
            &order,
            br#"{"id":"o1","cents":9007199254740993,"ship":{"city":"Oslo"},"at":"2026-12-07T00:00:00Z"}"#,
            &mut bytes,
        )
        .unwrap();
        assert_eq!(
            json(&order, &bytes).unwrap(),
            r#"{"id":"o1","cents":9007199254740993,"tags":[],"ship":{"city":"Oslo"},"at":"2026-12-07T00:00:00Z"}"#
        );
        // An empty message: every field its default (a message field stays absent).
        assert_eq!(
            json(&order, &[]).unwrap(),
            r#"{"id":"","cents":0,"tags":[]}"#
        );
    }

    #[test]
    fn bad_messages_and_values_are_errors_that_say_why() {
        let proto = Proto::parse(SHOP).unwrap();
        let order = proto.message(Some("shop.Order")).unwrap();
        assert!(
            json(&order, &[0x0a, 0x05, b'a'])
                .unwrap_err()
                .contains("shop.Order")
        );
        let mut out = Vec::new();
        let e = json_to_message(&order, br#"{"idd":"x"}"#, &mut out).unwrap_err();
        assert!(e.contains("does not fit") && e.contains("idd"), "{e}");
        let e = json_to_message(&order, br#"{"id":3}"#, &mut out).unwrap_err();
        assert!(e.contains("does not fit"), "{e}");
        assert!(
            json_to_message(&order, b"{", &mut out)
                .unwrap_err()
                .starts_with("not JSON")
        );
        let e = proto.message(Some("shop.Nope")).unwrap_err().to_string();
        assert!(
            e.contains("shop.Order") && e.contains("shop.Address"),
            "{e}"
        );
        let e = Proto::parse("message {").unwrap_err().to_string();
        assert!(e.contains("not a .proto schema"), "{e}");
        let e = Proto::parse("syntax = \"proto3\";")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no message"), "{e}");
        let e = Proto::parse("syntax = \"proto3\"; import \"other.proto\"; message A {}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("other.proto"), "{e}");
    }

    #[test]
    fn message_indexes_name_messages_as_confluents_serializers_write_them() {
        let proto = Proto::parse(SHOP).unwrap();
        for (name, indexes, wire) in [
            ("shop.Order", vec![0], vec![0u8]),
            ("shop.Address", vec![1], vec![2, 2]),
            ("shop.Order.Line", vec![0, 0], vec![4, 0, 0]),
        ] {
            let message = proto.message(Some(name)).unwrap();
            assert_eq!(indexes_of(&message), indexes, "{name}");
            let mut out = Vec::new();
            put_indexes(&indexes, &mut out);
            assert_eq!(out, wire, "{name}");
            out.extend_from_slice(b"rest");
            let mut read = Vec::new();
            assert_eq!(split_indexes(&out, &mut read).unwrap(), b"rest");
            assert_eq!(read, indexes);
            assert_eq!(proto.by_indexes(&read).unwrap().full_name(), name);
        }
        assert!(proto.by_indexes(&[5]).is_none());
        assert!(proto.by_indexes(&[-1]).is_none());
        let mut read = Vec::new();
        assert!(split_indexes(&[0x80], &mut read).is_err());
        assert!(split_indexes(&[40, 0], &mut read).is_err());
        assert!(split_indexes(&[0xff; 6], &mut read).is_err());
    }

    #[test]
    fn deeply_nested_messages_are_an_error_not_a_stack_overflow() {
        let proto =
            Proto::parse("syntax = \"proto3\"; message N { N n = 1; int32 x = 2; }").unwrap();
        let n = proto.message(None).unwrap();
        // 2,000 levels of `n { n { … } }` (prost stops at 100), built from the inside out.
        let mut bytes = vec![0x10, 0x01];
        for _ in 0..2_000 {
            let mut outer = vec![0x0a];
            let mut len = bytes.len();
            while len >= 0x80 {
                outer.push((len as u8) | 0x80);
                len >>= 7;
            }
            outer.push(len as u8);
            outer.extend_from_slice(&bytes);
            bytes = outer;
        }
        assert!(json(&n, &bytes).is_err());
        // A few levels are a message like any other.
        assert_eq!(
            json(&n, &[0x0a, 0x02, 0x10, 0x05]).unwrap(),
            r#"{"n":{"x":5},"x":0}"#
        );
    }

    #[test]
    fn what_a_message_decodes_to_is_bounded() {
        let proto = Proto::parse(
            "syntax = \"proto3\"; message M { repeated W w = 1; } \
             message W { string a = 1; string b = 2; string c = 3; string d = 4; \
             string e = 5; string f = 6; string g = 7; string h = 8; string i = 9; \
             string j = 10; string k = 11; string l = 12; string m = 13; string n = 14; \
             string o = 15; string p = 16; }",
        )
        .unwrap();
        let m = proto.message(None).unwrap();
        // Two bytes each, 114 bytes of JSON each: 700,000 empty items pass the bound.
        let bytes: Vec<u8> = std::iter::repeat_n([0x0a, 0x00], 700_000)
            .flatten()
            .collect();
        let e = json(&m, &bytes).unwrap_err();
        assert!(e.contains("MiB of JSON"), "{e}");
        assert!(json(&m, &bytes[..2000]).is_ok());
    }
}
