//! The search path an ELF executable carries for its libraries (`DT_RUNPATH`, or the older
//! `DT_RPATH`), read and rewritten in place. `dyadfs install` gives the copy it installs a path
//! relative to itself: the build's path points into a checkout (`.tools/ucx`), which the
//! loader searches before the system's directories for *every* library, so whoever could write
//! there could hand root a `libc.so.6`. 64-bit little-endian images only (x86-64, aarch64).

/// Program header types and dynamic tags (elf.h).
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;

/// The `N` bytes at `at` (and `plus` past it), if the image holds them.
fn bytes_at<const N: usize>(b: &[u8], at: usize, plus: usize) -> Option<[u8; N]> {
    let start = at.checked_add(plus)?;
    b.get(start..start.checked_add(N)?)?.try_into().ok()
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    bytes_at(b, at, 0).map(u16::from_le_bytes)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    bytes_at(b, at, 0).map(u32::from_le_bytes)
}

fn u64_at(b: &[u8], at: usize, plus: usize) -> Option<u64> {
    bytes_at(b, at, plus).map(u64::from_le_bytes)
}

/// Where in the file each search-path string starts (file offsets of NUL-terminated strings).
fn search_paths(image: &[u8]) -> Result<Vec<usize>, String> {
    let bad = |what: &str| format!("not a 64-bit little-endian ELF image ({what})");
    if image.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1]) {
        return Err(bad("header"));
    }
    let phoff = u64_at(image, 0x20, 0).ok_or_else(|| bad("header"))? as usize;
    let phentsize = u16_at(image, 0x36).ok_or_else(|| bad("header"))? as usize;
    let phnum = u16_at(image, 0x38).ok_or_else(|| bad("header"))? as usize;
    if phentsize < 56 {
        return Err(bad("program header size"));
    }
    // (type, offset, vaddr, filesz) of each program header.
    let headers: Vec<(u32, u64, u64, u64)> = (0..phnum)
        .map(|i| {
            let h = phoff.checked_add(i.checked_mul(phentsize)?)?;
            Some((
                u32_at(image, h)?,
                u64_at(image, h, 8)?,
                u64_at(image, h, 16)?,
                u64_at(image, h, 32)?,
            ))
        })
        .collect::<Option<_>>()
        .ok_or_else(|| bad("program headers"))?;
    let to_offset = |vaddr: u64| {
        headers
            .iter()
            .find(|&&(t, _, va, sz)| t == PT_LOAD && vaddr >= va && vaddr - va < sz)
            .map(|&(_, off, va, _)| off.wrapping_add(vaddr - va) as usize)
    };
    let Some(&(_, dyn_off, _, dyn_size)) = headers.iter().find(|h| h.0 == PT_DYNAMIC) else {
        return Ok(Vec::new()); // statically linked: nothing to search
    };
    let (mut strtab, mut paths) = (None, Vec::new());
    for i in 0..(dyn_size / 16) as usize {
        let entry = |plus| u64_at(image, dyn_off as usize, i.checked_mul(16)? + plus);
        let (tag, val) = (
            entry(0).ok_or_else(|| bad("dynamic section"))?,
            entry(8).ok_or_else(|| bad("dynamic section"))?,
        );
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(val),
            DT_RPATH | DT_RUNPATH => paths.push(val),
            _ => {}
        }
    }
    if paths.is_empty() {
        return Ok(Vec::new());
    }
    let base = strtab
        .and_then(to_offset)
        .ok_or_else(|| bad("string table"))?;
    paths
        .into_iter()
        .map(|p| {
            let at = base.checked_add(p as usize).filter(|&a| a < image.len());
            at.ok_or_else(|| bad("search path offset"))
        })
        .collect()
}

fn c_str(image: &[u8], at: usize) -> Result<&[u8], String> {
    let rest = &image[at..];
    let len = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or("an unterminated search path")?;
    Ok(&rest[..len])
}

/// The image's library search paths (each a `:`-separated list), in the order it holds them.
pub fn runpaths(image: &[u8]) -> Result<Vec<String>, String> {
    search_paths(image)?
        .into_iter()
        .map(|at| Ok(String::from_utf8_lossy(c_str(image, at)?).into_owned()))
        .collect()
}

/// Replaces every library search path of the image by `new`, in place (padded with NULs: the
/// string table keeps its size, so `new` may be no longer than the path it replaces). Returns
/// the paths it replaced; none if the image has none (then the loader's defaults apply).
pub fn set_runpath(image: &mut [u8], new: &str) -> Result<Vec<String>, String> {
    let mut old = Vec::new();
    for at in search_paths(image)? {
        let len = c_str(image, at)?.len();
        old.push(String::from_utf8_lossy(&image[at..at + len]).into_owned());
        if new.len() > len {
            return Err(format!(
                "the new search path {new:?} is longer than the old one ({len} bytes)"
            ));
        }
        image[at..at + len].fill(0);
        image[at..at + new.len()].copy_from_slice(new.as_bytes());
    }
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program linked with a search path into a build tree (as a distribution's build of
    /// dyadfs might be): it is rewritten, read back, and nothing else of the image changes.
    /// Needs a C compiler (`scripts/install-deps.sh` installs gcc).
    #[test]
    fn a_search_path_is_rewritten_in_place() {
        let dir = std::env::temp_dir().join(format!("dyadfs-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, bin) = (dir.join("p.c"), dir.join("p"));
        std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
        let built = std::process::Command::new("cc")
            .arg(&src)
            .arg("-o")
            .arg(&bin)
            .arg("-Wl,-rpath,/home/someone/checkout/.tools/ucx/lib")
            .status();
        if !built.is_ok_and(|s| s.success()) {
            eprintln!("skipped: no C compiler");
            return;
        }
        let exe = std::fs::read(&bin).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let before = runpaths(&exe).unwrap();
        assert_eq!(before, ["/home/someone/checkout/.tools/ucx/lib"]);
        let mut copy = exe.clone();
        let old = set_runpath(&mut copy, "$ORIGIN/../lib").unwrap();
        assert_eq!(old, before);
        assert_eq!(
            runpaths(&copy).unwrap(),
            vec!["$ORIGIN/../lib"; before.len()]
        );
        assert_eq!(copy.len(), exe.len());
        let changed = exe.iter().zip(&copy).filter(|(a, b)| a != b).count();
        assert!(changed <= before.iter().map(String::len).sum::<usize>());
        let too_long = "x".repeat(before[0].len() + 1);
        assert!(set_runpath(&mut copy, &too_long).is_err());
    }

    #[test]
    fn what_is_not_an_image_is_refused_without_a_panic() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        for cut in [0, 5, 64, 200, 4096] {
            let _ = runpaths(&exe[..cut.min(exe.len())]);
        }
        assert!(runpaths(b"#!/bin/sh\n").is_err());
        let mut flipped = exe[..4096.min(exe.len())].to_vec();
        flipped[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(runpaths(&flipped).is_err());
    }
}
