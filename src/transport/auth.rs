//! Mutual authentication of every control connection with the job's secret, before anything
//! else is read from it. Pure functions over messages (no sockets): the connection sites only
//! carry the three frames.
//!
//! 1. client -> server `AuthHello { protocol, node_id: c, nonce: nc }`
//! 2. server -> client `AuthChallenge { node_id: s, nonce: ns, mac: HMAC(k, "server" | t) }`
//! 3. client -> server `AuthProof { mac: HMAC(k, "client" | t) }`, then its first real message
//!
//! where `t` binds the protocol version, both node ids and both fresh 32-byte nonces. The client
//! checks the server's MAC before it sends anything else (no rkey, no request reaches a node
//! without the key); the server answers nothing but the challenge before the proof checks out.
//! MACs are HMAC-SHA256 (RustCrypto `hmac` + `sha2`), compared in constant time.
//!
//! Both sides then derive the connection's two session keys from the secret and `t`
//! (`HMAC(k, "c2s" | t)`, `HMAC(k, "s2c" | t)`): every later frame is sealed with them (see
//! [`super::session`]), so the proven peer is the only one who can speak on the connection.
//!
//! A rolling rotation of a long-lived key (the site's): a [`Secret`] may also accept a second
//! key. A server always proves with its own key `k`; a client checks the server's MAC under
//! each key it has and, where one checks out, proves and derives the session under that one.
//! So two nodes talk while either holds the other's key: all nodes first accept the new key,
//! then switch to it one by one (accepting the old), then drop the old one.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::session::Keys;
use super::wire::{Message, PROTOCOL_VERSION};

type HmacSha256 = Hmac<Sha256>;

/// Nonce and key lengths (bytes).
pub const NONCE: usize = 32;
pub const MIN_KEY: usize = 32;

/// The job secret: whoever holds it is a member of the job. The first key is the one this
/// node proves with as a server and tags datagrams with; any further one is a key it also
/// accepts from peers while a rotation is under way ([`Secret::accepting`]).
pub struct Secret(Vec<Vec<u8>>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub fn new(key: Vec<u8>) -> Result<Secret, AuthError> {
        if key.len() < MIN_KEY {
            return Err(AuthError::ShortKey(key.len()));
        }
        Ok(Secret(vec![key]))
    }

    /// This secret, also accepting a server that proves with `other`'s key, and datagrams
    /// tagged with it (a rolling rotation: see the module's comment).
    pub fn accepting(mut self, other: Secret) -> Secret {
        for k in other.0 {
            if !self.0.contains(&k) {
                self.0.push(k);
            }
        }
        self
    }

    /// The key this node proves and tags with.
    fn own(&self) -> &[u8] {
        &self.0[0]
    }

    /// Reads a key file: a regular file owned by this process's user, readable by nobody else,
    /// holding at least 32 bytes (a trailing newline is not part of the key). The error is a
    /// one-line refusal naming the file.
    pub fn load(path: &Path) -> Result<Secret, String> {
        use std::io::Read;
        let refuse = |why: &str| format!("secret file {}: {why}", path.display());
        // Checked on the descriptor it is read from: a swap of the path between a check and
        // the read cannot make root adopt a key someone else chose.
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => refuse("not a regular file (a symlink)"),
                _ => refuse(&e.to_string()),
            })?;
        let meta = f.metadata().map_err(|e| refuse(&e.to_string()))?;
        if !meta.file_type().is_file() {
            return Err(refuse("not a regular file"));
        }
        let me = crate::sys::euid();
        if meta.uid() != me {
            return Err(refuse(&format!("owned by uid {}, not {me}", meta.uid())));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(refuse(&format!(
                "mode {:o} lets others read it: chmod 600 {}",
                meta.mode() & 0o777,
                path.display()
            )));
        }
        let mut key = Vec::new();
        Read::by_ref(&mut f)
            .take(64 << 10)
            .read_to_end(&mut key)
            .map_err(|e| refuse(&e.to_string()))?;
        while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            key.pop();
        }
        Secret::new(key).map_err(|e| refuse(&e.to_string()))
    }

    /// Writes a new random key (64 hex digits: 256 random bits) to `path`, which must not exist,
    /// readable by its owner only.
    pub fn generate(path: &Path) -> std::io::Result<()> {
        let hex: String = random_bytes(32)?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        f.write_all(format!("{hex}\n").as_bytes())?;
        f.sync_all()
    }

    /// The job secret of a rendezvous directory: the first daemon writes `DIR/secret` (whole,
    /// atomically), the others wait (bounded) for it.
    pub fn rendezvous(dir: &Path, wait: std::time::Duration) -> Result<Secret, String> {
        let path = dir.join("secret");
        if !path.exists() {
            let tmp = dir.join(format!("secret.tmp.{}", std::process::id()));
            let made = Secret::generate(&tmp).and_then(|()| std::fs::hard_link(&tmp, &path));
            let _ = std::fs::remove_file(&tmp);
            match made {
                Ok(()) => tracing::info!(path = %path.display(), "created the job secret"),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("secret file {}: {e}", path.display())),
            }
        }
        let deadline = std::time::Instant::now() + wait;
        loop {
            match Secret::load(&path) {
                Ok(s) => return Ok(s),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("key of {0} bytes (at least {MIN_KEY} needed)")]
    ShortKey(usize),
    #[error("peer did not start with an authentication hello")]
    NoHello,
    #[error("peer speaks protocol version {0}, this node {PROTOCOL_VERSION}")]
    Version(u32),
    #[error("malformed authentication frame")]
    Malformed,
    #[error("wrong key (the MAC does not check out)")]
    BadMac,
}

/// Fresh random bytes for a nonce (or a key).
pub fn random_bytes(n: usize) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(b)
}

/// A datagram's tag: HMAC-SHA256 of `data` under the job secret, in a domain of its own
/// (`domain`, e.g. the gossip protocol's name and version), so no tag of one use is valid in
/// another.
pub fn tag(key: &Secret, domain: &[u8], data: &[u8]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(key.own()).expect("HMAC takes any key length");
    m.update(domain);
    m.update(data);
    m.finalize().into_bytes().into()
}

/// Whether `tag` is `data`'s tag in `domain` under one of `key`'s keys (constant time).
pub fn tag_ok(key: &Secret, domain: &[u8], data: &[u8], tag: &[u8]) -> bool {
    key.0.iter().any(|k| {
        let mut m = HmacSha256::new_from_slice(k).expect("HMAC takes any key length");
        m.update(domain);
        m.update(data);
        m.verify_slice(tag).is_ok()
    })
}

fn mac(key: &[u8], role: &[u8], client: u32, server: u32, nc: &[u8], ns: &[u8]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(b"dyadfs-auth-v1/");
    m.update(role);
    m.update(&PROTOCOL_VERSION.to_le_bytes());
    m.update(&client.to_le_bytes());
    m.update(&server.to_le_bytes());
    m.update(nc);
    m.update(ns);
    m
}

/// The connection's session keys, bound to the same transcript as the MACs.
fn keys(key: &[u8], client: u32, server: u32, nc: &[u8], ns: &[u8]) -> Keys {
    let derive = |role: &[u8]| -> [u8; 32] {
        mac(key, role, client, server, nc, ns)
            .finalize()
            .into_bytes()
            .into()
    };
    Keys {
        client_to_server: derive(b"session-c2s"),
        server_to_client: derive(b"session-s2c"),
    }
}

/// What a client keeps between its hello and the server's challenge.
pub struct ClientHandshake {
    me: u32,
    nonce: Vec<u8>,
}

/// Step 1: the client's hello.
pub fn client_hello(me: u32) -> std::io::Result<(Message, ClientHandshake)> {
    let nonce = random_bytes(NONCE)?;
    let hello = Message::AuthHello {
        protocol: PROTOCOL_VERSION,
        node_id: me,
        nonce: nonce.clone(),
    };
    Ok((hello, ClientHandshake { me, nonce }))
}

impl ClientHandshake {
    /// Step 3: checks the server's challenge and returns the proof to send, the server's node
    /// id and the connection's session keys.
    pub fn answer(
        self,
        key: &Secret,
        challenge: Message,
    ) -> Result<(Message, u32, Keys), AuthError> {
        let Message::AuthChallenge {
            node_id: server,
            nonce: ns,
            mac: server_mac,
        } = challenge
        else {
            return Err(AuthError::Malformed);
        };
        if ns.len() != NONCE {
            return Err(AuthError::Malformed);
        }
        // The server's own key: the first of ours its MAC checks out under.
        let key = (key.0.iter())
            .find(|k| {
                mac(k, b"server", self.me, server, &self.nonce, &ns)
                    .verify_slice(&server_mac)
                    .is_ok()
            })
            .ok_or(AuthError::BadMac)?;
        let proof = mac(key, b"client", self.me, server, &self.nonce, &ns)
            .finalize()
            .into_bytes()
            .to_vec();
        let keys = keys(key, self.me, server, &self.nonce, &ns);
        Ok((Message::AuthProof { mac: proof }, server, keys))
    }
}

/// What a server keeps between its challenge and the client's proof.
pub struct ServerHandshake {
    client: u32,
    server: u32,
    nc: Vec<u8>,
    ns: Vec<u8>,
}

/// Step 2: the server's challenge to a client's hello (anything else is refused).
pub fn server_challenge(
    key: &Secret,
    me: u32,
    hello: Message,
) -> Result<(Message, ServerHandshake), AuthError> {
    let Message::AuthHello {
        protocol,
        node_id: client,
        nonce: nc,
    } = hello
    else {
        return Err(AuthError::NoHello);
    };
    if protocol != PROTOCOL_VERSION {
        return Err(AuthError::Version(protocol));
    }
    if nc.len() != NONCE {
        return Err(AuthError::Malformed);
    }
    let ns = random_bytes(NONCE).map_err(|_| AuthError::Malformed)?;
    let server_mac = mac(key.own(), b"server", client, me, &nc, &ns)
        .finalize()
        .into_bytes()
        .to_vec();
    let challenge = Message::AuthChallenge {
        node_id: me,
        nonce: ns.clone(),
        mac: server_mac,
    };
    Ok((
        challenge,
        ServerHandshake {
            client,
            server: me,
            nc,
            ns,
        },
    ))
}

impl ServerHandshake {
    /// Step 4: checks the client's proof; returns the authenticated client's node id and the
    /// connection's session keys.
    pub fn check(self, key: &Secret, proof: Message) -> Result<(u32, Keys), AuthError> {
        let Message::AuthProof { mac: client_mac } = proof else {
            return Err(AuthError::Malformed);
        };
        mac(
            key.own(),
            b"client",
            self.client,
            self.server,
            &self.nc,
            &self.ns,
        )
        .verify_slice(&client_mac)
        .map_err(|_| AuthError::BadMac)?;
        let keys = keys(key.own(), self.client, self.server, &self.nc, &self.ns);
        Ok((self.client, keys))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Secret {
        Secret::new(vec![b; 32]).unwrap()
    }

    #[test]
    fn both_sides_with_the_key_agree_and_learn_each_other() {
        let k = key(7);
        let (hello, client) = client_hello(3).unwrap();
        let (challenge, server) = server_challenge(&k, 9, hello).unwrap();
        let (proof, server_id, ck) = client.answer(&k, challenge).unwrap();
        assert_eq!(server_id, 9);
        let (client_id, sk) = server.check(&k, proof).unwrap();
        assert_eq!(client_id, 3);
        assert_eq!(ck.client_to_server, sk.client_to_server);
        assert_eq!(ck.server_to_client, sk.server_to_client);
        assert_ne!(ck.client_to_server, ck.server_to_client);
    }

    #[test]
    fn a_wrong_key_fails_on_either_side() {
        // A server without the key: the client refuses it before sending anything else.
        let (hello, client) = client_hello(3).unwrap();
        let (challenge, _) = server_challenge(&key(1), 9, hello).unwrap();
        assert_eq!(
            client.answer(&key(2), challenge).unwrap_err(),
            AuthError::BadMac
        );
        // A client without the key: the server refuses its proof.
        let (hello, _) = client_hello(3).unwrap();
        let (_, server) = server_challenge(&key(1), 9, hello).unwrap();
        let forged = Message::AuthProof { mac: vec![0; 32] };
        assert_eq!(
            server.check(&key(1), forged).unwrap_err(),
            AuthError::BadMac
        );
        // A proof is bound to its challenge: replayed onto another one, it fails.
        let (hello, client) = client_hello(3).unwrap();
        let (challenge, server) = server_challenge(&key(1), 9, hello).unwrap();
        let (proof, _, _) = client.answer(&key(1), challenge).unwrap();
        let (hello, _) = client_hello(3).unwrap();
        let (_, other) = server_challenge(&key(1), 9, hello).unwrap();
        assert_eq!(
            other.check(&key(1), proof.clone()).unwrap_err(),
            AuthError::BadMac
        );
        assert_eq!(server.check(&key(1), proof).unwrap().0, 3);
    }

    /// Client with `c`, server with `s`: whether they agree, on what session keys.
    fn talk(c: &Secret, s: &Secret) -> Result<(), AuthError> {
        let (hello, client) = client_hello(3).unwrap();
        let (challenge, server) = server_challenge(s, 9, hello)?;
        let (proof, _, ck) = client.answer(c, challenge)?;
        let (_, sk) = server.check(s, proof)?;
        assert_eq!(ck.client_to_server, sk.client_to_server);
        assert_eq!(ck.server_to_client, sk.server_to_client);
        Ok(())
    }

    #[test]
    fn a_rolling_rotation_never_splits_two_nodes_that_share_a_key() {
        let (old, new) = (|| key(1), || key(2));
        // Step 1: nodes accept the new key; step 2: they prove with it, accepting the old;
        // step 3: the old key is dropped. Any two nodes one step apart agree, both ways.
        let steps = [
            vec![old()],
            vec![old().accepting(new())],
            vec![new().accepting(old())],
            vec![new()],
        ];
        for pair in steps.windows(2) {
            let (a, b) = (&pair[0][0], &pair[1][0]);
            assert_eq!(talk(a, b), Ok(()));
            assert_eq!(talk(b, a), Ok(()));
        }
        // Two steps apart, a node without the other's key is refused, as any keyless client.
        assert_eq!(talk(&old(), &new()), Err(AuthError::BadMac));
        assert_eq!(talk(&new(), &old()), Err(AuthError::BadMac));
        assert_eq!(
            talk(&key(3).accepting(new()), &old()),
            Err(AuthError::BadMac)
        );
        // Datagrams: tagged with the own key, accepted under either.
        let mid = new().accepting(old());
        let t = tag(&old(), b"d", b"x");
        assert!(tag_ok(&mid, b"d", b"x", &t));
        assert!(!tag_ok(&new(), b"d", b"x", &t));
        assert!(!tag_ok(&old(), b"d", b"x", &tag(&mid, b"d", b"x")));
        assert!(tag_ok(&new(), b"d", b"x", &tag(&mid, b"d", b"x")));
    }

    #[test]
    fn key_files_must_be_private_and_long_enough() {
        let dir = std::env::temp_dir().join(format!("dyadfs-auth-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        Secret::generate(&good).unwrap();
        assert!(Secret::load(&good).is_ok());
        assert!(
            Secret::generate(&good).is_err(),
            "an existing key is never overwritten"
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Secret::load(&good).unwrap_err();
        assert!(e.contains("good") && e.contains("644"), "{e}");
        let short = dir.join("short");
        std::fs::write(&short, b"0123456789\n").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Secret::load(&short).unwrap_err().contains("at least 32"));
        assert!(
            Secret::load(&dir)
                .unwrap_err()
                .contains("not a regular file")
        );
        // A symlink to a good key is not followed (whoever owns the link chose the key).
        let link = dir.join("link");
        std::os::unix::fs::symlink(&short, &link).unwrap();
        std::fs::write(&short, [b'k'; 40]).unwrap();
        assert!(Secret::load(&short).is_ok());
        assert!(Secret::load(&link).unwrap_err().contains("symlink"));
        std::fs::remove_file(&short).unwrap();
        std::fs::remove_file(&link).unwrap();
        let a = Secret::rendezvous(&dir, std::time::Duration::from_secs(1)).unwrap();
        let b = Secret::rendezvous(&dir, std::time::Duration::from_secs(1)).unwrap();
        assert_eq!(a.0, b.0);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn anything_but_a_hello_first_is_refused() {
        let hello = Message::Rpc(vec![0x90]);
        assert!(matches!(
            server_challenge(&key(1), 9, hello),
            Err(AuthError::NoHello)
        ));
        let short = Message::AuthHello {
            protocol: PROTOCOL_VERSION,
            node_id: 1,
            nonce: vec![1; 4],
        };
        assert!(matches!(
            server_challenge(&key(1), 9, short),
            Err(AuthError::Malformed)
        ));
        assert!(Secret::new(vec![0; 16]).is_err());
    }
}
