//! Kafka reached as managed clusters are: TLS with SASL/SCRAM, TLS with client
//! certificates (mTLS), secrets taken from a file or the environment; a wrong password
//! and an untrusted certificate named in the error, the secret nowhere in it. The test
//! broker's secure listeners come from `scripts/kafka/broker.sh`.

use std::process::Stdio;

use sluice_tests::kafka::{broker, create_topic, read_committed, secure_broker, unique_topic};
use sluice_tests::plugins::{COUNT, TOKENIZE};
use sluice_tests::{run_job, sluice_run, test_dir, write_job};

use super::{as_count_lines, assert_counts, topic_of_lines};
use crate::server::{ServerProcess, error_of, host_config};

/// `properties = { … }` for TLS with SASL `mechanism` as `user` with `password`, trusting
/// `ca`.
fn sasl_ssl(mechanism: &str, user: &str, password: &str, ca: &str) -> String {
    format!(
        "{{ \"security.protocol\" = \"SASL_SSL\", \"sasl.mechanism\" = \"{mechanism}\", \
         \"sasl.username\" = \"{user}\", \"sasl.password\" = \"{password}\", \
         \"ssl.ca.location\" = \"{ca}\" }}"
    )
}

#[test]
fn a_job_reads_over_mtls_and_writes_over_tls_with_scram_exactly_once() {
    let (Some(plain), Some(secure)) = (broker(), secure_broker()) else {
        return;
    };
    let dir = test_dir("kafka-secure");
    let (input, text) = topic_of_lines(&plain, "secure-in", 2, 47, 2_000);
    let output = unique_topic("secure-out");
    create_topic(&plain, &output, 2);
    // The password from a file beside the job file, the user from the environment.
    std::fs::write(dir.join("kafka-password"), format!("{}\n", secure.password)).unwrap();
    let tls = secure.tls.display();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "secure"
[source]
type = "kafka"
bootstrap = "{ssl}"
topics = "{input}"
bounded = true
properties = {{ "security.protocol" = "SSL", "ssl.ca.location" = "{tls}/ca.pem", "ssl.certificate.location" = "{tls}/client.pem", "ssl.key.location" = "{tls}/client.key" }}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
parallelism = 2
[sink]
type = "kafka"
bootstrap = "{sasl}"
topic = "{output}"
transactional_id_prefix = "{output}"
properties = {properties}
[checkpoint]
interval_ms = 50
dir = "checkpoints"
"#,
            ssl = secure.ssl,
            sasl = secure.sasl_ssl,
            properties = sasl_ssl(
                "SCRAM-SHA-256",
                "${env:SLUICE_KAFKA_USER}",
                "${file:kafka-password}",
                &format!("{tls}/ca.pem")
            ),
        ),
    );
    let out = sluice_run(env!("CARGO_BIN_EXE_sluice-test-cli"), &job, None)
        .arg("--log")
        .arg("debug")
        .env("SLUICE_KAFKA_USER", &secure.user)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains(&secure.password),
        "the password was logged"
    );
    assert_counts(&as_count_lines(&read_committed(&plain, &output)), &text);
}

#[test]
fn a_wrong_password_or_an_untrusted_certificate_is_named_without_the_secret() {
    let (Some(plain), Some(secure)) = (broker(), secure_broker()) else {
        return;
    };
    let dir = test_dir("kafka-secure-refused");
    let (input, _) = topic_of_lines(&plain, "secure-refused", 1, 3, 10);
    let ca = secure.tls.join("ca.pem").display().to_string();
    let other_ca = secure.tls.join("other-ca.pem").display().to_string();
    let wrong = "not-the-password-7f3a";
    for (what, properties, expected) in [
        (
            "a wrong password",
            sasl_ssl("SCRAM-SHA-512", &secure.user, wrong, &ca),
            vec![
                "SASL authentication error",
                "SCRAM-SHA-512",
                secure.sasl_ssl.as_str(),
            ],
        ),
        (
            "an unknown user",
            sasl_ssl("PLAIN", "mallory", wrong, &ca),
            vec![
                "SASL authentication error",
                "PLAIN",
                secure.sasl_ssl.as_str(),
            ],
        ),
        (
            "an untrusted certificate",
            sasl_ssl("SCRAM-SHA-512", &secure.user, &secure.password, &other_ca),
            vec!["certificate verify failed", secure.sasl_ssl.as_str()],
        ),
    ] {
        let job = write_job(
            &dir,
            &format!(
                r#"
name = "refused"
[source]
type = "kafka"
bootstrap = "{bootstrap}"
topics = "{input}"
bounded = true
properties = {properties}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
type = "stdout"
"#,
                bootstrap = secure.sasl_ssl,
            ),
        );
        let e = format!("{:#}", run_job(&job).expect_err(what));
        for part in expected {
            assert!(e.contains(part), "{what}: {part:?} not in: {e}");
        }
        assert!(
            !e.contains(wrong) && !e.contains(&secure.password),
            "{what}: {e}"
        );
    }

    // A sink refused the same way fails as it opens, named as well.
    let output = unique_topic("secure-refused-out");
    create_topic(&plain, &output, 1);
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "refused-sink"
[source]
type = "generator"
records = 10
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
type = "kafka"
bootstrap = "{bootstrap}"
topic = "{output}"
transactional_id_prefix = "{output}"
properties = {properties}
[checkpoint]
interval_ms = 50
dir = "checkpoints"
"#,
            bootstrap = secure.sasl_ssl,
            properties = sasl_ssl("SCRAM-SHA-256", &secure.user, wrong, &ca),
        ),
    );
    let e = format!("{:#}", run_job(&job).expect_err("a refused sink"));
    for part in ["SASL authentication error", "SCRAM-SHA-256", &output] {
        assert!(e.contains(part), "{part:?} not in: {e}");
    }
    assert!(!e.contains(wrong), "{e}");
}

/// A server job may not take a property from `${env:…}` or `${file:…}`: that would read
/// the server's own environment and files.
#[test]
fn a_server_job_may_not_read_the_servers_environment_or_files() {
    let dir = test_dir("kafka-secure-server");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let a = server.client(Some("token-a"));
    for reference in ["${env:HOME}", "${file:/etc/passwd}"] {
        let job = write_job(
            &dir,
            &format!(
                r#"
name = "reads-the-server"
[source]
type = "kafka"
bootstrap = "127.0.0.1:9"
topics = "t"
properties = {{ "sasl.password" = "{reference}" }}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
type = "file"
path = "out.txt"
"#
            ),
        );
        let e = error_of(a.submit(&job));
        assert!(
            e.contains("403") && e.contains("\"sasl.password\"") && e.contains("server's own"),
            "{e}"
        );
    }
}
