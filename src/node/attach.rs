//! A user's mount, attached: the caller known by the socket, its dataset opened as the caller,
//! the dataset's cache shared with every other mount of the same shared directory, and the
//! mount served read-only with the caller's rights asked at every open and lookup.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::proto::Reply;
use super::rights::AsCaller;
use super::state::{Dataset, MountSlot, Node, Refusal, io_refusal};
use crate::backing::{BackingStore, SharedFs};
use crate::cache::names_log::NamesLog;
use crate::core::source::Source;
use crate::daemon::config::MountConfig;
use crate::fs::DyadFs;
use crate::fs::quota::Quota;
use crate::fs::write::Producer;
use crate::fuse::session::{Mounted, SessionSpec};
use crate::sys::identity::{Ids, as_user, may_access};
use crate::sys::seqpacket::Conn;

/// Serves the mount whose `/dev/fuse` descriptor is `fd` for the caller of `conn`, presenting
/// `backing`; answers once the session is up (the kernel's INIT answered).
pub(super) fn attach(
    node: &Arc<Node>,
    conn: &Conn,
    mountpoint: &Path,
    backing: &Path,
    fd: OwnedFd,
) -> Reply {
    match attached(node, conn, mountpoint, backing, fd) {
        Ok(reply) => reply,
        Err(refusal) => {
            tracing::info!(error = %refusal.1, "an attach refused");
            refusal.into()
        }
    }
}

fn attached(
    node: &Arc<Node>,
    conn: &Conn,
    mountpoint: &Path,
    backing: &Path,
    fd: OwnedFd,
) -> Result<Reply, Refusal> {
    let (pid, ids) = conn.peer().map_err(io_refusal("the caller"))?;
    is_fuse_device(&fd)?;
    has_a_mount_waiting(&fd)?;
    if !backing.is_absolute() || !mountpoint.is_absolute() {
        return Err(Refusal(libc::EINVAL, "paths must be absolute".into()));
    }
    let slot = MountSlot::take(node, ids.uid)?;
    let (root, canonical, key) = open_dataset(&ids, backing)?;
    let dataset = node.dataset(&key, &canonical, ids.uid)?;
    let n = node.next_mount.fetch_add(1, Ordering::Relaxed);
    let own = node.config.ssd.join("mounts").join(n.to_string());
    let mut args = node.config.template.clone();
    args.mountpoint = mountpoint.to_path_buf();
    args.backing = canonical.clone();
    args.ssd = own.clone();
    let undo = |r: Refusal| {
        let _ = std::fs::remove_dir_all(&own);
        r
    };
    let backing = |fd| {
        BackingStore::beneath(args.backing.clone(), fd)
            .relieving(dataset.cache.files())
            .acting_as(ids.clone())
    };
    let source = backing(dup(&root).map_err(undo)?);
    let served = Served {
        dataset: &dataset,
        slot,
        own: own.clone(),
        shared: Arc::new(backing(dup(&root).map_err(undo)?)),
        root,
    };
    match &node.site {
        None => served.serve(&args, Arc::new(source), fd),
        Some(site) => {
            let source = site.source(&key, source, dataset.stats.clone());
            served.serve(&args, Arc::new(source), fd)
        }
    }
    .map_err(undo)?;
    tracing::info!(
        uid = ids.uid,
        pid,
        mountpoint = %mountpoint.display(),
        dataset = %key,
        backing = %canonical.display(),
        "serving a mount"
    );
    Ok(Reply::Attached {
        dataset: key,
        cache: node.config.ssd.join("datasets").join(&dataset.key),
    })
}

fn dup(fd: &OwnedFd) -> Result<OwnedFd, Refusal> {
    fd.try_clone()
        .map_err(io_refusal("the dataset's descriptor"))
}

/// A mount about to be served: its dataset, its user's slot, its own directory, and the shared
/// directory as the user opened it.
struct Served<'a> {
    dataset: &'a Arc<Dataset>,
    slot: MountSlot,
    own: PathBuf,
    shared: Arc<BackingStore>,
    root: OwnedFd,
}

impl Served<'_> {
    /// Builds the mount's file system over `source` (the shared directory read as the user,
    /// or the site first) and serves its session on a thread of its own.
    fn serve<S: Source>(
        self,
        args: &MountConfig,
        source: Arc<S>,
        fd: OwnedFd,
    ) -> Result<(), Refusal> {
        let fs = build(args, self.dataset, self.shared, self.root, source)?;
        let spec = SessionSpec {
            mountpoint: args.mountpoint.clone(),
            source: args.backing.display().to_string(),
            read_only: true,
            options: Vec::new(),
            threads: args.threads,
            transport: args.fuse_transport,
        };
        let mounted = Mounted::from_fd(fs, fd, &spec)
            .map_err(|e| Refusal(libc::EIO, format!("the session did not start: {e:?}")))?;
        self.dataset.mounts.fetch_add(1, Ordering::Relaxed);
        let (served, slot, own) = (self.dataset.clone(), self.slot, self.own);
        std::thread::Builder::new()
            .name("node-mount".into())
            .spawn(move || {
                if let Err(e) = mounted.run() {
                    tracing::warn!(error = %e, "a mount's session ended with an error");
                }
                served.mounts.fetch_sub(1, Ordering::Relaxed);
                drop(slot);
                let _ = std::fs::remove_dir_all(&own);
                tracing::info!(dataset = %served.key, "a mount ended");
            })
            .map_err(io_refusal("the mount's thread"))?;
        Ok(())
    }
}

/// The descriptor is the FUSE device (character device 10, 229), not anything else a caller
/// could pass.
fn is_fuse_device(fd: &OwnedFd) -> Result<(), Refusal> {
    // SAFETY: stat is plain data, written whole by fstat on success.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor we own and a valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io_refusal("the descriptor")(std::io::Error::last_os_error()));
    }
    let fuse = libc::makedev(10, 229);
    if st.st_mode & libc::S_IFMT != libc::S_IFCHR || st.st_rdev != fuse {
        return Err(Refusal(
            libc::EINVAL,
            "the descriptor is not /dev/fuse".into(),
        ));
    }
    Ok(())
}

/// How long the kernel's first request (INIT) may take to be there.
const INIT_WAIT_MS: i32 = 5000;

/// The descriptor has a mount waiting to be served: the kernel's INIT is there to read. A
/// descriptor of no mount (`/dev/fuse` opened and nothing mounted) or one whose INIT its sender
/// read itself would hold the service's handshake, and a thread, for ever: refused instead.
fn has_a_mount_waiting(fd: &OwnedFd) -> Result<(), Refusal> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the call only.
    let r = unsafe { libc::poll(&mut p, 1, INIT_WAIT_MS) };
    if r == 1 && p.revents & libc::POLLIN != 0 && p.revents & (libc::POLLERR | libc::POLLHUP) == 0 {
        return Ok(());
    }
    Err(Refusal(
        libc::EINVAL,
        "the descriptor has no mount waiting to be served".into(),
    ))
}

/// Opens `backing` as the caller (`O_PATH`: every directory above it searched with the caller's
/// rights) and checks the caller may list and search it; its canonical path and its key: the
/// shared directory's file system id, inode and birth time (where the file system keeps one,
/// so a directory made later on a reused inode is another dataset): the same on every node.
fn open_dataset(ids: &Ids, backing: &Path) -> Result<(OwnedFd, PathBuf, String), Refusal> {
    let path = CString::new(backing.as_os_str().as_encoded_bytes())
        .map_err(|_| Refusal(libc::EINVAL, "a path with a NUL byte".into()))?;
    let opened = as_user(ids, || {
        // SAFETY: a valid NUL-terminated path; the result is checked.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened and owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })
    .map_err(io_refusal("acting as the caller"))?;
    let denied = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => Refusal(
            libc::EACCES,
            format!("{}: you may not read it", backing.display()),
        ),
        _ => io_refusal(&backing.display().to_string())(e),
    };
    let root = opened.map_err(denied)?;
    if !may_access(ids, root.as_fd(), c".", libc::R_OK | libc::X_OK)
        .map_err(io_refusal("checking the dataset's rights"))?
    {
        return Err(denied(std::io::Error::from_raw_os_error(libc::EACCES)));
    }
    let canonical = std::fs::read_link(format!("/proc/self/fd/{}", root.as_raw_fd()))
        .map_err(io_refusal("the dataset's path"))?;
    // SAFETY: statx is plain data, written by the call on success.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor, an empty path with AT_EMPTY_PATH, and a valid out pointer.
    let r = unsafe {
        libc::statx(
            root.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_INO | libc::STATX_BTIME,
            &mut sx,
        )
    };
    if r != 0 {
        return Err(io_refusal("the dataset's identity")(
            std::io::Error::last_os_error(),
        ));
    }
    // The file system's id, not the device number: a network file system's device number is
    // the client's own (it differs from node to node), its id is the server's.
    // SAFETY: statfs is plain data, written by the call on success.
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor and a valid out pointer.
    if unsafe { libc::fstatfs(root.as_raw_fd(), &mut sf) } != 0 {
        return Err(io_refusal("the dataset's file system")(
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: fsid_t is two ints, plain data, whatever libc calls its field.
    let [a, b]: [u32; 2] = unsafe { std::mem::transmute(sf.f_fsid) };
    let mut key = format!("{a:x}{b:08x}-{:x}", sx.stx_ino);
    if sx.stx_mask & libc::STATX_BTIME != 0 {
        key.push_str(&format!(
            "-{:x}.{:x}",
            sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec
        ));
    }
    Ok((root, canonical, key))
}

/// The file system of one attached mount: the dataset's cache and counters, the shared
/// directory as the caller opened it and read as the caller (its fills read what the user may,
/// never with root's rights), misses read from `source`, and the mount's own (empty,
/// read-only) names in its own directory.
fn build<S: Source>(
    args: &MountConfig,
    dataset: &Dataset,
    shared: Arc<BackingStore>,
    root: OwnedFd,
    source: Arc<S>,
) -> Result<DyadFs<S>, Refusal> {
    let shared: Arc<dyn SharedFs> = shared;
    std::fs::create_dir_all(&args.ssd).map_err(io_refusal("the mount's directory"))?;
    let (journal, restored) = NamesLog::open(&args.ssd).map_err(io_refusal("the mount's names"))?;
    let names = Arc::new(crate::locator::names::LocalNames::restored(
        restored,
        Arc::new(journal),
        args.max_names_per_user,
    ));
    let names = Arc::new(crate::locator::watching::Watched::new(names));
    let quota = Quota::new(Some(0), dataset.stats.clone());
    let producer = Producer::open(&args.ssd, dataset.cache.clone(), 0, quota)
        .map_err(io_refusal("the mount's staging"))?;
    let mut config = args.fs.clone();
    // Every open reaches the service, which judges it: opens unasked would skip the judge.
    config.no_open = false;
    let fs = DyadFs::new(
        shared,
        names,
        Arc::new(producer),
        source,
        dataset.cache.clone(),
        dataset.stats.clone(),
        config,
    )
    .map_err(|e| Refusal(libc::EIO, format!("the dataset: {e}")))?;
    fs.set_rights(Arc::new(AsCaller { root }));
    Ok(fs)
}
