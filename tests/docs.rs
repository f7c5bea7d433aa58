//! The docs' command examples cannot drift from the product: every `sh` block of README.md and
//! docs/OPERATIONS.md is marked, on the line before it, `<!-- example: runs ... -->` or
//! `<!-- example: shown (why not) -->`, and each that runs is run here, as root, in a fresh
//! directory: `/dyad`, `/nvme` and `/lustre` (and `~`) moved under it, `dyadfs` this build.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// The `sh` blocks of a markdown file: (line of the fence, its marker line, its commands).
fn blocks(file: &Path) -> Vec<(usize, String, String)> {
    let text = fs::read_to_string(file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() == "```sh" {
            let marker = if i > 0 {
                lines[i - 1].to_string()
            } else {
                String::new()
            };
            let mut body = String::new();
            let mut j = i + 1;
            while j < lines.len() && !lines[j].starts_with("```") {
                body.push_str(lines[j]);
                body.push('\n');
                j += 1;
            }
            out.push((i + 1, marker, body));
            i = j;
        }
        i += 1;
    }
    out
}

/// A block's commands with the paths moved under `root`.
fn moved(body: &str, root: &Path) -> String {
    let r = root.display();
    body.lines()
        .map(|line| {
            line.split(' ')
                .map(|t| {
                    if ["/dyad", "/nvme", "/lustre"]
                        .iter()
                        .any(|p| t.starts_with(p))
                    {
                        format!("{r}{t}")
                    } else if let Some(rest) = t.strip_prefix("~/") {
                        format!("{r}/home/{rest}")
                    } else {
                        t.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
                + "\n"
        })
        .collect()
}

#[test]
fn every_command_example_is_marked_and_those_that_run_do() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_dyadfs"));
    let mut ran = 0;
    for doc in ["README.md", "docs/OPERATIONS.md"] {
        for (line, marker, body) in blocks(&repo.join(doc)) {
            let marker = marker.trim();
            if marker.starts_with("<!-- example: shown (") && marker.ends_with(") -->") {
                continue;
            }
            assert!(
                marker.starts_with("<!-- example: runs"),
                "{doc}:{line}: an `sh` block without `<!-- example: runs -->` or \
                 `<!-- example: shown (why) -->` on the line before it"
            );
            let f = Fixture::new(&format!("docs-{ran}"));
            let root = f.root.join("doc");
            for d in ["dyad", "home", "lustre/datasets/imagenet", "lustre/ds"] {
                fs::create_dir_all(root.join(d)).unwrap();
            }
            let path_dir = root.join("bin");
            fs::create_dir_all(&path_dir).unwrap();
            std::os::unix::fs::symlink(&bin, path_dir.join("dyadfs")).unwrap();
            let script = moved(&body, &root);
            let out = Command::new("bash")
                .args(["-euo", "pipefail", "-c", &script])
                .current_dir(repo)
                .env(
                    "PATH",
                    format!("{}:{}", path_dir.display(), std::env::var("PATH").unwrap()),
                )
                .env("HOME", root.join("home"))
                .output()
                .unwrap();
            // (Unmounted by the block already, unless it failed.)
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(root.join("dyad"))
                .stderr(std::process::Stdio::null())
                .status();
            assert!(
                out.status.success(),
                "{doc}:{line} failed:\n{script}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            println!("{doc}:{line} ran");
            ran += 1;
        }
    }
    assert!(ran >= 2, "the first mount's examples run");
}

/// A block that fails is reported, with its place: the check above cannot pass by accident.
#[test]
fn a_wrong_example_would_fail() {
    let f = Fixture::new("docs-wrong");
    let script = moved("dyadfs mount /dyad --no-such-flag\n", &f.root);
    assert!(script.contains(&f.root.display().to_string()));
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .env(
            "PATH",
            format!(
                "{}:{}",
                Path::new(env!("CARGO_BIN_EXE_dyadfs"))
                    .parent()
                    .unwrap()
                    .display(),
                std::env::var("PATH").unwrap()
            ),
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// The example in `dyadfs.stats`'s docstring (issue 69: it asked for a key the counters do not
/// have) runs against a real mount, as written there but for the mount's path.
#[test]
fn the_stats_docstring_example_runs() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = fs::read_to_string(repo.join("python/dyadfs/stats.py")).unwrap();
    let doc = text.split("\"\"\"").nth(1).expect("a module docstring");
    let example: String = doc
        .lines()
        .filter_map(|l| l.strip_prefix("    "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(example.contains("stats(\"/dyad\")"), "{example}");
    let f = Fixture::new("docs-stats");
    f.write("a.bin", b"bytes");
    let m = f.mount(&[]);
    assert_eq!(fs::read(m.path("a.bin")).unwrap(), b"bytes");
    let script = example.replace("\"/dyad\"", &format!("{:?}", m.mnt.display().to_string()));
    let out = Command::new("python3")
        .args(["-c", &script])
        .env("PYTHONPATH", repo.join("python"))
        .output()
        .unwrap();
    let printed = succeeded("the dyadfs.stats example", out);
    assert_eq!(printed.split_whitespace().count(), 2, "{printed}");
    m.unmount();
}
