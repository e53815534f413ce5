//! The program gdb loads its symbols from as it connects (the target's
//! exec-file), so `target remote` alone names the guest's kernel: the
//! kernel's own ELF where it carries DWARF (the demo OS, a debug vmlinux),
//! else a file made from its kallsyms and ORC tables
//! ([`vtrace_image::gdb_symbols`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use vtrace_image::gdb_symbols::{gdb_symbol_file, has_dwarf};

use crate::GdbError;

/// A file for gdb's symbols; one vtrace wrote is removed when dropped.
#[derive(Debug)]
pub struct SymbolFile {
    path: PathBuf,
    /// Held for its removal.
    _written: Option<tempfile::NamedTempFile>,
    /// What it holds, in words for the user.
    pub what: String,
}

impl SymbolFile {
    /// The file for the kernel ELF `elf` (a bzImage's vmlinux, or the
    /// image itself), read from `path` where it is a file of its own.
    /// `None` where the kernel offers gdb nothing (no symbols at all).
    pub fn for_kernel(elf: &[u8], path: Option<&Path>) -> Result<Option<SymbolFile>, GdbError> {
        if has_dwarf(elf) {
            if let Some(path) = path {
                return Ok(Some(SymbolFile {
                    path: path.to_path_buf(),
                    _written: None,
                    what: "its own symbols and DWARF".into(),
                }));
            }
            return SymbolFile::write(elf, "its own symbols and DWARF".into()).map(Some);
        }
        match gdb_symbol_file(elf, "the kernel") {
            Ok(made) => SymbolFile::write(
                &made.elf,
                format!(
                    "{} routines and {} variables from its kallsyms, {} unwind rules from its \
                     ORC tables; types and lines need a debug vmlinux: `file` it in gdb",
                    made.routines, made.variables, made.unwind_rules
                ),
            )
            .map(Some),
            Err(_) => Ok(None),
        }
    }

    fn write(bytes: &[u8], what: String) -> Result<SymbolFile, GdbError> {
        let io = |e| GdbError::SymbolFile(e);
        let mut file = tempfile::Builder::new()
            .prefix("vtrace-gdb-kernel-")
            .suffix(".elf")
            .tempfile()
            .map_err(io)?;
        file.write_all(bytes).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(SymbolFile {
            path: file.path().to_path_buf(),
            _written: Some(file),
            what,
        })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Part of `path`'s name as gdb reads the exec-file, from `offset`, into
/// `buf` (at most `length` bytes): how many bytes were written.
pub(crate) fn read_name(path: &Path, offset: u64, length: usize, buf: &mut [u8]) -> usize {
    let name = path.as_os_str().as_encoded_bytes();
    let from = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(name.len());
    let part = &name[from..];
    let n = part.len().min(length).min(buf.len());
    buf[..n].copy_from_slice(&part[..n]);
    n
}
