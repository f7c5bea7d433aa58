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
    ("cli", &["core", "fs", "fuse", "daemon", "client", "node"]),
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
    // The node service: one process serving many users' mounts, each built of the daemon's
    // parts and served by the kernel adapter from a descriptor a user's fusermount3 made; in a
    // site, the cluster's fetch logic over one locator and control port for every dataset.
    (
        "node",
        &[
            "core",
            "sys",
            "stats",
            "cache",
            "backing",
            "fs",
            "fuse",
            "transport",
            "locator",
            "cluster",
            "daemon",
            "metrics",
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

/// Every `a::b::c` path a file names: those of its `use` items, groups expanded
/// (`use super::{a, b::{c, d}}` names `super::a`, `super::b::c`, `super::b::d`), and those
/// written inline (`super::x::f()`).
fn paths_named(code: &str) -> Vec<String> {
    fn expand(prefix: &str, body: &str, out: &mut Vec<String>) {
        let Some(open) = body.find('{') else {
            out.push(format!("{prefix}{body}"));
            return;
        };
        let Some(close) = body.rfind('}') else { return };
        let (head, inner) = (&body[..open], &body[open + 1..close]);
        let (mut depth, mut part) = (0, String::new());
        for c in inner.chars().chain([',']) {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    if !part.is_empty() {
                        expand(&format!("{prefix}{head}"), &part, out);
                    }
                    part.clear();
                    continue;
                }
                _ => {}
            }
            part.push(c);
        }
    }
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = &rest[..at];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let lead = before[line_start..].trim();
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if lead.is_empty() || lead.starts_with("pub") {
            let body: String = after[..end]
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            expand("", &body, &mut out);
        }
        rest = &after[end.min(after.len())..];
    }
    for start in ["super::", "crate::", "self::"] {
        for (at, _) in code.match_indices(start) {
            let prev = code[..at].chars().next_back();
            if prev.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let path: String = code[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push(path);
        }
    }
    out
}

/// A file's code without comments and its unit tests.
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text
        .find("#[cfg(test)]\nmod tests")
        .map_or(text.as_str(), |i| &text[..i]);
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Within a folder, the files' imports of one another form no cycle (a cycle is one concept
/// split in two files, or two concepts that should meet below both). `mod.rs` is a file like the
/// others: a child that takes an item defined there points up at it, and `mod.rs` points down at
/// each child it uses or re-exports.
#[test]
fn no_cycles_inside_a_folder() {
    use std::collections::{BTreeSet, HashMap, HashSet};
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut folders = vec![src.clone()];
    let mut cycles = BTreeSet::new();
    while let Some(dir) = folders.pop() {
        // The folder's modules: its files (tests aside) and subfolders with a mod.rs.
        let mut files: Vec<(String, std::path::PathBuf)> = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                folders.push(p.clone());
                if p.join("mod.rs").exists() {
                    let stem = p.file_name().unwrap().to_string_lossy().to_string();
                    files.push((stem, p.join("mod.rs")));
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                let stem = p.file_stem().unwrap().to_string_lossy().to_string();
                if stem != "lib" && stem != "main" && !stem.ends_with("tests") {
                    files.push((stem, p));
                }
            }
        }
        let folder = dir
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('/', "::");
        let siblings: HashSet<&str> = files
            .iter()
            .map(|(s, _)| s.as_str())
            .filter(|s| *s != "mod")
            .collect();
        // The items mod.rs defines itself (not those it re-exports).
        let defined: HashSet<String> = files
            .iter()
            .find(|(s, _)| s == "mod")
            .map(|(_, p)| {
                code_of(p)
                    .lines()
                    .filter(|l| !l.starts_with(' '))
                    .filter_map(|l| {
                        let l = l
                            .trim_start_matches("pub(crate) ")
                            .trim_start_matches("pub ");
                        let l = l.trim_start_matches("unsafe ").trim_start_matches("async ");
                        let (kw, rest) = l.split_once(' ')?;
                        ["struct", "enum", "trait", "type", "fn", "const", "static"]
                            .contains(&kw)
                            .then(|| rest.split(|c: char| !c.is_alphanumeric() && c != '_'))
                            .and_then(|mut n| n.next().map(str::to_string))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let own = format!("crate::{folder}::");
        let mut edges: HashMap<String, HashSet<String>> = HashMap::new();
        for (stem, path) in &files {
            for named in paths_named(&code_of(path)) {
                let rest = if stem == "mod" {
                    named.strip_prefix("self::").or(named.strip_prefix(&own))
                } else {
                    named.strip_prefix("super::").or(named.strip_prefix(&own))
                };
                // From mod.rs, a child's own name is a path down to it too (`pub use a::B`).
                let rest = rest.or((stem == "mod").then_some(named.as_str()));
                let Some(first) = rest.and_then(|r| r.split("::").next()) else {
                    continue;
                };
                let to = if siblings.contains(first) {
                    first.to_string()
                } else if stem != "mod" && defined.contains(first) && !folder.is_empty() {
                    "mod".to_string()
                } else {
                    continue;
                };
                if &to != stem {
                    edges.entry(stem.clone()).or_default().insert(to);
                }
            }
        }
        // A cycle is an edge a -> b with a path b -> a.
        for (a, outs) in &edges {
            for b in outs {
                let (mut seen, mut stack) = (HashSet::new(), vec![b.as_str()]);
                while let Some(n) = stack.pop() {
                    if n == a {
                        let (x, y) = if a < b { (a, b) } else { (b, a) };
                        cycles.insert(format!("{folder}: {x} <-> {y}"));
                        break;
                    }
                    if seen.insert(n) {
                        stack.extend(edges.get(n).into_iter().flatten().map(String::as_str));
                    }
                }
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{cycles:#?}");
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
