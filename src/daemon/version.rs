//! What `dyadfs --version` says: the release, the commit it was built from, the protocol it
//! speaks (two daemons of different protocol versions refuse each other's hello, saying both),
//! and the optional parts this machine offers it.

use crate::transport::wire::PROTOCOL_VERSION;

/// Where the kernel says whether it offers FUSE over io_uring.
const URING_KNOB: &str = "/sys/module/fuse/parameters/enable_uring";

/// The long version: one line of what was built, one per optional part.
pub fn long_version() -> String {
    let uring = match std::fs::read_to_string(URING_KNOB) {
        Ok(v) if v.trim() == "Y" => "offered by the kernel (--fuse-transport auto uses it)".into(),
        Ok(v) => format!(
            "not enabled ({URING_KNOB} is {}: /dev/fuse is used)",
            v.trim()
        ),
        Err(_) => "not in this kernel (6.14 or later has it): /dev/fuse is used".into(),
    };
    format!(
        "{} (commit {}, protocol {PROTOCOL_VERSION})\nUCX: {} (for --data-plane ucx, and auto on RDMA)\nFUSE over io_uring: {uring}",
        env!("CARGO_PKG_VERSION"),
        env!("DYADFS_COMMIT"),
        crate::transport::ucx::version(),
    )
}
