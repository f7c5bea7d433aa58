//! The index: the entries by slot behind one lock, what is found, held and listed there, the
//! ages kept from wrapping, and an entry's leaving (its bytes, files and record). How an entry
//! comes to be is [`super::making`].

use std::fs;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::entry::Entry;
use super::events::{CacheEvent, Events};
use super::shared::Shared;
use super::write_errors::WriteErrors;
use crate::core::sync::lock;
use crate::core::{Version, path_hash};

/// Shards of the creations of entries (by slot): enough that fills of different files rarely
/// wait for each other's file creation.
const CREATING_SHARDS: usize = 64;

/// The entries by slot (the hash of their path, which names their data file): a slot holds one
/// entry at a time (a colliding newcomer takes it), so one table finds both. Tables of bare
/// entries placed by their slot: 9 bytes a bucket where a map from slot took 17 (a million
/// entries: 17 MB less). In shards by slot, so that a restart's threads fill them at once (one
/// thread filling one table took seconds of a 14-million-entry restart).
pub(super) struct Slots {
    shards: Vec<Table>,
}

type Table = hashbrown::HashTable<Arc<Entry>>;

/// Where slot `slot` goes in the table: FNV's low bits are weak, so they are mixed first
/// (splitmix64's finalizer).
pub(super) fn place(slot: u64) -> u64 {
    let z = (slot ^ (slot >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The shard, of `shards`, of slot `slot` (bits a table's own placing does not use).
pub(super) fn shard_of(slot: u64, shards: usize) -> usize {
    ((place(slot) >> 32) % shards as u64) as usize
}

impl Slots {
    /// Tables with room for `room[s]` entries in shard `s`.
    pub(super) fn with_shards(room: &[usize]) -> Slots {
        let shards = room
            .iter()
            .map(|&n| {
                let mut table = Table::new();
                table.reserve(n, |e: &Arc<Entry>| place(e.slot()));
                table
            })
            .collect();
        Slots { shards }
    }

    fn table(&self, slot: u64) -> &Table {
        &self.shards[shard_of(slot, self.shards.len())]
    }

    fn table_mut(&mut self, slot: u64) -> &mut Table {
        let n = self.shards.len();
        &mut self.shards[shard_of(slot, n)]
    }

    pub(super) fn get(&self, path: &str) -> Option<&Arc<Entry>> {
        let slot = path_hash(path);
        self.table(slot).find(place(slot), |e| *e.path == *path)
    }

    pub(super) fn insert(&mut self, entry: Arc<Entry>) {
        let slot = entry.slot();
        match self
            .table_mut(slot)
            .entry(place(slot), |e| e.slot() == slot, |e| place(e.slot()))
        {
            hashbrown::hash_table::Entry::Occupied(mut taken) => *taken.get_mut() = entry,
            hashbrown::hash_table::Entry::Vacant(free) => {
                free.insert(entry);
            }
        }
    }

    /// The shards, each to be filled by a loading thread of its own.
    pub(super) fn loading(&mut self) -> impl Iterator<Item = Loading<'_>> {
        self.shards.iter_mut().map(Loading)
    }

    pub(super) fn remove(&mut self, path: &str) -> Option<Arc<Entry>> {
        let slot = path_hash(path);
        let found = self
            .table_mut(slot)
            .find_entry(place(slot), |e| *e.path == *path)
            .ok()?;
        Some(found.remove().0)
    }

    pub(super) fn in_slot(&self, slot: u64) -> Option<Arc<Entry>> {
        self.table(slot)
            .find(place(slot), |e| e.slot() == slot)
            .cloned()
    }

    pub(super) fn entries(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.shards.iter().flat_map(|t| t.iter())
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|t| t.len()).sum()
    }
}

/// One shard of the table as a restart fills it.
pub(super) struct Loading<'a>(&'a mut Table);

impl Loading<'_> {
    /// Puts `entry`, whose path hashes to `slot` (of this shard), in a slot no entry holds (a
    /// load's: its headers have a slot each), neither hashing its path nor comparing it with
    /// others: a restart with 14 million entries spent seconds on both.
    pub(super) fn insert(&mut self, slot: u64, entry: Arc<Entry>) {
        self.0
            .insert_unique(place(slot), entry, |e| place(e.slot()));
    }
}

/// The index of one cache: its entries by slot, the turns of their creations, their ids and
/// the upkeep of their ages.
pub(super) struct Index {
    shared: Arc<Shared>,
    slots: Mutex<Slots>,
    /// Creations of new entries take turns per shard of slots (a slot's data file has one
    /// name), outside the index's lock: creating a file is a directory update on the cache's
    /// file system, and every open of the mount looks the index up.
    creating: Box<[Mutex<()>]>,
    /// The tick of the last pass that kept old entries' ages from wrapping ([`Index::keep_old`]).
    kept_old_at: AtomicU64,
    next_id: AtomicU64,
}

impl Index {
    /// The index of `slots`, loaded; new entries take ids from `next_id` on.
    pub(super) fn new(shared: Arc<Shared>, slots: Slots, next_id: u64) -> Index {
        Index {
            shared,
            slots: Mutex::new(slots),
            creating: (0..CREATING_SHARDS).map(|_| Mutex::new(())).collect(),
            kept_old_at: AtomicU64::new(1),
            next_id: AtomicU64::new(next_id),
        }
    }

    /// What every entry of this cache shares.
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The table, under the index's lock.
    pub(super) fn lock(&self) -> MutexGuard<'_, Slots> {
        lock(&self.slots)
    }

    /// The entry for `path` if cached at `version`; never creates one.
    pub(super) fn lookup(&self, path: &str, version: Version) -> Option<Arc<Entry>> {
        let slots = self.lock();
        slots.get(path).filter(|e| e.version == version).cloned()
    }

    /// Every entry, as of now.
    pub(super) fn all(&self) -> Vec<Arc<Entry>> {
        self.lock().entries().cloned().collect()
    }

    /// Entries holding at least one present byte.
    pub(super) fn cached_files(&self) -> u64 {
        // Counted outside the index's lock, which opens take: under it, the listing only (a
        // count under it took about 0.4 s at 14 M entries, each entry's state locked in turn).
        let all = self.all();
        all.iter()
            .filter(|e| e.state.lock().present_bytes > 0)
            .count() as u64
    }

    /// The turn of creations of slot `hash` (taken before the index's lock, never after).
    pub(super) fn creating_of(&self, hash: u64) -> MutexGuard<'_, ()> {
        lock(&self.creating[(hash % CREATING_SHARDS as u64) as usize])
    }

    /// The entry of `path` at `version` if `slots` has it (marked used).
    pub(super) fn found(&self, slots: &Slots, path: &str, version: Version) -> Option<Arc<Entry>> {
        let e = slots.get(path).filter(|e| e.version == version)?;
        e.touch(self.shared.next_tick());
        Some(e.clone())
    }

    /// Entries record their last use in 32 bits, and an age is taken modulo 2^32: an entry
    /// idle for 2^31 ticks (a day at 10,000 opens a second) would read as just used and
    /// outlive hot ones. Every 2^28 ticks, entries older than 2^30 are made exactly that old,
    /// so no age ever reaches 2^31 and the least recently used still go first.
    pub(super) fn keep_old(&self, slots: &Slots) {
        const EVERY: u64 = 1 << 28;
        const OLD: u64 = 1 << 30;
        let now = self.shared.tick.load(Ordering::Relaxed);
        let last = self.kept_old_at.load(Ordering::Relaxed);
        if now.wrapping_sub(last) < EVERY
            || self
                .kept_old_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        for e in slots.entries() {
            if u64::from(e.age(now)) > OLD {
                e.touch(now.wrapping_sub(OLD));
            }
        }
    }

    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Rewrites the log with the live headers only (it has grown well past them).
    pub(super) fn rewrite_journal(&self, slots: &Slots, writes: &WriteErrors) {
        let entries: Vec<Arc<Entry>> = slots.entries().cloned().collect();
        let r = self
            .shared
            .journal
            .rewrite(|| entries.iter().filter_map(|e| e.record()));
        if let Err(e) = r {
            // Appending goes on; the rewrite is tried again once the log has grown further.
            writes.write_failed("index.log (rewrite)", &e.into());
        }
    }

    /// Removes an entry's files and returns its bytes, telling `events` it left (a write of
    /// its tombstone that fails is told to `writes`). The caller has taken it out of the index.
    pub(super) fn drop_entry(&self, entry: &Entry, events: &Events, writes: &WriteErrors) {
        let mut st = entry.state.lock();
        st.evicted = true;
        if st.present_bytes > 0 {
            events.emit(CacheEvent::Dropped {
                path: entry.path.to_string(),
                version: entry.version,
            });
        }
        let present = std::mem::take(&mut st.present_bytes);
        st.drop_present();
        drop(st);
        let shared = &self.shared;
        if let Some(place) = entry.place() {
            // Its bytes are counted until its whole segment goes.
            let freed = shared.segments.dropped(&shared.files, place, present);
            shared.used.fetch_sub(freed, Ordering::Relaxed);
            if let Err(e) = shared.journal.drop_path(&entry.path) {
                writes.write_failed(&entry.path, &e);
            }
            return;
        }
        shared.used.fetch_sub(present, Ordering::Relaxed);
        shared.files.close(entry.id);
        // The tombstone goes first: a crash in between leaves data without a header (deleted
        // by the orphan sweep), never a header for deleted or replaced data.
        if let Err(e) = shared.journal.drop_path(&entry.path) {
            // The data file goes anyway: a header that outlives it is checked at first use.
            writes.write_failed(&entry.path, &e);
        }
        let _ = fs::remove_file(entry.data_path());
    }

    /// Deletes the entry `path` (at `version`) now, whoever holds it open.
    pub(super) fn forget(&self, path: &str, version: Version, events: &Events, w: &WriteErrors) {
        let mut slots = self.lock();
        if slots.get(path).is_some_and(|e| e.version == version) {
            let e = slots.remove(path).expect("present");
            self.drop_entry(&e, events, w);
        }
    }

    /// Removes `entry` from the index and deletes its files, if the index holds this very entry.
    pub(super) fn drop_if_current(&self, entry: &Entry, events: &Events, w: &WriteErrors) {
        let mut slots = self.lock();
        if slots
            .get(&entry.path)
            .is_some_and(|e| std::ptr::eq(e.as_ref(), entry))
        {
            let e = slots.remove(&entry.path).expect("present");
            self.drop_entry(&e, events, w);
        }
    }

    /// Deletes every data file that no entry owns (a fill cut short by a crash, a dropped
    /// entry, anything foreign) and returns how many. Safe while the cache serves: a slot's
    /// file is only judged under the lock its creations take, and the index's.
    pub(super) fn sweep_orphans(&self) -> io::Result<u64> {
        let mut removed = 0;
        for sub in fs::read_dir(self.shared.dir.join("data"))? {
            let sub = sub?.path();
            if !sub.is_dir() {
                continue;
            }
            for file in fs::read_dir(&sub)? {
                let file = file?.path();
                let name = file.file_name().unwrap_or_default().to_string_lossy();
                let slot = name
                    .strip_suffix(".dat")
                    .and_then(|hex| u64::from_str_radix(hex, 16).ok())
                    .filter(|hash| self.shared.data_path(*hash) == file);
                let _creating = slot.map(|hash| self.creating_of(hash));
                let slots = self.lock();
                // A packed entry has no data file: one in its slot is a leftover.
                if slot.is_none_or(|hash| slots.in_slot(hash).is_none_or(|e| e.packed())) {
                    let _ = fs::remove_file(&file);
                    removed += 1;
                }
            }
        }
        let segments = self.shared.segments.sweep()?;
        if removed + segments > 0 {
            tracing::info!(removed, segments, "deleted cache files no entry owns");
        }
        Ok(removed + segments)
    }
}
