//! Measures what the locator's homes keep per file: heap bytes of a rack home's holder table
//! and of a global home's table (and its bounded feed of gained copies) after N files are
//! published, counted by a global allocator that tallies live bytes. Deterministic: the same
//! figure on every machine with the same Rust version.
//!
//! cargo run --release --example home_memory -- [FILES]
//!
//! Shapes: every file held by one node of one rack (a training dataset read once), and every
//! file held by two nodes of each of two racks (after a shuffled epoch or two).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use dyadfs::core::Version;
use dyadfs::locator::{GlobalHome, Key, RackHome};

/// The system allocator, counting the bytes live at any time as glibc's malloc holds them
/// (a request plus its 8-byte header, in 16-byte steps, at least 32): what RSS sees.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

fn chunk(size: usize) -> isize {
    ((size + 8).div_ceil(16) * 16).max(32) as isize
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter only adds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(chunk(new_size) - chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc` is passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn key(f: u64) -> Key {
    (
        format!("train/{:03}/sample_{f:08}.npz", f % 1000),
        Version {
            size: 1 << 17,
            mtime_ns: 1_700_000_000_000_000_000 + f as i64,
        },
    )
}

/// Heap bytes per file that `fill` leaves in a home built by `make`.
fn per_file<H>(files: u64, make: impl Fn() -> H, fill: impl Fn(&mut H, &Key)) -> f64 {
    let before = live();
    let mut home = make();
    for f in 0..files {
        fill(&mut home, &key(f));
    }
    let bytes = live() - before;
    drop(home);
    bytes as f64 / files as f64
}

fn main() {
    let files: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("FILES: a number"))
        .unwrap_or(1_000_000);
    let path_len = (0..files).map(|f| key(f).0.len()).sum::<usize>() as f64 / files as f64;
    println!("{files} files, paths of {path_len:.0} bytes on average; heap bytes per file:");
    let rack1 = per_file(files, RackHome::default, |h, k| {
        h.publish(k, 3);
    });
    let rack2 = per_file(files, RackHome::default, |h, k| {
        h.publish(k, 3);
        h.publish(k, 5);
    });
    let global1 = per_file(files, GlobalHome::default, |h, k| {
        h.rack_gained(k, "rack-00", 3);
    });
    let global2 = per_file(files, GlobalHome::default, |h, k| {
        h.rack_gained(k, "rack-00", 3);
        h.rack_gained(k, "rack-01", 9);
    });
    println!("  rack home, 1 holder             {rack1:>8.1}");
    println!("  rack home, 2 holders            {rack2:>8.1}");
    println!("  global home, 1 rack (with feed) {global1:>8.1}");
    println!("  global home, 2 racks (with feed){global2:>8.1}");
    println!(
        "(the global home's feed of gained copies keeps the newest {} whatever the file count)",
        dyadfs::locator::tiers::MAX_FEED
    );
}
