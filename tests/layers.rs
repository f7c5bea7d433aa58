//! The layers of docs/ARCHITECTURE.md, held against the code: every `crate::` path in a
//! module's files names only the modules below it. A new arrow that points up (or sideways,
//! like the transport reaching into the locator) fails here with the file and the line. The page
//! itself is held to them too: its table of what each module may use is this file's, and its
//! list of files names every file under src/.

use std::path::Path;

/// Each top-level module and the modules it may use. `core`, `sys` and `stats` are the ground.
const LAYERS: &[(&str, &[&str])] = &[
    ("core", &[]),
    ("sys", &[]),
    ("stats", &[]),
    ("metrics", &["stats"]),
    ("trace", &["core", "sys"]),
    ("cli", &["core", "fs", "fuse", "daemon", "client"]),
    ("fstab", &["cli", "sys"]),
    ("install", &["fstab", "sys"]),
    ("cache", &["core", "sys", "stats"]),
    // The shared file system's port (the one way to it), and the engine that fills the cache
    // from a source: the file system and the cluster each use them, neither through the other.
    ("backing", &["core", "sys", "cache"]),
    ("fill", &["core", "sys", "stats", "cache"]),
    ("fs", &["core", "sys", "stats", "cache", "backing", "fill"]),
    // The kernel adapter: what the kernel sends, brought to the file system's calls; the file
    // system knows nothing of the kernel.
    ("fuse", &["core", "sys", "stats", "cache", "fs"]),
    ("transport", &["core", "sys"]),
    ("locator", &["core", "sys", "stats", "transport"]),
    (
        "cluster",
        &[
            "core",
            "sys",
            "stats",
            "cache",
            "backing",
            "fill",
            "transport",
            "locator",
        ],
    ),
    (
        "daemon",
        &[
            "core",
            "sys",
            "stats",
            "cache",
            "backing",
            "fill",
            "fs",
            "transport",
            "locator",
            "cluster",
            "metrics",
            "fuse",
        ],
    ),
    // The commands that talk to a running mount: what they need of the daemon is its errors
    // and whether a path is a mount point.
    ("client", &["core", "sys", "stats", "cache", "fs", "daemon"]),
];

/// Layers that may use only some of a module below: (user, used, the items it may name). The
/// locator speaks to its peers through its port (`locator::peers`); the connections behind it
/// are the cluster layer's, so it names the transport's error, framing and secret only. The
/// client names the daemon's error type and its mount-point test, never a mount's parts.
const NARROW: &[(&str, &str, &[&str])] = &[
    ("locator", "transport", &["TransportError", "frame", "auth"]),
    ("client", "daemon", &["UserError", "is_mount_point"]),
];

fn rust_files(path: &Path, out: &mut Vec<std::path::PathBuf>) {
    if path.is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            rust_files(&e.unwrap().path(), out);
        }
    } else if path.is_file() && path.extension().is_some_and(|x| x == "rs") {
        out.push(path.to_path_buf());
    }
}

#[test]
fn arrows_only_point_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (module, allowed) in LAYERS {
        let mut files = Vec::new();
        rust_files(&src.join(module), &mut files);
        rust_files(&src.join(format!("{module}.rs")), &mut files);
        assert!(!files.is_empty(), "no files for module {module}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                for (at, _) in line.match_indices("crate::") {
                    let used: String = line[at + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    checked += 1;
                    let item: String = line[at + 7 + used.len()..]
                        .trim_start_matches("::")
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    let narrow = NARROW
                        .iter()
                        .find(|(user, below, _)| user == module && *below == used)
                        .is_some_and(|(_, _, items)| !items.contains(&item.as_str()));
                    if used != *module && (!allowed.contains(&used.as_str()) || narrow) {
                        wrong.push(format!(
                            "{}:{}: {module} uses {used}::{item}",
                            file.strip_prefix(&src).unwrap().display(),
                            n + 1
                        ));
                    }
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} crate:: paths found");
    assert!(
        wrong.is_empty(),
        "arrows that point up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_module_has_a_layer() {
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    for line in lib.lines() {
        if let Some(m) = line.strip_prefix("pub mod ") {
            let m = m.trim_end_matches(';');
            assert!(
                LAYERS.iter().any(|(name, _)| *name == m),
                "module {m} has no layer in tests/layers.rs"
            );
        }
    }
}

/// Within a folder, the files' imports of one another form no cycle (a cycle is one concept
/// split in two files, or two concepts that should meet below both).
#[test]
fn no_cycles_inside_a_folder() {
    use std::collections::{HashMap, HashSet};
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut folders = vec![src.clone()];
    let mut cycles = Vec::new();
    while let Some(dir) = folders.pop() {
        let mut stems: Vec<(String, String)> = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                folders.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let stem = p.file_stem().unwrap().to_string_lossy().to_string();
                if stem != "mod" && stem != "lib" && stem != "main" {
                    stems.push((stem, std::fs::read_to_string(&p).unwrap()));
                }
            }
        }
        let names: HashSet<&str> = stems.iter().map(|(s, _)| s.as_str()).collect();
        let folder = dir
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('/', "::");
        let mut edges: HashMap<&str, HashSet<&str>> = HashMap::new();
        for (stem, text) in &stems {
            // Code only: a doc link to a sibling is no import.
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let text = &code;
            let prefixes = ["super::".to_string(), format!("crate::{folder}::")];
            for prefix in prefixes.iter().filter(|p| !p.ends_with("crate::::")) {
                for (at, _) in text.match_indices(prefix.as_str()) {
                    let used: String = text[at + prefix.len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if let Some(&n) = names.get(used.as_str())
                        && n != stem
                    {
                        edges.entry(stem.as_str()).or_default().insert(n);
                    }
                }
            }
        }
        // A cycle is an edge a -> b with a path b -> a.
        for (a, outs) in &edges {
            for b in outs {
                let (mut seen, mut stack) = (HashSet::new(), vec![*b]);
                while let Some(n) = stack.pop() {
                    if n == *a {
                        cycles.push(format!("{}: {a} <-> {b}", dir.display()));
                        break;
                    }
                    if seen.insert(n) {
                        stack.extend(edges.get(n).into_iter().flatten().copied());
                    }
                }
            }
        }
    }
    cycles.sort();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

/// docs/ARCHITECTURE.md's section between `## {title}` and the next `## `.
fn architecture_section(title: &str) -> String {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/ARCHITECTURE.md"))
            .unwrap();
    let start = page
        .find(&format!("\n## {title}"))
        .unwrap_or_else(|| panic!("no section {title} in ARCHITECTURE.md"));
    let rest = &page[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_string()
}

/// The page's table of modules says what the table above says each may use.
#[test]
fn the_architecture_page_draws_these_layers() {
    let layers = architecture_section("Layers");
    let mut rows = 0;
    for line in layers.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let module = cells[1].trim_matches('`').trim_end_matches('/');
        let module = module.strip_suffix(".rs").unwrap_or(module);
        let documented: Vec<&str> = match cells[2] {
            "—" => Vec::new(),
            // "transport (only `TransportError`, `frame` and `auth`)": the module's name.
            used => used
                .split(" (")
                .enumerate()
                .flat_map(|(i, part)| {
                    match i {
                        0 => part,
                        _ => part.split_once(')').map_or("", |(_, after)| after),
                    }
                    .split(", ")
                })
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .collect(),
        };
        let Some((_, allowed)) = LAYERS.iter().find(|(name, _)| *name == module) else {
            panic!("ARCHITECTURE.md has a row for {module}, which has no layer here");
        };
        let (mut a, mut b) = (documented.clone(), allowed.to_vec());
        a.sort();
        b.sort();
        assert_eq!(
            a, b,
            "what {module} may use: ARCHITECTURE.md against tests/layers.rs"
        );
        rows += 1;
    }
    assert_eq!(
        rows,
        LAYERS.len(),
        "every layer has its row in ARCHITECTURE.md"
    );
}

/// Every file under src/ is on the page's list of files: in its folder's list, in the item of
/// its subfolder there (`- \`ring/\`: \`mod.rs\` ...`), or by its path from src/.
#[test]
fn the_architecture_page_lists_every_file() {
    let section = architecture_section("Files");
    // Each item of the list with the folder its names are in: a folder's heading ("`fs/`:",
    // "`fuse/`, the kernel adapter ...") starts a folder, an item "- `sub/`: ..." a subfolder.
    let mut items: Vec<(String, String)> = Vec::new();
    let mut folder = String::new();
    for line in section.lines() {
        let heading = line
            .strip_prefix('`')
            .and_then(|l| l.split_once("/`"))
            .filter(|(f, _)| !f.contains(' '));
        if let Some((f, _)) = heading {
            folder = format!("{f}/");
        } else if let Some(item) = line.strip_prefix("- ") {
            let sub = item
                .strip_prefix('`')
                .and_then(|l| l.split_once("/`"))
                .filter(|(f, _)| !f.contains(' ') && !f.contains('.'));
            let prefix = match sub {
                Some((s, _)) => format!("{folder}{s}/"),
                None => folder.clone(),
            };
            items.push((prefix, item.to_string()));
        } else if let Some((_, text)) = items.last_mut() {
            text.push(' ');
            text.push_str(line);
        }
    }
    let named = |text: &str, file: &str| text.contains(&format!("`{file}`"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut missing = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().to_string();
        let listed = named(&section, &rel)
            || items.iter().any(|(prefix, text)| {
                rel.strip_prefix(prefix.as_str())
                    .is_some_and(|rest| named(text, rest))
            });
        if !listed {
            missing.push(rel);
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "files ARCHITECTURE.md does not list:\n{}",
        missing.join("\n")
    );
}
