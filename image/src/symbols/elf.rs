//! Code symbols from an ELF file's symbol table.

use object::{Object, ObjectSection, ObjectSymbol, SectionFlags, SectionIndex, SymbolKind};

use super::table::{Symbol, SymbolTable};
use super::SymbolError;

const SHF_EXECINSTR: u64 = 0x4;

fn executable(section: &object::Section<'_, '_>) -> bool {
    match section.flags() {
        SectionFlags::Elf { sh_flags } => sh_flags & SHF_EXECINSTR != 0,
        _ => section.kind() == object::SectionKind::Text,
    }
}

/// Reads the code symbols of an ELF image: functions, and the untyped
/// labels assembly code defines in executable sections (interrupt stubs
/// such as `isr32` are labels, not functions). Falls back to the dynamic
/// symbol table when the image is stripped of `.symtab`.
pub fn parse_elf(bytes: &[u8], origin: &str) -> Result<SymbolTable, SymbolError> {
    let file = object::File::parse(bytes).map_err(|e| SymbolError::Elf {
        origin: origin.to_string(),
        reason: e.to_string(),
    })?;
    let code_sections: Vec<SectionIndex> = file
        .sections()
        .filter(|s| executable(s) && s.size() > 0)
        .map(|s| s.index())
        .collect();
    let end = file
        .sections()
        .filter(|s| code_sections.contains(&s.index()))
        .map(|s| s.address().saturating_add(s.size()))
        .max();
    // Preference among names at one address: global functions, other
    // globals, local functions, other labels.
    let mut ranked: Vec<(u8, Symbol)> = Vec::new();
    let mut symbols: Vec<_> = file.symbols().collect();
    if symbols.is_empty() {
        symbols = file.dynamic_symbols().collect();
    }
    for s in symbols {
        let Some(section) = s.section_index() else {
            continue;
        };
        if !code_sections.contains(&section) {
            continue;
        }
        let rank = match s.kind() {
            SymbolKind::Text => 0,
            SymbolKind::Unknown | SymbolKind::Label => 1,
            _ => continue,
        } + if s.is_global() { 0 } else { 2 };
        let Ok(name) = s.name() else { continue };
        if name.is_empty() || name.starts_with(".L") || name.starts_with('$') {
            continue;
        }
        ranked.push((
            rank,
            Symbol {
                start: s.address(),
                size: s.size(),
                name: name.to_string(),
            },
        ));
    }
    // Procedure linkage tables have no symbols: their stubs would count
    // as the routine before them (`_init`). They are named after their
    // section, as objdump does, and are trampolines (see `thunks`).
    for section in file.sections() {
        let Ok(name) = section.name() else { continue };
        if code_sections.contains(&section.index()) && is_plt(name) {
            ranked.push((
                9,
                Symbol {
                    start: section.address(),
                    size: section.size(),
                    name: name.to_string(),
                },
            ));
            // Where no symbol follows (a stripped program), the code after
            // the table is not a stub of it.
            ranked.push((
                10,
                Symbol {
                    start: section.address().saturating_add(section.size()),
                    size: 0,
                    name: String::new(),
                },
            ));
        }
    }
    // Linker-script markers (`__kernel_start`, `_stext`) share addresses
    // with routines; the routine's name is the one to show, whatever the
    // source, so names starting with '_' come last here as in map files,
    // and a hole's marker after every name.
    ranked.sort_by_key(|(rank, s)| (s.start, s.name.is_empty(), s.name.starts_with('_'), *rank));
    let list: Vec<Symbol> = ranked.into_iter().map(|(_, s)| s).collect();
    if list.is_empty() {
        return Err(SymbolError::NoSymbols(origin.to_string()));
    }
    Ok(SymbolTable::new(list, end))
}

/// A procedure linkage table's section: `.plt`, `.plt.sec`, `.plt.got`,
/// `.iplt`.
pub(crate) fn is_plt(name: &str) -> bool {
    name.starts_with(".plt") || name == ".iplt"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_os_has_its_functions_and_assembly_labels() {
        let t = parse_elf(vtrace_demo::DEMO_OS_ELF, "demo").unwrap();
        for name in [
            "pvh_start",
            "kmain",
            "schedule",
            "isr32",
            "isr_common",
            "trap",
        ] {
            assert!(t.symbols().iter().any(|s| s.name == name), "{name} missing");
        }
        let schedule = t.symbols().iter().find(|s| s.name == "schedule").unwrap();
        assert!(schedule.size > 0);
        let i = t.lookup(schedule.start + schedule.size - 1).unwrap();
        assert_eq!(t.symbols()[i].name, "schedule");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let e = parse_elf(b"not an elf file at all", "junk").unwrap_err();
        assert!(e.to_string().contains("junk"), "{e}");
    }
}

#[cfg(test)]
mod agreement {
    use super::*;
    use crate::symbols::parse_map;

    /// System.map is `nm -n` output: the same kernel through both sources
    /// must give the same routine at every routine start and just before
    /// the next one.
    #[test]
    fn system_map_and_elf_agree_on_the_demo_os() {
        let dir = std::env::temp_dir().join(format!("vtrace-nm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let elf_path = dir.join("demo.elf");
        std::fs::write(&elf_path, vtrace_demo::DEMO_OS_ELF).unwrap();
        let nm = std::process::Command::new("nm")
            .arg("-n")
            .arg(&elf_path)
            .output()
            .expect("nm (binutils, installed with gcc) runs");
        assert!(nm.status.success());
        let map = parse_map(&String::from_utf8_lossy(&nm.stdout), "System.map").unwrap();
        let elf = parse_elf(vtrace_demo::DEMO_OS_ELF, "demo").unwrap();
        let name = |t: &SymbolTable, a: u64| t.lookup(a).map(|i| t.symbols()[i].name.clone());
        let mut checked = 0;
        for (i, s) in elf.symbols().iter().enumerate() {
            let last = elf.get(i + 1).map_or(s.start + s.size.max(1), |n| n.start) - 1;
            for addr in [s.start, last] {
                assert_eq!(name(&map, addr), name(&elf, addr), "at {addr:#x}");
                checked += 1;
            }
        }
        assert!(checked > 100, "only {checked} addresses compared");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Where an ELF image's code is loaded when it runs before paging maps it
/// at its link address: (virtual start, virtual end, physical start) of
/// each loadable segment whose physical address differs from its virtual
/// one. Linux's `startup_64` runs at physical addresses until it switches
/// to the kernel's mapping; these ranges name those first steps.
pub fn physical_loads(bytes: &[u8]) -> Vec<(u64, u64, u64)> {
    load_segments(bytes)
        .into_iter()
        .filter(|(vaddr, _, paddr)| vaddr != paddr)
        .collect()
}

/// Every loadable segment of a 64-bit ELF image: (virtual start, virtual
/// end, physical start); none where it is not one.
pub fn load_segments(bytes: &[u8]) -> Vec<(u64, u64, u64)> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let Ok(file) = ElfFile64::<object::Endianness>::parse(bytes) else {
        return Vec::new();
    };
    let endian = file.endian();
    file.elf_program_headers()
        .iter()
        .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
        .map(|p| {
            let vaddr = p.p_vaddr(endian);
            (
                vaddr,
                vaddr.saturating_add(p.p_memsz(endian)),
                p.p_paddr(endian),
            )
        })
        .collect()
}
