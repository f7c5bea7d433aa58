//! Replays the inputs kept in fixtures/fuzz/ (seeds, and any input that once crashed a fuzz
//! target of scripts/fuzz.sh) through the same checks as the targets in fuzz/fuzz_targets/, so
//! a fixed crash stays fixed without the nightly toolchain.

use std::fs;
use std::path::Path;

use dyadfs::cache::format::Header;
use dyadfs::cache::journal;
use dyadfs::locator::proto;
use dyadfs::transport::wire::{self, Message};

fn inputs(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/fuzz")
        .join(target);
    let mut out: Vec<Vec<u8>> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert!(!out.is_empty(), "no inputs in {}", dir.display());
    out.sort();
    out
}

#[test]
fn wire_decode_inputs() {
    let (mut decoded, mut payloads) = (0, 0);
    for data in inputs("wire_decode") {
        let Some((prefix, body)) = data.split_first_chunk::<4>() else {
            continue;
        };
        if wire::check_len(*prefix).is_err() {
            continue;
        }
        if let Ok(msg) = wire::decode(body) {
            let frame = wire::encode(&msg);
            assert_eq!(wire::decode(&frame[4..]).ok(), Some(msg.clone()));
            decoded += 1;
            if let Message::Rpc(payload) = msg
                && let Ok(m) = proto::decode(&payload)
            {
                assert_eq!(proto::decode(&proto::encode(&m)).ok(), Some(m));
            }
        }
        if let Ok(m) = proto::decode(body) {
            assert_eq!(proto::decode(&proto::encode(&m)).ok(), Some(m));
            payloads += 1;
        }
    }
    assert!(decoded > 0, "the seeds are frames that decode");
    assert!(payloads > 0, "the seeds hold locator payloads that decode");
}

#[test]
fn hello_inputs() {
    use dyadfs::transport::handshake::{MAX_UCX_BLOB, ucx_info};
    use dyadfs::transport::session::{self, Keys};
    let (mut kept, mut refused, mut none) = (0, 0, 0);
    for data in inputs("hello") {
        if let Ok(Message::Hello {
            worker_address,
            rkey,
            ..
        }) = wire::decode(&data)
        {
            let (a, r) = (worker_address.len(), rkey.len());
            match ucx_info(worker_address, rkey) {
                Ok(Some(_)) => {
                    assert!(a > 0 && r > 0 && a <= MAX_UCX_BLOB && r <= MAX_UCX_BLOB);
                    kept += 1;
                }
                Ok(None) => {
                    assert!(a == 0 && r == 0);
                    none += 1;
                }
                Err(_) => {
                    assert!(a == 0 || r == 0 || a > MAX_UCX_BLOB || r > MAX_UCX_BLOB);
                    refused += 1;
                }
            }
        }
        let keys = Keys {
            client_to_server: [7; 32],
            server_to_client: [8; 32],
        };
        let (_, mut open) = session::server(&keys);
        assert!(
            open.frame(&mut data.clone()).is_err(),
            "a forged frame opened"
        );
    }
    assert!(
        kept > 0 && none > 0 && refused >= 3,
        "{kept} {none} {refused}"
    );
}

#[test]
fn journal_decode_inputs() {
    let mut records = 0;
    for data in inputs("journal_decode") {
        records += journal::decode(&data).len();
    }
    assert!(records > 0, "the seed is a log with records");
}

#[test]
fn cache_header_inputs() {
    let mut decoded = 0;
    for data in inputs("cache_header") {
        if let Ok(h) = Header::decode(&data) {
            assert_eq!(Header::decode(&h.encode()).ok(), Some(h));
            decoded += 1;
        }
    }
    assert!(decoded > 0, "the seed is a header that decodes");
}
