//! `names.log`, the journal of a node's produced names, against a user who changes one name as
//! fast as they can: the log stays bounded while mounted (it is compacted from the live names),
//! and the next mount replays it without reading it whole (before: 392-456 MB in 5 s, and the
//! next mount's daemon peaked at 407 MB).

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;

/// Makes `DIR` + [`DEEP`] (directories of 250 bytes, the path near PATH_MAX, so each change's
/// record is about 4 KiB as in the attack), creates a file of 250 bytes' name in it, and renames
/// and chmods that for SECS seconds or until it made MAX changes, four changes a round; prints
/// how many changes it made.
const RENAME_LOOP: &str = r#"
use Time::HiRes qw(time);
my ($d, $secs, $max) = @ARGV;
chdir($d) or die "chdir: $!";
my $part = "d" x 250;
for (1..14) { mkdir($part) or die "mkdir: $!"; chdir($part) or die "chdir: $!"; }
my ($a, $b) = ("a" x 250, "b" x 250);
open(my $f, '>', $a) or die "create: $!";
print $f "produced";
close($f) or die "close: $!";
my ($end, $n) = (time + $secs, 0);
while (time < $end && $n < $max) {
    for (1..200) {
        rename($a, $b) or die "rename: $!";
        chmod(0600, $b) or die "chmod: $!";
        rename($b, $a) or die "rename back: $!";
        chmod(0644, $a) or die "chmod back: $!";
        $n += 4;
    }
}
print "$n\n";
"#;

/// The directories the loop makes under its directory.
const DEEP: usize = 14;

/// The most a daemon's resident memory ever was (VmHWM), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

fn len_of(path: &Path) -> u64 {
    fs::metadata(path).map_or(0, |m| m.len())
}

#[test]
fn a_users_renames_keep_names_log_bounded_and_the_next_mount_small() {
    let f = Fixture::new("nameslog");
    let ssd = f.root.join("ssd-names");
    let log = ssd.join("names.log");
    let m = f.mount_managed_with(&ssd, &["-o", "allow_other"]);
    fs::create_dir_all(m.path("run")).unwrap();
    for i in 0..20 {
        let name = format!("run/f{i}");
        fs::write(m.path(&name), written(&name)).unwrap();
    }
    let open = m.path("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let baseline = peak_kib(m.pid);
    // As a plain user where this runs as root (the attack), else as whoever runs it.
    let (uid, gid) = plain_user().unwrap_or_else(|why| {
        println!("as the current user: {why}");
        // SAFETY: plain getters.
        unsafe { (libc::geteuid(), libc::getegid()) }
    });
    let secs = 6;
    let mut user = as_user(uid, gid);
    user.args(["perl", "-e", RENAME_LOOP])
        .arg(&open)
        .arg(secs.to_string())
        .arg(u64::MAX.to_string());
    let (done, largest) = (AtomicBool::new(false), AtomicU64::new(0));
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                largest.fetch_max(len_of(&log), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20)); // a sample of the log's size
            }
        });
        let out = user.output().unwrap();
        done.store(true, Ordering::Relaxed);
        out
    });
    let changes: u64 = succeeded("the rename loop", out).trim().parse().unwrap();
    let largest = largest.load(Ordering::Relaxed).max(len_of(&log));
    let running = peak_kib(m.pid);
    m.unmount();
    let remounted = remount_and_check(&f, &ssd, &open, uid);
    let after = len_of(&log);
    // A log left long (by an older build): its live records over and over, past 128 MiB.
    let bytes = fs::read(&log).unwrap();
    let records = &bytes[8..];
    let mut out = fs::OpenOptions::new().append(true).open(&log).unwrap();
    for _ in 0..(128 << 20) / records.len() + 1 {
        out.write_all(records).unwrap();
    }
    drop(out);
    let long = len_of(&log);
    let replayed = remount_and_check(&f, &ssd, &open, uid);
    println!(
        "{changes} changes in {secs} s by uid {uid}: names.log at most {largest} bytes \
         ({after} after), daemon peak {running} KiB mounted ({baseline} KiB before the loop), \
         {remounted} KiB after the remount, {replayed} KiB after one over a log of {long} bytes"
    );
    assert!(changes > 1000, "the loop made only {changes} changes");
    // Twice the live names (a few KiB here) plus the slack, whatever the rate.
    assert!(largest < 4 << 20, "names.log reached {largest} bytes");
    for peak in [remounted, replayed] {
        assert!(
            peak < baseline + (32 << 10),
            "a remount peaked at {peak} KiB, {baseline} KiB before the loop"
        );
    }
}

/// In a cluster the looped directory's home and its backup both journal every change: both
/// logs stay bounded (before: 408 MB each in 20 s).
#[test]
fn a_directorys_home_and_backup_both_keep_names_log_bounded() {
    let mut c = Cluster::new("nameslog", 2);
    c.managed = true;
    c.start(2);
    let open = c.nodes[0].path("open");
    fs::create_dir(&open).unwrap();
    let logs = [0, 1].map(|i| c.root.join(format!("s{i}/names.log")));
    let mut user = std::process::Command::new("perl");
    // Enough changes to pass the bound several times over (about 6 KB each), however slow.
    let enough = 2400;
    user.args(["-e", RENAME_LOOP])
        .arg(&open)
        .args(["60", &enough.to_string()]);
    let (done, largest) = (
        AtomicBool::new(false),
        [AtomicU64::new(0), AtomicU64::new(0)],
    );
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                for (log, most) in logs.iter().zip(&largest) {
                    most.fetch_max(len_of(log), Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20)); // a sample of the logs' sizes
            }
        });
        let out = user.output().unwrap();
        done.store(true, Ordering::Relaxed);
        out
    });
    let changes: u64 = succeeded("the rename loop", out).trim().parse().unwrap();
    let deep = c.nodes[1]
        .path("open")
        .join(format!("{}/", "d".repeat(250)).repeat(DEEP));
    wait_until(
        "the last change reaches node 1",
        Duration::from_secs(10),
        || fs::metadata(deep.join("a".repeat(250))).is_ok_and(|m| m.mode() & 0o777 == 0o644),
    );
    let largest = largest.map(|l| l.load(Ordering::Relaxed));
    println!("{changes} changes: names.log at most {largest:?} bytes on nodes 0 and 1");
    assert!(changes >= enough, "the loop made only {changes} changes");
    for (i, l) in largest.into_iter().enumerate() {
        assert!(
            l > 0 && l < 4 << 20,
            "node {i}'s names.log reached {l} bytes"
        );
    }
}

/// Mounts `f` again over `ssd`, checks every name the test made resolves (the looped one as
/// the loop left it, under `open`, owned by `uid`), unmounts; returns the daemon's peak memory.
fn remount_and_check(f: &Fixture, ssd: &Path, open: &Path, uid: u32) -> u64 {
    let m = f.mount_managed_with(ssd, &["-o", "allow_other"]);
    for i in 0..20 {
        let name = format!("run/f{i}");
        assert!(fs::read(m.path(&name)).unwrap() == written(&name), "{name}");
    }
    let deep = open.join(format!("{}/", "d".repeat(250)).repeat(DEEP));
    let (a, b) = (deep.join("a".repeat(250)), deep.join("b".repeat(250)));
    assert_eq!(fs::read(&a).unwrap(), b"produced");
    let meta = fs::metadata(&a).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (uid, 0o644));
    assert!(!b.exists());
    let peak = peak_kib(m.pid);
    m.unmount();
    peak
}
