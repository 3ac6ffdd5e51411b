//! Errors a Kafka client reports by callback rather than with a request: a broker out
//! of reach, a SASL authentication the broker refused (with the mechanism), a TLS
//! handshake that failed (a certificate not trusted). The request that then fails only
//! says its transport failed, so its error names the latest of them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;

/// How long a reported error explains a request's failure.
const RECENT: Duration = Duration::from_secs(60);

/// How many events a client is polled for to take in what it reported, on the way to
/// failing (each poll serves one).
pub const EVENTS_SERVED: usize = 64;

/// What librdkafka's reports of a refused connection say.
const REFUSALS: [&str; 3] = [
    "SASL authentication error",
    "SSL handshake failed",
    "certificate verify failed",
];

/// How many distinct reports a note names at most (the latest).
const KEPT: usize = 3;

/// The latest errors a client reported, each with when.
#[derive(Default)]
pub struct ClientErrors {
    last: Mutex<Vec<(Instant, String)>>,
}

impl ClientErrors {
    /// Keeps what librdkafka reported by its error callback (`reason` names the broker;
    /// never a secret).
    pub fn record(&self, error: &KafkaError, reason: &str) {
        tracing::debug!("Kafka client: {error}: {reason}");
        self.keep(reason);
    }

    /// Keeps what librdkafka logged at warning level or above (a refused authentication,
    /// with its mechanism; a failed TLS handshake, with why).
    pub fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        if (level as i32) <= RDKafkaLogLevel::Warning as i32 {
            tracing::debug!("Kafka client: {facility}: {message}");
            self.keep(message);
        }
    }

    /// Whether the brokers refused the client lately: a failed authentication or TLS
    /// handshake, which waiting does not mend.
    pub fn refused(&self) -> bool {
        self.last
            .lock()
            .iter()
            .any(|(at, m)| at.elapsed() < RECENT && REFUSALS.iter().any(|r| m.contains(r)))
    }

    fn keep(&self, message: &str) {
        // (The thread in brackets, `[thrd:…]`, says nothing to a reader.)
        let message = match message.strip_prefix("[thrd:") {
            Some(rest) => rest.split_once("]: ").map_or(message, |(_, m)| m),
            None => message,
        };
        // (Nor does how long it took, which tells repeats of one error apart.)
        let message = match message.rfind(" (after ") {
            Some(at) if message.ends_with(')') => &message[..at],
            _ => message,
        };
        let mut last = self.last.lock();
        last.retain(|(at, m)| m != message && at.elapsed() < RECENT);
        last.push((Instant::now(), message.to_string()));
        if last.len() > KEPT {
            last.remove(0);
        }
    }

    /// ` (the Kafka client reported: …)` when errors were reported in the last minute,
    /// else nothing: to follow what failed. A SASL error the broker gave without the
    /// mechanism (PLAIN's does) is told the one `properties` chose.
    pub fn note(&self, properties: &BTreeMap<String, String>) -> String {
        let last = self.last.lock();
        let recent: Vec<&str> = last
            .iter()
            .filter(|(at, _)| at.elapsed() < RECENT)
            .map(|(_, m)| m.as_str())
            .collect();
        if recent.is_empty() {
            return String::new();
        }
        let mut note = format!(" (the Kafka client reported: {}", recent.join("; "));
        // (librdkafka's default mechanism.)
        let mechanism = properties
            .get("sasl.mechanism")
            .map_or("GSSAPI", |m| m.as_str());
        if note.contains("SASL") && !note.contains(mechanism) {
            note.push_str(&format!("; SASL mechanism {mechanism}"));
        }
        note.push(')');
        note
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reported_error_explains_what_fails_after_it() {
        let plain = BTreeMap::from([("sasl.mechanism".to_string(), "PLAIN".to_string())]);
        let errors = ClientErrors::default();
        assert_eq!(errors.note(&plain), "");
        for after in ["310ms", "311ms, 1 identical error(s) suppressed"] {
            errors.log(
                RDKafkaLogLevel::Error,
                "FAIL",
                &format!(
                    "[thrd:sasl_ssl://b:9093/bootstrap]: sasl_ssl://b:9093/bootstrap: SASL \
                     authentication error: Authentication failed: Invalid username or \
                     password (after {after} in state AUTH_REQ)"
                ),
            );
        }
        // Debug lines are not errors.
        errors.log(RDKafkaLogLevel::Debug, "BROKER", "connected");
        errors.record(
            &KafkaError::ClientCreation("x".into()),
            "1/1 brokers are down",
        );
        assert!(errors.refused());
        // Repeats told once, the mechanism added.
        assert_eq!(
            errors.note(&plain),
            " (the Kafka client reported: sasl_ssl://b:9093/bootstrap: SASL authentication \
             error: Authentication failed: Invalid username or password; 1/1 brokers are \
             down; SASL mechanism PLAIN)"
        );
    }
}
