//! The command line's sizes and durations (`512M`, `30s`).

use std::time::Duration;

/// Parses a byte size: a number with an optional K, M, G or T suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("unknown size suffix in {s:?} (use K, M, G or T)")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 512M, 20G, 1T)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("{s:?} is not a size (examples: 512M, 20G, 1T)"));
    }
    Ok((value * (1u64 << shift) as f64) as u64)
}

pub(super) fn parse_chunk_size(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if !(1 << 20..=4 << 20).contains(&v) || !v.is_power_of_two() {
        return Err(format!("chunk size must be 1M, 2M or 4M, not {s}"));
    }
    Ok(v)
}

/// `--capacity`: a size above zero (a cache that may hold nothing could serve nothing).
pub(super) fn parse_capacity(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("the capacity must be above 0".into()),
        v => Ok(v),
    }
}

/// `--wait`: at most 1h (a name home holds a waiting lookup no longer).
pub(super) fn parse_wait(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > Duration::from_secs(3600) {
        return Err(format!("{s} is more than the longest wait, 1h"));
    }
    Ok(d)
}

/// A kernel readahead for the mount: at most 1G (the kernel takes any number, and would read
/// that far ahead of every sequential reader).
pub(super) fn parse_readahead(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v > 1 << 30 {
        return Err(format!("the kernel's readahead is at most 1G, not {s}"));
    }
    Ok(v)
}

/// Parses a duration: a number with an optional ms, s, m or h suffix (seconds by default).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else if let Some(n) = t.strip_suffix('d') {
        (n, 86400.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 500ms, 30s, 5m)"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "{s:?} is not a duration (examples: 500ms, 30s, 5m)"
        ));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("20G"), Ok(20 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_chunk_size("3M").is_err());
        assert_eq!(parse_chunk_size("4M"), Ok(4 << 20));
        assert_eq!(parse_readahead("1M"), Ok(1 << 20));
        assert!(parse_readahead("2G").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("soon").is_err());
    }
}
