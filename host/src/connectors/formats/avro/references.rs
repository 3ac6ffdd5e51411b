//! Confluent's schema references for Avro: a schema naming types that other subjects'
//! schemas define, turned into one schema `apache-avro` reads alone.

use std::collections::{HashMap, HashSet};

use anyhow::{Result, anyhow, bail};
use serde_json::{Map, Value as Json};

use super::super::SchemaText;

/// Avro's primitive type names, which no reference can define.
const PRIMITIVES: [&str; 8] = [
    "null", "boolean", "int", "long", "float", "double", "bytes", "string",
];

/// `schema`'s text as one schema `apache-avro` reads alone: each named type its
/// references define (Confluent's schema references: a type defined in another subject's
/// schema, named here by its full name) written in where it is first used, under its
/// full name, as if the schema had defined it there.
pub fn with_references(schema: &SchemaText) -> Result<String> {
    if schema.references.is_empty() {
        return Ok(schema.text.clone());
    }
    let mut defined = HashMap::new();
    for (name, text) in &schema.references {
        let json: Json = serde_json::from_str(text)
            .map_err(|e| anyhow!("the schema referred to as {name:?} is not JSON: {e}"))?;
        // Only a named type can be referred to: it is written in once, where first used,
        // and named after that (anything else would be copied at every use, and a chain
        // of unions naming each other twice would grow exponentially).
        let Some(full) = full_name(&json, "") else {
            bail!(
                "the schema referred to as {name:?} is not a named type (a record, enum or \
                 fixed), which is all another schema can refer to"
            );
        };
        defined.insert(name.clone(), json.clone());
        defined.insert(full, json);
    }
    let main: Json =
        serde_json::from_str(&schema.text).map_err(|e| anyhow!("not an Avro schema: {e}"))?;
    let mut inliner = Inliner {
        references: defined,
        seen: Default::default(),
    };
    Ok(inliner.inline(main, "", 0)?.to_string())
}

/// The full name of the named type `json` defines in namespace `namespace`, if it is one.
fn full_name(json: &Json, namespace: &str) -> Option<String> {
    defined_name(json.as_object()?, namespace)
}

/// [`full_name`] of a JSON object.
fn defined_name(object: &Map<String, Json>, namespace: &str) -> Option<String> {
    if !matches!(
        object.get("type")?.as_str()?,
        "record" | "error" | "enum" | "fixed"
    ) {
        return None;
    }
    let name = object.get("name")?.as_str()?;
    let namespace = object
        .get("namespace")
        .and_then(Json::as_str)
        .unwrap_or(namespace);
    Some(qualified(name, namespace))
}

/// The namespace of full name `full` (`""`, the null namespace, when it has none).
fn namespace_of(full: &str) -> &str {
    full.rsplit_once('.').map_or("", |(namespace, _)| namespace)
}

fn qualified(name: &str, namespace: &str) -> String {
    if name.contains('.') || namespace.is_empty() {
        name.to_string()
    } else {
        format!("{namespace}.{name}")
    }
}

/// Writes referenced types into a schema where they are first used.
struct Inliner {
    /// What the references define, by full name (and by the name they are referred to).
    references: HashMap<String, Json>,
    /// Named types defined so far, by full name.
    seen: HashSet<String>,
}

impl Inliner {
    fn inline(&mut self, json: Json, namespace: &str, depth: usize) -> Result<Json> {
        if depth > 64 {
            bail!("the schema and those it refers to nest more than 64 deep");
        }
        let depth = depth + 1;
        match json {
            Json::String(name) if PRIMITIVES.contains(&name.as_str()) => Ok(Json::String(name)),
            Json::String(name) => {
                let full = qualified(&name, namespace);
                if self.seen.contains(&full) {
                    return Ok(Json::String(name));
                }
                let Some(mut definition) = self
                    .references
                    .get(&full)
                    .or_else(|| self.references.get(&name))
                    .cloned()
                else {
                    // Not defined anywhere: `apache-avro` names it in its error.
                    return Ok(Json::String(name));
                };
                let own = full_name(&definition, "").expect("references are named types");
                if self.seen.contains(&own) {
                    // Written in already (referred to by another name): by its own.
                    return Ok(Json::String(own));
                }
                if let Json::Object(object) = &mut definition {
                    // Its full name, and its namespace as it was (none is the null
                    // namespace, `""`), so that it keeps both wherever it is written in.
                    let namespace = namespace_of(&own).to_string();
                    object.insert("name".into(), own.into());
                    object.insert("namespace".into(), namespace.into());
                }
                self.inline(definition, namespace, depth)
            }
            Json::Array(branches) => branches
                .into_iter()
                .map(|b| self.inline(b, namespace, depth))
                .collect::<Result<Vec<_>>>()
                .map(Json::Array),
            Json::Object(mut object) => {
                let kind = object
                    .get("type")
                    .and_then(Json::as_str)
                    .map(str::to_string);
                let full = defined_name(&object, namespace);
                match kind.as_deref() {
                    Some("record" | "error") => {
                        let full = full.unwrap_or_default();
                        let inner = namespace_of(&full).to_string();
                        self.seen.insert(full);
                        if let Some(Json::Array(fields)) = object.get_mut("fields") {
                            for field in fields {
                                if let Some(t) = field.get_mut("type") {
                                    *t = self.inline(t.take(), &inner, depth)?;
                                }
                            }
                        }
                    }
                    Some("enum" | "fixed") => {
                        self.seen.extend(full);
                    }
                    Some("array") => {
                        if let Some(items) = object.get_mut("items") {
                            *items = self.inline(items.take(), namespace, depth)?;
                        }
                    }
                    Some("map") => {
                        if let Some(values) = object.get_mut("values") {
                            *values = self.inline(values.take(), namespace, depth)?;
                        }
                    }
                    _ => {
                        if let Some(t) = object.get_mut("type") {
                            *t = self.inline(t.take(), namespace, depth)?;
                        }
                    }
                }
                Ok(Json::Object(object))
            }
            other => Ok(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::formats::Compiled;
    use apache_avro::Schema;

    #[test]
    fn referenced_types_are_written_in_where_first_used() {
        // A user (namespace com.acme) naming an address by its short name and an enum by
        // its full name; the address's schema names the enum too (another reference).
        let user = r#"{"type":"record","name":"User","namespace":"com.acme","fields":[
            {"name":"home","type":"Address"},
            {"name":"work","type":["null","com.acme.Address"],"default":null},
            {"name":"kind","type":"com.acme.Kind"}]}"#;
        let address = r#"{"type":"record","name":"Address","namespace":"com.acme","fields":[
            {"name":"city","type":"string"},{"name":"kind","type":"Kind"}]}"#;
        let kind = r#"{"type":"enum","name":"Kind","namespace":"com.acme","symbols":["A","B"]}"#;
        let schema = SchemaText {
            text: user.into(),
            references: vec![
                ("com.acme.Address".into(), address.into()),
                ("com.acme.Kind".into(), kind.into()),
            ],
        };
        let alone = with_references(&schema).unwrap();
        let expected = r#"{"type":"record","name":"User","namespace":"com.acme","fields":[
            {"name":"home","type":{"type":"record","name":"com.acme.Address","fields":[
                {"name":"city","type":"string"},
                {"name":"kind","type":{"type":"enum","name":"com.acme.Kind","symbols":["A","B"]}}]}},
            {"name":"work","type":["null","com.acme.Address"],"default":null},
            {"name":"kind","type":"com.acme.Kind"}]}"#;
        assert_eq!(
            Schema::parse_str(&alone).unwrap().canonical_form(),
            Schema::parse_str(expected).unwrap().canonical_form()
        );
        let compiled = Compiled::parse(&alone).unwrap();
        let value = br#"{"home":{"city":"Oslo","kind":"B"},"work":null,"kind":"A"}"#;
        let mut datum = Vec::new();
        compiled.json_to_datum(value, &mut datum).unwrap();
        let mut back = Vec::new();
        compiled.datum_to_json(&mut &datum[..], &mut back).unwrap();
        assert_eq!(back, value);
        // A schema naming nothing it references is left as it was; a reference that
        // refers to itself does not loop.
        assert_eq!(with_references(&SchemaText::plain(user)).unwrap(), user);
        // Only named types are referred to: a union naming others twice at each level
        // would grow exponentially if written in at every use.
        let doubling = SchemaText {
            text: r#""A""#.into(),
            references: vec![
                ("A".into(), r#"["B","B"]"#.into()),
                ("B".into(), r#"["null","A"]"#.into()),
            ],
        };
        let e = with_references(&doubling).unwrap_err().to_string();
        assert!(e.contains("\"A\" is not a named type"), "{e}");
        // A type in the null namespace keeps it where it is written in: inside a record
        // of namespace com.acme, `Plain` stays `Plain`, not `com.acme.Plain`.
        let plain = r#"{"type":"enum","name":"Plain","symbols":["X"]}"#;
        let schema = SchemaText {
            text: r#"{"type":"record","name":"R","namespace":"com.acme","fields":[{"name":"p","type":"Plain"}]}"#.into(),
            references: vec![("Plain".into(), plain.into())],
        };
        let alone = Schema::parse_str(&with_references(&schema).unwrap()).unwrap();
        let Schema::Record(record) = &alone else {
            panic!("{alone:?}")
        };
        let Schema::Enum(e) = &record.fields[0].schema else {
            panic!("{alone:?}")
        };
        assert_eq!(e.name.fullname(None), "Plain");
        let not_json = SchemaText {
            text: user.into(),
            references: vec![("com.acme.Address".into(), "{".into())],
        };
        let e = with_references(&not_json).unwrap_err().to_string();
        assert!(
            e.contains("referred to as \"com.acme.Address\" is not JSON"),
            "{e}"
        );
    }
}
