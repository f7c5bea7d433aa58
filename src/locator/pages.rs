//! How large one locator RPC may grow: a directory's listing (and a feed of gained copies) is
//! answered a page at a time, and many messages to one node (publishes, re-announces, a dead
//! home's copies) go as several batches, each bounded by what it encodes to. So no RPC comes
//! near the transport's frame limit (16 MiB) however many entries a table holds: a frame past
//! it is refused by the receiver, and what it carried would be lost.

use serde::Serialize;

use super::proto::Msg;
use crate::transport::frame::{self, MAX_FRAME};

/// The most the entries of a listing's page, or the messages of one batch, encode to. Large
/// enough that a page costs far more bytes than its round trip (a million 255-byte names are
/// about 300 pages), small enough to leave the frame limit far off: one entry adds at most a
/// name or path (4 KiB) and a symlink's target (4 KiB) past the bound.
pub const PAGE_BYTES: usize = 1 << 20;

const _: () = assert!(PAGE_BYTES * 2 < MAX_FRAME);

/// `msgs` in order, cut into batches of at most [`PAGE_BYTES`] each (a message larger than
/// that alone in its batch; none is: see the bounds above).
pub fn batches(msgs: Vec<Msg>) -> Vec<Vec<Msg>> {
    let mut out = Vec::new();
    let (mut batch, mut bytes) = (Vec::new(), 0);
    for m in msgs {
        let len = frame::encoded_len(&m);
        if !batch.is_empty() && bytes + len > PAGE_BYTES {
            out.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes += len;
        batch.push(m);
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
}

/// How many of `items`, from the first, encode to at most [`PAGE_BYTES`] (at least one).
pub fn fitting<T: Serialize>(items: &[T]) -> usize {
    let mut bytes = 0;
    let fit = items
        .iter()
        .take_while(|i| {
            bytes += frame::encoded_len(i);
            bytes <= PAGE_BYTES
        })
        .count();
    fit.max(1).min(items.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Version;

    fn publish(path: String) -> Msg {
        Msg::Publish {
            path,
            version: Version {
                size: u64::MAX,
                mtime_ns: i64::MIN,
            },
            node: u32::MAX,
            held: true,
        }
    }

    #[test]
    fn batches_keep_order_and_stay_under_the_bound() {
        // 40 MiB of the longest paths: far past a frame, as a big node's holdings are.
        let msgs: Vec<Msg> = (0..10_000)
            .map(|i| publish(format!("{i:0>4096}")))
            .collect();
        let all = msgs.clone();
        let total: usize = all.iter().map(frame::encoded_len).sum();
        assert!(total > 2 * MAX_FRAME, "{total}");
        let cut = batches(msgs);
        assert!(cut.len() >= total.div_ceil(PAGE_BYTES), "{}", cut.len());
        for b in &cut {
            let payload = frame::encoded_len(&Msg::Batch(b.clone()));
            assert!(payload <= PAGE_BYTES + 8, "{payload}");
        }
        assert_eq!(cut.concat(), all);
        assert!(batches(Vec::new()).is_empty());
        // A reply's prefix within a page, by the same bound.
        let fit = fitting(&all);
        assert_eq!(fit, cut[0].len());
        assert_eq!(fitting(&all[..3]), 3);
        assert_eq!(fitting::<Msg>(&[]), 0);
    }
}
