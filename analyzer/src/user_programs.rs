//! The user programs of a Linux trace, by name: the files each process
//! mapped (the trace's `Mappings` events), found under a directory the
//! user names (a sysroot: the guest's root file system, or the tree its
//! initramfs was built from), with their symbols added at the addresses
//! the process mapped them at, for the address space it ran in.
//!
//! Address spaces stand for processes here: the kernel gives each process
//! its own page tables. A page-table root freed by one process and reused
//! by a later one with other programs names the first one's routines.

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

use object::{Object, ObjectSegment};
use vtrace_storage::{Event, Mapping, RecordRef};

use crate::error::Result;
use crate::input::{Progress, Records, SegmentInfo, Trace};
use vtrace_image::symbols::{
    cr3_root, parse_elf, read_symbol_file, LineTable, Scope, Symbol, SymbolTable, Symbolizer,
};

/// A process's map as the trace recorded it, with its address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedMap {
    /// The page-table root the process ran in when its map was read.
    pub space: u64,
    /// The process.
    pub pid: u32,
    /// Its file-backed mappings.
    pub maps: Vec<Mapping>,
}

/// The maps the trace recorded, in trace order.
pub fn recorded_maps(trace: &Trace, progress: Progress<'_>) -> Result<Vec<RecordedMap>> {
    let mut all = Vec::new();
    trace.for_each_ordered(
        &trace.segments,
        |_: &SegmentInfo, records| maps_in(records),
        |chunk| {
            if let Ok(found) = chunk.result {
                all.extend(found);
            }
            Ok::<(), crate::error::AnalyzeError>(())
        },
        progress,
    )?;
    Ok(all)
}

/// One segment's maps. The kernel reads a map in the process's address
/// space (at a task switch or a system call's return), so the steps around
/// the event tell the space: the one before, or for an event that opens
/// the segment, the one after.
fn maps_in(records: &mut Records<'_>) -> Vec<RecordedMap> {
    let mut found = Vec::new();
    let mut space = None;
    let mut waiting: Vec<(u32, Vec<Mapping>)> = Vec::new();
    while let Some(r) = records.next_record() {
        match r {
            RecordRef::Step(s) => {
                let root = cr3_root(s.cr3);
                space = Some(root);
                for (pid, maps) in waiting.drain(..) {
                    found.push(RecordedMap {
                        space: root,
                        pid,
                        maps,
                    });
                }
            }
            RecordRef::Event(Event::Mappings { pid, maps }) => match space {
                Some(space) => found.push(RecordedMap {
                    space,
                    pid: *pid,
                    maps: maps.clone(),
                }),
                None => waiting.push((*pid, maps.clone())),
            },
            RecordRef::Event(_) => {}
        }
    }
    found
}

/// Where the files the trace's processes mapped are looked for.
#[derive(Clone, Debug)]
pub enum UserFiles {
    /// A directory: the guest's root file system, or the tree its
    /// initramfs was built from.
    Sysroot(PathBuf),
    /// Files taken out of an initramfs (see [`vtrace_image::initramfs`]), by
    /// absolute path; `origin` names the archive.
    Archive {
        /// The archive.
        origin: String,
        /// The files, by absolute path.
        files: HashMap<String, Vec<u8>>,
    },
}

impl UserFiles {
    /// The bytes of the guest's file `path`, and a name for it; `None`
    /// for a file an initramfs lacks, which is no news (the root file
    /// system mounted later holds it).
    fn read(&self, path: &str) -> std::result::Result<Option<(Vec<u8>, String)>, String> {
        match self {
            UserFiles::Sysroot(root) => {
                let local = inside(root, path)
                    .ok_or_else(|| format!("{path}: not a plain absolute path; not looked for"))?;
                if !local.is_file() {
                    return Err(format!("{path}: not found under {}", root.display()));
                }
                let bytes = read_symbol_file(&local).map_err(|e| e.to_string())?;
                Ok(Some((bytes, local.display().to_string())))
            }
            UserFiles::Archive { origin, files } => Ok(files
                .get(path)
                .map(|bytes| (bytes.clone(), format!("{path} in {origin}")))),
        }
    }
}

/// The files the recorded maps name, for [`vtrace_image::initramfs::files_in`].
pub fn mapped_paths(recorded: &[RecordedMap]) -> BTreeSet<String> {
    recorded
        .iter()
        .flat_map(|r| r.maps.iter().map(|m| m.path.clone()))
        .collect()
}

/// Adds the symbols of every mapped file found in `files`, each at the
/// addresses its process mapped it at. Returns what could not be used,
/// once per file, for the user.
pub fn add_user_symbols(
    symbols: &mut Symbolizer,
    recorded: &[RecordedMap],
    files_from: &UserFiles,
) -> Vec<String> {
    let mut files: HashMap<String, Option<LoadedFile>> = HashMap::new();
    let mut warnings = Vec::new();
    let mut added: BTreeSet<(u64, String, u64)> = BTreeSet::new();
    for map in recorded {
        for m in &map.maps {
            let file = files.entry(m.path.clone()).or_insert_with(|| {
                match LoadedFile::read(files_from, &m.path) {
                    Ok(f) => f,
                    Err(why) => {
                        warnings.push(why);
                        None
                    }
                }
            });
            let Some(file) = file else { continue };
            let Some(bias) = file.bias(m) else { continue };
            if !added.insert((map.space, m.path.clone(), bias)) {
                continue;
            }
            let table = if bias == 0 {
                file.table.clone()
            } else {
                shifted(&file.table, bias)
            };
            symbols.add(
                &format!("{} (pid {})", m.path, map.pid),
                Scope::AddressSpace(map.space),
                table,
                // Lines are looked up at link addresses: moved code goes
                // without them.
                (bias == 0).then(|| file.lines()).flatten(),
            );
        }
    }
    warnings
}

/// A mapped file's symbols and load segments.
struct LoadedFile {
    table: SymbolTable,
    origin: String,
    bytes: Vec<u8>,
    /// (file offset, size in the file, link address) of each segment.
    loads: Vec<(u64, u64, u64)>,
}

impl LoadedFile {
    fn read(files: &UserFiles, path: &str) -> std::result::Result<Option<LoadedFile>, String> {
        let Some((bytes, origin)) = files.read(path)? else {
            return Ok(None);
        };
        let elf =
            object::File::parse(&*bytes).map_err(|e| format!("{origin}: not an ELF file ({e})"))?;
        let loads = elf
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, size, s.address())
            })
            .collect();
        let table = parse_elf(&bytes, &origin).map_err(|e| e.to_string())?;
        Ok(Some(LoadedFile {
            table,
            origin,
            bytes,
            loads,
        }))
    }

    fn lines(&self) -> Option<LineTable> {
        LineTable::from_elf(&self.bytes, &self.origin)
            .ok()
            .flatten()
    }

    /// How far `m` moved the file from its link addresses: a mapping
    /// starts at a page of the segment whose bytes it maps.
    fn bias(&self, m: &Mapping) -> Option<u64> {
        let (offset, _, address) = self.loads.iter().find(|(off, size, _)| {
            m.offset >= off & !0xfff && m.offset < off.saturating_add(*size)
        })?;
        let linked = address.checked_sub(offset.checked_sub(m.offset)?)?;
        Some(m.start.wrapping_sub(linked))
    }
}

/// `path` (absolute, as the guest named it) under `root`; `None` for a
/// path that could leave it.
fn inside(root: &Path, path: &str) -> Option<PathBuf> {
    let path = Path::new(path);
    let mut out = root.to_path_buf();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(part) => out.push(part),
            _ => return None,
        }
    }
    path.is_absolute().then_some(out)
}

fn shifted(table: &SymbolTable, bias: u64) -> SymbolTable {
    let symbols = table
        .symbols()
        .iter()
        .map(|s| Symbol {
            start: s.start.wrapping_add(bias),
            size: s.size,
            name: s.name.clone(),
        })
        .collect();
    SymbolTable::new(
        symbols,
        table.range().map(|(_, end)| end.wrapping_add(bias)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_paths_stay_inside_the_sysroot() {
        let root = Path::new("/srv/root");
        assert_eq!(
            inside(root, "/bin/vtprog"),
            Some(PathBuf::from("/srv/root/bin/vtprog"))
        );
        assert_eq!(inside(root, "/bin/../../etc/shadow"), None);
        assert_eq!(inside(root, "bin/vtprog"), None);
    }

    #[test]
    fn a_mapping_gives_the_load_bias_of_its_segment() {
        let file = LoadedFile {
            table: SymbolTable::new(Vec::new(), None),
            origin: String::new(),
            bytes: Vec::new(),
            // A position-independent library: text at file offset 0x1000,
            // linked at 0x1000; data at offset 0x5e10, linked at 0x6e10.
            loads: vec![
                (0, 0x800, 0),
                (0x1000, 0x3000, 0x1000),
                (0x5e10, 0x200, 0x6e10),
            ],
        };
        let at = |start, offset| Mapping {
            start,
            end: start + 0x1000,
            offset,
            path: String::new(),
        };
        assert_eq!(
            file.bias(&at(0x7f00_0000_1000, 0x1000)),
            Some(0x7f00_0000_0000)
        );
        assert_eq!(
            file.bias(&at(0x7f00_0000_6000, 0x5000)),
            Some(0x7f00_0000_0000)
        );
        // A static program mapped where it was linked.
        assert_eq!(file.bias(&at(0x1000, 0x1000)), Some(0));
        // Past every segment.
        assert_eq!(file.bias(&at(0x9000, 0x9000)), None);
    }
}
