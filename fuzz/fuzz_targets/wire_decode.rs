//! Bytes from the network: a frame's length prefix and body never panic the decoder, and what
//! decodes re-encodes to a frame that decodes to the same message.
#![no_main]

use dyadfs::transport::wire;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((prefix, body)) = data.split_first_chunk::<4>() else {
        return;
    };
    if wire::check_len(*prefix).is_err() {
        return;
    }
    if let Ok(msg) = wire::decode(body) {
        let frame = wire::encode(&msg);
        assert_eq!(wire::decode(&frame[4..]).ok(), Some(msg));
    }
});
