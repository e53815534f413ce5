//! Parsing sizes and addresses given on the command line.

/// "256M", "4G", "4GiB", "512k", "1048576" → bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (examples: 256M, 4G, 1048576)"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "'{text}': unknown unit '{unit}' (use K, M, G or T)"
            ))
        }
    };
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("'{text}' is too large"))
}

/// "0x7c00" or "31744" → address.
pub fn parse_address(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => t.replace('_', "").parse(),
    };
    parsed.map_err(|_| format!("'{text}' is not an address (examples: 0x7c00, 31744)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_address("0x7c00"), Ok(0x7c00));
        assert_eq!(parse_address("31744"), Ok(31744));
        assert_eq!(parse_address("0x1_0000"), Ok(0x10000));
        assert!(parse_address("0xZZ").is_err());
    }
}
