//! Every frame after the handshake is sealed: AES-128-GCM (ring) under a key of its direction,
//! derived from the job secret and both handshake nonces (see [`super::auth`]), with the frame's
//! sequence number as the nonce. A relay or on-path writer without the key can change, replay,
//! reorder, drop-and-continue or inject nothing: any of those fails the next frame's tag, and the
//! connection is closed. The bytes are also hidden from whoever watches the wire (chunks, paths).
//!
//! A sealed frame is `len: u32 BE | ciphertext | tag (16)`, where `len` counts ciphertext and tag
//! and is the AEAD's associated data. The raw chunk that follows a `Data` frame is sealed as a
//! record of its own (`ciphertext | tag`, its length known from the authenticated frame), so the
//! holder seals and the puller opens it in place in the slot it travels in. A chunk staged for
//! an RMA get crosses memory that is not ours (the data-plane process's slab, which UCX's
//! software RMA lets anyone read and write), so it is sealed too, as a *staged record*: under the
//! same key with a nonce of its own space (`STG\0` and a per-connection count the holder sends,
//! with the tag, in the authenticated `Staged` frame), opened by the puller from its private
//! copy. Pure functions over bytes; `--insecure` connections carry plain frames and chunks
//! (`Sealer::plain`, `Opener::plain`).

use ring::aead::{AES_128_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, Tag, UnboundKey};

/// Bytes a sealed frame or record carries beyond its plaintext.
pub const TAG: usize = 16;

/// The two keys of a connection, one per direction.
pub struct Keys {
    pub client_to_server: [u8; 32],
    pub server_to_client: [u8; 32],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

/// One direction's key, its next sequence number and its next staged record's number.
struct Half {
    key: LessSafeKey,
    seq: u64,
    staged: u64,
}

/// The nonce prefix of staged records: never that of a frame or a stream record (zero).
const STAGED: [u8; 4] = *b"STG\0";

/// A staged record's nonce: [`STAGED`] and its number.
fn staged_nonce(n: u64) -> Nonce {
    let mut nonce = [0u8; NONCE_LEN];
    nonce[..4].copy_from_slice(&STAGED);
    nonce[4..].copy_from_slice(&n.to_be_bytes());
    Nonce::assume_unique_for_key(nonce)
}

/// A staged record's associated data: its domain and length (a record cut short or padded
/// fails).
fn staged_aad(len: usize) -> [u8; 14] {
    let mut aad = [0u8; 14];
    aad[..6].copy_from_slice(b"staged");
    aad[6..].copy_from_slice(&(len as u64).to_be_bytes());
    aad
}

impl Half {
    /// AES-128 takes the first 16 bytes of the derived key: as strong as the TLS 1.3 default
    /// suite, and 30% cheaper per byte than AES-256 here (31 vs 43 us per 256 KiB sealed).
    fn new(key: &[u8; 32]) -> Half {
        let key = UnboundKey::new(&AES_128_GCM, &key[..16]).expect("16 bytes are an AES-128 key");
        Half {
            key: LessSafeKey::new(key),
            seq: 0,
            staged: 0,
        }
    }

    /// The next nonce: 4 zero bytes and the sequence number. A key is used by one direction of
    /// one connection only, so no nonce repeats under a key.
    fn next_nonce(&mut self) -> Nonce {
        let mut n = [0u8; NONCE_LEN];
        n[4..].copy_from_slice(&self.seq.to_be_bytes());
        self.seq += 1;
        Nonce::assume_unique_for_key(n)
    }
}

/// A frame or record that did not open: forged, altered, replayed, reordered or truncated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a frame failed its authentication tag (altered, replayed or forged)")]
pub struct Forged;

/// The sending half of a connection.
pub struct Sealer(Option<Half>);

/// The receiving half of a connection.
pub struct Opener(Option<Half>);

/// The two halves of a client's connection.
pub fn client(keys: &Keys) -> (Sealer, Opener) {
    (
        Sealer(Some(Half::new(&keys.client_to_server))),
        Opener(Some(Half::new(&keys.server_to_client))),
    )
}

/// The two halves of a server's connection.
pub fn server(keys: &Keys) -> (Sealer, Opener) {
    (
        Sealer(Some(Half::new(&keys.server_to_client))),
        Opener(Some(Half::new(&keys.client_to_server))),
    )
}

impl Sealer {
    /// Plain frames (`--insecure`).
    pub fn plain() -> Sealer {
        Sealer(None)
    }

    /// Bytes a frame of a `body`-byte plaintext takes on the wire beyond its length prefix.
    pub fn overhead(&self) -> usize {
        if self.0.is_some() { TAG } else { 0 }
    }

    /// A complete frame (length prefix included) carrying `body`.
    pub fn frame(&mut self, body: &[u8]) -> Vec<u8> {
        let len = (body.len() + self.overhead()) as u32;
        let mut out = Vec::with_capacity(4 + len as usize);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(body);
        if let Some(h) = &mut self.0 {
            let nonce = h.next_nonce();
            let tag = h
                .key
                .seal_in_place_separate_tag(nonce, Aad::from(len.to_be_bytes()), &mut out[4..])
                .expect("AES-GCM seals any frame under 64 GiB");
            out.extend_from_slice(tag.as_ref());
        }
        out
    }

    /// Seals a raw record in place; returns its tag (empty when plain), to be sent after it.
    pub fn record(&mut self, bytes: &mut [u8]) -> Vec<u8> {
        let Some(h) = &mut self.0 else {
            return Vec::new();
        };
        let nonce = h.next_nonce();
        let tag = h
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(b"record"), bytes)
            .expect("AES-GCM seals any record under 64 GiB");
        tag.as_ref().to_vec()
    }

    /// Seals a chunk to be staged for a get, in place; returns its number and tag, which travel
    /// in the `Staged` frame (`(0, empty)` when plain). Each number is used once per key.
    pub fn staged(&mut self, bytes: &mut [u8]) -> (u64, Vec<u8>) {
        let Some(h) = &mut self.0 else {
            return (0, Vec::new());
        };
        let n = h.staged;
        h.staged += 1;
        let tag = h
            .key
            .seal_in_place_separate_tag(staged_nonce(n), Aad::from(staged_aad(bytes.len())), bytes)
            .expect("AES-GCM seals any record under 64 GiB");
        (n, tag.as_ref().to_vec())
    }
}

impl Opener {
    /// Plain frames (`--insecure`).
    pub fn plain() -> Opener {
        Opener(None)
    }

    /// Bytes of tag after a record's (or within a frame's) ciphertext.
    pub fn overhead(&self) -> usize {
        if self.0.is_some() { TAG } else { 0 }
    }

    /// Opens a frame's `len` bytes (as its prefix announced) in place; returns the plaintext.
    pub fn frame<'a>(&mut self, frame: &'a mut [u8]) -> Result<&'a [u8], Forged> {
        let Some(h) = &mut self.0 else {
            return Ok(frame);
        };
        let len = frame.len() as u32;
        let nonce = h.next_nonce();
        let plain = h
            .key
            .open_in_place(nonce, Aad::from(len.to_be_bytes()), frame)
            .map_err(|_| Forged)?;
        Ok(plain)
    }

    /// Opens a raw record in place, given the tag that followed it.
    pub fn record(&mut self, bytes: &mut [u8], tag: &[u8]) -> Result<(), Forged> {
        let Some(h) = &mut self.0 else {
            return Ok(());
        };
        let tag = Tag::try_from(tag).map_err(|_| Forged)?;
        let nonce = h.next_nonce();
        h.key
            .open_in_place_separate_tag(nonce, Aad::from(b"record"), tag, bytes, 0..)
            .map_err(|_| Forged)?;
        Ok(())
    }

    /// Opens a staged chunk in place (in memory of ours, never the shared slab it was got
    /// from), given the number and tag its `Staged` frame carried. Stateless: staged chunks may
    /// be opened in any order.
    pub fn staged(&self, bytes: &mut [u8], n: u64, tag: &[u8]) -> Result<(), Forged> {
        let Some(h) = &self.0 else {
            return Ok(());
        };
        let tag = Tag::try_from(tag).map_err(|_| Forged)?;
        h.key
            .open_in_place_separate_tag(
                staged_nonce(n),
                Aad::from(staged_aad(bytes.len())),
                tag,
                bytes,
                0..,
            )
            .map_err(|_| Forged)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(b: u8) -> Keys {
        Keys {
            client_to_server: [b; 32],
            server_to_client: [b + 1; 32],
        }
    }

    /// The body of a frame as the reader sees it (prefix stripped).
    fn body(frame: &[u8]) -> Vec<u8> {
        let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(frame.len(), 4 + len);
        frame[4..].to_vec()
    }

    #[test]
    fn frames_and_records_round_trip_in_order() {
        let (mut cs, mut co) = client(&keys(1));
        let (mut ss, mut so) = server(&keys(1));
        for i in 0..3u8 {
            let mut f = body(&cs.frame(&[i; 40]));
            assert_ne!(&f[..40], &[i; 40], "the bytes are hidden on the wire");
            assert_eq!(so.frame(&mut f).unwrap(), &[i; 40]);
        }
        let mut chunk = vec![7u8; 1000];
        let tag = ss.record(&mut chunk);
        assert_eq!(tag.len(), TAG);
        co.record(&mut chunk, &tag).unwrap();
        assert_eq!(chunk, vec![7u8; 1000]);
    }

    #[test]
    fn altered_replayed_reordered_or_foreign_frames_fail() {
        let (mut cs, _) = client(&keys(1));
        let (_, mut so) = server(&keys(1));
        let a = body(&cs.frame(b"first"));
        let b = body(&cs.frame(b"second"));
        // Reordered: the second frame first.
        assert_eq!(so.frame(&mut b.clone()), Err(Forged));
        let (_, mut so) = server(&keys(1));
        // Altered: one bit of the first.
        let mut bad = a.clone();
        bad[0] ^= 1;
        assert_eq!(so.frame(&mut bad), Err(Forged));
        // Replayed: the first twice.
        let (_, mut so) = server(&keys(1));
        so.frame(&mut a.clone()).unwrap();
        assert_eq!(so.frame(&mut a.clone()), Err(Forged));
        // Reflected: a frame sent back to its sender under the other direction's key.
        let (_, mut co) = client(&keys(1));
        assert_eq!(co.frame(&mut a.clone()), Err(Forged));
        // Another connection's keys.
        let (_, mut other) = server(&keys(3));
        assert_eq!(other.frame(&mut a.clone()), Err(Forged));
        // A record with a wrong or short tag.
        let (mut ss, _) = server(&keys(1));
        let (_, mut co) = client(&keys(1));
        let mut chunk = vec![1u8; 64];
        let mut tag = ss.record(&mut chunk);
        tag[3] ^= 0x80;
        assert_eq!(co.record(&mut chunk, &tag), Err(Forged));
        assert_eq!(co.record(&mut chunk, &tag[..4]), Err(Forged));
    }

    #[test]
    fn plain_halves_pass_bytes_through() {
        let mut s = Sealer::plain();
        let mut o = Opener::plain();
        let mut f = body(&s.frame(b"abc"));
        assert_eq!(o.frame(&mut f).unwrap(), b"abc");
        let mut r = b"xyz".to_vec();
        assert!(s.record(&mut r).is_empty());
        o.record(&mut r, &[]).unwrap();
        assert_eq!(r, b"xyz");
    }

    /// A staged chunk opens only with its own number and tag, at its own length, whatever order
    /// chunks are opened in; one byte changed, another chunk's ciphertext put in its place, or a
    /// frame's nonce space reused all fail. The slab sees ciphertext only.
    #[test]
    fn staged_chunks_open_only_as_sealed() {
        let (_, co) = client(&keys(3));
        let (mut ss, _) = server(&keys(3));
        let mut a = vec![1u8; 4096];
        let mut b = vec![2u8; 4096];
        let (na, ta) = ss.staged(&mut a);
        let (nb, tb) = ss.staged(&mut b);
        assert_ne!(na, nb);
        assert_ne!(a, vec![1u8; 4096], "the staged bytes are hidden");
        // Out of order.
        let mut b2 = b.clone();
        co.staged(&mut b2, nb, &tb).unwrap();
        assert_eq!(b2, vec![2u8; 4096]);
        // Swapped, altered, cut short.
        assert_eq!(co.staged(&mut b.clone(), na, &ta), Err(Forged));
        let mut bad = a.clone();
        bad[100] ^= 1;
        assert_eq!(co.staged(&mut bad, na, &ta), Err(Forged));
        assert_eq!(
            co.staged(&mut a.clone()[..4000].to_vec(), na, &ta),
            Err(Forged)
        );
        assert_eq!(co.staged(&mut a.clone(), na, &[]), Err(Forged));
        co.staged(&mut a, na, &ta).unwrap();
        assert_eq!(a, vec![1u8; 4096]);
    }
}
