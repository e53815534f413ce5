//! Where `--start-at` and `--stop-at` fire: the address of a location,
//! found before the trace disk is made (a misspelt routine must not
//! leave a gigabyte file behind).

use std::path::Path;

use vtrace_image::symbols::{discover, Discovery, KernelImages, Symbolizer};
use vtrace_image::user_routine::{
    fixed_routine_address, program_from_file, program_in_initramfs, Program, UserRoutineError,
};
use vtrace_storage::TraceMetadata;

use crate::location::Location;
use crate::SessionError;

type Result<T> = std::result::Result<T, SessionError>;

/// Kernel images vtrace carries itself: the built-in demo OS, and its SMP
/// mode.
pub fn builtin_kernels() -> KernelImages<'static> {
    KernelImages {
        builtin: &[
            (vtrace_storage::BUILTIN_DEMO, vtrace_demo::DEMO_OS_ELF),
            (
                vtrace_storage::BUILTIN_DEMO_SMP,
                vtrace_demo::DEMO_OS_SMP_ELF,
            ),
        ],
    }
}

/// `routine+0xoff at file:line` of `addr` in the kernel `metadata` names
/// (what a crash report adds to a bare RIP), where its symbols are found.
pub(crate) fn routine_at(
    metadata: &vtrace_storage::TraceMetadata,
    addr: u64,
    cr3: u64,
) -> Option<String> {
    let mut symbols = Symbolizer::new();
    discover(metadata, &builtin_kernels(), &mut symbols);
    let named = symbols.format(addr, cr3);
    symbols.resolve(addr, cr3)?;
    Some(match symbols.line(addr, cr3) {
        Some(line) => format!("{named} at {line}"),
        None => named,
    })
}

/// A trigger's place.
#[derive(Clone, Debug)]
pub struct Place {
    /// The linear address it fires at.
    pub address: u64,
    /// Fires only in tasks of this name (a user program's routine).
    pub task: Option<String>,
    /// What the user should be told of it.
    pub note: Option<String>,
}

/// Finds places, reading the kernel's symbols once, when a place names
/// one of its routines.
pub struct Places<'a> {
    metadata: &'a TraceMetadata,
    initrd: Option<&'a Path>,
    /// Whether the tracer can tell tasks apart (a Linux kernel whose
    /// layout it read).
    tasks_known: bool,
    kernel: Option<(Symbolizer, Discovery)>,
}

impl<'a> Places<'a> {
    /// Places of a run that boots with `metadata` and `initrd`.
    pub fn new(metadata: &'a TraceMetadata, initrd: Option<&'a Path>, tasks_known: bool) -> Self {
        Places {
            metadata,
            initrd,
            tasks_known,
            kernel: None,
        }
    }

    /// The place of `location`, given as `option`.
    pub fn find(&mut self, location: &Option<Location>, option: &str) -> Result<Option<Place>> {
        let place = self.find_any(location, option)?;
        if let Some(p) = &place {
            if !is_canonical(p.address) {
                let given = location
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                let at = match location {
                    Some(Location::Address(_)) => String::new(),
                    _ => format!(" ({:#x})", p.address),
                };
                return Err(SessionError::Request(format!(
                    "{}: not a canonical x86-64 address{at} (bits 63 to 56 must equal bit 55, \
                     even with five-level paging), so no instruction can be there",
                    named(option, &given),
                )));
            }
        }
        Ok(place)
    }

    fn find_any(&mut self, location: &Option<Location>, option: &str) -> Result<Option<Place>> {
        let place = match location {
            None => return Ok(None),
            Some(Location::Address(a)) => Place {
                address: *a,
                task: None,
                note: None,
            },
            Some(Location::Symbol {
                program: None,
                name,
                offset,
            }) => Place {
                address: self.kernel_routine(option, name, *offset)?,
                task: None,
                note: None,
            },
            Some(Location::Symbol {
                program: Some(program),
                name,
                offset,
            }) => self.user_routine(option, program, name, *offset)?,
        };
        Ok(Some(place))
    }

    /// The address of kernel routine `name` (plus `offset`).
    fn kernel_routine(&mut self, option: &str, name: &str, offset: u64) -> Result<u64> {
        let metadata = self.metadata;
        let (symbols, found) = self.kernel.get_or_insert_with(|| {
            let mut s = Symbolizer::new();
            let found = discover(metadata, &builtin_kernels(), &mut s);
            (s, found)
        });
        let addresses = symbols.addresses_of(name);
        let problem = match addresses.as_slice() {
            [one] => {
                return one.checked_add(offset).ok_or_else(|| {
                    SessionError::Request(format!(
                        "{}+{offset:#x}: the offset runs past the end of the address space \
                         ({name} is at {one:#x})",
                        named(option, name)
                    ))
                })
            }
            [] if found.loaded.is_empty() => format!(
                "{}: the kernel's symbols were not found ({}); give an address",
                named(option, name),
                found.all_warnings().cloned().collect::<Vec<_>>().join("; ")
            ),
            [] => format!(
                "{}: no routine of that name in {}",
                named(option, name),
                found.loaded.join(", ")
            ),
            many => format!(
                "{}: {} routines have that name (at {}); give one by address",
                named(option, name),
                many.len(),
                many.iter()
                    .map(|a| format!("{a:#x}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        Err(SessionError::Request(problem))
    }

    /// The place of routine `name` (plus `offset`) of user program
    /// `program`, which fires only in tasks running that program where
    /// the tracer can tell tasks apart.
    fn user_routine(&self, option: &str, program: &str, name: &str, offset: u64) -> Result<Place> {
        let bad = |e: UserRoutineError| {
            SessionError::request(format!(
                "{}: {e}",
                named(option, &format!("{program}:{name}"))
            ))
        };
        let found = self.program(program).map_err(bad)?;
        let start = fixed_routine_address(&found, name).map_err(bad)?;
        let address = start.checked_add(offset).ok_or_else(|| {
            SessionError::request(format!(
                "{}+{offset:#x}: the offset runs past the end of the address space ({name} is \
                 at {start:#x})",
                named(option, &format!("{program}:{name}"))
            ))
        })?;
        let whom = if self.tasks_known {
            format!("it fires in tasks named {}", found.comm)
        } else {
            "the kernel's tasks cannot be read, so it fires in any process that runs that \
             address"
                .to_string()
        };
        Ok(Place {
            address,
            task: self.tasks_known.then(|| found.comm.clone()),
            note: Some(format!(
                "vtrace: {}{} is {address:#x} in {}; {whom}",
                named(option, &format!("{program}:{name}")),
                if offset == 0 {
                    String::new()
                } else {
                    format!("+{offset:#x}")
                },
                found.origin
            )),
        })
    }

    /// The DWARF of user program `program`, where it has some.
    pub(crate) fn program_types(
        &self,
        program: &str,
    ) -> Option<vtrace_image::probe_dwarf::DwarfTypes> {
        let found = self.program(program).ok()?;
        vtrace_image::probe_dwarf::DwarfTypes::from_elf(&found.bytes)
    }

    /// The program's file: in the initramfs the run boots, by file name
    /// or path, else a file of the host.
    fn program(&self, program: &str) -> std::result::Result<Program, UserRoutineError> {
        if let Some(initrd) = self.initrd {
            let origin = initrd.display().to_string();
            let bytes = std::fs::read(initrd).map_err(|source| UserRoutineError::Unreadable {
                origin: origin.clone(),
                source,
            })?;
            let found = program_in_initramfs(&bytes, &origin, program)?;
            if let Some(found) = found {
                return Ok(found);
            }
        }
        let path = Path::new(program);
        if path.is_file() {
            let bytes =
                std::fs::read(path).map_err(|_| UserRoutineError::NotElf(program.into()))?;
            return Ok(program_from_file(bytes, program));
        }
        Err(UserRoutineError::NoProgram {
            program: program.to_string(),
            looked: match self.initrd {
                Some(initrd) => format!("in {} or on this host", initrd.display()),
                None => "on this host (the run boots no --initrd)".to_string(),
            },
        })
    }
}

/// Whether `address` is canonical on x86-64 with five-level paging
/// (57-bit linear addresses, the widest a guest can have): anything else
/// faults before it is fetched, so a trigger there could never fire.
fn is_canonical(address: u64) -> bool {
    let top = address >> 56;
    top == 0 || top == (u64::MAX >> 56)
}

/// The option and the routine it names, as messages say them: `--start-at
/// NAME`, or `--probe fn:NAME` where the option ends in the probe's kind.
fn named(option: &str, what: &str) -> String {
    match option.ends_with(':') {
        true => format!("{option}{what}"),
        false => format!("{option} {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::is_canonical;

    #[test]
    fn canonical_addresses_are_the_two_ends_of_the_space() {
        assert!(is_canonical(0x10_0000));
        assert!(is_canonical(0xffff_ffff_8100_0000));
        assert!(
            is_canonical(0x00ff_ffff_ffff_ffff),
            "five-level paging's top"
        );
        assert!(!is_canonical(0x8000_0000_0000_0000));
        assert!(!is_canonical(0x0100_0000_0000_0000));
    }
}
