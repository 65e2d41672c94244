//! Human-readable byte sizes: "64KiB", "1.5GiB", "4096", "10GB".

/// Parses a size with an optional unit (B, KiB, MiB, GiB, TiB, or the decimal
/// KB, MB, GB, TB; K/M/G/T alone mean the binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num.parse().map_err(|_| format!("'{s}' is not a size (try 64KiB, 1GiB or 4096)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => return Err(format!("unknown size unit '{other}' in '{s}' (use B, KiB, MiB, GiB, TiB)")),
    };
    let v = num * mult as f64;
    if !(0.0..=u64::MAX as f64).contains(&v) {
        return Err(format!("size '{s}' is out of range"));
    }
    Ok(v as u64)
}

/// Formats bytes with a binary unit: "1.5 GiB".
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        for (s, v) in [
            ("4096", 4096),
            ("64KiB", 65536),
            ("64k", 65536),
            ("1GiB", 1 << 30),
            ("1.5MiB", 3 << 19),
            ("10GB", 10_000_000_000),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
