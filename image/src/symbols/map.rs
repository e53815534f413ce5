//! `System.map`, `nm` output and `/proc/kallsyms` dumps: one symbol a line,
//! `ADDRESS TYPE NAME [MODULE]`.

use super::table::{Symbol, SymbolTable};
use super::SymbolError;

/// Whether an nm type letter marks code: `t`/`T` text, `w`/`W` weak
/// (Linux marks some weak functions so), `i` indirect functions.
fn is_code(kind: &str) -> bool {
    matches!(kind, "t" | "T" | "W" | "w" | "i")
}

/// Parses map text. Lines that are not symbols (blank, or a type that is
/// not code) are skipped; a line with a bad address is an error naming it,
/// because it means the file is not a map at all. All-zero addresses (a
/// kallsyms dump read without privileges) are refused with the reason.
pub fn parse_map(text: &str, origin: &str) -> Result<SymbolTable, SymbolError> {
    let mut entries = Vec::new();
    let mut zero = 0usize;
    let mut lines = 0usize;
    for (n, line) in text.lines().enumerate() {
        let mut fields = line.split_whitespace();
        let (Some(addr), Some(kind), Some(name)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        lines += 1;
        let start = u64::from_str_radix(addr, 16).map_err(|_| SymbolError::Parse {
            origin: origin.to_string(),
            line: n + 1,
            reason: format!("'{addr}' is not a hexadecimal address"),
        })?;
        if start == 0 {
            zero += 1;
            continue;
        }
        let name = match fields.next() {
            Some(module) => format!("{name} {module}"),
            None => name.to_string(),
        };
        entries.push((start, kind, name));
    }
    if lines > 0 && zero == lines {
        return Err(SymbolError::Parse {
            origin: origin.to_string(),
            line: 1,
            reason: "every address is zero: this kallsyms dump was read without the \
                     privilege to see addresses (read it as root, or set \
                     kernel.kptr_restrict=0)"
                .into(),
        });
    }
    code_table(entries, origin)
}

/// The code symbols among `(address, nm type, name)` entries, as a table:
/// global names before local ones and, among names at one address,
/// markers starting with '_' (`_stext`, `__kernel_start`) after the
/// routine's own name, as in ELF sources.
pub(super) fn code_table<'a>(
    entries: impl IntoIterator<Item = (u64, &'a str, String)>,
    origin: &str,
) -> Result<SymbolTable, SymbolError> {
    let mut globals = Vec::new();
    let mut locals = Vec::new();
    for (start, kind, name) in entries {
        if !is_code(kind) {
            continue;
        }
        let symbol = Symbol {
            start,
            size: 0,
            name,
        };
        if kind.chars().all(|c| c.is_ascii_uppercase()) {
            globals.push(symbol);
        } else {
            locals.push(symbol);
        }
    }
    globals.extend(locals);
    globals.sort_by_key(|s| (s.start, s.name.starts_with('_')));
    if globals.is_empty() {
        return Err(SymbolError::NoSymbols(origin.to_string()));
    }
    Ok(SymbolTable::new(globals, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_system_map_and_kallsyms_lines() {
        let text = "\
ffffffff81000000 T _stext
ffffffff81000010 t local_fn
ffffffff81000010 T global_alias
ffffffff81200000 D some_data
ffffffffc0000000 t mod_fn\t[ext4]
";
        let t = parse_map(text, "System.map").unwrap();
        let names: Vec<&str> = t.symbols().iter().map(|s| &s.name[..]).collect();
        assert_eq!(names, ["_stext", "global_alias", "mod_fn [ext4]"]);
    }

    #[test]
    fn refuses_a_dump_without_addresses_and_names_bad_lines() {
        let e = parse_map("0000000000000000 T a\n0000000000000000 t b\n", "kallsyms");
        assert!(e.unwrap_err().to_string().contains("kptr_restrict"));
        let e = parse_map("T nonsense here\n", "x.map").unwrap_err();
        assert!(e.to_string().contains("x.map:1"), "{e}");
    }
}
