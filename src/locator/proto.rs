//! The locator's messages: what members, rack homes, global homes and name homes ask and answer
//! one another. Each travels as the payload of one transport RPC (`transport::wire::Message::Rpc`),
//! MessagePack-encoded like the frames around it. Pure types and byte functions; golden bytes
//! in `fixtures/wire/` pin the encoding. Nothing decoded here is trusted before
//! [`super::check`] accepts it.

use serde::{Deserialize, Serialize};

use super::tiers::Reply;
use crate::core::names::Name;
use crate::core::{NodeId, Version};
use crate::transport::frame::{self, WireError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Msg {
    /// A member missed a file: asked of its rack home (`global: false`) or, by a rack home, of
    /// the global home (`global: true`).
    Lookup {
        path: String,
        version: Version,
        requester: NodeId,
        global: bool,
    },
    /// The answer to a lookup.
    Located(Reply),
    /// A node completed a copy (`held: true`) or dropped it, told to its rack home.
    Publish {
        path: String,
        version: Version,
        node: NodeId,
        held: bool,
    },
    /// A rack home tells the global home its rack gained its first copy or lost its last.
    RackChanged {
        path: String,
        version: Version,
        rack: String,
        node: NodeId,
        held: bool,
    },
    /// A designated fetcher could not read the backing store.
    FetchFailed {
        path: String,
        version: Version,
        node: NodeId,
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
    /// A page of a directory's names, in order: those after `after` (the last name of the
    /// page before; `None` from the first).
    NameList {
        dir: String,
        after: Option<String>,
    },
    /// The answer to `NameList`: entries encoding to at most [`super::pages::PAGE_BYTES`], and
    /// whether more follow the last (then ask again after it).
    Names {
        names: Vec<(String, Name)>,
        more: bool,
    },
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
    Batch(Vec<Msg>),
    /// From a node that has (re)started with empty tables: peers re-announce what those tables
    /// held (their copies it is rack home of, their racks' copies it is global home of), then
    /// answer `Ack`.
    Rejoined {
        node: NodeId,
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
        copies: Vec<(String, Version, NodeId)>,
    },
    /// The answer to a message the addressee refused (it failed [`super::check`]).
    Refused(String),
    /// A name home keeps a copy of each name at the next node in the directory's rendezvous
    /// order (which becomes its home if this one dies), and gives it back to a home that
    /// restarted: store it, forward nothing.
    NameReplica {
        dir: String,
        name: String,
        entry: Option<Name>,
    },
    /// To a holder: the chunk at `offset` it served failed its checksum at the puller (it
    /// rotted on the holder's disk after it was checked): check it again, drop it if bad.
    BadChunk {
        path: String,
        version: Version,
        offset: u64,
    },
    /// `dyadfs status`: how many complete files (and bytes) the addressee's cache holds.
    CountHeld,
    /// The answer to `CountHeld`.
    Held {
        files: u64,
        bytes: u64,
    },
    /// From a holder sweeping the objects it keeps: the objects of `holder` the addressee's
    /// names point at (of its directories and the copies it keeps), in order, after `after`.
    ObjectsNamed {
        holder: NodeId,
        after: Option<String>,
    },
    /// The answer to `ObjectsNamed`: a page, and whether more follow.
    Objects {
        objects: Vec<String>,
        more: bool,
    },
    /// From `node`, whose readers wait for these names (of directories the addressee is name
    /// home of): tell it when each is published, for up to `wait_ms`. Answered at once by a
    /// `NamesAre` of those published already (see `locator::watching`).
    NameWatch {
        node: NodeId,
        names: Vec<(String, String)>,
        wait_ms: u64,
    },
    /// Names published: the answer to `NameWatch`, and a name home's word to a watching node
    /// (answered `Ack`).
    NamesAre(Vec<(String, String, Name)>),
    /// To a holder of `path` at `version` (a large file, perhaps held only in part): which
    /// pages of it it has, for the window of [`PAGE_MAP_WORDS`] words holding byte `offset`.
    PagesOf {
        path: String,
        version: Version,
        offset: u64,
    },
    /// The answer to `PagesOf`: `None` if the addressee holds no copy.
    PagesAre(Option<PageMap>),
}

/// Words of 32 pages one [`PageMap`] covers: 16 KiB of masks, 2 GiB of a file at 16 KiB pages.
pub const PAGE_MAP_WORDS: u64 = 4096;

/// Which pages of a copy its holder has: for words `first..first + masks.len()` of 32 pages of
/// `page` bytes each (word w: pages 32w..32w + 32), a bit per present page. Holders may use
/// other page and chunk sizes than their pullers: the map says where its pages lie. `fills`: the holder is the file's designated
/// fetcher, which fills what a peer asks that it lacks (from the shared file system, once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageMap {
    pub page: u64,
    pub first: u64,
    pub masks: Vec<u32>,
    pub fills: bool,
}

impl PageMap {
    /// The first word of the window `PagesOf` at `offset` is answered with, for pages of
    /// `page` bytes.
    pub fn window(offset: u64, page: u64) -> u64 {
        offset / (page * 32) / PAGE_MAP_WORDS * PAGE_MAP_WORDS
    }

    /// Whether every page bytes `[offset, end)` touch is present; `None` if some lie outside
    /// the map's window (then the map says nothing about them).
    pub fn covers(&self, offset: u64, end: u64) -> Option<bool> {
        if end <= offset {
            return Some(true);
        }
        for p in offset / self.page..=(end - 1) / self.page {
            let word = (p / 32).checked_sub(self.first)?;
            let mask = *self.masks.get(usize::try_from(word).ok()?)?;
            if mask & (1 << (p % 32)) == 0 {
                return Some(false);
            }
        }
        Some(true)
    }
}

impl Msg {
    /// The message's kind, for traces.
    pub fn kind(&self) -> &'static str {
        match self {
            Msg::Lookup { .. } => "Lookup",
            Msg::Located(_) => "Located",
            Msg::Publish { .. } => "Publish",
            Msg::RackChanged { .. } => "RackChanged",
            Msg::FetchFailed { .. } => "FetchFailed",
            Msg::Ack => "Ack",
            Msg::NameGet { .. } => "NameGet",
            Msg::NameIs(_) => "NameIs",
            Msg::NameList { .. } => "NameList",
            Msg::Names { .. } => "Names",
            Msg::NameSet { .. } => "NameSet",
            Msg::Unhold { .. } => "Unhold",
            Msg::Batch(_) => "Batch",
            Msg::Rejoined { .. } => "Rejoined",
            Msg::Gained { .. } => "Gained",
            Msg::GainedList { .. } => "GainedList",
            Msg::Refused(_) => "Refused",
            Msg::NameReplica { .. } => "NameReplica",
            Msg::BadChunk { .. } => "BadChunk",
            Msg::CountHeld => "CountHeld",
            Msg::Held { .. } => "Held",
            Msg::ObjectsNamed { .. } => "ObjectsNamed",
            Msg::Objects { .. } => "Objects",
            Msg::NameWatch { .. } => "NameWatch",
            Msg::NamesAre(_) => "NamesAre",
            Msg::PagesOf { .. } => "PagesOf",
            Msg::PagesAre(_) => "PagesAre",
        }
    }
}

/// A message as an RPC payload.
pub fn encode(msg: &Msg) -> Vec<u8> {
    frame::to_bytes(msg)
}

/// An RPC payload as a message.
pub fn decode(payload: &[u8]) -> Result<Msg, WireError> {
    frame::from_bytes(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Msg> {
        let v = Version {
            size: 5 << 30,
            mtime_ns: 1_700_000_000_123_456_789,
        };
        vec![
            Msg::Lookup {
                path: "train/x.npz".into(),
                version: v,
                requester: 3,
                global: true,
            },
            Msg::Located(Reply::Holders(vec![1, 2])),
            Msg::Located(Reply::WaitFor(4)),
            Msg::Batch(vec![
                Msg::Publish {
                    path: "a".into(),
                    version: v,
                    node: 1,
                    held: true,
                },
                Msg::Ack,
            ]),
            Msg::Gained { after: 3, max: 512 },
            Msg::GainedList {
                next: 4,
                copies: vec![("train/x.npz".into(), v, 3)],
            },
            Msg::NameIs(Some(Name {
                dir: false,
                object: "//produced/1/5-2".into(),
                size: 10,
                mtime_ns: 11,
                mode: 0o640,
                holder: 1,
                uid: 1000,
                gid: 100,
                meta: Default::default(),
            })),
            Msg::NameSet {
                dir: "out".into(),
                name: "latest".into(),
                entry: Some(Name {
                    mtime_ns: 12,
                    mode: 0o777,
                    holder: 2,
                    meta: crate::core::names::NameMeta {
                        special: libc::S_IFLNK,
                        target: "step_1000".into(),
                        atime_ns: Some(-1),
                        ctime_ns: Some(13),
                        ..Default::default()
                    },
                    ..Default::default()
                }),
            },
            Msg::NameSet {
                dir: "out".into(),
                name: "hard".into(),
                entry: Some(Name::pointer("2-5-7", 2)),
            },
            Msg::NameList {
                dir: "out".into(),
                after: Some("step_999".into()),
            },
            Msg::Names {
                names: vec![("step_1000".into(), Name::pointer("2-5-7", 2))],
                more: true,
            },
            Msg::ObjectsNamed {
                holder: 2,
                after: Some("//produced/2/5-1".into()),
            },
            Msg::Objects {
                objects: vec!["//produced/2/5-2".into()],
                more: false,
            },
            Msg::CountHeld,
            Msg::Held {
                files: 3,
                bytes: 4 << 30,
            },
            Msg::Refused("no".into()),
            Msg::NameWatch {
                node: 3,
                names: vec![("out".into(), "step_1001".into())],
                wait_ms: 60_000,
            },
            Msg::NamesAre(vec![(
                "out".into(),
                "step_1001".into(),
                Name::pointer("2-5-8", 2),
            )]),
            Msg::PagesOf {
                path: "train/big.h5".into(),
                version: v,
                offset: 3 << 20,
            },
            Msg::PagesAre(Some(PageMap {
                page: 64 << 10,
                first: 0,
                masks: vec![0, 6, u32::MAX],
                fills: true,
            })),
            Msg::PagesAre(None),
        ]
    }

    #[test]
    fn a_page_map_covers_only_its_present_pages_in_its_window() {
        let page = 64 << 10;
        let map = PageMap {
            page,
            first: 1,
            masks: vec![0b110, u32::MAX],
            fills: false,
        };
        let chunk = 32 * page;
        // Pages 1 and 2 of chunk 1, and all of chunk 2.
        assert_eq!(map.covers(chunk + page, chunk + 3 * page), Some(true));
        assert_eq!(
            map.covers(chunk + page + 5, chunk + 2 * page + 1),
            Some(true)
        );
        assert_eq!(map.covers(chunk, chunk + page), Some(false));
        assert_eq!(
            map.covers(chunk + 2 * page, chunk + 3 * page + 1),
            Some(false)
        );
        assert_eq!(map.covers(2 * chunk, 3 * chunk), Some(true));
        // Outside the window: chunk 0, chunk 3.
        assert_eq!(map.covers(0, 1), None);
        assert_eq!(map.covers(3 * chunk - 1, 3 * chunk + 1), None);
        assert_eq!(PageMap::window(5 * chunk, page), 0);
        assert_eq!(PageMap::window(4097 * chunk, page), 4096);
    }

    #[test]
    fn golden_payloads() {
        const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/wire/locator-v10.bin");
        let all: Vec<u8> = samples().iter().flat_map(frame::encode).collect();
        // After a deliberate change (and a protocol version bump), regenerate with
        // DYADFS_REGENERATE_FIXTURES=1 cargo test --lib golden
        if std::env::var_os("DYADFS_REGENERATE_FIXTURES").is_some() {
            std::fs::write(PATH, &all).unwrap();
            return;
        }
        let golden = std::fs::read(PATH).unwrap();
        assert_eq!(
            all, golden,
            "the locator's encoding changed: bump PROTOCOL_VERSION and regenerate fixtures/wire"
        );
        let mut rest = golden.as_slice();
        for m in samples() {
            let len = frame::check_len(rest[..4].try_into().unwrap()).unwrap();
            assert_eq!(decode(&rest[4..4 + len]).unwrap(), m);
            rest = &rest[4 + len..];
        }
        assert!(rest.is_empty());
    }
}
