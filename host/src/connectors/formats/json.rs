//! A JSON value that borrows its strings from the text it was read from, with objects
//! as lists of fields: what a sink encodes from, without a map and a string allocated
//! per field of every record (`serde_json::Value` spent half an Avro sink's time so).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum J<'a> {
    Null,
    Bool(bool),
    /// An integer that fits `i64`.
    Int(i64),
    /// A non-negative integer past `i64::MAX`.
    UInt(u64),
    Float(f64),
    Str(Cow<'a, str>),
    Arr(Vec<J<'a>>),
    /// The fields in the order written (a repeated name: the first counts).
    Obj(Vec<(Cow<'a, str>, J<'a>)>),
}

impl<'a> J<'a> {
    /// Reads JSON text.
    pub fn parse(text: &'a [u8]) -> serde_json::Result<J<'a>> {
        serde_json::from_slice(text)
    }

    /// Field `name` of an object.
    pub fn get(&self, name: &str) -> Option<&J<'a>> {
        match self {
            J::Obj(fields) => fields.iter().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value as `f64`, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            J::Int(v) => Some(*v as f64),
            J::UInt(v) => Some(*v as f64),
            J::Float(v) => Some(*v),
            _ => None,
        }
    }

    /// An owned copy of a `serde_json` value (a schema's default).
    pub fn from_value(value: &serde_json::Value) -> J<'static> {
        match value {
            serde_json::Value::Null => J::Null,
            serde_json::Value::Bool(b) => J::Bool(*b),
            serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(v), _) => J::Int(v),
                (None, Some(v)) => J::UInt(v),
                _ => J::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => J::Str(Cow::Owned(s.clone())),
            serde_json::Value::Array(items) => J::Arr(items.iter().map(J::from_value).collect()),
            serde_json::Value::Object(map) => J::Obj(
                map.iter()
                    .map(|(k, v)| (Cow::Owned(k.clone()), J::from_value(v)))
                    .collect(),
            ),
        }
    }
}

impl fmt::Display for J<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            J::Null => f.write_str("null"),
            J::Bool(b) => write!(f, "{b}"),
            J::Int(v) => write!(f, "{v}"),
            J::UInt(v) => write!(f, "{v}"),
            J::Float(v) => write!(f, "{v}"),
            J::Str(s) => write!(f, "{s:?}"),
            J::Arr(_) => f.write_str("[…]"),
            J::Obj(_) => f.write_str("{…}"),
        }
    }
}

/// A string, borrowed when the text holds it without escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_string())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Deserialize<'de> for J<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = J<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<J<'de>, E> {
                Ok(J::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<J<'de>, E> {
                Ok(J::Null)
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<J<'de>, E> {
                Ok(J::Bool(b))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<J<'de>, E> {
                Ok(J::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<J<'de>, E> {
                Ok(i64::try_from(v).map_or(J::UInt(v), J::Int))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<J<'de>, E> {
                Ok(J::Float(v))
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<J<'de>, E> {
                Ok(J::Str(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<J<'de>, E> {
                Ok(J::Str(Cow::Owned(s.to_string())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<J<'de>, E> {
                Ok(J::Str(Cow::Owned(s)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<J<'de>, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(J::Arr(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<J<'de>, A::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(8).min(64));
                while let Some(Text(key)) = map.next_key()? {
                    fields.push((key, map.next_value()?));
                }
                Ok(J::Obj(fields))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_without_escapes_are_borrowed_and_numbers_keep_their_kind() {
        let text = br#"{"a":"plain","b":"esc\"aped","n":-3,"u":18446744073709551615,"f":1.5,"l":[null,true]}"#;
        let j = J::parse(text).unwrap();
        assert!(matches!(j.get("a"), Some(J::Str(Cow::Borrowed("plain")))));
        assert!(matches!(j.get("b"), Some(J::Str(Cow::Owned(s))) if s == "esc\"aped"));
        assert_eq!(j.get("n"), Some(&J::Int(-3)));
        assert_eq!(j.get("u"), Some(&J::UInt(u64::MAX)));
        assert_eq!(j.get("f"), Some(&J::Float(1.5)));
        assert_eq!(j.get("l"), Some(&J::Arr(vec![J::Null, J::Bool(true)])));
        assert!(J::parse(b"{\"a\":").is_err());
        assert!(J::parse(b"[1] x").is_err());
    }
}
