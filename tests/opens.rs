//! `--opens auto`: a read-only mount of a dataset of samples opens them without asking the
//! daemon (a re-read of a sample whose pages the kernel dropped costs a READ, no OPEN or
//! RELEASE), a dataset of large files and every writable mount keep asked opens (passthrough).
//! The suite runs this file on both FUSE transports (scripts/test.sh).

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;

use common::*;

const KIB: usize = 1 << 10;

/// A dataset of `n` files of about `size` bytes under `d/`.
fn dataset(f: &Fixture, n: usize, size: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|k| {
            let (p, d) = (format!("d/{k:03}.npz"), pattern(size + k * 7, k as u64));
            f.write(&p, &d);
            (p, d)
        })
        .collect()
}

#[test]
fn a_read_only_mount_of_samples_opens_them_unasked() {
    let f = Fixture::new("opens-samples");
    let files = dataset(&f, 40, 64 * KIB);
    for ro in [&["-o", "ro"][..], &["--read-only"][..]] {
        let m = f.mount(ro);
        assert_eq!(m.stats()["no_open"].as_bool(), Some(true), "{ro:?}");
        read_all(&m, &files);
        let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
        assert_eq!(
            m.stat("bytes_from_backing"),
            total,
            "each read once from the dataset"
        );
        m.unmount();
        // Cached now, and the kernel holds none of it: a buffered reader seeking about in
        // each sample (np.load of an .npz: its head, its end, then its members) sends one
        // READ, served from the cache by inode: told the sample's size as its block size, its
        // first read asks for the whole file.
        let m = f.mount(ro);
        for (p, d) in &files {
            let mut file = std::io::BufReader::with_capacity(
                fs::metadata(m.path(p)).unwrap().blksize() as usize,
                fs::File::open(m.path(p)).unwrap(),
            );
            for at in [0, d.len() - 100, d.len() / 2] {
                let mut buf = [0u8; 64];
                file.seek(SeekFrom::Start(at as u64)).unwrap();
                file.read_exact(&mut buf).unwrap();
                assert!(buf[..] == d[at..at + 64], "{p} at {at}");
            }
        }
        assert_eq!(
            m.stat("local_hits"),
            files.len() as u64,
            "{ro:?}: READs of seeking readers"
        );
        assert_eq!(m.stat("passthrough_opens"), 0);
        assert_eq!(m.stat("bytes_from_backing"), 0);
        read_all(&m, &files);
        let e = fs::write(m.path("new.bin"), b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
        m.unmount();
        fs::remove_dir_all(&f.ssd).unwrap();
    }
}

#[test]
fn large_files_writable_mounts_and_asked_keep_opens() {
    let f = Fixture::new("opens-asked");
    let files = dataset(&f, 8, 2 << 20);
    // Large files: passthrough wins (where the kernel offers it).
    let m = f.mount(&["-o", "ro"]);
    assert_eq!(m.stats()["no_open"].as_bool(), Some(false));
    read_all(&m, &files);
    m.unmount();
    let g = Fixture::new("opens-asked-small");
    let small = dataset(&g, 8, 16 * KIB);
    for args in [&[][..], &["-o", "ro", "--opens", "asked"][..]] {
        let m = g.mount(args);
        assert_eq!(m.stats()["no_open"].as_bool(), Some(false), "{args:?}");
        read_all(&m, &small);
        m.unmount();
    }
    // And `unasked` is --no-open.
    let m = g.mount(&["--opens", "unasked"]);
    assert_eq!(m.stats()["no_open"].as_bool(), Some(true));
    read_all(&m, &small);
    m.unmount();
}
