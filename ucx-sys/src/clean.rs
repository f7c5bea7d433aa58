//! What UCX's libucs reads while it initialises, made the process owner's alone. Loading libucp
//! runs libucs's constructor, which parses `ucx.conf` from the library's prefix, from `$HOME`,
//! from `$UCX_CONFIG_DIR` and from the current directory, then `dlopen`s the modules of
//! `UCX_MODULE_DIR` (from the environment or any of those files). Root loading UCX in a user's
//! job directory would run that user's code: so while the library loads, the process works from
//! `/` with `HOME` set to its own user's home (the passwd database, not the inherited variable),
//! and `UCX_CONFIG_DIR` and `UCX_MODULE_DIR` are removed for good. What is left is the
//! configuration beside the library (`<prefix>/etc/ucx/ucx.conf`, as trusted as the library
//! itself), the build's system-wide one, and the `UCX_*` tuning variables of the process's own
//! environment; modules come from beside the library (`<prefix>/lib/ucx`) only.

use std::ffi::{CStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;

/// Variables that would point UCX at configuration or code elsewhere: removed before loading.
pub const REMOVED: [&str; 2] = ["UCX_CONFIG_DIR", "UCX_MODULE_DIR"];

/// The process's working directory and `HOME` while UCX loads, put back when dropped.
pub struct Clean {
    cwd: Option<OwnedFd>,
    home: Option<OsString>,
}

impl Clean {
    /// Moves to `/`, sets `HOME` to the effective user's home (unset if it has none) and
    /// removes [`REMOVED`]. Call before the first `dlopen` of UCX, while no other thread runs:
    /// the environment is changed (`dyadfs` loads UCX in `main`, before any thread starts).
    pub fn enter() -> Clean {
        // O_PATH: a directory the process may not read (a user's 0711 home) can still be
        // returned to.
        // SAFETY: a NUL-terminated literal; the result is checked before use.
        let fd = unsafe {
            libc::open(
                c".".as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        // SAFETY: a descriptor just opened and owned by nobody else.
        let cwd = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) });
        // SAFETY: a NUL-terminated literal.
        unsafe { libc::chdir(c"/".as_ptr()) };
        let home = std::env::var_os("HOME");
        // SAFETY: the caller loads UCX before starting threads (see above): nothing reads the
        // environment concurrently.
        unsafe {
            for var in REMOVED {
                std::env::remove_var(var);
            }
            match own_home() {
                Some(h) => std::env::set_var("HOME", h),
                None => std::env::remove_var("HOME"),
            }
        }
        Clean { cwd, home }
    }
}

impl Drop for Clean {
    fn drop(&mut self) {
        if let Some(fd) = &self.cwd {
            // SAFETY: a directory descriptor we hold; failure leaves the process in `/`.
            unsafe { libc::fchdir(fd.as_raw_fd()) };
        }
        // SAFETY: as in `enter`.
        unsafe {
            match self.home.take() {
                Some(h) => std::env::set_var("HOME", h),
                None => std::env::remove_var("HOME"),
            }
        }
    }
}

/// The effective user's home directory from the passwd database.
fn own_home() -> Option<OsString> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: all-zero is a valid `passwd` (null pointers) for getpwuid_r to fill.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: `pw`, `buf` and `found` outlive the call, `buf.len()` is its size.
    let r = unsafe {
        libc::getpwuid_r(
            libc::geteuid(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if r != 0 || found.is_null() || pw.pw_dir.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded: pw_dir points to a NUL-terminated string inside `buf`.
    let dir = unsafe { CStr::from_ptr(pw.pw_dir) };
    Some(OsString::from_vec(dir.to_bytes().to_vec())).filter(|d| !d.is_empty())
}
