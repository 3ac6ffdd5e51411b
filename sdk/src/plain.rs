//! Plain keyed-state values: the fixed layouts that every SDK reads the same way
//! (`wit/operator.wit`, "Plain values"): 8 bytes, little-endian, for an `i64`, a `u64`
//! and an `f64` (IEEE 754). Python's `sluice_sdk.plain.I64` decodes and encodes a whole
//! batch of them at once in native code, where postcard's varints cost it a loop per
//! value in the interpreter; a Rust operator that shares state with such an operator
//! declares it with these types:
//!
//! ```
//! use sluice_sdk::plain::PlainI64;
//! assert_eq!(sluice_sdk::to_bytes(&PlainI64(-2)).unwrap(), (-2i64).to_le_bytes());
//! ```
//!
//! (Plain strings and bytes are the value's bytes as they are, without postcard's length:
//! read them with the raw state API.)

use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! plain {
    ($(#[$doc:meta])* $name:ident, $t:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
        pub struct $name(pub $t);

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                // postcard writes a byte array as its bytes, without a length.
                self.0.to_le_bytes().serialize(s)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <[u8; 8]>::deserialize(d).map(|b| $name(<$t>::from_le_bytes(b)))
            }
        }

        impl From<$t> for $name {
            fn from(v: $t) -> Self {
                $name(v)
            }
        }
    };
}

plain!(
    /// An `i64` stored as its 8 little-endian bytes.
    PlainI64,
    i64
);
plain!(
    /// A `u64` stored as its 8 little-endian bytes.
    PlainU64,
    u64
);
plain!(
    /// An `f64` stored as its 8 little-endian IEEE 754 bytes.
    PlainF64,
    f64
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_values_are_their_eight_little_endian_bytes() {
        for v in [0i64, -1, i64::MIN, 1 << 40] {
            let bytes = crate::to_bytes(&PlainI64(v)).unwrap();
            assert_eq!(bytes, v.to_le_bytes());
            assert_eq!(crate::from_bytes::<PlainI64>(&bytes).unwrap(), PlainI64(v));
        }
        assert_eq!(crate::to_bytes(&PlainU64(u64::MAX)).unwrap(), [0xff; 8]);
        assert_eq!(
            crate::to_bytes(&PlainF64(1.5)).unwrap(),
            1.5f64.to_le_bytes()
        );
        assert!(crate::from_bytes::<PlainI64>(&[1, 2, 3]).is_err());
    }
}
