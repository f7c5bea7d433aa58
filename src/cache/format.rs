//! On-disk format of a cache entry's header (a record of the cache's log, [`super::journal`]).
//!
//! The header repeats the entry's identity (path and source version) so a hash collision or a
//! swapped file is caught, records which chunks of the `.dat` file are present with the crc32c
//! of each, and ends with a crc32c of everything before it so a torn or foreign record is
//! rejected. Any change to this layout (or the log's) must bump [`FORMAT_VERSION`]; the
//! golden-bytes test below fails otherwise.
//!
//! Layout (little endian):
//! ```text
//! magic "DYADFSC\0" | format u32 | chunk_size u32 | source size u64 | source mtime_ns i64
//! | path_len u32 | path bytes | n_chunks u32 | n_chunks x (present u8, crc32c u32)
//! | n_partial u32 | n_partial x (chunk u32, pages u128, one crc32c u32 per page set) | crc u32
//! ```
//! Format 1 had no partial chunks (nor their count): a header without them is still written in
//! it, so an older release reads every entry but the partially cached ones (whose records it
//! skips as foreign: those files are fetched again). Format 2 had pages of a 32nd of a chunk
//! (`pages u32`): read, its partial chunks forgotten (their pages are fetched again; a crc32c of
//! a 32nd cannot vouch for the 128ths of format 3).

use super::error::CacheError;
use crate::core::Version;

pub const MAGIC: &[u8; 8] = b"DYADFSC\0";
pub const FORMAT_VERSION: u32 = 3;
/// The format before partial chunks, still read.
pub const FORMAT_V1: u32 = 1;
/// The format of 32 pages per chunk: read, its partial chunks dropped.
pub const FORMAT_V2: u32 = 2;

/// A set of a chunk's pages, a bit each (bit p: page p; see `super::chunks::PAGES`).
pub type PageMask = u128;

/// A chunk as recorded on disk: present with its checksum, or absent.
pub type ChunkRecord = Option<u32>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub chunk_size: u32,
    pub version: Version,
    pub path: String,
    pub chunks: Vec<ChunkRecord>,
    /// The chunks recorded absent above that have some pages present.
    pub partial: Vec<PartialRecord>,
}

/// A chunk with some of its pages present: which (a bit each), and each one's crc32c in page
/// order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialRecord {
    pub chunk: u32,
    pub pages: PageMask,
    pub crcs: Vec<u32>,
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40 + self.path.len() + 5 * self.chunks.len());
        let format = if self.partial.is_empty() {
            FORMAT_V1
        } else {
            FORMAT_VERSION
        };
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&format.to_le_bytes());
        out.extend_from_slice(&self.chunk_size.to_le_bytes());
        out.extend_from_slice(&self.version.size.to_le_bytes());
        out.extend_from_slice(&self.version.mtime_ns.to_le_bytes());
        out.extend_from_slice(&(self.path.len() as u32).to_le_bytes());
        out.extend_from_slice(self.path.as_bytes());
        out.extend_from_slice(&(self.chunks.len() as u32).to_le_bytes());
        for chunk in &self.chunks {
            out.push(chunk.is_some() as u8);
            out.extend_from_slice(&chunk.unwrap_or(0).to_le_bytes());
        }
        if format != FORMAT_V1 {
            out.extend_from_slice(&(self.partial.len() as u32).to_le_bytes());
        }
        for p in &self.partial {
            out.extend_from_slice(&p.chunk.to_le_bytes());
            out.extend_from_slice(&p.pages.to_le_bytes());
            for crc in &p.crcs {
                out.extend_from_slice(&crc.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Header, CacheError> {
        let corrupt = |why: &str| CacheError::Corrupt(why.to_string());
        if bytes.len() < 4 {
            return Err(corrupt("header too short"));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body).to_le_bytes() != crc {
            return Err(corrupt("header checksum mismatch"));
        }
        let mut r = Reader(body);
        if r.take(8)? != MAGIC {
            return Err(corrupt("bad magic"));
        }
        let format = r.u32()?;
        if ![FORMAT_V1, FORMAT_V2, FORMAT_VERSION].contains(&format) {
            return Err(CacheError::Corrupt(format!(
                "unknown format version {format}"
            )));
        }
        let chunk_size = r.u32()?;
        let size = r.u64()?;
        let mtime_ns = r.u64()? as i64;
        let path_len = r.u32()? as usize;
        let path = String::from_utf8(r.take(path_len)?.to_vec()).map_err(|_| corrupt("path"))?;
        let n = r.u32()? as usize;
        let mut chunks = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            let present = r.take(1)?[0];
            let crc = r.u32()?;
            chunks.push(match present {
                0 => None,
                1 => Some(crc),
                _ => return Err(corrupt("bad chunk flag")),
            });
        }
        let mut partial = Vec::new();
        if format != FORMAT_V1 {
            let n = r.u32()? as usize;
            for _ in 0..n {
                let chunk = r.u32()?;
                let pages = match format {
                    FORMAT_V2 => PageMask::from(r.u32()?),
                    _ => u128::from_le_bytes(r.take(16)?.try_into().unwrap()),
                };
                if pages == 0 || chunks.get(chunk as usize) != Some(&None) {
                    return Err(corrupt("bad partial chunk"));
                }
                let crcs = (0..pages.count_ones())
                    .map(|_| r.u32())
                    .collect::<Result<_, _>>()?;
                partial.push(PartialRecord { chunk, pages, crcs });
            }
            if format == FORMAT_V2 {
                partial.clear();
            }
        }
        if !r.0.is_empty() {
            return Err(corrupt("trailing bytes"));
        }
        Ok(Header {
            chunk_size,
            version: Version { size, mtime_ns },
            path,
            chunks,
            partial,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CacheError> {
        if self.0.len() < n {
            return Err(CacheError::Corrupt("header truncated".into()));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, CacheError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, CacheError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            chunk_size: 2 << 20,
            version: Version {
                size: 5 << 20,
                mtime_ns: 1_700_000_000_123_456_789,
            },
            path: "train/x.npz".into(),
            chunks: vec![Some(0xdead_beef), None, Some(7)],
            partial: vec![PartialRecord {
                chunk: 1,
                pages: 1 << 127 | 0b1001,
                crcs: vec![11, 0x0102_0304, 0x0a0b_0c0d],
            }],
        }
    }

    #[test]
    fn golden_bytes() {
        let path = "fixtures/cache/header-v3.bin";
        let golden_file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        if std::env::var_os("DYADFS_REGENERATE_FIXTURES").is_some() {
            std::fs::write(&golden_file, sample().encode()).unwrap();
        }
        let golden = include_bytes!("../../fixtures/cache/header-v3.bin");
        assert_eq!(
            sample().encode(),
            golden.as_slice(),
            "the on-disk cache header changed: bump FORMAT_VERSION and regenerate the fixture"
        );
        assert_eq!(Header::decode(golden).unwrap(), sample());
    }

    /// Format 2 (the release of 32 pages per chunk) is read, its partial chunk forgotten: its
    /// page's checksum covers four of this release's pages.
    #[test]
    fn a_format_2_header_is_read_without_its_partial_chunks() {
        let golden = include_bytes!("../../fixtures/cache/header-v2.bin");
        let mut whole = sample();
        whole.partial.clear();
        assert_eq!(Header::decode(golden).unwrap(), whole);
    }

    /// A header without partial chunks is format 1's, byte for byte: the release before partial
    /// chunks reads it, and this one reads what that release wrote.
    #[test]
    fn a_header_without_partial_chunks_is_format_1() {
        let golden = include_bytes!("../../fixtures/cache/header-v1.bin");
        let mut whole = sample();
        whole.partial.clear();
        assert_eq!(whole.encode(), golden.as_slice());
        assert_eq!(Header::decode(golden).unwrap(), whole);
    }

    #[test]
    fn rejects_any_flipped_byte_and_truncation() {
        let bytes = sample().encode();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(Header::decode(&bad).is_err(), "flip at {i} accepted");
        }
        for n in 0..bytes.len() {
            assert!(
                Header::decode(&bytes[..n]).is_err(),
                "truncation to {n} accepted"
            );
        }
    }
}
