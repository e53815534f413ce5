//! A routine of a user program as a trigger place (`--start-at
//! vtprog:main`): the program found in the initramfs a run boots, or on
//! the host, and the routine's address from its ELF symbols. Only a
//! program linked at a fixed address (not position-independent) has an
//! address before it runs.

use object::{Object, ObjectKind};

use crate::initramfs::files_where;
use crate::symbols::parse_elf;

/// `TASK_COMM_LEN - 1`: the bytes of a program's name a Linux task keeps.
const COMM_BYTES: usize = 15;

/// Why a user routine has no address to break at.
#[derive(Debug, thiserror::Error)]
pub enum UserRoutineError {
    /// The initramfs names no file of that name or path, and the host
    /// has none either.
    #[error("no program {program} {looked}")]
    NoProgram {
        /// The program as the user named it.
        program: String,
        /// Where it was looked for ("in l2.cpio or on this host").
        looked: String,
    },
    /// Several files of the initramfs have that name.
    #[error("{program} names {} files in {origin} ({}): give its path, as in {}:ROUTINE", paths.len(), paths.join(", "), paths[0])]
    AmbiguousProgram {
        /// The program as the user named it.
        program: String,
        /// The initramfs.
        origin: String,
        /// The files that have the name (at least two).
        paths: Vec<String>,
    },
    /// The initramfs file could not be read.
    #[error("{origin} cannot be read: {source}")]
    Unreadable {
        /// The initramfs.
        origin: String,
        /// Why.
        source: std::io::Error,
    },
    /// The initramfs is not an archive vtrace reads.
    #[error("{origin}: {source}")]
    BadArchive {
        /// The initramfs.
        origin: String,
        /// What is wrong with it.
        source: crate::initramfs::InitramfsError,
    },
    /// The file is not an ELF program.
    #[error("{0} is not an ELF program")]
    NotElf(String),
    /// The program loads where the kernel chooses.
    #[error(
        "{0} is position-independent: where it loads is known only once it runs; \
         link it at a fixed address (gcc -static or -no-pie) or give the address"
    )]
    PositionIndependent(String),
    /// The program's symbols have no routine of that name.
    #[error("no routine {name} in the symbols of {origin}")]
    NoRoutine {
        /// The routine asked for.
        name: String,
        /// The program.
        origin: String,
    },
    /// Several routines of the program have that name.
    #[error("{name} names {} routines in {origin} (at {}); give one by address", addresses.len(), addresses.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>().join(", "))]
    AmbiguousRoutine {
        /// The routine asked for.
        name: String,
        /// The program.
        origin: String,
        /// Where each is.
        addresses: Vec<u64>,
    },
}

/// A program's file, found.
#[derive(Clone, Debug)]
pub struct Program {
    /// Its ELF image.
    pub bytes: Vec<u8>,
    /// Where it was found, for messages ("/bin/vtprog in l2.cpio").
    pub origin: String,
    /// The name a Linux task running it has: its file name, cut to the 15
    /// bytes the kernel keeps (a program run through a link of another
    /// name is named after the link).
    pub comm: String,
}

/// Finds `program` (a file name, or an absolute path inside the archive)
/// in the initramfs `archive`, called `origin` in messages. `None` where
/// the archive has no such file.
pub fn program_in_initramfs(
    archive: &[u8],
    origin: &str,
    program: &str,
) -> Result<Option<Program>, UserRoutineError> {
    let by_path = program.starts_with('/');
    let wanted = |path: &str| {
        if by_path {
            path == program
        } else {
            path.rsplit('/').next() == Some(program)
        }
    };
    let found = files_where(archive, &wanted).map_err(|source| UserRoutineError::BadArchive {
        origin: origin.to_string(),
        source,
    })?;
    let mut paths: Vec<String> = found.keys().cloned().collect();
    paths.sort();
    match paths.as_slice() {
        [] => Ok(None),
        [path] => {
            let bytes = found.get(path).cloned().unwrap_or_default();
            Ok(Some(Program {
                bytes,
                origin: format!("{path} in {origin}"),
                comm: comm_of(path),
            }))
        }
        _ => Err(UserRoutineError::AmbiguousProgram {
            program: program.to_string(),
            origin: origin.to_string(),
            paths,
        }),
    }
}

/// A program given as a host file.
pub fn program_from_file(bytes: Vec<u8>, path: &str) -> Program {
    Program {
        bytes,
        origin: path.to_string(),
        comm: comm_of(path),
    }
}

/// The name a task has after it execs `path`, as the tracer reads it
/// (15 bytes, shown lossily where that cuts a character).
fn comm_of(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path).as_bytes();
    String::from_utf8_lossy(&name[..name.len().min(COMM_BYTES)]).into_owned()
}

/// The address of routine `name` of `program`, which must be linked at a
/// fixed address.
pub fn fixed_routine_address(program: &Program, name: &str) -> Result<u64, UserRoutineError> {
    let origin = &program.origin;
    let elf = object::File::parse(&*program.bytes)
        .map_err(|_| UserRoutineError::NotElf(origin.clone()))?;
    match elf.kind() {
        ObjectKind::Executable => {}
        ObjectKind::Dynamic => return Err(UserRoutineError::PositionIndependent(origin.clone())),
        _ => return Err(UserRoutineError::NotElf(origin.clone())),
    }
    let table =
        parse_elf(&program.bytes, origin).map_err(|_| UserRoutineError::NotElf(origin.clone()))?;
    let addresses: Vec<u64> = table
        .symbols()
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.start)
        .collect();
    match addresses.as_slice() {
        [one] => Ok(*one),
        [] => Err(UserRoutineError::NoRoutine {
            name: name.to_string(),
            origin: origin.clone(),
        }),
        _ => Err(UserRoutineError::AmbiguousRoutine {
            name: name.to_string(),
            origin: origin.clone(),
            addresses,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_is_named_after_the_file_cut_to_15_bytes() {
        assert_eq!(comm_of("/bin/vtprog"), "vtprog");
        assert_eq!(comm_of("a-very-long-program-name"), "a-very-long-pro");
        // The kernel cuts bytes; the tracer reads them lossily, and so
        // must the name it compares with.
        assert_eq!(comm_of("/x/ééééééééé"), "ééééééé\u{fffd}");
    }

    #[test]
    fn garbage_is_not_a_program() {
        let p = program_from_file(b"not an elf".to_vec(), "junk");
        assert!(matches!(
            fixed_routine_address(&p, "main"),
            Err(UserRoutineError::NotElf(_))
        ));
    }
}
