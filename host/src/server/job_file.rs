//! A job file as the server shows it back: the text submitted, with the values of
//! settings that hold secrets masked (Kafka client properties such as `sasl.password`
//! or `ssl.key.password`, and any key naming a password, secret, token or credential).

use toml_edit::{DocumentMut, Item, Table, TableLike, Value};

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

/// `edited`, a job file edited from its masked view, with each secret left masked
/// (`******`) given back its value from `stored`, the job file it replaces (the same
/// setting, by its path: table, key, index). A masked secret `stored` does not have is
/// named in the error. Text that is not TOML is returned as it is, for the job file's
/// reader to report where.
pub fn unmasked(edited: &str, stored: &str) -> Result<String, String> {
    let Ok(mut doc) = edited.parse::<DocumentMut>() else {
        return Ok(edited.to_string());
    };
    if !edited.contains(MASK) {
        return Ok(edited.to_string());
    }
    let stored: Option<DocumentMut> = stored.parse().ok();
    let mut missing = Vec::new();
    for (key, item) in doc.as_table_mut().iter_mut() {
        let old = stored.as_ref().and_then(|d| d.get(key.get()));
        unmask_item(item, old, is_secret(key.get()), key.get(), &mut missing);
    }
    match missing.is_empty() {
        true => Ok(doc.to_string()),
        false => Err(format!(
            "job.toml: {} masked ({MASK}) with no value in the job file it replaces to stand \
             for: give the secret's value",
            missing.join(", ")
        )),
    }
}

/// Gives back, within `item` (at `path`), each masked secret its value from `stored`.
fn unmask_item(
    item: &mut Item,
    stored: Option<&Item>,
    secret: bool,
    path: &str,
    missing: &mut Vec<String>,
) {
    match item {
        Item::Table(t) => unmask_table(t, stored.and_then(Item::as_table_like), path, missing),
        Item::ArrayOfTables(a) => {
            for (i, t) in a.iter_mut().enumerate() {
                let old = stored
                    .and_then(Item::as_array_of_tables)
                    .and_then(|o| o.get(i))
                    .map(|o| o as &dyn TableLike);
                unmask_table(t, old, &format!("{path}[{i}]"), missing);
            }
        }
        Item::Value(v) => unmask_value(v, stored, secret, path, missing),
        Item::None => {}
    }
}

/// [`unmask_item`] for each setting of `table` (at `path`), against `stored`.
fn unmask_table(
    table: &mut Table,
    stored: Option<&dyn TableLike>,
    path: &str,
    missing: &mut Vec<String>,
) {
    for (key, child) in table.iter_mut() {
        let old = stored.and_then(|o| o.get(key.get()));
        let at = format!("{path}.{}", key.get());
        unmask_item(child, old, is_secret(key.get()), &at, missing);
    }
}

fn unmask_value(
    value: &mut Value,
    stored: Option<&Item>,
    secret: bool,
    path: &str,
    missing: &mut Vec<String>,
) {
    match value {
        Value::InlineTable(t) => {
            for (key, v) in t.iter_mut() {
                let old = stored
                    .and_then(Item::as_table_like)
                    .and_then(|o| o.get(key.get()));
                let at = format!("{path}.{}", key.get());
                unmask_value(v, old, is_secret(key.get()), &at, missing);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter_mut().enumerate() {
                let old = stored
                    .and_then(Item::as_array)
                    .and_then(|o| o.get(i))
                    .map(|o| Item::Value(o.clone()));
                unmask_value(v, old.as_ref(), secret, &format!("{path}[{i}]"), missing);
            }
        }
        Value::String(s) if secret && s.value() == MASK => {
            match stored
                .and_then(Item::as_value)
                .filter(|o| o.as_str() != Some(MASK))
            {
                Some(old) => {
                    let decor = value.decor().clone();
                    *value = old.clone();
                    *value.decor_mut() = decor;
                }
                None => missing.push(format!("`{path}`")),
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
