//! Parsing sizes, intervals and captures given on the command line
//! (locations and addresses are the session library's).

use vtrace_storage::Regs;
use vtrace_trap::MAX_CAPTURE_LENGTH;

use vtrace_session::{parse_address, parse_location, CaptureRequest};

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

/// "100us", "1ms", "2s", "500000ns" → a duration. By hand rather than
/// with a crate: four units, and the message says which.
pub fn parse_interval(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    let bad = || format!("'{text}' is not an interval (examples: 100us, 1ms, 2s)");
    let value: u64 = number.parse().map_err(|_| bad())?;
    let ns_per = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return Err(bad()),
    };
    value
        .checked_mul(ns_per)
        .map(std::time::Duration::from_nanos)
        .ok_or_else(|| format!("'{text}' is too long"))
}

/// "kprintf:rdi:64", "vtprog:main:rsi:16:argv" or "0x1000d0:rax:8:buf"
/// → capture. The place may itself hold a colon (PROGRAM:ROUTINE), so the
/// register is found as the first name of one followed by a number.
pub fn parse_capture(text: &str) -> Result<CaptureRequest, String> {
    let parts: Vec<&str> = text.trim().split(':').collect();
    let usage = || {
        format!(
            "'{text}' is not a capture: give WHERE:REGISTER:LENGTH[:NAME], e.g. \
             kprintf:rdi:64 or vtprog:main:rsi:16:argv (REGISTER: rax ... r15; LENGTH: 1 to \
             {MAX_CAPTURE_LENGTH} bytes)"
        )
    };
    let at = (1..parts.len().saturating_sub(1))
        .find(|&i| Regs::gpr_index(parts[i]).is_some() && parse_address(parts[i + 1]).is_ok())
        .ok_or_else(usage)?;
    let place = parse_location(&parts[..at].join(":"))?;
    let register = Regs::gpr_index(parts[at]).ok_or_else(usage)?;
    let length = parse_address(parts[at + 1])?;
    let length = u32::try_from(length)
        .ok()
        .filter(|l| (1..=MAX_CAPTURE_LENGTH).contains(l))
        .ok_or_else(|| {
            format!("'{text}': a capture copies 1 to {MAX_CAPTURE_LENGTH} bytes, not {length}")
        })?;
    let name = match parts[at + 2..].join(":") {
        n if n.is_empty() => parts[..at].join(":"),
        n => n,
    };
    Ok(CaptureRequest {
        place,
        register,
        length,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_session::Location;

    #[test]
    fn intervals_in_the_four_units() {
        use std::time::Duration;
        assert_eq!(parse_interval("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_interval("100µs"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_interval("2ms"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("500ns"), Ok(Duration::from_nanos(500)));
        assert!(parse_interval("100").is_err(), "a unit is needed");
        assert!(parse_interval("1.5ms").is_err());
        assert!(parse_interval("99999999999999s").is_err());
    }

    #[test]
    fn captures() {
        let c = parse_capture("kprintf:rdi:64").unwrap();
        assert_eq!(
            c,
            CaptureRequest {
                place: Location::Symbol {
                    program: None,
                    name: "kprintf".into(),
                    offset: 0
                },
                register: 7,
                length: 64,
                name: "kprintf".into(),
            }
        );
        let c = parse_capture("vtprog:main+4:RSI:0x10:argv").unwrap();
        assert_eq!(c.register, 6);
        assert_eq!(c.length, 16);
        assert_eq!(c.name, "argv");
        assert_eq!(
            c.place,
            Location::Symbol {
                program: Some("vtprog".into()),
                name: "main".into(),
                offset: 4
            }
        );
        assert_eq!(
            parse_capture("0x1000:r8:1").unwrap().place,
            Location::Address(0x1000)
        );
        for bad in [
            "kprintf",
            "kprintf:rdi",
            "kprintf:rip:64",
            "kprintf:rdi:0",
            "kprintf:rdi:4097",
            ":rdi:8",
            "rdi:8",
        ] {
            assert!(parse_capture(bad).is_err(), "{bad}");
        }
    }

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
}
