//! The framing every control connection uses, generic in what it carries: a frame is a u32
//! big-endian length and that many bytes of MessagePack (rmp-serde, structs as arrays). The
//! transport's own [`Message`](super::wire::Message)s travel in frames; an RPC's payload (the
//! locator's messages) is encoded the same way inside one. Pure functions over bytes: tested and
//! fuzzed without a network.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest frame accepted: control messages are small; this bounds what a bad peer can make us
/// allocate.
pub const MAX_FRAME: usize = 16 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("undecodable frame: {0}")]
    Garbage(String),
    #[error("peer speaks protocol version {theirs}, this node {ours}")]
    Version { theirs: u32, ours: u32 },
}

/// Encodes a value as MessagePack (no length prefix: an RPC payload, or a frame's body).
pub fn to_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec(value).expect("wire types always serialize")
}

/// How many bytes [`to_bytes`] would make of `value`, without making them (a page of a
/// listing is bounded by what its entries encode to).
pub fn encoded_len<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    rmp_serde::encode::write(&mut c, value).expect("wire types always serialize");
    c.0
}

/// Decodes MessagePack bytes; anything that is not exactly a `T` is `Garbage`.
pub fn from_bytes<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    rmp_serde::from_slice(bytes).map_err(|e| WireError::Garbage(e.to_string()))
}

/// Encodes one value as a complete frame (length prefix included).
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let body = to_bytes(value);
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Checks a frame's announced length before its body is read.
pub fn check_len(prefix: [u8; 4]) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > MAX_FRAME {
        return Err(WireError::TooLarge(len));
    }
    Ok(len)
}

/// Byte vectors as MessagePack bin (compact) rather than arrays of integers.
pub mod bytes {
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = a.next_element()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_bytes(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_frames_are_refused() {
        assert_eq!(
            check_len(((MAX_FRAME + 1) as u32).to_be_bytes()),
            Err(WireError::TooLarge(MAX_FRAME + 1))
        );
        assert!(matches!(
            from_bytes::<(u32, String)>(b"\xc1garbage"),
            Err(WireError::Garbage(_))
        ));
        assert!(matches!(
            from_bytes::<(u32, String)>(&[]),
            Err(WireError::Garbage(_))
        ));
        let f = encode(&(7u32, "x".to_string()));
        assert_eq!(encoded_len(&(7u32, "x".to_string())), f.len() - 4);
        assert_eq!(check_len(f[..4].try_into().unwrap()), Ok(f.len() - 4));
        assert_eq!(from_bytes(&f[4..]), Ok((7u32, "x".to_string())));
    }
}
