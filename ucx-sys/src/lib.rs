//! Raw FFI bindings to UCP (libucp) of UCX, generated at build time against its headers, and
//! the library itself loaded at run time ([`load`]): a binary built with this crate links no UCX
//! library, starts where none is installed, and finds one only when a data plane asks for it.
//! Safe use lives in dyadfs's `transport::ucx`; nothing here is safe to call without reading
//! the UCX docs, and no function here may be called before [`load`] succeeded.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#![allow(clippy::all)]

/// What bindgen wrote (its loader code calls unsafe functions inside unsafe ones unmarked).
#[allow(unsafe_op_in_unsafe_fn)]
mod bindings {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}
pub use bindings::*;

mod clean;
pub use clean::REMOVED as REMOVED_VARIABLES;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The library's soname (UCX 1.x).
const SONAME: &str = "libucp.so.0";

/// The loaded library and where it came from, or why none was.
static LOADED: OnceLock<Result<(Ucp, PathBuf), String>> = OnceLock::new();

/// Loads libucp once for the process, from the first of [`candidates`] that has every function
/// dyadfs calls, and returns the file it came from; or a line saying where it looked. Later
/// calls return the first call's answer. The library initialises from `/` with the process
/// user's own `HOME` and no `UCX_CONFIG_DIR` or `UCX_MODULE_DIR` (see [`clean`]): no
/// `ucx.conf` or module of the directory it was started in, or of an inherited `HOME`, is
/// read. The first call must come before the process starts threads (it changes the
/// environment).
pub fn load() -> Result<&'static Path, &'static str> {
    match LOADED.get_or_init(|| {
        let candidates = candidates();
        let _clean = clean::Clean::enter();
        load_first(&candidates)
    }) {
        Ok((_, path)) => Ok(path),
        Err(why) => Err(why),
    }
}

fn load_first(candidates: &[OsString]) -> Result<(Ucp, PathBuf), String> {
    let mut tried = Vec::new();
    for c in candidates {
        let path = Path::new(c);
        // A path that names a file must exist; a bare soname is the loader's to search.
        if path.components().count() > 1 && !path.exists() {
            tried.push(format!("{} (absent)", path.display()));
            continue;
        }
        // RTLD_GLOBAL: UCX opens its transport modules itself, and they bind to the libucs and
        // libuct this library brought in.
        let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL;
        // SAFETY: loading runs libucp's initialisers (UCX's own, which any user of UCX runs);
        // the table is checked to hold every function before it is used.
        let opened = unsafe { libloading::os::unix::Library::open(Some(c), flags) }
            .and_then(|lib| unsafe { Ucp::from_library(lib) });
        match opened {
            Ok(ucp) => return Ok((ucp, resolved(c))),
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(format!(
        "no usable UCX library (libucp) was found; tried: {}. Set UCX_DIR to a UCX install, \
         install the libucx wheel (pip install 'dyadfs[ucx]'), or use --data-plane stream",
        tried.join("; ")
    ))
}

/// A soname's file as the loader found it (its first mapping of that name), or the name.
fn resolved(c: &OsStr) -> PathBuf {
    let name = Path::new(c).file_name().unwrap_or(c);
    std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|maps| {
            maps.lines()
                .filter_map(|l| l.split_whitespace().nth(5))
                .find(|p| Path::new(p).file_name() == Some(name))
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(c))
}

/// Where libucp is looked for, in order: `DYADFS_UCX_LIB` (a file; then nothing else),
/// `$UCX_DIR/lib`, the `lib/` beside this executable's directory (what `dyadfs install`
/// copies there), the `libucx` wheel installed beside it (a venv's
/// `lib/python3.*/site-packages/libucx/lib`), the UCX this crate was built against (only for
/// an executable still inside the tree it was built in, so an installed copy never loads code
/// from a checkout; never in a wheel: `UCX_SYS_PORTABLE=1` at build time), then the system's
/// loader path (`LD_LIBRARY_PATH`, ld.so.cache).
pub fn candidates() -> Vec<OsString> {
    if let Some(only) = std::env::var_os("DYADFS_UCX_LIB") {
        return vec![only];
    }
    let mut out: Vec<OsString> = Vec::new();
    if let Some(dir) = std::env::var_os("UCX_DIR") {
        out.push(Path::new(&dir).join("lib").join(SONAME).into());
    }
    let exe = std::env::current_exe().ok();
    if let Some(prefix) = exe.as_ref().and_then(|e| e.parent()?.parent()) {
        out.push(prefix.join("lib").join(SONAME).into());
        out.extend(wheel_libs(prefix).into_iter().map(OsString::from));
    }
    let tree = Path::new(env!("CARGO_MANIFEST_DIR")).parent();
    let in_tree = exe
        .as_ref()
        .zip(tree)
        .is_some_and(|(e, t)| e.starts_with(t));
    if let Some(dirs) = option_env!("UCX_SYS_BUILD_LIBDIRS").filter(|_| in_tree) {
        for dir in dirs.split(':').filter(|d| !d.is_empty()) {
            out.push(Path::new(dir).join(SONAME).into());
        }
    }
    out.push(SONAME.into());
    out
}

/// The `libucx` wheel's libucp under a venv (or a prefix) at `prefix`.
fn wheel_libs(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("python3") {
                let so = e.path().join("site-packages/libucx/lib").join(SONAME);
                if so.exists() {
                    out.push(so);
                }
            }
        }
    }
    out
}

/// The loaded table. Calling UCX before [`load`] succeeded is a bug in the caller.
fn lib() -> &'static Ucp {
    match LOADED.get() {
        Some(Ok((ucp, _))) => ucp,
        _ => panic!("a UCX function was called before ucx_sys::load() succeeded"),
    }
}

/// Free functions with the names and signatures of the C API, each calling the loaded table.
macro_rules! forward {
    ($( fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)?; )*) => {$(
        /// As the UCX function of this name (after [`load`]).
        ///
        /// # Safety
        /// As the UCX function's contract.
        pub unsafe fn $name($($a: $t),*) $(-> $r)? {
            // SAFETY: forwarded under the caller's contract to the function `load` found.
            unsafe { lib().$name($($a),*) }
        }
    )*};
}

use std::os::raw::{c_char, c_int, c_uint, c_void};

forward! {
    fn ucp_cleanup(context_p: ucp_context_h);
    fn ucp_config_modify(config: *mut ucp_config_t, name: *const c_char, value: *const c_char) -> ucs_status_t;
    fn ucp_config_read(env_prefix: *const c_char, filename: *const c_char, config_p: *mut *mut ucp_config_t) -> ucs_status_t;
    fn ucp_config_release(config: *mut ucp_config_t);
    fn ucp_ep_close_nbx(ep: ucp_ep_h, param: *const ucp_request_param_t) -> ucs_status_ptr_t;
    fn ucp_ep_create(worker: ucp_worker_h, params: *const ucp_ep_params_t, ep_p: *mut ucp_ep_h) -> ucs_status_t;
    fn ucp_ep_rkey_unpack(ep: ucp_ep_h, rkey_buffer: *const c_void, rkey_p: *mut ucp_rkey_h) -> ucs_status_t;
    fn ucp_get_nbx(ep: ucp_ep_h, buffer: *mut c_void, count: usize, remote_addr: u64, rkey: ucp_rkey_h, param: *const ucp_request_param_t) -> ucs_status_ptr_t;
    fn ucp_get_version_string() -> *const c_char;
    fn ucp_init_version(api_major_version: c_uint, api_minor_version: c_uint, params: *const ucp_params_t, config: *const ucp_config_t, context_p: *mut ucp_context_h) -> ucs_status_t;
    fn ucp_mem_map(context: ucp_context_h, params: *const ucp_mem_map_params_t, memh_p: *mut ucp_mem_h) -> ucs_status_t;
    fn ucp_mem_unmap(context: ucp_context_h, memh: ucp_mem_h) -> ucs_status_t;
    fn ucp_request_check_status(request: *mut c_void) -> ucs_status_t;
    fn ucp_request_free(request: *mut c_void);
    fn ucp_rkey_buffer_release(rkey_buffer: *mut c_void);
    fn ucp_rkey_destroy(rkey: ucp_rkey_h);
    fn ucp_rkey_pack(context: ucp_context_h, memh: ucp_mem_h, rkey_buffer_p: *mut *mut c_void, size_p: *mut usize) -> ucs_status_t;
    fn ucp_worker_arm(worker: ucp_worker_h) -> ucs_status_t;
    fn ucp_worker_create(context: ucp_context_h, params: *const ucp_worker_params_t, worker_p: *mut ucp_worker_h) -> ucs_status_t;
    fn ucp_worker_destroy(worker: ucp_worker_h);
    fn ucp_worker_get_address(worker: ucp_worker_h, address_p: *mut *mut ucp_address_t, address_length_p: *mut usize) -> ucs_status_t;
    fn ucp_worker_get_efd(worker: ucp_worker_h, fd: *mut c_int) -> ucs_status_t;
    fn ucp_worker_progress(worker: ucp_worker_h) -> c_uint;
    fn ucp_worker_release_address(worker: ucp_worker_h, address: *mut ucp_address_t);
    fn ucp_worker_signal(worker: ucp_worker_h) -> ucs_status_t;
    fn ucs_status_string(status: ucs_status_t) -> *const c_char;
}

/// `ucp_init` is a static inline function in ucp.h: it passes the header's API version.
///
/// # Safety
/// As `ucp_init_version`: valid params, optional config, and a valid out pointer.
pub unsafe fn ucp_init(
    params: *const ucp_params_t,
    config: *const ucp_config_t,
    context_p: *mut ucp_context_h,
) -> ucs_status_t {
    // SAFETY: forwarded under the caller's contract.
    unsafe { ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context_p) }
}

/// UCS_PTR_IS_ERR / UCS_PTR_STATUS / UCS_PTR_IS_PTR are macros in ucs/type/status.h.
pub fn ucs_ptr_status(ptr: *mut std::ffi::c_void) -> ucs_status_t {
    let v = ptr as isize;
    if v < 0 && v >= UCS_ERR_LAST as isize {
        v as ucs_status_t
    } else {
        UCS_OK as ucs_status_t
    }
}

pub fn ucs_ptr_is_err(ptr: *mut std::ffi::c_void) -> bool {
    ucs_ptr_status(ptr) < 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_one_line_naming_where_it_looked() {
        let why = load_first(&["/nonexistent/libucp.so.0".into(), "libnotucp.so.9".into()])
            .err()
            .unwrap();
        assert!(!why.contains('\n'), "{why}");
        assert!(why.contains("/nonexistent/libucp.so.0 (absent)"), "{why}");
        assert!(why.contains("libnotucp.so.9 ("), "{why}");
        assert!(why.contains("UCX_DIR"), "{why}");
    }

    #[test]
    fn a_library_without_the_functions_is_not_used() {
        // libc is loadable but has no UCP: the table is refused, not half filled.
        let why = load_first(&["libc.so.6".into()]).err().unwrap();
        assert!(why.contains("libc.so.6 ("), "{why}");
    }
}
