//! The cache's own file system failing under a mount: full (a small tmpfs, as when the NVMe is
//! shared or smaller than the working set), turned read-only mid-epoch (ext4 remounting itself
//! read-only after an error). Reads never fail for it: they are served uncached from where the
//! bytes come from. A produced file that cannot be written or sealed keeps no bytes.

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A file system mounted for a test, lazily unmounted when dropped (after the dyadfs mount
/// over it, which is dropped first when declared after it).
struct Mount(PathBuf);

impl Mount {
    /// A tmpfs of `size` at `dir`, private to root (a cache dir must be: a tmpfs root is 1777
    /// by default).
    fn tmpfs(dir: &Path, size: &str) -> Mount {
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mounting a tmpfs at {}", dir.display());
        Mount(dir.to_path_buf())
    }

    /// A fresh ext4 image of `size` at `dir` (loop device), which remounts itself read-only
    /// on an error.
    fn ext4(image: &Path, size: u64, dir: &Path) -> Mount {
        File::create(image).unwrap().set_len(size).unwrap();
        let st = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(image)
            .status()
            .unwrap();
        assert!(st.success(), "mkfs.ext4");
        let st = Command::new("mount")
            .args(["-o", "loop,errors=remount-ro"])
            .arg(image)
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mounting an ext4 image at {}", dir.display());
        Mount(dir.to_path_buf())
    }

    /// Makes the ext4 file system record an error, on which it turns read-only (what a disk
    /// error or corruption does to it in production).
    fn ext4_error(&self) {
        let out = Command::new("findmnt")
            .args(["-n", "-o", "SOURCE"])
            .arg(&self.0)
            .output()
            .unwrap();
        let dev = String::from_utf8(out.stdout).unwrap();
        let dev = Path::new(dev.trim()).file_name().unwrap().to_owned();
        let trigger = Path::new("/sys/fs/ext4").join(dev).join("trigger_fs_error");
        fs::write(&trigger, "dyadfs test: the cache disk fails\n").unwrap();
        let out = Command::new("findmnt")
            .args(["-n", "-o", "OPTIONS"])
            .arg(&self.0)
            .output()
            .unwrap();
        let options = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            options
                .trim()
                .split(',')
                .any(|o| o == "ro" || o == "emergency_ro"),
            "still writable: {options}"
        );
    }

    /// (bytes used, bytes available) of the file system.
    fn space(&self) -> (u64, u64) {
        let out = Command::new("df")
            .args(["-B1", "--output=used,avail"])
            .arg(&self.0)
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut n = text.lines().nth(1).unwrap().split_whitespace();
        let mut next = || n.next().unwrap().parse::<u64>().unwrap();
        (next(), next())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A dataset of `n` files (mostly 0.1-3 MiB, every tenth 9-12 MiB: read through the daemon's
/// mapping in chunks), written to the backing directory; their paths.
fn dataset(f: &Fixture, n: usize) -> Vec<String> {
    (0..n)
        .map(|k| {
            let size = if k % 10 == 9 {
                9 * MIB + k * 37_000
            } else {
                100_000 + (k * 7919 * 397) % (3 * MIB)
            };
            let p = format!("d{}/f{k}.bin", k % 7);
            f.write(&p, &pattern(size, 7000 + k as u64));
            p
        })
        .collect()
}

/// Four processes' worth of readers at once, each reading every file (in its own order) and
/// comparing it with the source, as the issue's `cmp` loops did; the failures.
fn four_readers(f: &Fixture, m: &Mounted, files: &[String]) -> Vec<String> {
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..4)
            .map(|r| {
                s.spawn(move || {
                    let mut failed = Vec::new();
                    for i in 0..files.len() {
                        let p = &files[(i * 7 + r * files.len() / 4) % files.len()];
                        match fs::read(m.path(p)) {
                            Ok(got) if got == fs::read(f.backing.join(p)).unwrap() => {}
                            Ok(_) => failed.push(format!("reader {r}: {p} differs")),
                            Err(e) => failed.push(format!("reader {r}: {p}: {e}")),
                        }
                    }
                    failed
                })
            })
            .collect();
        readers
            .into_iter()
            .flat_map(|r| r.join().unwrap())
            .collect()
    })
}

/// Issue 32's case, scaled down: 4 readers of a dataset ten times the size of the cache's
/// tmpfs. With the default capacity (the disk's accounting must keep up with concurrent fills
/// and evictions), then with a capacity larger than the disk (the disk fills for real under
/// them, as when it is shared): no read fails, and the second says so in `cache_write_errors`.
#[test]
fn four_readers_on_a_full_cache_disk_never_fail() {
    let f = Fixture::new("disk-full4");
    // 7 does not divide 7 * k for any k (every file is read by each reader).
    let files = dataset(&f, 151);
    for capacity in [&[][..], &["--capacity", "1G"]] {
        let tmpfs = Mount::tmpfs(&f.ssd, "24m");
        let m = f.mount(capacity);
        let failed = four_readers(&f, &m, &files);
        assert!(failed.is_empty(), "{capacity:?}: {failed:#?}");
        let s = m.stats();
        assert!(s["evictions"].as_u64().unwrap() > 0 || !capacity.is_empty());
        if !capacity.is_empty() {
            assert!(s["uncached_reads"].as_u64().unwrap() > 0, "{s}");
            assert!(s["cache_write_errors"].as_u64().unwrap() > 0, "{s}");
            let log = fs::read_to_string(f.ssd.join("dyadfs.log")).unwrap_or_default();
            let lines = log
                .lines()
                .filter(|l| l.contains("write to the cache's file system failed"))
                .count();
            assert!(lines <= 2, "not rate-limited: {lines} lines");
        }
        m.unmount();
        drop(tmpfs);
    }
}

/// The cache's file system turns read-only while files are being read (ext4 after an error,
/// `errors=remount-ro`): cached files are still served from it, every other read uncached
/// from the shared file system; none fails.
#[test]
fn a_cache_disk_turned_read_only_mid_epoch_serves_reads_uncached() {
    let f = Fixture::new("disk-ro");
    let files: Vec<String> = (0..40)
        .map(|k| {
            let p = format!("e/{k}.bin");
            f.write(&p, &pattern(MIB + k * 4099, 800 + k as u64));
            p
        })
        .collect();
    let ext4 = Mount::ext4(&f.root.join("cache.img"), 96 << 20, &f.ssd);
    let m = f.mount(&[]);
    // The first half of the epoch caches its files.
    for p in &files[..20] {
        assert!(fs::read(m.path(p)).unwrap() == fs::read(f.backing.join(p)).unwrap());
    }
    assert_eq!(m.stat("cached_files"), 20);
    ext4.ext4_error();
    let hits = m.stat("local_hits");
    let failed = four_readers(&f, &m, &files);
    assert!(failed.is_empty(), "{failed:#?}");
    let s = m.stats();
    assert!(s["uncached_reads"].as_u64().unwrap() > 0, "{s}");
    assert!(s["cache_write_errors"].as_u64().unwrap() > 0, "{s}");
    // The copies made before are still read from the cache.
    assert!(s["local_hits"].as_u64().unwrap() >= hits + 20, "{s}");
    assert_eq!(s["cached_files"], 20, "{s}");
    m.unmount();
}

/// A node whose cache disk fills up pulls what a peer holds and serves it uncached: the
/// bytes it could not store blame no holder and send no read to the shared file system.
#[test]
fn a_full_cache_disk_serves_pulled_files_uncached() {
    let mut c = Cluster::new("disk-pull", 2);
    let files: Vec<(String, Vec<u8>)> = (0..24)
        .map(|k| (format!("p/{k}.bin"), pattern(MIB + k * 811, 600 + k as u64)))
        .collect();
    for (p, d) in &files {
        let path = c.backing.join(p);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, d).unwrap();
    }
    fs::create_dir_all(c.root.join("s1")).unwrap();
    let tmpfs = Mount::tmpfs(&c.root.join("s1"), "6m");
    // More than the disk: node 1's fills find it full.
    c.extra = vec!["--capacity".into(), "1G".into()];
    c.start(2);
    for (p, d) in &files {
        assert!(fs::read(c.nodes[0].path(p)).unwrap() == *d, "{p} on node 0");
    }
    // Node 0's copies are published (batched) before node 1 asks.
    c.wait_published(files.len() as u64);
    for (p, d) in &files {
        let got = fs::read(c.nodes[1].path(p)).unwrap_or_else(|e| panic!("{p} on node 1: {e}"));
        assert!(got == *d, "{p} differs on node 1");
    }
    let s = c.nodes[1].stats();
    assert_eq!(s["bytes_from_backing"], 0, "{s}");
    assert!(s["cache_write_errors"].as_u64().unwrap() > 0, "{s}");
    assert!(s["uncached_reads"].as_u64().unwrap() > 0, "{s}");
    c.nodes.clear();
    drop(tmpfs);
}

/// Writes `size` bytes to `path` in 1 MiB writes; the errno of the write that failed (and at
/// what offset), then the result of the close.
fn write_then_close(path: &Path, size: usize) -> (Option<(usize, i32)>, std::io::Result<()>) {
    let mut file = File::create(path).unwrap();
    let chunk = vec![0x5a; MIB];
    let mut failed = None;
    let mut at = 0;
    while at < size {
        let n = chunk.len().min(size - at);
        if let Err(e) = file.write_all(&chunk[..n]) {
            failed = Some((at, e.raw_os_error().unwrap()));
            break;
        }
        at += n;
    }
    // SAFETY: `into_raw_fd` hands over the descriptor, closed once here.
    let closed = unsafe { libc::close(std::os::unix::io::IntoRawFd::into_raw_fd(file)) };
    let closed = if closed == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    };
    (failed, closed)
}

/// The leak: a produced file larger than the cache disk fails with ENOSPC at a write
/// (and at close), is not published, and keeps no byte: the disk is free again at once and
/// the next file is written, published and read back. Likewise a file that fits but whose
/// seal cannot be recorded (the disk full to the last byte).
#[test]
fn a_produced_file_that_fails_keeps_no_bytes() {
    let f = Fixture::new("disk-produce");
    let tmpfs = Mount::tmpfs(&f.ssd, "20m");
    // A managed mount over the tmpfs with a capacity of the whole disk: these files fit it,
    // and meet the disk's own limit (a file past the capacity is refused before the disk).
    let m = f.mount_managed_with(&f.ssd.join("c"), &["--capacity", "20M"]);
    let (used_at_start, free) = tmpfs.space();
    // Exactly the free space: every write lands, but the seal cannot log its object.
    let (failed, closed) = write_then_close(&m.path("exact"), free as usize);
    assert_eq!(failed, None, "a write failed with room left");
    let e = closed.expect_err("sealed with no room to record it");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    // (Listed, not stat'ed: the kernel may keep the created name for its 1 s TTL.)
    assert_eq!(fs::read_dir(&m.mnt).unwrap().count(), 0, "published anyway");
    let (used, _) = tmpfs.space();
    assert!(
        used <= used_at_start + MIB as u64,
        "{used} bytes still used"
    );
    // Larger than the disk: the write that finds no room fails with ENOSPC.
    let (failed, closed) = write_then_close(&m.path("big"), 30 * MIB);
    let (at, errno) = failed.expect("30 MiB were staged on a 20 MiB disk");
    assert_eq!(errno, libc::ENOSPC);
    assert!(at >= 15 * MIB, "failed at {at}");
    assert_eq!(closed.unwrap_err().raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(fs::read_dir(&m.mnt).unwrap().count(), 0);
    let (used, _) = tmpfs.space();
    assert!(
        used <= used_at_start + MIB as u64,
        "{used} bytes still used"
    );
    // (A file the daemon deletes between the listing and its stat, such as a staged file
    // dropped at the kernel's asynchronous release, holds no bytes.)
    let data_files: u64 = walk(&f.ssd.join("c"))
        .iter()
        .map(|p| fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    assert!(
        data_files < MIB as u64,
        "{data_files} bytes of files in the cache dir"
    );
    // The disk is usable again at once.
    let data = pattern(15 * MIB, 9);
    fs::write(m.path("next"), &data).unwrap();
    assert!(fs::read(m.path("next")).unwrap() == data);
    assert_eq!(m.stat("files_produced"), 1);
    assert!(m.stat("cache_write_errors") >= 2);
    m.unmount();
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The one data file in `f`'s cache, opened to read and write behind the daemon's back.
fn the_data_file(f: &Fixture) -> File {
    let dat: Vec<PathBuf> = walk(&f.ssd.join("data"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "dat"))
        .collect();
    assert_eq!(dat.len(), 1, "one data file: {dat:?}");
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dat[0])
        .unwrap()
}

/// A producer's write that finds the cache disk full of cached copies evicts them (the
/// capacity does not count files being written) instead of failing.
#[test]
fn a_producer_write_evicts_cached_files_to_make_room() {
    let f = Fixture::new("disk-room");
    let files: Vec<String> = (0..16)
        .map(|k| {
            let p = format!("c/{k}.bin");
            f.write(&p, &pattern(MIB, 900 + k as u64));
            p
        })
        .collect();
    let _tmpfs = Mount::tmpfs(&f.ssd, "20m");
    let m = f.mount(&[]);
    for p in &files {
        assert!(fs::read(m.path(p)).unwrap() == fs::read(f.backing.join(p)).unwrap());
    }
    assert_eq!(m.stat("cached_files"), 16);
    let data = pattern(12 * MIB, 5);
    fs::write(m.path("out.bin"), &data).unwrap();
    assert!(fs::read(m.path("out.bin")).unwrap() == data);
    assert!(m.stat("evictions") > 0);
    m.unmount();
}

/// Issue 68: pages of a partly cached file (over 8 MiB, read at random: filled page by page)
/// changed on the cache disk while mounted are never served changed. One byte of each of 24
/// read ranges is changed in the cache's data file, the page cache dropped, and each range read
/// again, twice over: every change is caught (counted in `checksum_failures`) and the pages
/// are fetched again. Before the fix, 24 of 24 were served changed, both times.
#[test]
fn pages_of_a_partly_cached_file_changed_while_mounted_are_never_served() {
    use std::os::unix::fs::FileExt;
    let f = Fixture::new("pageflip");
    let data = pattern(24 << 20, 68);
    f.write("big.bin", &data);
    let m = f.mount(&[]);
    let ranges: Vec<u64> = (0..24u64)
        .map(|i| i * (1 << 20) + 12_345 + i * 777)
        .collect();
    let read_ranges = |what: &str| {
        let file = File::open(m.path("big.bin")).unwrap();
        let mut wrong = Vec::new();
        for &at in &ranges {
            let mut buf = vec![0u8; 4096];
            file.read_exact_at(&mut buf, at).unwrap();
            if buf[..] != data[at as usize..at as usize + 4096] {
                wrong.push(at);
            }
        }
        assert_eq!(wrong, Vec::<u64>::new(), "{what}: ranges served changed");
    };
    read_ranges("first read");
    let cached = the_data_file(&f);
    assert!(
        m.stat("bytes_from_backing") < 12 << 20,
        "the file is partly cached (random reads fill pages)"
    );
    for round in 1..=2u64 {
        for &at in &ranges {
            let at = at + 100 * round;
            let mut b = [0u8];
            cached.read_exact_at(&mut b, at).unwrap();
            cached.write_all_at(&[b[0] ^ 0x5a], at).unwrap();
        }
        cached.sync_all().unwrap();
        fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
        read_ranges(&format!("after change {round}"));
        assert_eq!(
            m.stat("checksum_failures"),
            24 * round,
            "every changed page caught, round {round}"
        );
    }
    m.unmount();
}

/// A large cached file is never served with a byte changed on the cache disk after the chunk
/// holding it was verified, whatever verifies or fills the rest afterwards. Here a change to
/// chunk 5 is caught (by the background verification an open starts) and the chunk dropped;
/// then chunk 0, verified, changes; the next open reads chunk 5 first (filled again, which
/// completes the file) and then the rest. Before the fix, that fill remembered the file's
/// print as it was after the change as the verified file's, and chunk 0 was served changed (a
/// flip-read loop over a 24 MiB file read 15 of 60 whole reads wrong in a release build).
#[test]
fn a_change_to_a_verified_chunk_is_never_hidden_by_the_fill_of_another() {
    use std::os::unix::fs::FileExt;
    use std::time::Duration;
    let f = Fixture::new("wholeflip");
    let data = pattern(24 << 20, 69);
    f.write("big.bin", &data);
    let m = f.mount(&[]);
    assert_eq!(fs::read(m.path("big.bin")).unwrap(), data, "first read");
    let cached = the_data_file(&f);
    let flip = |at: u64| {
        let mut b = [0u8];
        cached.read_exact_at(&mut b, at).unwrap();
        cached.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    };
    let chunk5 = 10 << 20;
    flip(chunk5 + 5);
    // An open without a read: its background verification catches the change.
    drop(File::open(m.path("big.bin")).unwrap());
    wait_until("the change caught", Duration::from_secs(20), || {
        m.stat("checksum_failures") == 1
    });
    // (Past the file system's timestamp granularity where it is coarse.)
    std::thread::sleep(Duration::from_millis(20));
    flip(5);
    let file = File::open(m.path("big.bin")).unwrap();
    let mut buf = vec![0u8; 2 << 20];
    file.read_exact_at(&mut buf, chunk5).unwrap();
    assert!(
        buf[..] == data[chunk5 as usize..][..2 << 20],
        "chunk 5 filled again"
    );
    let mut whole = vec![0u8; data.len()];
    file.read_exact_at(&mut whole, 0).unwrap();
    let wrong = whole.iter().zip(&data).position(|(a, b)| a != b);
    assert_eq!(wrong, None, "a changed byte served");
    assert_eq!(m.stat("checksum_failures"), 2, "the second change caught");
    drop(file);
    m.unmount();
}

/// Issue 69: a producer whose cache disk fails under it (ext4 turning itself read-only on an
/// error, as a failing NVMe makes it) gets the disk's errno at the write or at close, and its
/// file is never published; a file closed before the failure stays readable.
#[test]
fn a_produced_file_on_a_failing_disk_is_never_published() {
    let f = Fixture::new("disk-fail-produce");
    let ext4 = Mount::ext4(&f.root.join("cache.img"), 64 << 20, &f.ssd);
    let m = f.mount_managed_with(&f.ssd.join("c"), &["--capacity", "48M"]);
    let before = pattern(MIB, 69);
    fs::write(m.path("before"), &before).unwrap();
    let mut file = File::create(m.path("during")).unwrap();
    file.write_all(&pattern(MIB, 70)).unwrap();
    ext4.ext4_error();
    let wrote = file
        .write_all(&pattern(4 * MIB, 71))
        .and_then(|()| file.sync_all());
    // SAFETY: `into_raw_fd` hands over the descriptor, closed once here.
    let closed = unsafe { libc::close(std::os::unix::io::IntoRawFd::into_raw_fd(file)) };
    let errno = match wrote {
        Err(e) => e.raw_os_error(),
        Ok(()) if closed != 0 => std::io::Error::last_os_error().raw_os_error(),
        Ok(()) => None,
    };
    assert!(
        matches!(errno, Some(libc::EROFS | libc::EIO)),
        "the write or close of a file on a failed disk said {errno:?}"
    );
    println!("the failed disk said {errno:?} to the producer");
    // (Listed, not stat'ed: the kernel may keep the created name for its 1 s TTL.)
    let listed: Vec<String> = fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, ["before"], "the failed file was published");
    assert!(fs::read(m.path("before")).unwrap() == before);
    m.unmount();
}
