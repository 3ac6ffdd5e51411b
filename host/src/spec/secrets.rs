//! Kafka client properties whose values come from elsewhere, as Kafka's own config
//! providers write them: `"${env:NAME}"` (an environment variable of the process that
//! builds the job) and `"${file:PATH}"` (a file's contents without the trailing line
//! break, such as a mounted secret; a relative path is relative to the file that names
//! it). So a password need not be written in a job or host file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Where a property's value comes from, when it is a reference.
#[derive(Debug, PartialEq, Eq)]
pub enum Reference<'a> {
    /// `${env:NAME}`.
    Env(&'a str),
    /// `${file:PATH}`.
    File(&'a str),
}

/// The reference `value` is, if it is one (the whole value, `${env:…}` or `${file:…}`).
pub fn reference(value: &str) -> Option<Reference<'_>> {
    let inner = value.trim().strip_prefix("${")?.strip_suffix('}')?;
    if let Some(name) = inner.strip_prefix("env:") {
        return Some(Reference::Env(name));
    }
    inner.strip_prefix("file:").map(Reference::File)
}

/// `properties` with each reference replaced by what it names; paths of `${file:…}`
/// resolved by `resolve`. The error names the property and what was missing, never a
/// value.
pub fn resolved(
    properties: &BTreeMap<String, String>,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<BTreeMap<String, String>> {
    properties
        .iter()
        .map(|(key, value)| {
            let value = match reference(value) {
                None => value.clone(),
                Some(Reference::Env(name)) => {
                    if name.is_empty() {
                        bail!("property {key:?}: `${{env:}}` names no variable");
                    }
                    std::env::var(name).map_err(|e| {
                        anyhow::anyhow!(
                            "property {key:?}: environment variable {name} ({e}), which \
                             `${{env:{name}}}` names"
                        )
                    })?
                }
                Some(Reference::File(path)) => {
                    if path.is_empty() {
                        bail!("property {key:?}: `${{file:}}` names no file");
                    }
                    let path = resolve(Path::new(path));
                    let text = std::fs::read_to_string(&path).with_context(|| {
                        format!(
                            "property {key:?}: reading {} (named by `${{file:…}}`)",
                            path.display()
                        )
                    })?;
                    text.strip_suffix('\n')
                        .map(|t| t.strip_suffix('\r').unwrap_or(t))
                        .unwrap_or(&text)
                        .to_string()
                }
            };
            Ok((key.clone(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_replaced_by_the_variable_or_the_file_they_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("password"), "s3cret\n").unwrap();
        // SAFETY: only this test reads or writes this variable.
        unsafe { std::env::set_var("SLUICE_SECRETS_TEST_USER", "ann") };
        let properties: BTreeMap<String, String> = [
            ("sasl.username", "${env:SLUICE_SECRETS_TEST_USER}"),
            ("sasl.password", "${file:password}"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("client.id", "a ${env:X} in the middle"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let base = dir.path().to_path_buf();
        let out = resolved(&properties, &|p| base.join(p)).unwrap();
        assert_eq!(out["sasl.username"], "ann");
        assert_eq!(out["sasl.password"], "s3cret");
        assert_eq!(out["sasl.mechanism"], "SCRAM-SHA-512");
        // Only a whole value is a reference.
        assert_eq!(out["client.id"], "a ${env:X} in the middle");
    }

    #[test]
    fn a_missing_variable_or_file_is_named_with_its_property() {
        let one = |key: &str, value: &str| {
            let p = BTreeMap::from([(key.to_string(), value.to_string())]);
            format!("{:#}", resolved(&p, &|p| p.to_path_buf()).unwrap_err())
        };
        let e = one("sasl.password", "${env:SLUICE_SECRETS_TEST_NOT_SET}");
        assert!(
            e.contains("\"sasl.password\"") && e.contains("SLUICE_SECRETS_TEST_NOT_SET"),
            "{e}"
        );
        let e = one("ssl.key.password", "${file:/nonexistent/secret}");
        assert!(
            e.contains("\"ssl.key.password\"") && e.contains("/nonexistent/secret"),
            "{e}"
        );
        assert!(one("x", "${env:}").contains("names no variable"));
    }
}
