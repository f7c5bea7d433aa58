//! The commit the binary is built from goes in `DYADFS_COMMIT` (for `dyadfs --version`).

fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DYADFS_COMMIT={commit}");
    // A new commit moves the branch's ref (or packed-refs). Only paths that exist are watched:
    // cargo takes a missing one for changed, and would rebuild the crate on every build.
    for watched in [
        ".git/HEAD",
        ".git/refs/heads",
        ".git/packed-refs",
        "build.rs",
    ] {
        if std::path::Path::new(watched).exists() {
            println!("cargo:rerun-if-changed={watched}");
        }
    }
}
