//! The operator's configuration from the job file.

use std::fmt::Display;
use std::str::FromStr;

use crate::{Error, Result};

/// The `config` table of the operator in the job file, as string keys and values.
///
/// Every accessor that can fail returns [`Error::InvalidConfig`] naming the key, so `?` in
/// [`Operator::open`](crate::Operator::open) reports a bad job file the way the host
/// expects (the job fails without restarts).
///
/// ```
/// # use sluice_sdk::Config;
/// let config = Config::from_pairs([("min-length", "3")]);
/// config.check_known(&["min-length", "max-length"])?;
/// assert_eq!(config.parse_or("min-length", 1usize)?, 3);
/// assert_eq!(config.parse::<usize>("max-length")?, None);
/// # Ok::<(), sluice_sdk::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    entries: Vec<(String, String)>,
}

impl Config {
    /// A configuration holding `pairs`; when a key repeats, the first one counts.
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Config {
            entries: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the key when it is not set.
    pub fn require(&self, key: &str) -> Result<&str> {
        self.get(key)
            .ok_or_else(|| Error::invalid_config(format!("missing required config key `{key}`")))
    }

    /// The value of `key` parsed as `T`, or `None` when it is not set.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the key, the value and why it does not parse.
    pub fn parse<T>(&self, key: &str) -> Result<Option<T>>
    where
        T: FromStr,
        T::Err: Display,
    {
        self.get(key)
            .map(|value| {
                value
                    .parse()
                    .map_err(|e| Error::invalid_config(format!("config `{key}` = {value:?}: {e}")))
            })
            .transpose()
    }

    /// The value of `key` parsed as `T`, or `default` when it is not set.
    ///
    /// # Errors
    ///
    /// As [`Config::parse`].
    pub fn parse_or<T>(&self, key: &str, default: T) -> Result<T>
    where
        T: FromStr,
        T::Err: Display,
    {
        Ok(self.parse(key)?.unwrap_or(default))
    }

    /// The keys that are set, in the order the host passed them.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// The `(key, value)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Rejects keys other than `known`, so that a typo in the job file is an error rather
    /// than a silently ignored setting.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first unknown key and listing the known ones.
    pub fn check_known(&self, known: &[&str]) -> Result<()> {
        match self.keys().find(|key| !known.contains(key)) {
            None => Ok(()),
            Some(key) if known.is_empty() => Err(Error::invalid_config(format!(
                "unknown config key `{key}`: this operator takes no configuration"
            ))),
            Some(key) => Err(Error::invalid_config(format!(
                "unknown config key `{key}` (known keys: {})",
                known.join(", ")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::from_pairs([("n", "12"), ("flag", "yes"), ("n", "13")])
    }

    #[test]
    fn lookups() {
        let c = config();
        assert_eq!(c.get("n"), Some("12"));
        assert_eq!(c.get("missing"), None);
        assert_eq!(c.keys().collect::<Vec<_>>(), ["n", "flag", "n"]);
        assert_eq!(c.parse::<u32>("n").unwrap(), Some(12));
        assert_eq!(c.parse_or("missing", 5u32).unwrap(), 5);
    }

    #[test]
    fn errors_name_key_value_and_reason() {
        let c = config();
        let err = c.parse::<bool>("flag").unwrap_err();
        assert!(err.is_invalid_config());
        assert_eq!(
            err.message(),
            "config `flag` = \"yes\": provided string was not `true` or `false`"
        );
        let err = c.require("path").unwrap_err();
        assert_eq!(err.message(), "missing required config key `path`");
        let err = c.check_known(&["n", "other"]).unwrap_err();
        assert_eq!(
            err.message(),
            "unknown config key `flag` (known keys: n, other)"
        );
        assert!(c.check_known(&["n", "flag"]).is_ok());
        assert!(
            c.check_known(&[])
                .unwrap_err()
                .message()
                .contains("no configuration")
        );
    }
}
