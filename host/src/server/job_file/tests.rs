use super::*;

#[test]
fn secrets_are_masked_at_any_depth_and_everything_else_is_kept() {
    let text = r#"name = "wc"  # the word count
[source]
type = "kafka"
topic = "words"
properties = { "sasl.mechanism" = "SCRAM-SHA-512", "sasl.password" = "hunter2" }
[sink.properties]
"ssl.key.password" = "k3y"
"ssl.key.pem" = "-----BEGIN PRIVATE KEY-----"
"sasl.oauthbearer.client.secret" = "s"
"bootstrap.servers" = "broker:9093"
[[operator]]
name = "enrich"
config = { api_token = "t0k", region = "eu" }
"#;
    let shown = masked(text).unwrap();
    for secret in ["hunter2", "k3y", "BEGIN PRIVATE KEY", "\"s\"", "t0k"] {
        assert!(!shown.contains(secret), "{secret} shown:\n{shown}");
    }
    for kept in [
        "name = \"wc\"  # the word count",
        "\"sasl.mechanism\" = \"SCRAM-SHA-512\"",
        "\"bootstrap.servers\" = \"broker:9093\"",
        "region = \"eu\"",
        "topic = \"words\"",
    ] {
        assert!(shown.contains(kept), "{kept} lost:\n{shown}");
    }
    assert_eq!(shown.matches(MASK).count(), 5, "{shown}");
}

#[test]
fn text_that_is_not_toml_is_not_shown() {
    assert_eq!(masked("password = "), None);
}
