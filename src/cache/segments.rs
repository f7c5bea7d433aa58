//! Packed segments: a cached object of at most `--pack-max` bytes (one chunk) gets no data file
//! of its own but a region of a large preallocated segment file, `<ssd>/segments/<id>.seg`,
//! appended to in order. Caching a training sample then costs one `pwrite` into blocks that
//! exist already: no create, no inode, no directory entry, no close, no unlink at eviction
//! (per pulled 256 KiB file those were a third of the puller's CPU, `perf` of
//! `scripts/bench_small_pull.sh`).
//!
//! Where an object lives is its entry's id ([`Place::id`]): segments are numbered up and only
//! ever appended to, so a (segment, page) pair is never reused in a cache's lifetime and is as
//! unique as the ids of entries with a file of their own, which count up from 1 (bit 63 tells
//! them apart). The entry keeps its size (a million entries held at once) and its records in
//! the journal carry the place ([`super::journal::Record::Packed`]).
//!
//! Crash safety is the checksums': the journal records an object after its bytes were written,
//! and a chunk recorded but torn (its bytes never reached the disk) fails its crc32c when first
//! served and is fetched again. Regions a crash left unrecorded are dead space, given back with
//! their segment.
//!
//! Space: the capacity counts an object's bytes while it lives and after it was dropped, until
//! its whole segment is freed: the last object of a segment that takes no more appends to leave
//! the cache deletes the file. Eviction works by segment (see `capacity.rs`): the least recently
//! used segment nobody holds goes whole.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::files::{DataFiles, Mode, create_fresh, private_file};
use crate::core::sync::lock;

/// Bit 63 of an entry's id: the entry is packed, the rest of the id is its [`Place`].
const PACKED: u64 = 1 << 63;
/// Objects start on page boundaries: O_DIRECT reads of them stay aligned.
pub const PAGE: u64 = 4096;
/// The largest segment; smaller caches get segments of a 32nd of their capacity, so that
/// eviction by segment stays fine-grained.
pub const SEGMENT_MAX: u64 = 256 << 20;

/// Where a packed object's bytes start: a segment and a page in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Place {
    pub segment: u32,
    pub page: u32,
}

impl Place {
    /// The id of the entry living here (unique for the cache's lifetime, see the module's doc).
    pub(super) fn id(self) -> u64 {
        PACKED | (u64::from(self.segment & 0x7fff_ffff) << 32) | u64::from(self.page)
    }

    /// The place of the entry of id `id`, if packed.
    pub(super) fn of(id: u64) -> Option<Place> {
        (id & PACKED != 0).then_some(Place {
            segment: (id >> 32) as u32 & 0x7fff_ffff,
            page: id as u32,
        })
    }

    /// The byte offset of the object in its segment.
    pub fn offset(self) -> u64 {
        u64::from(self.page) * PAGE
    }

    /// The key of its segment's open files in [`DataFiles`] (no entry has this id: a page this
    /// far into a segment is never allocated).
    fn file_key(self) -> u64 {
        Place {
            segment: self.segment,
            page: u32::MAX,
        }
        .id()
    }
}

/// The segments of one cache and the accounting of their space.
pub struct Segments {
    dir: PathBuf,
    /// Bytes a segment file holds (preallocated at its creation).
    size: u64,
    /// Objects of at most this many bytes are packed (0: none).
    max: AtomicU64,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next: u32,
    /// The segment appends go to.
    open: Option<u32>,
    segs: HashMap<u32, Segment>,
}

#[derive(Default, Debug)]
struct Segment {
    /// Bytes allocated from its start.
    tail: u64,
    /// Objects living in it.
    live: u32,
    /// Bytes the capacity counts for objects that left it (given back with the segment).
    dead: u64,
    /// Bytes of the regions of its reloaded objects (a reload's count of dead space).
    reloaded: u64,
}

impl Segments {
    /// Segments under `dir` of `size` bytes (rounded up to pages) packing objects of at most
    /// `max` bytes; the directory is made if packing is on.
    pub(super) fn new(dir: PathBuf, size: u64, max: u64) -> io::Result<Segments> {
        if max > 0 {
            fs::create_dir_all(&dir)?;
        }
        Ok(Segments {
            dir,
            size: size.max(max).next_multiple_of(PAGE).max(PAGE),
            max: AtomicU64::new(max),
            table: Mutex::new(Table::default()),
        })
    }

    /// Packs objects of at most `max` bytes from now on (0: none; never more than a segment
    /// holds); the objects packed so far stay where they are.
    pub(super) fn set_max(&self, max: u64) {
        self.max.store(max.min(self.size), Ordering::Relaxed);
    }

    /// The size of a cache of `capacity` bytes' segments.
    pub(super) fn size_for(capacity: u64) -> u64 {
        (capacity / 32).min(SEGMENT_MAX)
    }

    /// Whether an object of `size` bytes is packed.
    pub(super) fn packs(&self, size: u64) -> bool {
        size > 0 && size <= self.max.load(Ordering::Relaxed)
    }

    pub(super) fn path(&self, segment: u32) -> PathBuf {
        self.dir.join(format!("{segment:08x}.seg"))
    }

    /// The segment file of `place`, opened as `mode` (kept open in `files` while idle).
    pub(super) fn file(
        &self,
        files: &DataFiles,
        place: Place,
        mode: Mode,
    ) -> io::Result<Arc<File>> {
        let key = place.file_key();
        if let Some(f) = files.cached(key, mode) {
            return Ok(f);
        }
        files.open(key, &self.path(place.segment), mode)
    }

    /// A region of `len` bytes for a new object: in the open segment, or in a new one
    /// (created and preallocated here; a failure to make it is the caller's to report).
    pub(super) fn alloc(&self, files: &DataFiles, len: u64) -> io::Result<(Place, u64)> {
        let need = len.next_multiple_of(PAGE).max(PAGE);
        let mut t = lock(&self.table);
        let mut freed = 0;
        if let Some(id) = t.open {
            let seg = &t.segs[&id];
            if seg.tail + need <= self.size {
                let page = (seg.tail / PAGE) as u32;
                let seg = t.segs.get_mut(&id).expect("open");
                seg.tail += need;
                seg.live += 1;
                return Ok((Place { segment: id, page }, 0));
            }
            // Full: appends go to a new segment; this one goes once its last object does.
            t.open = None;
            freed = self.free_if_empty(&mut t, files, id);
        }
        let id = t.next;
        let file = self.create(id)?;
        t.next += 1;
        files.insert(
            Place {
                segment: id,
                page: 0,
            }
            .file_key(),
            Mode::ReadWrite,
            file,
        );
        t.segs.insert(
            id,
            Segment {
                tail: need,
                live: 1,
                ..Segment::default()
            },
        );
        t.open = Some(id);
        Ok((
            Place {
                segment: id,
                page: 0,
            },
            freed,
        ))
    }

    /// A new segment file of `size` bytes, its blocks allocated now (so appends allocate none).
    fn create(&self, id: u32) -> io::Result<File> {
        let path = self.path(id);
        // (A leftover of another run no journal record names is unlinked first.)
        let file = create_fresh(&path, || private_file(&path))?;
        if let Err(e) = crate::sys::preallocate(&file, self.size) {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        Ok(file)
    }

    /// An object at `place` holding `bytes` (counted by the capacity) left the cache; returns
    /// the bytes to give back now (its segment's, if it was the last object of a segment that
    /// takes no more appends, whose file is then deleted).
    pub(super) fn dropped(&self, files: &DataFiles, place: Place, bytes: u64) -> u64 {
        let mut t = lock(&self.table);
        let Some(seg) = t.segs.get_mut(&place.segment) else {
            return bytes;
        };
        seg.live = seg.live.saturating_sub(1);
        seg.dead += bytes;
        if t.open == Some(place.segment) {
            return 0;
        }
        self.free_if_empty(&mut t, files, place.segment)
    }

    /// Takes segment `id` out of appends (eviction empties it next).
    pub(super) fn seal(&self, id: u32) {
        let mut t = lock(&self.table);
        if t.open == Some(id) {
            t.open = None;
        }
    }

    /// Deletes segment `id` if no object lives in it; the bytes the capacity counted for it.
    fn free_if_empty(&self, t: &mut Table, files: &DataFiles, id: u32) -> u64 {
        if t.segs.get(&id).is_none_or(|s| s.live > 0) {
            return 0;
        }
        let seg = t.segs.remove(&id).expect("checked");
        files.close(
            Place {
                segment: id,
                page: 0,
            }
            .file_key(),
        );
        let _ = fs::remove_file(self.path(id));
        seg.dead
    }

    /// Records an object reloaded from the journal at `place`, of `len` bytes.
    pub(super) fn reloaded(&self, place: Place, len: u64) {
        let mut t = lock(&self.table);
        t.next = t.next.max(place.segment + 1);
        let seg = t.segs.entry(place.segment).or_default();
        let region = len.next_multiple_of(PAGE).max(PAGE);
        seg.live += 1;
        seg.reloaded += region;
        seg.tail = seg.tail.max(place.offset() + region);
    }

    /// After every object is reloaded: the regions between them belong to objects that left
    /// before the restart (or were never recorded), counted as dead until their segment goes;
    /// returns their bytes.
    pub(super) fn count_dead(&self) -> u64 {
        let mut t = lock(&self.table);
        t.segs
            .values_mut()
            .map(|seg| {
                seg.dead = seg.tail.saturating_sub(seg.reloaded);
                seg.dead
            })
            .sum()
    }

    /// The reloaded segments whose file is missing or shorter than what lives in it (changed
    /// behind the cache): their objects are not loaded.
    pub(super) fn unusable(&self) -> Vec<u32> {
        let t = lock(&self.table);
        t.segs
            .iter()
            .filter(|(id, seg)| fs::metadata(self.path(**id)).map_or(true, |m| m.len() < seg.tail))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Forgets segments (see [`Segments::unusable`]).
    pub(super) fn forget(&self, ids: &[u32]) {
        let mut t = lock(&self.table);
        for id in ids {
            t.segs.remove(id);
        }
    }

    /// Deletes segment files no object lives in (a crash's, or those of dropped objects after
    /// a restart); returns how many.
    pub(super) fn sweep(&self) -> io::Result<u64> {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return Ok(0);
        };
        let mut removed = 0;
        for file in dir {
            let file = file?.path();
            let name = file.file_name().unwrap_or_default().to_string_lossy();
            let id = name
                .strip_suffix(".seg")
                .and_then(|hex| u32::from_str_radix(hex, 16).ok())
                .filter(|id| self.path(*id) == file);
            let t = lock(&self.table);
            if id.is_none_or(|id| !t.segs.contains_key(&id)) {
                let _ = fs::remove_file(&file);
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// (segments, bytes of their files).
    pub(super) fn count(&self) -> (u64, u64) {
        let t = lock(&self.table);
        (t.segs.len() as u64, t.segs.len() as u64 * self.size)
    }

    /// The segment appends go to.
    #[cfg(test)]
    pub(super) fn open_segment(&self) -> Option<u32> {
        lock(&self.table).open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_ids_and_back() {
        for p in [
            Place {
                segment: 0,
                page: 0,
            },
            Place {
                segment: 7,
                page: 65_535,
            },
            Place {
                segment: 0x7fff_ffff,
                page: u32::MAX - 1,
            },
        ] {
            assert_eq!(Place::of(p.id()), Some(p));
            assert_ne!(p.id(), p.file_key());
        }
        // Ids of entries with a file of their own are not places.
        assert_eq!(Place::of(1), None);
        assert_eq!(Place::of(u64::MAX >> 1), None);
    }
}
