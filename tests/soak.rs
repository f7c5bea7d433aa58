//! A short chaos soak in the test command (`scripts/soak.sh`, 20 seconds): 16 real daemons in
//! 4 racks, readers checking every byte, daemons frozen, killed and restarted at random, a
//! cache disk filled, cached files corrupted, and cached files corrupted, read and corrupted
//! again (those three first, so every run has them). The long run
//! (`SOAK_SECONDS=600 scripts/soak.sh`) is in docs/BENCHMARKS.md.

use std::process::Command;

#[test]
fn a_short_chaos_soak_reads_no_wrong_byte() {
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/soak.sh"))
        .env("DYADFS_BIN", env!("CARGO_BIN_EXE_dyadfs"))
        .env("SOAK_SECONDS", "20")
        .env("SOAK_NODES", "16")
        .env("SOAK_RACKS", "4")
        .env("SOAK_FILES", "60")
        .env("SOAK_LARGE", "1")
        .env("SOAK_LARGE_MIB", "12")
        .env("SOAK_START_WITH", "fill,corrupt,recorrupt")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the soak failed");
    assert!(text.contains("wrong bytes              0 reads"), "{text}");
    assert!(text.contains("errors on live nodes     0"), "{text}");
    assert!(
        text.contains(" fill disk") && text.contains(" corrupt ") && text.contains(" recorrupt "),
        "{text}"
    );
}
