//! The control channel's messages and framing: pure types and byte functions, no sockets, so
//! they are tested (and fuzzable) without a network. A frame is a u32 big-endian length and
//! that many bytes of MessagePack (rmp-serde, struct-as-array). Golden frames in
//! `fixtures/wire/` pin the encoding: a change there is a protocol version bump.

use serde::{Deserialize, Serialize};

use crate::core::Version;
use crate::core::names::Name;

pub const PROTOCOL_VERSION: u32 = 3;
/// Largest frame accepted: control messages are small; this bounds what a bad peer can make us
/// allocate.
pub const MAX_FRAME: usize = 16 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// First message each way: who I am and how to reach my memory over UCX.
    Hello {
        protocol: u32,
        node_id: u32,
        #[serde(with = "serde_bytes_compat")]
        worker_address: Vec<u8>,
        #[serde(with = "serde_bytes_compat")]
        rkey: Vec<u8>,
        /// The puller copies in the background (`--replicate`): the holder serves it on
        /// lowest-priority threads, through its background UCX worker if it has one.
        #[serde(default)]
        background: bool,
    },
    /// Stage bytes `[offset, offset + len)` of a file at a version (one chunk; `len` at most
    /// the holder's slot size).
    Request {
        id: u64,
        path: String,
        version: Version,
        offset: u64,
        len: u32,
    },
    /// The chunk is staged at `addr` in the holder's slab: get it, then `Release` it.
    Staged {
        id: u64,
        addr: u64,
        len: u32,
        crc32c: u32,
    },
    /// The requester is done with a staged slot.
    Release {
        addr: u64,
    },
    Error {
        id: u64,
        message: String,
    },
    // Locator RPCs: one request and one reply per connection (see `locator::service`).
    /// A member missed a file: asked of its rack home (`global: false`) or, by a rack home, of
    /// the global home (`global: true`).
    Lookup {
        path: String,
        version: Version,
        requester: u32,
        global: bool,
    },
    /// The answer to a lookup.
    Located(Located),
    /// A node completed a copy (`held: true`) or dropped it, told to its rack home.
    Publish {
        path: String,
        version: Version,
        node: u32,
        held: bool,
    },
    /// A rack home tells the global home its rack gained its first copy or lost its last.
    RackChanged {
        path: String,
        version: Version,
        rack: String,
        node: u32,
        held: bool,
    },
    /// A designated fetcher could not read the backing store.
    FetchFailed {
        path: String,
        version: Version,
        node: u32,
    },
    Ack,
    // The produced namespace (see `locator::names`), asked of a directory's name home.
    /// Look a name up, waiting up to `wait_ms` for it to be published.
    NameGet {
        dir: String,
        name: String,
        wait_ms: u64,
    },
    /// The answer to `NameGet`, and to `NameSet` (the name it replaced).
    NameIs(Option<Name>),
    NameList {
        dir: String,
    },
    Names(Vec<(String, Name)>),
    /// Publish (`Some`) or remove (`None`) a name.
    NameSet {
        dir: String,
        name: String,
        entry: Option<Name>,
    },
    /// To a producer: its object is no longer named (`drop`: delete it; else evictable).
    Unhold {
        object: String,
        version: Version,
        drop: bool,
    },
    /// Several locator messages in one RPC (publishes queued together); answered by a `Batch`
    /// of their replies, in order.
    Batch(Vec<Message>),
    /// From a node that has (re)started with empty tables: peers re-announce what those tables
    /// held (their copies it is rack home of, their racks' copies it is global home of), then
    /// answer `Ack`.
    Rejoined {
        node: u32,
    },
    /// From a replicating node to a global home: the copies racks gained after position
    /// `after` of its feed (at most `max`).
    Gained {
        after: u64,
        max: u32,
    },
    /// The answer to `Gained`: (path, version, holder), and the position to ask from next.
    GainedList {
        next: u64,
        copies: Vec<(String, Version, u32)>,
    },
    // Authentication with the job secret, first on every connection (see `transport::auth`).
    /// Client: who I am, and a fresh nonce.
    AuthHello {
        protocol: u32,
        node_id: u32,
        #[serde(with = "serde_bytes_compat")]
        nonce: Vec<u8>,
    },
    /// Server: who I am, my fresh nonce, and my MAC over both.
    AuthChallenge {
        node_id: u32,
        #[serde(with = "serde_bytes_compat")]
        nonce: Vec<u8>,
        #[serde(with = "serde_bytes_compat")]
        mac: Vec<u8>,
    },
    /// Client: its MAC over both nonces.
    AuthProof {
        #[serde(with = "serde_bytes_compat")]
        mac: Vec<u8>,
    },
}

/// What a lookup tells the requester to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Located {
    Holders(Vec<u32>),
    Fetch,
    WaitFor(u32),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("undecodable frame: {0}")]
    Garbage(String),
    #[error("peer speaks protocol version {0}, this node {PROTOCOL_VERSION}")]
    Version(u32),
}

/// Encodes one message as a complete frame (length prefix included).
pub fn encode(msg: &Message) -> Vec<u8> {
    let body = rmp_serde::to_vec(msg).expect("messages always serialize");
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

/// Decodes a frame body; a Hello of another protocol version is refused.
pub fn decode(body: &[u8]) -> Result<Message, WireError> {
    let msg: Message =
        rmp_serde::from_slice(body).map_err(|e| WireError::Garbage(e.to_string()))?;
    if let Message::Hello { protocol, .. } = msg
        && protocol != PROTOCOL_VERSION
    {
        return Err(WireError::Version(protocol));
    }
    Ok(msg)
}

/// Byte vectors as MessagePack bin (compact) rather than arrays of integers.
mod serde_bytes_compat {
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

    fn samples() -> Vec<Message> {
        vec![
            Message::Hello {
                protocol: PROTOCOL_VERSION,
                node_id: 3,
                worker_address: vec![1, 2, 3, 250],
                rkey: vec![9, 8],
                background: true,
            },
            Message::Request {
                id: 7,
                path: "train/x.npz".into(),
                version: Version {
                    size: 5 << 30,
                    mtime_ns: 1_700_000_000_123_456_789,
                },
                offset: 4 << 30,
                len: 2 << 20,
            },
            Message::Staged {
                id: 7,
                addr: 0x7f00_dead_0000,
                len: 2 << 20,
                crc32c: 0xdead_beef,
            },
            Message::Release {
                addr: 0x7f00_dead_0000,
            },
            Message::Error {
                id: 7,
                message: "no such file".into(),
            },
            Message::Gained { after: 3, max: 512 },
            Message::GainedList {
                next: 4,
                copies: vec![(
                    "train/x.npz".into(),
                    Version {
                        size: 1,
                        mtime_ns: 2,
                    },
                    3,
                )],
            },
            Message::AuthHello {
                protocol: PROTOCOL_VERSION,
                node_id: 1,
                nonce: vec![7; 32],
            },
            Message::AuthChallenge {
                node_id: 2,
                nonce: vec![8; 32],
                mac: vec![9; 32],
            },
            Message::AuthProof { mac: vec![10; 32] },
            Message::NameIs(Some(Name {
                dir: false,
                object: "//produced/1/5-2".into(),
                size: 10,
                mtime_ns: 11,
                mode: 0o640,
                holder: 1,
                uid: 1000,
                gid: 100,
            })),
        ]
    }

    #[test]
    fn golden_frames() {
        let golden = include_bytes!("../../fixtures/wire/frames-v3.bin");
        let mut all = Vec::new();
        for m in samples() {
            all.extend(encode(&m));
        }
        // After a deliberate protocol change (and version bump), regenerate with
        // DYADFS_REGENERATE_FIXTURES=1 cargo test --lib golden_frames
        if std::env::var_os("DYADFS_REGENERATE_FIXTURES").is_some() {
            std::fs::write(
                concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/wire/frames-v3.bin"),
                &all,
            )
            .unwrap();
            return;
        }
        assert_eq!(
            all,
            golden.as_slice(),
            "the wire encoding changed: bump PROTOCOL_VERSION and regenerate fixtures/wire"
        );
        let mut rest = golden.as_slice();
        for m in samples() {
            let len = check_len(rest[..4].try_into().unwrap()).unwrap();
            assert_eq!(decode(&rest[4..4 + len]).unwrap(), m);
            rest = &rest[4 + len..];
        }
        assert!(rest.is_empty());
    }

    #[test]
    fn bad_frames_are_refused() {
        assert_eq!(
            check_len(((MAX_FRAME + 1) as u32).to_be_bytes()),
            Err(WireError::TooLarge(MAX_FRAME + 1))
        );
        assert!(matches!(decode(b"\xc1garbage"), Err(WireError::Garbage(_))));
        assert!(matches!(decode(&[]), Err(WireError::Garbage(_))));
        let future = encode(&Message::Hello {
            protocol: 99,
            node_id: 0,
            worker_address: vec![],
            rkey: vec![],
            background: false,
        });
        assert_eq!(decode(&future[4..]), Err(WireError::Version(99)));
    }
}
