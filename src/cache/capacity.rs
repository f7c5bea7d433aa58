//! The capacity: room reserved for what fills write, eviction of the least recently used files
//! nobody holds, and room given back.

use super::*;

impl Cache {
    /// Reserves room for `bytes` of new chunks of `for_entry`, evicting least recently used
    /// entries that are not open and not being filled. `false`: nothing more can be evicted, the
    /// caller serves the read uncached.
    pub fn reserve(&self, for_entry: &Entry, bytes: u64) -> bool {
        if bytes > self.capacity {
            return false;
        }
        let mut index = lock(&self.index);
        if self.shared.used.load(Ordering::Relaxed) + bytes <= self.capacity {
            self.shared.used.fetch_add(bytes, Ordering::Relaxed);
            return true;
        }
        // In a large cache, free a little more than needed, so the next fills need no scan.
        let slack = if index.len() > SCAN_CHEAP {
            self.capacity / EVICT_SLACK_DIVISOR
        } else {
            0
        };
        let target = self.capacity.saturating_sub(bytes + slack);
        self.evict_down_to(&mut index, target, Some(for_entry));
        if self.shared.used.load(Ordering::Relaxed) + bytes <= self.capacity {
            self.shared.used.fetch_add(bytes, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Evicts cached files to free at least `bytes` of the cache's file system for something
    /// the capacity does not count (a file being written, which found the disk full); whether
    /// anything was evicted. Frees at least [`MAKE_ROOM_MIN`] at a time: every write of the
    /// producer would come back for more.
    pub fn make_room(&self, bytes: u64) -> bool {
        let mut index = lock(&self.index);
        let used = self.shared.used.load(Ordering::Relaxed);
        let target = used.saturating_sub(bytes.max(MAKE_ROOM_MIN));
        self.evict_down_to(&mut index, target, None) > 0
    }

    /// Evicts least recently used entries, never `sparing`, nor entries that are open, kept or
    /// being filled, until the cache holds at most `target` bytes; how many it evicted. Packed
    /// objects go by segment (see [`super::segments`]): a segment is as old as its most
    /// recently used object, and goes whole (its objects dropped) unless one of them may not.
    fn evict_down_to(&self, index: &mut Index, target: u64, sparing: Option<&Entry>) -> usize {
        let now = self.shared.tick.load(Ordering::Relaxed);
        let spared = |e: &Arc<Entry>| sparing.is_some_and(|s| std::ptr::eq(e.as_ref(), s));
        let held = |e: &Arc<Entry>| e.pinned() || e.kept() || spared(e);
        let mut victims: Vec<(u32, Victim)> = Vec::new();
        // segment -> (its age, its objects, whether one may not go)
        let mut segments: HashMap<u32, (u32, Vec<Arc<Entry>>, bool)> = HashMap::new();
        for e in index.entries() {
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
                index.remove(&victim.path);
                self.drop_entry(&victim);
                self.stats.evictions.fetch_add(1, Ordering::Relaxed);
                evicted += 1;
            }
        }
        evicted
    }

    /// Returns a reservation (or a present chunk's bytes) to the free pool.
    pub fn release(&self, bytes: u64) {
        self.shared.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// What eviction may take: a file with its own data file, or a segment with its objects.
enum Victim {
    File(Arc<Entry>),
    Segment(u32, Vec<Arc<Entry>>),
}
