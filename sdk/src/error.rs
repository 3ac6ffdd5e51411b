//! The error an operator returns to the host.

use std::fmt;

/// What went wrong in an operator call.
///
/// The two variants decide what the host does next: an invalid configuration fails the
/// job without restarting it (restarting would not help), anything else fails the task and
/// lets the job's restart strategy take over. A panic is neither: it traps the instance,
/// which the host also treats as a failure but cannot recover the instance from.
///
/// Common error types convert into [`Error::Failed`] with `?`, so a plugin rarely builds
/// one by hand:
///
/// ```
/// fn parse_count(text: &str) -> sluice_sdk::Result<u64> {
///     Ok(text.parse::<u64>()?)
/// }
/// let err = parse_count("ten").unwrap_err();
/// assert_eq!(err.to_string(), "cannot parse an integer: invalid digit found in string");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The configuration given to `open` cannot be used. The message should name the
    /// offending key.
    InvalidConfig(String),
    /// Anything else.
    Failed(String),
}

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::InvalidConfig`] with `message`.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Error::InvalidConfig(message.into())
    }

    /// An [`Error::Failed`] with `message`.
    pub fn failed(message: impl Into<String>) -> Self {
        Error::Failed(message.into())
    }

    /// The message, without the kind of error.
    pub fn message(&self) -> &str {
        match self {
            Error::InvalidConfig(message) | Error::Failed(message) => message,
        }
    }

    /// True for [`Error::InvalidConfig`].
    pub fn is_invalid_config(&self) -> bool {
        matches!(self, Error::InvalidConfig(_))
    }

    /// The same error with `context` and a colon put in front of its message.
    ///
    /// ```
    /// # use sluice_sdk::Error;
    /// let err = Error::failed("bad input").context("record 3");
    /// assert_eq!(err, Error::failed("record 3: bad input"));
    /// ```
    pub fn context(self, context: impl fmt::Display) -> Self {
        match self {
            Error::InvalidConfig(message) => Error::InvalidConfig(format!("{context}: {message}")),
            Error::Failed(message) => Error::Failed(format!("{context}: {message}")),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidConfig(message) => write!(f, "invalid configuration: {message}"),
            Error::Failed(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

/// Implements `From<$ty> for Error` as `Failed("$what: <error>")`.
macro_rules! failed_from {
    ($($ty:ty => $what:literal,)*) => {$(
        impl From<$ty> for Error {
            fn from(err: $ty) -> Self {
                Error::Failed(format!(concat!($what, ": {}"), err))
            }
        }
    )*};
}

failed_from! {
    postcard::Error => "cannot encode or decode a value (postcard)",
    std::str::Utf8Error => "not valid UTF-8",
    std::string::FromUtf8Error => "not valid UTF-8",
    std::num::ParseIntError => "cannot parse an integer",
    std::num::ParseFloatError => "cannot parse a number",
    std::str::ParseBoolError => "cannot parse a boolean",
    std::char::ParseCharError => "cannot parse a character",
    std::io::Error => "I/O error",
    sluice_codec::DecodeError => "cannot decode a buffer from the host",
}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error::Failed(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Error::Failed(message.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_tells_the_kinds_apart() {
        assert_eq!(
            Error::invalid_config("`x` is not a number").to_string(),
            "invalid configuration: `x` is not a number"
        );
        assert_eq!(Error::failed("boom").to_string(), "boom");
        assert_eq!(Error::failed("boom").message(), "boom");
    }

    #[test]
    fn conversions_say_what_failed() {
        let bytes = vec![0xff_u8];
        let err: Error = std::str::from_utf8(&bytes).unwrap_err().into();
        assert!(err.message().starts_with("not valid UTF-8"), "{err}");
        let err: Error = postcard::from_bytes::<u64>(&[]).unwrap_err().into();
        assert!(err.message().contains("postcard"), "{err}");
        assert!(!err.is_invalid_config());
    }
}
