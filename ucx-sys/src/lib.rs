//! Raw FFI bindings to UCP (libucp) of the system's UCX, generated at build time. Safe use lives
//! in dyadfs's `transport::ucx`; nothing here is safe to call without reading the UCX docs.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

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
