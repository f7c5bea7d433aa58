//! Finds UCX's headers with pkg-config and generates bindings for the UCP API with bindgen: the
//! types and constants, and a table of the functions dyadfs calls, loaded at run time (dlopen,
//! `src/lib.rs`): the binary links no UCX library and runs where none is installed.
//! UCX is never built here. Where it is looked for, first match wins: `UCX_DIR` (a UCX install
//! prefix), the project's `.tools/ucx/libucx` (or `$DYADFS_TOOLS/ucx/libucx`) that
//! `scripts/install-deps.sh` fills, then the system's pkg-config path. The library directory is
//! handed to dependents as `DEP_UCP_LIBDIR` (the binaries' rpath). A `.tools/ucx` installed after
//! a build against the system's UCX is picked up only once this script reruns (`cargo clean -p
//! ucx-sys`). That library directory is also the last place but the system's that `load` looks.

use std::path::{Path, PathBuf};

/// The UCP functions dyadfs calls (and `ucs_status_string`, which libucp's handle finds in its
/// libucs): the loaded table holds these only, and a library that lacks one is not used.
const FUNCTIONS: &[&str] = &[
    "ucp_cleanup",
    "ucp_config_modify",
    "ucp_config_read",
    "ucp_config_release",
    "ucp_ep_close_nbx",
    "ucp_ep_create",
    "ucp_ep_rkey_unpack",
    "ucp_get_nbx",
    "ucp_get_version_string",
    "ucp_init_version",
    "ucp_mem_map",
    "ucp_mem_unmap",
    "ucp_request_check_status",
    "ucp_request_free",
    "ucp_rkey_buffer_release",
    "ucp_rkey_destroy",
    "ucp_rkey_pack",
    "ucp_worker_arm",
    "ucp_worker_create",
    "ucp_worker_destroy",
    "ucp_worker_get_address",
    "ucp_worker_get_efd",
    "ucp_worker_progress",
    "ucp_worker_release_address",
    "ucp_worker_signal",
    "ucs_status_string",
];

/// 1.13 aborts the process when a peer restarts quickly (ucp_request.c:684, fixed by
/// openucx/ucx#8175), and a daemon must survive its neighbours' restarts.
const MIN_VERSION: &str = "1.14";

fn project_ucx() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("UCX_DIR") {
        return Some(PathBuf::from(dir));
    }
    let tools = match std::env::var("DYADFS_TOOLS") {
        Ok(dir) => PathBuf::from(dir),
        Err(_) => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools"),
    };
    let home = tools.join("ucx/libucx");
    home.join("lib/pkgconfig/ucx.pc").exists().then_some(home)
}

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    for var in [
        "UCX_SYS_INCLUDE_DIR",
        "UCX_DIR",
        "DYADFS_TOOLS",
        "PKG_CONFIG_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if let Some(home) = project_ucx() {
        let pc = home.join("lib/pkgconfig");
        println!("cargo:rerun-if-changed={}", pc.join("ucx.pc").display());
        let path = match std::env::var("PKG_CONFIG_PATH") {
            Ok(old) if !old.is_empty() => format!("{}:{old}", pc.display()),
            _ => pc.display().to_string(),
        };
        // SAFETY: a build script is single-threaded; nothing else reads the environment now.
        unsafe { std::env::set_var("PKG_CONFIG_PATH", path) };
    }
    // Headers and the library's directory only: nothing is linked.
    let lib = pkg_config::Config::new()
        .atleast_version(MIN_VERSION)
        .cargo_metadata(false)
        .probe("ucx")
        .unwrap_or_else(|e| {
            panic!(
                "ucx-sys needs UCX >= {MIN_VERSION} (1.13 aborts when a peer restarts): run \
                 scripts/install-deps.sh, or set UCX_DIR to a UCX install: {e}"
            )
        });
    let mut dirs: Vec<String> = lib
        .link_paths
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    dirs.dedup();
    println!("cargo:libdir={}", dirs.join(":"));
    // A wheel is installed elsewhere: the build machine's UCX is no place to look there.
    println!("cargo:rerun-if-env-changed=UCX_SYS_PORTABLE");
    let portable = std::env::var_os("UCX_SYS_PORTABLE").is_some_and(|v| v == "1");
    let build_dirs = if portable {
        String::new()
    } else {
        dirs.join(":")
    };
    println!("cargo:rustc-env=UCX_SYS_BUILD_LIBDIRS={build_dirs}");
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .dynamic_library_name("Ucp")
        .dynamic_link_require_all(true)
        .allowlist_type("ucp_.*")
        .allowlist_type("ucs_.*")
        .allowlist_var("UCP_.*")
        .allowlist_var("UCS_.*")
        // C may return values a Rust enum lacks: C enums become plain integer constants.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false);
    for f in FUNCTIONS {
        builder = builder.allowlist_function(f);
    }
    for dir in &lib.include_paths {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    if let Ok(dir) = std::env::var("UCX_SYS_INCLUDE_DIR") {
        builder = builder.clang_arg(format!("-I{dir}"));
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("bindings.rs");
    builder
        .generate()
        .expect("bindgen failed on the UCX headers")
        .write_to_file(out)
        .expect("write bindings");
}
