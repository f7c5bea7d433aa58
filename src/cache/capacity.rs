//! The capacity: how many bytes the cache may hold, room reserved for what fills write,
//! eviction of the least recently used files nobody holds, and room given back.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::entry::Entry;
use super::events::Events;
use super::index::{Index, Slots};
use super::shared::Shared;
use super::write_errors::WriteErrors;
use crate::stats::Stats;

/// In a cache of more than [`SCAN_CHEAP`] entries, eviction frees this fraction of the capacity
/// beyond what a reservation needs: the scan for victims visits every entry, so with millions
/// of entries it must not run for every new file.
const EVICT_SLACK_DIVISOR: u64 = 64;
const SCAN_CHEAP: usize = 4096;
/// The least [`Room::make_room`] frees.
const MAKE_ROOM_MIN: u64 = 64 << 20;

/// The cache's capacity and its eviction.
pub(super) struct Room {
    /// Bytes the cache may hold (present chunks and reservations: `Shared::used`); changed by
    /// [`Room::set_capacity`] (the node service shares its disk among datasets).
    capacity: AtomicU64,
    shared: Arc<Shared>,
    stats: Arc<Stats>,
}

impl Room {
    pub(super) fn new(capacity: u64, shared: Arc<Shared>, stats: Arc<Stats>) -> Room {
        Room {
            capacity: AtomicU64::new(capacity),
            shared,
            stats,
        }
    }

    /// The capacity of a cache in `dir` given none (`--capacity` left out), with `used` bytes
    /// loaded: what keeps 10% of its file system free. A small one is told in the log: most
    /// reads may then go to the shared file system.
    pub(super) fn unset(dir: &Path, used: u64) -> io::Result<u64> {
        let (total, avail) = fs_space(dir)?;
        let c = (avail + used).saturating_sub(total / 10);
        if c < (total / 100).max(1 << 30) {
            // Every read would then go uncached to the shared file system: say why, and which:
            // a disk mostly full, or one that is small (10% kept free).
            let why = if avail + used < total / 2 {
                "is over half full"
            } else {
                "is small"
            };
            tracing::warn!(
                capacity = c,
                free = avail,
                size = total,
                "the cache file system ({total} bytes, {avail} free) {why}: the cache gets {c} \
                 bytes, keeping 10% of the disk free (give --capacity to choose), so most reads \
                 may go to the shared file system"
            );
        }
        Ok(c)
    }

    pub(super) fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Makes the capacity `bytes`, evicting what is over it now (what is held or being filled
    /// stays, and goes at a later fill's eviction).
    pub(super) fn set_capacity(
        &self,
        index: &Index,
        bytes: u64,
        events: &Events,
        writes: &WriteErrors,
    ) {
        self.capacity.store(bytes, Ordering::Relaxed);
        if self.shared.used.load(Ordering::Relaxed) > bytes {
            let mut slots = index.lock();
            self.evict_down_to(&mut slots, bytes, None, |victim| {
                index.drop_entry(victim, events, writes)
            });
        }
    }

    /// Reserves room for `bytes` of new chunks of `for_entry`, evicting least recently used
    /// entries of `index` that are not open and not being filled (telling `events` and
    /// `writes` as they leave). `false`: nothing more can be evicted, the caller serves the
    /// read uncached.
    pub(super) fn reserve(
        &self,
        index: &Index,
        for_entry: &Entry,
        bytes: u64,
        events: &Events,
        writes: &WriteErrors,
    ) -> bool {
        let capacity = self.capacity();
        if bytes > capacity {
            return false;
        }
        let mut slots = index.lock();
        if self.take(bytes) {
            return true;
        }
        // In a large cache, free a little more than needed, so the next fills need no scan.
        let slack = if slots.len() > SCAN_CHEAP {
            capacity / EVICT_SLACK_DIVISOR
        } else {
            0
        };
        let target = capacity.saturating_sub(bytes + slack);
        self.evict_down_to(&mut slots, target, Some(for_entry), |victim| {
            index.drop_entry(victim, events, writes)
        });
        self.take(bytes)
    }

    /// Counts `bytes` as used if the capacity has room for them.
    fn take(&self, bytes: u64) -> bool {
        let used = &self.shared.used;
        if used.load(Ordering::Relaxed) + bytes <= self.capacity() {
            used.fetch_add(bytes, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Evicts cached files to free at least `bytes` of the cache's file system for something
    /// the capacity does not count (a file being written, which found the disk full); whether
    /// anything was evicted. Frees at least [`MAKE_ROOM_MIN`] at a time: every write of the
    /// producer would come back for more.
    pub(super) fn make_room(
        &self,
        index: &Index,
        bytes: u64,
        events: &Events,
        writes: &WriteErrors,
    ) -> bool {
        let mut slots = index.lock();
        let used = self.shared.used.load(Ordering::Relaxed);
        let target = used.saturating_sub(bytes.max(MAKE_ROOM_MIN));
        self.evict_down_to(&mut slots, target, None, |victim| {
            index.drop_entry(victim, events, writes)
        }) > 0
    }

    /// Evicts least recently used entries, never `sparing`, nor entries that are open, kept or
    /// being filled, until the cache holds at most `target` bytes; how many it evicted (each
    /// taken out of `slots` and handed to `leave`). Packed objects go by segment (see
    /// [`super::segments`]): a segment is as old as its most recently used object, and goes
    /// whole (its objects dropped) unless one of them may not.
    fn evict_down_to(
        &self,
        slots: &mut Slots,
        target: u64,
        sparing: Option<&Entry>,
        mut leave: impl FnMut(&Entry),
    ) -> usize {
        let now = self.shared.tick.load(Ordering::Relaxed);
        let spared = |e: &Arc<Entry>| sparing.is_some_and(|s| std::ptr::eq(e.as_ref(), s));
        let held = |e: &Arc<Entry>| e.pinned() || e.kept() || spared(e);
        let mut victims: Vec<(u32, Victim)> = Vec::new();
        // segment -> (its age, its objects, whether one may not go)
        let mut segments: HashMap<u32, (u32, Vec<Arc<Entry>>, bool)> = HashMap::new();
        for e in slots.entries() {
            let filling = {
                let st = e.state.lock();
                (0..st.chunks.len()).any(|i| st.filling(i))
            };
            match e.place() {
                Some(place) => {
                    let seg =
                        segments
                            .entry(place.segment)
                            .or_insert((u32::MAX, Vec::new(), false));
                    seg.0 = seg.0.min(e.age(now));
                    seg.1.push(e.clone());
                    seg.2 |= held(e) || filling;
                }
                None => {
                    if !held(e) && !filling && e.state.lock().present_bytes > 0 {
                        victims.push((e.age(now), Victim::File(e.clone())));
                    }
                }
            }
        }
        victims.extend(
            segments
                .into_iter()
                .filter(|(_, (_, _, blocked))| !blocked)
                .map(|(id, (age, entries, _))| (age, Victim::Segment(id, entries))),
        );
        // The least recently used first.
        victims.sort_unstable_by_key(|(age, _)| std::cmp::Reverse(*age));
        let mut evicted = 0;
        for (_, victim) in victims {
            if self.shared.used.load(Ordering::Relaxed) <= target {
                break;
            }
            let entries = match victim {
                Victim::File(e) => vec![e],
                Victim::Segment(id, entries) => {
                    // No more appends to it: its last object leaving deletes it.
                    self.shared.segments.seal(id);
                    entries
                }
            };
            for victim in entries {
                tracing::debug!(path = %victim.path, "evicting");
                slots.remove(&victim.path);
                leave(&victim);
                self.stats.evictions.fetch_add(1, Ordering::Relaxed);
                evicted += 1;
            }
        }
        evicted
    }

    /// Returns a reservation (or a present chunk's bytes) to the free pool.
    pub(super) fn release(&self, bytes: u64) {
        self.shared.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// What eviction may take: a file with its own data file, or a segment with its objects.
enum Victim {
    File(Arc<Entry>),
    Segment(u32, Vec<Arc<Entry>>),
}

/// (total, available to unprivileged users) bytes of the filesystem holding `dir`.
pub fn fs_space(dir: &Path) -> io::Result<(u64, u64)> {
    let s = crate::sys::statvfs(dir)?;
    Ok((s.f_blocks * s.f_frsize, s.f_bavail * s.f_frsize))
}
