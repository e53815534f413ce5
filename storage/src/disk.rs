//! The trace disk: a preallocated file (or a block device) holding a
//! superblock and then equal-sized slots. A segment fills one slot or, when
//! it compresses badly, a few consecutive ones; segments never straddle the
//! end of the disk.
//!
//! The superblock is a hint. Every segment header carries its sequence
//! number and checksums, so the reader rebuilds the order by scanning slots,
//! even after the VMM was killed mid-trace or the superblock was lost.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};

use crate::segment::{SegmentHeader, HEADER_LEN};

/// Bytes reserved at the start for the superblock.
pub const SUPERBLOCK_LEN: u64 = 4096;
/// Default slot size.
pub const DEFAULT_SLOT_SIZE: u32 = 1 << 20;
const MAGIC: [u8; 8] = *b"VTRACEDK";
const VERSION: u32 = 1;
const FLAG_WRAP: u32 = 1;
/// Longest metadata text the superblock holds.
pub const METADATA_MAX: usize = 3072;

/// Errors opening, creating or writing a trace disk.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("cannot open trace disk {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot reserve {size} bytes for trace disk {path}: {source} \
         (free some space or choose a smaller --disk-size)"
    )]
    Reserve {
        path: PathBuf,
        size: u64,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "trace disk {path} is too small: {size} bytes holds fewer than two {slot_size}-byte slots"
    )]
    TooSmall {
        path: PathBuf,
        size: u64,
        slot_size: u32,
    },
    #[error("I/O on trace disk {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a vtrace trace disk (no superblock and no segments)")]
    NotATrace { path: PathBuf },
}

/// What the superblock records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub slot_size: u32,
    pub slot_count: u64,
    pub wrap: bool,
    pub created_unix: u64,
    /// Free text: what was traced and how (`key: value` lines).
    pub metadata: String,
}

impl Superblock {
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_LEN as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.slot_size.to_le_bytes());
        b[16..24].copy_from_slice(&self.slot_count.to_le_bytes());
        b[24..28].copy_from_slice(&(if self.wrap { FLAG_WRAP } else { 0 }).to_le_bytes());
        b[28..36].copy_from_slice(&self.created_unix.to_le_bytes());
        let meta = self.metadata.as_bytes();
        let meta = &meta[..meta.len().min(METADATA_MAX)];
        b[36..40].copy_from_slice(&(meta.len() as u32).to_le_bytes());
        b[64..64 + meta.len()].copy_from_slice(meta);
        let crc = crc32c::crc32c(&b[..SUPERBLOCK_LEN as usize - 4]);
        let end = SUPERBLOCK_LEN as usize;
        b[end - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Superblock> {
        let end = SUPERBLOCK_LEN as usize;
        if b.len() < end || b[0..8] != MAGIC {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        if crc32c::crc32c(&b[..end - 4]) != u32_at(end - 4) || u32_at(8) != VERSION {
            return None;
        }
        let meta_len = (u32_at(36) as usize).min(METADATA_MAX);
        Some(Superblock {
            slot_size: u32_at(12),
            slot_count: u64_at(16),
            wrap: u32_at(24) & FLAG_WRAP != 0,
            created_unix: u64_at(28),
            metadata: String::from_utf8_lossy(&b[64..64 + meta_len]).into_owned(),
        })
    }
}

fn is_block_device(file: &File) -> bool {
    file.metadata()
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false)
}

/// Size of a file or block device.
fn device_size(file: &mut File) -> std::io::Result<u64> {
    file.seek(SeekFrom::End(0))
}

/// A trace disk opened for writing, with the slot the next segment goes to.
pub struct DiskWriter {
    file: File,
    path: PathBuf,
    superblock: Superblock,
    next_slot: u64,
    /// Slots written at least once (for "disk use").
    slots_used: u64,
}

/// Result of appending a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Appended {
    /// Written at this slot.
    At { slot: u64, slots: u64 },
    /// No room left (not in wrap mode): nothing was written.
    Full,
}

impl DiskWriter {
    /// Creates (or takes over) a trace disk of `size` bytes at `path`,
    /// reserving the space now so tracing can never fail halfway on a full
    /// host disk. A block device keeps its own size.
    pub fn create(
        path: &Path,
        size: u64,
        slot_size: u32,
        wrap: bool,
        metadata: &str,
    ) -> Result<DiskWriter, DiskError> {
        let open_err = |source| DiskError::Open {
            path: path.to_path_buf(),
            source,
        };
        let existing_block = std::fs::metadata(path)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(!existing_block)
            .truncate(!existing_block)
            .open(path)
            .map_err(open_err)?;
        let size = if is_block_device(&file) {
            device_size(&mut file).map_err(open_err)?
        } else {
            reserve(&file, size).map_err(|source| DiskError::Reserve {
                path: path.to_path_buf(),
                size,
                source,
            })?;
            size
        };
        let slot_count = size.saturating_sub(SUPERBLOCK_LEN) / u64::from(slot_size);
        if slot_count < 2 {
            return Err(DiskError::TooSmall {
                path: path.to_path_buf(),
                size,
                slot_size,
            });
        }
        let superblock = Superblock {
            slot_size,
            slot_count,
            wrap,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            metadata: metadata.to_string(),
        };
        let writer = DiskWriter {
            file,
            path: path.to_path_buf(),
            superblock,
            next_slot: 0,
            slots_used: 0,
        };
        writer.write_at(0, &writer.superblock.encode())?;
        if existing_block {
            // Stale segments of an earlier trace would confuse the scan.
            let zero = vec![0u8; HEADER_LEN];
            for slot in 0..slot_count {
                writer.write_at(writer.slot_offset(slot), &zero)?;
            }
        }
        Ok(writer)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        self.file
            .write_all_at(data, offset)
            .map_err(|source| DiskError::Io {
                path: self.path.clone(),
                source,
            })
    }

    fn slot_offset(&self, slot: u64) -> u64 {
        SUPERBLOCK_LEN + slot * u64::from(self.superblock.slot_size)
    }

    pub fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    /// Slots a sealed segment of `len` bytes needs.
    pub fn slots_for(&self, len: usize) -> u64 {
        (len as u64).div_ceil(u64::from(self.superblock.slot_size))
    }

    /// Slots left before the disk is full (wrap mode never is).
    pub fn slots_free(&self) -> u64 {
        self.superblock.slot_count - self.next_slot
    }

    /// Slots that hold trace data.
    pub fn slots_used(&self) -> u64 {
        self.slots_used
    }

    /// Writes a sealed segment (see [`crate::segment::seal`]).
    pub fn append(&mut self, sealed: &[u8]) -> Result<Appended, DiskError> {
        let slots = self.slots_for(sealed.len());
        let count = self.superblock.slot_count;
        if slots > count {
            return Ok(Appended::Full);
        }
        if self.next_slot + slots > count {
            if !self.superblock.wrap {
                return Ok(Appended::Full);
            }
            self.next_slot = 0;
        }
        let slot = self.next_slot;
        self.write_at(self.slot_offset(slot), sealed)?;
        self.next_slot += slots;
        self.slots_used = self.slots_used.max(self.next_slot);
        if self.superblock.wrap && self.next_slot == count {
            self.next_slot = 0;
        }
        Ok(Appended::At { slot, slots })
    }

    /// Makes written segments durable.
    pub fn sync(&self) -> Result<(), DiskError> {
        self.file.sync_data().map_err(|source| DiskError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

/// Sizes a regular file and reserves its blocks.
fn reserve(file: &File, size: u64) -> std::io::Result<()> {
    file.set_len(size)?;
    // SAFETY: posix_fallocate on an open descriptor with in-range values.
    let rc = unsafe {
        libc::posix_fallocate(
            std::os::fd::AsRawFd::as_raw_fd(file),
            0,
            size as libc::off_t,
        )
    };
    match rc {
        0 => Ok(()),
        // Filesystems without fallocate (tmpfs on old kernels, some FUSE):
        // the file is sized; reservation is best effort there.
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// A segment found on the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoundSegment {
    pub header: SegmentHeader,
    /// Byte offset of its header.
    pub offset: u64,
}

/// A trace disk opened for reading: the superblock if intact, and every
/// segment header the scan found, in sequence order.
pub struct DiskScan {
    pub path: PathBuf,
    pub file: File,
    pub size: u64,
    pub superblock: Option<Superblock>,
    pub segments: Vec<FoundSegment>,
    /// Where headers can start (the slot size, or 4 KiB when guessing).
    pub stride: u64,
}

impl DiskScan {
    /// Opens `path` and collects every valid segment header.
    pub fn open(path: &Path) -> Result<DiskScan, DiskError> {
        let io = |source| DiskError::Open {
            path: path.to_path_buf(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        let size = device_size(&mut file).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        let mut sb = vec![0u8; SUPERBLOCK_LEN as usize];
        let superblock = match file.read_exact(&mut sb) {
            Ok(()) => Superblock::decode(&sb),
            Err(_) => None,
        };
        // Without a superblock, segments are still 4 KiB aligned.
        let stride = superblock
            .as_ref()
            .map_or(4096, |s| u64::from(s.slot_size).max(4096));
        let mut segments = Vec::new();
        let mut header = [0u8; HEADER_LEN];
        let mut offset = SUPERBLOCK_LEN;
        while offset + HEADER_LEN as u64 <= size {
            if file.read_exact_at(&mut header, offset).is_ok() {
                if let Some(h) = SegmentHeader::decode(&header) {
                    segments.push(FoundSegment { header: h, offset });
                }
            }
            offset += stride;
        }
        if superblock.is_none() && segments.is_empty() {
            return Err(DiskError::NotATrace {
                path: path.to_path_buf(),
            });
        }
        segments.sort_by_key(|s| s.header.seq);
        Ok(DiskScan {
            path: path.to_path_buf(),
            file,
            size,
            superblock,
            segments,
            stride,
        })
    }

    /// The stored (compressed) payload of a segment.
    pub fn read_stored(&self, seg: &FoundSegment) -> std::io::Result<Vec<u8>> {
        let len = seg.header.stored_len as usize;
        if seg.offset + (HEADER_LEN + len) as u64 > self.size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "segment runs past the end of the disk",
            ));
        }
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, seg.offset + HEADER_LEN as u64)?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::seal;

    #[test]
    fn superblock_round_trips() {
        let sb = Superblock {
            slot_size: 1 << 20,
            slot_count: 1023,
            wrap: true,
            created_unix: 42,
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
    fn segments_larger_than_a_slot_take_several() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.vtd");
        let mut w = DiskWriter::create(&path, SUPERBLOCK_LEN + 8 * 4096, 4096, false, "").unwrap();
        // Incompressible 10 KB: three slots.
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
            Appended::At { slot: 0, slots: 3 }
        );
        assert_eq!(
            w.append(&seal(&[1; 10], 1, 1, 1, 0)).unwrap(),
            Appended::At { slot: 3, slots: 1 }
        );
        drop(w);
        let scan = DiskScan::open(&path).unwrap();
        let seg = scan.segments[0];
        let stored = scan.read_stored(&seg).unwrap();
        assert_eq!(crate::segment::unseal(&seg.header, &stored).unwrap(), noise);
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
