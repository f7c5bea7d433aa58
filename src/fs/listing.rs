//! Directory listings: the backing directory's entries and the produced names in it, snapshot
//! at `opendir` and served by offset.

use std::ffi::OsString;

use crate::core::Kind;

/// One directory entry of a listing: a name and a type, no attributes (the kernel looks up
/// the entries it needs attributes of; `find` over a million files stats none of them).
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    pub ino: u64,
    pub kind: Kind,
}

/// The entries of a listing from `offset` on, each with the offset of the one after it (what
/// readdir replies carry): "." and ".." (of directory `ino`; the kernel fixes ".." itself) at
/// offsets 0 and 1, then entry i of the listing at i + 2.
pub fn page<'a>(
    ino: u64,
    listing: &'a [DirEntry],
    offset: u64,
) -> impl Iterator<Item = (u64, std::borrow::Cow<'a, DirEntry>)> + 'a {
    let dots = [".", ".."].map(|name| DirEntry {
        name: name.into(),
        ino,
        kind: Kind::Dir,
    });
    let dots = dots.into_iter().map(std::borrow::Cow::Owned);
    let rest = listing.iter().map(std::borrow::Cow::Borrowed);
    dots.chain(rest)
        .enumerate()
        .skip(offset as usize)
        .map(|(i, e)| (i as u64 + 1, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, ino: u64) -> DirEntry {
        DirEntry {
            name: name.into(),
            ino,
            kind: Kind::File,
        }
    }

    #[test]
    fn offsets_resume_where_the_last_reply_stopped() {
        let listing = [entry("a", 10), entry("b", 11)];
        let all: Vec<(u64, String, u64)> = page(7, &listing, 0)
            .map(|(next, e)| (next, e.name.to_string_lossy().into_owned(), e.ino))
            .collect();
        assert_eq!(
            all,
            [
                (1, ".".into(), 7),
                (2, "..".into(), 7),
                (3, "a".into(), 10),
                (4, "b".into(), 11)
            ]
        );
        // A reply that took two entries resumes at the offset of the second one.
        let rest: Vec<u64> = page(7, &listing, 2).map(|(_, e)| e.ino).collect();
        assert_eq!(rest, [10, 11]);
        assert_eq!(page(7, &listing, 4).count(), 0);
        assert_eq!(page(7, &listing, 99).count(), 0);
    }
}
