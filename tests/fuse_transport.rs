//! `mount --fuse-transport`: the transport asked for, or a refusal that says why. The suite
//! runs every mount test twice (scripts/test.sh): with the kernel's FUSE ring disabled, then
//! enabled (`/sys/module/fuse/parameters/enable_uring`); this file checks each run's promise.

mod common;

use std::fs;

use common::{Fixture, as_user, is_mounted, pattern, thread_names};

const URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether this kernel has the ring and it is enabled now.
fn ring_enabled() -> bool {
    fs::read_to_string(URING).is_ok_and(|s| s.trim() == "Y")
}

#[test]
fn the_transport_asked_for_serves_the_mount_or_the_mount_says_why_not() {
    let f = Fixture::new("fuse-transport");
    let big = pattern(3 << 20, 7);
    f.write("d/big", &big);
    f.write("small", b"hello");

    // /dev/fuse whatever the kernel offers, and no ring thread.
    let m = f.mount(&["--fuse-transport", "dev"]);
    assert_eq!(m.stats()["fuse_transport"], "dev");
    assert!(
        !thread_names(m.pid)
            .iter()
            .any(|t| t.starts_with("fuse-ring"))
    );
    assert_eq!(fs::read(m.path("d/big")).unwrap(), big);
    m.unmount();

    if !ring_enabled() {
        let out = f.try_mount(&["--fuse-transport", "uring"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "mounted without a ring");
        assert!(err.contains("no FUSE io_uring"), "{err}");
        assert!(!is_mounted(&f.mnt), "a refused mount is left mounted");
        // auto: /dev/fuse, as before the ring.
        let m = f.mount(&[]);
        assert_eq!(m.stats()["fuse_transport"], "dev");
        m.unmount();
        return;
    }

    // The ring: every queue registered (the stats say so only then), reads, writes, listings
    // and renames through it, byte-exact.
    for args in [&["--fuse-transport", "uring"][..], &[][..]] {
        let m = f.mount(args);
        common::wait_until(
            "every queue registered",
            std::time::Duration::from_secs(5),
            || m.stats()["fuse_transport"] == "uring",
        );
        assert!(
            thread_names(m.pid)
                .iter()
                .any(|t| t.starts_with("fuse-ring-0"))
        );
        assert_eq!(fs::read(m.path("d/big")).unwrap(), big);
        assert_eq!(fs::read(m.path("small")).unwrap(), b"hello");
        fs::create_dir(m.path("out")).unwrap();
        let made = pattern(1 << 20, 9);
        fs::write(m.path("out/a"), &made).unwrap();
        fs::rename(m.path("out/a"), m.path("out/b")).unwrap();
        assert_eq!(fs::read(m.path("out/b")).unwrap(), made);
        let mut names: Vec<String> = fs::read_dir(m.path("out"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["b"]);
        fs::remove_file(m.path("out/b")).unwrap();
        fs::remove_dir(m.path("out")).unwrap();
        assert!(m.stats()["passthrough_opens"].as_u64().unwrap() > 0);
        m.unmount();
    }
}

/// `-o allow_root`: the kernel lets every user through (it sets `allow_other`), and the daemon
/// turns away all but root and the mount's owner, by either transport.
#[test]
fn allow_root_admits_root_and_the_owner_alone() {
    let f = Fixture::new("allow-root");
    f.write("x", b"not yours");
    let m = f.mount(&["-o", "allow_root"]);
    assert_eq!(fs::read(m.path("x")).unwrap(), b"not yours");
    let out = as_user(65534, 65534)
        .arg("/bin/cat")
        .arg(m.path("x"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "another user read the file");
    assert!(err.contains("Permission denied"), "{err}");
    m.unmount();
}
