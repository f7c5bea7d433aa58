//! The transport's own messages: the hello, a pull's requests and staged chunks, the job-secret
//! handshake, and `Rpc`, whose payload the transport carries without reading (the locator's
//! messages, see `locator::proto`). Pure types and byte functions over [`frame`](super::frame)
//! framing. Golden frames in `fixtures/wire/` pin the encoding: a change there is a protocol
//! version bump.

use serde::{Deserialize, Serialize};

use super::frame::{self, WireError};
use crate::core::Version;

/// Version 4: locator messages travel as an opaque `Rpc` payload. Version 6: small chunks
/// travel inline (`Data`), as the puller's hello allows. Version 7: every frame after the
/// handshake is sealed (`session`), and a hello without UCX blobs means every chunk inline.
/// Version 8: a produced directory is listed a page at a time (`NameList` names a cursor).
/// Version 9: a staged chunk is sealed (`Staged` carries its record number and tag).
pub const PROTOCOL_VERSION: u32 = 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// First message each way: who I am and how to reach my memory over UCX.
    Hello {
        protocol: u32,
        node_id: u32,
        #[serde(with = "frame::bytes")]
        worker_address: Vec<u8>,
        #[serde(with = "frame::bytes")]
        rkey: Vec<u8>,
        /// The puller copies in the background (`--replicate`): the holder serves it on
        /// lowest-priority threads, through its background UCX worker if it has one.
        #[serde(default)]
        background: bool,
        /// The puller takes chunks of up to this many bytes inline (`Data`) instead of staged
        /// for an RMA get (0: never).
        #[serde(default)]
        eager_max: u32,
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
    /// The chunk is staged at `addr` in the holder's slab, sealed as staged record `record`
    /// with `tag` (see `session`; empty on `--insecure` connections): get it, open it, then
    /// `Release` it.
    Staged {
        id: u64,
        addr: u64,
        len: u32,
        crc32c: u32,
        record: u64,
        #[serde(with = "frame::bytes")]
        tag: Vec<u8>,
    },
    /// The requester is done with a staged slot.
    Release {
        addr: u64,
    },
    /// The chunk itself: its `len` bytes follow this frame on the stream, raw (a request of at
    /// most the hello's `eager_max` bytes; nothing to get or release).
    Data {
        id: u64,
        len: u32,
        crc32c: u32,
    },
    Error {
        id: u64,
        message: String,
    },
    /// One RPC, either way: a request to the control port's RPC handler, or its reply. The
    /// payload is the handler's business (the locator's `proto`), checked by it.
    Rpc(#[serde(with = "frame::bytes")] Vec<u8>),
    // Authentication with the job secret, first on every connection (see `transport::auth`).
    /// Client: who I am, and a fresh nonce.
    AuthHello {
        protocol: u32,
        node_id: u32,
        #[serde(with = "frame::bytes")]
        nonce: Vec<u8>,
    },
    /// Server: who I am, my fresh nonce, and my MAC over both.
    AuthChallenge {
        node_id: u32,
        #[serde(with = "frame::bytes")]
        nonce: Vec<u8>,
        #[serde(with = "frame::bytes")]
        mac: Vec<u8>,
    },
    /// Client: its MAC over both nonces.
    AuthProof {
        #[serde(with = "frame::bytes")]
        mac: Vec<u8>,
    },
}

/// Encodes one message as a complete plain frame (length prefix included).
pub fn encode(msg: &Message) -> Vec<u8> {
    frame::encode(msg)
}

/// Encodes one message as a frame's body (no length prefix), to be sealed.
pub fn to_body(msg: &Message) -> Vec<u8> {
    frame::to_bytes(msg)
}

/// Decodes a frame body; a Hello of another protocol version is refused.
pub fn decode(body: &[u8]) -> Result<Message, WireError> {
    let msg: Message = frame::from_bytes(body)?;
    if let Message::Hello { protocol, .. } = msg
        && protocol != PROTOCOL_VERSION
    {
        return Err(WireError::Version {
            theirs: protocol,
            ours: PROTOCOL_VERSION,
        });
    }
    Ok(msg)
}

pub use frame::check_len;

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
                eager_max: 256 << 10,
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
                record: 3,
                tag: vec![11; 16],
            },
            Message::Release {
                addr: 0x7f00_dead_0000,
            },
            Message::Data {
                id: 8,
                len: 64 << 10,
                crc32c: 0x1234_5678,
            },
            Message::Error {
                id: 7,
                message: "no such file".into(),
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
            Message::Rpc(vec![0x92, 1, 2]),
        ]
    }

    #[test]
    fn golden_frames() {
        let golden = include_bytes!("../../fixtures/wire/frames-v10.bin");
        let mut all = Vec::new();
        for m in samples() {
            all.extend(encode(&m));
        }
        // After a deliberate protocol change (and version bump), regenerate with
        // DYADFS_REGENERATE_FIXTURES=1 cargo test --lib golden_frames
        if std::env::var_os("DYADFS_REGENERATE_FIXTURES").is_some() {
            std::fs::write(
                concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/wire/frames-v10.bin"),
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
        assert!(matches!(decode(b"\xc1garbage"), Err(WireError::Garbage(_))));
        assert!(matches!(decode(&[]), Err(WireError::Garbage(_))));
        let future = encode(&Message::Hello {
            protocol: 99,
            node_id: 0,
            worker_address: vec![],
            rkey: vec![],
            background: false,
            eager_max: 0,
        });
        assert_eq!(
            decode(&future[4..]),
            Err(WireError::Version {
                theirs: 99,
                ours: PROTOCOL_VERSION
            })
        );
    }
}
