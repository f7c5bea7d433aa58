//! The file system against a shared file system that fails (`backing::memory`): each failed
//! call reaches its caller as that call's errno, nothing of it is remembered, and the first call
//! that works again is answered as if nothing had happened.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::ops_tests::{MemNames, fs_over};
use super::*;
use crate::backing::memory::{Call, MemShared};
use crate::core::Kind;
use crate::core::mem_source::MemSource;

const DATA: &[u8] = b"0123456789";

/// A file system over an in-memory shared tree: `d/a.bin` (DATA) and `d/link` -> `a.bin`.
fn world(name: &str) -> (DyadFs<MemSource>, Arc<MemShared>, PathBuf) {
    let dir = std::env::temp_dir().join(format!("dyadfs-shared-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let shared = Arc::new(MemShared::default());
    shared.file("d/a.bin", DATA.len() as u64, 5_000_000_007);
    shared.symlink("d/link", "a.bin");
    let source = Arc::new(MemSource::default());
    source.add_version("d/a.bin", DATA.to_vec(), 5_000_000_007);
    let names = Arc::new(MemNames::default());
    let fs = fs_over(
        &dir.join("ssd"),
        shared.clone(),
        source,
        names,
        (None, Duration::ZERO),
    );
    (fs, shared, dir)
}

fn lookup(fs: &DyadFs<MemSource>, parent: u64, name: &str) -> Result<Attr, Error> {
    fs.lookup(parent, OsStr::new(name), &crate::fs::caller::Unknown::ROOT)
}

#[test]
fn a_failed_stat_is_the_lookups_errno_and_is_not_remembered() {
    let (fs, shared, dir) = world("stat");
    let d = lookup(&fs, ROOT_INO, "d").unwrap();
    for errno in [libc::EIO, libc::EACCES, libc::ETIMEDOUT] {
        shared.fail(Call::Stat, errno);
        let e = lookup(&fs, d.ino, "a.bin").unwrap_err();
        assert_eq!(e.errno(), errno, "{e}");
    }
    shared.heal(Call::Stat);
    let before = shared.made(Call::Stat);
    let a = lookup(&fs, d.ino, "a.bin").unwrap();
    assert!(
        shared.made(Call::Stat) > before,
        "the failure was not remembered as an answer"
    );
    assert_eq!((a.size, a.kind), (DATA.len() as u64, Kind::File));
    let opened = fs.open(a.ino, false, false).unwrap();
    assert_eq!(&fs.read(opened.fh, 0, 64).unwrap()[..], DATA);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_failed_listing_is_the_opendirs_errno_and_the_next_lists_everything() {
    let (fs, shared, dir) = world("list");
    let d = lookup(&fs, ROOT_INO, "d").unwrap();
    shared.fail(Call::List, libc::EIO);
    assert_eq!(fs.opendir(d.ino).unwrap_err().errno(), libc::EIO);
    shared.heal(Call::List);
    let fh = fs.opendir(d.ino).unwrap();
    let mut names: Vec<_> = fs
        .listing(fh)
        .unwrap()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["a.bin", "link"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_failed_readlink_and_statfs_are_their_callers_errnos() {
    let (fs, shared, dir) = world("link");
    let d = lookup(&fs, ROOT_INO, "d").unwrap();
    let link = lookup(&fs, d.ino, "link").unwrap();
    assert_eq!(link.kind, Kind::Symlink);
    shared.fail(Call::ReadLink, libc::EIO);
    assert_eq!(fs.readlink(link.ino).unwrap_err().errno(), libc::EIO);
    shared.heal(Call::ReadLink);
    assert_eq!(fs.readlink(link.ino).unwrap(), PathBuf::from("a.bin"));
    shared.fail(Call::Statvfs, libc::ENOTCONN);
    assert_eq!(fs.statfs().unwrap_err().errno(), libc::ENOTCONN);
    shared.heal(Call::Statvfs);
    assert_eq!(fs.statfs().unwrap().f_bsize, 4096);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_slow_shared_file_system_slows_a_lookup_and_nothing_else_fails() {
    let (fs, shared, dir) = world("slow");
    let d = lookup(&fs, ROOT_INO, "d").unwrap();
    shared.slow(Duration::from_millis(50));
    let started = std::time::Instant::now();
    lookup(&fs, d.ino, "a.bin").unwrap();
    assert!(started.elapsed() >= Duration::from_millis(50));
    let _ = std::fs::remove_dir_all(dir);
}
