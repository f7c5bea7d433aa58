//! The cache's header log after a crash or a bad disk: any bytes replay without a panic.
#![no_main]

use dyadfs::cache::journal;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = journal::decode(data);
});
