//! Where a kernel variable lives in guest-physical memory, for the peeper
//! (`vtrace run --sample NAME`): its link address from the image's symbol
//! table (or, for a stripped Linux vmlinux, its kallsyms table, which
//! lists data symbols on kernels built with `CONFIG_KALLSYMS_ALL`), then
//! the physical address the loadable segment holding it was loaded at.
//! That holds where vtrace loads the ELF itself, at its physical
//! addresses, with no relocation (the demo OS; a bzImage vtrace unpacks).

use object::{Object, ObjectSymbol, SymbolKind};

use super::elf::load_segments;
use super::kallsyms::all_symbols;

/// Why a variable cannot be sampled.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VariableError {
    /// No symbol of that name.
    #[error("no symbol named {0} in the kernel (its symbol table and kallsyms)")]
    NotFound(String),
    /// The symbol lies in no segment the kernel image loads.
    #[error("{name} is at {address:#x}, in no loadable segment of the kernel image")]
    NotLoaded {
        /// The symbol.
        name: String,
        /// Its link address.
        address: u64,
    },
    #[error(
        "{0} is a per-CPU variable (an offset into each CPU's area, which the kernel \
         allocates at boot); give the guest-physical address of one CPU's copy"
    )]
    /// A per-CPU variable: no single address holds it.
    PerCpu(String),
}

/// A kernel variable: its link address and where it is in guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VariablePlace {
    /// Its link address.
    pub address: u64,
    /// Its guest-physical address.
    pub physical: u64,
}

/// The link address of symbol `name` of `elf`: a data object, or any
/// symbol of that name where the image has no typed one.
fn link_address(elf: &[u8], name: &str) -> Option<u64> {
    let file = object::File::parse(elf).ok()?;
    let mut untyped = None;
    for s in file.symbols() {
        if s.name() != Ok(name) || s.section_index().is_none() {
            continue;
        }
        match s.kind() {
            SymbolKind::Data | SymbolKind::Tls => return Some(s.address()),
            _ => untyped = untyped.or(Some(s.address())),
        }
    }
    untyped.or_else(|| {
        all_symbols(elf, "vmlinux")
            .ok()?
            .into_iter()
            .find(|(_, n, _)| n == name)
            .map(|(_, _, a)| a)
    })
}

/// Where `address` (a link address of `elf`) was loaded, if a loadable
/// segment holds it; a segment linked at 0 in a higher-half kernel is
/// Linux's per-CPU template, which no CPU uses as such.
pub fn physical_of(elf: &[u8], address: u64) -> Option<Result<u64, ()>> {
    let segments = load_segments(elf);
    let high_half = segments.iter().any(|(v, _, _)| *v >= 0xffff_8000_0000_0000);
    let (start, _, physical) = segments
        .into_iter()
        .find(|(start, end, _)| (*start..*end).contains(&address))?;
    if start == 0 && high_half {
        return Some(Err(()));
    }
    Some(Ok(physical.wrapping_add(address - start)))
}

/// Finds variable `name` of the kernel ELF `elf`.
pub fn find_variable(elf: &[u8], name: &str) -> Result<VariablePlace, VariableError> {
    let address = link_address(elf, name).ok_or_else(|| VariableError::NotFound(name.into()))?;
    match physical_of(elf, address) {
        Some(Ok(physical)) => Ok(VariablePlace { address, physical }),
        Some(Err(())) => Err(VariableError::PerCpu(name.into())),
        None => Err(VariableError::NotLoaded {
            name: name.into(),
            address,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_demo_os_tick_counter_where_nm_does() {
        let found = find_variable(vtrace_demo::DEMO_OS_ELF, "ticks").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demo.elf");
        std::fs::write(&path, vtrace_demo::DEMO_OS_ELF).unwrap();
        let nm = std::process::Command::new("nm")
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&nm.stdout);
        let line = text
            .lines()
            .find(|l| l.ends_with(" ticks"))
            .expect("nm lists ticks");
        let address = u64::from_str_radix(line.split(' ').next().unwrap(), 16).unwrap();
        assert_eq!(found.address, address);
        // The demo OS runs identity-mapped.
        assert_eq!(found.physical, address);
        assert_eq!(
            find_variable(vtrace_demo::DEMO_OS_ELF, "no_such_variable"),
            Err(VariableError::NotFound("no_such_variable".into()))
        );
    }
}
