//! A pull connection's first frames from a peer: a hello's UCX blobs are checked before UCX sees
//! them (both or neither, each bounded), and bytes that claim to be a sealed frame never panic
//! the opener (and open only under the key they were sealed with).
#![no_main]

use dyadfs::transport::handshake::{MAX_UCX_BLOB, ucx_info};
use dyadfs::transport::session::{self, Keys};
use dyadfs::transport::wire::{self, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Message::Hello {
        worker_address,
        rkey,
        ..
    }) = wire::decode(data)
    {
        let (a, r) = (worker_address.len(), rkey.len());
        match ucx_info(worker_address, rkey) {
            Ok(Some(_)) => assert!(a > 0 && r > 0 && a <= MAX_UCX_BLOB && r <= MAX_UCX_BLOB),
            Ok(None) => assert!(a == 0 && r == 0),
            Err(_) => assert!(a == 0 || r == 0 || a > MAX_UCX_BLOB || r > MAX_UCX_BLOB),
        }
    }
    let keys = Keys {
        client_to_server: [7; 32],
        server_to_client: [8; 32],
    };
    let (_, mut open) = session::server(&keys);
    let mut frame = data.to_vec();
    assert!(open.frame(&mut frame).is_err(), "a forged frame opened");
});
