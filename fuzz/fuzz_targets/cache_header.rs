//! A cache entry's header as read from disk: any bytes decode or fail without a panic, and what
//! decodes re-encodes to the same bytes.
#![no_main]

use dyadfs::cache::format::Header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::decode(data) {
        assert_eq!(Header::decode(&h.encode()).ok(), Some(h));
    }
});
