//! The rows of the homes' tables, kept compact: a home holds a row per file of its share of
//! the dataset (hundreds of thousands per node), so a row is a shared path, a version and an
//! inline holder: 167 bytes a file at a rack home and 188 at a global home with the table's own
//! overhead (`examples/home_memory.rs` measures it; a `String` key, a `BTreeSet` of holders and
//! a `BTreeMap` of rack names came to 248 and 640 bytes).

use std::hash::{Hash, Hasher, RandomState};
use std::sync::Arc;

use hashbrown::Equivalent;

use crate::core::Version;

/// A file at one version, as the tiers name it in their messages and lookups: holders of
/// another version are never used.
pub type Key = (String, Version);

/// A table keyed by file. SipHash with a random key, as std's maps: paths come from peers.
pub(super) type Table<V> = hashbrown::HashMap<HomeKey, V, RandomState>;

pub(super) fn table<V>() -> Table<V> {
    Table::with_hasher(RandomState::new())
}

/// A file at one version as a table row keys it; the path is shared with the global home's
/// feed. Looked up with a [`Key`] directly (it hashes the same), so a lookup allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HomeKey {
    pub(super) path: Arc<str>,
    pub(super) version: Version,
}

impl Hash for HomeKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `(String, Version)` hashes: the path's str, then the version.
        (*self.path).hash(state);
        self.version.hash(state);
    }
}

impl Equivalent<HomeKey> for Key {
    fn equivalent(&self, k: &HomeKey) -> bool {
        self.1 == k.version && *self.0 == *k.path
    }
}

impl From<&Key> for HomeKey {
    fn from(k: &Key) -> HomeKey {
        HomeKey {
            path: k.0.as_str().into(),
            version: k.1,
        }
    }
}

impl HomeKey {
    pub(super) fn to_key(&self) -> Key {
        (self.path.to_string(), self.version)
    }
}

/// A small set kept sorted, inline while it has one member (most files have one holder per
/// rack and are held by one rack until an epoch reshuffles them). Never empty: a row whose
/// last member leaves is removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Few<T> {
    One(T),
    Many(Box<[T]>),
}

impl<T: Copy + Ord> Few<T> {
    pub(super) fn as_slice(&self) -> &[T] {
        match self {
            Few::One(t) => std::slice::from_ref(t),
            Few::Many(ts) => ts,
        }
    }

    /// Sorted `ts` without duplicates; `None` when empty.
    fn of(mut ts: Vec<T>) -> Option<Few<T>> {
        ts.sort_unstable();
        ts.dedup();
        match ts[..] {
            [] => None,
            [one] => Some(Few::One(one)),
            _ => Some(Few::Many(ts.into_boxed_slice())),
        }
    }

    /// With `t` in place of the members `same` picks (equal ones, or those of the same rack).
    pub(super) fn with(&self, t: T, same: impl Fn(&T) -> bool) -> Few<T> {
        let mut ts: Vec<T> = self
            .as_slice()
            .iter()
            .copied()
            .filter(|x| !same(x))
            .collect();
        ts.push(t);
        Few::of(ts).expect("one member at least")
    }

    /// Without the members `gone` picks; `None` when none is left.
    pub(super) fn without(&self, gone: impl Fn(&T) -> bool) -> Option<Few<T>> {
        Few::of(
            self.as_slice()
                .iter()
                .copied()
                .filter(|x| !gone(x))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn a_key_finds_its_row_and_hashes_as_it() {
        let mut t = table();
        let k: Key = (
            "a/b".into(),
            Version {
                size: 3,
                mtime_ns: 4,
            },
        );
        t.insert(HomeKey::from(&k), 7u32);
        assert_eq!(t.get(&k), Some(&7));
        let other: Key = (k.0.clone(), Version { size: 4, ..k.1 });
        assert_eq!(t.get(&other), None);
        let s = RandomState::new();
        assert_eq!(s.hash_one(&k), s.hash_one(HomeKey::from(&k)));
        assert_eq!(HomeKey::from(&k).to_key(), k);
    }

    #[test]
    fn few_stays_sorted_and_inline_for_one() {
        let one = Few::One(5u32);
        assert_eq!(std::mem::size_of::<Few<u32>>(), 16);
        assert_eq!(std::mem::size_of::<Few<(u32, u32)>>(), 16);
        let two = one.with(2, |x| *x == 2);
        assert_eq!(two.as_slice(), [2, 5]);
        assert_eq!(two.with(5, |x| *x == 5).as_slice(), [2, 5]);
        assert_eq!(two.without(|x| *x == 2), Some(Few::One(5)));
        assert_eq!(Few::One(5).without(|x| *x == 5), None);
        // Replacing by a key: a pair of (rack, node) keeps one node per rack.
        let racks = Few::One((1u32, 9u32)).with((1, 4), |(r, _)| *r == 1);
        assert_eq!(racks, Few::One((1, 4)));
    }
}
