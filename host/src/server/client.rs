//! A client of a server's API, behind `sluice submit|list|status|cancel|stop|start|output`
//! and `sluice savepoint ID --server URL`: it speaks `/v1` and reads the answers as the
//! types of [`super::model`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde::de::DeserializeOwned;

use super::model::{
    ErrorBody, JobDetail, JobList, JobSummary, Plugin, PluginList, Probe, SavepointStatus,
    SavepointTaken, SavepointTriggered, TriggerStatus,
};

/// Talks to one server as one tenant.
pub struct Client {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

/// Largest answer read (job output can be large).
const MAX_ANSWER: u64 = 1 << 30;

/// Bodies larger than this wait for `100 Continue` before they are sent.
const LARGE_BODY: usize = 64 << 10;

/// An agent that hands error statuses back as answers, with `tls`.
fn agent(tls: ureq::tls::TlsConfig) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(600)))
        .tls_config(tls)
        .build()
        .into()
}

impl Client {
    /// A client of the server at `base` (e.g. `http://127.0.0.1:8600`).
    pub fn new(base: &str, token: Option<String>) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            token,
            agent: agent(ureq::tls::TlsConfig::default()),
        }
    }

    /// Trusts the certificate authority in `pem` (a PEM certificate; e.g. a server's
    /// self-signed one) instead of the public ones, for `https://` servers.
    pub fn with_ca_cert(mut self, pem: &[u8]) -> Result<Client> {
        use ureq::tls::{Certificate, RootCerts, TlsConfig};
        let cert = Certificate::from_pem(pem)
            .map_err(|e| anyhow!("not a PEM certificate: {e}"))?
            .to_owned();
        let tls = TlsConfig::builder()
            .root_certs(RootCerts::new_with_certs(&[cert]))
            .build();
        self.agent = agent(tls);
        Ok(self)
    }

    /// Sends a request; returns the status and the body.
    pub fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<(u16, Vec<u8>)> {
        let url = format!("{}{path}", self.base);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let sent = match (method, body) {
            ("GET", None) => {
                let mut req = self.agent.get(&url);
                if let Some(auth) = &auth {
                    req = req.header("Authorization", auth);
                }
                req.call()
            }
            ("POST", body) => {
                let mut req = self.agent.post(&url);
                if let Some(auth) = &auth {
                    req = req.header("Authorization", auth);
                }
                let body = body.unwrap_or_default();
                // A large body waits for the server's go-ahead: a refusal (too large, a
                // bad token) then arrives as an answer, not as a connection closed
                // mid-upload.
                if body.len() > LARGE_BODY {
                    req = req.header("Expect", "100-continue");
                }
                req.send(body)
            }
            ("DELETE", None) => {
                let mut req = self.agent.delete(&url);
                if let Some(auth) = &auth {
                    req = req.header("Authorization", auth);
                }
                req.call()
            }
            _ => bail!("unsupported request {method} {path}"),
        };
        let mut response = sent.with_context(|| {
            format!(
                "{method} {url}: no answer from a server there (is `sluice serve` running? \
                 --server or SLUICE_SERVER say where it is)"
            )
        })?;
        let status = response.status().as_u16();
        let bytes = response
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_vec()
            .with_context(|| format!("{method} {url}: reading the answer"))?;
        Ok((status, bytes))
    }

    /// Sends a request and reads a successful JSON answer as a `T`; an error status
    /// becomes an error with the server's message.
    fn json<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<T> {
        let (status, bytes) = self.request(method, path, body)?;
        if status >= 400 {
            bail!("{method} {path}: {status}: {}", error_message(&bytes));
        }
        serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{method} {path}: the server's answer is not what this client reads ({}): {}",
                std::any::type_name::<T>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("?"),
                String::from_utf8_lossy(&bytes[..bytes.len().min(512)])
            )
        })
    }

    /// Uploads a plugin component; returns what the server stored.
    pub fn upload_plugin(&self, path: &Path) -> Result<Plugin> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| anyhow!("{}: not a file name", path.display()))?;
        self.json(
            "POST",
            &format!("/v1/plugins?name={}", query_escape(&name)),
            Some(&bytes),
        )
        .with_context(|| format!("uploading {}", path.display()))
    }

    /// Submits the job file at `path`: uploads the plugins it names by path (relative to
    /// the job file) and submits the file with them named by content hash, each in its
    /// place (every other byte as written, so that the server's errors name the lines of
    /// the file, which they name by its path).
    pub fn submit(&self, path: &Path) -> Result<JobSummary> {
        let (text, not_files) = self.for_server(path)?;
        let (status, answer) = self.request("POST", "/v1/jobs", Some(text.as_bytes()))?;
        job_file_answer(path, "submitting", status, &answer, &not_files)
    }

    /// The job file at `path` as the server takes it: each plugin named by a file here
    /// (relative to the job file) uploaded and named by its hash, each schema file
    /// written in (see [`schemas_written_in`]). Also the plugin names that are no file
    /// here (maybe plugins uploaded before: the server decides), with where they were
    /// looked for.
    fn for_server(&self, path: &Path) -> Result<(String, Vec<(String, PathBuf)>)> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut job: toml_edit::DocumentMut = text
            .parse()
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new(""));
        schemas_written_in(&mut job, base).with_context(|| path.display().to_string())?;
        let mut not_files = Vec::new();
        let mut plugins: Vec<&mut toml_edit::Value> = Vec::new();
        match job.get_mut("operator") {
            Some(toml_edit::Item::ArrayOfTables(operators)) => plugins.extend(
                operators
                    .iter_mut()
                    .filter_map(|op| op.get_mut("plugin")?.as_value_mut()),
            ),
            Some(toml_edit::Item::Value(toml_edit::Value::Array(operators))) => plugins.extend(
                operators
                    .iter_mut()
                    .filter_map(|op| op.as_inline_table_mut()?.get_mut("plugin")),
            ),
            _ => {}
        }
        for plugin in plugins {
            let Some(named) = plugin.as_str().filter(|p| !p.starts_with("sha256:")) else {
                continue;
            };
            let file = base.join(named);
            if !file.is_file() {
                not_files.push((named.to_string(), file));
                continue;
            }
            let uploaded = self.upload_plugin(&file)?;
            let decor = plugin.decor().clone();
            *plugin = toml_edit::Value::from(format!("sha256:{}", uploaded.sha256));
            *plugin.decor_mut() = decor;
        }
        Ok((job.to_string(), not_files))
    }

    /// The tenant's jobs.
    pub fn list(&self) -> Result<JobList> {
        self.json("GET", "/v1/jobs", None)
    }

    /// One job in detail.
    pub fn status(&self, id: &str) -> Result<JobDetail> {
        self.json("GET", &format!("/v1/jobs/{}", query_escape(id)), None)
    }

    /// Cancels a job.
    pub fn cancel(&self, id: &str) -> Result<JobSummary> {
        self.json(
            "POST",
            &format!("/v1/jobs/{}/cancel", query_escape(id)),
            None,
        )
    }

    /// Stops a job with a savepoint.
    pub fn stop(&self, id: &str, drain: bool) -> Result<JobSummary> {
        self.json(
            "POST",
            &format!("/v1/jobs/{}/stop?drain={drain}", query_escape(id)),
            None,
        )
    }

    /// Starts a stopped job again, from `savepoint` or its latest one.
    pub fn start(&self, id: &str, savepoint: Option<&str>) -> Result<JobSummary> {
        self.json("POST", &start_path(id, savepoint), None)
    }

    /// Starts a stopped job again, from `savepoint` or its latest one, as the job file at
    /// `path` describes (an upgrade: its plugins named by path are uploaded first, as
    /// [`Client::submit`] does); that file replaces the one the job ran by.
    pub fn start_as(&self, id: &str, savepoint: Option<&str>, path: &Path) -> Result<JobSummary> {
        let (text, not_files) = self.for_server(path)?;
        let (status, answer) =
            self.request("POST", &start_path(id, savepoint), Some(text.as_bytes()))?;
        let doing = format!("starting job '{id}' as");
        job_file_answer(path, &doing, status, &answer, &not_files)
    }

    /// Takes a savepoint of a running job without stopping it; returns once it is
    /// written.
    pub fn savepoint(&self, id: &str) -> Result<SavepointTaken> {
        self.json(
            "POST",
            &format!("/v1/jobs/{}/savepoint", query_escape(id)),
            None,
        )
    }

    /// Triggers a savepoint of a running job without stopping it or waiting for it.
    pub fn trigger_savepoint(&self, id: &str) -> Result<SavepointTriggered> {
        self.json(
            "POST",
            &format!("/v1/jobs/{}/savepoints", query_escape(id)),
            None,
        )
    }

    /// Where a triggered savepoint is.
    pub fn savepoint_status(&self, id: &str, request_id: &str) -> Result<SavepointStatus> {
        self.json(
            "GET",
            &format!(
                "/v1/jobs/{}/savepoints/{}",
                query_escape(id),
                query_escape(request_id)
            ),
            None,
        )
    }

    /// Triggers a savepoint and asks about it every `poll` until it completed (its name)
    /// or failed (the server's error), for at most `timeout`.
    pub fn savepoint_polled(&self, id: &str, poll: Duration, timeout: Duration) -> Result<String> {
        let request = self.trigger_savepoint(id)?.request_id;
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.savepoint_status(id, &request)?;
            match status.status {
                TriggerStatus::Completed => {
                    return status.location.ok_or_else(|| {
                        anyhow!("job {id}: the server says savepoint request {request} completed, but names no savepoint")
                    });
                }
                TriggerStatus::Failed => bail!(
                    "{}",
                    status
                        .error
                        .unwrap_or_else(|| format!("the savepoint of job {id} failed"))
                ),
                TriggerStatus::InProgress if Instant::now() >= deadline => bail!(
                    "job {id}: savepoint request {request} was still in progress after {} s",
                    timeout.as_secs()
                ),
                TriggerStatus::InProgress => std::thread::sleep(poll),
            }
        }
    }

    /// A job's committed output: all its files, or only `file` (one the job lists).
    pub fn output(&self, id: &str, file: Option<&str>) -> Result<Vec<u8>> {
        let query = file.map_or(String::new(), |f| format!("?file={}", query_escape(f)));
        self.text(&format!("/v1/jobs/{}/output{query}", query_escape(id)))
    }

    /// Deletes a job that is not running, with its files; returns what it was.
    pub fn delete_job(&self, id: &str) -> Result<JobSummary> {
        self.json("DELETE", &format!("/v1/jobs/{}", query_escape(id)), None)
    }

    /// The tenant's plugins, newest first.
    pub fn plugins(&self) -> Result<PluginList> {
        self.json("GET", "/v1/plugins", None)
    }

    /// Deletes a plugin (by SHA-256 or name) that no job that could run uses.
    pub fn delete_plugin(&self, key: &str) -> Result<Plugin> {
        self.json(
            "DELETE",
            &format!("/v1/plugins/{}", query_escape(key)),
            None,
        )
    }

    /// The tenant's metrics, in Prometheus' text format.
    pub fn metrics(&self) -> Result<Vec<u8>> {
        self.text("/v1/metrics")
    }

    /// A job's recent log lines.
    pub fn logs(&self, id: &str) -> Result<Vec<u8>> {
        self.text(&format!("/v1/jobs/{}/logs", query_escape(id)))
    }

    /// `/readyz`: whether the server resumed its jobs and accepts requests (an error
    /// says why not).
    pub fn ready(&self) -> Result<Probe> {
        self.json("GET", "/readyz", None)
    }

    /// A plain-text answer.
    fn text(&self, path: &str) -> Result<Vec<u8>> {
        let (status, bytes) = self.request("GET", path, None)?;
        if status >= 400 {
            bail!("GET {path}: {status}: {}", error_message(&bytes));
        }
        Ok(bytes)
    }
}

/// The message of an error answer: its `error`, or the body as it is when it is not one
/// (a proxy's page, a probe's status).
fn error_message(body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => e.error,
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    }
}

/// Percent-encodes everything but unreserved characters.
fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `POST /v1/jobs/{id}/start`, from `savepoint` when one is named.
fn start_path(id: &str, savepoint: Option<&str>) -> String {
    let query = savepoint
        .map(|s| format!("?savepoint={}", query_escape(s)))
        .unwrap_or_default();
    format!("/v1/jobs/{}/start{query}", query_escape(id))
}

/// Writes each schema file a source or sink of `job` names (`schema`, `key_schema`: a
/// path relative to `base`) into it as `{ text = "…", imports = { … } }`, with the files a
/// `.proto` imports: a server job reads no file of the server's disk.
fn schemas_written_in(job: &mut toml_edit::DocumentMut, base: &Path) -> Result<()> {
    let mut endpoints: Vec<(&str, &mut dyn toml_edit::TableLike)> = Vec::new();
    for (key, item) in job.as_table_mut().iter_mut() {
        let what = match key.get() {
            "source" => "source",
            "sink" => "sink",
            _ => continue,
        };
        match item {
            toml_edit::Item::Table(t) => endpoints.push((what, t)),
            toml_edit::Item::ArrayOfTables(ts) => endpoints.extend(
                ts.iter_mut()
                    .map(|t| (what, t as &mut dyn toml_edit::TableLike)),
            ),
            toml_edit::Item::Value(toml_edit::Value::InlineTable(t)) => endpoints.push((what, t)),
            _ => {}
        }
    }
    for (what, table) in endpoints {
        for (key, format) in [("schema", "format"), ("key_schema", "key_format")] {
            let protobuf = table.get(format).and_then(|f| f.as_str()) == Some("protobuf");
            let Some(value) = table.get_mut(key).and_then(|v| v.as_value_mut()) else {
                continue;
            };
            let Some(named) = value.as_str() else {
                continue;
            };
            let file = base.join(named);
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("[{what}] {key}: reading {}", file.display()))?;
            let schema = if protobuf {
                let folder = file.parent().unwrap_or(Path::new("."));
                crate::connectors::formats::Proto::with_imports(text, folder)
                    .with_context(|| format!("[{what}] {key}: {}", file.display()))?
                    .0
            } else {
                crate::connectors::formats::SchemaText::plain(text)
            };
            let mut written = toml_edit::InlineTable::new();
            written.insert("text", schema.text.into());
            if !schema.references.is_empty() {
                let mut imports = toml_edit::InlineTable::new();
                for (name, text) in schema.references {
                    imports.insert(&name, text.into());
                }
                written.insert("imports", imports.into());
            }
            let decor = value.decor().clone();
            *value = toml_edit::Value::InlineTable(written);
            *value.decor_mut() = decor;
        }
    }
    Ok(())
}

/// The job a request carrying the job file at `path` answered with, or the server's
/// error naming that file (the server knows it as `job.toml`) and, for a plugin it did
/// not find uploaded, where the file would have been.
fn job_file_answer(
    path: &Path,
    doing: &str,
    status: u16,
    answer: &[u8],
    not_files: &[(String, PathBuf)],
) -> Result<JobSummary> {
    if status < 400 {
        return serde_json::from_slice(answer)
            .with_context(|| format!("{doing} {}: the server's answer", path.display()));
    }
    let mut message = error_message(answer).replace("job.toml", &path.display().to_string());
    for (named, file) in not_files {
        if message.contains(&format!("{named:?} was not uploaded")) {
            message.push_str(&format!(
                "; and {named:?} is no file here either ({} does not exist; a plugin's \
                 path is relative to the job file)",
                file.display()
            ));
        }
    }
    match message.starts_with(&path.display().to_string()) {
        true => bail!("{message} (the server answered {status})"),
        false => bail!("{doing} {}: {status}: {message}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::job_file::JobFile;
    use crate::spec::values::SchemaSpec;

    #[test]
    fn schema_files_are_written_into_the_job_file_with_their_imports() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        std::fs::create_dir(base.join("common")).unwrap();
        let address =
            "syntax = \"proto3\";\npackage common;\nmessage Address { string city = 1; }\n";
        std::fs::write(base.join("common/address.proto"), address).unwrap();
        let order = "syntax = \"proto3\";\npackage shop;\nimport \"common/address.proto\";\n\
                     message Order { string id = 1; common.Address ship = 2; }\n";
        std::fs::write(base.join("order.proto"), order).unwrap();
        let key = r#"{"type":"string"}"#;
        std::fs::write(base.join("key.avsc"), key).unwrap();
        let text = r#"name = "j"
[source]
type = "kafka"
bootstrap = "b:1"
topics = "in"
format = "protobuf"
schema = "order.proto" # the orders
[[operator]]
name = "pass"
plugin = "p.wasm"
[[sink]]
type = "kafka"
bootstrap = "b:1"
topic = "out"
key_format = "avro"
key_schema = "key.avsc"
"#;
        let mut job: toml_edit::DocumentMut = text.parse().unwrap();
        schemas_written_in(&mut job, base).unwrap();
        let written = job.to_string();
        assert!(written.contains("# the orders"), "comments kept: {written}");
        let file: JobFile = toml::from_str(&written).unwrap();
        assert_eq!(
            file.source[0].schema,
            Some(SchemaSpec::Text {
                text: order.into(),
                imports: [("common/address.proto".to_string(), address.to_string())].into(),
            })
        );
        assert_eq!(
            file.sink[0].key_schema,
            Some(SchemaSpec::Text {
                text: key.into(),
                imports: Default::default(),
            })
        );
        // A file that is not there is an error naming it, not a job sent without it.
        let mut job: toml_edit::DocumentMut =
            text.replace("key.avsc", "nope.avsc").parse().unwrap();
        let e = format!("{:#}", schemas_written_in(&mut job, base).unwrap_err());
        assert!(
            e.contains("[sink] key_schema: reading") && e.contains("nope.avsc"),
            "{e}"
        );
    }
}
