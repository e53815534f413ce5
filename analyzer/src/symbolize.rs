//! Addresses to names, as `addr2line -f` gives them: the routine and the
//! offset into it, and the source file and line where the image has line
//! tables. `vtrace analyze symbolize` and every report that prints a bare
//! address go through here.

use serde::Serialize;

use vtrace_image::symbols::{cr3_root, Symbolizer};

/// An address to name: `ADDR`, or `ADDR@CR3` for one address space's
/// (a user program's) code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressQuery {
    /// The address.
    pub addr: u64,
    /// The address space (its page-table root), where given.
    pub space: Option<u64>,
}

impl AddressQuery {
    /// Parses `ADDR` or `ADDR@CR3`, both hex with or without `0x` (how
    /// listings, `nm` and crash reports print them); `what went wrong` in
    /// words otherwise.
    pub fn parse(text: &str) -> Result<AddressQuery, String> {
        let (addr, space) = match text.split_once('@') {
            Some((a, s)) => (a, Some(s)),
            None => (text, None),
        };
        let hex = |t: &str| {
            let digits = t
                .strip_prefix("0x")
                .or_else(|| t.strip_prefix("0X"))
                .unwrap_or(t);
            u64::from_str_radix(digits, 16).ok()
        };
        let bad = || format!("{text:?} is not an address (hex: 0xffffffff81000000, or ADDR@CR3)");
        Ok(AddressQuery {
            addr: hex(addr).ok_or_else(bad)?,
            space: match space {
                Some(s) => Some(cr3_root(hex(s).ok_or_else(bad)?)),
                None => None,
            },
        })
    }
}

/// What an address names. Fields the symbols do not know are `None`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Named {
    /// The address.
    pub address: u64,
    /// Its address space, where the query gave one.
    pub space: Option<u64>,
    /// The routine containing it.
    pub routine: Option<String>,
    /// Bytes past the routine's first.
    pub offset: Option<u64>,
    /// The source file, as the line table names it.
    pub file: Option<String>,
    /// The source line.
    pub line: Option<u32>,
    /// Where the routine's symbol came from (the image or symbol file).
    pub source: Option<String>,
}

/// Names `query` with `symbols`. An address in no routine is named by
/// nothing, never by the nearest symbol below it.
pub fn name_address(symbols: &Symbolizer, query: AddressQuery) -> Named {
    let space = query.space.unwrap_or(0);
    let resolved = symbols.resolve(query.addr, space);
    let (file, line) = match resolved {
        Some(_) => match symbols.location(query.addr, space) {
            Some((file, line)) => (Some(file), line),
            None => (None, None),
        },
        None => (None, None),
    };
    Named {
        address: query.addr,
        space: query.space,
        routine: resolved.map(|r| r.name.to_string()),
        offset: resolved.map(|r| r.offset),
        file,
        line,
        source: resolved
            .and_then(|_| symbols.origin_of(query.addr, space))
            .map(str::to_string),
    }
}

impl Named {
    /// `routine+0xoff` (`routine` at offset 0), or `??` as addr2line
    /// says it.
    pub fn routine_text(&self) -> String {
        match (&self.routine, self.offset) {
            (Some(r), Some(0) | None) => r.clone(),
            (Some(r), Some(off)) => format!("{r}+{off:#x}"),
            (None, _) => "??".to_string(),
        }
    }

    /// One line: the address, `routine+0xoff` and, where known,
    /// `file:line`.
    pub fn text(&self) -> String {
        let mut out = format!("{:#018x} {}", self.address, self.routine_text());
        if let Some(file) = &self.file {
            out.push(' ');
            out.push_str(file);
            if let Some(line) = self.line {
                out.push_str(&format!(":{line}"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_image::symbols::Scope;

    #[test]
    fn addresses_parse_as_listings_and_nm_print_them() {
        let q = |t| AddressQuery::parse(t);
        assert_eq!(
            q("0xffffffff81000000"),
            Ok(AddressQuery {
                addr: 0xffff_ffff_8100_0000,
                space: None
            })
        );
        assert_eq!(q("401000").map(|a| a.addr), Ok(0x401000));
        assert_eq!(
            q("0x401000@0x1234567"),
            Ok(AddressQuery {
                addr: 0x401000,
                space: Some(0x1234000)
            })
        );
        for bad in [
            "",
            "0x",
            "main",
            "0x401000@",
            "@0x1000",
            "1_000",
            "0x1g",
            "ffffffffffffffff0",
        ] {
            assert!(q(bad).is_err(), "{bad:?} parsed");
        }
    }

    fn demo() -> Symbolizer {
        let mut s = Symbolizer::new();
        s.add_elf(vtrace_demo::DEMO_OS_ELF, "demo.elf", Scope::Any)
            .unwrap();
        s
    }

    #[test]
    fn a_routine_inside_the_demo_is_named_with_its_offset_and_line() {
        let symbols = demo();
        let start = symbols.addresses_of("schedule")[0];
        let named = name_address(
            &symbols,
            AddressQuery {
                addr: start + 3,
                space: None,
            },
        );
        assert_eq!(named.routine.as_deref(), Some("schedule"));
        assert_eq!(named.offset, Some(3));
        assert_eq!(named.routine_text(), "schedule+0x3");
        assert!(named
            .file
            .as_deref()
            .is_some_and(|f| f.ends_with("os/sched.c")));
        assert!(named.line.is_some());
        assert_eq!(named.source.as_deref(), Some("demo.elf"));
        let text = named.text();
        assert!(
            text.starts_with(&format!("{:#018x} schedule+0x3 ", start + 3)),
            "{text}"
        );
    }

    #[test]
    fn an_address_outside_every_routine_is_named_by_nothing() {
        let named = name_address(
            &demo(),
            AddressQuery {
                addr: 0xdead_0000_0000,
                space: None,
            },
        );
        assert_eq!(named.routine, None);
        assert_eq!(named.file, None);
        assert_eq!(named.text(), "0x0000dead00000000 ??");
    }
}
