//! Symbols: which routine an address belongs to, and its source line.
//!
//! A [`Symbolizer`] holds several sources at once (ELF images, System.map
//! or `nm` output, kallsyms dumps), each for every address space or for one
//! (a CR3 value). A lookup tries the sources for the step's address space
//! first, then the global ones, in the order they were added.

mod discover;
mod elf;
mod kallsyms;
mod lines;
mod map;
mod table;
mod thunks;
mod variables;

use std::path::{Path, PathBuf};

pub use discover::{discover, Discovery, KernelImages};
pub use elf::{load_segments, parse_elf};
pub use kallsyms::all_symbols as all_kallsyms;
pub(crate) use lines::load_dwarf;
pub use lines::{DwarfReader, LineTable};
pub use map::parse_map;
pub use table::{Symbol, SymbolTable};
pub use thunks::{thunk_kind, Thunk};
pub use variables::{find_variable, physical_of, VariableError, VariablePlace};

/// Problems loading symbols.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    /// The file could not be read.
    #[error("cannot read symbols from {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not an ELF file vtrace reads.
    #[error("{origin} is not a usable ELF file: {reason}")]
    Elf {
        /// The file.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A line of a System.map or kallsyms text does not parse.
    #[error("{origin}:{line}: {reason}")]
    Parse {
        /// The file.
        origin: String,
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The source has no code symbols.
    #[error("{0} has no code symbols (stripped?)")]
    NoSymbols(String),
    /// An address-space scope that is not a CR3 value.
    #[error("'{0}': an address space is a CR3 value in hex, such as 0x1000 or 1000")]
    BadScope(String),
    /// Symbols are read from regular files only: a device or FIFO named by
    /// a trace (or a user) could feed the reader without end.
    #[error("{path} is not a regular file; symbols are read from regular files only")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// Bigger than any kernel image or symbol file.
    #[error("{path} is {size} bytes, more than the {limit} a symbol file may have")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The largest vtrace reads.
        limit: u64,
    },
}

impl SymbolError {
    /// The status a command that fails with this error exits with, as
    /// sysexits.h names them (2 for a value that means nothing here, the
    /// status of arguments clap refuses).
    pub fn exit_status(&self) -> i32 {
        match self {
            SymbolError::Read { .. } | SymbolError::NotAFile { .. } => exitcode::NOINPUT,
            SymbolError::BadScope(_) => 2,
            SymbolError::Elf { .. }
            | SymbolError::Parse { .. }
            | SymbolError::NoSymbols(_)
            | SymbolError::TooLarge { .. } => exitcode::DATAERR,
        }
    }
}

/// The largest file read for symbols: a vmlinux with full DWARF is a few
/// hundred MiB.
pub const MAX_SYMBOL_FILE: u64 = 2 << 30;

/// Reads a file for symbols: a regular file, at most [`MAX_SYMBOL_FILE`].
pub fn read_symbol_file(path: &Path) -> Result<Vec<u8>, SymbolError> {
    use std::io::Read;
    let read_err = |source| SymbolError::Read {
        path: path.to_path_buf(),
        source,
    };
    // Looked at before it is opened: opening a FIFO waits for a writer.
    if !std::fs::metadata(path).map_err(read_err)?.is_file() {
        return Err(SymbolError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let file = std::fs::File::open(path).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(SymbolError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    if meta.len() > MAX_SYMBOL_FILE {
        return Err(SymbolError::TooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
            limit: MAX_SYMBOL_FILE,
        });
    }
    // At most MAX_SYMBOL_FILE (checked above): a capacity hint.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // take(): the file may grow while it is read.
    file.take(MAX_SYMBOL_FILE)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    Ok(bytes)
}

/// Which address spaces a source describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every address space (a kernel's symbols).
    Any,
    /// One address space, by its CR3 value (the low 12 flag bits ignored).
    AddressSpace(u64),
}

/// The page-table root of a CR3 value: what tells address spaces apart.
pub fn cr3_root(cr3: u64) -> u64 {
    cr3 & !0xfff
}

impl Scope {
    /// Parses the `@ASPACE` part of `--symbols FILE@ASPACE`.
    pub fn parse(text: &str) -> Result<Scope, SymbolError> {
        let digits = text.trim_start_matches("0x").trim_start_matches("0X");
        u64::from_str_radix(digits, 16)
            .map(|v| Scope::AddressSpace(cr3_root(v)))
            .map_err(|_| SymbolError::BadScope(text.to_string()))
    }

    fn covers(self, cr3: u64) -> bool {
        match self {
            Scope::Any => true,
            Scope::AddressSpace(root) => root == cr3_root(cr3),
        }
    }
}

/// One loaded source.
#[derive(Debug)]
pub struct Source {
    /// Where the symbols came from, for messages.
    pub origin: String,
    /// Which address spaces it describes.
    pub scope: Scope,
    /// Its routines.
    pub table: SymbolTable,
    /// Its source lines (DWARF), where it has them.
    pub lines: Option<LineTable>,
    /// Global id of this source's first symbol.
    first_id: u32,
    /// Another source's routines at their physical load addresses.
    alias: bool,
}

/// A routine id: stable for one [`Symbolizer`], dense from 0, so analyses
/// can count per routine in plain vectors.
pub type FuncId = u32;

/// The routine of code no source covers.
pub const UNKNOWN_FUNC: FuncId = u32::MAX;

/// A routine's index in its table as an id offset (tables hold fewer than
/// 4 G routines; see `Symbolizer::add`).
fn id(index: usize) -> FuncId {
    FuncId::try_from(index).unwrap_or(UNKNOWN_FUNC)
}

/// What an address resolved to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved<'a> {
    /// The routine.
    pub func: FuncId,
    /// Its name.
    pub name: &'a str,
    /// Bytes past its first.
    pub offset: u64,
    /// The routine's address range as far as this source knows: an address
    /// in `start..end` (same address space) resolves to the same routine.
    pub start: u64,
    /// The end of that range (exclusive).
    pub end: u64,
}

/// All symbol sources of one analysis.
#[derive(Debug, Default)]
pub struct Symbolizer {
    sources: Vec<Source>,
    /// Index of the source owning each [`FuncId`], by first id.
    total: u32,
    /// Routines that are trampolines (see [`Thunk`]).
    thunks: rustc_hash::FxHashMap<FuncId, Thunk>,
}

impl Symbolizer {
    /// A symbolizer with no source.
    pub fn new() -> Symbolizer {
        Symbolizer::default()
    }

    /// Adds a source: `table` (and `lines`) from `origin`, for the address
    /// spaces of `scope`. Its routines get the next ids.
    pub fn add(
        &mut self,
        origin: &str,
        scope: Scope,
        table: SymbolTable,
        lines: Option<LineTable>,
    ) {
        let first_id = self.total;
        // Ids run out only past 4 G routines, which no symbol file of at
        // most MAX_SYMBOL_FILE bytes holds.
        self.total = self.total.saturating_add(id(table.len()));
        for (i, s) in table.symbols().iter().enumerate() {
            if let Some(kind) = thunk_kind(&s.name) {
                self.thunks.insert(first_id.saturating_add(id(i)), kind);
            }
        }
        self.sources.push(Source {
            origin: origin.to_string(),
            scope,
            table,
            lines,
            first_id,
            alias: false,
        });
    }

    /// Adds an ELF image: its symbols and, when it has them, its lines.
    pub fn add_elf(&mut self, bytes: &[u8], origin: &str, scope: Scope) -> Result<(), SymbolError> {
        let table = parse_elf(bytes, origin)?;
        let lines = LineTable::from_elf(bytes, origin)?;
        self.add(origin, scope, table, lines);
        Ok(())
    }

    /// Adds a file: an ELF image, or map text (System.map, nm, kallsyms).
    pub fn add_file(&mut self, path: &Path, scope: Scope) -> Result<(), SymbolError> {
        let bytes = read_symbol_file(path)?;
        self.add_bytes(&bytes, &path.display().to_string(), scope)
    }

    /// Adds a file's contents, told apart as [`Symbolizer::add_file`] does.
    pub fn add_bytes(
        &mut self,
        bytes: &[u8],
        origin: &str,
        scope: Scope,
    ) -> Result<(), SymbolError> {
        if bytes.starts_with(b"\x7fELF") {
            match self.add_elf(bytes, origin, scope) {
                // A stripped vmlinux still has the kernel's own table.
                Err(SymbolError::NoSymbols(_)) => self
                    .add_kallsyms(bytes, &format!("{origin} (kallsyms)"), scope)
                    .map_err(|_| SymbolError::NoSymbols(origin.to_string())),
                other => other,
            }
        } else {
            let table = parse_map(&String::from_utf8_lossy(bytes), origin)?;
            self.add(origin, scope, table, None);
            Ok(())
        }
    }

    /// Adds the symbols a Linux kernel keeps for `/proc/kallsyms`,
    /// recovered from its image (a vmlinux, stripped or not).
    pub fn add_kallsyms(
        &mut self,
        vmlinux: &[u8],
        origin: &str,
        scope: Scope,
    ) -> Result<(), SymbolError> {
        let table = kallsyms::recover(vmlinux, origin)?;
        self.add(origin, scope, table, None);
        Ok(())
    }

    /// Adds, for the last source added, its routines in `elf`'s loadable
    /// segments once more at their physical load addresses (see
    /// `elf::physical_loads`). Nothing if no segment loads elsewhere.
    pub fn add_physical_alias(&mut self, elf: &[u8]) {
        let Some(last) = self.sources.last() else {
            return;
        };
        let loads = elf::physical_loads(elf);
        let alias: Vec<Symbol> = last
            .table
            .symbols()
            .iter()
            .filter_map(|s| {
                let (vstart, _, pstart) = loads
                    .iter()
                    .find(|(start, end, _)| s.start >= *start && s.start < *end)?;
                Some(Symbol {
                    // The file gives both addresses: checked.
                    start: (s.start - vstart).checked_add(*pstart)?,
                    size: s.size,
                    name: s.name.clone(),
                })
            })
            .collect();
        if alias.is_empty() {
            return;
        }
        let end = loads
            .iter()
            .filter_map(|(start, end, p)| end.checked_sub(*start)?.checked_add(*p))
            .max();
        let origin = format!("{} (at physical addresses)", last.origin);
        let scope = last.scope;
        self.add(&origin, scope, SymbolTable::new(alias, end), None);
        if let Some(added) = self.sources.last_mut() {
            added.alias = true;
        }
    }

    /// The sources, in the order they were added.
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// Number of routine ids handed out.
    pub fn func_count(&self) -> usize {
        self.total as usize
    }

    fn candidates(&self, cr3: u64) -> impl Iterator<Item = &Source> {
        let specific = self
            .sources
            .iter()
            .filter(move |s| s.scope != Scope::Any && s.scope.covers(cr3));
        specific.chain(self.sources.iter().filter(|s| s.scope == Scope::Any))
    }

    /// The routine containing `addr` in address space `cr3`.
    pub fn resolve(&self, addr: u64, cr3: u64) -> Option<Resolved<'_>> {
        for source in self.candidates(cr3) {
            if let Some(i) = source.table.lookup(addr) {
                let sym = &source.table.symbols()[i];
                let end = source
                    .table
                    .get(i + 1)
                    .map(|n| n.start)
                    .or(source.table.range().map(|r| r.1))
                    .unwrap_or(addr + 1);
                return Some(Resolved {
                    func: source.first_id.saturating_add(id(i)),
                    name: &sym.name,
                    offset: addr - sym.start,
                    start: sym.start,
                    end,
                });
            }
        }
        None
    }

    /// Whether `func` is a trampoline, and for what.
    pub fn thunk(&self, func: FuncId) -> Option<Thunk> {
        self.thunks.get(&func).copied()
    }

    /// Start addresses of the routines named `name`, in every source
    /// (several when sources overlap or a name is static in several
    /// files), at their link addresses only.
    pub fn addresses_of(&self, name: &str) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .sources
            .iter()
            .filter(|s| !s.alias)
            .flat_map(|s| s.table.symbols().iter())
            .filter(|s| s.name == name)
            .map(|s| s.start)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The name of a routine id ("?" for [`UNKNOWN_FUNC`]).
    pub fn name(&self, func: FuncId) -> &str {
        let Some(source) =
            self.sources.iter().rev().find(|s| {
                s.first_id <= func && func < s.first_id.saturating_add(id(s.table.len()))
            })
        else {
            return "?";
        };
        source
            .table
            .get((func - source.first_id) as usize)
            .map(|s| &s.name[..])
            .unwrap_or("?")
    }

    /// `symbol+0xoff`, or the bare address when no source covers it.
    pub fn format(&self, addr: u64, cr3: u64) -> String {
        match self.resolve(addr, cr3) {
            Some(r) if r.offset == 0 => r.name.to_string(),
            Some(r) => format!("{}+{:#x}", r.name, r.offset),
            None => format!("{addr:#x}"),
        }
    }

    /// `file:line` of `addr`, from the first source with lines covering it.
    pub fn line(&self, addr: u64, cr3: u64) -> Option<String> {
        self.candidates(cr3)
            .filter(|s| s.table.lookup(addr).is_some())
            .find_map(|s| s.lines.as_ref()?.locate(addr))
    }

    /// The source file (whole path) and line of `addr`, from the first
    /// source with lines covering it.
    pub fn location(&self, addr: u64, cr3: u64) -> Option<(String, Option<u32>)> {
        self.candidates(cr3)
            .filter(|s| s.table.lookup(addr).is_some())
            .find_map(|s| s.lines.as_ref()?.location(addr))
    }

    /// Where the routine `addr` resolved to came from (a source's origin).
    pub fn origin_of(&self, addr: u64, cr3: u64) -> Option<&str> {
        self.candidates(cr3)
            .find(|s| s.table.lookup(addr).is_some())
            .map(|s| &s.origin[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(entries: &[(u64, &str)]) -> SymbolTable {
        SymbolTable::new(
            entries
                .iter()
                .map(|(a, n)| Symbol {
                    start: *a,
                    size: 0,
                    name: n.to_string(),
                })
                .collect(),
            None,
        )
    }

    #[test]
    fn address_space_sources_come_before_global_ones() {
        let mut s = Symbolizer::new();
        s.add("kernel", Scope::Any, table(&[(0x1000, "kfunc")]), None);
        s.add(
            "task",
            Scope::parse("0x5000").unwrap(),
            table(&[(0x1000, "tfunc")]),
            None,
        );
        assert_eq!(s.format(0x1004, 0x9000), "kfunc+0x4");
        assert_eq!(s.format(0x1004, 0x5018), "tfunc+0x4");
        assert_eq!(s.format(0x9_0000, 0x5018), "0x90000");
        let r = s.resolve(0x1000, 0x5000).unwrap();
        assert_eq!(s.name(r.func), "tfunc");
        assert_eq!(s.name(UNKNOWN_FUNC), "?");
        assert!(Scope::parse("cr3").is_err());
    }
}
