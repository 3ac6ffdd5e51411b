//! What users write, as plain serde types: the job file and the host file.
//!
//! This floor imports nothing of the runtime. Each knob is one field with its type and its
//! doc; validation (`crate::job`) and tenant resolution (`crate::tenant`) turn these files
//! into what the runtime uses.

pub mod host_file;
pub mod job_file;
pub mod limits;
pub mod secrets;
pub mod values;

pub use host_file::HostFile;
pub use job_file::{
    CheckpointSpec, ClusterSpec, JobFile, OperatorSpec, RestartSpec, RuntimeSpec, SinkKind,
    SinkSpec, SourceKind, SourceSpec, StateSpec,
};

/// Parses the TOML `text` of the file at `path` into `T`. An error names the file, the
/// place in it (line and column, with the line shown) and, for a value inside tables and
/// arrays, the path to it (`operator[1].key_by`).
pub fn from_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    path: &std::path::Path,
) -> anyhow::Result<T> {
    let file = path.display();
    let de = toml::Deserializer::parse(text).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        let e = e.into_inner();
        if at == "." || at.is_empty() {
            anyhow::anyhow!("{file}: {e}")
        } else {
            anyhow::anyhow!("{file}: in `{at}`: {e}")
        }
    })
}

/// The JSON Schema of the job file, for editors (TOML language servers such as Taplo take
/// a `#:schema PATH` comment on the first line). Shipped as `docs/schema/job-file.json`.
pub fn job_file_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(JobFile).to_value();
    add_unit_names(&mut schema);
    schema
}

/// A duration or size knob (`interval_ms`, `max_pending_mb`, `buffer_bytes`) is also
/// written by its name without the unit (`interval = "10s"`): serde's aliases, which
/// schemars does not list. Adds each such name beside its field, and lets either name
/// satisfy a required field.
fn add_unit_names(schema: &mut serde_json::Value) {
    use serde_json::Value;
    const UNITS: [(&str, &str); 3] = [
        ("_ms", "#/$defs/Duration"),
        ("_mb", "#/$defs/MiB"),
        ("_bytes", "#/$defs/Bytes"),
    ];
    match schema {
        Value::Object(object) => {
            let mut renamed = Vec::new();
            if let Some(Value::Object(properties)) = object.get_mut("properties") {
                for (name, field) in properties.iter() {
                    let text = field.to_string();
                    for (suffix, unit) in UNITS {
                        if let Some(short) = name.strip_suffix(suffix)
                            && text.contains(unit)
                        {
                            renamed.push((name.clone(), short.to_string(), field.clone()));
                        }
                    }
                }
                for (_, short, field) in &renamed {
                    properties.insert(short.clone(), field.clone());
                }
            }
            if let Some(Value::Array(required)) = object.get("required").cloned() {
                let (either, only): (Vec<Value>, Vec<Value>) = required
                    .into_iter()
                    .partition(|r| renamed.iter().any(|(name, ..)| r == name));
                if !either.is_empty() {
                    object.insert("required".into(), Value::Array(only));
                    let each: Vec<Value> = either
                        .iter()
                        .map(|r| {
                            let (name, short, _) =
                                renamed.iter().find(|(name, ..)| r == name).expect("found");
                            serde_json::json!({ "anyOf": [
                                { "required": [name] },
                                { "required": [short] }
                            ] })
                        })
                        .collect();
                    object.insert("allOf".into(), Value::Array(each));
                }
            }
            for value in object.values_mut() {
                add_unit_names(value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(add_unit_names),
        _ => {}
    }
}

/// The JSON Schema of the host file. Shipped as `docs/schema/host-file.json`.
pub fn host_file_schema() -> serde_json::Value {
    schemars::schema_for!(HostFile).to_value()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The shipped schemas are what the types say (`SLUICE_BLESS=1` writes them anew).
    #[test]
    fn the_shipped_schemas_are_current() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema");
        for (name, schema) in [
            ("job-file.json", super::job_file_schema()),
            ("host-file.json", super::host_file_schema()),
        ] {
            let text = serde_json::to_string_pretty(&schema).unwrap() + "\n";
            let path = dir.join(name);
            if std::env::var_os("SLUICE_BLESS").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &text).unwrap();
            }
            let shipped = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                shipped == text,
                "{} is not what the types give: run the test with SLUICE_BLESS=1",
                path.display()
            );
        }
    }

    /// A knob written by its other name (a duration or size with units) is in the schema
    /// too, so an editor does not flag it.
    #[test]
    fn the_schema_knows_both_names_of_a_knob() {
        let schema = super::job_file_schema().to_string();
        for name in [
            "\"interval_ms\"",
            "\"interval\"",
            "\"max_pending\"",
            "\"buffer\"",
        ] {
            assert!(schema.contains(name), "{name} not in the job file's schema");
        }
    }
}
