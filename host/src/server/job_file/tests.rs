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

#[test]
fn an_edited_job_file_gets_back_the_secrets_left_masked_and_keeps_the_new_ones() {
    let stored = r#"name = "wc"
[source]
type = "kafka"
properties = { "sasl.password" = "hunter2", "sasl.username" = "ann" }
[sink.properties]
"ssl.key.password" = "k3y"
[[operator]]
name = "enrich"
config = { api_token = "t0k" }
[[operator]]
name = "count"
config = { api_token = "second" }
"#;
    // Edited from the masked view: a setting changed, one secret given anew, the
    // others left masked.
    let edited = masked(stored)
        .unwrap()
        .replace("\"ann\"", "\"bob\"")
        .replacen(&format!("api_token = \"{MASK}\""), "api_token = \"new\"", 1);
    let text = unmasked(&edited, stored).unwrap();
    for kept in [
        "\"sasl.password\" = \"hunter2\"",
        "\"sasl.username\" = \"bob\"",
        "\"ssl.key.password\" = \"k3y\"",
        "api_token = \"new\"",
        "api_token = \"second\"",
    ] {
        assert!(text.contains(kept), "{kept} lost:\n{text}");
    }
    assert!(!text.contains(MASK), "{text}");
    // A masked secret the stored file never had is named.
    let added = format!("{edited}[state]\nsecret_key = \"{MASK}\"\n");
    let e = unmasked(&added, stored).unwrap_err();
    assert!(
        e.contains("`state.secret_key`") && e.contains("give the secret"),
        "{e}"
    );
    // Nothing masked, or not TOML: as it is.
    assert_eq!(
        unmasked("name = \"x\"\n", stored).unwrap(),
        "name = \"x\"\n"
    );
    assert_eq!(unmasked("name = ", stored).unwrap(), "name = ");
}
