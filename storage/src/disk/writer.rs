//! Writing the trace disk: made beside its path and put in place when
//! ready, locked, preallocated, segments appended (or wrapped), and closed.

use crate::segment::{SegmentHeader, HEADER_LEN};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::*;

/// A trace disk opened for writing, with the block the next segment goes
/// to.
pub struct DiskWriter {
    file: File,
    path: PathBuf,
    superblock: Superblock,
    block_device: bool,
    next_block: u64,
    /// Blocks written at least once (for "disk use").
    blocks_used: u64,
}

impl std::fmt::Debug for DiskWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskWriter").finish_non_exhaustive()
    }
}

/// Result of appending a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Appended {
    /// Written at this block, taking `blocks`.
    At {
        /// The first block.
        block: u64,
        /// Blocks taken.
        blocks: u64,
    },
    /// No room left (not in wrap mode): nothing was written.
    Full,
}

impl DiskWriter {
    /// Creates a trace disk of `size` bytes at `path` (or takes over an
    /// earlier trace there, or a block device), reserving the space now so
    /// tracing can never fail halfway on a full host disk. A block device
    /// keeps its own size. A file that is not a trace is not overwritten
    /// ([`DiskError::Foreign`]): remove it first where that is meant.
    ///
    /// The writer holds the disk's lock until it is dropped: a second
    /// writer is refused ([`DiskError::Busy`]). A new file is made and
    /// reserved beside the path and takes its place only when ready, so a
    /// failure leaves an earlier trace there as it was, and nothing else.
    pub fn create(
        path: &Path,
        size: u64,
        segment_size: u32,
        wrap: bool,
        metadata: &str,
    ) -> Result<DiskWriter, DiskError> {
        Self::create_over(path, size, segment_size, wrap, metadata, false)
    }

    /// [`DiskWriter::create`], replacing a file that is not a trace as
    /// well where `foreign_ok` (`--force`), once the new disk is ready.
    pub fn create_over(
        path: &Path,
        size: u64,
        segment_size: u32,
        wrap: bool,
        metadata: &str,
        foreign_ok: bool,
    ) -> Result<DiskWriter, DiskError> {
        let open_err = |source| DiskError::Open {
            path: path.to_path_buf(),
            source,
        };
        // The trace goes where a symbolic link points; one that points
        // nowhere is refused rather than followed into a new file.
        let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        let target = if is_link {
            std::fs::canonicalize(path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => DiskError::DanglingLink {
                    path: path.to_path_buf(),
                    target: std::fs::read_link(path).unwrap_or_default(),
                },
                _ => open_err(e),
            })?
        } else {
            path.to_path_buf()
        };
        let existing = std::fs::metadata(&target).ok();
        if let Some(kind) = existing.as_ref().and_then(unusable_kind) {
            return Err(DiskError::NotAFile {
                path: path.to_path_buf(),
                kind,
            });
        }
        let too_small = |size: u64| {
            let blocks = size.saturating_sub(SUPERBLOCK_LEN) / BLOCK;
            (blocks < 2 * blocks_for(u64::from(segment_size))).then(|| DiskError::TooSmall {
                path: path.to_path_buf(),
                size,
                segment_size,
            })
        };
        let (file, size, block_device) = if existing
            .as_ref()
            .is_some_and(|m| m.file_type().is_block_device())
        {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&target)
                .map_err(open_err)?;
            lock_or_busy(&file, path)?;
            let size = device_size(&mut file).map_err(open_err)?;
            (file, size, true)
        } else {
            // Before anything is made: a refused size leaves no file.
            if let Some(e) = too_small(size) {
                return Err(e);
            }
            (
                new_file_in_place(path, &target, size, foreign_ok)?,
                size,
                false,
            )
        };
        if let Some(e) = too_small(size) {
            return Err(e);
        }
        let block_count = size.saturating_sub(SUPERBLOCK_LEN) / BLOCK;
        let superblock = Superblock {
            segment_size,
            block_count,
            wrap,
            closed: false,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            segments: 0,
            steps: 0,
            metadata: metadata.to_string(),
        };
        let writer = DiskWriter {
            file,
            path: path.to_path_buf(),
            superblock,
            block_device,
            next_block: 0,
            blocks_used: 0,
        };
        writer.write_at(0, &writer.superblock.encode())?;
        if block_device {
            // Stale segments of an earlier trace would confuse the scan.
            let zero = vec![0u8; HEADER_LEN];
            for block in 0..block_count {
                writer.write_at(writer.block_offset(block), &zero)?;
            }
        }
        Ok(writer)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        self.file
            .write_all_at(data, offset)
            .map_err(|source| self.io(source))
    }

    fn io(&self, source: std::io::Error) -> DiskError {
        DiskError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn block_offset(&self, block: u64) -> u64 {
        SUPERBLOCK_LEN + block * BLOCK
    }

    /// The superblock as written at creation.
    pub fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    /// Blocks left before the disk is full (wrap mode never is).
    pub fn blocks_free(&self) -> u64 {
        self.superblock.block_count - self.next_block
    }

    /// Blocks that hold trace data.
    pub fn blocks_used(&self) -> u64 {
        self.blocks_used
    }

    /// Writes a sealed segment (see [`crate::segment::seal`]).
    pub fn append(&mut self, sealed: &[u8]) -> Result<Appended, DiskError> {
        let blocks = blocks_for(sealed.len() as u64);
        let count = self.superblock.block_count;
        if blocks > count {
            return Ok(Appended::Full);
        }
        if self.next_block + blocks > count {
            if !self.superblock.wrap {
                return Ok(Appended::Full);
            }
            self.next_block = 0;
        }
        let block = self.next_block;
        self.write_at(self.block_offset(block), sealed)?;
        if let Some(h) = SegmentHeader::decode(sealed) {
            self.superblock.segments += 1;
            self.superblock.steps = self.superblock.steps.saturating_add(h.steps);
        }
        self.next_block += blocks;
        self.blocks_used = self.blocks_used.max(self.next_block);
        if self.superblock.wrap && self.next_block == count {
            self.next_block = 0;
        }
        Ok(Appended::At { block, blocks })
    }

    /// Makes written segments durable.
    pub fn sync(&self) -> Result<(), DiskError> {
        self.file.sync_data().map_err(|source| self.io(source))
    }

    /// Ends the trace cleanly: a file is cut back to the blocks it used
    /// (a finished trace takes its size, not the size reserved), and the
    /// superblock says the run ended cleanly. Everything is synced.
    pub fn close(mut self) -> Result<(), DiskError> {
        self.sync()?;
        if !self.block_device {
            let end = self.block_offset(self.blocks_used);
            self.file.set_len(end).map_err(|source| self.io(source))?;
            self.superblock.block_count = self.blocks_used;
        }
        self.superblock.closed = true;
        self.write_at(0, &self.superblock.encode())?;
        self.sync()
    }
}

/// Sizes a regular file and reserves its blocks.
fn reserve(file: &File, size: u64) -> std::io::Result<()> {
    file.set_len(size)?;
    let len =
        libc::off_t::try_from(size).map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: posix_fallocate on an open descriptor with in-range values.
    let rc = unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(file), 0, len) };
    match rc {
        0 => Ok(()),
        // Filesystems without fallocate (tmpfs on old kernels, some FUSE):
        // the file is sized; reservation is best effort there.
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// Takes the disk's lock on `file`, or says who holds it.
fn lock_or_busy(file: &File, path: &Path) -> Result<(), DiskError> {
    match crate::lock::try_exclusive(file) {
        Ok(true) => Ok(()),
        Ok(false) => Err(DiskError::Busy {
            path: path.to_path_buf(),
            holder: crate::lock::holder(file),
        }),
        Err(source) => Err(DiskError::Open {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Makes a reserved, locked file of `size` bytes at `target` (`path` as
/// the user gave it, for messages): beside it first, under a hidden name,
/// then in its place. An earlier trace at `target` (or, `foreign_ok`, any
/// file) stays locked and untouched until then; anything that fails
/// removes the new file.
fn new_file_in_place(
    path: &Path,
    target: &Path,
    size: u64,
    foreign_ok: bool,
) -> Result<File, DiskError> {
    let open_err = |source| DiskError::Open {
        path: path.to_path_buf(),
        source,
    };
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target.file_name().ok_or_else(|| DiskError::NotAFile {
        path: path.to_path_buf(),
        kind: "not a file name",
    })?;
    // Two runs may race for a path that held nothing: the loser finds the
    // winner's disk there, locked, on its second look.
    for _ in 0..2 {
        let old = match File::open(target) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(open_err(e)),
        };
        if let Some(old) = &old {
            lock_or_busy(old, path)?;
            let still_there = std::fs::metadata(target).ok().map(|m| (m.dev(), m.ino()));
            let locked = old.metadata().map_err(open_err)?;
            if still_there != Some((locked.dev(), locked.ino())) {
                continue;
            }
            if locked.len() > 0 && !foreign_ok {
                let mut head = [0u8; 8];
                if old.read_exact_at(&mut head, 0).is_err() || !looks_like_a_superblock(&head) {
                    return Err(DiskError::Foreign {
                        path: path.to_path_buf(),
                    });
                }
            }
        }
        let free = free_bytes(&dir).map_err(open_err)?;
        if size > free {
            return Err(DiskError::NoRoom {
                path: path.to_path_buf(),
                size,
                free,
            });
        }
        let mut hidden = std::ffi::OsString::from(".");
        hidden.push(name);
        hidden.push(format!(".new-{}", std::process::id()));
        let fresh = dir.join(hidden);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&fresh)
            .map_err(open_err)?;
        let placed = crate::lock::try_exclusive(&file)
            .map_err(open_err)
            .and_then(|_| {
                reserve(&file, size).map_err(|source| DiskError::Reserve {
                    path: path.to_path_buf(),
                    size,
                    source,
                })
            })
            .and_then(|()| match old {
                // Replaces the trace this run holds locked.
                Some(_) => std::fs::rename(&fresh, target).map_err(open_err),
                // Takes the path only if it is still free.
                None => take_free_path(&fresh, target).map_err(open_err),
            });
        // Renamed, the hidden name is gone already; linked, the disk keeps
        // its place under the path; failed, the new file goes.
        let _ = std::fs::remove_file(&fresh);
        match placed {
            Ok(()) => return Ok(file),
            Err(DiskError::Open { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(DiskError::Busy {
        path: path.to_path_buf(),
        holder: "another run that took it meanwhile".to_string(),
    })
}

/// Puts `fresh` at `target` only if nothing is there: a hard link, or on
/// a file system without them (FAT, some FUSE) a rename that refuses to
/// replace (`RENAME_NOREPLACE`), or where that is not known either, a
/// rename after a look (the one window two runs could race in).
fn take_free_path(fresh: &Path, target: &Path) -> std::io::Result<()> {
    use std::io::ErrorKind;
    match std::fs::hard_link(fresh, target) {
        Err(e) if e.kind() != ErrorKind::AlreadyExists => {}
        done => return done,
    }
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(ErrorKind::InvalidInput))
    };
    let (from, to) = (c(fresh)?, c(target)?);
    // SAFETY: renameat2 on two NUL-terminated paths it only reads.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS) if !target.exists() => std::fs::rename(fresh, target),
        Some(libc::EINVAL | libc::ENOSYS) => Err(ErrorKind::AlreadyExists.into()),
        _ => Err(e),
    }
}

/// Bytes an unprivileged writer may still take on the file system of `dir`.
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: statvfs writes the struct it is given for a NUL-terminated path.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}
