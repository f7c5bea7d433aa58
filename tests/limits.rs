//! The house's sizes, held against the code: no file under `src/` (nor `ucx-sys/src/`) over
//! 700 lines, and no function (a `fn` item: free, method, nested or test) over 120 lines, counted
//! from the line of its `fn` to the line of its closing brace. A file or function past its limit
//! fails here with its path, line and length: split it along its seams (docs/ARCHITECTURE.md).

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 700;
const MAX_FN_LINES: usize = 120;

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            rust_files(&e.unwrap().path(), out);
        }
    } else if path.is_file() && path.extension().is_some_and(|x| x == "rs") {
        out.push(path.to_path_buf());
    }
}

/// The files held to the limits, with the path each is reported by.
fn checked_files() -> Vec<(String, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "ucx-sys/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .map(|f| (f.strip_prefix(root).unwrap().display().to_string(), f))
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The code with every comment, string and character literal blanked (each of their characters
/// but newlines made a space), so that what is left of braces and `fn`s is the code's own.
fn blanked(text: &str) -> Vec<char> {
    let s: Vec<char> = text.chars().collect();
    let mut out = s.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in &mut out[from..to.min(s.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let mut i = 0;
    while i < s.len() {
        let at = |k: usize| s.get(k).copied().unwrap_or('\0');
        // Where a raw string may start: an `r` that ends no identifier but a `b` or `c` prefix.
        let raw_start = i == 0
            || !is_ident(s[i - 1])
            || matches!(s[i - 1], 'b' | 'c') && (i == 1 || !is_ident(s[i - 2]));
        match s[i] {
            // A line comment, to its line's end.
            '/' if at(i + 1) == '/' => {
                let end = (i..s.len()).find(|&k| s[k] == '\n').unwrap_or(s.len());
                blank(&mut out, i, end);
                i = end;
            }
            // A block comment, which may nest.
            '/' if at(i + 1) == '*' => {
                let (mut k, mut depth) = (i + 2, 1);
                while k < s.len() && depth > 0 {
                    if s[k] == '/' && at(k + 1) == '*' {
                        depth += 1;
                        k += 2;
                    } else if s[k] == '*' && at(k + 1) == '/' {
                        depth -= 1;
                        k += 2;
                    } else {
                        k += 1;
                    }
                }
                blank(&mut out, i, k);
                i = k;
            }
            // A raw string: r"..", r#".."#, br"..", cr#".."# and so on.
            'r' if raw_start => {
                let mut k = i + 1;
                while at(k) == '#' {
                    k += 1;
                }
                if at(k) != '"' {
                    i += 1;
                    continue;
                }
                let hashes = k - i - 1;
                let mut end = k + 1;
                while end < s.len() && !(s[end] == '"' && (1..=hashes).all(|h| at(end + h) == '#'))
                {
                    end += 1;
                }
                let end = (end + 1 + hashes).min(s.len());
                blank(&mut out, i, end);
                i = end;
            }
            // A string (b".." and c".." too: the prefix is left, the quotes on are blanked).
            '"' => {
                let mut k = i + 1;
                while k < s.len() && s[k] != '"' {
                    k += if s[k] == '\\' { 2 } else { 1 };
                }
                blank(&mut out, i, k + 1);
                i = k + 1;
            }
            // A character ('a', '\n', '\u{1F600}', b'x'), or else a lifetime ('a, 'static).
            '\'' => {
                if at(i + 1) == '\\' {
                    let mut k = i + 2;
                    while k < s.len() && s[k] != '\'' {
                        k += 1;
                    }
                    blank(&mut out, i, k + 1);
                    i = k + 1;
                } else if at(i + 2) == '\'' {
                    blank(&mut out, i, i + 3);
                    i += 3;
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// Each function of the code: (its name, the line of its `fn`, its length in lines).
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let s = blanked(text);
    let mut line_of = Vec::with_capacity(s.len());
    let mut line = 1;
    for &c in &s {
        line_of.push(line);
        if c == '\n' {
            line += 1;
        }
    }
    let mut found = Vec::new();
    let mut i = 0;
    while i + 2 < s.len() {
        let word = s[i] == 'f'
            && s[i + 1] == 'n'
            && (i == 0 || !is_ident(s[i - 1]))
            && s[i + 2].is_whitespace();
        if !word {
            i += 1;
            continue;
        }
        // `fn name`: a function item; `fn(u8)` is a pointer type, `fn $name` a macro's.
        let mut k = i + 2;
        while k < s.len() && s[k].is_whitespace() {
            k += 1;
        }
        let name: String = s[k..].iter().take_while(|c| is_ident(**c)).collect();
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            i += 2;
            continue;
        }
        // Its body's opening brace, unless a `;` outside brackets ends a body-less declaration.
        let mut depth = 0i32;
        let mut open = None;
        while k < s.len() {
            match s[k] {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => break,
                '{' if depth == 0 => {
                    open = Some(k);
                    break;
                }
                _ => {}
            }
            k += 1;
        }
        if let Some(open) = open {
            let mut depth = 0;
            let mut close = open;
            for (j, &c) in s.iter().enumerate().skip(open) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    close = j;
                    break;
                }
            }
            found.push((name, line_of[i], line_of[close] - line_of[i] + 1));
        }
        i += 2;
    }
    found
}

#[test]
fn no_file_is_over_its_limit() {
    let mut long = Vec::new();
    for (name, path) in checked_files() {
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        if lines > MAX_FILE_LINES {
            long.push(format!("{name}: {lines} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines (split each along its seams):\n{}",
        long.join("\n")
    );
}

#[test]
fn no_function_is_over_its_limit() {
    let mut long = Vec::new();
    let mut seen = 0;
    for (name, path) in checked_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        for (f, line, lines) in functions(&text) {
            seen += 1;
            if lines > MAX_FN_LINES {
                long.push(format!("{name}:{line}: fn {f}: {lines} lines"));
            }
        }
    }
    assert!(seen > 1000, "only {seen} functions found");
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// The scanner itself: braces and `fn`s in comments, strings and characters are not code.
#[test]
fn the_scanner_skips_what_is_not_code() {
    let code = r##"
fn a() {
    let s = "}"; // }
    let c = '{'; let d = '\''; let e: &'static str = r#"fn x() {"#;
    /* } /* nested } */ fn y() { */
    let f: fn(u8) -> u8 = |x| x;
}
trait T { fn b(&self) -> [u8; 4]; fn c(&self) {
} }
"##;
    let found = functions(code);
    assert_eq!(
        found,
        vec![("a".to_string(), 2, 6), ("c".to_string(), 8, 2)],
        "{found:?}"
    );
}
