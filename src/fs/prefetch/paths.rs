//! One prefetch list's paths in one arena: their text, newline-terminated, in one string, a
//! mark every [`MARK_EVERY`] paths, and an open-addressed index of their positions. A path
//! costs its bytes plus about 5 (before: a `Box<str>` and a hash map entry each, ~80 bytes for
//! a short path), so a user's bound in bytes ([`super::MAX_HELD_BYTES`]) is what it holds.

use std::hash::{BuildHasher, Hasher};

use super::MAX_PATHS;

/// What a list is charged per path beside its text: the index's slots (1.25 of 4 bytes) and
/// the marks (4 bytes per 32 paths), rounded up; the newline is in the text.
pub const PATH_COST: usize = 6;
/// Paths between marks: finding a position's text reads past at most this many lines.
const MARK_EVERY: usize = 32;
/// An index slot is `tag << TAG_SHIFT | position + 1` (0: empty); the tag, 8 bits of the
/// path's hash, spares most string comparisons.
const TAG_SHIFT: u32 = 24;
const _: () = assert!(MAX_PATHS < 1 << TAG_SHIFT);

/// The hasher of a prefetcher's indexes (keyed at random: a list cannot be made to collide).
pub type Keys = std::collections::hash_map::RandomState;

/// A list's paths, in order.
#[derive(Default)]
pub struct Paths {
    text: Box<str>,
    /// The offset in `text` of every [`MARK_EVERY`]th path.
    marks: Box<[u32]>,
    len: usize,
    /// Open addressing, linear probing; the first position of each distinct path.
    index: Box<[u32]>,
}

pub fn hash(keys: &Keys, path: &str) -> u64 {
    let mut h = keys.build_hasher();
    h.write(path.as_bytes());
    h.finish()
}

impl Paths {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes this list is charged: its text and [`PATH_COST`] a path.
    pub fn held(&self) -> usize {
        charged(self.text.len(), self.len)
    }

    /// The path at `pos` (< `len`).
    pub fn get(&self, pos: usize) -> &str {
        let mut start = self.marks[pos / MARK_EVERY] as usize;
        for _ in 0..pos % MARK_EVERY {
            start += self.text[start..]
                .find('\n')
                .expect("a newline ends each path")
                + 1;
        }
        let len = self.text[start..]
            .find('\n')
            .expect("a newline ends each path");
        &self.text[start..start + len]
    }

    /// The first position of `path`, whose hash under the list's keys is `h`.
    pub fn find(&self, h: u64, path: &str) -> Option<usize> {
        if self.index.is_empty() {
            return None;
        }
        let tag = tag(h);
        let mut slot = home(h, self.index.len());
        loop {
            let e = self.index[slot];
            if e == 0 {
                return None;
            }
            let pos = (e & ((1 << TAG_SHIFT) - 1)) as usize - 1;
            if e >> TAG_SHIFT == tag && self.get(pos) == path {
                return Some(pos);
            }
            slot = (slot + 1) % self.index.len();
        }
    }
}

fn charged(text: usize, paths: usize) -> usize {
    text + PATH_COST * paths
}

fn tag(h: u64) -> u32 {
    (h & 0xff) as u32
}

/// The slot a hash starts probing at (the high bits: the tag has the low ones).
fn home(h: u64, slots: usize) -> usize {
    ((h as u128 * slots as u128) >> 64) as usize
}

/// A list being read: paths appended while their cost stays within a budget.
pub struct Builder {
    text: String,
    marks: Vec<u32>,
    len: usize,
    budget: usize,
}

/// Past the budget: the list is refused as it is read.
#[derive(Debug)]
pub struct OverBudget;

impl Builder {
    /// `expected`: the list file's size, reserved (address space only) so the text is not
    /// copied as it grows; at most `budget` is reserved.
    pub fn new(expected: usize, budget: usize) -> Builder {
        Builder {
            text: String::with_capacity(expected.min(budget)),
            marks: Vec::new(),
            len: 0,
            budget,
        }
    }

    /// Whether the list has [`MAX_PATHS`] paths (the rest of its lines are skipped).
    pub fn full(&self) -> bool {
        self.len >= MAX_PATHS
    }

    /// Appends the path `write` writes to the text, if it returns true (false: it wrote no
    /// path, whatever it wrote is dropped). Refused once the list costs more than its budget.
    pub fn push_with(
        &mut self,
        write: impl FnOnce(&mut String) -> bool,
    ) -> Result<bool, OverBudget> {
        let start = self.text.len();
        if !write(&mut self.text) {
            self.text.truncate(start);
            return Ok(false);
        }
        self.text.push('\n');
        if self.len.is_multiple_of(MARK_EVERY) {
            self.marks.push(start as u32);
        }
        self.len += 1;
        if charged(self.text.len(), self.len) > self.budget {
            return Err(OverBudget);
        }
        Ok(true)
    }

    #[cfg(test)]
    pub fn push(&mut self, path: &str) -> Result<bool, OverBudget> {
        self.push_with(|t| {
            t.push_str(path);
            true
        })
    }

    /// The list, its index built under `keys`.
    pub fn finish(self, keys: &Keys) -> Paths {
        let mut paths = Paths {
            text: self.text.into_boxed_str(),
            marks: self.marks.into_boxed_slice(),
            len: self.len,
            index: Box::default(),
        };
        if paths.len == 0 {
            return paths;
        }
        let slots = paths.len + paths.len / 4 + 1;
        let mut index = vec![0u32; slots].into_boxed_slice();
        for pos in 0..paths.len {
            let path = paths.get(pos);
            let h = hash(keys, path);
            let mut slot = home(h, slots);
            while index[slot] != 0 {
                let other = (index[slot] & ((1 << TAG_SHIFT) - 1)) as usize - 1;
                if index[slot] >> TAG_SHIFT == tag(h) && paths.get(other) == path {
                    break;
                }
                slot = (slot + 1) % slots;
            }
            if index[slot] == 0 {
                index[slot] = tag(h) << TAG_SHIFT | (pos as u32 + 1);
            }
        }
        paths.index = index;
        paths
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_found_at_their_first_position_and_charged_near_their_bytes() {
        let keys = Keys::new();
        let mut b = Builder::new(0, usize::MAX);
        let names: Vec<String> = (0..1000).map(|i| format!("d{}/f{i}", i % 7)).collect();
        for n in &names {
            assert!(b.push(n).unwrap());
        }
        assert!(b.push("d0/f0").unwrap());
        assert!(
            !b.push_with(|t| {
                t.push_str("dropped");
                false
            })
            .unwrap()
        );
        let p = b.finish(&keys);
        assert_eq!(p.len(), 1001);
        for (i, n) in names.iter().enumerate() {
            assert_eq!(p.get(i), n);
            assert_eq!(p.find(hash(&keys, n), n), Some(i));
        }
        assert_eq!(p.get(1000), "d0/f0");
        assert_eq!(p.find(hash(&keys, "nope"), "nope"), None);
        let text: usize = names.iter().map(|n| n.len() + 1).sum::<usize>() + 6;
        assert_eq!(p.held(), text + 1001 * PATH_COST);
        // What it really holds is within what it is charged.
        let real = p.text.len() + 4 * (p.marks.len() + p.index.len());
        assert!(real <= p.held(), "{real} > {}", p.held());
        assert!(Paths::default().find(1, "x").is_none());
    }

    #[test]
    fn a_list_past_its_budget_is_refused_at_the_path_that_passes_it() {
        let mut b = Builder::new(1 << 30, 3 * (2 + PATH_COST));
        assert_eq!(b.text.capacity(), 3 * (2 + PATH_COST));
        for _ in 0..3 {
            b.push("a").unwrap();
        }
        assert!(b.push("b").is_err());
    }
}
