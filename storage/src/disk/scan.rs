//! Finding the segments on a trace disk by their headers, whatever the
//! superblock says.

use crate::segment::{SegmentHeader, HEADER_LEN};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::*;

/// A segment found on the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoundSegment {
    /// What the segment's header says.
    pub header: SegmentHeader,
    /// Byte offset of its header.
    pub offset: u64,
}

/// A trace disk opened for reading: the superblock if intact, and every
/// segment header the scan found, in sequence order.
pub struct DiskScan {
    /// Where the disk is.
    pub path: PathBuf,
    /// The open disk.
    pub file: File,
    /// Its size in bytes.
    pub size: u64,
    /// The superblock, if it is intact.
    pub superblock: Option<Superblock>,
    /// The disk starts with a superblock's magic that does not check out
    /// (a damaged superblock, or one of another vtrace version).
    pub superblock_damaged: bool,
    /// Every valid segment header, by sequence number.
    pub segments: Vec<FoundSegment>,
    /// Who is writing the disk as it is read ("pid 1234: vtrace run
    /// ..."), if a run is: it holds what that run has written so far.
    pub written_by: Option<String>,
}

impl std::fmt::Debug for DiskScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskScan").finish_non_exhaustive()
    }
}

impl DiskScan {
    /// Opens `path` and collects every valid segment header. Only regular
    /// files and block devices are read.
    pub fn open(path: &Path) -> Result<DiskScan, DiskError> {
        let io = |source| DiskError::Open {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if let Some(kind) = unusable_kind(&meta) {
            return Err(DiskError::NotAFile {
                path: path.to_path_buf(),
                kind,
            });
        }
        let mut file = File::open(path).map_err(io)?;
        let size = device_size(&mut file).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        let mut sb = vec![0u8; SUPERBLOCK_BYTES];
        let (superblock, superblock_damaged) = match file.read_exact(&mut sb) {
            Ok(()) => {
                let decoded = Superblock::decode(&sb);
                let damaged = decoded.is_none() && looks_like_a_superblock(&sb);
                (decoded, damaged)
            }
            Err(_) => (None, false),
        };
        let mut segments = Vec::new();
        let mut header = [0u8; HEADER_LEN];
        let mut offset = SUPERBLOCK_LEN;
        // Segments lie within the blocks an intact superblock counts (all
        // it reserved, where the run did not end cleanly); past them, a
        // file may go on for terabytes of nothing.
        let end = superblock.as_ref().map_or(size, |sb| {
            SUPERBLOCK_LEN
                .saturating_add(sb.block_count.saturating_mul(BLOCK))
                .min(size)
        });
        while offset.saturating_add(HEADER_LEN as u64) <= end {
            let mut next = offset.saturating_add(BLOCK);
            if file.read_exact_at(&mut header, offset).is_ok() {
                if header.iter().all(|b| *b == 0) {
                    // Zeros, maybe a hole: on to the next block with data.
                    match next_data(&file, offset) {
                        Some(data) if data > offset => {
                            next = SUPERBLOCK_LEN.saturating_add(
                                blocks_for(data - SUPERBLOCK_LEN).saturating_mul(BLOCK),
                            );
                        }
                        Some(_) => {}
                        None => break,
                    }
                } else if let Some(h) = SegmentHeader::decode(&header) {
                    segments.push(FoundSegment { header: h, offset });
                    // Not into the segment's own bytes: data the guest
                    // controls could look like a header there.
                    let end = blocks_for(h.total_len()).saturating_mul(BLOCK);
                    next = next.max(offset.saturating_add(end));
                }
            }
            offset = next;
        }
        if superblock.is_none() && !superblock_damaged && segments.is_empty() {
            return Err(DiskError::NotATrace {
                path: path.to_path_buf(),
            });
        }
        segments.sort_by_key(|s| s.header.seq);
        let written_by = crate::lock::written_now(&file).then(|| crate::lock::holder(&file));
        Ok(DiskScan {
            path: path.to_path_buf(),
            file,
            size,
            superblock,
            superblock_damaged,
            segments,
            written_by,
        })
    }

    /// The stored (compressed) payload of a segment.
    pub fn read_stored(&self, seg: &FoundSegment) -> std::io::Result<Vec<u8>> {
        let len = seg.header.stored_len as usize;
        if seg.offset.saturating_add(seg.header.total_len()) > self.size {
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
