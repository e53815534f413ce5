//! Where a trigger, a capture or a `fn:` probe fires, as a user writes it.

/// Where a trigger fires: an address, or a routine (resolved once the
/// kernel is known) plus an offset: of the kernel's symbols, or of a user
/// program's (`program:routine`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A linear address.
    Address(u64),
    /// A routine by name.
    Symbol {
        /// The user program the routine is in; `None`: the kernel.
        program: Option<String>,
        /// The routine's symbol.
        name: String,
        /// Bytes past the routine's first.
        offset: u64,
    },
}

impl std::fmt::Display for Location {
    /// As the user would write it again.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Address(a) => write!(f, "{a:#x}"),
            Location::Symbol {
                program,
                name,
                offset,
            } => {
                if let Some(p) = program {
                    write!(f, "{p}:")?;
                }
                write!(f, "{name}")?;
                if *offset != 0 {
                    write!(f, "+{offset:#x}")?;
                }
                Ok(())
            }
        }
    }
}

/// "0x100000", "start_kernel", "schedule+0x10" or "vtprog:main" → a
/// location; the error says what was wrong, for the user.
pub fn parse_location(text: &str) -> Result<Location, String> {
    let t = text.trim();
    if t.starts_with(|c: char| c.is_ascii_digit()) {
        return parse_address(t).map(Location::Address);
    }
    let (program, routine) = match t.split_once(':') {
        Some((program, routine)) => (Some(program), routine),
        None => (None, t),
    };
    let (name, offset) = match routine.split_once('+') {
        Some((name, off)) => (name, parse_address(off)?),
        None => (routine, 0),
    };
    let bad = |s: &str| s.is_empty() || s.contains(char::is_whitespace);
    if bad(name) || program.is_some_and(bad) {
        return Err(format!(
            "'{text}' is neither an address nor a routine name (examples: 0x100000, \
             start_kernel, schedule+0x10, a user program's vtprog:main)"
        ));
    }
    Ok(Location::Symbol {
        program: program.map(str::to_string),
        name: name.to_string(),
        offset,
    })
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
    fn locations() {
        assert_eq!(parse_location("0x1000"), Ok(Location::Address(0x1000)));
        assert_eq!(
            parse_location("schedule+0x10"),
            Ok(Location::Symbol {
                program: None,
                name: "schedule".into(),
                offset: 0x10
            })
        );
        assert_eq!(
            parse_location("start_kernel"),
            Ok(Location::Symbol {
                program: None,
                name: "start_kernel".into(),
                offset: 0
            })
        );
        assert_eq!(
            parse_location("/bin/vtprog:main+4"),
            Ok(Location::Symbol {
                program: Some("/bin/vtprog".into()),
                name: "main".into(),
                offset: 4
            })
        );
        assert!(parse_location(":main").is_err());
        assert!(parse_location("vtprog:").is_err());
        assert!(parse_location("f+x").is_err());
        assert!(parse_location("0xzz").is_err());
    }

    #[test]
    fn locations_print_as_written() {
        for text in ["0x1000", "start_kernel", "schedule+0x10", "vtprog:main+0x4"] {
            assert_eq!(parse_location(text).unwrap().to_string(), text);
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_address("0x7c00"), Ok(0x7c00));
        assert_eq!(parse_address("31744"), Ok(31744));
        assert_eq!(parse_address("0x1_0000"), Ok(0x10000));
        assert!(parse_address("0xZZ").is_err());
    }
}
