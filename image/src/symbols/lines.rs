//! Source lines from DWARF (`.debug_line` and friends) through addr2line.

use std::borrow::Cow;
use std::sync::Arc;

use addr2line::gimli;
use object::{Object, ObjectSection};

use super::SymbolError;

/// How vtrace reads DWARF: sections shared, so units outlive the file.
pub type DwarfReader = gimli::EndianArcSlice<gimli::RunTimeEndian>;

/// The DWARF sections of an ELF image (empty where it lacks one).
pub(crate) fn load_dwarf(
    file: &object::File<'_>,
) -> Result<gimli::Dwarf<DwarfReader>, gimli::Error> {
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    gimli::Dwarf::load(
        |id: gimli::SectionId| -> Result<DwarfReader, gimli::Error> {
            let data = file
                .section_by_name(id.name())
                .and_then(|s| s.uncompressed_data().ok())
                .unwrap_or(Cow::Borrowed(&[]));
            Ok(DwarfReader::new(Arc::from(&*data), endian))
        },
    )
}

/// The line table of one ELF image. addr2line parses units lazily through
/// interior cells, so the context is not `Sync`; a mutex shares it between
/// the listing's workers, which cache lines per address and rarely ask.
pub struct LineTable {
    context: std::sync::Mutex<addr2line::Context<DwarfReader>>,
}

impl std::fmt::Debug for LineTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LineTable")
    }
}

impl LineTable {
    /// `Ok(None)` when the image has no line information.
    pub fn from_elf(bytes: &[u8], origin: &str) -> Result<Option<LineTable>, SymbolError> {
        let err = |reason: String| SymbolError::Elf {
            origin: origin.to_string(),
            reason,
        };
        let file = object::File::parse(bytes).map_err(|e| err(e.to_string()))?;
        if file.section_by_name(".debug_line").is_none() {
            return Ok(None);
        }
        let dwarf = load_dwarf(&file).map_err(|e| err(format!("DWARF: {e}")))?;
        let context =
            addr2line::Context::from_dwarf(dwarf).map_err(|e| err(format!("DWARF: {e}")))?;
        Ok(Some(LineTable {
            context: std::sync::Mutex::new(context),
        }))
    }

    /// `file:line` of `addr`, with the file name shortened to its last two
    /// components (a listing line has no room for build paths).
    pub fn locate(&self, addr: u64) -> Option<String> {
        let (file, line) = self.location(addr)?;
        let short: Vec<&str> = file.rsplit('/').take(2).collect();
        let short = short.into_iter().rev().collect::<Vec<_>>().join("/");
        Some(match line {
            Some(line) => format!("{short}:{line}"),
            None => short,
        })
    }

    /// The source file of `addr` as the line table names it (the whole
    /// path, as `addr2line` prints it) and its line, where known: the
    /// innermost location, as the line table's row for `addr` says.
    pub fn location(&self, addr: u64) -> Option<(String, Option<u32>)> {
        let context = self.context.lock().ok()?;
        let loc = context.find_location(addr).ok()??;
        Some((loc.file?.to_string(), loc.line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_os_addresses_have_source_lines() {
        let lines = LineTable::from_elf(vtrace_demo::DEMO_OS_ELF, "demo")
            .unwrap()
            .expect("the demo OS is built with -g");
        let table = super::super::elf::parse_elf(vtrace_demo::DEMO_OS_ELF, "demo").unwrap();
        let schedule = table
            .symbols()
            .iter()
            .find(|s| s.name == "schedule")
            .unwrap();
        let at = lines.locate(schedule.start).unwrap();
        assert!(at.starts_with("os/sched.c:"), "{at}");
    }
}
