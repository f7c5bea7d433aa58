//! Bytes from the network: a frame's length prefix and body never panic the decoder, and what
//! decodes re-encodes to a frame that decodes to the same message; an RPC's payload likewise
//! through the locator's decoder.
#![no_main]

use dyadfs::locator::proto;
use dyadfs::transport::wire::{self, Message};
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
        assert_eq!(wire::decode(&frame[4..]).ok(), Some(msg.clone()));
        if let Message::Rpc(payload) = msg {
            if let Ok(m) = proto::decode(&payload) {
                assert_eq!(proto::decode(&proto::encode(&m)).ok(), Some(m));
            }
        }
    }
    // The payload decoder also sees the raw bytes (a payload is any bytes a peer chose).
    if let Ok(m) = proto::decode(body) {
        assert_eq!(proto::decode(&proto::encode(&m)).ok(), Some(m));
    }
});
