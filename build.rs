//! The binaries, tests and examples load the UCX that ucx-sys linked against, wherever it is
//! (the project's `.tools/ucx` is on no loader path): its library directory goes in their rpath.

fn main() {
    if let Ok(dirs) = std::env::var("DEP_UCP_LIBDIR") {
        for dir in dirs.split(':').filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
