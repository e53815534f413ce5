//! The trace disk: a file (or a block device) holding a superblock and then
//! segments, packed one after the other at 4 KiB boundaries (blocks).
//! Segments never straddle the end of the disk; with `--wrap` the writer
//! starts again at the first block.
//!
//! A file is preallocated to its full size while tracing, so tracing never
//! fails halfway on a full host disk; when the run ends cleanly it is cut
//! back to the blocks it used and the superblock is marked closed. A trace
//! whose superblock is not closed did not end cleanly.
//!
//! The superblock is a hint. Every segment header carries its sequence
//! number and checksums, so the reader rebuilds the order by scanning
//! blocks, even after the VMM was killed mid-trace or the superblock was
//! lost.
//!
//! | bytes | superblock field |
//! |---|---|
//! | 0..8 | magic `VTRACEDK` |
//! | 8..12 | version (2) |
//! | 12..16 | segment size: raw bytes a segment is cut at |
//! | 16..24 | blocks after the superblock |
//! | 24..28 | flags: 1 wrap, 2 closed (the run ended cleanly) |
//! | 28..36 | creation time, Unix seconds |
//! | 36..40 | metadata length, then the metadata text at 64 |
//! | 40..48 | segments written (set when closed) |
//! | 48..56 | steps written (set when closed) |
//! | 4092..4096 | CRC32C of bytes 0..4092 |

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

mod scan;
mod writer;

pub use scan::{DiskScan, FoundSegment};
pub use writer::{Appended, DiskWriter};

/// Bytes reserved at the start for the superblock.
pub const SUPERBLOCK_LEN: u64 = 4096;
/// [`SUPERBLOCK_LEN`] as a buffer length.
const SUPERBLOCK_BYTES: usize = 4096;
const _: () = assert!(SUPERBLOCK_BYTES as u64 == SUPERBLOCK_LEN);
/// Segments start at multiples of this many bytes after the superblock.
pub const BLOCK: u64 = 4096;
/// Default segment size.
pub const DEFAULT_SEGMENT_SIZE: u32 = 1 << 20;
const MAGIC: [u8; 8] = *b"VTRACEDK";
const VERSION: u32 = 2;
const FLAG_WRAP: u32 = 1;
const FLAG_CLOSED: u32 = 2;
/// Longest metadata text the superblock holds.
pub const METADATA_MAX: usize = 3072;

/// Errors opening, creating or writing a trace disk.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The file could not be opened or created.
    #[error("cannot open trace disk {path}: {source}")]
    Open {
        /// The trace disk.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The host could not give the file its size.
    #[error(
        "cannot reserve {size} bytes for trace disk {path}: {source} \
         (free some space or choose a smaller --disk-size)"
    )]
    Reserve {
        /// The trace disk.
        path: PathBuf,
        /// The size asked for.
        size: u64,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The size leaves no room for a segment.
    #[error(
        "trace disk {path} is too small: {size} bytes holds fewer than two {segment_size}-byte \
         segments"
    )]
    TooSmall {
        /// The trace disk.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The segment size asked for.
        segment_size: u32,
    },
    /// Reading or writing failed.
    #[error("I/O on trace disk {path}: {source}")]
    Io {
        /// The trace disk.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// Neither a superblock nor a segment was found.
    #[error("{path} is not a vtrace trace disk (no superblock and no segments)")]
    NotATrace {
        /// The file.
        path: PathBuf,
    },
    /// A directory, FIFO, socket or character device.
    #[error("{path} is {kind}, not a trace disk (a regular file or a block device)")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is ("a directory").
        kind: &'static str,
    },
    /// Another run writes the trace disk now.
    #[error(
        "trace disk {path} is being written by another run ({holder}); wait for it to end, \
         or choose another --disk"
    )]
    Busy {
        /// The trace disk.
        path: PathBuf,
        /// Who writes it: "pid 1234: vtrace run ...".
        holder: String,
    },
    /// The file system has less room than the disk's size.
    #[error(
        "no room for a {} trace disk at {path}: the file system has {} free (free some space, \
         choose a smaller --disk-size, or remove the old trace there first: it is kept until \
         the new disk is ready)",
        size_text(*size),
        size_text(*free)
    )]
    NoRoom {
        /// The trace disk.
        path: PathBuf,
        /// The size asked for.
        size: u64,
        /// Bytes the file system has free.
        free: u64,
    },
    /// The path is a symbolic link to nothing.
    #[error(
        "{path} is a symbolic link to {target}, which does not exist; vtrace does not make a \
         link's target (make it, or give the path itself as --disk)"
    )]
    DanglingLink {
        /// The link.
        path: PathBuf,
        /// Where it points.
        target: PathBuf,
    },
    /// Creating the disk would destroy a file that is not a trace.
    #[error(
        "{path} exists and is not a vtrace trace disk; refusing to overwrite it \
         (choose another --disk, or add --force)"
    )]
    Foreign {
        /// The file.
        path: PathBuf,
    },
}

impl DiskError {
    /// The status a command that fails with this error exits with, as
    /// sysexits.h names them (2 for a value that means nothing here, the
    /// status of arguments clap refuses).
    pub fn exit_status(&self) -> i32 {
        match self {
            DiskError::Open { .. } | DiskError::DanglingLink { .. } => exitcode::NOINPUT,
            DiskError::NotATrace { .. } | DiskError::NotAFile { .. } => exitcode::DATAERR,
            DiskError::TooSmall { .. } => 2,
            DiskError::Foreign { .. } | DiskError::Reserve { .. } | DiskError::NoRoom { .. } => {
                exitcode::CANTCREAT
            }
            DiskError::Io { .. } => exitcode::IOERR,
            DiskError::Busy { .. } => exitcode::TEMPFAIL,
        }
    }
}

/// What the superblock records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Raw bytes at which the recorder cuts a segment.
    pub segment_size: u32,
    /// Blocks of `BLOCK` bytes (4 KiB) after the superblock.
    pub block_count: u64,
    /// Old segments are overwritten when the disk is full.
    pub wrap: bool,
    /// The run ended cleanly: everything it recorded was written.
    pub closed: bool,
    /// When the disk was made, Unix seconds.
    pub created_unix: u64,
    /// Segments written, once closed (else 0).
    pub segments: u64,
    /// Steps written, once closed (else 0).
    pub steps: u64,
    /// Free text: what was traced and how (`key: value` lines).
    pub metadata: String,
}

impl Superblock {
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_BYTES];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.segment_size.to_le_bytes());
        b[16..24].copy_from_slice(&self.block_count.to_le_bytes());
        let flags =
            (if self.wrap { FLAG_WRAP } else { 0 }) | (if self.closed { FLAG_CLOSED } else { 0 });
        b[24..28].copy_from_slice(&flags.to_le_bytes());
        b[28..36].copy_from_slice(&self.created_unix.to_le_bytes());
        let meta = self.metadata.as_bytes();
        let meta = &meta[..meta.len().min(METADATA_MAX)];
        // At most METADATA_MAX bytes.
        let meta_len = u32::try_from(meta.len()).unwrap_or(u32::MAX);
        b[36..40].copy_from_slice(&meta_len.to_le_bytes());
        b[40..48].copy_from_slice(&self.segments.to_le_bytes());
        b[48..56].copy_from_slice(&self.steps.to_le_bytes());
        b[64..64 + meta.len()].copy_from_slice(meta);
        let crc = crc32c::crc32c(&b[..SUPERBLOCK_BYTES - 4]);
        let end = SUPERBLOCK_BYTES;
        b[end - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Superblock> {
        let end = SUPERBLOCK_BYTES;
        if b.len() < end || b[0..8] != MAGIC {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        if crc32c::crc32c(&b[..end - 4]) != u32_at(end - 4) || u32_at(8) != VERSION {
            return None;
        }
        let meta_len = (u32_at(36) as usize).min(METADATA_MAX);
        let flags = u32_at(24);
        Some(Superblock {
            segment_size: u32_at(12),
            block_count: u64_at(16),
            wrap: flags & FLAG_WRAP != 0,
            closed: flags & FLAG_CLOSED != 0,
            created_unix: u64_at(28),
            segments: u64_at(40),
            steps: u64_at(48),
            metadata: String::from_utf8_lossy(&b[64..64 + meta_len]).into_owned(),
        })
    }
}

/// Bytes for a message, in the largest binary unit that keeps a digit
/// before the point: "16000 TiB", "69.8 GiB", "512 B".
fn size_text(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Whether `b` starts like a superblock (the magic), intact or not.
fn looks_like_a_superblock(b: &[u8]) -> bool {
    b.get(0..8) == Some(&MAGIC[..])
}

/// What kind of file `path` is, when it cannot be a trace disk.
fn unusable_kind(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() || t.is_block_device() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() {
        Some("a character device")
    } else {
        Some("not a regular file")
    }
}

/// Where the next data at or after `offset` starts in a sparse file
/// (`SEEK_DATA`): `offset` itself where the file system does not say, or
/// None where only a hole follows.
fn next_data(file: &File, offset: u64) -> Option<u64> {
    let Ok(at) = libc::off_t::try_from(offset) else {
        return Some(offset);
    };
    // SAFETY: lseek on a descriptor this function borrows; the scan reads
    // with pread, so the file position it moves is not used.
    let found = unsafe { libc::lseek(std::os::fd::AsRawFd::as_raw_fd(file), at, libc::SEEK_DATA) };
    if found >= 0 {
        return u64::try_from(found).ok();
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENXIO) => None,
        _ => Some(offset),
    }
}

/// Size of a file or block device.
fn device_size(file: &mut File) -> std::io::Result<u64> {
    file.seek(SeekFrom::End(0))
}

/// Blocks that `len` bytes take.
fn blocks_for(len: u64) -> u64 {
    len.div_ceil(BLOCK)
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::segment::seal;
    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;

    #[test]
    fn sizes_are_said_in_binary_units() {
        assert_eq!(size_text(512), "512 B");
        assert_eq!(size_text(8 << 20), "8 MiB");
        assert_eq!(size_text(16000 << 40), "15.6 PiB");
        assert_eq!(size_text(74_933_497_856), "69.8 GiB");
    }

    #[test]
    fn a_new_disk_keeps_the_old_trace_until_it_is_ready_and_locks_out_a_second_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.vtd");
        let first = DiskWriter::create(&path, 1 << 20, 64 << 10, false, "first").unwrap();
        first.close().unwrap();
        // The old trace stays while a refused size is asked for.
        let err = DiskWriter::create(&path, u64::MAX / 2, 64 << 10, false, "").err();
        assert!(matches!(err, Some(DiskError::NoRoom { .. })), "{err:?}");
        let scan = DiskScan::open(&path).unwrap();
        assert_eq!(scan.superblock.map(|s| s.metadata), Some("first".into()));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // A writer holds the disk: a second is refused, a reader is told.
        let second = DiskWriter::create(&path, 1 << 20, 64 << 10, false, "second").unwrap();
        let err = DiskWriter::create(&path, 1 << 20, 64 << 10, false, "third").err();
        assert!(matches!(err, Some(DiskError::Busy { .. })), "{err:?}");
        let pid = format!("pid {}", std::process::id());
        let busy = DiskScan::open(&path).unwrap().written_by;
        assert!(busy.is_some_and(|w| w.starts_with(&pid)));
        second.close().unwrap();
        assert_eq!(DiskScan::open(&path).unwrap().written_by, None);
    }

    #[test]
    fn superblock_round_trips() {
        let sb = Superblock {
            segment_size: 1 << 20,
            block_count: 1023,
            wrap: true,
            closed: true,
            created_unix: 42,
            segments: 3,
            steps: 99,
            metadata: "guest: demo".into(),
        };
        assert_eq!(Superblock::decode(&sb.encode()), Some(sb));
    }

    #[test]
    fn fills_up_without_wrap_and_overwrites_with_wrap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.vtd");
        let slot = 4096u32;
        let size = SUPERBLOCK_LEN + 3 * u64::from(slot);
        let mut w = DiskWriter::create(&path, size, slot, false, "m").unwrap();
        for seq in 0..3 {
            assert!(matches!(
                w.append(&seal(&[seq as u8; 100], seq, seq, 1, 0)).unwrap(),
                Appended::At { .. }
            ));
        }
        assert_eq!(
            w.append(&seal(&[9; 100], 3, 3, 1, 0)).unwrap(),
            Appended::Full
        );
        drop(w);
        let scan = DiskScan::open(&path).unwrap();
        assert_eq!(
            scan.segments
                .iter()
                .map(|s| s.header.seq)
                .collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(scan.superblock.as_ref().unwrap().metadata, "m");

        let mut w = DiskWriter::create(&path, size, slot, true, "m").unwrap();
        for seq in 0..5 {
            w.append(&seal(&[seq as u8; 100], seq, seq, 1, 0)).unwrap();
        }
        drop(w);
        let scan = DiskScan::open(&path).unwrap();
        assert_eq!(
            scan.segments
                .iter()
                .map(|s| s.header.seq)
                .collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
    }

    #[test]
    fn segments_larger_than_a_block_take_several() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.vtd");
        let mut w = DiskWriter::create(&path, SUPERBLOCK_LEN + 8 * 4096, 4096, false, "").unwrap();
        // Incompressible 10 KB: three blocks.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..10_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert_eq!(
            w.append(&seal(&noise, 0, 0, 1, 0)).unwrap(),
            Appended::At {
                block: 0,
                blocks: 3
            }
        );
        assert_eq!(
            w.append(&seal(&[1; 10], 1, 1, 1, 0)).unwrap(),
            Appended::At {
                block: 3,
                blocks: 1
            }
        );
        drop(w);
        let scan = DiskScan::open(&path).unwrap();
        let seg = scan.segments[0];
        let stored = scan.read_stored(&seg).unwrap();
        assert_eq!(crate::segment::unseal(&seg.header, &stored).unwrap(), noise);
    }

    #[test]
    fn small_segments_are_packed_and_a_closed_disk_takes_only_its_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.vtd");
        let size = 64 << 20;
        let mut w = DiskWriter::create(&path, size, 1 << 20, false, "m").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size, "reserved");
        for seq in 0..3 {
            assert_eq!(
                w.append(&seal(&[seq as u8; 100], seq, seq, 1, 0)).unwrap(),
                Appended::At {
                    block: seq,
                    blocks: 1
                },
                "a small segment takes one block, not a whole segment's room"
            );
        }
        w.close().unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            SUPERBLOCK_LEN + 3 * BLOCK
        );
        let scan = DiskScan::open(&path).unwrap();
        let sb = scan.superblock.unwrap();
        assert!(sb.closed);
        assert_eq!(sb.block_count, 3);
        assert_eq!(scan.segments.len(), 3);
    }

    #[test]
    fn a_damaged_superblock_is_told_apart_from_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.vtd");
        let mut w = DiskWriter::create(&path, SUPERBLOCK_LEN + 4 * 8192, 8192, false, "").unwrap();
        w.append(&seal(&[1; 10], 0, 0, 1, 0)).unwrap();
        drop(w);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xee], 40).unwrap();
        let scan = DiskScan::open(&path).unwrap();
        assert!(scan.superblock.is_none());
        assert!(scan.superblock_damaged);
    }

    #[test]
    fn directories_and_other_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            DiskScan::open(dir.path()),
            Err(DiskError::NotAFile { .. })
        ));
        assert!(matches!(
            DiskWriter::create(dir.path(), 1 << 20, 4096, false, ""),
            Err(DiskError::NotAFile { .. })
        ));
        let other = dir.path().join("notes.txt");
        std::fs::write(&other, "not a trace").unwrap();
        assert!(matches!(
            DiskWriter::create(&other, 1 << 20, 4096, false, ""),
            Err(DiskError::Foreign { .. })
        ));
        assert_eq!(std::fs::read(&other).unwrap(), b"not a trace");
        // A size that holds no two segments leaves no file behind.
        let small = dir.path().join("small.vtd");
        assert!(matches!(
            DiskWriter::create(&small, 100 << 10, 1 << 20, false, ""),
            Err(DiskError::TooSmall { .. })
        ));
        assert!(!small.exists());
        // An earlier trace is taken over.
        let trace = dir.path().join("t.vtd");
        DiskWriter::create(&trace, 1 << 20, 4096, false, "")
            .unwrap()
            .close()
            .unwrap();
        assert!(DiskWriter::create(&trace, 1 << 20, 4096, false, "").is_ok());
    }

    #[test]
    fn segments_are_found_without_the_superblock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.vtd");
        let mut w = DiskWriter::create(&path, SUPERBLOCK_LEN + 4 * 8192, 8192, false, "").unwrap();
        w.append(&seal(&[1; 10], 0, 0, 1, 0)).unwrap();
        w.append(&seal(&[2; 10], 1, 1, 1, 0)).unwrap();
        drop(w);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0u8; 16], 0).unwrap();
        let scan = DiskScan::open(&path).unwrap();
        assert!(scan.superblock.is_none());
        assert_eq!(scan.segments.len(), 2);
    }

    #[test]
    fn a_file_that_is_not_a_trace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        std::fs::write(&path, vec![7u8; 20_000]).unwrap();
        assert!(matches!(
            DiskScan::open(&path),
            Err(DiskError::NotATrace { .. })
        ));
        assert!(matches!(
            DiskScan::open(&dir.path().join("missing")),
            Err(DiskError::Open { .. })
        ));
    }
}
