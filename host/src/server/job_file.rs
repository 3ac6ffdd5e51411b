//! A job file as the server shows it back: the text submitted, with the values of
//! settings that hold secrets masked (Kafka client properties such as `sasl.password`
//! or `ssl.key.password`, and any key naming a password, secret, token or credential).

use toml_edit::{DocumentMut, Item, Table, Value};

/// What stands in for a secret's value.
pub const MASK: &str = "******";

/// Parts of a key that mark its value as a secret.
const SECRET_PARTS: [&str; 6] = [
    "password",
    "secret",
    "token",
    "credential",
    "jaas",
    "private",
];

/// Whether a setting named `key` holds a secret (`sasl.password`, `ssl.key.pem`,
/// `sasl.oauthbearer.client.secret`, `api_token`, …).
fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_PARTS.iter().any(|p| key.contains(p))
        || key.ends_with("key.pem")
        || key.ends_with(".key")
        || key.ends_with("_key")
}

/// `text` with the value of every secret setting, at any depth, masked; formatting and
/// comments kept. Text that is not TOML is not shown at all.
pub fn masked(text: &str) -> Option<String> {
    let mut doc: DocumentMut = text.parse().ok()?;
    mask_table(doc.as_table_mut());
    Some(doc.to_string())
}

fn mask_table(table: &mut Table) {
    for (key, item) in table.iter_mut() {
        let secret = is_secret(key.get());
        match item {
            Item::Table(t) => mask_table(t),
            Item::ArrayOfTables(a) => a.iter_mut().for_each(mask_table),
            Item::Value(v) => mask_value(v, secret),
            Item::None => {}
        }
    }
}

fn mask_value(value: &mut Value, secret: bool) {
    match value {
        Value::InlineTable(t) => {
            for (key, v) in t.iter_mut() {
                let secret = is_secret(key.get());
                mask_value(v, secret);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| mask_value(v, secret)),
        _ if secret => {
            let decor = value.decor().clone();
            *value = Value::from(MASK);
            *value.decor_mut() = decor;
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
