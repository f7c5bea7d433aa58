//! A local socket of whole messages (`AF_UNIX`, `SOCK_SEQPACKET`) that can carry a descriptor
//! with a message and says who is at the other end. The node service's socket: a user's mount
//! hands the service its `/dev/fuse` descriptor in the message that asks for the mount, and the
//! service knows the caller by the kernel's word (`SO_PEERCRED`, `SO_PEERGROUPS`), never by
//! anything the caller says.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use super::identity::Ids;

/// The largest message either side sends.
pub const MAX_MESSAGE: usize = 64 << 10;

/// One end of a connection.
pub struct Conn(OwnedFd);

/// A listening socket.
pub struct Listener(OwnedFd);

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: socket takes no pointers; a descriptor it returns is ours alone.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn address(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let bytes = path.as_os_str().as_encoded_bytes();
    // SAFETY: sockaddr_un is plain data; zeroed is a valid (empty) address.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a usable socket path", path.display()),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

impl AsRawFd for Conn {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

impl Listener {
    /// Listens at `path`, which must not exist.
    pub fn bind(path: &Path) -> io::Result<Listener> {
        let fd = socket()?;
        let (addr, len) = address(path)?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const addr).cast::<libc::sockaddr>(),
                len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: listen takes no pointers.
        if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Listener(fd))
    }

    /// The next connection.
    pub fn accept(&self) -> io::Result<Conn> {
        loop {
            // SAFETY: null address pointers: the peer's address is not asked for.
            let fd = unsafe {
                libc::accept4(
                    self.0.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if fd >= 0 {
                // SAFETY: a new descriptor accept4 returned, owned by nothing else.
                return Ok(Conn(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Conn {
    /// Two connected ends (`socketpair`), both closed on exec.
    pub fn pair() -> io::Result<(Conn, Conn)> {
        let mut fds = [0; 2];
        // SAFETY: socketpair writes two descriptors into the array we own.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just made by socketpair and are owned by nothing else.
        Ok(unsafe {
            (
                Conn(OwnedFd::from_raw_fd(fds[0])),
                Conn(OwnedFd::from_raw_fd(fds[1])),
            )
        })
    }

    /// Connects to the listener at `path`.
    pub fn connect(path: &Path) -> io::Result<Conn> {
        let fd = socket()?;
        let (addr, len) = address(path)?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&raw const addr).cast::<libc::sockaddr>(),
                len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Conn(fd))
    }

    /// Bounds every later send and receive.
    pub fn set_timeout(&self, timeout: std::time::Duration) -> io::Result<()> {
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
            // SAFETY: `tv` is a valid timeval of the size given.
            let r = unsafe {
                libc::setsockopt(
                    self.0.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&raw const tv).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Sends one message, with `fd` if given.
    pub fn send(&self, message: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        if message.len() > MAX_MESSAGE {
            return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
        }
        let mut iov = libc::iovec {
            iov_base: message.as_ptr() as *mut libc::c_void,
            iov_len: message.len(),
        };
        // Room for one descriptor's control message, aligned as cmsghdr wants.
        let mut control = [0u64; 4];
        // SAFETY: msghdr is plain data; zeroed is valid, the fields are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            // SAFETY: CMSG_SPACE only computes a size.
            let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
            assert!(space <= std::mem::size_of_val(&control));
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space;
            // SAFETY: the control buffer holds `space` bytes, enough for one cmsghdr and an int
            // (asserted above); CMSG_FIRSTHDR points into it and CMSG_DATA past its header.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&raw const msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<i32>(), fd.as_raw_fd());
            }
        }
        // SAFETY: `msg` points at `iov` and `control`, both alive for the call.
        let n = unsafe { libc::sendmsg(self.0.as_raw_fd(), &raw const msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receives one message and the descriptor that came with it, if any. An empty message
    /// with no descriptor is the other end's close.
    pub fn recv(&self) -> io::Result<(Vec<u8>, Option<OwnedFd>)> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut control = [0u64; 4];
        // SAFETY: msghdr is plain data; zeroed is valid, the fields are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: `msg` points at `buf` and `control`, both alive for the call; descriptors
        // received are closed on exec.
        let n = unsafe { libc::recvmsg(self.0.as_raw_fd(), &raw mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fds = Vec::new();
        // SAFETY: the kernel filled `control` with `msg_controllen` bytes of control messages;
        // the CMSG_ macros walk them within it.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<i32>();
                    let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                    for i in 0..count {
                        let fd = std::ptr::read_unaligned(data.add(i));
                        // A descriptor the kernel just installed for us.
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                c = libc::CMSG_NXTHDR(&raw const msg, c);
            }
        }
        let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
        if truncated || fds.len() > 1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a message too long, or with more than one descriptor",
            ));
        }
        buf.truncate(n as usize);
        Ok((buf, fds.pop()))
    }

    /// Who connected: their pid, and their ids and groups as the kernel saw them then.
    pub fn peer(&self) -> io::Result<(u32, Ids)> {
        // SAFETY: ucred is plain data, written whole by getsockopt.
        let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `cred` is a valid out buffer of `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                self.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&raw mut cred).cast(),
                &raw mut len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut groups = vec![0u32; 1024];
        loop {
            let mut len = (groups.len() * 4) as libc::socklen_t;
            // SAFETY: `groups` is a valid out buffer of `len` bytes.
            let r = unsafe {
                libc::getsockopt(
                    self.0.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_PEERGROUPS,
                    groups.as_mut_ptr().cast(),
                    &raw mut len,
                )
            };
            if r == 0 {
                groups.truncate(len as usize / 4);
                break;
            }
            let e = io::Error::last_os_error();
            // ERANGE: `len` says how much is needed.
            if e.raw_os_error() == Some(libc::ERANGE) && groups.len() < 65536 {
                groups.resize((len as usize / 4).max(groups.len() * 2), 0);
                continue;
            }
            return Err(e);
        }
        let ids = Ids {
            uid: cred.uid,
            gid: cred.gid,
            groups,
        };
        Ok((cred.pid as u32, ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_message_carries_a_descriptor_and_the_peer_is_known() {
        let dir = std::env::temp_dir().join(format!("dyadfs-seqpacket-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let listener = Listener::bind(&path).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"hello").unwrap();
        let client = std::thread::spawn({
            let (path, file) = (path.clone(), file.clone());
            move || {
                let c = Conn::connect(&path).unwrap();
                let f = std::fs::File::open(&file).unwrap();
                c.send(b"one", Some(f.as_fd())).unwrap();
                c.send(b"two", None).unwrap();
                c.recv().unwrap().0
            }
        });
        let server = listener.accept().unwrap();
        let (pid, ids) = server.peer().unwrap();
        assert_eq!(pid, std::process::id());
        assert_eq!(ids.uid, crate::sys::euid());
        let (m, fd) = server.recv().unwrap();
        assert_eq!(m, b"one");
        let mut got = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd.unwrap()), &mut got).unwrap();
        assert_eq!(got, "hello");
        let (m, fd) = server.recv().unwrap();
        assert_eq!((m.as_slice(), fd.is_none()), (&b"two"[..], true));
        server.send(b"bye", None).unwrap();
        assert_eq!(client.join().unwrap(), b"bye");
        // The other end gone: an empty message.
        assert_eq!(server.recv().unwrap().0, b"");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
