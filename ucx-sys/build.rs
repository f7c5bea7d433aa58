//! Finds the system UCX with pkg-config and generates bindings for the UCP API with bindgen.
//! UCX is never built or vendored here: install it (Debian: libucx-dev).

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-env-changed=UCX_SYS_INCLUDE_DIR");
    let lib = pkg_config::Config::new()
        .atleast_version("1.13")
        .probe("ucx")
        .unwrap_or_else(|e| {
            panic!("ucx-sys needs UCX >= 1.13 found by pkg-config (Debian: apt-get install libucx-dev): {e}")
        });
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ucp_.*")
        .allowlist_function("ucs_status_string")
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
    for dir in &lib.include_paths {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    if let Ok(dir) = std::env::var("UCX_SYS_INCLUDE_DIR") {
        builder = builder.clang_arg(format!("-I{dir}"));
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("bindings.rs");
    builder
        .generate()
        .expect("bindgen failed on the UCX headers")
        .write_to_file(out)
        .expect("write bindings");
}
