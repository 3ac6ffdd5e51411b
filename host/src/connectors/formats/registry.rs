//! A client of a schema registry that speaks Confluent's REST API (Confluent Schema
//! Registry, Apicurio Registry's `ccompat` API, Redpanda, Karapace), and the wire format
//! Confluent's serializers write: a zero byte, the schema's id as 4 bytes big-endian,
//! then the datum.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

/// Where the registry is and how to sign in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    /// Base address, e.g. `http://registry:8081` (Apicurio: `…/apis/ccompat/v7`).
    pub url: String,
    /// HTTP basic authentication: user and password (resolved, never logged).
    pub basic_auth: Option<(String, String)>,
}

/// A schema as the registry keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub id: u32,
    /// `AVRO`, `JSON` or `PROTOBUF` (the registry leaves it out for Avro).
    pub kind: String,
    pub text: String,
    /// The other subjects' schemas it names.
    pub references: Vec<Reference>,
}

/// A schema reference: another subject's schema, named in the referring one as `name`
/// (Protobuf: the path it is imported as; Avro: the full name of the type it defines).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Reference {
    pub name: String,
    pub subject: String,
    pub version: i64,
}

/// How many schemas one schema may refer to, directly or not: a registry's answers are
/// not trusted to end.
const MAX_REFERENCES: usize = 256;

/// The byte Confluent's wire format starts with.
pub const MAGIC: u8 = 0;

/// The schema id and the datum of a record in Confluent's wire format.
pub fn split_framed(value: &[u8]) -> Result<(u32, &[u8]), String> {
    match value {
        [MAGIC, a, b, c, d, rest @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), rest)),
        [] => Err("the value is empty, not in the schema registry's wire format".into()),
        [first, ..] if *first != MAGIC => Err(format!(
            "the value starts with byte {first:#04x}, not the schema registry's magic byte 0x00"
        )),
        _ => Err(format!(
            "the value is {} bytes long, shorter than the wire format's 5-byte header",
            value.len()
        )),
    }
}

/// Appends the wire format's header for schema `id`.
pub fn put_header(id: u32, out: &mut Vec<u8>) {
    out.push(MAGIC);
    out.extend_from_slice(&id.to_be_bytes());
}

/// A registry client. Blocking: it is asked when a source meets a schema id it has not
/// seen and when a sink starts, never per record.
pub struct Registry {
    config: RegistryConfig,
    agent: ureq::Agent,
}

#[derive(Deserialize)]
struct SchemaAnswer {
    schema: String,
    #[serde(rename = "schemaType")]
    kind: Option<String>,
    #[serde(default)]
    references: Vec<Reference>,
    id: Option<u32>,
}

#[derive(Deserialize)]
struct IdAnswer {
    id: u32,
}

#[derive(Deserialize)]
struct VersionAnswer {
    version: i64,
}

const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

impl Registry {
    pub fn new(config: RegistryConfig) -> Registry {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        Registry { config, agent }
    }

    /// The schema with id `id`, `None` if the registry has none.
    pub fn by_id(&self, id: u32) -> Result<Option<Registered>> {
        let answer: Option<SchemaAnswer> = self.send("GET", &format!("/schemas/ids/{id}"), None)?;
        answer.map(|a| registered(a, Some(id))).transpose()
    }

    /// The latest version of `subject`, `None` if the registry has no such subject.
    pub fn latest(&self, subject: &str) -> Result<Option<Registered>> {
        let path = format!("/subjects/{}/versions/latest", escape(subject));
        let answer: Option<SchemaAnswer> = self.send("GET", &path, None)?;
        answer.map(|a| registered(a, None)).transpose()
    }

    /// The latest schema of `subject`, which must be of `kind` (`AVRO`, `PROTOBUF`);
    /// `missing` is the advice when the registry has no such subject.
    pub fn latest_of(&self, subject: &str, kind: &str, missing: &str) -> Result<Registered> {
        let latest = self
            .latest(subject)
            .with_context(|| format!("reading the schema of subject {subject:?}"))?
            .ok_or_else(|| anyhow!("the schema registry has no subject {subject:?}: {missing}"))?;
        if latest.kind != kind {
            bail!(
                "the latest schema of subject {subject:?} is {}, not {kind}: name the schema \
                 with `schema`",
                latest.kind
            );
        }
        Ok(latest)
    }

    /// Version `version` of `subject`, `None` if the registry has no such version.
    pub fn version(&self, subject: &str, version: i64) -> Result<Option<Registered>> {
        let path = format!("/subjects/{}/versions/{version}", escape(subject));
        let answer: Option<SchemaAnswer> = self.send("GET", &path, None)?;
        answer.map(|a| registered(a, None)).transpose()
    }

    /// The texts of the schemas `schema` refers to, directly or through others, each
    /// under the name it is referred to by (what [`super::SchemaText`] holds).
    pub fn references(&self, schema: &Registered) -> Result<Vec<(String, String)>> {
        let mut found: Vec<(String, String)> = Vec::new();
        let mut pending: Vec<Reference> = schema.references.iter().rev().cloned().collect();
        while let Some(reference) = pending.pop() {
            if found.iter().any(|(name, _)| *name == reference.name) {
                continue;
            }
            if found.len() == MAX_REFERENCES {
                bail!("the schema refers to more than {MAX_REFERENCES} other schemas");
            }
            let Reference {
                name,
                subject,
                version,
            } = &reference;
            let referred = self
                .version(subject, *version)
                .with_context(|| format!("reading the schema it refers to as {name:?}"))?
                .ok_or_else(|| {
                    anyhow!(
                        "it refers to {name:?} as version {version} of subject {subject:?}, \
                         which the registry does not have"
                    )
                })?;
            if referred.kind != schema.kind {
                bail!(
                    "it refers to {name:?} (subject {subject:?}, version {version}), a {} \
                     schema, from a {} one",
                    referred.kind,
                    schema.kind
                );
            }
            pending.extend(referred.references.iter().rev().cloned());
            found.push((reference.name, referred.text));
        }
        Ok(found)
    }

    /// Registers `text` (a schema of `kind` naming `references`) under `subject`, or
    /// finds it there; its id.
    pub fn register(
        &self,
        subject: &str,
        kind: &str,
        text: &str,
        references: &[Reference],
    ) -> Result<u32> {
        let path = format!("/subjects/{}/versions", escape(subject));
        let answer: Option<IdAnswer> =
            self.send("POST", &path, Some(body(kind, text, references)))?;
        let answer = answer.ok_or_else(|| anyhow!("schema registry: POST {path}: 404"))?;
        Ok(answer.id)
    }

    /// The version of `subject` whose schema is `text` (registered), `None` if none is.
    pub fn version_of(
        &self,
        subject: &str,
        kind: &str,
        text: &str,
        references: &[Reference],
    ) -> Result<Option<i64>> {
        let path = format!("/subjects/{}", escape(subject));
        let answer: Option<VersionAnswer> =
            self.send("POST", &path, Some(body(kind, text, references)))?;
        Ok(answer.map(|a| a.version))
    }

    fn send<T: for<'de> Deserialize<'de>>(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> Result<Option<T>> {
        let url = format!("{}{path}", self.config.url.trim_end_matches('/'));
        let auth = self.config.basic_auth.as_ref().map(|(user, password)| {
            use base64::Engine as _;
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Basic {token}")
        });
        // Every request here reads or registers idempotently: one answered with a server
        // error (a registry under concurrent first registrations can give 500) is asked
        // again, three times at most, 0.1, 0.2 and 0.4 s apart.
        let mut attempt = 0;
        let (status, bytes) = loop {
            let sent = match &body {
                None => {
                    let mut req = self.agent.get(&url).header("Accept", CONTENT_TYPE);
                    if let Some(auth) = &auth {
                        req = req.header("Authorization", auth);
                    }
                    req.call()
                }
                Some(body) => {
                    let mut req = self
                        .agent
                        .post(&url)
                        .header("Accept", CONTENT_TYPE)
                        .header("Content-Type", CONTENT_TYPE);
                    if let Some(auth) = &auth {
                        req = req.header("Authorization", auth);
                    }
                    req.send(body.as_str())
                }
            };
            let mut response =
                sent.with_context(|| format!("schema registry: {method} {url}: no answer"))?;
            let status = response.status().as_u16();
            let bytes = response
                .body_mut()
                .with_config()
                .limit(16 << 20)
                .read_to_vec()
                .with_context(|| format!("schema registry: {method} {url}: reading the answer"))?;
            if status >= 500 && attempt < 3 {
                std::thread::sleep(Duration::from_millis(100 << attempt));
                attempt += 1;
                continue;
            }
            break (status, bytes);
        };
        if status >= 400 {
            // Confluent's errors: {"error_code": 40403, "message": "Schema not found"}.
            let error = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
            let code = error.as_ref().and_then(|e| e.get("error_code")?.as_u64());
            if status == 404 && code.is_some_and(|c| (40400..40500).contains(&c)) {
                return Ok(None);
            }
            let message = error
                .as_ref()
                .and_then(|e| e.get("message")?.as_str().map(str::to_string))
                .unwrap_or_else(|| {
                    String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned()
                });
            let hint = match status {
                401 | 403 => " (check `schema_registry`'s username and password)",
                404 => " (is `url` the registry's Confluent API? Apicurio's is …/apis/ccompat/v7)",
                _ => "",
            };
            bail!("schema registry: {method} {url}: {status}: {message}{hint}");
        }
        serde_json::from_slice(&bytes).map(Some).with_context(|| {
            format!(
                "schema registry: {method} {url}: not a schema registry's answer: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            )
        })
    }
}

fn registered(answer: SchemaAnswer, id: Option<u32>) -> Result<Registered> {
    Ok(Registered {
        id: id
            .or(answer.id)
            .ok_or_else(|| anyhow!("the registry's answer names no schema id"))?,
        kind: answer.kind.unwrap_or_else(|| "AVRO".into()),
        text: answer.schema,
        references: answer.references,
    })
}

/// A registration's body: the schema, its kind unless Avro, its references if any.
fn body(kind: &str, text: &str, references: &[Reference]) -> String {
    let mut body = serde_json::json!({ "schema": text });
    if kind != "AVRO" {
        body["schemaType"] = kind.into();
    }
    if !references.is_empty() {
        body["references"] = serde_json::to_value(references).expect("plain fields");
    }
    body.to_string()
}

/// A subject as a path segment.
fn escape(subject: &str) -> String {
    subject
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_format_is_a_zero_byte_and_a_big_endian_id() {
        let mut framed = Vec::new();
        put_header(0x01020304, &mut framed);
        framed.extend_from_slice(b"datum");
        assert_eq!(split_framed(&framed), Ok((0x01020304, &b"datum"[..])));
        assert!(split_framed(b"{\"a\":1}").unwrap_err().contains("0x7b"));
        assert!(split_framed(&[0, 1]).unwrap_err().contains("2 bytes long"));
        assert!(split_framed(&[]).unwrap_err().contains("empty"));
        assert_eq!(escape("orders-value"), "orders-value");
        assert_eq!(escape("a b/c"), "a%20b%2Fc");
    }
}
