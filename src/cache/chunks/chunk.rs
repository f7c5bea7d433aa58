//! One chunk's state (`Chunk`), and a file's list of them (`Chunks`) with the page tables of
//! its partial ones.

use std::collections::HashMap;
use std::sync::Arc;

use super::pages::{PageTables, Pages};
use crate::cache::format::PartialRecord;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::cache) enum Chunk {
    Absent,
    Filling,
    Present {
        crc: u32,
        verified: bool,
    },
    /// Some of its pages present or being filled: which, in the chunks' page table.
    Partial,
}

/// An entry's chunks: most training samples are one chunk, kept inline (a million cached files
/// should not mean a million extra allocations). Only a file of several chunks has pages.
pub(in crate::cache) enum Chunks {
    One([Chunk; 1]),
    Many(Box<ManyChunks>),
}

pub(in crate::cache) struct ManyChunks {
    chunks: Box<[Chunk]>,
    /// The pages of its `Partial` chunks, by chunk.
    pages: HashMap<u32, Pages>,
    /// Where its page tables are counted (`None` until it joins a cache's entry).
    tables: Option<Arc<PageTables>>,
    /// The data file's ctime print when its pages were last checked (0: none yet), for as
    /// long as the file is partly cached (see `Entry::guard_partial`).
    print: u32,
}

impl Drop for ManyChunks {
    fn drop(&mut self) {
        if let Some(t) = &self.tables {
            t.sub(self.pages.len() as u64);
        }
    }
}

impl From<Vec<Chunk>> for Chunks {
    fn from(v: Vec<Chunk>) -> Chunks {
        match v[..] {
            [one] => Chunks::One([one]),
            _ => Chunks::Many(Box::new(ManyChunks {
                chunks: v.into_boxed_slice(),
                pages: HashMap::new(),
                tables: None,
                print: 0,
            })),
        }
    }
}

impl Chunks {
    /// The print of a partly cached file's pages (`None` for a one-chunk file, never partial).
    pub(in crate::cache) fn print_mut(&mut self) -> Option<&mut u32> {
        match self {
            Chunks::One(_) => None,
            Chunks::Many(m) => Some(&mut m.print),
        }
    }

    /// Marks every present chunk and page unverified: each is checked again before it is
    /// next served.
    pub(in crate::cache) fn unverify(&mut self) {
        for c in self.iter_mut() {
            if let Chunk::Present { crc, .. } = *c {
                *c = Chunk::Present {
                    crc,
                    verified: false,
                };
            }
        }
        if let Chunks::Many(m) = self {
            for p in m.pages.values_mut() {
                p.verified = 0;
            }
        }
    }

    /// The page table (empty for a one-chunk file).
    pub(in crate::cache) fn pages(&self) -> Option<&HashMap<u32, Pages>> {
        match self {
            Chunks::One(_) => None,
            Chunks::Many(m) => Some(&m.pages),
        }
    }

    /// The pages of chunk `idx`, if it has any.
    pub(in crate::cache) fn page_set(&self, idx: u64) -> Option<&Pages> {
        self.pages()?.get(&(idx as u32))
    }

    /// The pages of chunk `idx`, made absent if it had none (`None` for a one-chunk file).
    pub(in crate::cache) fn pages_mut(&mut self, idx: u64) -> Option<&mut Pages> {
        match self {
            Chunks::One(_) => None,
            Chunks::Many(m) => {
                let ManyChunks { pages, tables, .. } = &mut **m;
                Some(pages.entry(idx as u32).or_insert_with(|| {
                    if let Some(t) = tables {
                        t.add(1);
                    }
                    Pages::default()
                }))
            }
        }
    }

    /// Forgets the pages of chunk `idx` (it is absent, being filled whole, or present whole).
    pub(in crate::cache) fn drop_pages(&mut self, idx: u64) {
        if let Chunks::Many(m) = self
            && m.pages.remove(&(idx as u32)).is_some()
            && let Some(t) = &m.tables
        {
            t.sub(1);
        }
    }

    /// Counts its page tables, now and as they come and go, in `tables`.
    pub(in crate::cache) fn counted_in(mut self, tables: &Arc<PageTables>) -> Chunks {
        if let Chunks::Many(m) = &mut self {
            tables.add(m.pages.len() as u64);
            m.tables = Some(tables.clone());
        }
        self
    }

    /// Whether an absent chunk may be filled page by page: never a one-chunk file's (files
    /// that small are fetched whole), and a cache's page tables are bounded ([`PageTables`]).
    pub(super) fn may_take_pages(&self) -> bool {
        match self {
            Chunks::One(_) => false,
            Chunks::Many(m) => m.tables.as_ref().is_none_or(|t| t.room()),
        }
    }

    /// The present pages of its partial chunks, as the log records them.
    pub(in crate::cache) fn partial_records(&self) -> Vec<PartialRecord> {
        let Some(pages) = self.pages() else {
            return Vec::new();
        };
        let mut out: Vec<PartialRecord> = pages
            .iter()
            .filter(|(_, p)| p.present != 0)
            .map(|(&chunk, p)| PartialRecord {
                chunk,
                pages: p.present,
                crcs: p.crcs.to_vec(),
            })
            .collect();
        out.sort_by_key(|r| r.chunk);
        out
    }

    /// `chunks` with the logged pages of its partial ones (present, not yet verified).
    pub(in crate::cache) fn with_partial(mut chunks: Chunks, partial: &[PartialRecord]) -> Chunks {
        for r in partial {
            let idx = u64::from(r.chunk);
            let Some(p) = chunks.pages_mut(idx) else {
                continue;
            };
            p.restore(r.pages, &r.crcs);
            chunks[idx as usize] = Chunk::Partial;
        }
        chunks
    }

    /// Every chunk absent, no page anywhere.
    pub(in crate::cache) fn clear(&mut self) {
        if let Chunks::Many(m) = self {
            if let Some(t) = &m.tables {
                t.sub(m.pages.len() as u64);
            }
            m.pages.clear();
        }
        self.fill(Chunk::Absent);
    }
}

impl std::ops::Deref for Chunks {
    type Target = [Chunk];
    fn deref(&self) -> &[Chunk] {
        match self {
            Chunks::One(c) => c,
            Chunks::Many(m) => &m.chunks,
        }
    }
}

impl std::ops::DerefMut for Chunks {
    fn deref_mut(&mut self) -> &mut [Chunk] {
        match self {
            Chunks::One(c) => c,
            Chunks::Many(m) => &mut m.chunks,
        }
    }
}
